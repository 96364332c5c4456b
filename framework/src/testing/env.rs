//! [`TestEnv`]: what a `#[tenure::test]` gets, and [`run`], the harness the
//! attribute expands to (a worker process re-runs the same test binary; `run`
//! turns it into a worker instead of running the test body).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;

use super::history::{History, Report};
use super::process::{self, WorkerProcess};
use super::proxy::EtcdProxy;
use super::spec::{TestError, TestSpec, short_backoffs};
use crate::devstack::{DevStack, DevStackOptions};
use crate::faults::{Fault, FaultHit, FaultPlan, Injector};
use crate::{Client, Config, Job, JobId, JobRow, Worker, WorkerBuilder};

/// What a test function of `#[tenure::test]` may return: `()` or a `Result`
/// whose error is `Debug`.
pub trait TestResult {
    /// Panics (fails the test) on an error.
    fn finish(self);
}

impl TestResult for () {
    fn finish(self) {}
}

impl<E: std::fmt::Debug> TestResult for Result<(), E> {
    #[allow(clippy::panic)] // Fails the test, as `#[test]` does with an `Err`.
    fn finish(self) {
        if let Err(e) = self {
            panic!("the test returned an error: {e:?}");
        }
    }
}

/// Runs a `#[tenure::test]`: in a worker process, the worker; otherwise the
/// test body with a fresh [`TestEnv`].
#[allow(clippy::panic, clippy::expect_used)] // A test harness: failing is panicking.
pub fn run<F, Fut, R>(spec: TestSpec, body: F)
where
    F: FnOnce(TestEnv) -> Fut,
    Fut: Future<Output = R>,
    R: TestResult,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime for the test");
    if let Some(child) = process::ChildSpec::from_env(&spec) {
        if let Err(e) = rt.block_on(process::serve(spec, child)) {
            panic!("worker process of {}: {e}", spec.path);
        }
        return;
    }
    let env = match rt.block_on(TestEnv::start(spec)) {
        Ok(env) => env,
        Err(e) => panic!("#[tenure::test] {}: could not set up: {e}", spec.path),
    };
    rt.block_on(body(env)).finish();
}

/// The stack a test runs on: the test binary's shared one or its own.
#[derive(Debug, Clone)]
pub(super) enum StackRef {
    Shared(&'static DevStack),
    Own(Arc<DevStack>),
}

impl StackRef {
    fn get(&self) -> &DevStack {
        match self {
            StackRef::Shared(s) => s,
            StackRef::Own(s) => s,
        }
    }
}

/// A test's environment: the dev stack, a namespace and schema of its own
/// (migrated), a client and config, its [`History`], and ways to start
/// workers. See [`guide::testing`](crate::guide::testing).
pub struct TestEnv {
    spec: TestSpec,
    stack: StackRef,
    cfg: Config,
    client: Client,
    history: Arc<History>,
    fired: Arc<Mutex<Vec<FaultHit>>>,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("test", &self.spec.path)
            .field("namespace", &self.cfg.namespace)
            .finish_non_exhaustive()
    }
}

/// A `Config` for namespace `ns` (schema `ns`) on `stack` with lease TTL
/// `ttl`, with short backoffs (tests wait for retries).
fn config_for(stack: &DevStack, ns: &str, ttl: Duration) -> Config {
    let mut cfg = Config::new(ns)
        .with_schema(ns)
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_nats_url(stack.nats_url())
        .with_database_url(stack.database_url())
        .with_lease_ttl(ttl);
    short_backoffs(&mut cfg);
    cfg
}

impl TestEnv {
    async fn start(spec: TestSpec) -> Result<Self, TestError> {
        let stack = if spec.own_stack {
            let s = DevStack::start_with(DevStackOptions::default())
                .await
                .map_err(|e| TestError::Stack(e.to_string()))?;
            StackRef::Own(Arc::new(s))
        } else {
            StackRef::Shared(DevStack::shared().map_err(TestError::Stack)?)
        };
        let name = spec.test_name().rsplit("::").next().unwrap_or("t");
        let prefix: String = name.chars().take(20).collect();
        let ns = DevStack::unique_namespace(&format!("t_{prefix}"));
        let mut cfg = config_for(stack.get(), &ns, Duration::from_secs(spec.ttl_secs));
        if let Some(partitions) = spec.partitions {
            cfg = cfg.with_partitions(partitions);
        }
        let client = Client::connect(&cfg).await?;
        client.migrate().await?;
        Ok(TestEnv {
            spec,
            stack,
            cfg,
            client,
            history: History::new(),
            fired: Arc::default(),
        })
    }

    /// The client (connected, schema migrated).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The config every worker of this test starts from (with the test's
    /// `partitions = N`, if any: the way of owning jobs its namespace recorded).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The servers.
    pub fn stack(&self) -> &DevStack {
        self.stack.get()
    }

    /// The test's namespace, which is also its PostgreSQL schema.
    pub fn namespace(&self) -> &str {
        &self.cfg.namespace
    }

    /// The test's schema (where `jobs` and your own tables live).
    pub fn schema(&self) -> &str {
        self.client.store().schema()
    }

    /// A connection pool on the test's database.
    pub fn pool(&self) -> &sqlx::PgPool {
        self.client.store().pool()
    }

    /// Everything the test's workers committed and refused.
    pub fn history(&self) -> &Arc<History> {
        &self.history
    }

    /// The faults in-process workers applied so far (worker processes say
    /// theirs in [`WorkerProcess::lines`]).
    pub fn faults_fired(&self) -> Vec<FaultHit> {
        self.fired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Checks the history ([`History::check`]).
    ///
    /// # Errors
    /// [`TestError::Check`].
    pub async fn check(&self) -> Result<Report, TestError> {
        Ok(self.history.check(&self.client).await?)
    }

    /// Starts an in-process worker `id`: `build` (an `async fn(Config) ->
    /// WorkerBuilder`, e.g. the test's `worker = ...` function) registers its
    /// jobs on the test's config; the env installs the [`History`] as its
    /// observer.
    ///
    /// # Errors
    /// [`TestError::Worker`].
    pub async fn worker<F, Fut>(&self, id: &str, build: F) -> Result<Worker, TestError>
    where
        F: FnOnce(Config) -> Fut,
        Fut: Future<Output = WorkerBuilder>,
    {
        self.worker_with_faults(id, FaultPlan::new(), build).await
    }

    /// As [`TestEnv::worker`], with `plan`'s faults. In process, a worker can
    /// be cut from etcd ([`Fault::CutEtcd`]: its etcd traffic goes through a
    /// proxy of its own) and can restart PostgreSQL ([`Fault::RestartPostgres`],
    /// only with `own_stack`); crashes and freezes need a worker process.
    ///
    /// # Errors
    /// [`TestError::Unsupported`] for a fault it cannot apply;
    /// [`TestError::Worker`].
    pub async fn worker_with_faults<F, Fut>(
        &self,
        id: &str,
        plan: FaultPlan,
        build: F,
    ) -> Result<Worker, TestError>
    where
        F: FnOnce(Config) -> Fut,
        Fut: Future<Output = WorkerBuilder>,
    {
        let mut cfg = self.cfg.clone().with_worker_id(id);
        let injector = self.in_process_injector(&plan, &mut cfg).await?;
        if !plan.rules().is_empty() {
            cfg.fault_plan = Some(plan.with_injector(injector));
        }
        let observer: Arc<dyn crate::WorkerObserver> = self.history.clone();
        Ok(build(cfg).await.observer(observer).start().await?)
    }

    /// Checks `plan` for an in-process worker and builds its injector (with
    /// an etcd proxy in `cfg` when the plan cuts etcd).
    async fn in_process_injector(
        &self,
        plan: &FaultPlan,
        cfg: &mut Config,
    ) -> Result<Arc<InProcess>, TestError> {
        let mut proxy = None;
        for rule in plan.rules() {
            match rule.fault {
                Fault::Crash | Fault::Freeze(_) => {
                    return Err(TestError::Unsupported {
                        fault: rule.fault,
                        where_: "in process",
                        hint: "start a worker process (TestEnv::worker_process)",
                    });
                }
                Fault::RestartPostgres | Fault::PauseEtcdLeader(_) if !self.spec.own_stack => {
                    return Err(TestError::Unsupported {
                        fault: rule.fault,
                        where_: "on the shared dev stack",
                        hint: "use #[tenure::test(own_stack)]",
                    });
                }
                Fault::CutEtcd(_) if proxy.is_none() => {
                    let p = EtcdProxy::start(&cfg.etcd_endpoints)
                        .await
                        .map_err(|e| TestError::Process(format!("etcd proxy: {e}")))?;
                    cfg.etcd_endpoints = p.endpoints();
                    proxy = Some(p);
                }
                _ => {}
            }
        }
        Ok(Arc::new(InProcess {
            stack: self.stack.clone(),
            proxy,
            fired: self.fired.clone(),
        }))
    }

    /// Starts worker `id` as a child process (this test binary, running the
    /// test's `worker = ...` function), with `plan`'s faults: a crash aborts
    /// it, a freeze stops it whole (`SIGSTOP`) and the env continues it after
    /// the freeze. Its commits and refusals reach the env's [`History`].
    /// Returns once its worker started.
    ///
    /// # Errors
    /// [`TestError::NoWorkerFn`], [`TestError::Unsupported`] (etcd cuts and
    /// PostgreSQL restarts are for in-process workers), [`TestError::Process`].
    pub async fn worker_process(
        &self,
        id: &str,
        plan: FaultPlan,
    ) -> Result<WorkerProcess, TestError> {
        if self.spec.worker.is_none() {
            return Err(TestError::NoWorkerFn);
        }
        if let Some(rule) = plan.rules().into_iter().find(|r| {
            matches!(
                r.fault,
                Fault::CutEtcd(_) | Fault::RestartPostgres | Fault::PauseEtcdLeader(_)
            )
        }) {
            return Err(TestError::Unsupported {
                fault: rule.fault,
                where_: "in a worker process",
                hint: "use an in-process worker (TestEnv::worker_with_faults)",
            });
        }
        let child = process::ChildSpec::new(&self.spec, &self.cfg, id, plan.rules());
        let proc = WorkerProcess::spawn(&self.spec, &child, self.history.clone())?;
        proc.wait_ready(Duration::from_secs(60)).await?;
        Ok(proc)
    }

    /// Waits until job `id` is `done` (or ended otherwise: dead, cancelled)
    /// and returns its row. A failed read is retried until `timeout`: a test
    /// that restarts PostgreSQL (a fault plan's `RestartPostgres`) reads
    /// through the restart.
    ///
    /// # Errors
    /// [`TestError::Timeout`] if it is still pending or running after
    /// `timeout`; the read's error if the last read failed.
    pub async fn run_until_done(&self, id: JobId, timeout: Duration) -> Result<JobRow, TestError> {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let row = match self.client.job(id).await {
                Ok(row) => row,
                Err(e) if tokio::time::Instant::now() >= until => return Err(e.into()),
                Err(e) => {
                    tracing::debug!(job_id = %id, error = %e, "reading the job failed; retried");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            match row {
                Some(r) if r.status.is_terminal() => return Ok(r),
                _ if tokio::time::Instant::now() >= until => {
                    return Err(TestError::Timeout {
                        job: id,
                        waited: timeout,
                        status: row.map(|r| r.status),
                    });
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Job `id`'s result (`None` while unfinished), typed as `J`'s output.
    ///
    /// # Errors
    /// As [`Client::result`].
    pub async fn result<J: Job>(&self, id: JobId) -> Result<Option<J::Output>, TestError> {
        Ok(self.client.result::<J>(id).await?)
    }
}

/// Applies faults inside the test process.
struct InProcess {
    stack: StackRef,
    proxy: Option<EtcdProxy>,
    fired: Arc<Mutex<Vec<FaultHit>>>,
}

impl Injector for InProcess {
    fn inject(&self, hit: FaultHit) -> BoxFuture<'static, ()> {
        let stack = self.stack.clone();
        let cut = self.proxy.as_ref().map(EtcdProxy::cut_handle);
        self.fired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(hit);
        Box::pin(async move {
            match hit.rule.fault {
                Fault::CutEtcd(d) => match cut {
                    Some(cut) => {
                        cut.send_replace(true);
                        tokio::time::sleep(d).await;
                        cut.send_replace(false);
                    }
                    None => tracing::error!("no etcd proxy to cut"),
                },
                Fault::RestartPostgres => restart_postgres(stack.get()).await,
                Fault::PauseEtcdLeader(d) => pause_etcd_leader(stack, d).await,
                other => tracing::error!(fault = ?other, "not applicable in process; skipped"),
            }
        })
    }
}

/// Stops the etcd leader for `pause` and returns once it is stopped; a task
/// of its own continues it.
async fn pause_etcd_leader(stack: StackRef, pause: Duration) {
    let leader = match stack.get().etcd_leader().await {
        Ok(i) => i,
        Err(e) => return tracing::error!(error = %e, "no etcd leader to pause"),
    };
    if let Err(e) = stack.get().etcd_member(leader).pause() {
        return tracing::error!(error = %e, "pausing the etcd leader failed");
    }
    tokio::spawn(async move {
        tokio::time::sleep(pause).await;
        if let Err(e) = stack.get().etcd_member(leader).resume() {
            tracing::error!(error = %e, "resuming the etcd leader failed");
        }
    });
}

/// Restarts PostgreSQL and waits until it accepts connections.
async fn restart_postgres(stack: &DevStack) {
    if let Err(e) = stack.postgres().restart() {
        tracing::error!(error = %e, "restarting PostgreSQL failed");
        return;
    }
    if let Err(e) = stack.wait_ready(Duration::from_secs(60)).await {
        tracing::error!(error = %e, "PostgreSQL did not come back");
    }
}
