//! The worker's reports of itself for operators (`worker_reports`, through
//! `fence`): its session lease, the lease's health and its jobs in flight, on
//! every health change and every half TTL, and `stopped` at a graceful
//! shutdown. Best effort: a report that fails is logged and the next one tries
//! again; nothing in the protocol reads them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::slots::Slots;
use crate::fence::WorkerReport;
use crate::lease::{Health, Session};

/// What the reports need, for the reporting task and the last report at shutdown.
#[derive(Clone)]
pub(super) struct Reporter {
    shared: Arc<Shared>,
    slots: Arc<Slots>,
    started_at: DateTime<Utc>,
    /// Held while a report is written; `true` once `stopped` was written, after
    /// which nothing else is (so a periodic report cannot land after it).
    stopped: Arc<tokio::sync::Mutex<bool>>,
    /// The job types last recorded as unrouted (recorded 0 once they are not).
    unrouted: Arc<std::sync::Mutex<BTreeSet<String>>>,
    /// The job types last recorded with a backlog (recorded 0 once they have none).
    backlog: Arc<std::sync::Mutex<BTreeSet<String>>>,
    /// The job types last recorded with an oldest message (recorded 0 once
    /// they have none).
    oldest: Arc<std::sync::Mutex<BTreeSet<String>>>,
}

impl Reporter {
    pub(super) fn new(shared: Arc<Shared>, slots: Arc<Slots>) -> Self {
        Reporter {
            shared,
            slots,
            started_at: Utc::now(),
            stopped: Arc::default(),
            unrouted: Arc::default(),
            backlog: Arc::default(),
            oldest: Arc::default(),
        }
    }

    /// Reports until `stop`: at once, then on every session or health change
    /// and every half TTL.
    pub(super) async fn run(self, stop: CancellationToken) {
        let mut sessions = self.shared.session.clone();
        let period = self.shared.cfg.lease_ttl / 2;
        loop {
            let session = sessions.borrow_and_update().clone();
            let health = session.as_ref().map_or(Health::Lost, |s| s.health());
            self.report(session.as_deref(), health.as_str()).await;
            self.record_queue().await;
            let mut healths = session.as_ref().map(|s| s.watch_health());
            // Not held while waiting: a graceful shutdown revokes the session
            // only once nobody else holds it.
            drop(session);
            tokio::select! {
                () = stop.cancelled() => return,
                _ = sessions.changed() => {}
                () = health_changed(&mut healths) => {}
                () = tokio::time::sleep(period) => {}
            }
        }
    }

    /// The last report of a graceful shutdown.
    pub(super) async fn stopped(&self) {
        let session = self.shared.session.borrow().clone();
        self.report(session.as_deref(), "stopped").await;
    }

    async fn report(&self, session: Option<&Session>, health: &'static str) {
        let mut stopped = self.stopped.lock().await;
        if *stopped {
            return;
        }
        *stopped = health == "stopped";
        let cfg = &self.shared.cfg;
        let report = WorkerReport {
            worker: cfg.worker_id.clone(),
            lease_id: session.map(|s| s.lease_id().get()),
            health,
            in_flight: self.slots.running(),
            max_in_flight: cfg.max_in_flight,
            lease_ttl: cfg.lease_ttl,
            started_at: self.started_at,
            job_types: self.shared.registry.names(),
            type_limits: self.shared.registry.reported_limits(),
        };
        let write = self.shared.store.report_worker(&report);
        match tokio::time::timeout(cfg.lease_ttl / 2, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "worker report failed"),
            Err(_) => tracing::warn!("worker report timed out"),
        }
    }
}

impl Reporter {
    /// Records `tenure.queue.backlog` (the messages stored in the work stream
    /// per job type), `tenure.queue.unrouted` (those of types no live
    /// worker registers, from the workers' reports) and
    /// `tenure.queue.oldest_age` (the age of each type's oldest message); a
    /// type recorded before that has none now is recorded 0. One read of
    /// each server per report, then one message read per type with a
    /// backlog, all within half a TTL.
    async fn record_queue(&self) {
        let sh = &self.shared;
        let bound = sh.cfg.lease_ttl / 2;
        let deadline = tokio::time::Instant::now() + bound;
        let read = async {
            (
                sh.queue.stored_by_type().await,
                sh.store.registered_job_types().await,
            )
        };
        let (stored, routed) = match tokio::time::timeout(bound, read).await {
            Ok((Ok(stored), Ok(routed))) => (stored, routed),
            Ok((Err(e), _)) => {
                return tracing::debug!(error = %e, "reading the work stream's types failed");
            }
            Ok((_, Err(e))) => {
                return tracing::debug!(error = %e, "reading the registered types failed");
            }
            Err(_) => return tracing::debug!("reading the work stream's backlog timed out"),
        };
        let backlog: BTreeMap<String, u64> = stored.into_iter().filter(|(_, n)| *n > 0).collect();
        let unrouted: BTreeMap<String, u64> = backlog
            .iter()
            .filter(|(t, _)| !routed.contains(*t))
            .map(|(t, n)| (t.clone(), *n))
            .collect();
        let oldest = self.oldest_ages(backlog.keys(), deadline).await;
        record_gauges(&self.backlog, backlog, |t, n| sh.metrics.backlog(t, n));
        record_gauges(&self.unrouted, unrouted, |t, n| sh.metrics.unrouted(t, n));
        record_gauges(&self.oldest, oldest, |t, age| sh.metrics.oldest_age(t, age));
    }

    /// The age of the oldest stored message of each of `types`, read
    /// concurrently by `deadline`; a type whose read fails is left out.
    async fn oldest_ages(
        &self,
        types: impl Iterator<Item = &String>,
        deadline: tokio::time::Instant,
    ) -> BTreeMap<String, Duration> {
        let queue = &self.shared.queue;
        let reads = types.map(|t| async move { (t.clone(), queue.oldest_stored_age(t).await) });
        let Ok(ages) = tokio::time::timeout_at(deadline, futures::future::join_all(reads)).await
        else {
            tracing::debug!("reading the oldest message ages timed out");
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for (t, age) in ages {
            match age {
                Ok(Some(age)) => {
                    out.insert(t, age);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(job_type = %t, error = %e, "reading the oldest message failed")
                }
            }
        }
        out
    }
}

/// Records `now` through `record`, and zero for each type in `last` not in
/// `now`; `last` becomes `now`'s types.
fn record_gauges<V: Copy + Default>(
    last: &std::sync::Mutex<BTreeSet<String>>,
    now: BTreeMap<String, V>,
    record: impl Fn(&str, V),
) {
    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
    for gone in last.iter().filter(|t| !now.contains_key(*t)) {
        record(gone, V::default());
    }
    for (t, n) in &now {
        record(t, *n);
    }
    *last = now.into_keys().collect();
}

/// Waits for the next change of a session's health (forever without a session).
async fn health_changed(healths: &mut Option<watch::Receiver<Health>>) {
    match healths {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}
