//! The lock service: a worker's job-lock acquisitions and releases, batched.
//!
//! One etcd transaction costs about as much as five PostgreSQL commits, so a
//! worker never pays an etcd round trip per job: concurrent acquisitions are
//! gathered into one transaction of nested create-if-absent transactions (one Raft
//! entry), and releases into one transaction of guarded deletes. Batches form
//! naturally: while one is in flight, the next requests queue up. One batch at a
//! time: etcd's cost is per transaction (a Raft entry, fsynced on every member),
//! not per key, so more batches in flight only means smaller ones and more etcd
//! work per job. Within a batch the creates and the deletes share one Txn.
//!
//! Every created lock is re-read linearizably before its token is handed out
//! (the etcd issue 11456 guard). When the next batch is ready as soon as a
//! batch's Txn returns, that re-read rides in the next batch's Txn (a read in a
//! write Txn is ordered after every earlier one); otherwise it is made on its
//! own at once. Under load that saves one etcd request per batch; a lone job
//! waits exactly as long as before.
//!
//! The lock of a job that ended for good (done, dead-lettered) guards nothing any
//! more: a redelivery finds the row terminal at admission and never asks for the
//! lock. Its release is therefore [`ReleaseMode::Deferred`]: it waits up to
//! 100 ms for the next acquisition to ride along with, instead of costing a Txn
//! of its own. Releases of jobs handed back for another attempt go out at once,
//! since the next attempt needs the lock. Deferred releases that are still
//! waiting when the worker stops go with the session lease, which shutdown
//! revokes.
//!
//! A release whose Txn failed is queued and tried again by the same loop, with
//! backoff, alongside new work: an etcd hiccup never holds up the acquisitions
//! behind it. After 5 s it is given up (the lock expires with its lease).
//!
//! When to send, what to fold and what to retry is decided by the pure
//! [`Planner`](super::plan::Planner); this task only does the I/O.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Session;
use super::batch::{Batch, MAX_BATCH, Unverified};
use super::error::LeaseError;
use super::health::Health;
use super::lock::{Acquire, JobLock};
pub(crate) use super::plan::ReleaseMode;
use super::plan::{Decision, Outgoing, Planner, Release};
use crate::JobId;
use crate::config::Tuning;
use crate::telemetry::Metrics;

/// Handle to the lock service task (cloneable; the task stops when `stop` is
/// cancelled or every handle is dropped).
#[derive(Clone)]
pub(crate) struct LockService {
    tx: mpsc::Sender<Request>,
    /// Jobs that will ask for a lock soon (admission running).
    coming: Arc<AtomicUsize>,
}

/// A job on its way to a lock request: counted until it asks (or gives up), so a
/// batch about to leave can wait a moment for it.
pub(crate) struct Coming(Arc<AtomicUsize>);

impl Drop for Coming {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for LockService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockService")
    }
}

/// One acquisition waiting for its batch.
struct AcquireRequest {
    session: Arc<Session>,
    job_id: JobId,
    reply: oneshot::Sender<Result<Acquire, LeaseError>>,
}

/// One lock to delete.
struct ReleaseRequest {
    session: Arc<Session>,
    lock: JobLock,
}

enum Request {
    Acquire(AcquireRequest),
    Release(ReleaseRequest, ReleaseMode),
}

impl LockService {
    /// Starts the service task; it is owned by `tasks` (aborted with it).
    /// `tuning`'s `lock_*` numbers time its batches and retries; at most
    /// `lock_queue` requests wait for it (a bound: senders beyond wait).
    pub(crate) fn start(
        stop: CancellationToken,
        metrics: Metrics,
        tuning: Tuning,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(tuning.lock_queue);
        let coming = Arc::new(AtomicUsize::new(0));
        tasks.spawn(run(rx, stop, coming.clone(), metrics, tuning));
        LockService { tx, coming }
    }

    /// Announces a lock request that is about to come (call when a delivery's
    /// admission starts; pass the guard to [`acquire`](Self::acquire)). A batch
    /// waits up to `Tuning::lock_acquire_linger` (2 ms) for announced requests, so a few jobs arriving together
    /// share one etcd transaction; with nothing announced it leaves at once, and
    /// a lone job pays no wait.
    pub(crate) fn expect_acquire(&self) -> Coming {
        self.coming.fetch_add(1, Ordering::AcqRel);
        Coming(self.coming.clone())
    }

    /// Acquires `job_id`'s lock under `session`, batched with concurrent
    /// callers: a verified [`JobLock`] (re-read linearizably), or the holder.
    ///
    /// # Errors
    /// [`LeaseError::Batch`] with the error of the batch this request rode in
    /// (shared by the whole batch); [`LeaseError::ServiceStopped`] at shutdown.
    pub(crate) async fn acquire(
        &self,
        session: Arc<Session>,
        job_id: JobId,
        announced: Coming,
    ) -> Result<Acquire, LeaseError> {
        let (reply, rx) = oneshot::channel();
        let sent = self
            .tx
            .send(Request::Acquire(AcquireRequest {
                session,
                job_id,
                reply,
            }))
            .await;
        // Queued (or failed): no longer on its way.
        drop(announced);
        sent.map_err(|_| LeaseError::ServiceStopped)?;
        rx.await.map_err(|_| LeaseError::ServiceStopped)?
    }

    /// Releases `lock` (batched, fire and forget: a failed release is retried by
    /// the service for 5 s; a lock that is not released expires with its session
    /// lease). See [`ReleaseMode`] for when it is sent.
    pub(crate) async fn release(&self, session: Arc<Session>, lock: JobLock, mode: ReleaseMode) {
        let request = Request::Release(ReleaseRequest { session, lock }, mode);
        let _ = self.tx.send(request).await;
    }
}

/// A batch whose locks are written but not verified yet, with its callers.
struct PendingCheck {
    session: Arc<Session>,
    unverified: Unverified,
    waiting: Vec<AcquireRequest>,
}

impl PendingCheck {
    async fn verify_alone(self) {
        let results = self.session.verify_pending(self.unverified).await;
        answer(self.waiting, results);
    }
}

type Plan = Planner<AcquireRequest, ReleaseRequest>;

async fn run(
    mut rx: mpsc::Receiver<Request>,
    stop: CancellationToken,
    coming: Arc<AtomicUsize>,
    metrics: Metrics,
    tuning: Tuning,
) {
    let mut plan = Plan::new(tuning);
    // The last batch, awaiting its verification read.
    let mut pending: Option<PendingCheck> = None;
    loop {
        let now = Instant::now();
        for _ in 0..MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => queue(&mut plan, r, now),
                Err(_) => break,
            }
        }
        match plan.decide(Instant::now(), coming.load(Ordering::Acquire) > 0) {
            Decision::Send(out) => {
                pending = execute(out, pending.take(), &mut plan, &metrics).await;
                if pending.is_some() {
                    plan.verification_pending(Instant::now());
                }
            }
            Decision::VerifyAlone => {
                if let Some(p) = pending.take() {
                    p.verify_alone().await;
                }
            }
            Decision::Wait(until) => {
                let sleep = until.map(tokio::time::sleep_until);
                tokio::select! {
                    () = stop.cancelled() => break,
                    r = rx.recv() => match r {
                        Some(r) => queue(&mut plan, r, Instant::now()),
                        None => break,
                    },
                    () = async { if let Some(s) = sleep { s.await } }, if until.is_some() => {}
                }
            }
        }
        if stop.is_cancelled() {
            break;
        }
    }
}

fn queue(plan: &mut Plan, request: Request, now: Instant) {
    match request {
        Request::Acquire(a) => plan.acquire(a, now),
        Request::Release(r, mode) => plan.release(r, mode, now),
    }
}

/// One session's share of a batch.
struct Group {
    session: Arc<Session>,
    acquires: Vec<AcquireRequest>,
    /// The locks to delete, and (in the same order) their releases' history.
    locks: Vec<JobLock>,
    releases: Vec<Release<()>>,
}

impl Group {
    /// The releases back as requests, for a retry.
    fn into_releases(
        session: &Arc<Session>,
        locks: Vec<JobLock>,
        releases: Vec<Release<()>>,
    ) -> Vec<Release<ReleaseRequest>> {
        locks
            .into_iter()
            .zip(releases)
            .map(|(lock, r)| {
                r.map(|()| ReleaseRequest {
                    session: session.clone(),
                    lock,
                })
            })
            .collect()
    }
}

/// Groups a batch by session (normally there is one current session).
fn groups(out: Outgoing<AcquireRequest, ReleaseRequest>) -> Vec<Group> {
    fn group<'a>(groups: &'a mut Vec<Group>, session: &Arc<Session>) -> &'a mut Group {
        let idx = match groups.iter().position(|g| Arc::ptr_eq(&g.session, session)) {
            Some(i) => i,
            None => {
                groups.push(Group {
                    session: session.clone(),
                    acquires: Vec::new(),
                    locks: Vec::new(),
                    releases: Vec::new(),
                });
                groups.len() - 1
            }
        };
        &mut groups[idx]
    }
    let mut groups: Vec<Group> = Vec::new();
    for a in out.acquires {
        let session = a.session.clone();
        group(&mut groups, &session).acquires.push(a);
    }
    for r in out.releases {
        let (req, release) = r.split();
        let g = group(&mut groups, &req.session);
        g.locks.push(req.lock);
        g.releases.push(release);
    }
    groups
}

/// Runs one batch: per session, one etcd Txn of creates, guarded deletes and
/// the verification reads of `pending` (see `Session::acquire_folding`).
/// Failed releases go back to `plan` for a retry. Returns the batch left
/// awaiting its own check, if any.
async fn execute(
    out: Outgoing<AcquireRequest, ReleaseRequest>,
    mut pending: Option<PendingCheck>,
    plan: &mut Plan,
    metrics: &Metrics,
) -> Option<PendingCheck> {
    if !out.fold
        && let Some(p) = pending.take()
    {
        p.verify_alone().await;
    }
    let mut next: Option<PendingCheck> = None;
    for g in groups(out) {
        let Group {
            session,
            acquires,
            locks,
            releases,
        } = g;
        let previous = match &pending {
            Some(p) if Arc::ptr_eq(&p.session, &session) => pending.take(),
            _ => None,
        };
        tracing::debug!(
            acquires = acquires.len(),
            releases = locks.len(),
            verifies = previous.as_ref().map_or(0, |p| p.unverified.reads()),
            "lock batch"
        );
        if acquires.is_empty() && previous.is_none() {
            if let Err(e) = session.release_slice(&locks).await {
                retry_later(plan, &session, locks, releases, &e);
            }
            continue;
        }
        let (previous, previous_waiting) = match previous {
            Some(p) => (Some(p.unverified), p.waiting),
            None => (None, Vec::new()),
        };
        let ids: Vec<JobId> = acquires.iter().map(|a| a.job_id).collect();
        if !ids.is_empty() {
            metrics.lock_batch(ids.len());
        }
        let (before, now) = session.acquire_folding(&ids, &locks, previous).await;
        if let Some(results) = before {
            answer(previous_waiting, results);
        }
        match now {
            Ok(Batch::Done(results)) => answer(acquires, Ok(results)),
            Ok(Batch::Unverified(unverified)) if unverified.reads() > 0 && next.is_none() => {
                next = Some(PendingCheck {
                    session,
                    unverified,
                    waiting: acquires,
                });
            }
            Ok(Batch::Unverified(unverified)) => {
                // Nothing to read (all contended), or another session's batch
                // already waits: settle it now.
                answer(acquires, session.verify_pending(unverified).await);
            }
            Err(e) => {
                // Guarded deletes are idempotent: they are tried again later.
                retry_later(plan, &session, locks, releases, &e);
                answer(acquires, Err(e));
            }
        }
    }
    // A pending batch whose session had no request in this batch.
    if let Some(p) = pending {
        p.verify_alone().await;
    }
    next
}

/// Queues failed releases for another attempt while their session lives. A lock
/// that is not released stays as long as its session lease: if the session
/// survives the etcd hiccup that failed the release (a leader election, a short
/// quorum loss, slow keepalives: `Degraded` but never `Lost`), the lock would
/// outlive the job attempt that gave it up, and every redelivery of the job
/// would find it held.
fn retry_later(
    plan: &mut Plan,
    session: &Arc<Session>,
    locks: Vec<JobLock>,
    releases: Vec<Release<()>>,
    error: &LeaseError,
) {
    let n = locks.len();
    if session.health() == Health::Lost {
        tracing::warn!(locks = n, error = %error, "releasing job locks failed; they expire with the session lease");
        return;
    }
    let failed = Group::into_releases(session, locks, releases);
    let given_up = plan.release_failed(failed, Instant::now());
    tracing::debug!(locks = n, retrying = plan.retrying(), error = %error, "releasing job locks failed; retrying");
    if !given_up.is_empty() {
        tracing::warn!(
            locks = given_up.len(), error = %error,
            "releasing job locks failed for 5 s; they expire with the session lease"
        );
    }
}

fn answer(waiting: Vec<AcquireRequest>, results: Result<Vec<Acquire>, LeaseError>) {
    match results {
        Ok(results) if results.len() == waiting.len() => {
            for (a, result) in waiting.into_iter().zip(results) {
                let _ = a.reply.send(Ok(result));
            }
        }
        Ok(results) => {
            let e = Arc::new(LeaseError::Unexpected {
                op: "acquire",
                detail: format!(
                    "acquire_many answered {} results for {} keys",
                    results.len(),
                    waiting.len()
                ),
            });
            for a in waiting {
                let _ = a.reply.send(Err(LeaseError::Batch(e.clone())));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for a in waiting {
                let _ = a.reply.send(Err(LeaseError::Batch(e.clone())));
            }
        }
    }
}
