//! Job rows without a token: creating a row once, reading rows, and the
//! diagnosis read behind every refusal.

use sqlx::{Executor, Postgres};
use tracing::Instrument;

use crate::steps as step_list;
use crate::steps::StepInfo;
use crate::types::{JobId, Priority};

use super::FenceStore;
use super::access::on_live_session;
use super::claims::CLAIM_RETRIES;
use super::error::FenceError;
use super::row::{Diag, Inserted, JobRow, diag_from, job_row};
use super::status::JobStatus;

impl FenceStore {
    /// Inserts a `pending` job row. Idempotent: the same id with the same job type and
    /// input (compared as `jsonb`, so key order does not matter) is
    /// [`Inserted::Existing`] and changes nothing.
    ///
    /// # Errors
    /// [`FenceError::PayloadConflict`] when the id exists with another job type or
    /// input (never overwritten); [`FenceError::Db`].
    pub async fn insert_job(
        &self,
        id: JobId,
        job_type: &str,
        input: &serde_json::Value,
    ) -> Result<Inserted, FenceError> {
        self.insert_row(id, job_type, input, (None, None), Priority::Normal)
            .await
    }

    /// Inserts a delayed job row: due at `run_at`. A `run_at` in the future
    /// (by PostgreSQL's clock) leaves the row `awaiting_publish`: no message is
    /// sent for it until the scheduler leader publishes it once due
    /// (the runtime's `FenceStore::lock_due`, then its batch's mark);
    /// a `run_at` now or past makes an ordinary row, to be published by the
    /// caller.
    /// Idempotent as [`FenceStore::insert_job`]: an existing row (same type and
    /// input) is [`Inserted::Existing`] and keeps its own `run_at`.
    ///
    /// # Errors
    /// As [`FenceStore::insert_job`].
    pub async fn insert_job_at(
        &self,
        id: JobId,
        job_type: &str,
        input: &serde_json::Value,
        run_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Inserted, FenceError> {
        self.insert_row(id, job_type, input, (Some(run_at), None), Priority::Normal)
            .await
    }

    /// Inserts a job row of a typed definition: as
    /// [`FenceStore::insert_job`] (`run_at: None`) or
    /// [`FenceStore::insert_job_at`], and records the definition's step names
    /// and their fingerprint ([`JobRow::step_names`]), against which workers
    /// check their own definition before resuming the job. An existing row
    /// keeps its own list.
    ///
    /// # Errors
    /// As [`FenceStore::insert_job`].
    pub async fn insert_defined_job(
        &self,
        id: JobId,
        job_type: &str,
        input: &serde_json::Value,
        run_at: Option<chrono::DateTime<chrono::Utc>>,
        steps: &[StepInfo],
    ) -> Result<Inserted, FenceError> {
        self.insert_row(id, job_type, input, (run_at, Some(steps)), Priority::Normal)
            .await
    }

    /// The one insert of a job row behind the three above (and the client's
    /// enqueues): due at `run_at` (`None`: now), with the definition's
    /// `steps` if typed, at `priority` (recorded for the job's later
    /// messages).
    pub(crate) async fn insert_row(
        &self,
        id: JobId,
        job_type: &str,
        input: &serde_json::Value,
        (run_at, steps): (Option<chrono::DateTime<chrono::Utc>>, Option<&[StepInfo]>),
        priority: Priority,
    ) -> Result<Inserted, FenceError> {
        let names = steps.map(step_list::names);
        let fingerprint = names.as_deref().map(step_list::fingerprint);
        let span = tracing::info_span!("tenure.fence.insert_job", job_id = %id, job_type);
        async {
            let trace = crate::telemetry::propagation::current_row_value();
            for _ in 0..CLAIM_RETRIES {
                let insert = || {
                    sqlx::query(&self.sql.insert)
                        .bind(id.as_uuid())
                        .bind(job_type)
                        .bind(input)
                        .bind(run_at)
                        .bind(&names)
                        .bind(&fingerprint)
                        .bind(&trace)
                        .bind(priority.as_str())
                        .execute(&self.pool)
                };
                // A prune committed while the insert waited: look again.
                let done = match on_live_session(&self.pool, insert).await {
                    Err(e) if super::error::is_tombstoned(&e) => continue,
                    done => done?,
                };
                if done.rows_affected() == 1 {
                    return Ok(Inserted::New);
                }
                // ON CONFLICT DO NOTHING waited for a concurrent inserter to finish,
                // so the row is visible now (unless it was deleted meanwhile: retry).
                if let Some(found) = self.existing(&self.pool, id, job_type, input).await? {
                    return found;
                }
            }
            Err(FenceError::NotFound(id))
        }
        .instrument(span)
        .await
    }

    /// What an insert that conflicted on `id` found: the same job
    /// ([`Inserted::Existing`], or [`Inserted::Pruned`] from its tombstone),
    /// another one under the id
    /// ([`FenceError::PayloadConflict`]), or `None` when the row is gone
    /// (deleted meanwhile: insert again).
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub(super) async fn existing<'e, E>(
        &self,
        exec: E,
        id: JobId,
        job_type: &str,
        input: &serde_json::Value,
    ) -> Result<Option<Result<Inserted, FenceError>>, FenceError>
    where
        E: Executor<'e, Database = Postgres>,
    {
        let found: Option<(bool, String, bool)> = sqlx::query_as(&self.sql.same_payload)
            .bind(id.as_uuid())
            .bind(job_type)
            .bind(input)
            .fetch_optional(exec)
            .await?;
        let Some((same, status, tombstone)) = found else {
            return Ok(None);
        };
        if !same {
            return Ok(Some(Err(FenceError::PayloadConflict { job_id: id })));
        }
        if !tombstone {
            return Ok(Some(Ok(Inserted::Existing)));
        }
        let status = status
            .parse::<JobStatus>()
            .map_err(|e| FenceError::Corrupt {
                job_id: id,
                reason: format!("tombstone status: {e:?}"),
            })?;
        Ok(Some(Ok(Inserted::Pruned(status))))
    }

    /// Reads one job row.
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn job(&self, id: JobId) -> Result<Option<JobRow>, FenceError> {
        let read = || {
            sqlx::query(&self.sql.job)
                .bind(id.as_uuid())
                .fetch_optional(&self.pool)
        };
        let row = on_live_session(&self.pool, read).await?;
        row.as_ref().map(job_row).transpose()
    }

    /// Reads one job row on `conn`: inside the caller's transaction, a row it
    /// inserted itself and has not committed is seen.
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn job_on(
        &self,
        conn: &mut sqlx::PgConnection,
        id: JobId,
    ) -> Result<Option<JobRow>, FenceError> {
        let row = sqlx::query(&self.sql.job)
            .bind(id.as_uuid())
            .fetch_optional(conn)
            .await?;
        row.as_ref().map(job_row).transpose()
    }

    /// One round trip to PostgreSQL (`SELECT 1` on a pooled connection): whether
    /// the worker can reach it now. The runtime's probe of a PostgreSQL it
    /// suspects is unreachable (partition mode stands down without it).
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn ping(&self) -> Result<(), FenceError> {
        // A pooled session the server ended says nothing about the server
        // now: ask on a fresh one.
        let ask = || sqlx::query("SELECT 1").execute(&self.pool);
        on_live_session(&self.pool, ask).await?;
        Ok(())
    }

    /// Reads the job rows of `ids` in one query (ids without a row are simply
    /// missing from the answer; the order is unspecified).
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn jobs(&self, ids: &[JobId]) -> Result<Vec<JobRow>, FenceError> {
        let ids: Vec<uuid::Uuid> = ids.iter().map(JobId::as_uuid).collect();
        let read = || sqlx::query(&self.sql.jobs).bind(&ids).fetch_all(&self.pool);
        let rows = on_live_session(&self.pool, read).await?;
        rows.iter().map(job_row).collect()
    }

    /// Lists up to `limit` job rows, oldest first, optionally of one status.
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn list_jobs(
        &self,
        status: Option<JobStatus>,
        limit: i64,
    ) -> Result<Vec<JobRow>, FenceError> {
        let rows = sqlx::query(&self.sql.list)
            .bind(status.map(JobStatus::as_str))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(job_row).collect()
    }

    /// The row's fence, step, status and released flag, read on `exec`.
    pub(super) async fn diag<'e, E>(&self, exec: E, id: JobId) -> Result<Option<Diag>, FenceError>
    where
        E: Executor<'e, Database = Postgres>,
    {
        let row = sqlx::query(&self.sql.diag)
            .bind(id.as_uuid())
            .fetch_optional(exec)
            .await?;
        row.as_ref().map(|r| diag_from(id, r)).transpose()
    }
}
