//! Phase 4b, the step-list check: after the claim, before any step runs, the
//! worker's definition of the job type must fit the steps the row committed
//! ([`step_list::fit`]). A fitting definition records its list on the row (in
//! the first step's transaction); one that does not hands the job back for a
//! worker with a compatible definition, or, once no such worker took it within
//! `Config::definition_grace`, dead-letters it as `definition_changed`.
//!
//! The check follows the claim, never precedes it: only the claim's row lock
//! makes "the steps committed so far" a fact no other owner can change before
//! our first step commits.

use std::time::Duration;

use super::outcome::{DeadCode, Outcome, Owned};
use super::run::JobRun;
use crate::fence::{Claim, FencedTx};
use crate::retry;
use crate::steps::{self as step_list, Fit};

/// The shortest hand-back delay of a job whose definition does not fit.
const MIN_HAND_BACK: Duration = Duration::from_millis(100);

impl JobRun {
    /// Phase 4b: `Ok` with the claim's transaction if our definition may
    /// resume the job, else the outcome (hand back or dead-letter).
    pub(super) async fn step_list_check(
        &self,
        owned: &Owned,
        claim: &Claim,
        mut claim_tx: FencedTx,
    ) -> Result<FencedTx, Outcome> {
        let own = owned.job.steps();
        let committed = usize::try_from(claim.step.get()).unwrap_or(usize::MAX);
        let recorded = claim.step_names.as_deref();
        match step_list::fit(recorded, committed, own) {
            Fit::Same if claim.incompatible_for.is_none() => Ok(claim_tx),
            Fit::Same | Fit::Compatible => {
                match claim_tx.record_steps(&step_list::names(own)).await {
                    Ok(()) => Ok(claim_tx),
                    Err(e) => Err(self.bookkeeping_failed(claim_tx, &e).await),
                }
            }
            Fit::Incompatible(why) => Err(self.not_fitting(owned, claim, claim_tx, &why).await),
        }
    }

    /// Our definition does not fit: hand the job back, marked, or dead-letter
    /// it once the grace has passed.
    async fn not_fitting(
        &self,
        owned: &Owned,
        claim: &Claim,
        mut claim_tx: FencedTx,
        why: &str,
    ) -> Outcome {
        let grace = self.shared.cfg.definition_grace;
        let past_grace = claim
            .incompatible_for
            .map_or(grace.is_zero(), |waited| waited >= grace);
        if !past_grace && let Err(e) = claim_tx.mark_incompatible().await {
            return self.bookkeeping_failed(claim_tx, &e).await;
        }
        // The release or the dead mark is fenced on its own connection: make
        // the claim (and the mark) durable first.
        if let Err(e) = claim_tx.commit_claim().await {
            tracing::warn!(error = %e, "committing the claim failed; retrying later");
            let delay = retry::jittered(&self.shared.cfg.retry_backoff, 0);
            return Outcome::Retry { delay };
        }
        let recorded = claim.step_names.as_deref().unwrap_or_default();
        let committed = usize::try_from(claim.step.get()).unwrap_or(usize::MAX);
        if past_grace {
            let reason = step_list::changed_reason(recorded, committed, owned.job.steps(), why);
            let code = DeadCode::DefinitionChanged;
            return Outcome::DeadLetter { code, reason };
        }
        let after = (grace / 100).max(MIN_HAND_BACK);
        tracing::warn!(
            recorded = ?recorded,
            committed,
            %why,
            ?after,
            "this worker's definition does not fit the job's committed steps; \
             handing it back for a worker with a compatible definition"
        );
        Outcome::Release { after }
    }

    /// A bookkeeping write in the claim's transaction failed: roll it back
    /// (which re-applies the claim) and retry later.
    async fn bookkeeping_failed(
        &self,
        claim_tx: FencedTx,
        e: &crate::fence::FenceError,
    ) -> Outcome {
        tracing::warn!(error = %e, "recording the step list on the job row failed; retrying later");
        let _ = claim_tx.rollback().await;
        let delay = retry::jittered(&self.shared.cfg.retry_backoff, 0);
        Outcome::Retry { delay }
    }
}
