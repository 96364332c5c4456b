//! Partition mode (`Config::partitions`): which partitions this worker owns
//! ([`Ownership`], read by the fetcher and the job actors) and the task that
//! keeps that share fair ([`rebalance`]).
//!
//! Per job type, the live members that registered it share its partitions:
//! member `i` of `n` (by lease id) aims for `P / n` partitions, one more if
//! `i < P % n` ([`fair_share`]). A worker below its share campaigns for free
//! partitions (etcd key, then the partition's fence in PostgreSQL); above it,
//! it hands the extra ones over: it stops fetching them, lets their running
//! jobs stop at their next step boundary (released, so the next owner counts no
//! takeover), then deletes the key. A crashed worker's keys go with its lease.
//! Every change under `<ns>/own/` wakes every worker's rebalance at once (an
//! etcd watch), so a free partition is taken a round trip after it is freed.
//!
//! What holds besides:
//!
//! * **A worker that cannot work gives its partitions back.** One that fails
//!   to reach PostgreSQL or NATS for `Config::stand_down_after` (one TTL by
//!   default; `standing.rs` decides, from the runtime's failures and its own
//!   probes) stands down: it deletes its member key, so the others' fair
//!   shares cover every partition, and aims for no partition (each handed
//!   over as above). Once a probe reaches both servers it joins again and
//!   takes its share.
//! * **No partition key outlives its owner's interest under a live lease.**
//!   A hand-over deletes its key until etcd answers (or the session ends:
//!   the key goes with the lease), and only then forgets the partition
//!   ([`resign_until_gone`]); a key of ours that this worker does not hold (a
//!   campaign whose answer was lost) is adopted while below the share, else
//!   deleted. So a partition is never left owned in etcd with nobody working
//!   it for longer than an etcd outage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::standing::{Reachability, Server, Standing};
use crate::config::BackoffConfig;
use crate::fence::FenceError;
use crate::lease::{Campaign, Health, Leadership, LeaseError, OwnershipView, Session};
use crate::retry::Backoff;
use crate::types::{FencingToken, JobId, LeaseId};

/// What partition mode keeps.
pub(crate) struct Partitioned {
    /// `Config::partitions`.
    pub(crate) count: u32,
    /// The partitions this worker leads.
    pub(crate) owned: Arc<Ownership>,
    /// Whether this worker can reach PostgreSQL and NATS (it stands down,
    /// handing its partitions back, when it cannot).
    pub(crate) reach: Arc<Reachability>,
}

/// One owned partition of one job type.
struct Unit {
    lead: Leadership,
    lease: LeaseId,
    /// Cancelled when the partition is being handed over: its jobs stop at
    /// their next step boundary, no new one starts.
    handover: CancellationToken,
    /// This partition's deliveries past their grant, until they end.
    in_flight: Arc<AtomicUsize>,
}

/// The partitions this worker owns, by (job type, partition).
#[derive(Default)]
pub(crate) struct Ownership {
    units: Mutex<HashMap<(String, u32), Unit>>,
    /// Woken on every change of the owned set.
    changed: Notify,
}

/// A delivery's right to run its job: the partition's token, held while the
/// delivery lives (the hand-over of the partition waits for it to end).
pub(crate) struct PartitionGrant {
    pub(crate) job_id: JobId,
    pub(crate) token: FencingToken,
    pub(crate) handover: CancellationToken,
    _use: UnitUse,
}

/// Counts a delivery in its partition's `in_flight` until dropped.
struct UnitUse(Arc<AtomicUsize>);

impl Drop for UnitUse {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Ownership {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), Unit>> {
        self.units.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The grant to run `job_id` of `job_type` under `session`: `None` unless
    /// this session owns the job's partition and is not handing it over.
    pub(crate) fn grant(
        &self,
        job_type: &str,
        job_id: JobId,
        partitions: u32,
        session: &Session,
    ) -> Option<PartitionGrant> {
        let units = self.lock();
        let unit = units.get(&(job_type.to_string(), job_id.partition(partitions)))?;
        if unit.lease != session.lease_id() || unit.handover.is_cancelled() {
            return None;
        }
        unit.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(PartitionGrant {
            job_id,
            token: unit.lead.token(),
            handover: unit.handover.clone(),
            _use: UnitUse(unit.in_flight.clone()),
        })
    }

    /// The partitions of `job_type` to fetch from (owned, not handed over).
    pub(crate) fn fetchable(&self, job_type: &str) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .lock()
            .iter()
            .filter(|((t, _), u)| t == job_type && !u.handover.is_cancelled())
            .map(|((_, p), _)| *p)
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether this worker holds partition `partition` of `job_type` (being
    /// handed over or not).
    fn holds(&self, job_type: &str, partition: u32) -> bool {
        self.lock().contains_key(&(job_type.to_string(), partition))
    }

    /// How many partitions this worker owns (all types).
    pub(crate) fn owned(&self) -> usize {
        self.lock().len()
    }

    /// Waits for a change of the owned set (at most `bound`).
    pub(crate) async fn changed(&self, bound: Duration) {
        let _ = tokio::time::timeout(bound, self.changed.notified()).await;
    }

    fn insert(&self, job_type: &str, partition: u32, lead: Leadership, lease: LeaseId) {
        let unit = Unit {
            lead,
            lease,
            handover: CancellationToken::new(),
            in_flight: Arc::default(),
        };
        self.lock().insert((job_type.to_string(), partition), unit);
        self.changed.notify_waiters();
    }

    /// Forgets every partition not held under `lease` (a lost session's), and
    /// those `view` shows are no longer ours; tells their jobs to stop.
    /// Returns the job type of each one forgotten.
    fn forget_lost(&self, lease: LeaseId, view: Option<&OwnershipView>) -> Vec<String> {
        let mut units = self.lock();
        let mut lost = Vec::new();
        units.retain(|(t, p), u| {
            let still = u.lease == lease
                && view.is_none_or(|v| {
                    v.owners.iter().any(|o| {
                        o.job_type == *t
                            && o.partition == *p
                            && o.lease == lease
                            && o.revision == u.lead.token().get()
                    })
                });
            // One being handed over is gone by our own hand: not lost.
            if !still && !u.handover.is_cancelled() {
                u.handover.cancel();
                lost.push(t.clone());
            }
            still
        });
        if !lost.is_empty() {
            tracing::warn!(
                lost = lost.len(),
                "partitions lost (session lost or key gone)"
            );
            self.changed.notify_waiters();
        }
        lost
    }

    /// [`forget_lost`](Self::forget_lost), counted.
    fn forget(&self, shared: &Shared, lease: LeaseId, view: Option<&OwnershipView>) {
        for job_type in self.forget_lost(lease, view) {
            shared.metrics.partitions(&job_type, "lost", 1);
        }
    }

    /// Marks partition `partition` of `job_type` as handed over; returns its
    /// key and in-flight count if it was ours and not already marked.
    fn start_handover(
        &self,
        job_type: &str,
        partition: u32,
    ) -> Option<(Leadership, Arc<AtomicUsize>)> {
        let units = self.lock();
        let unit = units.get(&(job_type.to_string(), partition))?;
        if unit.handover.is_cancelled() {
            return None;
        }
        unit.handover.cancel();
        self.changed.notify_waiters();
        Some((unit.lead.clone(), unit.in_flight.clone()))
    }

    fn remove(&self, job_type: &str, partition: u32, token: FencingToken) {
        let mut units = self.lock();
        let key = (job_type.to_string(), partition);
        if units.get(&key).is_some_and(|u| u.lead.token() == token) {
            units.remove(&key);
        }
    }
}

/// Member `index` of `members`' share of `partitions`: `P / n`, one more for
/// the first `P % n` members.
pub(crate) fn fair_share(partitions: u32, members: usize, index: usize) -> usize {
    let (p, n) = (partitions as usize, members.max(1));
    p / n + usize::from(index < p % n)
}

/// The fair share of `job_type`'s `partitions` that `view`'s members give
/// the session `lease`, and its index among the type's members (by lease id,
/// itself included).
pub(crate) fn share_of(
    view: &OwnershipView,
    job_type: &str,
    lease: LeaseId,
    partitions: u32,
) -> (usize, usize) {
    let mut members: Vec<LeaseId> = view
        .members
        .iter()
        .filter(|m| m.job_types.iter().any(|t| t == job_type))
        .map(|m| m.lease)
        .collect();
    if !members.contains(&lease) {
        members.push(lease);
    }
    members.sort_by_key(|l| l.get());
    let index = members.iter().position(|l| *l == lease).unwrap_or(0);
    (fair_share(partitions, members.len(), index), index)
}

/// Partition mode's readiness: not stood down, and holding the fair share of
/// every registered type's partitions that etcd's members give this worker
/// (the owners read within `timeout`).
pub(super) async fn readiness(
    sh: &Shared,
    p: &Partitioned,
    timeout: Duration,
) -> Result<(), String> {
    if *p.reach.watch().borrow() == Standing::StoodDown {
        return Err("stood down: PostgreSQL or NATS unreachable for too long".into());
    }
    let Some(session) = sh.healthy_session() else {
        return Err("no healthy etcd session".into());
    };
    let view = match tokio::time::timeout(timeout, session.ownership()).await {
        Ok(Ok(view)) => view,
        Ok(Err(e)) => return Err(format!("reading the owners: {e}")),
        Err(_) => return Err("reading the owners timed out".into()),
    };
    for job_type in sh.registry.names() {
        let (share, _) = share_of(&view, &job_type, session.lease_id(), p.count);
        let held = p.owned.fetchable(&job_type).len();
        if held < share {
            return Err(format!(
                "holds {held} of its {share} partitions of {job_type}"
            ));
        }
    }
    Ok(())
}

/// Keeps this worker's share of every registered type's partitions until
/// `stop`: on every session, join the members, then reconcile on every change
/// under `<ns>/own/` (and every `Tuning::partition_resync` as a backstop).
pub(crate) async fn rebalance(
    shared: Arc<Shared>,
    partitioned: Arc<Partitioned>,
    stop: CancellationToken,
) {
    let (partitions, ownership) = (partitioned.count, &partitioned.owned);
    let types = shared.registry.names();
    let standing = partitioned.reach.watch();
    let mut current = shared.session.clone();
    loop {
        let session = current.borrow_and_update().clone();
        match session.filter(|s| s.health() != Health::Lost) {
            Some(session) => {
                let round = Rebalance {
                    shared: &shared,
                    ownership,
                    session: &session,
                    partitions,
                    types: &types,
                    standing: standing.clone(),
                    joined: AtomicBool::new(false),
                    handovers: Mutex::default(),
                };
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = round.run() => {}
                    _ = current.changed() => {}
                }
            }
            None => {
                ownership.forget(&shared, LeaseId::new(0), None);
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = current.changed() => {}
                }
            }
        }
    }
}

/// One session's rebalancing.
struct Rebalance<'a> {
    shared: &'a Arc<Shared>,
    ownership: &'a Arc<Ownership>,
    session: &'a Arc<Session>,
    partitions: u32,
    types: &'a [String],
    /// Whether this worker can reach PostgreSQL and NATS: stood down, it
    /// aims for no partition and is no member.
    standing: watch::Receiver<Standing>,
    /// Whether this session's member key is in etcd (put when ready, deleted
    /// when stood down).
    joined: AtomicBool,
    /// Hand-overs in progress (aborted with the session's rebalancing: the
    /// key then goes with the lease).
    handovers: Mutex<tokio::task::JoinSet<()>>,
}

impl Rebalance<'_> {
    /// Until the session is lost: watch, then reconcile on every change (of
    /// the owners or of the standing), every `Tuning::partition_resync`, and
    /// a tenth of that after a failed round.
    async fn run(&self) {
        let pause = self.shared.cfg.tuning.partition_resync;
        let lease = self.session.lease_id();
        self.ownership.forget(self.shared, lease, None);
        let mut lost = self.session.watch_health();
        let mut standing = self.standing.clone();
        loop {
            let mut watch = match self.session.watch_ownership().await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "watching partition owners failed; retrying");
                    tokio::time::sleep(pause / 10).await;
                    continue;
                }
            };
            loop {
                let next = match self.reconcile().await {
                    Ok(()) => pause,
                    Err(e) => {
                        tracing::warn!(error = %e, "rebalancing partitions failed; retrying");
                        pause / 10
                    }
                };
                tokio::select! {
                    changed = watch.changed() => if changed.is_err() { break },
                    Ok(()) = standing.changed() => {}
                    () = tokio::time::sleep(next) => {}
                    () = wait_lost(&mut lost) => {
                        self.ownership.forget(self.shared, LeaseId::new(0), None);
                        return std::future::pending().await;
                    }
                }
            }
        }
    }

    /// One reconciliation against the owners etcd shows now: ready, this
    /// worker's fair share; stood down, none (every partition handed back).
    async fn reconcile(&self) -> Result<(), LeaseError> {
        let ready = *self.standing.borrow() == Standing::Ready;
        self.membership(ready).await?;
        let view = self.session.ownership().await?;
        let lease = self.session.lease_id();
        self.ownership.forget(self.shared, lease, Some(&view));
        for job_type in self.types {
            let (share, index) = if ready {
                self.share_of(job_type, &view)
            } else {
                (0, 0)
            };
            self.balance_type(job_type, &view, share, index).await;
        }
        Ok(())
    }

    /// Puts this session's member key when `ready`, deletes it otherwise
    /// (once per change).
    async fn membership(&self, ready: bool) -> Result<(), LeaseError> {
        if self.joined.load(Ordering::Acquire) == ready {
            return Ok(());
        }
        if ready {
            let types: Vec<&str> = self.types.iter().map(String::as_str).collect();
            self.session.join_members(&types).await?;
        } else {
            self.session.leave_members().await?;
        }
        self.joined.store(ready, Ordering::Release);
        Ok(())
    }

    /// This worker's fair share of `job_type` and its index among the
    /// type's members (by lease id, itself included).
    fn share_of(&self, job_type: &str, view: &OwnershipView) -> (usize, usize) {
        share_of(view, job_type, self.session.lease_id(), self.partitions)
    }

    /// Takes free partitions of `job_type` up to `share`, or hands the extra
    /// ones over. Keys of ours that nobody here works are adopted first.
    async fn balance_type(&self, job_type: &str, view: &OwnershipView, share: usize, index: usize) {
        let owners: HashMap<u32, LeaseId> = view
            .owners
            .iter()
            .filter(|o| o.job_type == job_type)
            .map(|o| (o.partition, o.lease))
            .collect();
        let kept = self.ownership.fetchable(job_type);
        if kept.len() > share {
            for &p in kept.iter().rev().take(kept.len() - share) {
                self.hand_over(job_type, p);
            }
        }
        let mut missing = share.saturating_sub(kept.len());
        missing = self.adopt_strays(job_type, &owners, missing).await;
        if missing == 0 {
            return;
        }
        // Start looking at a different place per member: fewer lost races.
        let start = (index as u32).wrapping_mul(self.partitions / 4 + 1) % self.partitions;
        for k in 0..self.partitions {
            if missing == 0 {
                break;
            }
            let p = (start + k) % self.partitions;
            if owners.contains_key(&p) {
                continue;
            }
            if self.take(job_type, p).await {
                missing -= 1;
            }
        }
    }

    /// Stray keys: partitions of `job_type` whose key carries our lease but
    /// that this worker does not hold (a campaign whose answer was lost to a
    /// timeout, though etcd created the key). Nobody else may take them while
    /// our session lives, so each is adopted (taken as ours) while `missing`
    /// lasts and given up otherwise. Returns what is still missing.
    async fn adopt_strays(
        &self,
        job_type: &str,
        owners: &HashMap<u32, LeaseId>,
        mut missing: usize,
    ) -> usize {
        let lease = self.session.lease_id();
        let mut strays: Vec<u32> = owners
            .iter()
            .filter(|&(p, l)| *l == lease && !self.ownership.holds(job_type, *p))
            .map(|(p, _)| *p)
            .collect();
        strays.sort_unstable();
        for p in strays {
            tracing::info!(
                job_type,
                partition = p,
                missing,
                "a partition key of ours that nobody here works: adopting it or giving it up"
            );
            if missing == 0 {
                self.give_up(job_type, p).await;
            } else if self.take(job_type, p).await {
                missing -= 1;
            }
        }
        missing
    }

    /// Deletes the stray key of partition `p` of `job_type` (see
    /// [`adopt_strays`](Self::adopt_strays)); a failure is tried again the
    /// next round, which finds the key still stray.
    async fn give_up(&self, job_type: &str, p: u32) {
        if let Err(e) = self.session.disown_partition(job_type, p).await {
            tracing::warn!(job_type, partition = p, error = %e, "giving a stray partition key up failed; tried again next round");
        }
    }

    /// Campaigns for partition `p` of `job_type`, then claims its fence in
    /// PostgreSQL; whether it is ours now.
    async fn take(&self, job_type: &str, p: u32) -> bool {
        let lead = match self.session.own_partition(job_type, p).await {
            Ok(Campaign::Elected(lead)) => lead,
            Ok(Campaign::Follower) => return false,
            Err(e) => {
                tracing::warn!(job_type, partition = p, error = %e, "campaign for a partition failed");
                return false;
            }
        };
        #[cfg(feature = "testing")]
        super::faults::partition_claim(&self.shared.cfg).await;
        let worker = &self.shared.cfg.worker_id;
        match self
            .shared
            .store
            .claim_partition(job_type, p, lead.token(), worker)
            .await
        {
            Ok(()) => {
                tracing::info!(
                    job_type,
                    partition = p,
                    token = lead.token().get(),
                    "partition owned"
                );
                self.shared.metrics.partitions(job_type, "taken", 1);
                self.ownership
                    .insert(job_type, p, lead, self.session.lease_id());
                true
            }
            Err(e) => {
                self.refused(job_type, p, lead.token(), &e);
                let (session, retry) = (
                    self.session.clone(),
                    self.shared.cfg.tuning.lock_release_retry,
                );
                self.spawn(async move { resign_until_gone(&session, lead, retry).await });
                false
            }
        }
    }

    /// Why the claim of partition `p` under `granted` failed: the alarm, or a
    /// warning.
    fn refused(&self, job_type: &str, p: u32, granted: FencingToken, e: &FenceError) {
        match e {
            FenceError::PartitionFencedOut { ours, current, .. } if ours == current => {
                self.shared.metrics.token_regression(job_type);
                if let Some(observer) = &self.shared.observer {
                    observer.partition_token_regression(job_type, p, granted);
                }
                tracing::error!(job_type, partition = p, error = %e,
                    "ALERT: fencing token regression on a partition (etcd revisions went backwards); none of its jobs run under it");
            }
            e => {
                if matches!(e, FenceError::Db(_)) {
                    self.shared.suspect(Server::Postgres);
                }
                tracing::warn!(job_type, partition = p, error = %e, "claiming a partition's fence failed")
            }
        }
    }

    /// Hands partition `p` of `job_type` over in the background: no new job
    /// starts, running ones stop at their next step boundary; once none is
    /// left (or after `Config::shutdown_grace`), the key is deleted, tried
    /// until it is gone ([`resign_until_gone`]); only then is the partition
    /// forgotten.
    fn hand_over(&self, job_type: &str, p: u32) {
        let Some((lead, in_flight)) = self.ownership.start_handover(job_type, p) else {
            return;
        };
        tracing::info!(job_type, partition = p, "handing a partition over");
        self.shared.metrics.partitions(job_type, "handed_over", 1);
        let (session, ownership) = (self.session.clone(), self.ownership.clone());
        let shared = self.shared.clone();
        let job_type = job_type.to_string();
        self.spawn(async move {
            let until = tokio::time::Instant::now() + shared.cfg.shutdown_grace;
            while in_flight.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let token = lead.token();
            #[cfg(feature = "testing")]
            super::faults::partition_resign(&shared.cfg).await;
            resign_until_gone(&session, lead, shared.cfg.tuning.lock_release_retry).await;
            ownership.remove(&job_type, p, token);
        });
    }

    /// Runs `task` among this session's hand-overs (aborted with them).
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.handovers.lock().unwrap_or_else(|p| p.into_inner());
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }
}

/// Deletes the partition key `lead` (a hand-over's last act, or a refused
/// claim's), trying again after every failure until etcd answers (the key is
/// then gone, or another owner's) or the session ends (the key goes with the
/// lease). A key left under a live lease with nobody working it would keep
/// its partition from every other worker for the session's whole life, and
/// one failed delete is enough for that: an etcd election longer than
/// `Config::etcd_request_timeout` fails it. Each try is bounded by that
/// timeout; between tries, `retry` (`Tuning::lock_release_retry`).
async fn resign_until_gone(session: &Session, lead: Leadership, retry: BackoffConfig) {
    let mut backoff = Backoff::new(retry);
    let ended = session.cancellation();
    loop {
        match session.resign(lead.clone()).await {
            Ok(_) => return,
            Err(e) => {
                let attempt = backoff.attempt() + 1;
                tracing::warn!(partition = lead.role(), error = %e, attempt, "deleting a partition's key failed; trying again");
                if !backoff.sleep_unless(&ended).await {
                    return;
                }
            }
        }
    }
}

/// Until `health` says `Lost` (or its session is gone).
async fn wait_lost(health: &mut tokio::sync::watch::Receiver<Health>) {
    let _ = health.wait_for(|h| *h == Health::Lost).await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        for p in [1u32, 7, 16, 64] {
            for n in 1..=9usize {
                let shares: Vec<usize> = (0..n).map(|i| fair_share(p, n, i)).collect();
                assert_eq!(shares.iter().sum::<usize>(), p as usize, "p={p} n={n}");
                let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(hi - lo <= 1, "p={p} n={n}: {shares:?}");
            }
        }
    }
}
