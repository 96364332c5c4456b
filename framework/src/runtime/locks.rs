//! Batching of job-lock acquisitions and releases.
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
//! lock. Its release is therefore *deferred*: it waits up to [`RELEASE_LINGER`]
//! for the next acquisition to ride along with, instead of costing a Txn of its
//! own. Releases of jobs handed back for another attempt go out at once, since
//! the next attempt needs the lock. Deferred releases that are still waiting when
//! the worker stops go with the session lease, which shutdown revokes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::JobId;
use crate::lease::{Acquire, Batch, Health, JobLock, LeaseError, Session, Unverified};
use crate::telemetry::Metrics;

const MAX_BATCH: usize = 128;
/// How long a deferred release waits for an acquisition to ride along with.
const RELEASE_LINGER: std::time::Duration = std::time::Duration::from_millis(100);
/// Deferred releases that are sent on their own without waiting any longer.
const DEFERRED_FLUSH: usize = 64;
/// How long a batch waits for acquisitions that are on their way (jobs between
/// delivery and their lock request, see [`LockBatcher::expect_acquire`]).
const ACQUIRE_LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// When a release goes to etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseMode {
    /// The job ended for good: ride along with the next acquisition (at most
    /// [`RELEASE_LINGER`] later).
    Deferred,
    /// The job is handed back for another attempt: in the next batch.
    Prompt,
}

enum Request {
    Acquire {
        session: Arc<Session>,
        job_id: JobId,
        reply: oneshot::Sender<Result<Acquire, String>>,
    },
    Release {
        session: Arc<Session>,
        lock: JobLock,
        mode: ReleaseMode,
    },
}

impl Request {
    fn is_deferred_release(&self) -> bool {
        matches!(
            self,
            Request::Release {
                mode: ReleaseMode::Deferred,
                ..
            }
        )
    }
}

/// Handle to the batching task (cloneable; the task stops when `stop` is
/// cancelled or every handle is dropped).
#[derive(Clone)]
pub(crate) struct LockBatcher {
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

impl std::fmt::Debug for LockBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LockBatcher")
    }
}

impl LockBatcher {
    /// Starts the batching task; it is owned by `tasks` (aborted with it).
    pub(crate) fn start(
        stop: CancellationToken,
        metrics: Metrics,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(4096);
        let coming = Arc::new(AtomicUsize::new(0));
        tasks.spawn(run(rx, stop, coming.clone(), metrics));
        LockBatcher { tx, coming }
    }

    /// Announces a lock request that is about to come (call when a delivery's
    /// admission starts; pass the guard to [`acquire`](Self::acquire)). A batch
    /// waits up to [`ACQUIRE_LINGER`] for announced requests, so a few jobs
    /// arriving together share one etcd transaction; with nothing announced it
    /// leaves at once, and a lone job pays no wait.
    pub(crate) fn expect_acquire(&self) -> Coming {
        self.coming.fetch_add(1, Ordering::AcqRel);
        Coming(self.coming.clone())
    }

    /// Acquires `job_id`'s lock under `session`, batched with concurrent callers.
    ///
    /// # Errors
    /// The etcd error as text (shared by the whole batch), or a stopped batcher.
    pub(crate) async fn acquire(
        &self,
        session: Arc<Session>,
        job_id: JobId,
        announced: Coming,
    ) -> Result<Acquire, String> {
        let (reply, rx) = oneshot::channel();
        let sent = self
            .tx
            .send(Request::Acquire {
                session,
                job_id,
                reply,
            })
            .await;
        // Queued (or failed): no longer on its way.
        drop(announced);
        sent.map_err(|_| "lock batcher stopped".to_string())?;
        rx.await
            .map_err(|_| "lock batcher dropped the request".to_string())?
    }

    /// Releases `lock` (batched, fire and forget: a lock that is not released
    /// expires with its session lease). See [`ReleaseMode`] for when it is sent.
    pub(crate) async fn release(&self, session: Arc<Session>, lock: JobLock, mode: ReleaseMode) {
        let _ = self
            .tx
            .send(Request::Release {
                session,
                lock,
                mode,
            })
            .await;
    }
}

/// A batch whose locks are written but not verified yet, with its callers.
type Pending = (Arc<Session>, Unverified, Vec<(JobId, AcquireReply)>);

async fn run(
    mut rx: mpsc::Receiver<Request>,
    stop: CancellationToken,
    coming: Arc<AtomicUsize>,
    metrics: Metrics,
) {
    // Deferred releases waiting for an acquisition, and until when they wait.
    let mut deferred: Vec<Request> = Vec::new();
    let mut flush_at = tokio::time::Instant::now();
    // The last batch, awaiting its verification read: it rides in the next
    // batch's Txn if one is ready now, else it is made on its own at once.
    let mut pending: Option<Pending> = None;
    loop {
        let first = if pending.is_some() {
            // Deferred releases alone do not make a write Txn worth it: they
            // wait for the next acquisition, and the re-read goes out alone.
            let linger_until = tokio::time::Instant::now() + ACQUIRE_LINGER;
            let mut ready = None;
            while let Some(r) = next_ready(&mut rx, &coming, linger_until).await {
                if r.is_deferred_release() {
                    defer(&mut deferred, &mut flush_at, r);
                } else {
                    ready = Some(r);
                    break;
                }
            }
            match ready {
                Some(r) => Some(r),
                None => {
                    if let Some((session, unverified, replies)) = pending.take() {
                        answer(replies, session.verify_pending(unverified).await);
                    }
                    continue;
                }
            }
        } else {
            tokio::select! {
                () = stop.cancelled() => break,
                r = rx.recv() => match r { Some(r) => Some(r), None => break },
                () = tokio::time::sleep_until(flush_at), if !deferred.is_empty() => None,
            }
        };
        if let Some(r) = first {
            if r.is_deferred_release() {
                defer(&mut deferred, &mut flush_at, r);
                if deferred.len() < DEFERRED_FLUSH {
                    continue;
                }
            } else {
                deferred.push(r);
            }
        }
        // Everything deferred so far rides along (MAX_BATCH bounds only what is
        // added here; an oversized Txn is split by the lease layer).
        let mut batch = std::mem::take(&mut deferred);
        let linger_until = tokio::time::Instant::now() + ACQUIRE_LINGER;
        while batch.len() < MAX_BATCH {
            match next_ready(&mut rx, &coming, linger_until).await {
                Some(r) => batch.push(r),
                None => break,
            }
        }
        pending = execute(batch, pending.take(), &metrics).await;
        if stop.is_cancelled() {
            break;
        }
    }
}

/// Keeps a deferred release for the next acquisition; the first one waiting
/// sets when they go out on their own.
fn defer(deferred: &mut Vec<Request>, flush_at: &mut tokio::time::Instant, r: Request) {
    if deferred.is_empty() {
        *flush_at = tokio::time::Instant::now() + RELEASE_LINGER;
    }
    deferred.push(r);
}

/// A request that is ready now, or, while some are announced, one that arrives
/// before `linger_until`.
async fn next_ready(
    rx: &mut mpsc::Receiver<Request>,
    coming: &AtomicUsize,
    linger_until: tokio::time::Instant,
) -> Option<Request> {
    match rx.try_recv() {
        Ok(r) => Some(r),
        Err(_) if coming.load(Ordering::Acquire) > 0 => {
            tokio::time::timeout_at(linger_until, rx.recv())
                .await
                .ok()
                .flatten()
        }
        Err(_) => None,
    }
}

type AcquireReply = oneshot::Sender<Result<Acquire, String>>;
type Group = (Arc<Session>, Vec<(JobId, AcquireReply)>, Vec<JobLock>);

/// Runs one batch: per session, one etcd Txn of creates, guarded deletes and
/// the verification reads of `pending` (see `Session::acquire_folding`).
/// Returns the batch left awaiting its own check, if any.
async fn execute(
    batch: Vec<Request>,
    mut pending: Option<Pending>,
    metrics: &Metrics,
) -> Option<Pending> {
    // Group by session (normally there is one current session).
    let mut groups: Vec<Group> = Vec::new();
    for req in batch {
        let session = match &req {
            Request::Acquire { session, .. } | Request::Release { session, .. } => session.clone(),
        };
        let idx = match groups.iter().position(|g| Arc::ptr_eq(&g.0, &session)) {
            Some(i) => i,
            None => {
                groups.push((session, Vec::new(), Vec::new()));
                groups.len() - 1
            }
        };
        match req {
            Request::Acquire { job_id, reply, .. } => groups[idx].1.push((job_id, reply)),
            Request::Release { lock, .. } => groups[idx].2.push(lock),
        }
    }
    let mut next: Option<Pending> = None;
    for (session, acquires, releases) in groups {
        let previous = match &pending {
            Some((s, _, _)) if Arc::ptr_eq(s, &session) => pending.take(),
            _ => None,
        };
        tracing::debug!(
            acquires = acquires.len(),
            releases = releases.len(),
            verifies = previous.as_ref().map_or(0, |p| p.1.reads()),
            "lock batch"
        );
        if acquires.is_empty() && previous.is_none() {
            release_all(&session, releases).await;
            continue;
        }
        let (previous, previous_replies) = match previous {
            Some((_, unverified, replies)) => (Some(unverified), replies),
            None => (None, Vec::new()),
        };
        let ids: Vec<JobId> = acquires.iter().map(|(id, _)| *id).collect();
        if !ids.is_empty() {
            metrics.lock_batch(ids.len());
        }
        let (before, now) = session.acquire_folding(&ids, &releases, previous).await;
        if let Some(results) = before {
            answer(previous_replies, results);
        }
        match now {
            Ok(Batch::Done(results)) => answer(acquires, Ok(results)),
            Ok(Batch::Unverified(unverified)) if unverified.reads() > 0 && next.is_none() => {
                next = Some((session, unverified, acquires));
            }
            Ok(Batch::Unverified(unverified)) => {
                // Nothing to read (all contended), or another session's batch
                // already waits: settle it now.
                answer(acquires, session.verify_pending(unverified).await);
            }
            Err(e) => {
                // Guarded deletes are idempotent: retry them on their own.
                release(&session, &releases).await;
                answer(acquires, Err(e));
            }
        }
    }
    // A pending batch whose session had no request in this batch.
    if let Some((session, unverified, replies)) = pending {
        answer(replies, session.verify_pending(unverified).await);
    }
    next
}

fn answer(acquires: Vec<(JobId, AcquireReply)>, results: Result<Vec<Acquire>, LeaseError>) {
    match results {
        Ok(results) if results.len() == acquires.len() => {
            for ((_, reply), result) in acquires.into_iter().zip(results) {
                let _ = reply.send(Ok(result));
            }
        }
        Ok(results) => {
            let msg = format!(
                "acquire_many answered {} results for {} keys",
                results.len(),
                acquires.len()
            );
            for (_, reply) in acquires {
                let _ = reply.send(Err(msg.clone()));
            }
        }
        Err(e) => {
            let msg = lease_error_text(&e);
            for (_, reply) in acquires {
                let _ = reply.send(Err(msg.clone()));
            }
        }
    }
}

async fn release_all(session: &Session, releases: Vec<JobLock>) {
    if !releases.is_empty() {
        release(session, &releases).await;
    }
}

/// Attempts of a failed release while the session lives.
const RELEASE_ATTEMPTS: u32 = 20;
/// Pause between release attempts (each attempt is itself bounded by
/// `Config::etcd_request_timeout`).
const RELEASE_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// Releases `locks`, retrying while the session is not `Lost`. A lock that is not
/// released stays as long as its session lease: if the session survives the
/// etcd hiccup that failed the release (a leader election, a short quorum loss,
/// slow keepalives: `Degraded` but never `Lost`), the lock would outlive the job
/// attempt that gave it up, and every redelivery of the job would find it held.
async fn release(session: &Session, locks: &[JobLock]) {
    let mut attempt = 0;
    loop {
        match session.release_slice(locks).await {
            Ok(()) => return,
            Err(e) if attempt + 1 < RELEASE_ATTEMPTS && session.health() != Health::Lost => {
                attempt += 1;
                tracing::debug!(locks = locks.len(), attempt, error = %e, "releasing job locks failed; retrying");
                tokio::time::sleep(RELEASE_RETRY_DELAY).await;
            }
            Err(e) => {
                tracing::warn!(locks = locks.len(), error = %e, "releasing job locks failed; they expire with the session lease");
                return;
            }
        }
    }
}

fn lease_error_text(e: &LeaseError) -> String {
    e.to_string()
}
