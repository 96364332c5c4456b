//! A dead job's `on_dead` hook (`#[tenure::job(on_dead = ..)]`), run once per
//! death: the compensation's fence is claimed (the owner that marked the job
//! dead keeps its own token; a worker that finds a dead row whose
//! compensation is pending raises the fence to its fresh lock's), the hook
//! runs with a [`StepCtx`] whose `db()` opens the compensation's fenced
//! transaction, and that transaction commits the hook's writes together with
//! `compensation = 'done'` (see `fence::compensation`). Until it commits, the
//! job's message is not dead-lettered, so a crash mid-hook is redelivered and
//! compensated by the next owner; a stale one's commit is refused.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt as _;

use super::outcome::{Compensated, Compensation, Outcome};
use super::run::JobRun;
use crate::job::{DeadJob, StepCtx, StepErrorKind};
use crate::retry;
use crate::telemetry::StaleAt;

impl JobRun {
    /// Runs the job's `on_dead` hook if its compensation is pending: `Err` is
    /// how the delivery ends instead (a retry, or stale).
    pub(super) async fn compensate(&self, c: Compensation<'_>) -> Result<Compensated, Outcome> {
        let sh = &self.shared;
        let retry = |attempt| Outcome::Retry {
            delay: retry::jittered(&sh.cfg.retry_backoff, attempt),
        };
        let dead = match sh.store.claim_compensation(c.job_id, c.token).await {
            Ok(Some(dead)) => dead,
            Ok(None) => return Ok(Compensated::Done),
            Err(e) if e.is_fenced_out() => return Err(stale(&e)),
            Err(e) => {
                tracing::warn!(error = %e, "claiming the compensation failed; retrying later");
                return Err(retry(c.attempt));
            }
        };
        let mut ctx = compensation_ctx(self, &c, &dead);
        let info = DeadJob::of_definition(
            c.job.steps(),
            dead.reason,
            dead.step,
            dead.checkpoint,
            dead.step_names,
        );
        tracing::info!(step = %info.step, fits = info.fits, "running the on_dead hook");
        let ran = AssertUnwindSafe(c.job.on_dead(&mut ctx, info))
            .catch_unwind()
            .await;
        let tx = ctx.tx.take();
        let failure = match ran {
            Ok(Ok(())) => None,
            Ok(Err(e)) if e.kind() == StepErrorKind::Permanent => {
                Some((format!("on_dead failed permanently: {}", e.message()), None))
            }
            Ok(Err(e)) => Some((
                format!("on_dead: {}", e.message()),
                Some(e.requested_delay()),
            )),
            Err(_) => Some(("on_dead panicked".to_string(), Some(None))),
        };
        if let Some((note, retry_after)) = failure {
            if let Some(tx) = tx {
                let _ = tx.rollback().await;
            }
            tracing::warn!(%note, "the on_dead hook failed");
            return match retry_after {
                None => Ok(Compensated::Failed(note)),
                Some(Some(delay)) => Err(Outcome::Retry { delay }),
                Some(None) => Err(retry(c.attempt)),
            };
        }
        let tx = match tx {
            Some(tx) => tx,
            None => match sh.store.begin_compensation(c.job_id, c.token).await {
                Ok(tx) => tx,
                Err(e) if e.is_fenced_out() => return Err(stale(&e)),
                Err(e) => {
                    tracing::warn!(error = %e, "opening the compensation failed; retrying later");
                    return Err(retry(c.attempt));
                }
            },
        };
        match tx.commit_compensation().await {
            Ok(()) => Ok(Compensated::Done),
            Err(e) if e.is_fenced_out() => Err(stale(&e)),
            Err(e) => {
                tracing::warn!(error = %e, "committing the compensation failed; retrying later");
                Err(retry(c.attempt))
            }
        }
    }
}

/// The hook's context: `db()` opens the compensation's fenced transaction.
fn compensation_ctx(run: &JobRun, c: &Compensation<'_>, dead: &crate::fence::DeadRow) -> StepCtx {
    let sh = &run.shared;
    StepCtx {
        job_id: c.job_id,
        job_type: c.job.name(),
        step: dead.step,
        step_name: "on_dead",
        token: c.token,
        attempt: c.attempt,
        cancel: sh.stop_jobs.child_token(),
        deadline: c.session.lost_deadline(),
        store: Some(sh.store.clone()),
        tx: None,
        handover: None,
        claim_lost: false,
        job_input: Some(Arc::new(dead.input.clone())),
        compensating: true,
        #[cfg(feature = "mysql")]
        mysql: None,
    }
}

/// A compensation refused by a newer owner's fence.
fn stale(e: &crate::fence::FenceError) -> Outcome {
    Outcome::Stale {
        at: StaleAt::StepCommit,
        step: None,
        error: e.to_string(),
    }
}
