//! What a `#[tenure::test]` asked for ([`TestSpec`]), what the kit may fail
//! with ([`TestError`]) and the short backoffs of a test's workers
//! ([`short_backoffs`]): shared by `env.rs` (in-process workers) and `process.rs`
//! (worker processes), below both.

use std::time::Duration;

use futures::future::BoxFuture;

use super::history::CheckError;
use crate::faults::Fault;
use crate::{ClientError, Config, JobId, JobStatus, WorkerBuilder};

/// How a `#[tenure::test]` asked to be run (built by the attribute).
#[derive(Debug, Clone, Copy)]
pub struct TestSpec {
    /// `module_path!()::name` of the test function.
    pub path: &'static str,
    /// The lease TTL of its workers, in seconds.
    pub ttl_secs: u64,
    /// Whether it starts a dev stack of its own (for server faults) instead of
    /// sharing the test binary's.
    pub own_stack: bool,
    /// What a worker process of this test runs (`worker = path` argument: an
    /// `async fn(Config) -> WorkerBuilder`).
    pub worker: Option<WorkerFn>,
    /// The partition count its namespace is migrated with (`partitions = N`
    /// argument); `None`: one lock per job.
    pub partitions: Option<u32>,
}

/// A test's worker function, boxed: `worker = path` of `#[tenure::test]`.
pub type WorkerFn = fn(Config) -> BoxFuture<'static, WorkerBuilder>;

impl TestSpec {
    /// The test's name as libtest knows it (the module path without the crate).
    pub(super) fn test_name(&self) -> &'static str {
        self.path
            .split_once("::")
            .map_or(self.path, |(_, rest)| rest)
    }
}

/// Why a test's environment could not do what it was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestError {
    /// The dev stack did not start.
    #[error("dev stack: {0}")]
    Stack(String),
    /// A client call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A worker did not start.
    #[error(transparent)]
    Worker(#[from] crate::WorkerError),
    /// The history could not be checked.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// A job did not finish in time.
    #[error("job {job} not finished after {waited:?} (status {status:?})")]
    Timeout {
        /// The job.
        job: JobId,
        /// How long we waited.
        waited: Duration,
        /// Its last status (`None`: no row).
        status: Option<JobStatus>,
    },
    /// A fault this kind of worker cannot apply (e.g. a crash in process).
    #[error("fault {fault:?} cannot be applied {where_}: {hint}")]
    Unsupported {
        /// The fault.
        fault: Fault,
        /// In process or in a worker process.
        where_: &'static str,
        /// What to do instead.
        hint: &'static str,
    },
    /// `worker_process` without `#[tenure::test(worker = ...)]`.
    #[error("worker processes need #[tenure::test(worker = path::to::fn)]")]
    NoWorkerFn,
    /// [`TestEnv::run_step`](super::TestEnv::run_step) could not run or commit the step.
    #[error("run_step: {0}")]
    Step(String),
    /// A worker process could not be started or did not get ready.
    #[error("worker process: {0}")]
    Process(String),
}

/// Sets `cfg`'s contention and retry backoffs to 50 ms rising to 500 ms and
/// its session backoff to 100 ms rising to 1 s: tests wait for retries and
/// takeovers. The kit's workers (in process and worker processes) run with
/// these; a harness that builds its own `Config` (e.g. a torture binary's
/// worker) calls it to match them.
pub fn short_backoffs(cfg: &mut Config) {
    cfg.contention_backoff.base = Duration::from_millis(50);
    cfg.contention_backoff.cap = Duration::from_millis(500);
    cfg.retry_backoff.base = Duration::from_millis(50);
    cfg.retry_backoff.cap = Duration::from_millis(500);
    cfg.session_backoff.base = Duration::from_millis(100);
    cfg.session_backoff.cap = Duration::from_secs(1);
}
