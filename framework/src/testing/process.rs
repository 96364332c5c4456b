//! Worker processes of a `#[tenure::test]`: the test binary re-runs itself
//! with `--exact <test>` and [`CHILD_VAR`] set; [`super::run`] then serves the
//! test's `worker = ...` function as a worker instead of running the test body.
//!
//! The child speaks to the parent in stdout lines starting with [`PREFIX`]:
//! `ready`, `commit <job> <step> <token>`, `refused <job> <step> <token>`, and
//! `freeze <ms>` right before it stops itself with `SIGSTOP` (the parent sends
//! `SIGCONT` after that long), and `stopped` after its graceful shutdown. It
//! runs under `Worker::run_until_signal`: `SIGTERM` (or its stdin closing,
//! which raises `SIGTERM`) shuts it down gracefully.

use std::io::{BufRead as _, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::history::History;
use super::spec::{TestError, TestSpec, short_backoffs};
use crate::faults::{Fault, FaultHit, FaultPlan, FaultRule, Injector};
use crate::{FencingToken, JobId, StepIndex, WorkerObserver};

/// The environment variable that makes a test binary a worker process.
const CHILD_VAR: &str = "TENURE_TEST_WORKER";
/// The prefix of the child's protocol lines.
const PREFIX: &str = "tenure-kit ";

/// What a worker process is told (JSON in [`CHILD_VAR`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ChildSpec {
    test: String,
    namespace: String,
    etcd: Vec<String>,
    nats: String,
    database: String,
    ttl_ms: u64,
    partitions: Option<u32>,
    worker: String,
    rules: Vec<FaultRule>,
}

impl ChildSpec {
    pub(super) fn new(
        spec: &TestSpec,
        cfg: &crate::Config,
        id: &str,
        rules: Vec<FaultRule>,
    ) -> Self {
        ChildSpec {
            test: spec.path.to_string(),
            namespace: cfg.namespace.clone(),
            etcd: cfg.etcd_endpoints.clone(),
            nats: cfg.nats_url.clone(),
            database: cfg.database_url.clone(),
            ttl_ms: u64::try_from(cfg.lease_ttl.as_millis()).unwrap_or(u64::MAX),
            partitions: cfg.partitions,
            worker: id.to_string(),
            rules,
        }
    }

    /// The spec this process was started with, if it is a worker process of
    /// the test `spec`.
    pub(super) fn from_env(spec: &TestSpec) -> Option<Self> {
        let raw = std::env::var(CHILD_VAR).ok()?;
        let child: ChildSpec = serde_json::from_str(&raw).ok()?;
        (child.test == spec.path).then_some(child)
    }
}

/// Runs the worker of a worker process under `Worker::run_until_signal`
/// until it gets `SIGTERM` or its stdin closes.
pub(super) async fn serve(spec: TestSpec, child: ChildSpec) -> Result<(), TestError> {
    let build = spec.worker.ok_or(TestError::NoWorkerFn)?;
    let mut cfg = crate::Config::new(&child.namespace)
        .with_schema(&child.namespace)
        .with_etcd_endpoints(child.etcd.clone())
        .with_nats_url(child.nats.clone())
        .with_database_url(child.database.clone())
        .with_lease_ttl(Duration::from_millis(child.ttl_ms));
    short_backoffs(&mut cfg);
    if let Some(partitions) = child.partitions {
        cfg = cfg.with_partitions(partitions);
    }
    let mut cfg = cfg.with_worker_id(&child.worker);
    let mut plan = FaultPlan::new();
    for r in &child.rules {
        plan = plan.at(r.job, r.step, r.point, r.fault);
    }
    cfg.fault_plan = Some(plan.with_injector(Arc::new(SelfInjector)));
    let worker = build(cfg)
        .await
        .observer(Arc::new(Reporter))
        .start()
        .await?;
    // Installed before the stdin watcher can raise it: tokio keeps its
    // handler for the life of the process, so a SIGTERM never kills us.
    let _installed = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| TestError::Process(format!("SIGTERM handler: {e}")))?;
    say("ready");
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        // The parent closed our stdin (or died): the same graceful way out.
        let _ = nix::sys::signal::raise(Signal::SIGTERM);
    });
    worker.run_until_signal().await?;
    say("stopped");
    Ok(())
}

/// Prints one protocol line and flushes it (before a stop or an abort).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{PREFIX}{line}");
    let _ = out.flush();
}

/// The worker process's observer: its commits and refusals, to the parent.
struct Reporter;

impl WorkerObserver for Reporter {
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        say(&format!(
            "commit {} {} {}",
            job_id.as_uuid(),
            step.get(),
            token.get()
        ));
    }
    fn stale_rejected(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        say(&format!(
            "refused {} {} {}",
            job_id.as_uuid(),
            step.get(),
            token.get()
        ));
    }
}

/// Applies a worker process's faults to itself.
struct SelfInjector;

impl Injector for SelfInjector {
    fn inject(&self, hit: FaultHit) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            match hit.rule.fault {
                Fault::Crash => {
                    say("crash");
                    std::process::abort();
                }
                Fault::Freeze(d) => {
                    say(&format!("freeze {}", d.as_millis()));
                    // The whole process stops, keepalives included; the parent
                    // continues it.
                    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
                }
                other => tracing::error!(fault = ?other, "not applicable in a worker process"),
            }
        })
    }
}

/// A worker process of a test (see [`TestEnv::worker_process`](super::TestEnv::worker_process)):
/// killed (by its pid) and reaped when dropped.
#[derive(Debug)]
pub struct WorkerProcess {
    child: Mutex<Child>,
    pid: u32,
    lines: Arc<Mutex<Vec<String>>>,
}

impl WorkerProcess {
    pub(super) fn spawn(
        spec: &TestSpec,
        child: &ChildSpec,
        history: Arc<History>,
    ) -> Result<Self, TestError> {
        let exe = std::env::current_exe().map_err(|e| TestError::Process(e.to_string()))?;
        let json = serde_json::to_string(child).map_err(|e| TestError::Process(e.to_string()))?;
        let mut proc = Command::new(exe)
            .args([
                spec.test_name(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_VAR, json)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| TestError::Process(format!("spawn: {e}")))?;
        let out = proc
            .stdout
            .take()
            .ok_or_else(|| TestError::Process("no stdout".into()))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let pid = proc.id();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                // libtest's "test name ... " may precede the first line.
                if let Some((_, msg)) = line.split_once(PREFIX) {
                    handle(pid, msg, &history);
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(msg.to_string());
                }
            }
        });
        Ok(WorkerProcess {
            child: Mutex::new(proc),
            pid,
            lines,
        })
    }

    /// Waits for the worker's `ready` line.
    pub(super) async fn wait_ready(&self, timeout: Duration) -> Result<(), TestError> {
        if crate::devstack::wait_until(timeout, || async {
            self.has_line("ready") || self.exited()
        })
        .await
            && !self.exited()
        {
            return Ok(());
        }
        Err(TestError::Process(format!(
            "worker {} did not start: {:?}",
            self.pid,
            self.lines()
        )))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the worker said `line` (the kit's protocol lines, without the
    /// prefix: `ready`, `crash`, `freeze <ms>`, `commit ...`, `refused ...`,
    /// `stopped`).
    pub fn has_line(&self, line: &str) -> bool {
        self.lines().iter().any(|l| l.starts_with(line))
    }

    /// Every protocol line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the process has exited (a planned crash aborts it).
    pub fn exited(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        matches!(child.try_wait(), Ok(Some(_)))
    }

    /// Kills the worker (`SIGKILL`) and reaps it.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Sends the worker `SIGTERM` (by its pid): it shuts down gracefully
    /// (`Worker::run_until_signal`); waits for it to exit and returns how it
    /// exited (`None` if it could not be waited for).
    pub fn terminate(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let pid = Pid::from_raw(i32::try_from(self.pid).ok()?);
        if let Ok(None) = child.try_wait() {
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        }
        child.wait().ok()
    }

    /// Stops the whole worker (`SIGSTOP`, by its pid): keepalives included,
    /// as a long GC pause or a stopped VM would; [`WorkerProcess::resume`]
    /// continues it.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Continues a worker [`WorkerProcess::pause`] stopped (`SIGCONT`).
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    fn signal(&self, sig: Signal) {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
        }
    }

    /// Closes its stdin: the worker shuts down gracefully; waits for it.
    pub fn shutdown(&self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        drop(child.stdin.take());
        let _ = child.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Acts on a child's protocol line: records commits and refusals, continues
/// a frozen child after its freeze.
fn handle(pid: u32, msg: &str, history: &History) {
    let parts: Vec<&str> = msg.split(' ').collect();
    match parts[..] {
        ["freeze", ms] => {
            let ms = ms.parse::<u64>().unwrap_or(0);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(ms));
                let pid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
                let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
            });
        }
        [kind @ ("commit" | "refused"), job, step, token] => {
            let (Ok(job), Ok(step), Ok(token)) =
                (job.parse::<uuid::Uuid>(), step.parse(), token.parse())
            else {
                return;
            };
            let (job, step) = (JobId::from_uuid(job), StepIndex::new(step));
            if kind == "commit" {
                history.record_commit(job, step, token);
            } else {
                history.record_refusal(job, step, token);
            }
        }
        _ => {}
    }
}
