//! `JobActor`: one per delivery. Runs the protocol of the design card as
//! phases (admit, acquire, run slot, claim, poison check, step-list check in
//! `step_list`, steps in `steps`),
//! each returning `Result<Next, Outcome>`, then settles the one
//! [`Outcome`] the delivery ends with (`outcome`).

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;
use tracing::{Instrument, field};

use super::Shared;
use super::outcome::{Attempt, Compensated, Compensation, DeadCode, Held, Outcome, Owned};
use super::registry::DynJob;
use super::run::JobRun;
use super::slots::{HoldSlot, NoRunSlot};
use super::standing::Server;
use crate::fence::{Claim, FenceError, FenceStore, FencedTx, JobRow, JobStatus};
use crate::lease::{Coming, Health, Session};
use crate::queue::Delivery;
use crate::telemetry::{StaleAt, propagation, spans};
use crate::{FencingToken, JobId, retry};

pub(crate) struct JobArgs {
    pub(crate) shared: Arc<Shared>,
    /// The job row as read with the delivery's fetch group; `None` when the
    /// group's read did not return it (no row, a second message of the same
    /// job in the group, a failed read): the actor reads its own.
    pub(crate) admitted: Option<JobRow>,
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
            // Boxed: ractor keeps the handler's future inside the actor's
            // loop future, itself allocated for the actor's whole life.
            Box::pin(run.run(delivery, admitted)).await;
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

impl JobRun {
    /// The delivery's whole life: the phases, then one [`settle`](Self::settle).
    async fn run(&self, delivery: Delivery, admitted: Option<JobRow>) {
        let mut attempt = Attempt::new(delivery);
        let job_id = match attempt.delivery().job_id() {
            Ok(id) => id,
            Err(bad) => {
                let reason = format!("bad message: {bad}");
                let seq = attempt.delivery().stream_sequence();
                tracing::warn!(seq, %reason, "dead-lettering");
                let code = DeadCode::BadMessage;
                let outcome = Outcome::DeadLetter { code, reason };
                Box::pin(self.settle(attempt, outcome)).await;
                return;
            }
        };
        let header_type = attempt.delivery().job_type().map(str::to_string).ok();
        let span = tracing::info_span!(
            spans::JOB,
            job_id = %job_id,
            job_type = header_type.as_deref().unwrap_or("?"),
            token = field::Empty,
            lease_id = field::Empty,
            worker = %self.shared.cfg.worker_id,
            delivery = attempt.delivery().delivery_count(),
            "messaging.system" = "nats",
            "messaging.operation.type" = "process",
            "messaging.destination.name" = attempt.delivery().subject(),
        );
        // The producer's trace (every delivery, a takeover's too, carries it).
        let parent = propagation::from_headers(attempt.delivery().headers());
        propagation::set_parent(&span, parent);
        // Each phase's future is boxed (here and in `phases`, `run_steps`,
        // `run_step`, `drive_stage`): a job's future is allocated once per job
        // in flight at the size of its largest state, so inline it would
        // carry the claim's, the commit's and the settling's futures through
        // every step it waits on (11 KB; BENCHMARKS.md, worker RSS). Boxed,
        // only the phase that runs is allocated.
        async move {
            let phases = Box::pin(self.phases(&mut attempt, job_id, header_type, admitted));
            let outcome = match phases.await {
                Ok(()) => Outcome::Done,
                Err(outcome) => outcome,
            };
            Box::pin(self.settle(attempt, outcome)).await;
        }
        .instrument(span)
        .await;
    }

    /// Admit, acquire, wait for a run slot, claim, poison check, step-list
    /// check, steps: `Ok`
    /// when the last step committed, else the outcome the delivery ends with.
    async fn phases(
        &self,
        a: &mut Attempt,
        job_id: JobId,
        header_type: Option<String>,
        admitted: Option<JobRow>,
    ) -> Result<(), Outcome> {
        // A renewed message carries the rest of its predecessor's delay.
        if let Some(delay) = a.delivery().not_before_wait() {
            return Err(Outcome::Retry { delay });
        }
        if a.delivery().delivery_count() > 1 {
            tracing::info!(
                deliveries = a.delivery().delivery_count(),
                "redelivered: an earlier delivery was handed back (contention, retry, \
                 shutdown) or its owner went silent past AckWait"
            );
        }
        // This delivery will ask for its lock once admitted: a lock batch about
        // to leave may wait a moment for it.
        let coming = self.shared.locks.expect_acquire();
        // Watched from before admission, so a cancel notice that arrives while
        // the row is read, the lock acquired or the claim made is not missed.
        a.cancel = Some(self.shared.cancels.watch(job_id));
        let job = self.admit(a, job_id, header_type, admitted).await?;
        // Admission lets a dead row through only when its compensation is
        // pending: the hook runs under our lock, then the job is dead-lettered.
        let compensating = a.row.as_ref().is_some_and(|r| r.status == JobStatus::Dead);
        Box::pin(self.hold_while_paused(a)).await?;
        self.acquire(a, job_id, coming).await?;
        Box::pin(self.wait_run_slot(a)).await?;
        if compensating {
            return Err(Box::pin(self.compensate_dead(a, &job)).await);
        }
        let (claim, claim_tx) = Box::pin(self.claim(a, job)).await?;
        let Held::Claim(owned) = &a.held else {
            unreachable!("a successful claim leaves the attempt holding its claim")
        };
        let claim_tx = self.poison_check(owned, &claim, claim_tx).await?;
        let claim_tx = Box::pin(self.step_list_check(owned, &claim, claim_tx)).await?;
        Box::pin(self.run_steps(owned, a.delivery(), claim, claim_tx)).await
    }

    /// Phase 1, admission: the job row (usually read with the delivery's fetch
    /// group) must exist, be live, and name a type this worker runs.
    async fn admit(
        &self,
        a: &mut Attempt,
        job_id: JobId,
        header_type: Option<String>,
        admitted: Option<JobRow>,
    ) -> Result<Arc<dyn DynJob>, Outcome> {
        let sh = &self.shared;
        let read = match admitted {
            Some(row) => Ok(Some(row)),
            None => sh.store.job(job_id).await,
        };
        let row = match read {
            Ok(Some(row)) => row,
            Ok(None) => {
                let reason = "no job row: the message was not enqueued through Tenure".into();
                let code = DeadCode::NoJobRow;
                return Err(Outcome::DeadLetter { code, reason });
            }
            Err(e) => {
                if matches!(e, FenceError::Db(_)) {
                    sh.suspect(Server::Postgres);
                }
                tracing::warn!(error = %e, "admission read failed; retrying later");
                let delay = retry::jittered(&sh.cfg.retry_backoff, 0);
                return Err(Outcome::Retry { delay });
            }
        };
        a.job_type = row.job_type.clone();
        let row = a.row.insert(row);
        check_admission(row, header_type.as_deref())?;
        if let Some(job) = sh.registry.get(&row.job_type) {
            return Ok(job);
        }
        let reason = format!("unknown job type {:?}", row.job_type);
        // Not a label of ours: a stray type must not grow the metrics.
        a.job_type = "unknown".into();
        let code = DeadCode::UnknownJobType;
        Err(Outcome::DeadLetter { code, reason })
    }

    /// Phase 2: the job's lock (or, in partition mode, its partition's
    /// grant), under a healthy session.
    async fn acquire(&self, a: &mut Attempt, job_id: JobId, coming: Coming) -> Result<(), Outcome> {
        let sh = &self.shared;
        let Some(session) = sh.healthy_session() else {
            let delay = retry::jittered(&sh.cfg.contention_backoff, 0);
            return Err(Outcome::Retry { delay });
        };
        tracing::Span::current().record("lease_id", field::display(session.lease_id()));
        sh.owning.acquire(self, a, job_id, session, coming).await
    }

    /// A run slot (held until the delivery is settled): at once unless this
    /// delivery was fetched ahead of the running jobs (see `Slots`).
    async fn wait_run_slot(&self, a: &mut Attempt) -> Result<(), Outcome> {
        let sh = &self.shared;
        // A type paused meanwhile: wait for the resume instead of giving the
        // delivery back when the bound passes (that would count a delivery).
        let got = loop {
            let stop = async {
                tokio::select! {
                    () = sh.draining.cancelled() => NoRunSlot::Draining,
                    () = sh.pauses.paused(&a.job_type) => NoRunSlot::Paused,
                }
            };
            match self.slots.run_slot_until(stop).await {
                Err(NoRunSlot::Paused) => self.hold_while_paused(a).await?,
                got => break got,
            }
        };
        match got {
            Ok(slot) => a.run_slot = Some(slot),
            Err(why) => {
                tracing::debug!(
                    ?why,
                    "no run slot for a delivery fetched ahead; giving it back"
                );
                // Redelivered at once (to a worker with a free slot, or to this one).
                return Err(Outcome::Retry {
                    delay: Duration::ZERO,
                });
            }
        }
        // The session may have been lost while the delivery waited: its lock is
        // gone (or going) with the lease, and a newer owner may hold the job.
        // Do not claim with a token that no longer guards anything.
        if let Held::Lock { session, .. } = &a.held
            && session.health() == Health::Lost
        {
            tracing::info!(
                "the session was lost while the delivery waited for a run slot; giving it back"
            );
            return Err(Outcome::Retry {
                delay: Duration::ZERO,
            });
        }
        Ok(())
    }

    /// Phase 3: claims the fence at the resource, before any useful work. The claim
    /// opens the first step's fenced transaction (its UPDATE holds the row
    /// lock, so the step needs no admission and no commit of its own).
    async fn claim(
        &self,
        a: &mut Attempt,
        job: Arc<dyn DynJob>,
    ) -> Result<(Claim, FencedTx), Outcome> {
        let sh = &self.shared;
        let Held::Lock { lock, .. } = &a.held else {
            unreachable!("the claim follows the acquisition")
        };
        let (job_id, token) = (lock.job_id(), lock.token());
        let span = tracing::info_span!(spans::CLAIM, job_id = %job_id, token = token.get());
        let claimed =
            claim_for_first_step(&sh.store, job_id, token, sh.cfg.tuning.commit_claim_first)
                .instrument(span)
                .await;
        let (claim, claim_tx) = match claimed {
            Ok(c) => c,
            Err(e) => return Err(self.claim_refused(a, e).await),
        };
        sh.metrics.claimed(job.name(), claim.takeover);
        if claim.previous.is_none() {
            let since = a.delivery().published_at().elapsed().unwrap_or_default();
            sh.metrics.first_claim(job.name(), since);
        }
        if claim.takeover {
            tracing::warn!(
                takeovers = claim.takeovers,
                previous_fence = a.row.as_ref().map(|r| r.fence),
                "took over the job from an owner that did not release it (crash, pause or partition)"
            );
        }
        let Held::Lock { session, lock } = std::mem::replace(&mut a.held, Held::Nothing) else {
            unreachable!("checked above")
        };
        let (lock, partition) = lock.into_kept();
        a.held = Held::Claim(Owned {
            job_id,
            job,
            session,
            lock,
            partition,
            token,
            takeovers: claim.takeovers,
            attempts: claim.attempts,
            cancel: a.cancel.as_ref().map(|w| w.token()).unwrap_or_default(),
            input: Arc::new(claim.input.clone()),
        });
        Ok((claim, claim_tx))
    }

    /// Phase 4, the poison check: a job that lost its owner too often is
    /// dead-lettered instead of run again.
    async fn poison_check(
        &self,
        owned: &Owned,
        claim: &Claim,
        claim_tx: FencedTx,
    ) -> Result<FencedTx, Outcome> {
        let sh = &self.shared;
        let max_takeovers = owned.job.max_takeovers().unwrap_or(sh.cfg.max_takeovers);
        if claim.takeovers <= max_takeovers {
            return Ok(claim_tx);
        }
        // The dead-lettering writes are fenced on their own connection: make
        // the claim durable first (it holds the row lock until then).
        if let Err(e) = claim_tx.commit_claim().await {
            tracing::warn!(error = %e, "committing the claim failed; retrying later");
            let delay = retry::jittered(&sh.cfg.retry_backoff, 0);
            return Err(Outcome::Retry { delay });
        }
        let reason = format!(
            "lost its owner {} times (max_takeovers = {max_takeovers})",
            claim.takeovers
        );
        let code = DeadCode::MaxTakeovers;
        Err(Outcome::DeadLetter { code, reason })
    }

    /// A dead job whose compensation is pending, under our fresh lock: runs
    /// its `on_dead` hook, then dead-letters it.
    async fn compensate_dead(&self, a: &mut Attempt, job: &Arc<dyn DynJob>) -> Outcome {
        let Held::Lock { session, lock } = &a.held else {
            unreachable!("the compensation follows the acquisition")
        };
        let attempt = a.delivery().delivery_count().saturating_sub(1);
        let compensation = Compensation {
            job,
            job_id: lock.job_id(),
            token: lock.token(),
            session,
            attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
        };
        match self.compensate(compensation).await {
            Ok(Compensated::Done) => dead_row(a.row.as_ref()),
            Ok(Compensated::Failed(note)) => match dead_row(a.row.as_ref()) {
                Outcome::DeadLetter { code, reason } => Outcome::DeadLetter {
                    code,
                    reason: format!("{reason}; {note}"),
                },
                other => other,
            },
            Err(outcome) => outcome,
        }
    }

    /// What a claim refused on our fresh lock means. Never runs the job.
    async fn claim_refused(&self, a: &mut Attempt, e: FenceError) -> Outcome {
        let Held::Lock { session, lock } = &a.held else {
            unreachable!("a claim is refused to a lock")
        };
        if e.is_fenced_out() {
            let (now, deadline) = (Instant::now(), session.lost_deadline());
            let partitioned = !lock.live_session_excludes_newer_owners();
            return match claim_refusal(now, deadline, session.health(), partitioned) {
                ClaimRefusal::NewerOwner => Outcome::Stale {
                    at: StaleAt::Claim,
                    step: None,
                    error: e.to_string(),
                },
                ClaimRefusal::Regression => Outcome::Regression {
                    error: e.to_string(),
                },
            };
        }
        if e.is_token_regression() {
            // Another owner may hold this very token: never run the job. Handed
            // back: the next acquisition gets a later revision.
            return Outcome::Regression {
                error: e.to_string(),
            };
        }
        match e {
            // Marked dead since admission (the broker gave up, an operator):
            // dead-letter it as admission would.
            FenceError::Terminal {
                status: JobStatus::Dead,
                ..
            } => {
                let job_id = lock.job_id();
                a.row = self.shared.store.job(job_id).await.ok().flatten();
                dead_row(a.row.as_ref())
            }
            FenceError::Terminal {
                status: JobStatus::Cancelled,
                ..
            } => Outcome::Cancelled,
            FenceError::Terminal { .. } => Outcome::Ack,
            e => {
                if matches!(e, FenceError::Db(_)) {
                    self.shared.suspect(Server::Postgres);
                }
                tracing::warn!(error = %e, "claim failed; retrying later");
                let delay = retry::jittered(&self.shared.cfg.retry_backoff, 0);
                Outcome::Retry { delay }
            }
        }
    }
}

/// Admission's checks of a row that exists: a terminal row ends the delivery
/// (acked if done or cancelled, dead-lettered if dead), and a header that contradicts the
/// row is a bad message.
fn check_admission(row: &JobRow, header_type: Option<&str>) -> Result<(), Outcome> {
    match row.status {
        JobStatus::Done => {
            tracing::debug!("job already done; acking the redelivery");
            return Err(Outcome::Ack);
        }
        // Dead, its `on_dead` hook not yet committed (a crash mid-hook, or
        // the broker gave up on it): compensate first.
        JobStatus::Dead if row.compensation_pending => {}
        // The row went dead but the message was not dead-lettered yet (a crash
        // in between): finish that now.
        JobStatus::Dead => return Err(dead_row(Some(row))),
        JobStatus::Cancelled => {
            tracing::info!("job cancelled before this delivery ran it; acking");
            return Err(Outcome::Cancelled);
        }
        _ => {}
    }
    match header_type {
        Some(h) if h != row.job_type => Err(Outcome::DeadLetter {
            code: DeadCode::BadMessage,
            reason: format!(
                "bad message: header job type {h:?} but the job row says {:?}",
                row.job_type
            ),
        }),
        _ => Ok(()),
    }
}

/// Dead-letters a delivery whose row is `dead`, with the row's last error as
/// the reason (`row` is `None` if it could not be read).
fn dead_row(row: Option<&JobRow>) -> Outcome {
    let reason = row
        .and_then(|r| r.last_error.clone())
        .unwrap_or_else(|| "dead".into());
    Outcome::DeadLetter {
        code: DeadCode::Dead,
        reason,
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
///
/// Under a partition's grant a live session proves nothing: the partition
/// may have moved to another owner and back since the grant (each move a new
/// token, the row fenced by the one in between). There, a regression is
/// caught where partition tokens are compared, by
/// [`claim_partition`](crate::fence::FenceStore::claim_partition).
fn claim_refusal(
    now: Instant,
    lost_deadline: Instant,
    health: Health,
    partitioned: bool,
) -> ClaimRefusal {
    if partitioned || health_at(now, lost_deadline, health) == Health::Lost {
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
pub(super) fn lease_health_now(session: &Session) -> Health {
    health_at(Instant::now(), session.lost_deadline(), session.health())
}

/// The claim and the first step's transaction: in one transaction (the
/// default), or with the claim committed first (`Tuning::commit_claim_first`:
/// a downstream service that verifies tokens against the job rows sees the
/// claim while the step calls it).
async fn claim_for_first_step(
    store: &FenceStore,
    job_id: JobId,
    token: FencingToken,
    commit_first: bool,
) -> Result<(Claim, FencedTx), FenceError> {
    if !commit_first {
        return store.claim_and_begin(job_id, token).await;
    }
    let claim = store.claim(job_id, token).await?;
    let tx = store.begin_step(job_id, token, claim.step).await?;
    Ok((claim, tx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_refused_while_the_session_lives_is_a_regression() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        assert_eq!(
            claim_refusal(now, later, Health::Healthy, false),
            ClaimRefusal::Regression
        );
        assert_eq!(
            claim_refusal(now, later, Health::Degraded, false),
            ClaimRefusal::Regression
        );
        // Stalled past the deadline (the watch still says Healthy after a SIGSTOP):
        // a newer owner is normal, not an alarm.
        assert_eq!(
            claim_refusal(later, now, Health::Healthy, false),
            ClaimRefusal::NewerOwner
        );
        assert_eq!(
            claim_refusal(now, later, Health::Lost, false),
            ClaimRefusal::NewerOwner
        );
    }

    #[test]
    fn a_partition_grant_fenced_out_by_a_later_owner_is_no_alarm() {
        // The partition moved to another owner (who claimed the job) and
        // back while this delivery held its grant: a live session, a larger
        // fence, and nothing went backwards.
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        for health in [Health::Healthy, Health::Degraded] {
            assert_eq!(
                claim_refusal(now, later, health, true),
                ClaimRefusal::NewerOwner
            );
        }
    }
}
