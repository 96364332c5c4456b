//! How a delivery ends: every ending of a job is one [`Outcome`], and
//! [`JobRun::settle`] performs its side effects (ack, nak or dead-letter of the
//! message, deletion of our lock, bookkeeping on the job row, metrics, the
//! observer) in this one place.
//!
//! The phases of `job_actor` and `steps` decide; they do no message or lock
//! side effects of their own. What a delivery holds when it ends (nothing, a
//! lock, or a claim on the row) is its [`Held`]; settling undoes it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::cancel::CancelWatch;
use super::partitions::PartitionGrant;
use super::registry::DynJob;
use super::run::{Holding, JobRun};
use super::slots::RunSlot;
use crate::fence::{FenceError, JobRow, JobStatus};
use crate::lease::{JobLock, ReleaseMode, Session};
use crate::queue::{DeadLetterInfo, Delivery, HandedBack};
use crate::telemetry::StaleAt;
use crate::{FencingToken, JobId, ObservedFence, StepIndex, retry};

/// Every way a delivery can end.
#[derive(Debug)]
pub(super) enum Outcome {
    /// The last step committed (`status = done`): counted, acked, our lock
    /// deleted in the background.
    Done,
    /// The row is already terminal (a redelivery of a finished job): acked, a
    /// lock we hold deleted in the background.
    Ack,
    /// The row is `cancelled` (an operator cancelled the job: seen at
    /// admission, at the claim, at a refused admission or commit, or
    /// confirmed after a cancel notice stopped the step): counted, acked, a
    /// lock we hold deleted in the background. No retry, no DLQ, no row write.
    Cancelled,
    /// Not now: a lock we hold is deleted at once (the next attempt needs it),
    /// then the message is nak'ed, redelivered after `delay`.
    Retry { delay: Duration },
    /// Another session holds the job's lock: counted, nak'ed with `delay`.
    Contended { delay: Duration },
    /// Our own lease holds the lock but no job actor of this worker does (a
    /// create whose answer was lost, a release that gave up): the stranded lock
    /// is deleted and the message nak'ed.
    Stranded {
        session: Arc<Session>,
        job_id: JobId,
    },
    /// A retryable failure of an attempt we own: counted on the row (fenced),
    /// then [`Retry`](Outcome::Retry) with backoff (or `after`, the delay the
    /// step asked for with `StepError::retry_after`), or
    /// [`DeadLetter`](Outcome::DeadLetter) past the job's retry limit.
    Fail {
        reason: String,
        after: Option<Duration>,
        /// The dead letter's code if this failure exhausts the retries:
        /// `MaxRetries`, or `Timeout` for a step stopped at its timeout.
        exhausted: DeadCode,
    },
    /// We stop a job we own (the worker drains, the step was cancelled, our
    /// definition does not fit its committed steps): the release is recorded
    /// on the row, so the next claim is no takeover, then
    /// [`Retry`](Outcome::Retry) after `after`.
    Release { after: Duration },
    /// Dead-lettered: a row we own is marked dead (fenced) first, an unknown
    /// job type's row unfenced; the DLQ publish terminates the message; a lock
    /// we hold is deleted in the background.
    DeadLetter { code: DeadCode, reason: String },
    /// A newer owner fenced us out: counted and reported, nothing acked. A lock
    /// never claimed (refused at the claim) is deleted; after a claim it is
    /// left alone (the newer owner's claim means our key is gone).
    Stale {
        at: StaleAt,
        step: Option<StepIndex>,
        error: String,
    },
    /// Our fresh lock met a fence at or above its token: etcd's revisions went
    /// backwards. The alarm is raised and the job handed back unrun
    /// ([`Retry`](Outcome::Retry) with backoff).
    Regression { error: String },
    /// We may no longer hold the job (the lease was lost, or not healthy at a
    /// commit): a lock we hold is deleted at once; the message is neither acked
    /// nor nak'ed, so the broker redelivers it after AckWait to the next owner.
    LeaveToNextOwner,
}

impl Outcome {
    /// A retryable failure with the backoff's delay.
    pub(super) fn fail(reason: String) -> Self {
        Outcome::Fail {
            reason,
            after: None,
            exhausted: DeadCode::MaxRetries,
        }
    }
}

/// The outcomes that end a delivery as they are: what [`JobRun::settle`]
/// turns every [`Outcome`] into (the bookkeeping ones, `Fail`, `Release`,
/// `Regression` and `DeadLetter`, first do their bookkeeping). Each variant is
/// documented at its [`Outcome`] namesake.
#[derive(Debug)]
enum Ending {
    Done,
    Ack,
    Cancelled,
    Retry {
        delay: Duration,
    },
    Contended {
        delay: Duration,
    },
    Stranded {
        session: Arc<Session>,
        job_id: JobId,
    },
    Stale {
        at: StaleAt,
        step: Option<StepIndex>,
        error: String,
    },
    LeaveToNextOwner,
}

/// Why a job was dead-lettered: the code in the DLQ reason and the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DeadCode {
    /// The message has no valid job id, or its header contradicts the row.
    BadMessage,
    /// The message was not enqueued through Tenure.
    NoJobRow,
    /// No job of the row's type is registered in this worker.
    UnknownJobType,
    /// The row is already dead (a crash between marking and publishing).
    Dead,
    /// The job lost its owner more than `max_takeovers` times.
    MaxTakeovers,
    /// A step returned a permanent error (or wrote around the fence).
    PermanentError,
    /// The job failed more than its retry limit.
    MaxRetries,
    /// A step ran past its timeout: the last of the retries, or a timeout
    /// that says `on_timeout = "permanent"`.
    Timeout,
    /// No worker whose definition fits the job's committed steps took it
    /// within `Config::definition_grace`.
    DefinitionChanged,
}

impl DeadCode {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            DeadCode::BadMessage => "bad_message",
            DeadCode::NoJobRow => "no_job_row",
            DeadCode::UnknownJobType => "unknown_job_type",
            DeadCode::Dead => "dead",
            DeadCode::MaxTakeovers => "max_takeovers",
            DeadCode::PermanentError => "permanent_error",
            DeadCode::MaxRetries => "max_retries",
            DeadCode::Timeout => "timeout",
            DeadCode::DefinitionChanged => "definition_changed",
        }
    }
}

/// What a delivery runs its job under until its claim.
pub(super) enum Grant {
    /// The job's own etcd lock.
    Lock(JobLock),
    /// Its partition's grant.
    Partition(PartitionGrant),
}

impl Grant {
    pub(super) fn job_id(&self) -> JobId {
        match self {
            Grant::Lock(l) => l.job_id(),
            Grant::Partition(g) => g.job_id,
        }
    }

    pub(super) fn token(&self) -> FencingToken {
        match self {
            Grant::Lock(l) => l.token(),
            Grant::Partition(g) => g.token,
        }
    }

    /// Whether a live session proves that no newer owner can exist: true of
    /// a job's lock; not of a partition's grant, whose partition may have
    /// moved away and back since (each move a new token).
    pub(super) fn live_session_excludes_newer_owners(&self) -> bool {
        matches!(self, Grant::Lock(_))
    }

    /// What the claimed job keeps: the lock (deleted when the delivery
    /// settles), or the partition's grant (its hand-over stops the job).
    pub(super) fn into_kept(self) -> (Option<JobLock>, Option<PartitionGrant>) {
        match self {
            Grant::Lock(lock) => (Some(lock), None),
            Grant::Partition(grant) => (None, Some(grant)),
        }
    }
}

/// What a delivery holds when it ends.
pub(super) enum Held {
    /// Nothing of ours: no lock (yet), no claim.
    Nothing,
    /// Our job lock or partition grant, not claimed at the resource.
    Lock { session: Arc<Session>, lock: Grant },
    /// Our claim on the job row (and our lock, until it is deleted).
    Claim(Owned),
}

impl Held {
    /// The lock we hold, taken (so it is deleted once).
    fn take_lock(&mut self) -> Option<(Arc<Session>, JobLock)> {
        match std::mem::replace(self, Held::Nothing) {
            Held::Nothing => None,
            Held::Lock {
                session,
                lock: Grant::Lock(lock),
            } => Some((session, lock)),
            held @ Held::Lock { .. } => {
                // A partition's grant: nothing to delete; kept until settled.
                *self = held;
                None
            }
            Held::Claim(mut owned) => {
                let lock = owned.lock.take().map(|l| (owned.session.clone(), l));
                *self = Held::Claim(owned);
                lock
            }
        }
    }
}

/// A job this delivery claimed.
pub(super) struct Owned {
    pub(super) job_id: JobId,
    pub(super) job: Arc<dyn DynJob>,
    pub(super) session: Arc<Session>,
    pub(super) lock: Option<JobLock>,
    /// Partition mode: the partition's grant (its hand-over stops the job at
    /// the next step boundary).
    pub(super) partition: Option<PartitionGrant>,
    pub(super) token: FencingToken,
    pub(super) takeovers: u32,
    pub(super) attempts: u32,
    /// Fired by an operator's cancel notice for this job.
    pub(super) cancel: CancellationToken,
    /// The job's input as enqueued (every step's `StepCtx::input`).
    pub(super) input: Arc<serde_json::Value>,
}

impl Owned {
    /// Whether the job's partition is being handed over to another worker.
    pub(super) fn handing_over(&self) -> bool {
        self.partition
            .as_ref()
            .is_some_and(|g| g.handover.is_cancelled())
    }
}

/// One delivery on its way through the phases: the message, what is known of
/// its job, and what it holds.
pub(super) struct Attempt {
    delivery: Delivery,
    /// The job type for metrics: `unknown` until admission trusts the row's.
    pub(super) job_type: String,
    /// The job row as admission read it (for an unowned dead-letter's details).
    pub(super) row: Option<JobRow>,
    pub(super) held: Held,
    /// This job actor's entry in the worker's holding map, until settled.
    pub(super) holding: Option<Holding>,
    /// The run slot, until settled.
    pub(super) run_slot: Option<RunSlot>,
    /// This delivery's watch on operator cancel notices, until settled.
    pub(super) cancel: Option<CancelWatch>,
}

impl Attempt {
    pub(super) fn new(delivery: Delivery) -> Self {
        Attempt {
            delivery,
            job_type: "unknown".into(),
            row: None,
            held: Held::Nothing,
            holding: None,
            run_slot: None,
            cancel: None,
        }
    }

    /// The message, until settling acks, naks or dead-letters it.
    pub(super) fn delivery(&self) -> &Delivery {
        &self.delivery
    }
}

/// How a compensation ended, when it did not end the delivery otherwise.
pub(super) enum Compensated {
    /// The hook committed now, or nothing was pending.
    Done,
    /// The hook failed permanently: its compensation stays pending (a
    /// redrive resets it), and the job is dead-lettered with this note.
    Failed(String),
}

/// The compensation to run: the job, its owner's token and session, and the
/// delivery's attempt number (for the backoff of a retryable hook failure).
pub(super) struct Compensation<'a> {
    pub(super) job: &'a Arc<dyn DynJob>,
    pub(super) job_id: JobId,
    pub(super) token: FencingToken,
    pub(super) session: &'a Session,
    pub(super) attempt: u32,
}

impl JobRun {
    /// Ends the delivery as `outcome` says. The bookkeeping outcomes (`Fail`,
    /// `Release`, `Regression`, and the dead mark of a `DeadLetter` we own)
    /// first turn into the ending they lead to.
    pub(super) async fn settle(&self, mut a: Attempt, outcome: Outcome) {
        let mut outcome = outcome;
        let ending = loop {
            outcome = match outcome {
                Outcome::Fail {
                    reason,
                    after,
                    exhausted,
                } => self.record_failure(&mut a, reason, after, exhausted).await,
                Outcome::Release { after } => self.record_release(&a, after).await,
                Outcome::Regression { error } => {
                    self.regression_alarm(&a, &error);
                    let delay = retry::jittered(&self.shared.cfg.retry_backoff, 0);
                    Outcome::Retry { delay }
                }
                Outcome::DeadLetter { code, reason } => {
                    match self.mark_dead(&a, code, &reason).await {
                        Ok(()) => match self.compensate_owned(&a).await {
                            Ok(None) => return self.dead_letter(a, code, reason).await,
                            Ok(Some(note)) => {
                                let reason = format!("{reason}; {note}");
                                return self.dead_letter(a, code, reason).await;
                            }
                            Err(next) => next,
                        },
                        Err(next) => next,
                    }
                }
                Outcome::Done => break Ending::Done,
                Outcome::Ack => break Ending::Ack,
                Outcome::Cancelled => break Ending::Cancelled,
                Outcome::Retry { delay } => break Ending::Retry { delay },
                Outcome::Contended { delay } => break Ending::Contended { delay },
                Outcome::Stranded { session, job_id } => {
                    break Ending::Stranded { session, job_id };
                }
                Outcome::Stale { at, step, error } => break Ending::Stale { at, step, error },
                Outcome::LeaveToNextOwner => break Ending::LeaveToNextOwner,
            };
        };
        self.end(a, ending).await;
    }

    /// Performs an ending: the message acked, nak'ed or left, our lock deleted
    /// or left, the metrics and the observer told.
    async fn end(&self, mut a: Attempt, ending: Ending) {
        let sh = &self.shared;
        match ending {
            Ending::Done => {
                let since = a.delivery().published_at().elapsed().unwrap_or_default();
                sh.metrics.completed(&a.job_type, since);
                if let Held::Claim(owned) = &a.held {
                    notify_finished(sh, owned.job_id, JobStatus::Done).await;
                }
                self.ack(a).await;
            }
            Ending::Ack => self.ack(a).await,
            Ending::Cancelled => {
                sh.metrics.cancelled(&a.job_type);
                tracing::info!("job cancelled by an operator; acking");
                self.ack(a).await;
            }
            Ending::Retry { delay } => {
                self.release(&mut a.held, ReleaseMode::Prompt).await;
                retry_later(a.delivery, delay).await;
            }
            Ending::Contended { delay } => {
                sh.metrics.contention(&a.job_type);
                retry_later(a.delivery, delay).await;
            }
            Ending::Stranded { session, job_id } => {
                if let Err(e) = session.release_stranded(job_id).await {
                    tracing::warn!(error = %e, "deleting a lock stranded under our own lease failed");
                }
                let delay = retry::jittered(&sh.cfg.contention_backoff, 0);
                retry_later(a.delivery, delay).await;
            }
            Ending::Stale { at, step, error } => self.stale(&mut a, at, step, &error).await,
            Ending::LeaveToNextOwner => self.release(&mut a.held, ReleaseMode::Prompt).await,
        }
    }

    async fn ack(&self, a: Attempt) {
        let Attempt {
            delivery, mut held, ..
        } = a;
        if let Err(e) = delivery.ack().await {
            tracing::warn!(error = %e, "ack failed; the redelivery finds the row terminal and acks again");
        }
        self.release(&mut held, ReleaseMode::Deferred).await;
    }

    /// Deletes the lock we hold, if any (once: later calls find none).
    async fn release(&self, held: &mut Held, mode: ReleaseMode) {
        if let Some((session, lock)) = held.take_lock() {
            self.shared.locks.release(session, lock, mode).await;
        }
    }

    /// Records a retryable failure on the row, and says what follows.
    async fn record_failure(
        &self,
        a: &mut Attempt,
        reason: String,
        after: Option<Duration>,
        exhausted: DeadCode,
    ) -> Outcome {
        let sh = &self.shared;
        let Held::Claim(owned) = &mut a.held else {
            return Outcome::Retry {
                delay: retry::jittered(&sh.cfg.retry_backoff, 0),
            };
        };
        let recorded = self
            .with_claim(owned, || {
                sh.store.record_failure(owned.job_id, owned.token, &reason)
            })
            .await;
        let attempts = match recorded {
            Ok(attempts) => attempts,
            Err(e) if e.is_fenced_out() => return stale_bookkeeping(e),
            Err(e) => {
                tracing::warn!(error = %e, %reason, "recording the failure failed; retrying later");
                let delay = retry::jittered(&sh.cfg.retry_backoff, 0);
                return Outcome::Retry { delay };
            }
        };
        owned.attempts = attempts;
        let limit = owned.job.retries().unwrap_or(sh.cfg.max_retries);
        if attempts > limit {
            let reason =
                format!("failed {attempts} times (retries = {limit}); last error: {reason}");
            return Outcome::DeadLetter {
                code: exhausted,
                reason,
            };
        }
        sh.metrics.retried(&a.job_type);
        // The step's own request (already cut to `MAX_RETRY_AFTER`) replaces
        // the backoff for this attempt.
        let delay = after
            .unwrap_or_else(|| retry::jittered(&sh.cfg.retry_backoff, attempts.saturating_sub(1)));
        tracing::info!(attempts, ?delay, %reason, "step failed; retrying");
        Outcome::Retry { delay }
    }

    /// Records a voluntary release on the row (best effort), then hands back.
    async fn record_release(&self, a: &Attempt, after: Duration) -> Outcome {
        let sh = &self.shared;
        if let Held::Claim(owned) = &a.held {
            let recorded = self
                .with_claim(owned, || sh.store.record_release(owned.job_id, owned.token))
                .await;
            if let Err(e) = recorded {
                tracing::warn!(error = %e, "recording the voluntary release failed");
            }
        }
        tracing::info!(?after, "released the job voluntarily");
        Outcome::Retry { delay: after }
    }

    /// Marks the row dead before the DLQ publish, so a crash in between leaves
    /// a dead row whose redelivery is dead-lettered at admission: fenced if we
    /// own it, unfenced for a type no worker here knows (nobody owns it).
    /// `Err` is the ending instead of the dead-letter.
    async fn mark_dead(&self, a: &Attempt, code: DeadCode, reason: &str) -> Result<(), Outcome> {
        let sh = &self.shared;
        let Held::Claim(owned) = &a.held else {
            self.mark_unknown_type_dead(a, code, reason).await;
            return Ok(());
        };
        let marked = self
            .with_claim(owned, || {
                let compensate = owned.job.has_on_dead();
                sh.store
                    .mark_dead(owned.job_id, owned.token, reason, compensate)
            })
            .await;
        match marked {
            Ok(()) => Ok(()),
            Err(e) if e.is_fenced_out() => Err(stale_bookkeeping(e)),
            Err(e) => {
                tracing::warn!(error = %e, "marking the job dead failed; retrying later");
                let delay = retry::jittered(&sh.cfg.retry_backoff, 0);
                Err(Outcome::Retry { delay })
            }
        }
    }

    /// Runs the `on_dead` hook of a job we own and just marked dead (its
    /// compensation pending): `Ok(Some(note))` when the hook failed for good.
    async fn compensate_owned(&self, a: &Attempt) -> Result<Option<String>, Outcome> {
        let Held::Claim(owned) = &a.held else {
            return Ok(None);
        };
        if !owned.job.has_on_dead() {
            return Ok(None);
        }
        let attempt = a.delivery.delivery_count().saturating_sub(1);
        let compensation = Compensation {
            job: &owned.job,
            job_id: owned.job_id,
            token: owned.token,
            session: &owned.session,
            attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
        };
        match self.compensate(compensation).await? {
            Compensated::Done => Ok(None),
            Compensated::Failed(note) => Ok(Some(note)),
        }
    }

    /// Publishes to the DLQ (which terminates the message), then deletes a
    /// lock we hold in the background.
    async fn dead_letter(&self, a: Attempt, code: DeadCode, reason: String) {
        let sh = &self.shared;
        let info = match &a.held {
            Held::Claim(owned) => {
                let last = Some(owned.token.observed());
                info(code, &reason, last, owned.takeovers, owned.attempts)
            }
            _ => {
                let row = a.row.as_ref();
                let last = row.and_then(|r| ObservedFence::new(r.fence));
                let (takeovers, attempts) = row.map_or((0, 0), |r| (r.takeovers, r.attempts));
                info(code, &reason, last, takeovers, attempts)
            }
        };
        sh.metrics.dead_lettered(&a.job_type, code.as_str());
        tracing::warn!(reason = %reason, code = code.as_str(), "job dead-lettered");
        let dead_row = match &a.held {
            Held::Claim(owned) => Some(owned.job_id),
            _ => a.row.as_ref().map(|r| r.id),
        };
        if let Some(job_id) = dead_row {
            notify_finished(sh, job_id, JobStatus::Dead).await;
        }
        let Attempt {
            delivery, mut held, ..
        } = a;
        if let Err(e) = delivery.dead_letter(info).await {
            tracing::error!(error = %e, "DLQ publish failed; the redelivery will dead-letter it again");
        }
        self.release(&mut held, ReleaseMode::Deferred).await;
    }

    /// A row of a type no worker here knows is marked dead (unfenced: nobody
    /// owns it), so its redeliveries are dead-lettered at admission.
    async fn mark_unknown_type_dead(&self, a: &Attempt, code: DeadCode, reason: &str) {
        if code != DeadCode::UnknownJobType {
            return;
        }
        if let Some(row) = &a.row {
            let marked = self.shared.store.mark_dead_unfenced(row.id, reason, false);
            if let Err(e) = marked.await {
                tracing::warn!(error = %e, "marking the job dead failed");
            }
        }
    }

    /// Counts and reports a stale owner's refused write; nothing is acked.
    async fn stale(&self, a: &mut Attempt, at: StaleAt, step: Option<StepIndex>, error: &str) {
        let sh = &self.shared;
        sh.metrics.stale_rejected(&a.job_type, at);
        if let Held::Lock { .. } = a.held {
            tracing::info!(
                error,
                "fenced out at claim: this worker stalled past its lease after \
                 acquiring, and a newer owner claimed the job"
            );
            self.release(&mut a.held, ReleaseMode::Prompt).await;
            return;
        }
        tracing::warn!(
            error,
            step = ?step,
            at = at.as_str(),
            "write refused: fenced out by a newer owner; not acking"
        );
        if let (Held::Claim(owned), Some(step), Some(h)) = (&a.held, step, &sh.observer) {
            h.stale_rejected(owned.job_id, step, owned.token);
        }
    }

    /// A fresh, verified lock of a live session met a fence at or above its
    /// token: etcd's revisions went backwards. Counted, logged as an alert and
    /// reported to the observer.
    fn regression_alarm(&self, a: &Attempt, error: &str) {
        self.shared.metrics.token_regression(&a.job_type);
        tracing::error!(
            error,
            "ALERT: fencing token regression (etcd revisions went backwards: a snapshot \
             restore without --bump-revision?); the job is handed back, not run"
        );
        if let (Held::Lock { lock, .. }, Some(h)) = (&a.held, &self.shared.observer) {
            h.token_regression(lock.job_id(), lock.token());
        }
    }

    /// Runs one of our fenced bookkeeping writes (`record_failure`, `mark_dead`,
    /// `record_release`). If it finds that our claim never became durable (the
    /// transaction that carried it was lost: a commit error other than the
    /// fence's, a panic after `ctx.db()`, a connection PostgreSQL ended), the
    /// claim is applied again on its own and the write runs once more, so every
    /// attempt is counted. A newer owner's fence refuses the re-claim as it
    /// would any write.
    async fn with_claim<T, F, Fut>(&self, owned: &Owned, write: F) -> Result<T, FenceError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, FenceError>>,
    {
        match write().await {
            Err(FenceError::NotClaimed { .. }) => {
                tracing::info!("the transaction that carried the claim was lost; claiming again");
                self.shared.store.claim(owned.job_id, owned.token).await?;
                write().await
            }
            other => other,
        }
    }
}

/// A bookkeeping write of ours (a failure, a dead mark) refused by a newer
/// owner's fence.
fn stale_bookkeeping(e: FenceError) -> Outcome {
    Outcome::Stale {
        at: StaleAt::StepCommit,
        step: None,
        error: e.to_string(),
    }
}

fn info(
    code: DeadCode,
    reason: &str,
    last_token: Option<ObservedFence>,
    takeovers: u32,
    attempts: u32,
) -> DeadLetterInfo {
    DeadLetterInfo {
        reason: format!("{}: {reason}", code.as_str()),
        last_token,
        takeovers,
        attempts,
    }
}

/// Publishes the job's completion notice (best effort: a waiter reads the
/// row at its timeout anyway).
pub(super) async fn notify_finished(sh: &super::Shared, job_id: JobId, status: JobStatus) {
    if let Err(e) = sh.queue.publish_finished(job_id, status.as_str()).await {
        tracing::warn!(error = %e, "publishing the completion notice failed");
    }
}

/// Hands the delivery back for `delay`: a nak, or past half of `MaxDeliver`
/// a renewed message, so waiting never counts towards the broker's backstop.
async fn retry_later(delivery: Delivery, delay: Duration) {
    match delivery.hand_back(delay).await {
        Ok(HandedBack::Nak) => {}
        Ok(HandedBack::Renewed) => tracing::debug!(?delay, "handed back as a renewed message"),
        Err(e) => tracing::warn!(error = %e, "nak failed; the broker redelivers after AckWait"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_codes_are_the_documented_strings() {
        let all = [
            (DeadCode::BadMessage, "bad_message"),
            (DeadCode::NoJobRow, "no_job_row"),
            (DeadCode::UnknownJobType, "unknown_job_type"),
            (DeadCode::Dead, "dead"),
            (DeadCode::MaxTakeovers, "max_takeovers"),
            (DeadCode::PermanentError, "permanent_error"),
            (DeadCode::MaxRetries, "max_retries"),
            (DeadCode::Timeout, "timeout"),
            (DeadCode::DefinitionChanged, "definition_changed"),
        ];
        for (code, text) in all {
            assert_eq!(code.as_str(), text);
        }
    }
}
