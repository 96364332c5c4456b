//! # Tenure: fenced, quorum-leased multi-step jobs
//!
//! Tenure runs critical multi-step jobs (ledger mutations, infrastructure
//! provisioning) on many workers so that a worker that was paused, partitioned or
//! slow can never commit on top of the worker that replaced it.
//!
//! A TTL lock alone cannot promise that: the holder can stop for longer than the
//! TTL (a GC pause, a disk stall, a suspended VM), the lock expires, another worker
//! takes the job, and the first one wakes up and writes too. Tenure closes the gap
//! with two mechanisms:
//! 1. a **quorum lease** in etcd per worker, kept alive in the background, with a
//!    health state (`Healthy`, `Degraded`, `Lost`) and a watchdog that cancels the
//!    worker's running steps when the lease is lost;
//! 2. a **fencing token** per job owner (the etcd `create_revision` of the job's
//!    lock key, larger for every new owner) that the resource, PostgreSQL, checks
//!    in the same transaction as every write. A stale owner's writes are refused.
//!
//! # What a job is
//! A job type is an `impl` block of async **steps** marked with
//! [`#[tenure::job]`](macro@job). Steps run in order; the output of step *k* is
//! the input of step *k + 1* and is checkpointed in the job's row in PostgreSQL
//! when step *k* commits. A **job** is one instance of a job type, named by a
//! [`JobId`] that the enqueuer's idempotency key determines (same key, same job).
//! If its worker dies, the next owner resumes at the first uncommitted step.
//!
//! Each step receives a [`StepCtx`]:
//! * [`StepCtx::db`]: the step's **fenced transaction**. Its writes commit if and
//!   only if the step's checkpoint does, and only while this owner holds the
//!   newest token.
//! * [`StepCtx::idempotency_key`]: a key for an external call that cannot check a
//!   token (a payment API, an email provider); the same for every owner and retry.
//! * [`StepCtx::fence_headers`]: the owner's fence, for a downstream service that
//!   enforces fences on its own writes (with [`fence::TokenGate`]).
//! * [`StepCtx::cancellation`] and [`StepCtx::guard`]: cancelled when the lease is
//!   lost or the worker shuts down.
//!
//! # The protocol in brief
//! For every delivered message a worker: looks up the job row (a finished job is
//! acked and skipped); **acquires** the job lock in etcd under its session lease
//! (held by another worker: retry later); **claims** the fence in PostgreSQL,
//! `UPDATE jobs SET fence = $token WHERE fence < $token`, before any work (zero rows:
//! a newer owner exists, stop); checks the job is not **poison** (too many lost
//! owners: dead-letter it); **runs the steps** from the row's step onward, each in
//! a transaction that starts by locking the row under `fence = $token AND step = $k`
//! and ends by advancing the step; then **acks** the message and deletes the lock.
//! The full protocol, with its guarantees and non-guarantees, is in
//! [`guide::protocol`].
//!
//! # A complete example
//! A two-step job, a worker that runs it and a producer that enqueues it. It needs
//! etcd, NATS JetStream and PostgreSQL (set `TENURE_ETCD_ENDPOINTS`,
//! `TENURE_NATS_URL`, `TENURE_DATABASE_URL`, or start the embedded dev stack with
//! the `devstack` feature as the examples do), so it is compiled, not run, here.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use tenure::Worker;
//! use tenure::{Client, Config, StepCtx, StepError};
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! struct Order { id: String, cents: i64 }
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! struct Charged { order: String, payment: String }
//!
//! /// Shared by every running job of this type (hold clients, pools, ...).
//! struct Checkout;
//!
//! #[tenure::job(name = "shop.checkout", retries = 3)]
//! impl Checkout {
//!     /// An external call that cannot check a token: send a stable key.
//!     #[step]
//!     async fn charge(&self, ctx: &mut StepCtx, order: Order) -> Result<Charged, StepError> {
//!         let key = ctx.idempotency_key("charge"); // same for every owner and retry
//!         let payment = format!("pay-{key}"); // e.g. payments.charge(&key, order.cents).await?
//!         Ok(Charged { order: order.id, payment })
//!     }
//!
//!     /// A database write: fenced, committed together with the step's checkpoint.
//!     #[step]
//!     async fn record(&self, ctx: &mut StepCtx, c: Charged) -> Result<(), StepError> {
//!         sqlx::query("UPDATE orders SET paid = true, payment = $2 WHERE id = $1")
//!             .bind(&c.order)
//!             .bind(&c.payment)
//!             .execute(ctx.db().await?)
//!             .await?;
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let cfg = Config::from_env()?;
//!     let client = Client::connect(&cfg).await?;
//!     client.migrate().await?; // once, idempotent
//!
//!     let worker = Worker::builder(cfg).register(Checkout).start().await?;
//!     let order = Order { id: "o-1".into(), cents: 1_250 };
//!     let job = client.enqueue::<Checkout>("order-o-1", &order).await?;
//!     println!("enqueued job {} (duplicate: {})", job.job_id, job.duplicate);
//!
//!     // An operator changes their mind: the owner's `ctx.cancellation()` fires,
//!     // its running step rolls back, and no later step runs.
//!     let cancelled = client.cancel(job.job_id, "order withdrawn").await?;
//!     println!("{cancelled:?}"); // Now, or Already on a second call
//!     // ... serve until told to stop, then let running steps finish:
//!     worker.shutdown().await?;
//!     Ok(())
//! }
//! ```
//!
//! # Later, and on a schedule
//! [`Client::enqueue_after`] and [`Client::enqueue_at`] delay a job: its row holds
//! `run_at`, nothing is published until it is due, and the namespace's elected
//! scheduler leader (one worker, elected through etcd and fenced in PostgreSQL
//! like a job owner) publishes due jobs in batches.
//! [`WorkerBuilder::schedule`] enqueues a job at every tick of a cron
//! expression, once per tick across the fleet (the tick is the idempotency key).
//!
//! ```no_run
//! # use tenure::{StepCtx, StepError};
//! # struct Report;
//! # #[tenure::job(name = "reports.daily")]
//! # impl Report {
//! #     #[step]
//! #     async fn build(&self, _ctx: &mut StepCtx, day: String) -> Result<(), StepError> { Ok(()) }
//! # }
//! use std::time::Duration;
//! use tenure::{Client, Config, MissedTicks, Schedule, Worker};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = Config::from_env()?;
//! let client = Client::connect(&cfg).await?;
//! // Runs in ten minutes, not before; the same key again is a duplicate.
//! client.enqueue_after::<Report>("report-2026-12-01", &"2026-12-01".to_string(), Duration::from_secs(600)).await?;
//!
//! // Every day at 06:00 in New York; missed days are skipped (the default).
//! let worker = Worker::builder(cfg)
//!     .register(Report)
//!     .schedule::<Report>("daily-report", "0 0 6 * * *", &"today".to_string())
//!     .schedule_with::<Report>(
//!         Schedule::new("ny-report", "0 0 6 * * *")
//!             .in_time_zone("America/New_York")
//!             .missed(MissedTicks::CatchUp { max: 3 }),
//!         &"today".to_string(),
//!     )
//!     .start()
//!     .await?;
//! # worker.shutdown().await?; Ok(()) }
//! ```
//!
//! Two runnable demos live in the repository's `examples/` package:
//! `cargo run --example ledger` (a paused worker is fenced out of a money
//! transfer) and `cargo run --example provisioning` (idempotency keys and a fence
//! enforced by a downstream service).
//!
//! # Guides
//! * [`guide::getting_started`]: the dev stack, a first job, running it, testing it.
//! * [`guide::protocol`]: the protocol step by step, what it guarantees and what it
//!   does not.
//! * [`guide::testing`]: testing your own jobs against real servers and real
//!   faults (`#[tenure::test]`, fault plans, the history checker).
//! * [`guide::production`]: sizing the lease TTL, running etcd, NATS and PostgreSQL
//!   clusters, and what the metrics mean.
//! * [`guide::deployment`]: probes, the shutdown grace period, a migrations job,
//!   the roles, sizing and upgrades; the repository's `deploy/` compose file.
//! * [`guide::configuration`]: every `TENURE_*` variable, its value and default
//!   (generated from [`config::SETTINGS`]).
//!
//! # The public face
//! What an application uses is at the crate root:
//! - [`Worker`] (built with [`Worker::builder`]) runs jobs; [`WorkerObserver`] sees
//!   every commit and refusal; [`Health`] is its lease's state;
//!   [`Worker::readiness`] ([`Readiness`]) and [`Worker::probe`] ([`WorkerProbe`])
//!   answer an orchestrator's probes, served over HTTP by `probe::ProbeServer`
//!   (feature `http`); [`Worker::run_until_signal`] shuts down on `SIGTERM`.
//! - [`Schedule`], [`MissedTicks`], [`ScheduleError`]: cron schedules for
//!   [`WorkerBuilder::schedule_with`].
//! - [`Client`]: migrate, enqueue (now, [after a delay](Client::enqueue_after),
//!   [at a time](Client::enqueue_at)), inspect ([`JobRow`], [`JobStatus`]), redrive dead
//!   letters, cancel a job ([`Client::cancel`], [`Cancelled`]), and guard your own
//!   tables ([`Client::install_guard`]).
//! - [`Config`] (module [`config`]): every name, timeout and tuning number, from code
//!   or the environment.
//! - [`Job`], [`StepCtx`], [`StepError`] (module [`job`](mod@job)) and the
//!   [`job`](macro@job) / [`step`] attributes: writing jobs.
//! - [`JobId`], [`FencingToken`], [`ObservedFence`], [`StepIndex`], [`LeaseId`]: ids and tokens.
//! - `MySqlFence` (feature `mysql`): a MySQL/MariaDB database your steps write to
//!   with the same fence ([`StepCtx::mysql`](crate::StepCtx)).
//! - [`TokenGate`] over [`PgFenceMarks`] ([`GateError`], [`StaleToken`]): a downstream
//!   service that enforces fences on its own writes.
//! - [`security`]: TLS files and credentials for etcd, NATS and PostgreSQL
//!   ([`guide::production`], Security), and [`security::AccessError`], what a
//!   refusing server becomes.
//! - [`telemetry`]: exporters (`otlp`, `prometheus` features) and span names.
//! - `testing` (feature `testing`, tests only): `#[tenure::test]`, fault plans and
//!   the history checker for your own jobs ([`guide::testing`]).
//! - `devstack` (feature `devstack`): real etcd, NATS and PostgreSQL servers as child
//!   processes, for tests and demos.
//!
//! [`blocks`] holds the building blocks the runtime is made of (each the only code
//! that talks to its server: [`blocks::lease`] to etcd, [`blocks::fence`] to
//! PostgreSQL, [`blocks::queue`] to NATS), for tools and advanced users; an
//! application needs none of it.
//!
//! **Stability.** The crate root and the public modules above are the API:
//! before 1.0 an incompatible change comes only with a minor release (0.1 to
//! 0.2), named in `CHANGELOG.md`. [`blocks`] may change in any minor release.
//! The `testing` and `devstack` features are for tests and demos
//! (`[dev-dependencies]`), never for production.
//!
//! # Feature flags
//! | feature | default | what it enables |
//! |---|---|---|
//! | `devstack` | off | the `devstack` module: starts a 3-member etcd cluster, NATS JetStream and PostgreSQL as child processes on loopback ports, with fault injection (pause, kill, restart a member). For tests, examples and benchmarks. |
//! | `testing` | off | for tests only: `tenure::testing` (with `devstack`: `#[tenure::test]`, `TestEnv`, worker processes; always: `FaultPlan`, applied by the runtime at named points of jobs, and the `History` checker) and test-only constructors (`FencingToken::for_tests`, `StepCtx::detached_for_tests`). Never enable it in production. |
//! | `otlp` | off | `telemetry::otlp`: push metrics to an OpenTelemetry collector over gRPC (opentelemetry-otlp). |
//! | `prometheus` | off | `telemetry::prometheus`: a Prometheus scrape endpoint (`GET /metrics`) for the worker's metrics. |
//! | `http` | off | `probe::ProbeServer`: a worker's `GET /livez` and `GET /readyz` (and, with `prometheus`, `GET /metrics`) on one listener, for an orchestrator's probes. |
//! | `mysql` | off | `fence::mysql` and `StepCtx::mysql`: a MySQL/MariaDB database as a fenced resource (sqlx's MySQL driver, rustls); with `devstack`, `DevStackOptions::mariadb`. |

pub mod blocks;
mod client;
pub mod config;
#[cfg(feature = "testing")]
mod faults;
mod handover;
pub mod job;
#[cfg(feature = "http")]
pub mod probe;
mod retry;
mod runtime;
mod schedule;
pub mod security;
mod steps;
pub mod telemetry;
mod types;

pub(crate) use blocks::{fence, lease, queue};

#[cfg(feature = "devstack")]
pub mod devstack;
#[cfg(feature = "testing")]
pub mod testing;

/// Guides: longer documentation, kept in `framework/src/docs/*.md`.
pub mod guide {
    #[doc = include_str!("docs/getting_started.md")]
    pub mod getting_started {}
    #[doc = include_str!("docs/protocol.md")]
    pub mod protocol {}
    #[doc = include_str!("docs/production.md")]
    pub mod production {}
    #[doc = include_str!("docs/deployment.md")]
    pub mod deployment {}
    #[doc = include_str!("docs/configuration.md")]
    pub mod configuration {}
    #[doc = include_str!("docs/security.md")]
    pub mod security {}
    #[doc = include_str!("docs/testing.md")]
    #[doc = "```rust,ignore"]
    #[doc = include_str!("docs/testing_example.rs")]
    #[doc = "```"]
    pub mod testing {}
}

pub use client::{
    BatchError, Client, ClientError, EnqueueItemError, EnqueueOptions, Enqueued, ItemResult,
    MAX_CANCEL_REASON, MAX_TRIGGER_ID,
};
pub use config::Config;
#[cfg(feature = "mysql")]
pub use fence::mysql::{MySqlFence, MySqlFenceError, MySqlFencedTx};
pub use fence::{
    Cancelled, GateError, JobRow, JobStatus, PgFenceMarks, StaleToken, TokenGate, WrongState,
};
pub use job::{DeadJob, Job, StepCtx, StepError};
pub use lease::Health;
pub use runtime::{
    JobLimits, READINESS_TIMEOUT, Readiness, ReadinessCheck, Worker, WorkerBuilder, WorkerError,
    WorkerObserver, WorkerProbe,
};
pub use schedule::{MissedTicks, Schedule, ScheduleError};
/// `#[tenure::test]` (feature `testing`; the tests it makes need `devstack`
/// too): see `tenure::testing` and the guide [`guide::testing`].
#[cfg(feature = "testing")]
pub use tenure_macros::test;
pub use tenure_macros::{job, step};
pub use types::{
    FencingToken, InvalidFence, JobId, LeaseId, ObservedFence, Priority, StepIndex, UnknownPriority,
};

/// Items used by code that `#[tenure::job]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use serde_json;
}
