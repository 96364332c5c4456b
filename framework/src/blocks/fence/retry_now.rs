//! An operator's retry-now and reschedule (migration 0019): the row checks
//! and writes, each one `SECURITY DEFINER` call under the job's row lock.
//!
//! Neither makes anyone the job's owner. A retry-now only checks that the job
//! waits in retry backoff and records the event; the caller then publishes
//! one more message for the job, which a worker admits, locks and claims as
//! any other (a live owner's lock and fence keep it out). A reschedule moves
//! `run_at` only while the job still awaits publication; the leader's
//! publisher holds the rows it publishes locked until they are marked
//! published, so the two are ordered by the row lock.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::status::WrongState;
use super::{FenceError, FenceStore};
use crate::types::JobId;

/// `Ok` for the row function's `ok`, else the refusal it names.
fn refusal(job_id: JobId, outcome: &str) -> Result<(), FenceError> {
    if outcome == "ok" {
        return Ok(());
    }
    match WrongState::from_outcome(outcome) {
        Some(state) => Err(FenceError::WrongState { job_id, state }),
        None if outcome == "unknown" => Err(FenceError::NotFound(job_id)),
        None => Err(FenceError::Db(sqlx::Error::Protocol(format!(
            "unexpected answer {outcome:?} about job {job_id}"
        )))),
    }
}

impl FenceStore {
    /// Checks, under the job's row lock, that `id` waits in retry backoff
    /// (pending, failed at least once, its message out) and records the
    /// history event `retried_now` (`tenure_retry_now`, the operator's
    /// grant). Returns the row's attempts. Changes nothing else: publishing
    /// the message that starts the next attempt is the caller's.
    ///
    /// # Errors
    /// [`FenceError::NotFound`], [`FenceError::WrongState`] (nothing written),
    /// [`FenceError::Db`].
    pub async fn retry_now(&self, id: JobId) -> Result<u32, FenceError> {
        let sql = format!(
            "SELECT o_outcome, o_attempts FROM {}($1)",
            self.table("tenure_retry_now")
        );
        let row = sqlx::query(&sql)
            .bind(id.as_uuid())
            .fetch_one(&self.pool)
            .await?;
        let outcome: String = row.try_get("o_outcome")?;
        refusal(id, &outcome)?;
        let attempts: i32 = row.try_get("o_attempts")?;
        Ok(u32::try_from(attempts).unwrap_or(0))
    }

    /// Moves delayed job `id`'s `run_at`, under its row lock, while it still
    /// awaits publication (`tenure_reschedule`, the operator's grant), and
    /// records the history event `rescheduled`. A `run_at` that has come
    /// wakes the scheduler leader's publisher (the outbox channel).
    ///
    /// # Errors
    /// [`FenceError::NotFound`], [`FenceError::WrongState`] (nothing written),
    /// [`FenceError::ArgumentRefused`] (not a time), [`FenceError::Db`].
    pub async fn reschedule(&self, id: JobId, run_at: DateTime<Utc>) -> Result<(), FenceError> {
        let sql = format!("SELECT {}($1, $2)", self.table("tenure_reschedule"));
        let mut conn = self.pool.acquire().await?;
        let outcome: String = sqlx::query_scalar(&sql)
            .bind(id.as_uuid())
            .bind(run_at)
            .fetch_one(&mut *conn)
            .await?;
        refusal(id, &outcome)?;
        if run_at <= Utc::now() {
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(self.outbox_channel())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
}
