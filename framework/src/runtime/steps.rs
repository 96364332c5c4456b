//! Phase 5: the steps of a claimed job, each in a `StageActor`, each committed with
//! its checkpoint through a fenced transaction, after the pre-commit check (phase 6).
//! A step that ends the delivery returns its [`Outcome`]; `settle` does the
//! rest.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::job_actor::lease_health_now;
use super::outcome::{DeadCode, Outcome, Owned};
use super::run::JobRun;
use super::stage::{StageOutcome, run_stage};
use crate::StepIndex;
use crate::fence::{Claim, FenceError, FencedTx, JobStatus};
use crate::handover::{Handover, Offer};
use crate::job::{StepCtx, StepError, StepErrorKind};
use crate::lease::Health;
use crate::queue::Delivery;
use crate::telemetry::{StaleAt, spans};

/// The step about to run.
#[derive(Clone, Copy)]
struct StepAt {
    index: StepIndex,
    name: &'static str,
    last: bool,
}

/// What a committed step hands to the next: its output and the fenced
/// transaction its commit opened for the next step.
type Committed = (serde_json::Value, Option<FencedTx>);

impl JobRun {
    /// Runs the steps from the claim's first uncommitted one: `Ok` once the
    /// last one committed (the job row is `done`).
    pub(super) async fn run_steps(
        &self,
        owned: &Owned,
        delivery: &Delivery,
        claim: Claim,
        claim_tx: FencedTx,
    ) -> Result<(), Outcome> {
        let steps = owned.job.steps();
        let n = u32::try_from(steps.len()).unwrap_or(u32::MAX);
        let first = claim.step.get();
        let mut input = if first == 0 {
            claim.input
        } else {
            claim.checkpoint.unwrap_or(serde_json::Value::Null)
        };
        // The claim's transaction goes to the first step, which takes it on its
        // first `ctx.db()`. A step that does other work first must not keep the
        // job row locked (and the transaction idle towards
        // `idle_in_transaction_session_timeout`) nor a pooled connection: after
        // `open_tx_window` the claim is committed alone and the step opens its own
        // transaction.
        let mut open_tx = Some(claim_tx);
        for k in first..n {
            if owned.cancel.is_cancelled() {
                // A cancel notice came before this step started.
                if let Some(tx) = open_tx.take() {
                    let _ = tx.rollback().await;
                }
                return Err(self.cancel_asked(owned).await);
            }
            // Shutdown, or the job's partition goes to another worker: stop
            // at this step boundary, released (no takeover for the next owner).
            if (self.shared.draining.is_cancelled() || owned.handing_over()) && k > first {
                // The transaction opened for this step holds the job row.
                if let Some(tx) = open_tx.take() {
                    let _ = tx.rollback().await;
                }
                return Err(Outcome::Release {
                    after: Duration::ZERO,
                });
            }
            // A paused type: the job waits here, its next step's transaction
            // rolled back so that no row stays locked meanwhile.
            if k > first && self.shared.pauses.is_paused(owned.job.name()) {
                if let Some(tx) = open_tx.take() {
                    let _ = tx.rollback().await;
                }
                Box::pin(self.wait_between_steps(owned, delivery)).await?;
            }
            let step = StepAt {
                index: StepIndex::new(k),
                name: steps.get(k as usize).map_or("?", |s| s.name),
                last: k + 1 == n,
            };
            (input, open_tx) = self
                .run_step(owned, delivery, step, input, open_tx.take())
                .await?;
        }
        Ok(())
    }

    /// Runs one step and commits it (or says how the delivery ends).
    async fn run_step(
        &self,
        owned: &Owned,
        delivery: &Delivery,
        step: StepAt,
        input: serde_json::Value,
        open_tx: Option<FencedTx>,
    ) -> Result<Committed, Outcome> {
        let sh = &self.shared;
        let started = Instant::now();
        let (asks_tx, asks) = mpsc::channel(1);
        let window_end = started + open_tx_window(&sh.cfg);
        let mut desk = Desk {
            cancel: sh.stop_jobs.child_token(),
            offer: Offer::new(open_tx, window_end),
            asks,
        };
        let ctx = StepCtx {
            job_id: owned.job_id,
            job_type: owned.job.name(),
            step: step.index,
            step_name: step.name,
            token: owned.token,
            attempt: owned.attempts,
            cancel: desk.cancel.clone(),
            deadline: owned.session.lost_deadline(),
            store: Some(sh.store.clone()),
            tx: None,
            handover: Some(asks_tx),
            claim_lost: false,
            job_input: Some(owned.input.clone()),
            compensating: false,
            #[cfg(feature = "mysql")]
            mysql: None,
        };
        let span = tracing::info_span!(spans::STEP, step = %step.index, name = step.name, token = owned.token.get());
        #[cfg(feature = "testing")]
        super::faults::step_start(&sh.cfg, owned.job_id, step.index).await;
        let mut outcome = self
            .drive_stage(owned, delivery, ctx, step.index, input, &mut desk)
            .instrument(span)
            .await;
        if owned.cancel.is_cancelled() {
            // An operator's cancel notice stopped the step: nothing of it
            // commits, whatever it returned.
            rollback_all(desk.offer, outcome.ctx.as_mut()).await;
            return Err(Box::pin(self.cancel_asked(owned)).await);
        }
        // The transaction opened for this step, if the step did not take it:
        // the checkpoint's commit uses it.
        if let Some(tx) = desk.offer.leftover() {
            match outcome.ctx.as_mut() {
                Some(ctx) if ctx.tx.is_none() => ctx.tx = Some(tx),
                // Rolling back a claim's transaction re-applies the claim on its own.
                _ => {
                    let _ = tx.rollback().await;
                }
            }
        }
        match (outcome.result, outcome.ctx) {
            (Ok(out), Some(ctx)) => Box::pin(self.commit(owned, ctx, step, out, started)).await,
            (Ok(_), None) => Err(Outcome::fail("step lost its context".into())),
            (Err(err), ctx) => Err(Box::pin(self.step_failed(owned, ctx, step, err)).await),
        }
    }

    /// Commits a step's output as its checkpoint, after the pre-commit check.
    /// Not the last step: the same round trip opens the next step's fenced
    /// transaction.
    async fn commit(
        &self,
        owned: &Owned,
        mut ctx: StepCtx,
        step: StepAt,
        out: serde_json::Value,
        started: Instant,
    ) -> Result<Committed, Outcome> {
        let sh = &self.shared;
        // A step that did no database work still commits its checkpoint
        // through a fenced transaction.
        let tx = match ctx.tx.take() {
            Some(tx) => tx,
            None => match sh
                .store
                .begin_step(owned.job_id, owned.token, step.index)
                .await
            {
                Ok(tx) => tx,
                Err(e) if is_cancelled(&e) => return Err(Outcome::Cancelled),
                Err(e) if e.is_fenced_out() => return Err(stale(StaleAt::Admission, step, &e)),
                Err(e) => {
                    let reason = format!("database: {e}");
                    return Err(Outcome::fail(reason));
                }
            },
        };
        #[cfg(feature = "testing")]
        super::faults::before_commit(&sh.cfg, owned.job_id, step.index).await;
        let health = self.health_at_commit(owned).await;
        if health != Health::Healthy {
            let _ = tx.rollback().await;
            tracing::warn!(?health, step = %step.index, "lease not healthy at commit; rolled back, leaving the job to the next owner");
            return Err(Outcome::LeaveToNextOwner);
        }
        // The step's MySQL writes commit first, then the checkpoint: two
        // commits (see `fence::mysql`, "What does not hold").
        #[cfg(feature = "mysql")]
        if let Err(e) = ctx.commit_mysql().await {
            let _ = tx.rollback().await;
            if e.is_fenced_out() {
                return Err(stale(StaleAt::StepCommit, step, &e));
            }
            let reason = format!("mysql commit: {e}");
            return Err(Outcome::fail(reason));
        }
        let span = tracing::info_span!(spans::COMMIT, step = %step.index, token = owned.token.get(), "db.system.name" = "postgresql");
        let committed = if step.last {
            tx.commit_step(&out, true)
                .instrument(span)
                .await
                .map(|()| None)
        } else {
            let next = StepIndex::new(step.index.get() + 1);
            tx.commit_step_and_begin(&out, next).instrument(span).await
        };
        match committed {
            Ok(next) => {
                let took = started.elapsed().as_secs_f64();
                sh.metrics.step_done(owned.job.name(), step.name, took);
                if let Some(h) = &sh.observer {
                    h.step_committed(owned.job_id, step.index, owned.token);
                }
                #[cfg(feature = "testing")]
                super::faults::after_commit(&sh.cfg, owned.job_id, step.index).await;
                Ok((out, next))
            }
            Err(e) if is_cancelled(&e) => Err(Outcome::Cancelled),
            Err(e) if e.is_fenced_out() => Err(stale(StaleAt::StepCommit, step, &e)),
            Err(e) => {
                tracing::warn!(error = %e, step = %step.index, "commit failed");
                let reason = format!("commit: {e}");
                Err(Outcome::fail(reason))
            }
        }
    }

    /// Phase 6, the pre-commit check (an optimisation: the fence is the guarantee).
    /// `Degraded` is transient (one late keepalive ack on a loaded machine):
    /// wait until it turns `Healthy` or `Lost`, at most until the session's lost
    /// deadline (< TTL, so below the idle-in-transaction timeout), instead of
    /// dropping a job we still hold.
    async fn health_at_commit(&self, owned: &Owned) -> Health {
        let mut health = lease_health_now(&owned.session);
        if health == Health::Degraded {
            let mut watch = owned.session.watch_health();
            let settled = async {
                let _ = watch.wait_for(|h| *h != Health::Degraded).await;
            };
            let _ = tokio::time::timeout_at(owned.session.lost_deadline(), settled).await;
            health = lease_health_now(&owned.session);
        }
        #[cfg(feature = "testing")]
        if self.shared.cfg.unsafe_no_fencing {
            return Health::Healthy; // TEST ONLY: the negative control skips this check.
        }
        health
    }

    /// How a step that returned an error ends the delivery.
    async fn step_failed(
        &self,
        owned: &Owned,
        ctx: Option<StepCtx>,
        step: StepAt,
        err: StepError,
    ) -> Outcome {
        if let Some(tx) = ctx.and_then(|mut c| c.tx.take()) {
            let _ = tx.rollback().await;
        }
        let (index, name) = (step.index, step.name);
        if err.downcast_ref::<FenceError>().is_some_and(is_cancelled) {
            // The step's own admission (`ctx.db()`) found the row cancelled.
            return Outcome::Cancelled;
        }
        if let Some(at) = stale_cause(&err) {
            if at == StaleAt::Guard && self.still_current(owned).await {
                let reason = format!(
                    "step {index} ({name}) wrote to a guarded table outside \
                     ctx.db() while it owned the job: {}",
                    err.message()
                );
                let code = DeadCode::PermanentError;
                return Outcome::DeadLetter { code, reason };
            }
            return stale(at, step, &err);
        }
        if err.is_timeout() {
            return timed_out(err);
        }
        let reason = format!("step {index} ({name}): {}", err.message());
        match err.kind() {
            StepErrorKind::Cancelled if owned.session.health() == Health::Lost => {
                tracing::warn!(step = %index, "step cancelled: lease lost; the next owner takes over");
                Outcome::LeaveToNextOwner
            }
            StepErrorKind::Cancelled => Outcome::Release {
                after: Duration::ZERO,
            },
            StepErrorKind::Permanent => Outcome::DeadLetter {
                code: DeadCode::PermanentError,
                reason,
            },
            _ => Outcome::Fail {
                reason,
                after: err.requested_delay(),
                exhausted: DeadCode::MaxRetries,
            },
        }
    }

    /// Runs the stage while sending progress acks (only while `Healthy`),
    /// cancelling the step when the session is lost, handing the step its open
    /// transaction when it asks, and ending that transaction when its window
    /// passes untaken.
    async fn drive_stage(
        &self,
        owned: &Owned,
        delivery: &Delivery,
        ctx: StepCtx,
        step: StepIndex,
        input: serde_json::Value,
        desk: &mut Desk,
    ) -> StageOutcome {
        let mut stage = Box::pin(run_stage(
            self.me.clone(),
            owned.job.clone(),
            step,
            ctx,
            input,
        ));
        let period =
            (self.shared.cfg.ack_wait() / 3).max(self.shared.cfg.tuning.progress_min_period);
        let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
        let lost = owned.session.cancellation();
        let mut lost_seen = false;
        let mut cancel_seen = false;
        loop {
            let window = desk.offer.deadline();
            tokio::select! {
                outcome = &mut stage => return outcome,
                Some(answer) = desk.asks.recv() => {
                    if let Err(unanswered) = answer.send(desk.offer.ask()) {
                        desk.offer.unanswered(unanswered);
                    }
                }
                () = tokio::time::sleep_until(window.unwrap_or_else(Instant::now)), if window.is_some() => {
                    Box::pin(end_untaken(desk)).await;
                }
                () = owned.cancel.cancelled(), if !cancel_seen => {
                    cancel_seen = true;
                    tracing::info!(step = %step, "operator cancel: cancelling the running step");
                    desk.cancel.cancel();
                }
                () = lost.cancelled(), if !lost_seen => {
                    lost_seen = true;
                    tracing::warn!(step = %step, "lease lost: cancelling the running step");
                    desk.cancel.cancel();
                }
                _ = ticker.tick() => {
                    if owned.session.health() == Health::Healthy
                        && let Err(e) = Box::pin(delivery.progress()).await
                    {
                        tracing::debug!(error = %e, "progress ack failed");
                    }
                }
            }
        }
    }

    /// After a cancel notice stopped the job (its transactions rolled back):
    /// [`Outcome::Cancelled`] once the row says `cancelled` (the operator's
    /// update waited for our row lock and lands now), else, if it does not
    /// within [`CANCEL_CONFIRM`] (the operator's cancel failed or is stuck),
    /// a voluntary release: the job is never acked on the notice alone.
    pub(super) async fn cancel_asked(&self, owned: &Owned) -> Outcome {
        let until = Instant::now() + CANCEL_CONFIRM;
        loop {
            match self.shared.store.job(owned.job_id).await {
                Ok(Some(r)) if r.status == JobStatus::Cancelled => return Outcome::Cancelled,
                Ok(Some(r)) if r.status.is_terminal() => return Outcome::Ack,
                _ if Instant::now() >= until => break,
                _ => tokio::time::sleep(CANCEL_POLL).await,
            }
        }
        tracing::warn!(
            "a cancel notice stopped the job but its row was not cancelled within {CANCEL_CONFIRM:?}; releasing it"
        );
        Outcome::Release {
            after: Duration::ZERO,
        }
    }

    /// Whether the job row still names us as its live owner (fence = our token,
    /// running, not released).
    async fn still_current(&self, owned: &Owned) -> bool {
        matches!(
            self.shared.store.job(owned.job_id).await,
            Ok(Some(r)) if r.fence == owned.token.get()
                && r.status == JobStatus::Running
                && !r.released
        )
    }
}

/// How a step stopped at its timeout ends the delivery: a retryable failure
/// (dead-lettered `timeout` once the retries are spent), or `timeout` at once.
fn timed_out(err: StepError) -> Outcome {
    let reason = err.message().to_string();
    match err.kind() {
        StepErrorKind::Permanent => Outcome::DeadLetter {
            code: DeadCode::Timeout,
            reason,
        },
        _ => Outcome::Fail {
            reason,
            after: None,
            exhausted: DeadCode::Timeout,
        },
    }
}

/// How long a job stopped by a cancel notice waits for its row to say
/// `cancelled` before it is released instead of acked.
const CANCEL_CONFIRM: Duration = Duration::from_secs(2);
/// How often it looks meanwhile.
const CANCEL_POLL: Duration = Duration::from_millis(20);

/// Whether a fenced statement was refused because an operator cancelled the job.
fn is_cancelled(e: &FenceError) -> bool {
    matches!(
        e,
        FenceError::Terminal {
            status: JobStatus::Cancelled,
            ..
        }
    )
}

/// Rolls back every transaction a stopped step holds: the one it never took
/// and the one in its context (a claim's rollback re-applies the claim alone).
async fn rollback_all(offer: Offer<FencedTx>, ctx: Option<&mut StepCtx>) {
    if let Some(tx) = offer.leftover() {
        let _ = tx.rollback().await;
    }
    if let Some(tx) = ctx.and_then(|c| c.tx.take()) {
        let _ = tx.rollback().await;
    }
}

/// A write of this step refused by a newer owner's fence, at `at`.
fn stale(at: StaleAt, step: StepAt, error: &dyn std::fmt::Display) -> Outcome {
    Outcome::Stale {
        at,
        step: Some(step.index),
        error: error.to_string(),
    }
}

/// Whether a step's error says a newer owner holds the job, and where it showed.
fn stale_cause(err: &crate::job::StepError) -> Option<StaleAt> {
    if let Some(e) = err.downcast_ref::<FenceError>() {
        if matches!(e, FenceError::GuardRefused { .. }) {
            return Some(StaleAt::Guard);
        }
        if e.is_fenced_out() {
            return Some(StaleAt::Admission);
        }
    }
    if err
        .downcast_ref::<sqlx::Error>()
        .is_some_and(crate::fence::is_guard_refusal)
    {
        return Some(StaleAt::Guard);
    }
    #[cfg(feature = "mysql")]
    if let Some(e) = err.downcast_ref::<crate::fence::mysql::MySqlFenceError>() {
        use crate::fence::mysql::MySqlFenceError;
        if matches!(e, MySqlFenceError::GuardRefused { .. }) {
            return Some(StaleAt::Guard);
        }
        if e.is_fenced_out() {
            return Some(StaleAt::Admission);
        }
    }
    None
}

/// How long a step may take before it asks for its database: the transaction
/// opened for it (and the job row lock) stays open that long at most before it
/// is ended (a claim committed alone, a plain admission rolled back). Never more
/// than a quarter of the TTL ([`Tuning::step_tx_window`](crate::config::Tuning::step_tx_window)
/// says why it is short), far below `idle_in_transaction_session_timeout`
/// (one TTL).
fn open_tx_window(cfg: &crate::Config) -> Duration {
    (cfg.lease_ttl / 4).min(cfg.tuning.step_tx_window)
}

/// The stage loop's side of a running step, besides the step itself.
struct Desk {
    /// The step's cancellation (shutdown, lease lost, claim lost).
    cancel: CancellationToken,
    /// The transaction opened for the step, until it takes it.
    offer: Offer<FencedTx>,
    /// The step's requests for that transaction.
    asks: mpsc::Receiver<oneshot::Sender<Handover<FencedTx>>>,
}

/// Ends the transaction the step did not take within its window: a claim is
/// committed alone, a plain admission rolled back.
///
/// If the claim cannot be committed, the offer turns `ClaimLost` (so
/// `StepCtx::db` opens no fenced transaction under this token) and the step is
/// cancelled: after an etcd restore another acquisition may hold the same token
/// and claim the row, and an admission under an equal token would let two
/// owners in. The attempt ends as a voluntary release, whose bookkeeping claims
/// again strictly (or meets the other owner).
async fn end_untaken(desk: &mut Desk) {
    let Some(tx) = desk.offer.expire() else {
        return;
    };
    if tx.carries_claim() {
        tracing::debug!(
            "the step did not take its transaction within the window; committing the claim alone"
        );
        if let Err(e) = tx.commit_claim().await {
            tracing::warn!(error = %e, "committing the claim alone failed; cancelling the step");
            desk.offer.lose_claim();
            desk.cancel.cancel();
        }
    } else {
        tracing::debug!("the step did not take its transaction within the window; rolling it back");
        let _ = tx.rollback().await;
    }
}
