//! Bookkeeping of a generation and of the operator: a failed attempt, a
//! voluntary release, a dead job (fenced, or with no generation at all), and
//! the redrive of a dead job.

use tracing::Instrument;

use crate::types::{FencingToken, JobId};

use super::FenceStore;
use super::claims::{CLAIM_RETRIES, log_refusal, verdict};
use super::error::FenceError;
use super::row::Cancelled;
use super::status::JobStatus;

impl FenceStore {
    /// Records a failed attempt of generation `token`: `attempts + 1`, `last_error`,
    /// and marks the generation released (a voluntary retry: the next claim counts
    /// no takeover) with status `pending`. Returns the attempts now.
    ///
    /// # Errors
    /// [`FenceError::FencedOut`] and the other zero-row verdicts (see
    /// [`begin_step`](Self::begin_step)); [`FenceError::Db`].
    ///
    /// # Fencing
    /// `WHERE fence = $token AND status = 'running' AND NOT released`.
    pub async fn record_failure(
        &self,
        id: JobId,
        token: FencingToken,
        error: &str,
    ) -> Result<u32, FenceError> {
        let span = tracing::info_span!("tenure.fence.record_failure", job_id = %id, token = %token);
        async {
            let attempts: Option<i32> = sqlx::query_scalar(&self.sql.fail)
                .bind(id.as_uuid())
                .bind(token.get())
                .bind(error)
                .fetch_optional(&self.pool)
                .await?;
            match attempts {
                Some(n) => u32::try_from(n).map_err(|_| FenceError::Corrupt {
                    job_id: id,
                    reason: format!("negative attempts {n}"),
                }),
                None => {
                    let err = self.refusal(&self.pool, id, token, None).await;
                    log_refusal(&err);
                    self.record_refusal(&err, token, None, "step").await;
                    Err(err)
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Graceful release by generation `token` (shutdown, voluntary give-back): the
    /// next claim counts no takeover; this generation writes no more. Idempotent.
    ///
    /// # Errors
    /// As [`record_failure`](Self::record_failure).
    ///
    /// # Fencing
    /// `WHERE fence = $token AND status = 'running' AND NOT released`.
    pub async fn record_release(&self, id: JobId, token: FencingToken) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.record_release", job_id = %id, token = %token);
        async {
            let done = sqlx::query(&self.sql.release)
                .bind(id.as_uuid())
                .bind(token.get())
                .execute(&self.pool)
                .await?;
            if done.rows_affected() == 1 {
                return Ok(());
            }
            let diag = self.diag(&self.pool, id).await?;
            if let Some(d) = diag
                && d.fence == token.get()
                && d.released
                && !d.status.is_terminal()
            {
                return Ok(());
            }
            let err = verdict(id, token, diag, None);
            log_refusal(&err);
            Err(err)
        }
        .instrument(span)
        .await
    }

    /// Marks the job `dead` under generation `token` (poison, retries exhausted),
    /// recording `reason` as the last error; with `compensate` (the job type
    /// has an `on_dead` hook) its compensation becomes `pending` in the same
    /// statement (see `FenceStore::claim_compensation`). Works after this generation's own
    /// [`record_failure`](Self::record_failure). Idempotent.
    ///
    /// # Errors
    /// As [`record_failure`](Self::record_failure); [`FenceError::Terminal`] if the
    /// job is `done`.
    ///
    /// # Fencing
    /// `WHERE fence = $token AND status IN ('pending', 'running')`.
    pub async fn mark_dead(
        &self,
        id: JobId,
        token: FencingToken,
        reason: &str,
        compensate: bool,
    ) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.mark_dead", job_id = %id, token = %token);
        async {
            let done = sqlx::query(&self.sql.dead)
                .bind(id.as_uuid())
                .bind(token.get())
                .bind(reason)
                .bind(compensate)
                .execute(&self.pool)
                .await?;
            if done.rows_affected() == 1 {
                tracing::info!(reason, "job marked dead");
                return Ok(());
            }
            let diag = self.diag(&self.pool, id).await?;
            if let Some(d) = diag
                && d.fence == token.get()
                && d.status == JobStatus::Dead
            {
                return Ok(());
            }
            let err = match diag {
                // Our own released generation may still mark dead: only a newer
                // fence or a terminal status stops it.
                Some(d) if d.fence == token.get() => FenceError::Terminal {
                    job_id: id,
                    status: d.status,
                },
                _ => verdict(id, token, diag, None),
            };
            log_refusal(&err);
            Err(err)
        }
        .instrument(span)
        .await
    }

    /// Marks the job `dead` without a token (its compensation `pending` with
    /// `compensate`), for paths where no generation exists
    /// (payload that does not deserialize, unknown job type, the broker giving up).
    /// Only a non-terminal row changes; a `done` or `dead` row is left as it is and
    /// this returns `Ok`. It waits for a running step's transaction (row lock), and
    /// a live owner's next fenced write then fails with [`FenceError::Terminal`].
    ///
    /// # Errors
    /// [`FenceError::NotFound`], [`FenceError::Db`].
    pub async fn mark_dead_unfenced(
        &self,
        id: JobId,
        reason: &str,
        compensate: bool,
    ) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.mark_dead_unfenced", job_id = %id);
        async {
            let done = sqlx::query(&self.sql.dead_unfenced)
                .bind(id.as_uuid())
                .bind(reason)
                .bind(compensate)
                .execute(&self.pool)
                .await?;
            if done.rows_affected() == 1 {
                tracing::info!(reason, "job marked dead (unfenced)");
                return Ok(());
            }
            match self.diag(&self.pool, id).await? {
                Some(_) => Ok(()),
                None => Err(FenceError::NotFound(id)),
            }
        }
        .instrument(span)
        .await
    }

    /// Operator redrive: `dead` -> `pending` with `takeovers = 0`, `attempts = 0`,
    /// keeping the step, checkpoint, fence and last error, so the job resumes where
    /// it stopped. A compare-and-set on the fence value read (and on `dead`), so it
    /// cannot race a claim.
    ///
    /// # Errors
    /// [`FenceError::NotDead`], [`FenceError::NotFound`], [`FenceError::Db`].
    pub async fn reset_for_redrive(&self, id: JobId) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.reset_for_redrive", job_id = %id);
        async {
            for _ in 0..CLAIM_RETRIES {
                let Some(d) = self.diag(&self.pool, id).await? else {
                    return Err(FenceError::NotFound(id));
                };
                if d.status != JobStatus::Dead {
                    return Err(FenceError::NotDead {
                        job_id: id,
                        status: d.status,
                    });
                }
                let done = sqlx::query(&self.sql.redrive)
                    .bind(id.as_uuid())
                    .bind(d.fence)
                    .execute(&self.pool)
                    .await?;
                if done.rows_affected() == 1 {
                    tracing::info!("job reset for redrive");
                    return Ok(());
                }
            }
            Err(FenceError::Db(sqlx::Error::Protocol(format!(
                "job {id}: redrive kept racing concurrent changes"
            ))))
        }
        .instrument(span)
        .await
    }

    /// Operator cancel: a `pending`, `running` or `dead` job becomes `cancelled`, with
    /// `reason` and the time. No token: the `UPDATE` takes the job row lock,
    /// so it waits behind an owner's open step transaction (at most the
    /// connection's `lock_timeout`, 2 x TTL) and lands after that commit or
    /// rollback. From the cancel's commit on, every claim, admission and step
    /// commit finds a terminal row and is refused: nothing an owner commits
    /// later commits. Idempotent.
    ///
    /// # Errors
    /// [`FenceError::NotFound`]; [`FenceError::Terminal`] with `done` (a
    /// finished job is not cancelled); [`FenceError::CompensationPending`] (a
    /// dead job whose `on_dead` hook has not ended: cancelling it would
    /// abandon the compensation half-done); [`FenceError::Db`] (a lock wait past
    /// `lock_timeout` included).
    pub async fn cancel_job(&self, id: JobId, reason: &str) -> Result<Cancelled, FenceError> {
        let span = tracing::info_span!("tenure.fence.cancel_job", job_id = %id);
        async {
            for _ in 0..CLAIM_RETRIES {
                let fence: Option<i64> = sqlx::query_scalar(&self.sql.cancel)
                    .bind(id.as_uuid())
                    .bind(reason)
                    .fetch_optional(&self.pool)
                    .await?;
                if let Some(fence) = fence {
                    tracing::info!(reason, fence, "job cancelled by an operator");
                    return Ok(Cancelled::Now);
                }
                match self.diag(&self.pool, id).await? {
                    None => return Err(FenceError::NotFound(id)),
                    Some(d) if d.status == JobStatus::Cancelled => return Ok(Cancelled::Already),
                    // Dead, and its `on_dead` compensation not ended.
                    Some(d) if d.status == JobStatus::Dead => {
                        return Err(FenceError::CompensationPending(id));
                    }
                    Some(d) if d.status.is_terminal() => {
                        let status = d.status;
                        return Err(FenceError::Terminal { job_id: id, status });
                    }
                    // Live again (a redrive raced us): try once more.
                    Some(_) => continue,
                }
            }
            Err(FenceError::Db(sqlx::Error::Protocol(format!(
                "job {id}: cancel kept racing concurrent changes"
            ))))
        }
        .instrument(span)
        .await
    }
}
