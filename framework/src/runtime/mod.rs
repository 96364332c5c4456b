//! The runtime: ractor actor trees that run fenced state machines. What a
//! running worker spawns, and the order it stops them in, is `lifecycle`'s.
//!
//! ```no_run
//! # use tenure::{Config, Worker};
//! # async fn demo<J: tenure::Job>(job: J) -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Worker::builder(Config::from_env()?)
//!     .register(job)
//!     .start()
//!     .await?;
//! // ... until told to stop:
//! worker.shutdown().await?;
//! # Ok(()) }
//! ```

mod bucket;
mod cancel;
mod compensate;
#[cfg(feature = "testing")]
mod faults;
mod fetcher;
mod fleet;
mod gave_up;
mod job_actor;
mod keeper;
mod levels;
mod lifecycle;
mod outcome;
mod owning;
mod partitions;
mod pauses;
mod readiness;
mod registry;
mod report;
mod routes;
mod run;
mod scheduler;
mod slots;
mod stage;
mod standing;
mod step_list;
mod steps;
mod supervisor;
mod unstick;

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ConfigError;
use crate::fence::{FenceError, FenceStore};
use crate::job::Job;
use crate::lease::{Health, LeaseError, LockService, Session};
use crate::queue::{Queue, QueueError};
use crate::schedule::{Parsed, Schedule, ScheduleError};
use crate::telemetry::Metrics;
use crate::{Config, FencingToken, JobId, StepIndex};

use keeper::KeeperArgs;
use lifecycle::{Lifecycle, Parts, Stops};
pub use readiness::{READINESS_TIMEOUT, Readiness, ReadinessCheck, WorkerProbe};
pub use registry::JobLimits;
use registry::Registry;
use slots::Slots;

/// Errors starting or stopping a worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// Invalid configuration.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// No job type was registered.
    #[error("no job types registered: call `register` before `start`")]
    NoJobs,
    /// Two job types share a name.
    #[error("job type {0:?} registered twice")]
    DuplicateJob(&'static str),
    /// A job type's `JobLimits::max_in_flight` is 0: it would never run.
    #[error("job type {0:?} has max_in_flight 0: it would never run")]
    ZeroLimit(&'static str),
    /// A job type's `JobLimits::fleet_max` is 0: it would never run.
    #[error("job type {0:?} has fleet_max 0: it would never run")]
    ZeroFleetLimit(&'static str),
    /// A job type's `JobLimits::rate` is 0 deliveries, or per a zero period.
    #[error("job type {0:?} has a rate of 0 deliveries or per a zero period")]
    BadRate(&'static str),
    /// etcd could not be reached or refused the session.
    #[error("etcd: {0}")]
    Lease(#[from] LeaseError),
    /// PostgreSQL could not be reached.
    #[error("postgresql: {0}")]
    Fence(#[from] FenceError),
    /// NATS could not be reached or set up.
    #[error("nats: {0}")]
    Queue(#[from] QueueError),
    /// An actor could not be spawned.
    #[error("actor: {0}")]
    Actor(String),
    /// A cron schedule that cannot be used (checked before anything connects).
    #[error("schedule: {0}")]
    Schedule(#[from] crate::schedule::ScheduleError),
    /// [`Worker::run_until_signal`] could not install its signal handlers.
    #[error("signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

/// Observes what the runtime commits and refuses (for audits and torture tests).
/// Called synchronously on the job's task: keep it cheap.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use tenure::{Worker, WorkerObserver};
/// use tenure::{FencingToken, JobId, StepIndex};
///
/// #[derive(Default)]
/// struct Audit { stale: AtomicU64 }
///
/// impl WorkerObserver for Audit {
///     fn stale_rejected(&self, job: JobId, step: StepIndex, token: FencingToken) {
///         self.stale.fetch_add(1, Ordering::Relaxed);
///         eprintln!("job {job} step {step}: token {token} was fenced out");
///     }
/// }
///
/// # async fn demo<J: tenure::Job>(cfg: tenure::Config, job: J) -> Result<(), tenure::WorkerError> {
/// let audit = Arc::new(Audit::default());
/// let worker = Worker::builder(cfg).register(job).observer(audit.clone()).start().await?;
/// # Ok(()) }
/// ```
pub trait WorkerObserver: Send + Sync + 'static {
    /// Step `step` of `job_id` committed under `token`.
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        let _ = (job_id, step, token);
    }
    /// A write of step `step` under `token` was refused: a newer owner holds the job.
    fn stale_rejected(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        let _ = (job_id, step, token);
    }
    /// The claim of a freshly verified lock with `token` found the job's fence at
    /// or above it while our session was alive: etcd's revisions went backwards
    /// (a snapshot restore without `--bump-revision`). The job was handed back,
    /// not run. This is an alarm, never normal operation.
    fn token_regression(&self, job_id: JobId, token: FencingToken) {
        let _ = (job_id, token);
    }
    /// Partition mode's [`token_regression`](Self::token_regression): the
    /// campaign for partition `partition` of `job_type` won a key whose
    /// `token` the partition's fence already holds (etcd's revisions went
    /// backwards). The partition was handed back, none of its jobs run under
    /// `token`. An alarm, never normal operation.
    fn partition_token_regression(&self, job_type: &str, partition: u32, token: FencingToken) {
        let _ = (job_type, partition, token);
    }
}

/// What every actor of one worker shares.
pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) store: FenceStore,
    pub(crate) queue: Queue,
    pub(crate) registry: Registry,
    pub(crate) metrics: Metrics,
    pub(crate) locks: LockService,
    pub(crate) session: watch::Receiver<Option<Arc<Session>>>,
    /// Shutdown asked: fetch nothing more, stop between steps.
    pub(crate) draining: CancellationToken,
    /// Shutdown grace over: cancel running steps.
    pub(crate) stop_jobs: CancellationToken,
    pub(crate) observer: Option<Arc<dyn WorkerObserver>>,
    /// How many job actors of this worker are acquiring or holding each job's
    /// lock right now: a lock of our own lease for a job no other actor here
    /// works on is one this worker stranded.
    pub(crate) holding: std::sync::Mutex<std::collections::HashMap<JobId, u32>>,
    /// The jobs in flight here that an operator's cancel notice can reach.
    pub(crate) cancels: cancel::Cancels,
    /// How this worker owns a job: one lock per job, or partitions.
    pub(crate) owning: owning::Owning,
    /// The paused job types.
    pub(crate) pauses: pauses::Pauses,
    /// The job types limited fleet-wide.
    pub(crate) fleet: fleet::Fleet,
}

impl Shared {
    /// The current session if it is `Healthy`.
    pub(crate) fn healthy_session(&self) -> Option<Arc<Session>> {
        self.session
            .borrow()
            .as_ref()
            .filter(|s| s.health() == Health::Healthy)
            .cloned()
    }

    /// A call to `server` failed as if it were unreachable: in partition
    /// mode, the server is suspected and probed (see `standing`).
    pub(crate) fn suspect(&self, server: standing::Server) {
        self.owning.suspect(server);
    }
}

/// Builds a [`Worker`]: the job types it runs, and optionally a meter and an
/// observer.
///
/// ```no_run
/// # async fn demo<A: tenure::Job, B: tenure::Job>(a: A, b: B) -> Result<(), Box<dyn std::error::Error>> {
/// use opentelemetry::metrics::MeterProvider as _;
/// use tenure::Worker;
///
/// let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder().build();
/// let worker = Worker::builder(tenure::Config::from_env()?)
///     .register(a)
///     .register(b) // one worker, several job types
///     .meter(provider.meter("tenure"))
///     .start()
///     .await?;
/// # let _ = worker; Ok(()) }
/// ```
#[must_use]
pub struct WorkerBuilder {
    cfg: Config,
    registry: Registry,
    duplicate: Option<&'static str>,
    meter: Option<opentelemetry::metrics::Meter>,
    observer: Option<Arc<dyn WorkerObserver>>,
    schedules: Vec<ScheduleEntry>,
}

/// A schedule given to the builder: checked, with its job type and input, or
/// the first error found (reported by `start`).
type ScheduleEntry = Result<(Parsed, &'static str, serde_json::Value), ScheduleError>;

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("cfg", &self.cfg)
            .field("jobs", &self.registry)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// Registers a job type. Each name once. The worker fetches only the job
    /// types it registered (one NATS consumer per type): a job of a type no
    /// running worker registers waits in the stream until one does.
    pub fn register<J: Job>(self, job: J) -> Self {
        self.register_with(job, JobLimits::default())
    }

    /// Registers a job type with limits of its own, so that it cannot take the
    /// whole worker from the other types.
    ///
    /// ```no_run
    /// # async fn demo<A: tenure::Job, B: tenure::Job>(a: A, b: B) -> Result<(), Box<dyn std::error::Error>> {
    /// use tenure::{JobLimits, Worker};
    /// let worker = Worker::builder(tenure::Config::from_env()?)
    ///     .register_with(a, JobLimits::default().max_in_flight(4)) // slow: at most 4 at once
    ///     .register(b)
    ///     .start()
    ///     .await?;
    /// # let _ = worker; Ok(()) }
    /// ```
    pub fn register_with<J: Job>(mut self, job: J, limits: JobLimits) -> Self {
        if !self.registry.insert(job, limits) && self.duplicate.is_none() {
            self.duplicate = Some(J::NAME);
        }
        self
    }

    /// Enqueues a job of type `J` with `input` at every tick of `cron_expr`
    /// (five fields, or six with seconds first), read in UTC, missed ticks
    /// skipped: [`WorkerBuilder::schedule_with`] with [`Schedule::new`].
    ///
    /// ```no_run
    /// # async fn demo<J: tenure::Job>(job: J, input: J::Input) -> Result<(), tenure::WorkerError> {
    /// let worker = tenure::Worker::builder(tenure::Config::from_env()?)
    ///     .register(job)
    ///     .schedule::<J>("every-ten-seconds", "*/10 * * * * *", &input)
    ///     .start() // a bad expression is WorkerError::Schedule here
    ///     .await?;
    /// # let _ = worker; Ok(()) }
    /// ```
    pub fn schedule<J: Job>(self, name: &str, cron_expr: &str, input: &J::Input) -> Self {
        self.schedule_with::<J>(Schedule::new(name, cron_expr), input)
    }

    /// Enqueues a job of type `J` with `input` at every tick of `schedule`,
    /// once across the whole fleet: the namespace's elected scheduler leader
    /// enqueues each tick under the key `cron:<name>:<tick, RFC 3339 UTC>`.
    /// Every worker may declare the same schedules; the job type need not be
    /// registered on this worker. A schedule that does not check (see
    /// [`Schedule::check`]) makes [`start`](Self::start) fail with
    /// [`WorkerError::Schedule`] before anything connects.
    pub fn schedule_with<J: Job>(mut self, schedule: Schedule, input: &J::Input) -> Self {
        let name = schedule.name().to_string();
        let entry = schedule.parsed().and_then(|p| {
            let value = serde_json::to_value(input).map_err(|e| ScheduleError::Input {
                name: name.clone(),
                reason: e.to_string(),
            })?;
            Ok((p, J::NAME, value))
        });
        let duplicate = self
            .schedules
            .iter()
            .any(|e| matches!(e, Ok((p, ..)) if p.def.name() == name));
        self.schedules.push(if duplicate {
            Err(ScheduleError::Duplicate(name))
        } else {
            entry
        });
        self
    }

    /// Records metrics with `meter` instead of the global meter provider.
    pub fn meter(mut self, meter: opentelemetry::metrics::Meter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// Installs an observer of commits and stale rejections.
    pub fn observer(mut self, observer: Arc<dyn WorkerObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Connects to PostgreSQL, NATS (creating streams and the consumer if needed)
    /// and etcd (granting the session), then starts the actor tree.
    ///
    /// The schema is not migrated here: call [`crate::Client::migrate`] once.
    /// The worker records its way of owning jobs ([`Config::partitions`]) if
    /// the namespace has none yet, and refuses to start under another one.
    ///
    /// # Errors
    /// Invalid configuration, no or duplicate job types,
    /// [`FenceError::PartitionsChanged`] (as [`WorkerError::Fence`]), or a
    /// server that cannot be reached.
    pub async fn start(mut self) -> Result<Worker, WorkerError> {
        let schedules = self.checked()?;
        let cfg = self.cfg;
        let metrics = match &self.meter {
            Some(m) => Metrics::new(m, &cfg.worker_id),
            None => Metrics::global(&cfg.worker_id),
        };
        let store = FenceStore::connect(&cfg).await?;
        // Recorded or matched here, once: the record never changes, so every
        // publish of this worker (the scheduler's due jobs, a compensation's
        // republish) uses the namespace's way of owning jobs for its life.
        store.record_partitions(cfg.partitions).await?;
        let queue = Queue::provision(&cfg).await?;
        let schedules = register_schedules(&store, &queue, schedules).await?;
        let routes = routes::TypeRoutes::new(self.registry.routes());
        let owning = owning::Owning::new(&cfg);
        owning.open(&queue, &routes).await?;
        let first = Session::establish(&cfg).await?;
        let stops = Stops::default();
        let mut tasks = tokio::task::JoinSet::new();
        let locks = LockService::start(
            stops.stop_all.clone(),
            metrics.clone(),
            cfg.tuning,
            &mut tasks,
        );
        let (current_tx, current_rx) = watch::channel(None);
        let fleet = fleet::Fleet::new(self.registry.fleet_limits());
        let shared = Arc::new(Shared {
            cfg: cfg.clone(),
            store,
            queue,
            registry: self.registry,
            metrics: metrics.clone(),
            locks,
            session: current_rx,
            draining: stops.draining.clone(),
            stop_jobs: stops.stop_jobs.clone(),
            observer: self.observer,
            holding: Default::default(),
            cancels: Default::default(),
            owning,
            pauses: Default::default(),
            fleet,
        });
        // Before the first fetch: a type paused now is not fetched at start.
        if !shared.pauses.refresh(&shared).await {
            tracing::warn!("cannot read the paused job types at start; assuming none");
        }
        let slots = Slots::new(&cfg);
        let keeper = KeeperArgs {
            cfg,
            metrics,
            current: current_tx,
            stop: stops.stop_all.clone(),
            first: Some(first),
        };
        let parts = Parts {
            shared: shared.clone(),
            slots: slots.clone(),
            routes,
            keeper,
            schedules,
        };
        let life = Lifecycle::spawn(stops, tasks, parts).await?;
        Ok(Worker {
            shared,
            slots,
            life,
        })
    }

    /// The builder's own checks, before anything connects: the configuration,
    /// the job types and their limits, the schedules (returned).
    fn checked(&mut self) -> Result<Vec<(Parsed, &'static str, serde_json::Value)>, WorkerError> {
        self.cfg.validate()?;
        if let Some(name) = self.duplicate {
            return Err(WorkerError::DuplicateJob(name));
        }
        if self.registry.is_empty() {
            return Err(WorkerError::NoJobs);
        }
        if let Some(name) = self.registry.zero_limit() {
            return Err(WorkerError::ZeroLimit(name));
        }
        if let Some((name, _)) = self
            .registry
            .fleet_limits()
            .into_iter()
            .find(|&(_, n)| n == 0)
        {
            return Err(WorkerError::ZeroFleetLimit(name));
        }
        if let Some(name) = self.registry.bad_rate() {
            return Err(WorkerError::BadRate(name));
        }
        std::mem::take(&mut self.schedules)
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(WorkerError::from)
    }
}

/// Writes each schedule's definition to its row (for operators and the
/// leader's last tick); returns the parsed schedules.
async fn register_schedules(
    store: &FenceStore,
    queue: &Queue,
    entries: Vec<(Parsed, &'static str, serde_json::Value)>,
) -> Result<Vec<Parsed>, WorkerError> {
    let mut parsed = Vec::with_capacity(entries.len());
    for (p, job_type, input) in entries {
        // Every tick's message carries this input: one too large for the
        // server (or a bad type) is refused before the schedule is stored,
        // not found at each tick as a row no message runs. A tick's job id
        // has the same length whatever its key.
        let len = serde_json::to_vec(&input).map_or(0, |v| v.len());
        let tick = crate::JobId::from_key(job_type, p.def.name());
        queue.check_job_message(tick, job_type, len)?;
        let row = crate::fence::ScheduleRow {
            name: p.def.name().to_string(),
            job_type: job_type.to_string(),
            expr: p.def.expr().to_string(),
            time_zone: p.def.zone().to_string(),
            missed: p.def.policy().as_text(),
            input,
            last_tick: None,
            next_tick: None,
            enqueued: 0,
            skipped: 0,
            created_at: chrono::Utc::now(),
            paused_at: None,
            paused_by: None,
            resumed_at: None,
        };
        store.upsert_schedule(&row).await?;
        parsed.push(p);
    }
    Ok(parsed)
}

/// A running worker: its actor tree, session and connections.
///
/// Dropping a `Worker` without [`Worker::shutdown`] stops its actors abruptly; the
/// jobs it held are taken over after the session TTL.
///
/// ```no_run
/// # async fn demo<J: tenure::Job>(job: J) -> Result<(), Box<dyn std::error::Error>> {
/// use tenure::blocks::lease::Health;
/// use tenure::Worker;
///
/// let worker = Worker::builder(tenure::Config::from_env()?).register(job).start().await?;
/// assert_eq!(worker.health(), Health::Healthy);
/// tokio::signal::ctrl_c().await?;
/// worker.shutdown().await?; // finish running steps, release, revoke the session
/// # Ok(()) }
/// ```
pub struct Worker {
    shared: Arc<Shared>,
    slots: Arc<Slots>,
    /// Every task and actor the worker spawned, and their stops.
    life: Lifecycle,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.shared.cfg.worker_id)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A builder for a worker with configuration `cfg`.
    pub fn builder(cfg: Config) -> WorkerBuilder {
        WorkerBuilder {
            cfg,
            registry: Registry::default(),
            duplicate: None,
            meter: None,
            observer: None,
            schedules: Vec::new(),
        }
    }

    /// This worker's id.
    pub fn id(&self) -> &str {
        &self.shared.cfg.worker_id
    }

    /// The current session's health (`Lost` while no session exists).
    pub fn health(&self) -> Health {
        self.shared
            .session
            .borrow()
            .as_ref()
            .map_or(Health::Lost, |s| s.health())
    }

    /// Jobs running right now (past their lock; deliveries fetched ahead and
    /// waiting for a run slot are not counted).
    pub fn in_flight(&self) -> usize {
        self.slots.running()
    }

    /// A handle on this worker's liveness and readiness that outlives it,
    /// for a probe server (`probe::ProbeServer`, feature `http`).
    pub fn probe(&self) -> WorkerProbe {
        self.life.probe(&self.shared)
    }

    /// Whether this worker can do work now, per check: see [`Readiness`]
    /// (and [`WorkerProbe::readiness`]).
    pub async fn readiness(&self) -> Readiness {
        self.probe().readiness().await
    }

    /// Runs until the process gets `SIGTERM` or `SIGINT`, then shuts down
    /// gracefully ([`Worker::shutdown`]: running jobs stop at their next
    /// step boundary within [`Config::shutdown_grace`] and are released, so
    /// the next owner counts no takeover). Make the orchestrator's grace
    /// period (Kubernetes' `terminationGracePeriodSeconds`) longer than
    /// `shutdown_grace`.
    ///
    /// ```no_run
    /// # async fn demo<J: tenure::Job>(job: J) -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = tenure::Worker::builder(tenure::Config::from_env()?)
    ///     .register(job)
    ///     .start()
    ///     .await?;
    /// worker.run_until_signal().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`WorkerError::Signal`] if the signal handlers cannot be installed
    /// (the worker is shut down then too).
    #[cfg(unix)]
    pub async fn run_until_signal(self) -> Result<(), WorkerError> {
        use tokio::signal::unix::{SignalKind, signal};
        let handlers = signal(SignalKind::terminate())
            .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
        let (mut term, mut int) = match handlers {
            Ok(h) => h,
            Err(e) => {
                self.shutdown().await?;
                return Err(WorkerError::Signal(e));
            }
        };
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(
            signal = name,
            grace = ?self.shared.cfg.shutdown_grace,
            "signal received: shutting down gracefully"
        );
        self.shutdown().await
    }

    /// Graceful shutdown: stop fetching; let running steps finish (a job stops
    /// between steps and is released voluntarily, so the next owner counts no
    /// takeover) up to `Config::shutdown_grace`; then cancel the steps still
    /// running; revoke the session (deleting every lock still held); stop the actors.
    ///
    /// # Errors
    /// Never fails today; the `Result` leaves room for reporting.
    pub async fn shutdown(mut self) -> Result<(), WorkerError> {
        self.life.shutdown(&self.shared, &self.slots).await;
        Ok(())
    }
}
