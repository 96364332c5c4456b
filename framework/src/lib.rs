//! # Tenure: fenced, quorum-leased multi-step jobs
//!
//! Tenure runs critical multi-step jobs (ledger mutations, infrastructure
//! provisioning) on many workers so that a worker that was paused, partitioned or
//! slow can never commit on top of the worker that replaced it.
//!
//! Two mechanisms close the gap that TTL locks leave open:
//! 1. a **quorum lease** in etcd per worker, kept alive in the background, with a
//!    health state (`Healthy`, `Degraded`, `Lost`) and a watchdog;
//! 2. a **fencing token** per job (the etcd `create_revision` of the job's lock key)
//!    that the resource, PostgreSQL, checks in the same transaction as every write.
//!
//! ## Modules
//! - [`lease`]: sessions, job locks and fencing tokens (the only code that talks to etcd).
//! - [`fence`]: job rows and fenced transactions (the only code that writes job rows).
//! - [`queue`]: JetStream delivery, enqueue idempotency, DLQ (the only code that talks to NATS).
//! - [`config`]: every timeout and name, from code or environment.
//! - [`devstack`] (feature `devstack`): real servers as child processes, for tests and demos.
//!
//! ## Feature flags
//! - `devstack`: the embedded dev stack ([`devstack`]).
//! - `testing`: test-only constructors (raw fencing tokens). Never in production.
//! - `otlp`: push metrics to an OpenTelemetry collector (`telemetry::otlp`).
//! - `prometheus`: a Prometheus scrape endpoint (`telemetry::prometheus`).

mod client;
pub mod config;
pub mod fence;
pub mod job;
pub mod lease;
pub mod queue;
pub mod retry;
pub mod runtime;
pub mod telemetry;
pub mod types;

#[cfg(feature = "devstack")]
pub mod devstack;

pub use client::{Client, ClientError, Enqueued};
pub use config::Config;
pub use job::{Job, StepCtx, StepError};
pub use tenure_macros::{job, step};
pub use types::{FencingToken, JobId, LeaseId, StepIndex};

/// Items used by code that `#[tenure::job]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use serde_json;
}
