//! Claims and admission: raising the fence ([`FenceStore::claim`],
//! [`FenceStore::claim_and_begin`]), opening a step's fenced transaction
//! ([`FenceStore::begin_step`]), and the verdict on a fenced statement that
//! matched zero rows.

use sqlx::{Executor, Postgres};
use tracing::Instrument;

use crate::types::{FencingToken, JobId, ObservedFence, StepIndex};

use super::FenceStore;
use super::error::FenceError;
use super::row::{Claim, Diag, claim_from, step_to_sql};
use super::status::JobStatus;
use super::tx::FencedTx;

/// How often a claim re-reads and retries when the row changed between its update
/// and its diagnosis (a concurrent redrive); each retry is a fresh, fenced attempt.
pub(super) const CLAIM_RETRIES: usize = 3;

impl FenceStore {
    /// Claims the job for `token`, before any useful work:
    /// `UPDATE jobs SET fence = $token, takeovers = takeovers + (fence > 0 AND NOT
    /// released)::int, released = false, status = 'running' WHERE id = $id AND
    /// fence < $token AND status IN ('pending', 'running') RETURNING ..`.
    ///
    /// Returns where to resume: the row's step and the checkpoint of the last
    /// committed step. `token` must come from a fresh lock acquisition, and a
    /// claim strictly raises the fence: a token equal to the row's fence was
    /// issued by etcd before (see [`FenceError::TokenRegression`]), so a second
    /// claim with the same token is refused, never taken as "ours".
    ///
    /// # Errors
    /// * [`FenceError::FencedOut`]: a newer token holds the fence; we are stale.
    /// * [`FenceError::TokenRegression`]: the fence equals `token` (etcd's
    ///   revisions went backwards): raise the alarm, hand the job back.
    /// * [`FenceError::Terminal`]: the job is `done` or `dead` (not a fence verdict:
    ///   ack and stop).
    /// * [`FenceError::NotFound`], [`FenceError::Db`].
    ///
    /// # Fencing
    /// After this returns, every statement under a smaller token finds zero rows,
    /// and no other claim can succeed with this token.
    pub async fn claim(&self, id: JobId, token: FencingToken) -> Result<Claim, FenceError> {
        let span = tracing::info_span!("tenure.fence.claim", job_id = %id, token = %token);
        async {
            for _ in 0..CLAIM_RETRIES {
                let row = sqlx::query(&self.sql.claim)
                    .bind(id.as_uuid())
                    .bind(token.get())
                    .fetch_optional(&self.pool)
                    .await?;
                if let Some(row) = row {
                    let claim = claim_from(id, &row)?;
                    log_claim(&claim, token);
                    return Ok(claim);
                }
                match self.claim_refused(&self.pool, id, token).await? {
                    ClaimVerdict::Retry => continue,
                    ClaimVerdict::Refused(err) => return Err(err),
                }
            }
            Err(FenceError::Db(sqlx::Error::Protocol(format!(
                "job {id}: claim under {token} kept racing concurrent changes"
            ))))
        }
        .instrument(span)
        .await
    }

    /// Claims the job for `token` and, in the same transaction, opens the fenced
    /// transaction of step `claim.step`: the claim's `UPDATE` already holds the row
    /// lock, so this saves the admission statement and a commit.
    ///
    /// The claim commits with the step ([`FencedTx::commit_step`]). On
    /// [`FencedTx::rollback`] the claim is re-applied on its own so the generation
    /// keeps the fence; if the [`FencedTx`] is merely dropped, the claim is lost
    /// and later fenced calls under this token fail with [`FenceError::NotClaimed`].
    /// Until the transaction ends, a smaller token's [`begin_step`](Self::begin_step)
    /// waits for the row lock (then fails with [`FenceError::FencedOut`]).
    ///
    /// # Errors
    /// As [`claim`](Self::claim).
    ///
    /// # Fencing
    /// As [`claim`](Self::claim) and [`FencedTx`].
    pub async fn claim_and_begin(
        &self,
        id: JobId,
        token: FencingToken,
    ) -> Result<(Claim, FencedTx), FenceError> {
        let span =
            tracing::info_span!("tenure.fence.claim_and_begin", job_id = %id, token = %token);
        async {
            let mut tx = self.begin().await?;
            let row = sqlx::query(&self.sql.claim_and_begin)
                .bind(id.as_uuid())
                .bind(token.get())
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(row) = row {
                let claim = claim_from(id, &row)?;
                log_claim(&claim, token);
                let step = claim.step;
                return Ok((
                    claim,
                    FencedTx::new(tx, self.clone(), id, token, step, true),
                ));
            }
            let _ = tx.rollback().await;
            // Refused (the plain claim says why), or the row changed between the
            // update and now (the plain claim retries; then admit as usual).
            let claim = self.claim(id, token).await?;
            let ftx = self.begin_step(id, token, claim.step).await?;
            Ok((claim, ftx))
        }
        .instrument(span)
        .await
    }

    /// Opens step `step`'s fenced transaction under `token`: `BEGIN`, then
    /// `tenure_admit($id, $token, $step)` (`SECURITY DEFINER`, migration 0015),
    /// which locks the row `FOR UPDATE` where `fence = $token AND step = $step
    /// AND status = 'running' AND NOT released`, and records the transaction's
    /// admission for the guard (`guard_admissions`; the settings
    /// `tenure.job_id` / `tenure.fence` are set too, for information only).
    ///
    /// # Errors
    /// Zero rows, before any user write: [`FenceError::FencedOut`] (a newer token
    /// claimed), [`FenceError::StepMismatch`], [`FenceError::Released`],
    /// [`FenceError::NotClaimed`], [`FenceError::Terminal`], [`FenceError::NotFound`].
    /// [`FenceError::Db`] on I/O.
    ///
    /// # Fencing
    /// See [`FencedTx`] and the [module docs](super#why-the-fence-holds-under-read-committed).
    pub async fn begin_step(
        &self,
        id: JobId,
        token: FencingToken,
        step: StepIndex,
    ) -> Result<FencedTx, FenceError> {
        let span = tracing::info_span!(
            "tenure.fence.begin_step",
            job_id = %id,
            token = %token,
            step = %step
        );
        async {
            let step_sql = step_to_sql(id, step)?;
            let mut tx = self.begin().await?;
            let admitted = sqlx::query(&self.sql.admit)
                .bind(id.as_uuid())
                .bind(token.get())
                .bind(step_sql)
                .fetch_optional(&mut *tx)
                .await?;
            if admitted.is_none() {
                let err = self.refusal(&mut *tx, id, token, Some(step)).await;
                let _ = tx.rollback().await;
                log_refusal(&err);
                // After the rollback: the note takes a connection of its own.
                self.record_refusal(&err, token, Some(step), "step").await;
                return Err(err);
            }
            Ok(FencedTx::new(tx, self.clone(), id, token, step, false))
        }
        .instrument(span)
        .await
    }

    /// Why a fenced statement matched zero rows (reads the row on `exec`). The
    /// caller notes a refusal in the job's history ([`record_refusal`](Self::record_refusal))
    /// once its own transaction has ended, so the note never waits, inside an open
    /// transaction, for a second connection.
    pub(super) async fn refusal<'e, E>(
        &self,
        exec: E,
        id: JobId,
        token: FencingToken,
        step: Option<StepIndex>,
    ) -> FenceError
    where
        E: Executor<'e, Database = Postgres>,
    {
        match self.diag(exec, id).await {
            Ok(diag) => verdict(id, token, diag, step),
            Err(e) => e,
        }
    }

    async fn claim_refused<'e, E>(
        &self,
        exec: E,
        id: JobId,
        token: FencingToken,
    ) -> Result<ClaimVerdict, FenceError>
    where
        E: Executor<'e, Database = Postgres>,
    {
        let diag = self.diag(exec, id).await?;
        let verdict = match diag {
            None => ClaimVerdict::Refused(FenceError::NotFound(id)),
            Some(d) if d.status.is_terminal() => ClaimVerdict::Refused(FenceError::Terminal {
                job_id: id,
                status: d.status,
            }),
            Some(d) if d.fence > token.get() => {
                let err = FenceError::FencedOut {
                    job_id: id,
                    ours: token.observed(),
                    current: ObservedFence::new(d.fence),
                };
                log_refusal(&err);
                self.record_refusal(&err, token, None, "claim").await;
                ClaimVerdict::Refused(err)
            }
            // Partition mode: the owner's own token on the row is its own
            // earlier claim; the row changed after our update. Try again.
            Some(d) if d.fence == token.get() && self.sql.partitioned => ClaimVerdict::Retry,
            Some(d) if d.fence == token.get() => {
                let err = FenceError::TokenRegression {
                    job_id: id,
                    token: token.observed(),
                };
                tracing::error!(
                    error = %err,
                    released = d.released,
                    "ALERT: fencing token regression: a fresh claim found its own token on the row"
                );
                ClaimVerdict::Refused(err)
            }
            // fence < token on a live row: it changed after our update; try again.
            Some(_) => ClaimVerdict::Retry,
        };
        Ok(verdict)
    }
}

enum ClaimVerdict {
    Retry,
    Refused(FenceError),
}

/// The verdict on a fenced write that matched zero rows, from the row as it is now.
pub(super) fn verdict(
    id: JobId,
    ours: FencingToken,
    diag: Option<Diag>,
    step: Option<StepIndex>,
) -> FenceError {
    let Some(d) = diag else {
        return FenceError::NotFound(id);
    };
    let current = ObservedFence::new(d.fence);
    let seen = ours.observed();
    if d.fence > ours.get() {
        FenceError::FencedOut {
            job_id: id,
            ours: seen,
            current,
        }
    } else if d.fence < ours.get() {
        FenceError::NotClaimed {
            job_id: id,
            ours: seen,
            current,
        }
    } else if d.status.is_terminal() {
        FenceError::Terminal {
            job_id: id,
            status: d.status,
        }
    } else if d.released || d.status != JobStatus::Running {
        FenceError::Released {
            job_id: id,
            token: seen,
        }
    } else if let Some(expected) = step.filter(|k| *k != d.step) {
        FenceError::StepMismatch {
            job_id: id,
            token: seen,
            expected,
            actual: d.step,
        }
    } else {
        FenceError::Corrupt {
            job_id: id,
            reason: format!(
                "a fenced statement under {ours} matched no row, yet the row matches it now"
            ),
        }
    }
}

fn log_claim(claim: &Claim, token: FencingToken) {
    if claim.takeover {
        tracing::warn!(
            token = %token,
            previous = ?claim.previous.map(ObservedFence::get),
            takeovers = claim.takeovers,
            step = %claim.step,
            "fence claimed: takeover from a generation that did not release"
        );
    } else {
        tracing::info!(
            token = %token,
            previous = ?claim.previous.map(ObservedFence::get),
            step = %claim.step,
            "fence claimed"
        );
    }
}

/// Logs a refusal: a stale rejection as a warning, any other verdict as info.
pub(super) fn log_refusal(err: &FenceError) {
    if err.is_fenced_out() {
        tracing::warn!(error = %err, "stale rejection");
    } else {
        tracing::info!(error = %err, "fenced statement refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(n: i64) -> FencingToken {
        FencingToken::for_tests(n)
    }

    fn diag(fence: i64, step: u32, status: JobStatus, released: bool) -> Option<Diag> {
        Some(Diag {
            fence,
            step: StepIndex::new(step),
            status,
            released,
        })
    }

    #[test]
    fn verdicts_keep_causes_apart() {
        let id = JobId::from_key("t", "k");
        let k = Some(StepIndex::new(2));
        assert!(matches!(
            verdict(id, tok(41), None, k),
            FenceError::NotFound(_)
        ));
        let e = verdict(id, tok(41), diag(42, 2, JobStatus::Running, false), k);
        assert!(e.is_fenced_out());
        assert!(matches!(e, FenceError::FencedOut { current: Some(c), .. } if c == tok(42)));
        // A newer owner that finished is still "fenced out" for a stale writer.
        assert!(verdict(id, tok(41), diag(42, 3, JobStatus::Done, false), k).is_fenced_out());
        assert!(matches!(
            verdict(id, tok(43), diag(42, 2, JobStatus::Running, false), k),
            FenceError::NotClaimed { .. }
        ));
        assert!(matches!(
            verdict(id, tok(42), diag(42, 2, JobStatus::Dead, true), k),
            FenceError::Terminal {
                status: JobStatus::Dead,
                ..
            }
        ));
        assert!(matches!(
            verdict(id, tok(42), diag(42, 2, JobStatus::Pending, true), k),
            FenceError::Released { .. }
        ));
        let e = verdict(id, tok(42), diag(42, 3, JobStatus::Running, false), k);
        assert!(
            matches!(e, FenceError::StepMismatch { actual, .. } if actual == StepIndex::new(3))
        );
        assert!(!e.is_fenced_out());
    }
}
