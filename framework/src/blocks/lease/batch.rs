//! Many job locks in one etcd Txn: [`Session::acquire_many`],
//! [`Session::acquire_and_release_many`], [`Session::release_many`], and the
//! runtime's folding of one batch's verification into the next batch's Txn
//! ([`Session::acquire_folding`], [`Unverified`], [`Batch`]). A lone
//! [`Session::acquire`] is a batch of one.

use etcd_client::{
    Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tracing::Instrument;

use crate::types::{FencingToken, JobId, LeaseId};

use super::Session;
use super::error::LeaseError;
use super::health::Health;
use super::lock::{Acquire, JobLock, count_released, guarded_delete};

/// Locks one batch Txn created whose linearizable re-read is still to come
/// (runtime batching: it rides in the next batch's Txn, see
/// `Session::acquire_folding`). Holding one proves nothing: no token is handed
/// out before the check.
#[derive(Debug)]
pub(super) struct Unverified {
    entries: Vec<(JobId, String, String)>,
    revision: i64,
    /// Per job: `Some(holder)` if contended, `None` if created.
    outcomes: Vec<Option<Option<LeaseId>>>,
}

impl Unverified {
    /// How many keys the check reads (the created ones).
    pub(super) fn reads(&self) -> usize {
        self.outcomes.iter().filter(|o| o.is_none()).count()
    }

    fn read_ops(&self) -> Vec<TxnOp> {
        self.entries
            .iter()
            .zip(&self.outcomes)
            .filter(|(_, o)| o.is_none())
            .map(|((_, key, _), _)| TxnOp::get(key.as_str(), None))
            .collect()
    }
}

/// A batch's outcome in [`Session::acquire_folding`].
#[derive(Debug)]
pub(super) enum Batch {
    /// Verified: per job, in request order.
    Done(Vec<Acquire>),
    /// Written, not verified yet.
    Unverified(Unverified),
}

/// At most this many jobs go into one etcd transaction (etcd's default
/// `--max-txn-ops` is 128, and etcd 3.4 refuses 128 nested txns but accepts
/// 127); larger batches are split.
pub const MAX_BATCH: usize = 100;

impl Session {
    /// Acquires many jobs at once: ONE etcd Txn whose success branch holds one
    /// nested create-if-absent Txn per job (so the batch costs one Raft entry),
    /// then ONE linearizable read-only Txn re-reading every created key. Results
    /// are in the order of `job_ids`. Every lock created by one Txn has the same
    /// token (the Txn's revision), larger than any earlier token of those jobs.
    /// Batches larger than [`MAX_BATCH`] are split into several Txns.
    ///
    /// # Fencing
    /// As [`Session::acquire`], per job.
    ///
    /// # Errors
    /// As [`Session::acquire`]; [`LeaseError::DuplicateJob`] if a job appears
    /// twice. On an error no lock of the failed chunk is held (created keys are
    /// deleted best-effort); locks of earlier chunks are released best-effort.
    pub async fn acquire_many(&self, job_ids: &[JobId]) -> Result<Vec<Acquire>, LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.acquire_many",
            jobs = job_ids.len(), lease_id = %self.lease, worker = %self.worker_id,
            acquired = tracing::field::Empty, contended = tracing::field::Empty,
        );
        async move {
            let mut seen = std::collections::HashSet::with_capacity(job_ids.len());
            for j in job_ids {
                if !seen.insert(*j) {
                    return Err(LeaseError::DuplicateJob(*j));
                }
            }
            let mut all = Vec::with_capacity(job_ids.len());
            for chunk in job_ids.chunks(MAX_BATCH) {
                match self.acquire_batch(chunk, &[]).await {
                    Ok(part) => all.extend(part),
                    Err(e) => {
                        let held: Vec<JobLock> =
                            all.into_iter().filter_map(Acquire::into_lock).collect();
                        if !held.is_empty() {
                            let _ = self.release_many(held).await;
                        }
                        return Err(e);
                    }
                }
            }
            let acquired = all.iter().filter(|a| a.is_acquired()).count();
            let span = tracing::Span::current();
            span.record("acquired", acquired);
            span.record("contended", all.len() - acquired);
            Ok(all)
        }
        .instrument(span)
        .await
    }

    /// Acquires `job_ids` (as [`Session::acquire_many`]) and releases `locks` (as
    /// [`Session::release_many`]) in ONE etcd Txn: one Raft entry for the
    /// creates and the guarded deletes together, then the one verification read
    /// of the created keys. When the two sets overlap or exceed [`MAX_BATCH`]
    /// together, they are sent as two Txns instead. Releases are best-effort as
    /// in [`Session::release_many`] (a failed Txn leaves them to the lease).
    ///
    /// # Fencing
    /// As [`Session::acquire`], per job; a release deletes a key only while its
    /// `create_revision` equals the lock's token.
    ///
    /// # Errors
    /// As [`Session::acquire_many`].
    pub(crate) async fn acquire_and_release_many(
        &self,
        job_ids: &[JobId],
        locks: &[JobLock],
    ) -> Result<Vec<Acquire>, LeaseError> {
        if locks.is_empty() {
            return self.acquire_many(job_ids).await;
        }
        if job_ids.is_empty() {
            self.release_slice(locks).await?;
            return Ok(Vec::new());
        }
        if !fits_one_txn(job_ids, locks, 0) {
            let (acquired, released) =
                tokio::join!(self.acquire_many(job_ids), self.release_slice(locks));
            if let Err(e) = released {
                tracing::warn!(error = %e, "releasing job locks failed; they expire with the session lease");
            }
            return acquired;
        }
        let span = tracing::info_span!(
            "tenure.lease.acquire_and_release_many",
            jobs = job_ids.len(), locks = locks.len(), lease_id = %self.lease,
            worker = %self.worker_id,
        );
        self.acquire_batch(job_ids, locks).instrument(span).await
    }

    /// One Txn of creates (plain for one job, nested for several) and guarded
    /// deletes of `releases`, then one verification read of the created keys.
    pub(super) async fn acquire_batch(
        &self,
        job_ids: &[JobId],
        releases: &[JobLock],
    ) -> Result<Vec<Acquire>, LeaseError> {
        let (created, _) = self.write_batch(job_ids, releases, None).await?;
        let answers = self.verify_alone(&created).await;
        self.finish(created, answers).await
    }

    /// Acquires `job_ids` and releases `releases` in ONE Txn that also carries
    /// the verification reads of `previous` (the locks the previous batch
    /// created): one Raft entry serves this batch's creates and deletes and the
    /// previous batch's re-read. A read inside a write Txn is ordered after every
    /// earlier Txn, so it sees what a linearizable read issued after the previous
    /// batch's Txn would: the same check as [`Session::acquire`] makes.
    ///
    /// Returns the previous batch's results (if there was one) and this batch,
    /// written but [`Batch::Unverified`]: its check is left to the next call or
    /// to [`Session::verify_pending`], whichever the caller makes first. Batches
    /// that cannot share one Txn (overlap, duplicates, more than [`MAX_BATCH`]
    /// operations) verify `previous` alone first and are then acquired and
    /// verified alone ([`Batch::Done`]).
    pub(super) async fn acquire_folding(
        &self,
        job_ids: &[JobId],
        releases: &[JobLock],
        previous: Option<Unverified>,
    ) -> (
        Option<Result<Vec<Acquire>, LeaseError>>,
        Result<Batch, LeaseError>,
    ) {
        let reads = previous.as_ref().map_or(0, Unverified::reads);
        if !fits_one_txn(job_ids, releases, reads) || (job_ids.is_empty() && releases.is_empty()) {
            let before = match previous {
                Some(p) => Some(self.verify_pending(p).await),
                None => None,
            };
            let now = self.acquire_and_release_many(job_ids, releases).await;
            return (before, now.map(Batch::Done));
        }
        let Some(previous) = previous else {
            let written = self.write_batch(job_ids, releases, None).await;
            return (None, written.map(|(created, _)| Batch::Unverified(created)));
        };
        let span = tracing::info_span!(
            "tenure.lease.acquire_folding",
            jobs = job_ids.len(), locks = releases.len(), verifies = previous.reads(),
            lease_id = %self.lease, worker = %self.worker_id,
        );
        let written = self
            .write_batch(job_ids, releases, Some(&previous))
            .instrument(span)
            .await;
        match written {
            Ok((created, answers)) => {
                let answers = answers.ok_or_else(|| LeaseError::Unexpected {
                    op: "acquire",
                    detail: "no verification answers in the batch".into(),
                });
                let before = self.finish(previous, answers).await;
                (Some(before), Ok(Batch::Unverified(created)))
            }
            Err(e) => {
                // This batch's creates were undone; the previous batch's check
                // did not happen: make it on its own.
                let before = self.verify_pending(previous).await;
                (Some(before), Err(e))
            }
        }
    }

    /// Verifies a batch whose check was left pending ([`Batch::Unverified`]) with
    /// its own linearizable read.
    ///
    /// # Errors
    /// As [`Session::acquire_many`].
    pub(super) async fn verify_pending(
        &self,
        pending: Unverified,
    ) -> Result<Vec<Acquire>, LeaseError> {
        let answers = self.verify_alone(&pending).await;
        self.finish(pending, answers).await
    }

    /// The batch Txn: creates of `job_ids` (a plain create-if-absent Txn for a
    /// lone job, nested ones otherwise), guarded deletes of `releases`, and the
    /// reads that verify `verify`'s created keys. Returns this batch's created
    /// (not yet verified) locks and the answers of the reads. On an error, what
    /// this very Txn may have created is undone best-effort.
    async fn write_batch(
        &self,
        job_ids: &[JobId],
        releases: &[JobLock],
        verify: Option<&Unverified>,
    ) -> Result<(Unverified, Option<Vec<TxnOpResponse>>), LeaseError> {
        self.ensure_not_lost()?;
        let nonce: u64 = rand::random();
        let entries: Vec<(JobId, String, String)> = job_ids
            .iter()
            .map(|j| (*j, self.lock_key(*j), self.lock_value(*j, nonce)))
            .collect();
        let reads = verify.map(Unverified::read_ops).unwrap_or_default();
        let n_reads = reads.len();
        let single = entries.len() == 1 && releases.is_empty() && reads.is_empty();
        let txn = batch_txn(self.lease.get(), &entries, releases, reads, single);
        let resp = match self.txn("acquire", txn).await {
            Ok(r) => r,
            Err(e) => {
                // The outcome is unknown: delete whatever this very attempt created.
                self.undo(&entries).await;
                return Err(e);
            }
        };
        let revision = header_revision(&resp, "acquire")?;

        // Per job: Some(holder) if contended, None if created.
        let (outcomes, answers) = if single {
            (vec![contended_holder(&resp)], None)
        } else {
            let (outcomes, answers) = self
                .nested_outcomes(&resp, &entries, releases, n_reads)
                .await?;
            (outcomes, verify.map(|_| answers))
        };
        Ok((
            Unverified {
                entries,
                revision,
                outcomes,
            },
            answers,
        ))
    }

    /// Splits the answers of a nested batch Txn (made by [`batch_txn`]):
    /// per job `Some(holder)` if contended, `None` if created; the releases are
    /// counted; returns the outcomes and the answers of the `n_reads` reads. An
    /// answer of the wrong shape undoes the batch's creates.
    async fn nested_outcomes(
        &self,
        resp: &TxnResponse,
        entries: &[(JobId, String, String)],
        releases: &[JobLock],
        n_reads: usize,
    ) -> Result<(Vec<Option<Option<LeaseId>>>, Vec<TxnOpResponse>), LeaseError> {
        let mut nested = resp.op_responses();
        if nested.len() != entries.len() + releases.len() + n_reads {
            self.undo(entries).await;
            return Err(LeaseError::Unexpected {
                op: "acquire",
                detail: format!(
                    "{} answers for {} jobs, {} releases and {} reads",
                    nested.len(),
                    entries.len(),
                    releases.len(),
                    n_reads
                ),
            });
        }
        let answers = nested.split_off(entries.len() + releases.len());
        count_released(releases, nested.split_off(entries.len()));
        let mut v = Vec::with_capacity(nested.len());
        for r in nested {
            match r {
                TxnOpResponse::Txn(inner) => v.push(contended_holder(&inner)),
                other => {
                    self.undo(entries).await;
                    return Err(LeaseError::Unexpected {
                        op: "acquire",
                        detail: format!("expected a nested txn answer, got {other:?}"),
                    });
                }
            }
        }
        Ok((v, answers))
    }

    /// The linearizable re-read of a batch's created keys, on its own (a
    /// read-only Txn is served through the leader's read index, like a default
    /// range read). No created key: no request.
    async fn verify_alone(&self, pending: &Unverified) -> Result<Vec<TxnOpResponse>, LeaseError> {
        let reads = pending.read_ops();
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let check = self.txn("verify", Txn::new().and_then(reads)).await?;
        Ok(check.op_responses())
    }
    /// Checks the re-read of every key `pending` created (it must still carry
    /// this session's lease and the batch's revision) and turns the batch into
    /// results. On any failure every key of the batch is undone and the batch
    /// fails: [`LeaseError::LockLostBeforeVerify`] (etcd issue 11456 guard), the
    /// read's error, or [`LeaseError::SessionLost`].
    async fn finish(
        &self,
        pending: Unverified,
        answers: Result<Vec<TxnOpResponse>, LeaseError>,
    ) -> Result<Vec<Acquire>, LeaseError> {
        let single = pending.entries.len() == 1;
        let tokens = self.check_created(&pending, answers).await?;
        let Unverified {
            entries, outcomes, ..
        } = pending;
        self.results(entries, outcomes, tokens, single)
    }

    /// Per job of `pending`, the verified token of a key it created (`None` for
    /// a contended job). A read that failed, a key not ours, or a session lost
    /// meanwhile undoes the batch and fails it (see `finish`).
    async fn check_created(
        &self,
        pending: &Unverified,
        answers: Result<Vec<TxnOpResponse>, LeaseError>,
    ) -> Result<Vec<Option<FencingToken>>, LeaseError> {
        let Unverified {
            entries,
            revision,
            outcomes,
        } = pending;
        let created: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.is_none().then_some(i))
            .collect();
        let mut tokens: Vec<Option<FencingToken>> = vec![None; entries.len()];
        if created.is_empty() {
            return Ok(tokens);
        }
        let answers = match answers {
            Ok(a) => a,
            Err(e) => {
                self.undo(entries).await;
                return Err(e);
            }
        };
        for (n, &i) in created.iter().enumerate() {
            let (job_id, key, _) = &entries[i];
            let kv = match answers.get(n) {
                Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
                _ => None,
            };
            match verified_token(kv.as_ref(), self.lease.get(), *revision) {
                Some(t) => tokens[i] = Some(t),
                None => {
                    let err = not_ours(*job_id, key, *revision, kv.as_ref());
                    self.undo(entries).await;
                    return Err(err);
                }
            }
        }
        if self.health() == Health::Lost {
            self.undo(entries).await;
            return Err(LeaseError::SessionLost {
                lease_id: self.lease,
                reason: self.lost_reason(),
            });
        }
        Ok(tokens)
    }

    /// The batch's results, in request order: a lock per created job (with its
    /// verified token), the holder per contended one.
    fn results(
        &self,
        entries: Vec<(JobId, String, String)>,
        outcomes: Vec<Option<Option<LeaseId>>>,
        tokens: Vec<Option<FencingToken>>,
        single: bool,
    ) -> Result<Vec<Acquire>, LeaseError> {
        let span = tracing::Span::current();
        let mut out = Vec::with_capacity(entries.len());
        for ((job_id, key, _), (outcome, token)) in
            entries.into_iter().zip(outcomes.into_iter().zip(tokens))
        {
            match (outcome, token) {
                (None, Some(token)) => {
                    if single {
                        span.record("token", token.get());
                        span.record("outcome", "acquired");
                    }
                    tracing::debug!(job_id = %job_id, token = %token, "job lock acquired");
                    out.push(Acquire::Acquired(JobLock {
                        job_id,
                        key,
                        token,
                        lease: self.lease,
                    }));
                }
                (Some(holder), _) => {
                    if single {
                        span.record("outcome", "contended");
                    }
                    tracing::debug!(
                        job_id = %job_id, holder = ?holder.map(|l| l.to_string()),
                        "job lock contended"
                    );
                    out.push(Acquire::Contended { holder });
                }
                (None, None) => {
                    return Err(LeaseError::Unexpected {
                        op: "acquire",
                        detail: format!("created {job_id} without a verified token"),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Best-effort deletion of the keys one acquisition attempt may have created:
    /// only keys still carrying exactly this attempt's value (its nonce) and lease.
    async fn undo(&self, entries: &[(JobId, String, String)]) {
        let lease = self.lease.get();
        let guarded = |key: &str, value: &str| {
            Txn::new()
                .when([
                    Compare::value(key, CompareOp::Equal, value),
                    Compare::lease(key, CompareOp::Equal, lease),
                ])
                .and_then([TxnOp::delete(key, None)])
        };
        let txn = Txn::new().and_then(
            entries
                .iter()
                .map(|(_, k, v)| TxnOp::txn(guarded(k, v)))
                .collect::<Vec<_>>(),
        );
        match self.txn("undo", txn).await {
            Ok(_) => tracing::debug!(jobs = entries.len(), "undid an acquisition attempt"),
            Err(e) => {
                tracing::warn!(error = %e, "could not undo an acquisition attempt; keys go with the lease")
            }
        }
    }

    /// Releases many locks in ONE Txn of nested guarded deletes (each deletes its
    /// key only if the `create_revision` still equals the lock's token). Locks
    /// that are not ours any more are left alone. Batches larger than
    /// [`MAX_BATCH`] are split.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`]; keys not deleted stay
    /// until the lease ends.
    pub async fn release_many(&self, locks: Vec<JobLock>) -> Result<(), LeaseError> {
        self.release_slice(&locks).await
    }

    /// [`release_many`](Self::release_many) on borrowed locks, so that a caller can
    /// retry after an error (the deletes are guarded by the token: idempotent).
    pub(super) async fn release_slice(&self, locks: &[JobLock]) -> Result<(), LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.release_many",
            locks = locks.len(), lease_id = %self.lease, worker = %self.worker_id,
            deleted = tracing::field::Empty,
        );
        async move {
            let mut deleted = 0usize;
            for chunk in locks.chunks(MAX_BATCH) {
                let ops: Vec<TxnOp> = chunk.iter().map(guarded_delete).collect();
                let resp = self.txn("release", Txn::new().and_then(ops)).await?;
                deleted += count_released(chunk, resp.op_responses());
            }
            tracing::Span::current().record("deleted", deleted);
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// The batch Txn of `Session::write_batch`: a plain create-if-absent Txn for
/// a lone job (`single`), otherwise one Txn of nested creates, then the guarded
/// deletes of `releases`, then `reads`.
fn batch_txn(
    lease: i64,
    entries: &[(JobId, String, String)],
    releases: &[JobLock],
    reads: Vec<TxnOp>,
    single: bool,
) -> Txn {
    let create = |key: &str, value: &str| {
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)])
    };
    match entries {
        [(_, key, value)] if single => create(key, value),
        many => Txn::new().and_then(
            many.iter()
                .map(|(_, key, value)| TxnOp::txn(create(key, value)))
                .chain(releases.iter().map(guarded_delete))
                .chain(reads)
                .collect::<Vec<_>>(),
        ),
    }
}

/// The token of a created key whose re-read `kv` still carries `lease` and the
/// batch's `revision`; `None` otherwise.
fn verified_token(kv: Option<&KeyValue>, lease: i64, revision: i64) -> Option<FencingToken> {
    let ok = kv.is_some_and(|kv| kv.lease() == lease && kv.create_revision() == revision);
    if ok {
        FencingToken::from_revision(revision)
    } else {
        None
    }
}

/// [`LeaseError::LockLostBeforeVerify`] for a created key whose re-read showed
/// `kv` (logged as the etcd issue 11456 guard firing).
fn not_ours(job_id: JobId, key: &str, revision: i64, kv: Option<&KeyValue>) -> LeaseError {
    tracing::error!(
        job_id = %job_id, key = %key, expected_revision = revision,
        found_lease = ?kv.map(|kv| kv.lease()),
        found_revision = ?kv.map(|kv| kv.create_revision()),
        "lock not ours on the linearizable re-read (etcd issue 11456 guard)"
    );
    LeaseError::LockLostBeforeVerify {
        job_id,
        key: key.to_string(),
        found: kv
            .map(|kv| LeaseId::new(kv.lease()))
            .filter(|l| l.get() != 0),
        found_revision: kv.map(|kv| kv.create_revision()),
    }
}

/// Whether creating `job_ids`, deleting `locks` and `reads` re-reads can share
/// one Txn: no job twice, no job both created and deleted, at most
/// [`MAX_BATCH`] operations.
fn fits_one_txn(job_ids: &[JobId], locks: &[JobLock], reads: usize) -> bool {
    let overlap = locks.iter().any(|l| job_ids.contains(&l.job_id));
    let mut seen = std::collections::HashSet::with_capacity(job_ids.len());
    let duplicate = job_ids.iter().any(|j| !seen.insert(*j));
    !overlap && !duplicate && job_ids.len() + locks.len() + reads <= MAX_BATCH
}

/// `None` if the (single-job) create succeeded; `Some(holder)` otherwise.
fn contended_holder(resp: &TxnResponse) -> Option<Option<LeaseId>> {
    if resp.succeeded() {
        return None;
    }
    let holder = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
        _ => None,
    });
    Some(holder.filter(|l| *l != 0).map(LeaseId::new))
}

fn header_revision(resp: &TxnResponse, op: &'static str) -> Result<i64, LeaseError> {
    resp.header()
        .map(|h| h.revision())
        .filter(|r| *r > 0)
        .ok_or_else(|| LeaseError::Unexpected {
            op,
            detail: "no header revision".into(),
        })
}
