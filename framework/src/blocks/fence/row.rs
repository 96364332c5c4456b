//! The values read from and written to job rows.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::types::{JobId, ObservedFence, Priority, StepIndex, UnknownPriority};

use super::error::FenceError;
use super::status::{JobStatus, UnknownStatus};

/// One job row, as read by [`FenceStore::job`](super::FenceStore::job) and
/// [`FenceStore::list_jobs`](super::FenceStore::list_jobs).
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    /// The job.
    pub id: JobId,
    /// Its job type.
    pub job_type: String,
    /// The input of step 0.
    pub input: serde_json::Value,
    /// The largest token the row accepted (0: never claimed).
    pub fence: i64,
    /// The next step to run (the number of committed steps).
    pub step: StepIndex,
    /// The output of the last committed step.
    pub checkpoint: Option<serde_json::Value>,
    /// The status.
    pub status: JobStatus,
    /// Whether generation `fence` released the job voluntarily.
    pub released: bool,
    /// Lost owners so far (claims that raised a fence whose generation did not release).
    pub takeovers: u32,
    /// Failed attempts so far.
    pub attempts: u32,
    /// The last recorded error or reason for death.
    pub last_error: Option<String>,
    /// The operator's reason, if the job was cancelled.
    pub cancel_reason: Option<String>,
    /// When the row was inserted.
    pub created_at: DateTime<Utc>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
    /// When a delayed job is due (`None`: enqueued to run now).
    pub run_at: Option<DateTime<Utc>>,
    /// A delayed job that is not due yet, or not yet published by the
    /// scheduler leader: no message exists for it.
    pub awaiting_publish: bool,
    /// The step names of the definition the job was enqueued with, or of the
    /// last worker that resumed it (`None`: enqueued by name and never claimed,
    /// or from before step lists were recorded). See
    /// [`step_list`](crate::job::step_list).
    pub step_names: Option<Vec<String>>,
    /// The [fingerprint](crate::job::step_list::fingerprint) of `step_names`.
    pub steps_fingerprint: Option<String>,
    /// Since when the workers that claimed the job had definitions that do
    /// not fit its committed steps (cleared by a compatible claim).
    pub incompatible_since: Option<DateTime<Utc>>,
    /// A dead job whose `on_dead` hook has not committed yet (migration
    /// 0011): a worker runs it before the job is dead-lettered.
    pub compensation_pending: bool,
    /// The job's priority level, recorded at enqueue (migration 0021): every
    /// later message of the job goes to this level's subject.
    pub priority: Priority,
}

/// What a cancel did ([`FenceStore::cancel_job`](super::FenceStore::cancel_job),
/// [`Client::cancel`](crate::Client::cancel)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// This call cancelled the job: from its commit on, no claim, admission or
    /// step commit of any owner succeeds.
    Now,
    /// The job was cancelled before; nothing changed.
    Already,
}

/// What [`FenceStore::insert_job`](super::FenceStore::insert_job) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// A new row.
    New,
    /// The same job (same id, job type and input) already existed; nothing changed.
    Existing,
    /// The same job existed, finished with this status, and retention pruned
    /// its row: its tombstone keeps the key used; nothing changed.
    Pruned(JobStatus),
}

/// A successful claim: where to resume.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The step to run next.
    pub step: StepIndex,
    /// The output of the last committed step (the input of `step`); `None` at step 0.
    pub checkpoint: Option<serde_json::Value>,
    /// The job's input (the input of step 0).
    pub input: serde_json::Value,
    /// Lost owners so far, including this claim if it was a takeover.
    pub takeovers: u32,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Always [`JobStatus::Running`] (a terminal job is the error
    /// [`FenceError::Terminal`]).
    pub status: JobStatus,
    /// The job type.
    pub job_type: String,
    /// The fence this claim replaced (`None`: first claim).
    pub previous: Option<ObservedFence>,
    /// Whether this claim took the job from a generation that did not release it.
    pub takeover: bool,
    /// The row's recorded step names ([`JobRow::step_names`]).
    pub step_names: Option<Vec<String>>,
    /// How long workers whose definitions do not fit have been finding the
    /// job, by PostgreSQL's clock (`None`: not marked).
    pub incompatible_for: Option<std::time::Duration>,
}

pub(crate) fn job_row(row: &PgRow) -> Result<JobRow, FenceError> {
    let id = JobId::from_uuid(row.try_get("id")?);
    let status: String = row.try_get("status")?;
    Ok(JobRow {
        id,
        job_type: row.try_get("job_type")?,
        input: row.try_get("input")?,
        fence: row.try_get("fence")?,
        step: step_from(id, row.try_get("step")?)?,
        checkpoint: row.try_get("checkpoint")?,
        status: status_from(id, &status)?,
        released: row.try_get("released")?,
        takeovers: count_from(id, "takeovers", row.try_get("takeovers")?)?,
        attempts: count_from(id, "attempts", row.try_get("attempts")?)?,
        last_error: row.try_get("last_error")?,
        cancel_reason: row.try_get("cancel_reason")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        run_at: row.try_get("run_at")?,
        awaiting_publish: row.try_get("awaiting_publish")?,
        step_names: row.try_get("step_names")?,
        steps_fingerprint: row.try_get("steps_fingerprint")?,
        incompatible_since: row.try_get("incompatible_since")?,
        compensation_pending: row.try_get::<String, _>("compensation")? == "pending",
        priority: priority_from(id, row.try_get::<&str, _>("priority")?)?,
    })
}

pub(crate) fn claim_from(id: JobId, row: &PgRow) -> Result<Claim, FenceError> {
    let status: String = row.try_get("status")?;
    let prev: i64 = row.try_get("prev_fence")?;
    Ok(Claim {
        step: step_from(id, row.try_get("step")?)?,
        checkpoint: row.try_get("checkpoint")?,
        input: row.try_get("input")?,
        takeovers: count_from(id, "takeovers", row.try_get("takeovers")?)?,
        attempts: count_from(id, "attempts", row.try_get("attempts")?)?,
        status: status_from(id, &status)?,
        job_type: row.try_get("job_type")?,
        previous: ObservedFence::new(prev),
        takeover: row.try_get("took_over")?,
        step_names: row.try_get("step_names")?,
        incompatible_for: row
            .try_get::<Option<i64>, _>("incompatible_ms")?
            .map(|ms| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
    })
}

/// The few columns needed to say why a fenced statement matched zero rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Diag {
    pub fence: i64,
    pub step: StepIndex,
    pub status: JobStatus,
    pub released: bool,
}

pub(crate) fn diag_from(id: JobId, row: &PgRow) -> Result<Diag, FenceError> {
    let status: String = row.try_get("status")?;
    Ok(Diag {
        fence: row.try_get("fence")?,
        step: step_from(id, row.try_get("step")?)?,
        status: status_from(id, &status)?,
        released: row.try_get("released")?,
    })
}

pub(crate) fn step_from(id: JobId, raw: i32) -> Result<StepIndex, FenceError> {
    u32::try_from(raw)
        .map(StepIndex::new)
        .map_err(|_| FenceError::Corrupt {
            job_id: id,
            reason: format!("negative step {raw}"),
        })
}

pub(crate) fn step_to_sql(id: JobId, step: StepIndex) -> Result<i32, FenceError> {
    i32::try_from(step.get()).map_err(|_| FenceError::Corrupt {
        job_id: id,
        reason: format!("step {step} does not fit the step column"),
    })
}

fn count_from(id: JobId, what: &str, raw: i32) -> Result<u32, FenceError> {
    u32::try_from(raw).map_err(|_| FenceError::Corrupt {
        job_id: id,
        reason: format!("negative {what} {raw}"),
    })
}

/// A row's `priority` column (`FenceError::Corrupt` for a level no
/// migration allows).
pub(super) fn priority_from(id: JobId, raw: &str) -> Result<Priority, FenceError> {
    raw.parse()
        .map_err(|e: UnknownPriority| FenceError::Corrupt {
            job_id: id,
            reason: e.to_string(),
        })
}

fn status_from(id: JobId, raw: &str) -> Result<JobStatus, FenceError> {
    raw.parse().map_err(|e: UnknownStatus| FenceError::Corrupt {
        job_id: id,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips() {
        for s in [
            JobStatus::Pending,
            JobStatus::Running,
            JobStatus::Done,
            JobStatus::Dead,
            JobStatus::Cancelled,
        ] {
            assert_eq!(s.as_str().parse::<JobStatus>(), Ok(s));
        }
        assert!("paused".parse::<JobStatus>().is_err());
        assert!(JobStatus::Done.is_terminal() && JobStatus::Dead.is_terminal());
        assert!(JobStatus::Cancelled.is_terminal());
        assert!(!JobStatus::Pending.is_terminal() && !JobStatus::Running.is_terminal());
    }
}
