//! An operator's controls of a cron schedule: pause, resume, and trigger
//! ("run now"). Pause and resume write the schedule's row through the
//! definer functions of migration 0020 (the operator's grant); a trigger is an
//! ordinary enqueue of the schedule's job type and input under a key of its
//! own ([`trigger_key`]), so it is deduplicated and fenced like any job.

use crate::fence::{schedule_name_ok, trigger_key};
use crate::{Client, ClientError, Enqueued};

/// The longest trigger id, in bytes.
pub const MAX_TRIGGER_ID: usize = 128;

impl Client {
    /// Pauses cron schedule `name` for the namespace: from the moment this
    /// returns, the scheduler leader enqueues none of its ticks (the tick
    /// write of a leader that looked before the pause is refused in its own
    /// transaction), and counts them as skipped. Durable (the schedule's row)
    /// until [`resume_schedule`](Self::resume_schedule); jobs of earlier
    /// ticks, and triggers, run as usual. `true` when it was not paused
    /// already. Needs the operator's grant (`FenceStore::grant_operator`).
    ///
    /// # Errors
    /// [`ClientError::UnknownSchedule`] when no schedule has that name
    /// (nothing written); server errors.
    pub async fn pause_schedule(&self, name: &str) -> Result<bool, ClientError> {
        known(name)?;
        let changed = self.store.pause_schedule(name).await?;
        changed.ok_or_else(|| ClientError::UnknownSchedule(name.to_string()))
    }

    /// Resumes a paused schedule: its next tick after now is enqueued as
    /// usual; the ticks that came while it was paused are skipped, whatever
    /// its missed-ticks policy (a pause held them back on purpose). `true`
    /// when it was paused.
    ///
    /// # Errors
    /// As [`pause_schedule`](Self::pause_schedule).
    pub async fn resume_schedule(&self, name: &str) -> Result<bool, ClientError> {
        known(name)?;
        let changed = self.store.resume_schedule(name).await?;
        changed.ok_or_else(|| ClientError::UnknownSchedule(name.to_string()))
    }

    /// Enqueues one run of schedule `name` now: a job of its type with its
    /// input, through [`enqueue_json`](Self::enqueue_json), under the key
    /// [`trigger_key`]`(name, trigger_id)` (`trigger:<name>:<id>`, which no
    /// tick's `cron:` key can be). The caller makes `trigger_id` once per
    /// intent (a form's hidden field, a fresh UUID per command): the same id
    /// again is the same job (`duplicate: true`), so a double click or a
    /// retried request runs it once. A paused schedule is triggered too (a
    /// pause stops its clock, not an operator). Needs the producer's grant.
    ///
    /// # Errors
    /// [`ClientError::UnknownSchedule`]; [`ClientError::InvalidTriggerId`]
    /// for an empty id, one longer than [`MAX_TRIGGER_ID`] bytes or with a
    /// control character (nothing written); as [`enqueue_json`](Self::enqueue_json).
    pub async fn trigger_schedule(
        &self,
        name: &str,
        trigger_id: &str,
    ) -> Result<Enqueued, ClientError> {
        check_trigger_id(trigger_id)?;
        known(name)?;
        let rows = self.store.schedules().await?;
        let Some(row) = rows.into_iter().find(|r| r.name == name) else {
            return Err(ClientError::UnknownSchedule(name.to_string()));
        };
        let key = trigger_key(name, trigger_id);
        self.enqueue_json(&row.job_type, &key, row.input).await
    }
}

/// A name no schedule can have is unknown, before any server is asked.
fn known(name: &str) -> Result<(), ClientError> {
    match schedule_name_ok(name) {
        true => Ok(()),
        false => Err(ClientError::UnknownSchedule(name.to_string())),
    }
}

fn check_trigger_id(id: &str) -> Result<(), ClientError> {
    if id.is_empty() {
        return Err(ClientError::InvalidTriggerId("empty"));
    }
    if id.len() > MAX_TRIGGER_ID {
        return Err(ClientError::InvalidTriggerId("longer than 128 bytes"));
    }
    if id.chars().any(char::is_control) {
        return Err(ClientError::InvalidTriggerId(
            "contains a control character",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_ids_are_checked() {
        assert!(check_trigger_id("c1d2").is_ok());
        assert!(check_trigger_id(&"x".repeat(MAX_TRIGGER_ID)).is_ok());
        for bad in ["", "a\nb", "\0"] {
            assert!(check_trigger_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_trigger_id(&"x".repeat(MAX_TRIGGER_ID + 1)).is_err());
    }
}
