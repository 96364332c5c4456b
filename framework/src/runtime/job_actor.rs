//! `JobActor`: one per delivery. Runs the protocol of the design card: admit,
//! acquire, claim, poison check, steps (each in a `StageActor`), finish.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, field};

use super::Shared;
use super::locks::ReleaseMode;
use super::registry::DynJob;
use super::slots::{HoldSlot, Slots};
use super::stage::{StageOutcome, run_stage};
use crate::fence::{FenceError, JobRow, JobStatus};
use crate::job::{StepCtx, StepErrorKind, TxSlot, new_slot, take_tx};
use crate::lease::{Acquire, Health, JobLock, Session};
use crate::queue::{DeadLetterInfo, Delivery};
use crate::telemetry::{StaleAt, spans};
use crate::{FencingToken, JobId, ObservedFence, StepIndex, retry};

/// A contended job lock is retried at least every `lease_ttl / CONTENTION_RETRY_DIVISOR`.
const CONTENTION_RETRY_DIVISOR: u32 = 20;

pub(crate) struct JobArgs {
    pub(crate) shared: Arc<Shared>,
    /// The job row as read with the delivery's fetch group: `Some(None)` if
    /// it has none, `None` if not read yet.
    pub(crate) admitted: Option<Option<JobRow>>,
    pub(crate) delivery: Delivery,
    /// This delivery's place in the worker, until the actor ends.
    pub(crate) hold: HoldSlot,
}

pub(crate) struct JobActor;

pub(crate) enum JobMsg {
    Run,
}

pub(crate) struct JobState {
    args: Option<JobArgs>,
}

impl Actor for JobActor {
    type Msg = JobMsg;
    type State = JobState;
    type Arguments = JobArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: JobArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.shared.metrics.in_flight(1);
        myself.send_message(JobMsg::Run)?;
        Ok(JobState { args: Some(args) })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        _msg: JobMsg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(args) = state.args.take() {
            let JobArgs {
                shared,
                admitted,
                delivery,
                hold,
            } = args;
            let run = JobRun {
                shared: shared.clone(),
                me: myself.get_cell(),
                slots: hold.slots().clone(),
            };
            run.run(delivery, admitted).await;
            shared.metrics.in_flight(-1);
            drop(hold);
        }
        myself.stop(None);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Stage actors end on their own; a failed one has already been turned into
        // a failed attempt by `run_stage`. The job actor outlives them either way.
        if let SupervisionEvent::ActorFailed(who, err) = event {
            tracing::warn!(actor = %who.get_id(), error = %err, "stage actor failed");
        }
        Ok(())
    }
}

/// Why a delivery ended without finishing the job (for logs).
enum Stop {
    /// Another worker holds the lock, or we were fenced out: nothing of ours to undo.
    Quiet,
}

struct Owned {
    job: Arc<dyn DynJob>,
    session: Arc<Session>,
    lock: Option<JobLock>,
    token: FencingToken,
    takeovers: u32,
    attempts: u32,
}

struct JobRun {
    shared: Arc<Shared>,
    me: ractor::ActorCell,
    slots: Arc<Slots>,
}

impl JobRun {
    async fn run(&self, delivery: Delivery, admitted: Option<Option<JobRow>>) {
        let job_id = match delivery.job_id() {
            Ok(id) => id,
            Err(bad) => {
                let reason = format!("bad message: {bad}");
                tracing::warn!(seq = delivery.stream_sequence(), %reason, "dead-lettering");
                self.shared.metrics.dead_lettered("unknown", "bad_message");
                if let Err(e) = delivery.dead_letter(info(reason, None, 0, 0)).await {
                    tracing::error!(error = %e, "dead-lettering a bad message failed; it will be redelivered");
                }
                return;
            }
        };
        let header_type = delivery.job_type().map(str::to_string).ok();
        let span = tracing::info_span!(
            spans::JOB,
            job_id = %job_id,
            job_type = header_type.as_deref().unwrap_or("?"),
            token = field::Empty,
            lease_id = field::Empty,
            worker = %self.shared.cfg.worker_id,
            delivery = delivery.delivery_count(),
        );
        let _ = self
            .run_job(job_id, header_type, delivery, admitted)
            .instrument(span)
            .await;
    }

    async fn run_job(
        &self,
        job_id: JobId,
        header_type: Option<String>,
        delivery: Delivery,
        admitted: Option<Option<JobRow>>,
    ) -> Result<(), Stop> {
        let sh = &self.shared;
        if delivery.delivery_count() > 1 {
            tracing::info!(
                deliveries = delivery.delivery_count(),
                "redelivered: an earlier delivery was handed back (contention, retry, \
                 shutdown) or its owner went silent past AckWait"
            );
        }
        // This delivery will ask for its lock once admitted: a lock batch about
        // to leave may wait a moment for it.
        let coming = sh.locks.expect_acquire();
        // 1. Admit (the row usually came with the delivery's fetch group).
        let read = match admitted {
            Some(row) => Ok(row),
            None => sh.store.job(job_id).await,
        };
        let row = match read {
            Ok(Some(row)) => row,
            Ok(None) => {
                let reason = "no job row: the message was not enqueued through Tenure".to_string();
                self.dead_letter_unowned(delivery, job_id, "unknown", "no_job_row", reason, None)
                    .await;
                return Err(Stop::Quiet);
            }
            Err(e) => {
                tracing::warn!(error = %e, "admission read failed; retrying later");
                self.retry_later(delivery, retry::jittered(&sh.cfg.retry_backoff, 0))
                    .await;
                return Err(Stop::Quiet);
            }
        };
        match row.status {
            JobStatus::Done => {
                tracing::debug!("job already done; acking the redelivery");
                ack(delivery).await;
                return Err(Stop::Quiet);
            }
            JobStatus::Dead => {
                // The row went dead but the message was not dead-lettered yet (a
                // crash in between): finish that now.
                self.dead_letter_dead_row(delivery, job_id, Some(&row))
                    .await;
                return Err(Stop::Quiet);
            }
            _ => {}
        }
        if let Some(h) = &header_type {
            if h != &row.job_type {
                let reason = format!(
                    "bad message: header job type {h:?} but the job row says {:?}",
                    row.job_type
                );
                self.dead_letter_unowned(
                    delivery,
                    job_id,
                    &row.job_type,
                    "bad_message",
                    reason,
                    Some(&row),
                )
                .await;
                return Err(Stop::Quiet);
            }
        }
        let Some(job) = sh.registry.get(&row.job_type) else {
            let reason = format!("unknown job type {:?}", row.job_type);
            if let Err(e) = sh.store.mark_dead_unfenced(job_id, &reason).await {
                tracing::warn!(error = %e, "marking the job dead failed");
            }
            self.dead_letter_unowned(
                delivery,
                job_id,
                "unknown",
                "unknown_job_type",
                reason,
                Some(&row),
            )
            .await;
            return Err(Stop::Quiet);
        };

        // 2. Acquire.
        let session = match sh.healthy_session() {
            Some(s) => s,
            None => {
                self.retry_later(delivery, retry::jittered(&sh.cfg.contention_backoff, 0))
                    .await;
                return Err(Stop::Quiet);
            }
        };
        tracing::Span::current().record("lease_id", field::display(session.lease_id()));
        let _holding = Holding::start(sh, job_id);
        let acquired = sh
            .locks
            .acquire(session.clone(), job_id, coming)
            .instrument(tracing::info_span!(spans::ACQUIRE, job_id = %job_id))
            .await;
        let lock = match acquired {
            Ok(Acquire::Acquired(lock)) => lock,
            Ok(Acquire::Contended { holder })
                if holder == Some(session.lease_id()) && !Holding::others_hold(sh, job_id) =>
            {
                self.release_stranded(&session, job_id, delivery).await;
                return Err(Stop::Quiet);
            }
            Ok(Acquire::Contended { holder }) => {
                sh.metrics.contention(job.name());
                let attempt =
                    u32::try_from(delivery.delivery_count().saturating_sub(1)).unwrap_or(u32::MAX);
                // A message comes back while its lock is held only when the holder
                // stopped progress-acking (paused, partitioned, crashed): its lease
                // ends within a TTL. Retry at least every TTL/20, so the new owner
                // acquires soon after the lease ends instead of backing off past it.
                let delay = retry::jittered(&sh.cfg.contention_backoff, attempt)
                    .min(sh.cfg.lease_ttl / CONTENTION_RETRY_DIVISOR);
                tracing::debug!(holder = ?holder, ?delay, "job lock held by another session");
                self.retry_later(delivery, delay).await;
                return Err(Stop::Quiet);
            }
            Err(e) => {
                tracing::warn!(error = %e, "acquiring the job lock failed");
                self.retry_later(delivery, retry::jittered(&sh.cfg.contention_backoff, 0))
                    .await;
                return Err(Stop::Quiet);
            }
        };
        let token = lock.token();
        tracing::Span::current().record("token", token.get());

        // A run slot (held until this job actor ends): at once unless this
        // delivery was fetched ahead of the running jobs (see `Slots`).
        let _running = match self.slots.run_slot(&sh.draining).await {
            Ok(slot) => slot,
            Err(why) => {
                tracing::debug!(
                    ?why,
                    "no run slot for a delivery fetched ahead; giving it back"
                );
                // Redelivered at once (to a worker with a free slot, or to this one).
                self.give_back(session, lock, delivery, Duration::ZERO)
                    .await;
                return Err(Stop::Quiet);
            }
        };
        // The session may have been lost while the delivery waited: its lock is
        // gone (or going) with the lease, and a newer owner may hold the job.
        // Do not claim with a token that no longer guards anything.
        if session.health() == Health::Lost {
            tracing::info!(
                "the session was lost while the delivery waited for a run slot; giving it back"
            );
            self.retry_later(delivery, Duration::ZERO).await;
            return Err(Stop::Quiet);
        }

        // 3. Claim the fence at the resource, before any useful work. The claim
        // opens the first step's fenced transaction (its UPDATE holds the row
        // lock, so the step needs no admission and no commit of its own).
        let claimed = sh
            .store
            .claim_and_begin(job_id, token)
            .instrument(tracing::info_span!(spans::CLAIM, job_id = %job_id, token = token.get()))
            .await;
        let (claim, claim_tx) = match claimed {
            Ok(c) => c,
            Err(e) => {
                self.claim_refused(session, lock, delivery, job.name(), e)
                    .await;
                return Err(Stop::Quiet);
            }
        };
        let took_over = claim.takeover;
        sh.metrics.claimed(job.name(), took_over);
        if took_over {
            tracing::warn!(
                takeovers = claim.takeovers,
                previous_fence = row.fence,
                "took over the job from an owner that did not release it (crash, pause or partition)"
            );
        }
        let mut owned = Owned {
            job,
            session,
            lock: Some(lock),
            token,
            takeovers: claim.takeovers,
            attempts: claim.attempts,
        };

        // 4. Poison check.
        let max_takeovers = owned.job.max_takeovers().unwrap_or(sh.cfg.max_takeovers);
        if claim.takeovers > max_takeovers {
            // The dead-lettering writes are fenced on their own connection: make
            // the claim durable first (it holds the row lock until then).
            if let Err(e) = claim_tx.commit_claim().await {
                tracing::warn!(error = %e, "committing the claim failed; retrying later");
                let delay = retry::jittered(&sh.cfg.retry_backoff, 0);
                self.hand_back(&mut owned, delivery, delay).await;
                return Err(Stop::Quiet);
            }
            let reason = format!(
                "lost its owner {} times (max_takeovers = {max_takeovers})",
                claim.takeovers
            );
            self.dead_letter_owned(&mut owned, delivery, job_id, "max_takeovers", reason)
                .await;
            return Err(Stop::Quiet);
        }

        // 5. Steps.
        let steps = owned.job.steps();
        let n = u32::try_from(steps.len()).unwrap_or(u32::MAX);
        let mut input = if claim.step.get() == 0 {
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
        let mut tx_slot: Option<TxSlot> = Some(new_slot(claim_tx));
        for k in claim.step.get()..n {
            let step = StepIndex::new(k);
            let step_name = steps.get(k as usize).map(|s| s.name).unwrap_or("?");
            if sh.draining.is_cancelled() && k > claim.step.get() {
                // The transaction opened for this step holds the job row.
                if let Some(tx) = tx_slot.take().and_then(|slot| take_tx(&slot)) {
                    let _ = tx.rollback().await;
                }
                self.release_voluntarily(&mut owned, delivery, job_id).await;
                return Err(Stop::Quiet);
            }
            let started = tokio::time::Instant::now();
            let cancel = sh.stop_jobs.child_token();
            let claim_lost = CancellationToken::new();
            let ctx = StepCtx {
                job_id,
                job_type: owned.job.name(),
                step,
                step_name,
                token,
                attempt: owned.attempts,
                cancel: cancel.clone(),
                deadline: owned.session.lost_deadline(),
                store: Some(sh.store.clone()),
                tx: None,
                open_tx: tx_slot.clone(),
                claim_lost: claim_lost.clone(),
            };
            let committer = tx_slot.as_ref().map(|slot| {
                let lost = [claim_lost.clone(), cancel.clone()];
                end_unused_later(slot.clone(), open_tx_window(&sh.cfg), lost)
            });
            let outcome = self
                .drive_stage(&owned, &delivery, ctx, step, input, &cancel)
                .instrument(tracing::info_span!(spans::STEP, step = %step, name = step_name, token = token.get()))
                .await;
            // The transaction opened for this step, if the step did not take it.
            let leftover = tx_slot.take().and_then(|slot| take_tx(&slot));
            drop(committer);
            let mut outcome = outcome;
            if let Some(tx) = leftover {
                match outcome.ctx.as_mut() {
                    Some(ctx) if ctx.tx.is_none() => ctx.tx = Some(tx),
                    _ => {
                        // Rolling back a claim's transaction re-applies the
                        // claim on its own.
                        let _ = tx.rollback().await;
                    }
                }
            }
            match outcome.result {
                Ok(out) => {
                    let Some(mut ctx) = outcome.ctx else {
                        self.fail_attempt(
                            &mut owned,
                            delivery,
                            job_id,
                            "step lost its context".into(),
                        )
                        .await;
                        return Err(Stop::Quiet);
                    };
                    // A step that did no database work still commits its checkpoint
                    // through a fenced transaction.
                    let tx = match ctx.tx.take() {
                        Some(tx) => tx,
                        None => match sh.store.begin_step(job_id, token, step).await {
                            Ok(tx) => tx,
                            Err(e) if e.is_fenced_out() => {
                                self.stale(&owned, job_id, step, StaleAt::Admission, &e);
                                return Err(Stop::Quiet);
                            }
                            Err(e) => {
                                self.fail_attempt(
                                    &mut owned,
                                    delivery,
                                    job_id,
                                    format!("database: {e}"),
                                )
                                .await;
                                return Err(Stop::Quiet);
                            }
                        },
                    };
                    // 6. Pre-commit check (an optimisation: the fence is the guarantee).
                    // `Degraded` is transient (one late keepalive ack on a loaded
                    // machine): wait until it turns `Healthy` or `Lost`, at most until
                    // the session's lost deadline (< TTL, so below the idle-in-transaction
                    // timeout), instead of dropping a job we still hold.
                    let mut health = lease_health_now(&owned.session);
                    if health == Health::Degraded {
                        let mut watch = owned.session.watch_health();
                        let settled = async {
                            let _ = watch.wait_for(|h| *h != Health::Degraded).await;
                        };
                        let _ =
                            tokio::time::timeout_at(owned.session.lost_deadline(), settled).await;
                        health = lease_health_now(&owned.session);
                    }
                    #[cfg(feature = "testing")]
                    let health = if sh.cfg.unsafe_no_fencing {
                        Health::Healthy // TEST ONLY: the negative control skips this check.
                    } else {
                        health
                    };
                    if health != Health::Healthy {
                        let _ = tx.rollback().await;
                        tracing::warn!(?health, step = %step, "lease not healthy at commit; rolled back, leaving the job to the next owner");
                        self.release_lock(&mut owned, ReleaseMode::Prompt).await;
                        return Err(Stop::Quiet);
                    }
                    let last = k + 1 == n;
                    // Not the last step: the same round trip that commits this
                    // step opens the next one's fenced transaction.
                    let commit_span =
                        tracing::info_span!(spans::COMMIT, step = %step, token = token.get());
                    let committed = if last {
                        tx.commit_step(&out, true)
                            .instrument(commit_span)
                            .await
                            .map(|()| None)
                    } else {
                        tx.commit_step_and_begin(&out, StepIndex::new(k + 1))
                            .instrument(commit_span)
                            .await
                    };
                    match committed {
                        Ok(next) => {
                            tx_slot = next.map(new_slot);
                            sh.metrics.step_done(
                                owned.job.name(),
                                step_name,
                                started.elapsed().as_secs_f64(),
                            );
                            if let Some(h) = &sh.hooks {
                                h.step_committed(job_id, step, token);
                            }
                            input = out;
                        }
                        Err(e) if e.is_fenced_out() => {
                            self.stale(&owned, job_id, step, StaleAt::StepCommit, &e);
                            return Err(Stop::Quiet);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, step = %step, "commit failed");
                            self.fail_attempt(&mut owned, delivery, job_id, format!("commit: {e}"))
                                .await;
                            return Err(Stop::Quiet);
                        }
                    }
                }
                Err(err) => {
                    if let Some(tx) = outcome.ctx.and_then(|mut c| c.tx.take()) {
                        let _ = tx.rollback().await;
                    }
                    if let Some(at) = stale_cause(&err) {
                        if at == StaleAt::Guard && self.still_current(&owned, job_id).await {
                            let reason = format!(
                                "step {step} ({step_name}) wrote to a guarded table outside \
                                 ctx.db() while it owned the job: {}",
                                err.message()
                            );
                            self.dead_letter_owned(
                                &mut owned,
                                delivery,
                                job_id,
                                "permanent_error",
                                reason,
                            )
                            .await;
                            return Err(Stop::Quiet);
                        }
                        self.stale(&owned, job_id, step, at, &err);
                        return Err(Stop::Quiet);
                    }
                    match err.kind() {
                        StepErrorKind::Cancelled => {
                            if owned.session.health() == Health::Lost {
                                tracing::warn!(step = %step, "step cancelled: lease lost; the next owner takes over");
                                return Err(Stop::Quiet);
                            }
                            self.release_voluntarily(&mut owned, delivery, job_id).await;
                            return Err(Stop::Quiet);
                        }
                        StepErrorKind::Permanent => {
                            let reason = format!("step {step} ({step_name}): {}", err.message());
                            self.dead_letter_owned(
                                &mut owned,
                                delivery,
                                job_id,
                                "permanent_error",
                                reason,
                            )
                            .await;
                            return Err(Stop::Quiet);
                        }
                        _ => {
                            let reason = format!("step {step} ({step_name}): {}", err.message());
                            self.fail_attempt(&mut owned, delivery, job_id, reason)
                                .await;
                            return Err(Stop::Quiet);
                        }
                    }
                }
            }
        }

        // 7. Finish: the last commit set status = done; ack, then delete the lock.
        sh.metrics.completed(owned.job.name());
        ack(delivery).await;
        self.release_lock(&mut owned, ReleaseMode::Deferred).await;
        Ok(())
    }

    /// Runs the stage while sending progress acks (only while `Healthy`) and
    /// cancelling the step when the session is lost.
    async fn drive_stage(
        &self,
        owned: &Owned,
        delivery: &Delivery,
        ctx: StepCtx,
        step: StepIndex,
        input: serde_json::Value,
        cancel: &CancellationToken,
    ) -> StageOutcome {
        let stage = run_stage(self.me.clone(), owned.job.clone(), step, ctx, input);
        tokio::pin!(stage);
        let period = (self.shared.cfg.ack_wait() / 3).max(Duration::from_millis(100));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let lost = owned.session.cancellation();
        let mut lost_seen = false;
        loop {
            tokio::select! {
                outcome = &mut stage => return outcome,
                () = lost.cancelled(), if !lost_seen => {
                    lost_seen = true;
                    tracing::warn!(step = %step, "lease lost: cancelling the running step");
                    cancel.cancel();
                }
                _ = ticker.tick() => {
                    if owned.session.health() == Health::Healthy {
                        if let Err(e) = delivery.progress().await {
                            tracing::debug!(error = %e, "progress ack failed");
                        }
                    }
                }
            }
        }
    }

    /// Counts and reports a stale owner's refused write. Nothing is acked and the
    /// lock is left alone: a newer owner holds the job (and its lock key).
    fn stale(
        &self,
        owned: &Owned,
        job_id: JobId,
        step: StepIndex,
        at: StaleAt,
        err: &dyn std::fmt::Display,
    ) {
        self.shared.metrics.stale_rejected(owned.job.name(), at);
        tracing::warn!(
            error = %err,
            step = %step,
            token = owned.token.get(),
            at = at.as_str(),
            "write refused: fenced out by a newer owner; not acking"
        );
        if let Some(h) = &self.shared.hooks {
            h.stale_rejected(job_id, step, owned.token);
        }
    }

    /// Runs one of our fenced bookkeeping writes (`record_failure`, `mark_dead`,
    /// `record_release`). If it finds that our claim never became durable (the
    /// transaction that carried it was lost: a commit error other than the fence's,
    /// a panic after `ctx.db()`, a connection PostgreSQL ended), the claim is
    /// applied again on its own and the write runs once more, so every attempt is
    /// counted. A newer owner's fence refuses the re-claim as it would any write.
    async fn with_claim<T, F, Fut>(
        &self,
        owned: &Owned,
        job_id: JobId,
        write: F,
    ) -> Result<T, FenceError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, FenceError>>,
    {
        match write().await {
            Err(FenceError::NotClaimed { .. }) => {
                tracing::info!("the transaction that carried the claim was lost; claiming again");
                self.shared.store.claim(job_id, owned.token).await?;
                write().await
            }
            other => other,
        }
    }

    /// Whether the job row still names us as its live owner (fence = our token,
    /// running, not released).
    async fn still_current(&self, owned: &Owned, job_id: JobId) -> bool {
        matches!(
            self.shared.store.job(job_id).await,
            Ok(Some(r)) if r.fence == owned.token.get()
                && r.status == JobStatus::Running
                && !r.released
        )
    }

    /// Our own lease holds the job's lock but no job actor of this worker does: a
    /// lock this worker stranded (a create whose answer was lost, a release that
    /// gave up). Delete it and let the message come back at once, instead of
    /// finding it "contended" until our own lease ends.
    async fn release_stranded(&self, session: &Session, job_id: JobId, delivery: Delivery) {
        if let Err(e) = session.release_stranded(job_id).await {
            tracing::warn!(error = %e, "deleting a lock stranded under our own lease failed");
        }
        let delay = retry::jittered(&self.shared.cfg.contention_backoff, 0);
        self.retry_later(delivery, delay).await;
    }

    /// A retryable failure: count it, then retry with backoff or dead-letter.
    async fn fail_attempt(
        &self,
        owned: &mut Owned,
        delivery: Delivery,
        job_id: JobId,
        reason: String,
    ) {
        let sh = &self.shared;
        let recorded = self
            .with_claim(owned, job_id, || {
                sh.store.record_failure(job_id, owned.token, &reason)
            })
            .await;
        let attempts = match recorded {
            Ok(a) => a,
            Err(e) if e.is_fenced_out() => {
                sh.metrics
                    .stale_rejected(owned.job.name(), StaleAt::StepCommit);
                tracing::warn!(error = %e, "fenced out while recording a failure");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, %reason, "recording the failure failed; retrying later");
                let delay = retry::jittered(&sh.cfg.retry_backoff, 0);
                self.hand_back(owned, delivery, delay).await;
                return;
            }
        };
        owned.attempts = attempts;
        let limit = owned.job.retries().unwrap_or(sh.cfg.max_retries);
        if attempts > limit {
            let reason =
                format!("failed {attempts} times (retries = {limit}); last error: {reason}");
            self.dead_letter_owned(owned, delivery, job_id, "max_retries", reason)
                .await;
            return;
        }
        sh.metrics.retried(owned.job.name());
        let delay = retry::jittered(&sh.cfg.retry_backoff, attempts.saturating_sub(1));
        tracing::info!(attempts, ?delay, %reason, "step failed; retrying");
        self.hand_back(owned, delivery, delay).await;
    }

    /// A fresh lock's claim was refused: says why, and ends the delivery. Never
    /// runs the job.
    async fn claim_refused(
        &self,
        session: Arc<Session>,
        lock: JobLock,
        delivery: Delivery,
        job_type: &str,
        e: FenceError,
    ) {
        let sh = &self.shared;
        let (job_id, token) = (lock.job_id(), lock.token());
        if e.is_fenced_out() {
            sh.metrics.stale_rejected(job_type, StaleAt::Claim);
            match claim_refusal(Instant::now(), session.lost_deadline(), session.health()) {
                ClaimRefusal::NewerOwner => tracing::info!(
                    error = %e,
                    "fenced out at claim: this worker stalled past its lease after \
                     acquiring, and a newer owner claimed the job"
                ),
                ClaimRefusal::Regression => {
                    self.regression_alarm(job_type, job_id, token, &e);
                }
            }
            sh.locks.release(session, lock, ReleaseMode::Prompt).await;
        } else if e.is_token_regression() {
            // Another owner may hold this very token: never run the job. Handed
            // back: the next acquisition gets a later revision.
            self.regression_alarm(job_type, job_id, token, &e);
            let delay = retry::jittered(&sh.cfg.retry_backoff, 0);
            self.give_back(session, lock, delivery, delay).await;
        } else if let FenceError::Terminal { status, .. } = e {
            sh.locks.release(session, lock, ReleaseMode::Deferred).await;
            if status == JobStatus::Dead {
                // Marked dead since admission (the broker gave up, an operator):
                // dead-letter it as admission would.
                let row = self.shared.store.job(job_id).await.ok().flatten();
                self.dead_letter_dead_row(delivery, job_id, row.as_ref())
                    .await;
            } else {
                ack(delivery).await;
            }
        } else {
            tracing::warn!(error = %e, "claim failed; retrying later");
            let delay = retry::jittered(&sh.cfg.retry_backoff, 0);
            self.give_back(session, lock, delivery, delay).await;
        }
    }

    /// A fresh, verified lock of a live session met a fence at or above its
    /// token: etcd's revisions went backwards. Counted, logged as an alert and
    /// reported to the observer; the caller hands the job back unrun.
    fn regression_alarm(&self, job_type: &str, job_id: JobId, token: FencingToken, e: &FenceError) {
        self.shared.metrics.token_regression(job_type);
        tracing::error!(
            error = %e,
            "ALERT: fencing token regression (etcd revisions went backwards: a snapshot \
             restore without --bump-revision?); the job is handed back, not run"
        );
        if let Some(h) = &self.shared.hooks {
            h.token_regression(job_id, token);
        }
    }

    /// Gives the job back for a later attempt: deletes our lock at once (the
    /// next attempt needs it), then naks the message with `delay`.
    async fn hand_back(&self, owned: &mut Owned, delivery: Delivery, delay: Duration) {
        self.release_lock(owned, ReleaseMode::Prompt).await;
        self.retry_later(delivery, delay).await;
    }

    /// [`hand_back`](Self::hand_back) for a job not claimed yet (nothing on its
    /// row to undo).
    async fn give_back(
        &self,
        session: Arc<Session>,
        lock: JobLock,
        delivery: Delivery,
        delay: Duration,
    ) {
        self.shared
            .locks
            .release(session, lock, ReleaseMode::Prompt)
            .await;
        self.retry_later(delivery, delay).await;
    }

    /// Deletes our job lock (once: later calls find none), see [`ReleaseMode`].
    async fn release_lock(&self, owned: &mut Owned, mode: ReleaseMode) {
        if let Some(lock) = owned.lock.take() {
            self.shared
                .locks
                .release(owned.session.clone(), lock, mode)
                .await;
        }
    }

    /// Graceful release: recorded on the row (so the next claim is no takeover),
    /// then the lock is deleted and the message handed back at once.
    async fn release_voluntarily(&self, owned: &mut Owned, delivery: Delivery, job_id: JobId) {
        let sh = &self.shared;
        let recorded = self
            .with_claim(owned, job_id, || {
                sh.store.record_release(job_id, owned.token)
            })
            .await;
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "recording the voluntary release failed");
        }
        tracing::info!("released the job voluntarily (shutdown)");
        self.hand_back(owned, delivery, Duration::ZERO).await;
    }

    /// Dead-letters a job we own: fenced `mark_dead` first (so a crash in between
    /// leaves a dead row whose redelivery is dead-lettered at admission), then the
    /// DLQ publish, which also terminates the original message.
    async fn dead_letter_owned(
        &self,
        owned: &mut Owned,
        delivery: Delivery,
        job_id: JobId,
        code: &'static str,
        reason: String,
    ) {
        let sh = &self.shared;
        let marked = self
            .with_claim(owned, job_id, || {
                sh.store.mark_dead(job_id, owned.token, &reason)
            })
            .await;
        match marked {
            Ok(()) => {}
            Err(e) if e.is_fenced_out() => {
                sh.metrics
                    .stale_rejected(owned.job.name(), StaleAt::StepCommit);
                tracing::warn!(error = %e, "fenced out while marking the job dead");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "marking the job dead failed; retrying later");
                self.retry_later(delivery, retry::jittered(&sh.cfg.retry_backoff, 0))
                    .await;
                return;
            }
        }
        sh.metrics.dead_lettered(owned.job.name(), code);
        tracing::warn!(reason = %reason, code, "job dead-lettered");
        let dl = info(
            format!("{code}: {reason}"),
            Some(owned.token.observed()),
            owned.takeovers,
            owned.attempts,
        );
        if let Err(e) = delivery.dead_letter(dl).await {
            tracing::error!(error = %e, "DLQ publish failed; the redelivery will dead-letter it at admission");
        }
        self.release_lock(owned, ReleaseMode::Deferred).await;
    }

    /// Dead-letters a delivery we do not own (bad message, unknown type, a row
    /// that is already dead).
    async fn dead_letter_unowned(
        &self,
        delivery: Delivery,
        job_id: JobId,
        job_type: &str,
        code: &'static str,
        reason: String,
        row: Option<&JobRow>,
    ) {
        self.shared.metrics.dead_lettered(job_type, code);
        tracing::warn!(%job_id, reason = %reason, code, "dead-lettering");
        let token = row.and_then(|r| ObservedFence::new(r.fence));
        let (takeovers, attempts) = row.map(|r| (r.takeovers, r.attempts)).unwrap_or((0, 0));
        if let Err(e) = delivery
            .dead_letter(info(
                format!("{code}: {reason}"),
                token,
                takeovers,
                attempts,
            ))
            .await
        {
            tracing::error!(error = %e, "DLQ publish failed; the message will be redelivered");
        }
    }

    /// Dead-letters a delivery whose row is `dead`, with the row's last error
    /// as the reason (`row` is `None` if it could not be read).
    async fn dead_letter_dead_row(&self, delivery: Delivery, job_id: JobId, row: Option<&JobRow>) {
        let reason = row
            .and_then(|r| r.last_error.clone())
            .unwrap_or_else(|| "dead".into());
        let job_type = row.map_or("unknown", |r| r.job_type.as_str());
        self.dead_letter_unowned(delivery, job_id, job_type, "dead", reason, row)
            .await;
    }

    async fn retry_later(&self, delivery: Delivery, delay: Duration) {
        if let Err(e) = delivery.retry_after(delay).await {
            tracing::warn!(error = %e, "nak failed; the broker redelivers after AckWait");
        }
    }
}

/// A job actor's entry in [`Shared::holding`](super::Shared), from before it
/// asks for the job's lock until the actor ends.
struct Holding<'a> {
    shared: &'a Shared,
    job_id: JobId,
}

impl<'a> Holding<'a> {
    fn start(shared: &'a Shared, job_id: JobId) -> Self {
        if let Ok(mut held) = shared.holding.lock() {
            *held.entry(job_id).or_default() += 1;
        }
        Holding { shared, job_id }
    }

    /// Whether another job actor of this worker (besides the caller's own entry)
    /// works on `job_id`. A poisoned map says yes: never delete a lock that may
    /// be in use.
    fn others_hold(shared: &Shared, job_id: JobId) -> bool {
        shared
            .holding
            .lock()
            .map_or(true, |held| held.get(&job_id).is_some_and(|n| *n > 1))
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        if let Ok(mut held) = self.shared.holding.lock() {
            if let Some(n) = held.get_mut(&self.job_id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.remove(&self.job_id);
                }
            }
        }
    }
}

/// What a claim refused on a freshly verified lock means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaimRefusal {
    /// Our session may be gone (this worker stalled between acquire and claim:
    /// SIGSTOP, GC, VM pause): a newer owner legitimately raised the fence.
    NewerOwner,
    /// Our session is alive, so our lock still stands and no newer lock can
    /// exist: a fence above our token means etcd's revisions went backwards.
    Regression,
}

/// Classifies a claim refused with a larger fence, from the session's state now.
/// The health watch of a process that was frozen has not caught up yet; the
/// monotonic lost deadline has.
fn claim_refusal(now: Instant, lost_deadline: Instant, health: Health) -> ClaimRefusal {
    if health_at(now, lost_deadline, health) == Health::Lost {
        ClaimRefusal::NewerOwner
    } else {
        ClaimRefusal::Regression
    }
}

/// A session's health at `now`: `Lost` once its lost deadline has passed, even
/// if the keepalive task has not said so yet (a process that was frozen past its
/// lease wakes with a stale health watch).
fn health_at(now: Instant, lost_deadline: Instant, health: Health) -> Health {
    if now >= lost_deadline {
        Health::Lost
    } else {
        health
    }
}

/// [`health_at`] now, for `session`.
fn lease_health_now(session: &Session) -> Health {
    health_at(Instant::now(), session.lost_deadline(), session.health())
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
    None
}

fn info(
    reason: String,
    last_token: Option<ObservedFence>,
    takeovers: u32,
    attempts: u32,
) -> DeadLetterInfo {
    DeadLetterInfo {
        reason,
        last_token,
        takeovers,
        attempts,
    }
}

async fn ack(delivery: Delivery) {
    if let Err(e) = delivery.ack().await {
        tracing::warn!(error = %e, "ack failed; the redelivery finds the row terminal and acks again");
    }
}

/// The longest a transaction opened for a step (the claim's, or the one the
/// previous step's commit opened) waits for the step to take it.
///
/// A step that writes to the database asks for it at once (well under a
/// millisecond after the claim); one that works elsewhere first should not hold
/// a pooled connection, the job row lock and an idle transaction meanwhile. With
/// a thousand jobs in flight whose first steps wait on something else, a longer
/// window would hold a thousand connections (the benchmark's RSS run found that
/// at PostgreSQL's `max_connections`).
const OPEN_TX_WINDOW_MAX: Duration = Duration::from_millis(50);

/// How long a step may take before it asks for its database: the transaction
/// opened for it (and the job row lock) stays open that long at most before it
/// is ended (a claim committed alone, a plain admission rolled back). Never more
/// than a quarter of the TTL, far below `idle_in_transaction_session_timeout`
/// (one TTL).
fn open_tx_window(cfg: &crate::Config) -> Duration {
    (cfg.lease_ttl / 4).min(OPEN_TX_WINDOW_MAX)
}

/// Ends the transaction opened for a step after `window`, unless the step took
/// it first or the returned guard is dropped (the step ended, or the job actor's
/// future was dropped): a claim is committed alone, a plain admission rolled
/// back. The task never outlives `window` plus one commit.
///
/// If the claim cannot be committed, both `claim_lost` tokens are cancelled (the
/// step's `claim_lost`, which makes `StepCtx::db` open no fenced transaction
/// under this token, and its cancellation): after an etcd restore another
/// acquisition may hold the same token and claim the row, and an admission under
/// an equal token would let two owners in. The attempt ends as a voluntary
/// release, whose bookkeeping claims again strictly (or meets the other owner).
fn end_unused_later(
    slot: TxSlot,
    window: Duration,
    claim_lost: [CancellationToken; 2],
) -> tokio_util::sync::DropGuard {
    let done = CancellationToken::new();
    let stop = done.clone();
    tokio::spawn(
        async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(window) => {
                    match take_tx(&slot) {
                        Some(tx) if tx.carries_claim() => {
                            tracing::debug!("the step did not take its transaction within the window; committing the claim alone");
                            if let Err(e) = tx.commit_claim().await {
                                tracing::warn!(error = %e, "committing the claim alone failed; cancelling the step");
                                claim_lost.iter().for_each(CancellationToken::cancel);
                            }
                        }
                        Some(tx) => {
                            tracing::debug!("the step did not take its transaction within the window; rolling it back");
                            let _ = tx.rollback().await;
                        }
                        None => {}
                    }
                }
            }
        }
        .in_current_span(),
    );
    done.drop_guard()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_refused_while_the_session_lives_is_a_regression() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        assert_eq!(
            claim_refusal(now, later, Health::Healthy),
            ClaimRefusal::Regression
        );
        assert_eq!(
            claim_refusal(now, later, Health::Degraded),
            ClaimRefusal::Regression
        );
        // Stalled past the deadline (the watch still says Healthy after a SIGSTOP):
        // a newer owner is normal, not an alarm.
        assert_eq!(
            claim_refusal(later, now, Health::Healthy),
            ClaimRefusal::NewerOwner
        );
        assert_eq!(
            claim_refusal(now, later, Health::Lost),
            ClaimRefusal::NewerOwner
        );
    }
}
