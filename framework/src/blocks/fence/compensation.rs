//! A dead job's compensation (`#[tenure::job(on_dead = ..)]`, migration
//! 0011): the `compensation` column is `pending` from the statement that marks
//! the job dead until the hook's own fenced transaction flips it to `done`.
//!
//! The worker that compensates raises the fence to its token first
//! ([`FenceStore::claim_compensation`]: a compare-and-swap, like a claim, but
//! on a `dead` row), then runs the hook in a transaction admitted under that
//! fence ([`FenceStore::begin_compensation`], row locked `FOR UPDATE`, the
//! guard's settings set) and commits it with the flip
//! ([`FencedTx::commit_compensation`]). So the hook's writes commit at most
//! once per death: a second compensator (a takeover after a crash mid-hook)
//! raises the fence past the first, whose commit is then refused, and finds
//! `done` once the first committed.

use sqlx::Row;
use tracing::Instrument;

use crate::types::{FencingToken, JobId, ObservedFence, StepIndex};

use super::FenceStore;
use super::claims::log_refusal;
use super::error::FenceError;
use super::row::step_from;
use super::tx::FencedTx;

/// What a compensation needs to know of its dead job
/// ([`FenceStore::claim_compensation`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeadRow {
    /// The job's input as enqueued.
    pub(crate) input: serde_json::Value,
    /// The step it died at (the number of committed steps).
    pub(crate) step: StepIndex,
    /// The last committed step's output (`None`: no step committed).
    pub(crate) checkpoint: Option<serde_json::Value>,
    /// Why it died.
    pub(crate) reason: String,
    /// The row's recorded step names
    /// ([`JobRow::step_names`](super::JobRow::step_names)): the first `step`
    /// of them are the steps that committed, the last of those wrote
    /// `checkpoint` (`None`: the row recorded none).
    pub(crate) step_names: Option<Vec<String>>,
}

impl FenceStore {
    /// Raises the fence of dead job `id` to `token` if its compensation is
    /// `pending` (the same token again is accepted: the owner that marked it
    /// dead compensates under its own fence). `None`: nothing to compensate
    /// (`none` or `done`).
    ///
    /// # Errors
    /// [`FenceError::FencedOut`] if a larger token compensates already;
    /// [`FenceError::NotFound`]; [`FenceError::Db`].
    ///
    /// # Fencing
    /// `WHERE status = 'dead' AND compensation = 'pending' AND fence <= $token`.
    pub(crate) async fn claim_compensation(
        &self,
        id: JobId,
        token: FencingToken,
    ) -> Result<Option<DeadRow>, FenceError> {
        let span =
            tracing::info_span!("tenure.fence.claim_compensation", job_id = %id, token = %token);
        async {
            let row = sqlx::query(&self.sql.claim_compensation)
                .bind(id.as_uuid())
                .bind(token.get())
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = row {
                let step: i32 = row.try_get("step")?;
                return Ok(Some(DeadRow {
                    input: row.try_get("input")?,
                    step: step_from(id, step)?,
                    checkpoint: row.try_get("checkpoint")?,
                    reason: row
                        .try_get::<Option<String>, _>("last_error")?
                        .unwrap_or_else(|| "dead".into()),
                    step_names: row.try_get("step_names")?,
                }));
            }
            let now: Option<(i64, String)> = sqlx::query_as(&self.sql.compensation_state)
                .bind(id.as_uuid())
                .fetch_optional(&self.pool)
                .await?;
            match now {
                None => Err(FenceError::NotFound(id)),
                Some((fence, state)) if state == "pending" && fence > token.get() => {
                    let err = FenceError::FencedOut {
                        job_id: id,
                        ours: token.observed(),
                        current: ObservedFence::new(fence),
                    };
                    log_refusal(&err);
                    Err(err)
                }
                Some(_) => Ok(None),
            }
        }
        .instrument(span)
        .await
    }

    /// Opens the fenced transaction of dead job `id`'s compensation under
    /// `token` (after the runtime's `claim_compensation`): the
    /// row is locked `FOR UPDATE` while `fence = token`, `status = 'dead'` and
    /// `compensation = 'pending'`, and the guard's settings are set, so the
    /// hook may write to guarded tables through [`FencedTx::conn`].
    ///
    /// # Errors
    /// [`FenceError::FencedOut`] when the row does not admit this token (a
    /// newer compensator, or the compensation is done); [`FenceError::Db`].
    pub async fn begin_compensation(
        &self,
        id: JobId,
        token: FencingToken,
    ) -> Result<FencedTx, FenceError> {
        let span =
            tracing::info_span!("tenure.fence.begin_compensation", job_id = %id, token = %token);
        async {
            let mut tx = self.begin().await?;
            let admitted = sqlx::query(&self.sql.admit_compensation)
                .bind(id.as_uuid())
                .bind(token.get())
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = admitted else {
                let _ = tx.rollback().await;
                return Err(self.compensation_refused(id, token).await);
            };
            let step: i32 = row.try_get("step")?;
            let step = step_from(id, step)?;
            Ok(FencedTx::new(tx, self.clone(), id, token, step, false))
        }
        .instrument(span)
        .await
    }

    /// Why a compensation's admission or commit matched no row.
    pub(super) async fn compensation_refused(&self, id: JobId, token: FencingToken) -> FenceError {
        let now: Result<Option<(i64, String)>, _> = sqlx::query_as(&self.sql.compensation_state)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await;
        let err = match now {
            Err(e) => FenceError::from(e),
            Ok(None) => FenceError::NotFound(id),
            Ok(Some((fence, _))) => FenceError::FencedOut {
                job_id: id,
                ours: token.observed(),
                current: ObservedFence::new(fence),
            },
        };
        log_refusal(&err);
        err
    }
}

impl FencedTx {
    /// Ends a compensation: `compensation = 'done'` where the fence is still
    /// this transaction's token and the compensation `pending`, then commits
    /// (the hook's writes with it). Zero rows: rolled back, nothing commits.
    ///
    /// # Errors
    /// [`FenceError::FencedOut`] (a newer compensator, or already done);
    /// [`FenceError::Db`].
    pub async fn commit_compensation(self) -> Result<(), FenceError> {
        let (job_id, token) = (self.job_id(), self.token());
        let store = self.store().clone();
        let mut tx = self.into_inner();
        let flipped = sqlx::query(&store.sql.finish_compensation)
            .bind(job_id.as_uuid())
            .bind(token.get())
            .execute(&mut *tx)
            .await?;
        if flipped.rows_affected() != 1 {
            let _ = tx.rollback().await;
            return Err(store.compensation_refused(job_id, token).await);
        }
        tx.commit().await?;
        tracing::info!(%job_id, %token, "compensation committed");
        Ok(())
    }
}
