//! [`JobLock`] and [`Acquire`]: one job's lock, acquired and released on its
//! own, and the guarded delete every release uses.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tracing::Instrument;

use crate::types::{FencingToken, JobId, LeaseId};

use super::Session;
use super::error::LeaseError;

/// The result of an acquisition attempt.
#[derive(Debug)]
pub enum Acquire {
    /// The lock is ours; its token is the job's new fencing token.
    Acquired(JobLock),
    /// Another session holds the job (or this one does: acquisition is not
    /// re-entrant). Not an error: `nak` the message and retry after
    /// `Config::contention_backoff`.
    Contended {
        /// The lease the key carries (`None` if the key has no lease).
        holder: Option<LeaseId>,
    },
}

impl Acquire {
    /// The lock, if acquired.
    pub fn into_lock(self) -> Option<JobLock> {
        match self {
            Acquire::Acquired(l) => Some(l),
            Acquire::Contended { .. } => None,
        }
    }

    /// Whether the lock was acquired.
    pub fn is_acquired(&self) -> bool {
        matches!(self, Acquire::Acquired(_))
    }
}

/// A held job lock: the key `<namespace>/jobs/<job_id>` under a session's lease.
///
/// It lives as long as the session's lease; dropping it does not delete the key
/// (use [`JobLock::release`] or [`Session::release_many`]).
///
/// # Fencing
/// [`JobLock::token`] is the key's `create_revision`. Holding the lock does not
/// make writes safe by itself: a paused holder may have lost it long ago. Every
/// write must be checked against the token at the resource.
#[derive(Debug)]
pub struct JobLock {
    pub(super) job_id: JobId,
    pub(super) key: String,
    pub(super) token: FencingToken,
    pub(super) lease: LeaseId,
}

impl JobLock {
    /// The fencing token: the lock key's `create_revision`.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The job.
    pub fn job_id(&self) -> JobId {
        self.job_id
    }

    /// The etcd key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease the key was created under.
    pub fn lease_id(&self) -> LeaseId {
        self.lease
    }

    /// Deletes the key only if its `create_revision` still equals our token.
    /// Returns `Ok(false)` when the key is gone or belongs to a newer owner (then
    /// nothing is deleted).
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`]; the key then stays until
    /// the lease ends.
    pub async fn release(self, session: &Session) -> Result<bool, LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.release",
            job_id = %self.job_id, token = %self.token, lease_id = %self.lease,
            worker = %session.worker_id, deleted = tracing::field::Empty,
        );
        async move {
            let resp = session.txn("release", guarded_delete_txn(&self)).await?;
            let deleted = resp.succeeded();
            tracing::Span::current().record("deleted", deleted);
            if !deleted {
                tracing::warn!(key = %self.key, "release: the key is not ours any more; nothing deleted");
            }
            Ok(deleted)
        }
        .instrument(span)
        .await
    }
}

impl Session {
    /// Deletes job `job_id`'s lock if it carries this session's own lease: a lock
    /// this worker stranded itself (a create whose answer was lost, a release that
    /// gave up), which acquisition would otherwise find held by its own lease until
    /// that lease ends. Returns whether a key was deleted; a key of another lease
    /// is never touched.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`].
    pub async fn release_stranded(&self, job_id: JobId) -> Result<bool, LeaseError> {
        let deleted = self
            .delete_if_ours("release_stranded", self.lock_key(job_id))
            .await?;
        if deleted {
            tracing::warn!(%job_id, "deleted a job lock stranded under this session's own lease");
        }
        Ok(deleted)
    }

    /// The lease holding job `job_id`'s lock, if anyone does (a linearizable
    /// read; a key lives only as long as its lease, so a holder is alive).
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`].
    pub async fn lock_holder(&self, job_id: JobId) -> Result<Option<LeaseId>, LeaseError> {
        self.holder_of("lock_holder", self.lock_key(job_id)).await
    }

    /// Deletes `key` only while it carries this session's lease; whether it did.
    pub(super) async fn delete_if_ours(
        &self,
        op: &'static str,
        key: String,
    ) -> Result<bool, LeaseError> {
        let txn = Txn::new()
            .when([Compare::lease(
                key.as_str(),
                CompareOp::Equal,
                self.lease.get(),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        Ok(self.txn(op, txn).await?.succeeded())
    }

    /// The lease a key lives under, if the key exists (one linearizable read).
    pub(super) async fn holder_of(
        &self,
        op: &'static str,
        key: String,
    ) -> Result<Option<LeaseId>, LeaseError> {
        let txn = Txn::new().and_then([TxnOp::get(key.as_str(), None)]);
        let resp = self.txn(op, txn).await?;
        let holder = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| LeaseId::new(kv.lease())),
            _ => None,
        });
        Ok(holder)
    }

    /// Creates the lock of `job_id` under this session's lease if nobody holds it
    /// (a Txn on `create_revision == 0`), then re-reads it linearizably and checks
    /// it carries our lease and the created revision.
    ///
    /// # Fencing
    /// On success, [`JobLock::token`] is the key's `create_revision`: larger than
    /// every token any earlier owner of this job held. Claim it at the resource
    /// before doing any work.
    ///
    /// # Errors
    /// [`LeaseError::SessionLost`] on a lost session; [`LeaseError::Etcd`] /
    /// [`LeaseError::Timeout`] (bounded by `etcd_request_timeout` per request; a
    /// create whose outcome is unknown is undone best-effort);
    /// [`LeaseError::LockLostBeforeVerify`] if the re-read does not show our key.
    pub async fn acquire(&self, job_id: JobId) -> Result<Acquire, LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.acquire",
            job_id = %job_id, lease_id = %self.lease, worker = %self.worker_id,
            token = tracing::field::Empty, outcome = tracing::field::Empty,
        );
        async move {
            let mut out = self.acquire_batch(&[job_id], &[]).await?;
            match out.pop() {
                Some(a) => Ok(a),
                None => Err(LeaseError::Unexpected {
                    op: "acquire",
                    detail: "no result for the job".into(),
                }),
            }
        }
        .instrument(span)
        .await
    }
}

/// A Txn deleting `l`'s key only while its `create_revision` is `l`'s token.
fn guarded_delete_txn(l: &JobLock) -> Txn {
    Txn::new()
        .when([Compare::create_revision(
            l.key.as_str(),
            CompareOp::Equal,
            l.token.get(),
        )])
        .and_then([TxnOp::delete(l.key.as_str(), None)])
}

/// [`guarded_delete_txn`] nested in a batch Txn.
pub(super) fn guarded_delete(l: &JobLock) -> TxnOp {
    TxnOp::txn(guarded_delete_txn(l))
}

/// Counts the guarded deletes of `locks` that deleted their key (answers in the
/// same order) and warns for each that found the key no longer ours.
pub(super) fn count_released(locks: &[JobLock], answers: Vec<TxnOpResponse>) -> usize {
    let mut deleted = 0;
    for (l, r) in locks.iter().zip(answers) {
        match r {
            TxnOpResponse::Txn(t) if t.succeeded() => deleted += 1,
            _ => tracing::warn!(
                job_id = %l.job_id, token = %l.token,
                "release: the key is not ours any more; nothing deleted"
            ),
        }
    }
    deleted
}
