//! How this worker owns a job: one etcd lock per job (the default), or the
//! partition of the job that the worker leads (partition mode). This is the
//! one seam between the two ways: what a fetch round reads from
//! ([`Source`]), what a delivery is granted ([`Grant`]), how a refused claim
//! reads, whether the broker's given-up message has a live owner, the
//! readiness check, and the tasks partition mode runs. The rest of the
//! runtime asks [`Owning`] and does not branch on the mode; the machinery
//! behind the two implementations is the lock service (`lease`) and
//! [`partitions`](super::partitions) with [`standing`](super::standing).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use super::Shared;
use super::outcome::{Attempt, Grant, Held, Outcome};
use super::partitions::{self, Partitioned};
use super::routes::TypeRoutes;
use super::run::{Holding, JobRun};
use super::standing::{self, Reachability, Server};
use crate::config::Config;
use crate::lease::{Acquire, Coming, Session};
use crate::queue::{Delivery, GaveUp, Queue, QueueError};
use crate::telemetry::spans;
use crate::{JobId, Priority, retry};

/// How this worker owns a job.
pub(crate) enum Owning {
    /// One etcd lock per job: a delivery asks the lock service for its job's.
    Locks,
    /// Partition mode: a delivery runs under the grant of its job's
    /// partition, which this worker leads.
    Partitions(Arc<Partitioned>),
}

/// One source of a fetch round: a job type's consumer, or the consumer of
/// one partition of it that this worker leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Source {
    /// The type's index in the worker's [`TypeRoutes`].
    pub(super) index: usize,
    pub(super) job_type: &'static str,
    pub(super) partition: Option<u32>,
    /// How many deliveries the source may take this round.
    pub(super) room: usize,
}

impl Owning {
    /// The way `cfg` says.
    pub(super) fn new(cfg: &Config) -> Self {
        match cfg.partitions {
            None => Owning::Locks,
            Some(count) => Owning::Partitions(Arc::new(Partitioned {
                count,
                owned: Arc::default(),
                reach: Reachability::new(cfg.stand_down_after()),
            })),
        }
    }

    /// Opens the consumers the worker fetches from at start: one per job
    /// type; partition mode opens each partition's when it comes to lead it.
    pub(super) async fn open(&self, queue: &Queue, routes: &TypeRoutes) -> Result<(), QueueError> {
        match self {
            Owning::Locks => queue.route(&routes.names()).await,
            Owning::Partitions(_) => Ok(()),
        }
    }

    /// A call to `server` failed as if it were unreachable: partition mode
    /// suspects it and probes it (see `standing`).
    pub(super) fn suspect(&self, server: Server) {
        if let Owning::Partitions(p) = self {
            p.reach.failed(server);
        }
    }

    /// A round's sources from its types (index, name, room): each type
    /// itself, or each partition of it that this worker leads, the type's
    /// room shared out among them.
    /// `turn` (the fetcher's round count) rotates which partitions get the
    /// share's remainder, so a room smaller than the partitions led (a rate
    /// limit's few tokens) reaches every partition in turn.
    pub(super) fn sources(
        &self,
        types: Vec<(usize, &'static str, usize)>,
        turn: usize,
    ) -> Vec<Source> {
        let source = |index, job_type, partition, room| Source {
            index,
            job_type,
            partition,
            room,
        };
        let Owning::Partitions(p) = self else {
            return types
                .into_iter()
                .map(|(i, n, room)| source(i, n, None, room))
                .collect();
        };
        let mut round = Vec::new();
        for (index, name, room) in types {
            let owned = p.owned.fetchable(name);
            let shares = shares(room, owned.len(), turn);
            for (partition, share) in owned.into_iter().zip(shares) {
                if share > 0 {
                    round.push(source(index, name, Some(partition), share));
                }
            }
        }
        round
    }

    /// Fetches up to `max` deliveries from `source`'s consumer at
    /// `priority`: a type's consumer waits up to `wait` for one; a
    /// partition's asks once (the fetcher pauses between idle rounds
    /// instead, see [`Owning::after_idle_round`]).
    pub(super) async fn fetch(
        &self,
        queue: &Queue,
        (source, priority): (Source, Priority),
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let (job_type, partition) = (source.job_type, source.partition);
        queue
            .fetch_with_priority(job_type, partition, priority, max, wait)
            .await
    }

    /// A round found no source: waits (up to `bound`) for one to appear, a
    /// partition to lead when none is, else a running job of a type at its
    /// limit to end.
    pub(super) async fn wait_for_sources(&self, routes: &TypeRoutes, bound: Duration) {
        match self {
            Owning::Partitions(p) if p.owned.owned() == 0 => p.owned.changed(bound).await,
            _ => routes.freed(bound).await,
        }
    }

    /// After a round that delivered nothing: partition fetches ask once, so
    /// the pause between idle rounds is their wait (`pause`, cut short when
    /// one of the round's sources `rang`); a type's fetch has waited already.
    pub(super) async fn after_idle_round(&self, pause: Duration, rang: impl Future<Output = ()>) {
        if let Owning::Partitions(_) = self {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = rang => {}
            }
        }
    }

    /// Acquisition: the job's lock, or its partition's grant, under `session`.
    pub(super) async fn acquire(
        &self,
        run: &JobRun,
        a: &mut Attempt,
        job_id: JobId,
        session: Arc<Session>,
        coming: Coming,
    ) -> Result<(), Outcome> {
        match self {
            Owning::Locks => run.acquire_lock(a, job_id, session, coming).await,
            Owning::Partitions(p) => {
                drop(coming);
                run.acquire_partition(a, job_id, session, p)
            }
        }
    }

    /// Whether a live owner holds the job the broker gave up on: its lock,
    /// or, for a `running` row, its partition. Such a job's message is
    /// renewed, never dead-lettered.
    pub(super) async fn live_holder(
        &self,
        sh: &Shared,
        session: &Session,
        g: &GaveUp,
    ) -> Result<bool, String> {
        let Owning::Partitions(p) = self else {
            let holder = session.lock_holder(g.job_id).await;
            return holder.map(|h| h.is_some()).map_err(|e| e.to_string());
        };
        let row = match sh.store.job(g.job_id).await {
            Ok(Some(row)) if row.status == crate::fence::JobStatus::Running => row,
            Ok(_) => return Ok(false),
            Err(e) => return Err(e.to_string()),
        };
        let partition = g.job_id.partition(p.count);
        let holder = session.partition_holder(&row.job_type, partition).await;
        holder.map(|h| h.is_some()).map_err(|e| e.to_string())
    }

    /// The mode's own readiness check, each read bounded by `timeout`:
    /// partition mode's standing and shares (see [`partitions::readiness`]);
    /// none with one lock per job.
    pub(super) async fn readiness(
        &self,
        sh: &Shared,
        timeout: Duration,
    ) -> Option<Result<(), String>> {
        match self {
            Owning::Locks => None,
            Owning::Partitions(p) => Some(partitions::readiness(sh, p, timeout).await),
        }
    }

    /// Partition mode's tasks: the probes of a suspected server (in `tasks`)
    /// and the rebalancer (returned with its own stop, ended before the
    /// session is revoked at shutdown).
    pub(super) fn spawn_tasks(
        shared: &Arc<Shared>,
        stop_all: &CancellationToken,
        tasks: &mut JoinSet<()>,
    ) -> Option<(CancellationToken, AbortOnDropHandle<()>)> {
        let Owning::Partitions(p) = &shared.owning else {
            return None;
        };
        let probe = ServerProbe(shared.clone());
        let period = shared.cfg.tuning.server_probe;
        let reach = p.reach.clone();
        tasks.spawn(standing::keep(reach, probe, period, stop_all.clone()));
        let stop = stop_all.child_token();
        let task = tokio::spawn(partitions::rebalance(
            shared.clone(),
            p.clone(),
            stop.clone(),
        ));
        Some((stop, AbortOnDropHandle::new(task)))
    }
}

/// Partition mode: the probes of a suspected server ([`standing::keep`]).
struct ServerProbe(Arc<Shared>);

impl standing::Probe for ServerProbe {
    fn probe(&self, server: Server) -> futures::future::BoxFuture<'_, bool> {
        Box::pin(async move {
            match server {
                Server::Postgres => self.0.store.ping().await.is_ok(),
                Server::Nats => self.0.queue.ping().await.is_ok(),
            }
        })
    }
}

impl JobRun {
    /// One lock per job: the job's lock from the lock service.
    async fn acquire_lock(
        &self,
        a: &mut Attempt,
        job_id: JobId,
        session: Arc<Session>,
        coming: Coming,
    ) -> Result<(), Outcome> {
        let sh = &self.shared;
        a.holding = Some(Holding::start(sh.clone(), job_id));
        let acquired = sh
            .locks
            .acquire(session.clone(), job_id, coming)
            .instrument(tracing::info_span!(spans::ACQUIRE, job_id = %job_id))
            .await;
        match acquired {
            Ok(Acquire::Acquired(lock)) => {
                tracing::Span::current().record("token", lock.token().get());
                a.held = Held::Lock {
                    session,
                    lock: Grant::Lock(lock),
                };
                Ok(())
            }
            Ok(Acquire::Contended { holder })
                if holder == Some(session.lease_id()) && !Holding::others_hold(sh, job_id) =>
            {
                Err(Outcome::Stranded { session, job_id })
            }
            Ok(Acquire::Contended { holder }) => {
                let attempt = a.delivery().delivery_count().saturating_sub(1);
                let attempt = u32::try_from(attempt).unwrap_or(u32::MAX);
                // A message comes back while its lock is held only when the holder
                // stopped progress-acking (paused, partitioned, crashed): its lease
                // ends within a TTL. Retry at least every TTL/20, so the new owner
                // acquires soon after the lease ends instead of backing off past it.
                let delay = retry::jittered(&sh.cfg.contention_backoff, attempt)
                    .min(sh.cfg.lease_ttl / sh.cfg.tuning.contention_retry_divisor);
                tracing::debug!(holder = ?holder, ?delay, "job lock held by another session");
                Err(Outcome::Contended { delay })
            }
            Err(e) => {
                tracing::warn!(error = %e, "acquiring the job lock failed");
                let delay = retry::jittered(&sh.cfg.contention_backoff, 0);
                Err(Outcome::Retry { delay })
            }
        }
    }

    /// Partition mode: the grant of the job's partition, which this worker
    /// must lead (ownership moved since the fetch: handed back at once, to
    /// the new owner's fetch), and no other delivery of the same job in this
    /// worker (the same token: the row cannot tell them apart).
    fn acquire_partition(
        &self,
        a: &mut Attempt,
        job_id: JobId,
        session: Arc<Session>,
        p: &Partitioned,
    ) -> Result<(), Outcome> {
        let sh = &self.shared;
        let Some(grant) = p.owned.grant(&a.job_type, job_id, p.count, &session) else {
            tracing::debug!("not the owner of the job's partition (any more); handing it back");
            return Err(Outcome::Retry {
                delay: Duration::ZERO,
            });
        };
        let holding = Holding::start(sh.clone(), job_id);
        if Holding::others_hold(sh, job_id) {
            let delay = sh.cfg.lease_ttl / sh.cfg.tuning.contention_retry_divisor;
            tracing::debug!(?delay, "another delivery of this job runs here");
            return Err(Outcome::Contended { delay });
        }
        tracing::Span::current().record("token", grant.token.get());
        a.holding = Some(holding);
        a.held = Held::Lock {
            session,
            lock: Grant::Partition(grant),
        };
        Ok(())
    }
}

/// `room` shared out over `k` partitions: each gets `room / k`, and the
/// remainder goes one each to the partitions from `turn % k` on.
fn shares(room: usize, k: usize, turn: usize) -> Vec<usize> {
    let first = turn % k.max(1);
    (0..k)
        .map(|j| room / k + usize::from((j + k - first) % k < room % k))
        .collect()
}

#[cfg(test)]
mod share_tests {
    use super::shares;

    #[test]
    fn the_remainder_of_a_room_rotates_over_the_partitions() {
        assert_eq!(shares(6, 4, 0), [2, 2, 1, 1]);
        assert_eq!(shares(6, 4, 3), [2, 1, 1, 2]);
        assert_eq!(shares(1, 3, 0), [1, 0, 0]);
        assert_eq!(shares(1, 3, 1), [0, 1, 0]);
        assert_eq!(shares(1, 3, 5), [0, 0, 1]);
        assert!(shares(3, 0, 7).is_empty());
    }
}
