//! A running worker's life, owned in one place: the cancellation tokens, every
//! task and the actor tree that [`WorkerBuilder::start`](super::WorkerBuilder::start)
//! spawns, and [`Lifecycle::shutdown`], which stops them in one order.
//!
//! ```text
//! Worker
//!  |- WorkerSupervisor (actor)      the actor tree:
//!  |   |- LeaseKeeper (actor)         the session, its keepalive task, a new session after Lost
//!  |   '- Fetcher (actor)             pulls while Healthy
//!  |       '- JobActor (per delivery)   admit, acquire, claim, steps, settle
//!  |           '- StageActor (per step)   one step function under StepCtx
//!  |- lock service (task)           the worker's etcd lock batches (lease::LockService)
//!  |- standing (task)               partition mode: probes a suspected PostgreSQL or NATS
//!  |- rebalancer (task)             partition mode: takes and hands over partitions
//!  |- cancel listener (task)        operator cancel notices -> running deliveries
//!  |- max-deliveries listener (task) + gave-up marking (task)
//!  |- reporter (task)               the worker's report for operators
//!  '- scheduler (task)              leader election: cron ticks, due jobs, retention
//! ```
//!
//! Shutdown, in this order:
//! 1. `draining`: the fetcher stops, jobs stop at their next step boundary and
//!    are released (the next owner counts no takeover);
//! 2. up to `shutdown_grace` for every run slot to come back; then `stop_jobs`
//!    cancels the steps still running (up to `shutdown_cancel_wait`);
//! 3. the reporter writes `stopped`;
//! 4. partition mode: the rebalancer hands its partitions over and ends (it
//!    holds the session, which is revoked only once nobody else does);
//! 5. the supervisor closes the session (revoking the lease deletes every lock
//!    still held);
//! 6. `stop_all` ends every task; the actor tree is stopped and joined, then
//!    the tasks.

use std::sync::Arc;

use ractor::{Actor, ActorRef};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::keeper::KeeperArgs;
use super::owning::Owning;
use super::readiness::WorkerProbe;
use super::report::Reporter;
use super::routes::TypeRoutes;
use super::scheduler::Scheduler;
use super::slots::Slots;
use super::supervisor::{SupervisorArgs, SupervisorMsg, WorkerSupervisor};
use super::{Shared, WorkerError, cancel, gave_up};
use crate::queue::AdvisoryListener;
use crate::schedule::Parsed;

/// The worker's three cancellation tokens, from the gentlest.
#[derive(Clone, Default)]
pub(super) struct Stops {
    /// Shutdown asked: fetch nothing more, stop jobs between steps.
    pub(super) draining: CancellationToken,
    /// Shutdown grace over: cancel running steps.
    pub(super) stop_jobs: CancellationToken,
    /// Every task ends.
    pub(super) stop_all: CancellationToken,
}

/// What the tasks and actors are spawned with.
pub(super) struct Parts {
    pub(super) shared: Arc<Shared>,
    pub(super) slots: Arc<Slots>,
    pub(super) routes: Arc<TypeRoutes>,
    pub(super) keeper: KeeperArgs,
    pub(super) schedules: Vec<Parsed>,
}

/// Everything a running worker spawned, until [`Lifecycle::shutdown`].
pub(super) struct Lifecycle {
    stops: Stops,
    tasks: JoinSet<()>,
    supervisor: ActorRef<SupervisorMsg>,
    join: Option<JoinHandle<()>>,
    _advisories: AdvisoryListener,
    reporter: Reporter,
    /// Partition mode: the rebalancing task and its own stop.
    rebalancer: Option<(CancellationToken, AbortOnDropHandle<()>)>,
}

impl Lifecycle {
    /// Spawns every task and the actor tree. `tasks` already holds the ones
    /// started before [`Shared`] existed (the lock service).
    pub(super) async fn spawn(
        stops: Stops,
        mut tasks: JoinSet<()>,
        parts: Parts,
    ) -> Result<Self, WorkerError> {
        let Parts {
            shared,
            slots,
            routes,
            keeper,
            schedules,
        } = parts;
        let stop_all = &stops.stop_all;
        let rebalancer = Owning::spawn_tasks(&shared, stop_all, &mut tasks);
        // Subscribed before the first fetch: a cancel notice for any job this
        // worker runs finds the subscription in place.
        spawn_cancel_listener(&shared, stop_all, &mut tasks).await?;
        spawn_ring_listener(&shared, stop_all, &mut tasks).await?;
        let args = SupervisorArgs {
            shared: shared.clone(),
            slots: slots.clone(),
            routes,
            keeper: Some(keeper),
        };
        let (supervisor, join) = Actor::spawn(None, WorkerSupervisor, args)
            .await
            .map_err(|e| WorkerError::Actor(e.to_string()))?;
        let advisories = gave_up::spawn_gave_up_marking(&shared, &mut tasks);
        let reporter = Reporter::new(shared.clone(), slots);
        tasks.spawn(reporter.clone().run(stop_all.clone()));
        let scheduler = Scheduler {
            shared: shared.clone(),
            schedules,
        };
        tasks.spawn(scheduler.run(stop_all.clone()));
        tasks.spawn(super::pauses::watch_pauses(
            shared.clone(),
            stop_all.clone(),
        ));
        Ok(Lifecycle {
            stops,
            tasks,
            supervisor,
            join: Some(join),
            _advisories: advisories,
            reporter,
            rebalancer,
        })
    }

    /// A probe handle on this worker (see [`WorkerProbe`]).
    pub(super) fn probe(&self, shared: &Arc<Shared>) -> WorkerProbe {
        WorkerProbe::new(
            shared.clone(),
            self.supervisor.clone(),
            self.stops.stop_all.clone(),
        )
    }

    /// Stops everything in the order of the module documentation.
    pub(super) async fn shutdown(&mut self, shared: &Shared, slots: &Slots) {
        self.stops.draining.cancel();
        let grace = shared.cfg.shutdown_grace;
        let drained = tokio::time::timeout(grace, slots.all_back()).await.is_ok();
        if !drained {
            tracing::warn!("shutdown grace over: cancelling running steps");
            self.stops.stop_jobs.cancel();
            let wait = shared.cfg.tuning.shutdown_cancel_wait;
            let _ = tokio::time::timeout(wait, slots.all_back()).await;
        }
        self.reporter.stopped().await;
        if let Some((stop, task)) = self.rebalancer.take() {
            stop.cancel();
            let _ = task.await;
        }
        let _ = ractor::call!(self.supervisor, SupervisorMsg::CloseSession);
        self.stops.stop_all.cancel();
        self.supervisor.stop(Some("shutdown".into()));
        if let Some(join) = self.join.take() {
            let _ = join.await;
        }
        self.tasks.shutdown().await;
    }
}

impl Drop for Lifecycle {
    /// Without [`Lifecycle::shutdown`]: everything stops at once; the jobs
    /// held are taken over after the session's TTL.
    fn drop(&mut self) {
        if self.join.is_some() {
            self.stops.stop_all.cancel();
            self.stops.draining.cancel();
            self.stops.stop_jobs.cancel();
            self.supervisor.kill();
        }
    }
}

/// The worker's one subscription to the doorbell (`queue/ring.rs`): idle
/// fetches ask at once when a job for them is stored.
async fn spawn_ring_listener(
    shared: &Arc<Shared>,
    stop_all: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), WorkerError> {
    let rings = shared.queue.listen_for_rings().await?;
    let stop = stop_all.clone();
    tasks.spawn(async move {
        tokio::select! {
            () = rings => {}
            () = stop.cancelled() => {}
        }
    });
    Ok(())
}

/// The worker's one subscription to operator cancel notices.
async fn spawn_cancel_listener(
    shared: &Arc<Shared>,
    stop_all: &CancellationToken,
    tasks: &mut JoinSet<()>,
) -> Result<(), WorkerError> {
    let notices = shared.queue.cancel_notices().await?;
    let confirm = cancel::Confirm {
        store: shared.store.clone(),
        metrics: shared.metrics.clone(),
    };
    tasks.spawn(cancel::listen(
        notices,
        shared.cancels.clone(),
        confirm,
        stop_all.clone(),
    ));
    Ok(())
}
