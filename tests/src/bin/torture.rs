//! The split-brain torture test: real processes, injected faults, a recorded
//! history and checkers that can fail.
//!
//! ```text
//! torture --jobs N --workers W --faults F --seed S [--ttl-secs T] [--unsafe-no-fencing]
//!         [--cancel FRACTION] [--partitions P] [--nats-cluster 3] [--fleet-max N]
//!         [--membership-faults] [--only KIND[,KIND...]]
//!         [--postgres-standby sync|async]
//! ```
//!
//! Starts its own dev stack (3 etcd members, NATS, PostgreSQL), W worker processes
//! (this binary re-executed with `worker`, dying with the parent through
//! `setpriv --pdeathsig KILL` and the close of their standard input), each
//! reaching etcd through a fault proxy of its own, and enqueues N transfers
//! between a fixed set of accounts (steps `debit`, `credit`, `settle`, each writing
//! to guarded tables in its fenced transaction and appending to `history` in the
//! same transaction). It injects F faults drawn from the seed, waits for
//! quiescence, then checks the history:
//!
//! * every `(job, step)` committed exactly once (`double_commits`);
//! * the tokens of a job's commits never decrease in commit order
//!   (`token_regressions`; commit order per job is `history.seq`, assigned while
//!   the job row is locked by the committing transaction);
//! * no job lost: every job `done` with all its steps in the history, or `dead`
//!   with a reason and present in the DLQ (`lost`);
//! * the ledger: each account's balance is its initial balance plus its history
//!   deltas, each done transfer moved exactly its amount once, money is conserved
//!   (`ledger_violations`);
//! * with `--cancel F`, the operator action `cancel`: a fraction F of the jobs
//!   is cancelled mid-run (`Client::cancel`, retried through the faults), and
//!   every cancelled job ends `cancelled` with its `cancelled` event, its
//!   applied steps exactly its committed ones (never partly committed), no
//!   history row written at or after the cancel, and every cancel call that
//!   returned has its row `cancelled` (`cancel_violations`; cancelled jobs
//!   count as ended, never as lost).
//!
//! Workers record every attempted commit: accepted ones (`C`) and refused stale
//! ones (`S`) in a file per worker process (through
//! [`WorkerObserver`](tenure::WorkerObserver)).
//!
//! `--partitions P` runs Tenure in partition mode (`Config::partitions`):
//! workers own partitions of the job type instead of locking each job, and two
//! more fault kinds move partitions while jobs are mid-step: `worker_join` (a
//! spare worker joins, or, if it is running, leaves gracefully and joins
//! again) and `worker_leave_graceful` (a worker shuts down gracefully, handing
//! its partitions over, and joins again after a moment).
//!
//! `--fleet-max N` runs the operators' controls (issue 35): both transfer types
//! limited fleet-wide to N jobs at once (`JobLimits::fleet_max`), and one more
//! fault kind, `operator_pause_type` (an operator pauses both transfer types
//! for 0.5 to 2.5 s, then resumes them, through `Client::pause`/`resume`).
//!
//! `--membership-faults` adds two etcd membership changes under load (issue
//! 36, `../torture/membership.rs`): `etcd_member_replace` (a member removed, a
//! fresh one added) and `etcd_grow_shrink` (3 -> 5 -> 3 members).
//! `--postgres-standby sync|async` (issue 36) gives PostgreSQL a streaming
//! standby behind a front every process connects to, and one more fault kind,
//! `postgres_failover` (`torture/pg_failover.rs`).
//!
//! `--unsafe-no-fencing` sets the test-only `Config::unsafe_no_fencing` in the
//! workers (fence predicates off, no pre-commit health check) and installs no
//! guards: the same schedule must then report violations. Exit status: 0 when the
//! checks pass (normal mode), or when violations were found (negative control).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tenure::devstack::DevStack;
use tenure::{Client, Config, FencingToken, JobId, StepCtx, StepError, StepIndex};
use tenure::{Worker, WorkerObserver};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

#[path = "../torture/cancel.rs"]
mod cancel;
#[path = "../torture/cron.rs"]
mod cron;
#[path = "../torture/membership.rs"]
mod membership;
#[path = "../torture/nats_state.rs"]
mod nats_state;
#[path = "../torture/pg_failover.rs"]
mod pg_failover;
#[path = "../torture/redis_lock.rs"]
mod redis_lock;
#[path = "../torture/resource.rs"]
mod resource;

use tenure::MySqlFence;

/// Number of accounts.
const ACCOUNTS: i32 = 16;
/// Initial balance of each account.
const INITIAL: i64 = 1_000_000;
/// Steps of a transfer (`--steps`, 3 or 5): set once at start, in the parent
/// and in every worker (which gets `--steps` from the parent).
static STEPS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(3);

/// The steps of a transfer in this run.
fn steps() -> i64 {
    STEPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets the run's steps from `--steps` (3 or 5).
fn set_steps(n: i64) -> anyhow::Result<()> {
    if n != 3 && n != 5 {
        bail!(
            "--steps must be 3 (debit, credit, settle) or 5 (debit, hold, credit, confirm, settle)"
        );
    }
    STEPS.store(n, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// The job type of this run's transfers.
fn transfer_type() -> &'static str {
    if steps() == 5 {
        "torture.transfer5"
    } else {
        "torture.transfer"
    }
}

/// The account step `k` moves money on, and by how much (`None`: a step
/// that writes only its history row): the debit first, the credit at the
/// middle step.
fn leg(k: i64, x: &Xfer) -> (Option<i32>, i64) {
    match k {
        0 => (Some(x.from), -x.amount),
        k if k == steps() / 2 => (Some(x.to), x.amount),
        _ => (None, 0),
    }
}

// ---------------------------------------------------------------------------
// The job.

/// A transfer request.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Xfer {
    from: i32,
    to: i32,
    amount: i64,
    /// Upper bound of the random delay before each step's database work.
    delay_ms: u64,
}

/// A three-step transfer; each step appends to `history` in its fenced transaction.
#[derive(Debug, Clone)]
struct Transfer {
    worker: String,
    schema: String,
    pause: PauseArm,
    /// `--target mariadb`: the accounts and history live there.
    mariadb: Option<MySqlFence>,
}

/// The `worker_sigstop` fault, aimed: armed by the parent, the worker stops
/// itself (SIGSTOP) at the next step that reaches its write (in redis-lock
/// mode: right after the lock check passed), the moment the seed's paused
/// holder is in. The parent arms every worker and disarms them once one has
/// stopped; an arm neither used nor disarmed within [`PauseArm::VALID`]
/// lapses (a safety net: a parent that died mid-fault).
#[derive(Debug, Clone, Default)]
struct PauseArm(Arc<Mutex<Option<std::time::Instant>>>);

impl PauseArm {
    const VALID: Duration = Duration::from_secs(60);

    fn arm(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }

    fn disarm(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Stops the process here if armed, first telling the parent (a line
    /// `PAUSED <job> <step>` on standard output) which job it stops in, so the
    /// parent can hold it until that job was taken over.
    /// Returns whether it stopped.
    fn stop_here_if_armed(&self, job: sqlx::types::Uuid, step: i64) -> bool {
        let armed = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if armed.is_none_or(|at| at.elapsed() >= Self::VALID) {
            return false;
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "PAUSED {job} {step}").and_then(|()| out.flush());
        drop(out);
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        true
    }

    /// The framework's stop: in a step after the first, and a moment's more
    /// work after waking before the write. Both make the waking owner's
    /// write certain, so the negative control always has one to catch:
    /// the transaction the runtime opened for the step before the stop died
    /// in PostgreSQL's idle-in-transaction timeout (one TTL, shorter than the stop),
    /// and a step that asked for it at once got that dead connection's error
    /// and wrote nothing (half of the runs; the moment lets the runtime end
    /// the expired offer first, so the step opens a transaction of its own);
    /// in step 0 that transaction carries the claim, whose loss cancels the
    /// step (`ctx.db()`: no write either). Seen as a negative control that
    /// caught nothing, 2026-12-07.
    async fn stop_before_write(&self, ctx: &StepCtx) {
        let step = ctx.step().get();
        if step > 0 && self.stop_here_if_armed(ctx.job_id().as_uuid(), i64::from(step)) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Transfer {
    async fn apply(
        &self,
        ctx: &mut StepCtx,
        x: &Xfer,
        account: Option<i32>,
        delta: i64,
    ) -> Result<(), StepError> {
        // Not bound to the cancellation token on purpose: a SIGSTOP lands mid-step
        // and the process carries on when it wakes, like after a GC pause.
        let ms = rand::rng().random_range(0..=x.delay_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.pause.stop_before_write(ctx).await;
        if let Some(bank) = &self.mariadb {
            return resource::apply_mariadb(ctx, bank, &self.worker, account, delta).await;
        }
        let (job, step, token) = (
            ctx.job_id().as_uuid(),
            i32::try_from(ctx.step().get()).unwrap_or(i32::MAX),
            ctx.token().get(),
        );
        let s = &self.schema;
        let db = ctx.db().await?;
        if let Some(a) = account {
            sqlx::query(&format!(
                "UPDATE {s}.accounts SET balance = balance + $2 WHERE id = $1"
            ))
            .bind(a)
            .bind(delta)
            .execute(&mut *db)
            .await?;
        }
        sqlx::query(&format!(
            "INSERT INTO {s}.history (job_id, step, token, worker, account, delta) \
             VALUES ($1, $2, $3, $4, $5, $6)"
        ))
        .bind(job)
        .bind(step)
        .bind(token)
        .bind(&self.worker)
        .bind(account)
        .bind(delta)
        .execute(&mut *db)
        .await?;
        Ok(())
    }
}

#[tenure::job(name = "torture.transfer", max_takeovers = 20, retries = 20)]
impl Transfer {
    #[step]
    async fn debit(&self, ctx: &mut StepCtx, x: Xfer) -> Result<Xfer, StepError> {
        self.apply(ctx, &x, Some(x.from), -x.amount).await?;
        Ok(x)
    }

    #[step]
    async fn credit(&self, ctx: &mut StepCtx, x: Xfer) -> Result<Xfer, StepError> {
        self.apply(ctx, &x, Some(x.to), x.amount).await?;
        Ok(x)
    }

    #[step]
    async fn settle(&self, ctx: &mut StepCtx, x: Xfer) -> Result<i64, StepError> {
        self.apply(ctx, &x, None, 0).await?;
        Ok(x.amount)
    }
}

/// The five-step transfer of `--steps 5` (the long run's shape): debit,
/// hold, credit, confirm, settle; the two new steps write only their history
/// row, like `settle`.
#[derive(Debug, Clone)]
struct Transfer5(Transfer);

#[tenure::job(name = "torture.transfer5", max_takeovers = 20, retries = 20)]
impl Transfer5 {
    #[step]
    async fn debit(&self, ctx: &mut StepCtx, x: Xfer) -> Result<Xfer, StepError> {
        self.0.apply(ctx, &x, Some(x.from), -x.amount).await?;
        Ok(x)
    }

    #[step]
    async fn hold(&self, ctx: &mut StepCtx, x: Xfer) -> Result<Xfer, StepError> {
        self.0.apply(ctx, &x, None, 0).await?;
        Ok(x)
    }

    #[step]
    async fn credit(&self, ctx: &mut StepCtx, x: Xfer) -> Result<Xfer, StepError> {
        self.0.apply(ctx, &x, Some(x.to), x.amount).await?;
        Ok(x)
    }

    #[step]
    async fn confirm(&self, ctx: &mut StepCtx, x: Xfer) -> Result<Xfer, StepError> {
        self.0.apply(ctx, &x, None, 0).await?;
        Ok(x)
    }

    #[step]
    async fn settle(&self, ctx: &mut StepCtx, x: Xfer) -> Result<i64, StepError> {
        self.0.apply(ctx, &x, None, 0).await?;
        Ok(x.amount)
    }
}

// ---------------------------------------------------------------------------
// Arguments.

#[derive(Debug, Clone)]
struct Args {
    jobs: usize,
    workers: usize,
    faults: usize,
    seed: u64,
    ttl: Duration,
    unsafe_no_fencing: bool,
    mode: RunMode,
    target: Target,
    delay_ms: u64,
    quiesce: Duration,
    /// Debugging: inject only this kind of fault.
    only: Option<String>,
    /// The operator action `cancel`: this fraction of the jobs is cancelled
    /// mid-run (`--cancel F`, 0 to 1).
    cancel: f64,
    /// Partition mode with this many partitions (`--partitions P`).
    partitions: Option<u32>,
    /// NATS as a JetStream cluster of this many nodes, streams at R3
    /// (`--nats-cluster 3`; 0 is one server), with the faults
    /// `nats_node_kill` and `nats_meta_leader_kill`.
    nats_cluster: usize,
    /// Both transfer types limited fleet-wide to this many jobs, and the
    /// fault `operator_pause_type` (`--fleet-max N`).
    fleet_max: Option<u32>,
    /// etcd membership changes: the faults `etcd_member_replace` and
    /// `etcd_grow_shrink` (`--membership-faults`).
    membership_faults: bool,
    /// PostgreSQL with a streaming standby replicating so, and the fault
    /// `postgres_failover` (`--postgres-standby sync|async`).
    postgres_standby: Option<tenure::devstack::Replication>,
}

fn parse_args(args: &[String]) -> anyhow::Result<Args> {
    let mut a = Args {
        jobs: 300,
        workers: 3,
        faults: 30,
        seed: 1,
        ttl: Duration::from_secs(2),
        unsafe_no_fencing: false,
        mode: RunMode::Fenced,
        target: Target::Postgres,
        delay_ms: 500,
        quiesce: Duration::from_secs(240),
        only: None,
        cancel: 0.0,
        partitions: None,
        nats_cluster: 0,
        fleet_max: None,
        membership_faults: false,
        postgres_standby: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .with_context(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--jobs" => a.jobs = val()?.parse()?,
            "--workers" => a.workers = val()?.parse()?,
            "--faults" => a.faults = val()?.parse()?,
            "--seed" => a.seed = val()?.parse()?,
            "--ttl-secs" => a.ttl = Duration::from_secs_f64(val()?.parse()?),
            "--delay-ms" => a.delay_ms = val()?.parse()?,
            "--quiesce-secs" => a.quiesce = Duration::from_secs(val()?.parse()?),
            "--unsafe-no-fencing" => a.mode = RunMode::Unfenced,
            "--mode" => a.mode = RunMode::parse(&val()?)?,
            "--target" => a.target = Target::parse(&val()?)?,
            "--only" => a.only = Some(val()?),
            "--cancel" => a.cancel = val()?.parse()?,
            "--partitions" => a.partitions = Some(val()?.parse()?),
            "--nats-cluster" => a.nats_cluster = val()?.parse()?,
            "--fleet-max" => a.fleet_max = Some(val()?.parse()?),
            "--membership-faults" => a.membership_faults = true,
            "--postgres-standby" => a.postgres_standby = Some(pg_failover::parse(&val()?)?),
            "--steps" => set_steps(val()?.parse()?)?,
            other => bail!("unknown argument {other:?}"),
        }
    }
    if !(0.0..=1.0).contains(&a.cancel) {
        bail!("--cancel must be a fraction between 0 and 1");
    }
    if a.workers < 2 {
        bail!("--workers must be at least 2 (a takeover needs a second worker)");
    }
    a.unsafe_no_fencing = a.mode == RunMode::Unfenced;
    if a.nats_cluster == 2 {
        bail!("--nats-cluster must be 0 or 1 (one server) or 3 or more (a quorum survives a node)");
    }
    if a.fleet_max.is_some() && a.mode == RunMode::RedisLock {
        bail!("--fleet-max limits Tenure's job types; --mode redis-lock runs none");
    }
    if a.membership_faults && a.mode == RunMode::RedisLock {
        bail!("--membership-faults changes etcd's members; --mode redis-lock uses no etcd");
    }
    if a.partitions.is_some() && a.mode == RunMode::RedisLock {
        bail!("--partitions runs Tenure; --mode redis-lock does not");
    }
    if a.target == Target::Mariadb && a.mode == RunMode::RedisLock {
        bail!("--mode redis-lock writes to PostgreSQL only (--target postgres)");
    }
    Ok(a)
}

/// What protects the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunMode {
    /// Tenure: etcd lease, fencing token checked by the resource.
    Fenced,
    /// Tenure with the fence predicates off (`--unsafe-no-fencing`).
    Unfenced,
    /// A Redis TTL lock, checked before each write, no token (`redis_lock.rs`).
    RedisLock,
}

impl RunMode {
    fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "fenced" => Ok(RunMode::Fenced),
            "unfenced" => Ok(RunMode::Unfenced),
            "redis-lock" => Ok(RunMode::RedisLock),
            other => bail!("--mode must be fenced, unfenced or redis-lock, not {other:?}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            RunMode::Fenced => "fenced",
            RunMode::Unfenced => "unfenced",
            RunMode::RedisLock => "redis-lock",
        }
    }

    /// A negative control: the run passes only if it finds violations.
    fn is_control(self) -> bool {
        self != RunMode::Fenced
    }
}

/// Where the transfers' accounts and history live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Postgres,
    Mariadb,
}

impl Target {
    fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "postgres" => Ok(Target::Postgres),
            "mariadb" => Ok(Target::Mariadb),
            other => bail!("--target must be postgres or mariadb, not {other:?}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Target::Postgres => "postgres",
            Target::Mariadb => "mariadb",
        }
    }
}

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Parent and worker children log the same way, to stderr.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if argv.first().map(String::as_str) == Some("worker") {
        return rt.block_on(worker_main(&argv[1..]));
    }
    let args = parse_args(&argv)?;
    let code = rt.block_on(parent_main(args))?;
    drop(rt);
    std::process::exit(code);
}

// ---------------------------------------------------------------------------
// The worker process.

struct Recorder {
    file: Mutex<std::fs::File>,
    crash_armed: AtomicBool,
}

impl Recorder {
    fn line(&self, kind: char, job_id: JobId, step: StepIndex, token: FencingToken) {
        self.raw(kind, job_id.as_uuid(), step.get(), token.get());
    }

    fn raw(
        &self,
        kind: char,
        job: impl std::fmt::Display,
        step: impl std::fmt::Display,
        token: i64,
    ) {
        if let Ok(mut f) = self.file.lock() {
            let _ = writeln!(f, "{kind} {job} {step} {token}");
        }
    }

    /// A commit (of the redis-lock mode, which has no token: 0), then the armed
    /// crash.
    fn committed(&self, job: sqlx::types::Uuid, step: i32) {
        self.raw('C', job, step, 0);
        self.crash_if_armed();
    }

    /// A write the redis-lock mode's lock check stopped.
    fn stale(&self, job: sqlx::types::Uuid, step: i32) {
        self.raw('S', job, step, 0);
    }

    fn crash_if_armed(&self) {
        if self.crash_armed.swap(false, Ordering::SeqCst) {
            // Killed between the step's commit and the message's ack.
            std::process::abort();
        }
    }
}

impl WorkerObserver for Recorder {
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        self.line('C', job_id, step, token);
        self.crash_if_armed();
    }
    fn stale_rejected(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        self.line('S', job_id, step, token);
    }
    fn token_regression(&self, job_id: JobId, token: FencingToken) {
        self.line('A', job_id, StepIndex::new(0), token);
    }
    fn partition_token_regression(&self, job_type: &str, partition: u32, token: FencingToken) {
        let what = format_args!("partition:{job_type}/{partition}");
        self.raw('A', what, 0, token.get());
    }
}

fn flag_value(args: &[String], name: &str) -> anyhow::Result<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .with_context(|| format!("worker: missing {name}"))
}

async fn worker_main(args: &[String]) -> anyhow::Result<()> {
    if let Ok(n) = flag_value(args, "--steps") {
        set_steps(n.parse()?)?;
    }
    let id = flag_value(args, "--id")?;
    let log = flag_value(args, "--log")?;
    let recorder = Arc::new(Recorder {
        file: Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .with_context(|| format!("open {log}"))?,
        ),
        crash_armed: AtomicBool::new(false),
    });
    let pause = PauseArm::default();
    let mode = RunMode::parse(&flag_value(args, "--mode")?)?;
    // Held until the process ends: dropping the worker stops it.
    let mut worker = if mode == RunMode::RedisLock {
        let runner = redis_runner(args, recorder.clone(), pause.clone()).await?;
        tokio::spawn(runner.run());
        None
    } else {
        Some(tenure_worker(args, recorder.clone(), pause.clone()).await?)
    };
    println!("READY {id}");
    let _ = std::io::stdout().flush();
    // Commands on stdin; its close (the parent is gone) ends the process.
    let mut stdin = TokioBufReader::new(tokio::io::stdin());
    let mut line = String::new();
    loop {
        line.clear();
        match stdin.read_line(&mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => match line.trim() {
                "crash-after-commit" => recorder.crash_armed.store(true, Ordering::SeqCst),
                "pause-before-write" => pause.arm(),
                "pause-disarm" => pause.disarm(),
                // A graceful leave: running steps finish, jobs are released,
                // the session (and every partition with it) revoked.
                "leave" => {
                    if let Some(w) = worker.take() {
                        w.shutdown().await?;
                    }
                    break;
                }
                _ => {}
            },
        }
    }
    std::process::exit(0);
}

/// A Tenure worker (modes fenced and unfenced) running the transfers.
async fn tenure_worker(
    args: &[String],
    recorder: Arc<Recorder>,
    pause: PauseArm,
) -> anyhow::Result<Worker> {
    let ns = flag_value(args, "--ns")?;
    let id = flag_value(args, "--id")?;
    let ttl = Duration::from_millis(flag_value(args, "--ttl-ms")?.parse()?);
    let mut cfg = Config::new(ns.clone())
        .with_schema(ns.clone())
        .with_etcd_endpoints(flag_value(args, "--etcd")?.split(','))
        .with_nats_url(flag_value(args, "--nats")?)
        .with_database_url(flag_value(args, "--db")?)
        .with_lease_ttl(ttl)
        .with_worker_id(id.clone());
    if let Ok(r) = flag_value(args, "--replicas") {
        cfg = cfg.with_stream_replicas(r.parse()?);
    }
    tenure::testing::short_backoffs(&mut cfg);
    cfg.max_in_flight = 16;
    cfg.unsafe_no_fencing = args.iter().any(|a| a == "--unsafe-no-fencing");
    if let Ok(p) = flag_value(args, "--partitions") {
        cfg = cfg.with_partitions(p.parse()?);
    }
    let mariadb = match flag_value(args, "--mysql") {
        Ok(url) => Some(MySqlFence::connect(&ns, &url, &cfg).await?),
        Err(_) => None,
    };
    let limits = match flag_value(args, "--fleet-max") {
        Ok(n) => tenure::JobLimits::default().fleet_max(n.parse()?),
        Err(_) => tenure::JobLimits::default(),
    };
    // The servers may be down right now (a fault): keep trying.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let job = Transfer {
            worker: id.clone(),
            schema: ns.clone(),
            pause: pause.clone(),
            mariadb: mariadb.clone(),
        };
        let tick = cron::Tick {
            worker: id.clone(),
            schema: ns.clone(),
        };
        match Worker::builder(cfg.clone())
            .register_with(job.clone(), limits)
            .register_with(Transfer5(job), limits)
            .register(tick)
            .schedule_with::<cron::Tick>(cron::schedule(), &())
            .observer(recorder.clone())
            .start()
            .await
        {
            Ok(w) => return Ok(w),
            Err(e) if Instant::now() < deadline => {
                eprintln!("worker {id}: start failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A redis-lock worker: its Redis link goes through its fault proxy.
async fn redis_runner(
    args: &[String],
    recorder: Arc<Recorder>,
    pause: PauseArm,
) -> anyhow::Result<Arc<redis_lock::LockRunner>> {
    let ns = flag_value(args, "--ns")?;
    let ttl = Duration::from_millis(flag_value(args, "--ttl-ms")?.parse()?);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(20)
        .connect_lazy(&flag_value(args, "--db")?)?;
    let client = redis::Client::open(flag_value(args, "--redis")?)?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(ttl / 3)
        .set_response_timeout(ttl / 3)
        .set_number_of_retries(1);
    let redis = retry("connect to redis", || {
        let (client, config) = (client.clone(), config.clone());
        async move { Ok(redis::aio::ConnectionManager::new_with_config(client, config).await?) }
    })
    .await?;
    Ok(Arc::new(redis_lock::LockRunner {
        worker: flag_value(args, "--id")?,
        schema: ns,
        pool,
        redis,
        ttl,
        recorder,
        pause,
    }))
}

// ---------------------------------------------------------------------------
// The fault proxy between a worker and the etcd members.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    /// Drop every connection and refuse new ones.
    Cut,
    /// Add this latency to every chunk forwarded.
    Delay(Duration),
}

/// One worker's proxies, one per etcd member, all sharing one mode.
struct Proxy {
    mode: watch::Sender<Mode>,
    addrs: Vec<String>,
    /// Where each address forwards new connections (`retarget`).
    targets: Vec<watch::Sender<String>>,
    _tasks: JoinSet<()>,
}

impl Proxy {
    async fn start(targets: &[String]) -> anyhow::Result<Proxy> {
        let (mode, _) = watch::channel(Mode::Pass);
        let mut tasks = JoinSet::new();
        let mut addrs = Vec::new();
        let mut senders = Vec::new();
        for target in targets {
            let (to, target) = watch::channel(host_port(target)?);
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(format!("http://{}", listener.local_addr()?));
            let rx = mode.subscribe();
            tasks.spawn(accept_loop(listener, target, rx));
            senders.push(to);
        }
        Ok(Proxy {
            mode,
            addrs,
            targets: senders,
            _tasks: tasks,
        })
    }

    /// Points address `i` at `targets[i]` (wrapping around if there are fewer
    /// targets) for the connections it accepts from now on: the stable
    /// name in front of servers that moved (etcd members replaced).
    fn retarget(&self, targets: &[String]) {
        for (i, to) in self.targets.iter().enumerate() {
            if let Some(Ok(target)) = targets.get(i % targets.len().max(1)).map(|t| host_port(t)) {
                to.send_replace(target);
            }
        }
    }

    fn set(&self, m: Mode) {
        self.mode.send_replace(m);
    }

    /// A proxy for the one server of `url` (`scheme://[user@]127.0.0.1:PORT[/..]`)
    /// and `url` rewritten to go through it.
    async fn relay_url(url: &str) -> anyhow::Result<(Proxy, String)> {
        let (_, rest) = url.split_once("://").context("a URL with a scheme")?;
        let authority = rest.split(['/', '?']).next().unwrap_or(rest);
        let host_port = authority.rsplit('@').next().unwrap_or(authority);
        let proxy = Proxy::start(&[format!("http://{host_port}")]).await?;
        let via = proxy.addrs[0].trim_start_matches("http://").to_string();
        Ok((proxy, url.replacen(host_port, &via, 1)))
    }
}

/// `127.0.0.1:PORT` of `http://127.0.0.1:PORT[/]`; only loopback targets.
fn host_port(target: &str) -> anyhow::Result<String> {
    let target = target
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    anyhow::ensure!(
        target.starts_with("127.0.0.1:"),
        "non-local target {target}"
    );
    Ok(target)
}

/// One proxy for every NATS node of `urls` (`nats://127.0.0.1:PORT`) and
/// the comma-separated URL that goes through it: a cut cuts them all.
async fn relay_nats(urls: &[String]) -> anyhow::Result<(Proxy, String)> {
    let targets: Vec<String> = urls
        .iter()
        .map(|u| u.replacen("nats://", "http://", 1))
        .collect();
    let proxy = Proxy::start(&targets).await?;
    let via: Vec<String> = proxy
        .addrs
        .iter()
        .map(|a| a.replacen("http://", "nats://", 1))
        .collect();
    Ok((proxy, via.join(",")))
}

async fn accept_loop(
    listener: TcpListener,
    target: watch::Receiver<String>,
    rx: watch::Receiver<Mode>,
) {
    // Owns its connections: they end when this task is aborted.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                if *rx.borrow() == Mode::Cut {
                    drop(inbound);
                    continue;
                }
                let to = target.borrow().clone();
                conns.spawn(forward(inbound, to, rx.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn forward(inbound: TcpStream, target: String, mut rx: watch::Receiver<Mode>) {
    let Ok(outbound) = TcpStream::connect(&target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (ri, wi) = inbound.into_split();
    let (ro, wo) = outbound.into_split();
    let up = pump(ri, wo, rx.clone());
    let down = pump(ro, wi, rx.clone());
    let cut = async move {
        loop {
            if *rx.borrow_and_update() == Mode::Cut {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    };
    // Whichever ends first ends the connection (both halves dropped).
    tokio::select! {
        () = cut => {}
        () = up => {}
        () = down => {}
    }
}

async fn pump<R, W>(mut r: R, mut w: W, rx: watch::Receiver<Mode>)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mode = *rx.borrow();
        match mode {
            Mode::Cut => return,
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Pass => {}
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------
// Faults.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    WorkerPause,
    WorkerKill,
    KillAfterCommit,
    EtcdKill,
    EtcdLeaderKill,
    EtcdQuorumLoss,
    NatsRestart,
    PgRestart,
    EtcdPartition,
    SlowKeepalive,
    EtcdRestore,
    EtcdRestoreBumped,
    OperatorRedriveRunning,
    NatsPause,
    WorkerCutFromPostgres,
    WorkerCutFromNats,
    WorkerJoin,
    WorkerLeaveGraceful,
    EtcdPauseDuringHandover,
    NatsNodeKill,
    NatsMetaLeaderKill,
    OperatorPauseType,
    EtcdMemberReplace,
    EtcdGrowShrink,
    PostgresFailover,
}

impl Fault {
    /// Partition mode's three more kinds (`--partitions`).
    const MOVES: [Fault; 3] = [
        Fault::WorkerJoin,
        Fault::WorkerLeaveGraceful,
        Fault::EtcdPauseDuringHandover,
    ];

    /// A NATS cluster's two more kinds (`--nats-cluster`).
    const NATS_NODES: [Fault; 2] = [Fault::NatsNodeKill, Fault::NatsMetaLeaderKill];

    /// etcd membership changes' two more kinds (`--membership-faults`).
    const MEMBERSHIP: [Fault; 2] = [Fault::EtcdMemberReplace, Fault::EtcdGrowShrink];

    /// The kinds a run injects: the sixteen, in partition mode the three
    /// that move partitions, on a NATS cluster the two that kill a node, with
    /// the operators' controls (`--fleet-max`) the pause of a type, with
    /// `--membership-faults` the two etcd membership changes, with a
    /// PostgreSQL standby (`--postgres-standby`) its failover.
    fn kinds(args: &Args) -> Vec<Fault> {
        let (partitions, nats_cluster) = (args.partitions.is_some(), args.nats_cluster > 1);
        let controls = args.fleet_max.is_some();
        let failover = if args.postgres_standby.is_some() {
            &[Fault::PostgresFailover][..]
        } else {
            &[]
        };
        let moves = if partitions { &Fault::MOVES[..] } else { &[] };
        let nodes = if nats_cluster {
            &Fault::NATS_NODES[..]
        } else {
            &[]
        };
        let controls = if controls {
            &[Fault::OperatorPauseType][..]
        } else {
            &[]
        };
        let membership = if args.membership_faults {
            &Fault::MEMBERSHIP[..]
        } else {
            &[]
        };
        Fault::ALL
            .iter()
            .chain(moves)
            .chain(nodes)
            .chain(controls)
            .chain(membership)
            .chain(failover)
            .copied()
            .collect()
    }

    const ALL: [Fault; 16] = [
        Fault::WorkerPause,
        Fault::WorkerKill,
        Fault::KillAfterCommit,
        Fault::EtcdKill,
        Fault::EtcdLeaderKill,
        Fault::EtcdQuorumLoss,
        Fault::NatsRestart,
        Fault::PgRestart,
        Fault::EtcdPartition,
        Fault::SlowKeepalive,
        Fault::EtcdRestore,
        Fault::EtcdRestoreBumped,
        Fault::OperatorRedriveRunning,
        Fault::NatsPause,
        Fault::WorkerCutFromPostgres,
        Fault::WorkerCutFromNats,
    ];

    /// A fault of the coordinator's servers (Redis's in redis-lock mode).
    fn is_coordinator_fault(self) -> bool {
        matches!(
            self,
            Fault::EtcdKill
                | Fault::EtcdLeaderKill
                | Fault::EtcdQuorumLoss
                | Fault::EtcdRestore
                | Fault::EtcdRestoreBumped
        )
    }

    fn name(self) -> &'static str {
        match self {
            Fault::WorkerPause => "worker_sigstop",
            Fault::WorkerKill => "worker_sigkill",
            Fault::KillAfterCommit => "worker_kill_after_commit",
            Fault::EtcdKill => "etcd_member_kill",
            Fault::EtcdLeaderKill => "etcd_leader_kill",
            Fault::EtcdQuorumLoss => "etcd_quorum_loss",
            Fault::NatsRestart => "nats_restart",
            Fault::PgRestart => "postgres_restart",
            Fault::EtcdPartition => "worker_cut_from_etcd",
            Fault::SlowKeepalive => "slow_keepalives",
            Fault::EtcdRestore => "etcd_restore",
            Fault::EtcdRestoreBumped => "etcd_restore_bumped",
            Fault::OperatorRedriveRunning => "operator_redrive_running",
            Fault::NatsPause => "nats_pause",
            Fault::WorkerCutFromPostgres => "worker_cut_from_postgres",
            Fault::WorkerCutFromNats => "worker_cut_from_nats",
            Fault::EtcdPauseDuringHandover => "etcd_pause_during_handover",
            Fault::WorkerJoin => "worker_join",
            Fault::WorkerLeaveGraceful => "worker_leave_graceful",
            Fault::NatsNodeKill => "nats_node_kill",
            Fault::NatsMetaLeaderKill => "nats_meta_leader_kill",
            Fault::OperatorPauseType => "operator_pause_type",
            Fault::EtcdMemberReplace => "etcd_member_replace",
            Fault::EtcdGrowShrink => "etcd_grow_shrink",
            Fault::PostgresFailover => "postgres_failover",
        }
    }
}

/// One worker slot: its process (replaced after a kill) and its etcd proxy.
struct Slot {
    index: usize,
    /// Should be running (a spare worker's slot is not until it joins).
    active: bool,
    generation: u32,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    ready: Arc<AtomicBool>,
    /// Where the worker last stopped itself (`worker_sigstop`): its job and step.
    paused_at: PausedAt,
    proxy: Proxy,
    /// The worker's PostgreSQL and NATS links (`worker_cut_from_*`), and the
    /// URLs that go through them.
    pg_proxy: Proxy,
    pg_url: String,
    nats_proxy: Proxy,
    nats_url: String,
}

/// The job and step a worker stopped itself in (its `PAUSED` line).
#[derive(Clone, Default)]
struct PausedAt(Arc<Mutex<Option<(sqlx::types::Uuid, i64)>>>);

impl PausedAt {
    fn record(&self, line: &str) {
        let mut parts = line.split_whitespace();
        let job = parts.next().and_then(|j| j.parse().ok());
        let step = parts.next().and_then(|k| k.parse().ok());
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = job.zip(step);
    }

    fn take(&self) -> Option<(sqlx::types::Uuid, i64)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Slot {
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

struct Run {
    args: Args,
    stack: DevStack,
    ns: String,
    dir: PathBuf,
    exe: PathBuf,
    slots: Vec<Slot>,
    counts: BTreeMap<&'static str, u64>,
    unexpected_exits: u64,
    /// `--target mariadb`: the MariaDB database the transfers write to.
    mysql_url: Option<String>,
    /// Per restore without a bump: the snapshot's revision and the last revision
    /// handed out before the restore. Revisions in between are handed out again,
    /// so a regression alarm on one of them is expected.
    reused_revisions: Vec<(i64, i64)>,
    /// The operator's client (redrives).
    client: Client,
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Whether process `pid` is stopped (state `T`).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "T")
    })
}

fn ms(rng: &mut StdRng, lo: Duration, hi: Duration) -> Duration {
    let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
    Duration::from_millis(rng.random_range(lo..=hi.max(lo)))
}

impl Run {
    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let slot = &mut self.slots[i];
        slot.generation += 1;
        let id = format!("w{}g{}", slot.index, slot.generation);
        let log = self.dir.join(format!("{id}.commits"));
        let err = std::fs::File::create(self.dir.join(format!("{id}.stderr")))?;
        let mut cmd = Command::new("setpriv");
        cmd.arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(&self.exe)
            .arg("worker")
            .arg("--ns")
            .arg(&self.ns)
            .arg("--id")
            .arg(&id)
            .arg("--ttl-ms")
            .arg(self.args.ttl.as_millis().to_string())
            .arg("--log")
            .arg(&log)
            .arg("--etcd")
            .arg(slot.proxy.addrs.join(","))
            .arg("--nats")
            .arg(&slot.nats_url)
            .arg("--db")
            .arg(&slot.pg_url)
            .arg("--mode")
            .arg(self.args.mode.name())
            .arg("--steps")
            .arg(steps().to_string())
            .arg("--replicas")
            .arg(stream_replicas(&self.args).to_string());
        if self.args.unsafe_no_fencing {
            cmd.arg("--unsafe-no-fencing");
        }
        if let Some(url) = &self.mysql_url {
            cmd.arg("--mysql").arg(url);
        }
        if let Some(p) = self.args.partitions {
            cmd.arg("--partitions").arg(p.to_string());
        }
        if let Some(n) = self.args.fleet_max {
            cmd.arg("--fleet-max").arg(n.to_string());
        }
        if self.args.mode == RunMode::RedisLock {
            // The coordinator link through the fault proxy is Redis's.
            let via = slot.proxy.addrs[0].replace("http://", "redis://");
            cmd.arg("--redis").arg(via);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .spawn()
            .context("spawn worker (setpriv)")?;
        let ready = Arc::new(AtomicBool::new(false));
        if let Some(out) = child.stdout.take() {
            let (ready, paused_at) = (ready.clone(), slot.paused_at.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if line.starts_with("READY") {
                        ready.store(true, Ordering::SeqCst);
                    } else if let Some(at) = line.strip_prefix("PAUSED ") {
                        paused_at.record(at);
                    }
                }
            });
        }
        slot.stdin = child.stdin.take();
        slot.child = Some(child);
        slot.ready = ready;
        slot.active = true;
        Ok(())
    }

    fn kill_worker(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(mut c) = slot.child.take() {
            signal(c.id(), "KILL");
            let _ = c.kill();
            let _ = c.wait();
        }
        slot.stdin = None;
    }

    /// Replaces workers that died on their own (or by an armed crash).
    fn reap(&mut self) -> anyhow::Result<()> {
        for i in 0..self.slots.len() {
            if !self.slots[i].active {
                continue;
            }
            let exited = match self.slots[i].child.as_mut() {
                Some(c) => matches!(c.try_wait(), Ok(Some(_))),
                None => true,
            };
            if exited {
                self.unexpected_exits += 1;
                self.slots[i].child = None;
                self.spawn(i)?;
            }
        }
        Ok(())
    }

    /// Worker `i` leaves gracefully (`leave` on its stdin: running steps
    /// finish, jobs released, session revoked); killed if it takes longer than
    /// the shutdown grace and a margin.
    async fn leave(&mut self, i: usize) {
        self.leave_started(i);
        self.leave_finished(i).await;
    }

    /// Tells worker `i` to leave gracefully (its stdin: `leave`).
    fn leave_started(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.active = false;
        if let Some(s) = slot.stdin.as_mut()
            && s.write_all(b"leave\n").and_then(|()| s.flush()).is_err()
        {
            slot.stdin = None;
        }
    }

    /// Waits up to 20 s for worker `i`'s graceful exit, then makes sure of it.
    async fn leave_finished(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let deadline = Instant::now() + Duration::from_secs(20);
        while slot.stdin.is_some() && Instant::now() < deadline {
            match slot.child.as_mut().map(Child::try_wait) {
                Some(Ok(None)) => tokio::time::sleep(Duration::from_millis(20)).await,
                _ => break,
            }
        }
        self.kill_worker(i);
    }

    /// Waits (up to 30 s) until worker `i` printed READY.
    async fn joined(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.slots[i].ready.load(Ordering::SeqCst) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn count(&mut self, f: Fault) {
        *self.counts.entry(f.name()).or_default() += 1;
    }

    async fn ready(&self) -> anyhow::Result<()> {
        let r = self.stack.wait_ready(Duration::from_secs(60)).await;
        if r.is_err() {
            for p in self.stack.processes() {
                let log = std::fs::read_to_string(p.log_path()).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                eprintln!("--- {} (running: {})", p.name(), p.is_running());
                for l in &lines[lines.len().saturating_sub(15)..] {
                    eprintln!("    {l}");
                }
            }
        }
        r.context("dev stack not ready after a fault")
    }

    /// Stops a worker at its next write, holds it for `hold` and then until
    /// the job it stopped in was taken over (at most 30 s more), then lets it
    /// go on: it wakes up a stale owner with a write to make. Every running
    /// worker was armed before the round's batch went out (`fault_round`):
    /// the first to reach a write stops itself, the others are disarmed (and
    /// one that stopped at the same moment let go at once). Waiting on every
    /// worker makes a stop certain while any job runs (arming one, it could
    /// meet no job of the batch: after an etcd restore the others drained it
    /// while it recovered its session, `make test` of 2026-12-07). If none
    /// stops within 40 s, the parent stops `w` wherever it is.
    async fn pause_before_write(&mut self, w: usize, hold: Duration) {
        let stopped = self.first_stopped(Duration::from_secs(40)).await;
        self.disarm_pauses();
        // A stop already under way when the disarm went out lands now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let v = stopped.unwrap_or(w);
        self.let_go_all_but(v);
        let at = match stopped {
            Some(i) => self.paused_at_within(i, Duration::from_secs(1)).await,
            None => None,
        };
        let Some(pid) = self.slots[v].pid() else {
            return;
        };
        signal(pid, "STOP");
        tokio::time::sleep(hold).await;
        match at {
            Some((job, step)) => self.wait_taken_over(v, job, step).await,
            None => eprintln!("torture: worker_sigstop: {v} stopped by the parent, no job known"),
        }
        signal(pid, "CONT");
        // A disarm read late may have let another worker stop itself.
        self.let_go_all_but(usize::MAX);
    }

    /// The first running worker found stopped (by its own arm), waited for up
    /// to `limit`.
    async fn first_stopped(&self, limit: Duration) -> Option<usize> {
        let deadline = Instant::now() + limit;
        loop {
            let found = self
                .slots
                .iter()
                .position(|s| s.active && s.pid().is_some_and(is_stopped));
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends SIGCONT to every worker but `keep` that is stopped, and forgets
    /// where it stopped.
    fn let_go_all_but(&self, keep: usize) {
        for (i, s) in self.slots.iter().enumerate() {
            if i != keep
                && let Some(pid) = s.pid()
                && is_stopped(pid)
            {
                s.paused_at.take();
                signal(pid, "CONT");
            }
        }
    }

    /// Where stopped worker `i` said it stopped (its `PAUSED` line, read by
    /// another task a moment after it stopped), waited for up to `limit`.
    async fn paused_at_within(
        &self,
        i: usize,
        limit: Duration,
    ) -> Option<(sqlx::types::Uuid, i64)> {
        let deadline = Instant::now() + limit;
        loop {
            let at = self.slots[i].paused_at.take();
            if at.is_some() || Instant::now() >= deadline {
                return at;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Arms every running worker to stop itself at its next write.
    fn arm_pauses(&mut self) {
        for s in &self.slots {
            s.paused_at.take();
        }
        self.command_workers(b"pause-before-write\n");
    }

    /// Takes back every arm not used yet.
    fn disarm_pauses(&mut self) {
        self.command_workers(b"pause-disarm\n");
    }

    /// Sends one command line to every running worker (one that cannot take
    /// it is gone, and is replaced by `reap`).
    fn command_workers(&mut self, line: &[u8]) {
        for slot in self.slots.iter_mut().filter(|s| s.active) {
            if let Some(s) = slot.stdin.as_mut() {
                let _ = s.write_all(line).and_then(|()| s.flush());
            }
        }
    }

    /// Waits (at most 30 s) until another worker committed `step` of `job`
    /// or the job ended, so the stopped worker wakes up stale for sure.
    async fn wait_taken_over(&self, v: usize, job: sqlx::types::Uuid, step: i64) {
        let started = Instant::now();
        let sql = format!(
            "SELECT step > $2 OR status NOT IN ('pending', 'running') FROM {}.jobs WHERE id = $1",
            self.ns
        );
        let pool = self.client.store().pool();
        while started.elapsed() < Duration::from_secs(30) {
            let moved: Result<Option<bool>, _> = sqlx::query_scalar(&sql)
                .bind(job)
                .bind(i32::try_from(step).unwrap_or(i32::MAX))
                .fetch_optional(pool)
                .await;
            if moved.is_ok_and(|m| m == Some(true)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "torture: worker_sigstop: {v} stopped in job {job} step {step}; \
             taken over (or 30 s) {:.1}s after the hold",
            started.elapsed().as_secs_f64()
        );
    }

    /// The coordinator's server faults in redis-lock mode, where Redis is the
    /// coordinator: a member kill or a restore (the locks it held are gone)
    /// restarts Redis, a quorum loss pauses it.
    async fn redis_fault(&mut self, f: Fault, rng: &mut StdRng) -> anyhow::Result<()> {
        let redis = self.stack.redis_server();
        if f == Fault::EtcdQuorumLoss {
            redis.pause()?;
            tokio::time::sleep(ms(rng, Duration::from_millis(500), self.args.ttl * 2)).await;
            redis.resume()?;
        } else {
            redis.kill()?;
            tokio::time::sleep(ms(
                rng,
                Duration::from_millis(500),
                Duration::from_millis(2500),
            ))
            .await;
            redis.restart()?;
        }
        self.ready().await
    }

    /// Arms worker `w` to abort right after its next step commit (before the ack).
    fn arm_crash(&mut self, w: usize) -> bool {
        match self.slots[w].stdin.as_mut() {
            Some(s) => s
                .write_all(b"crash-after-commit\n")
                .and_then(|()| s.flush())
                .is_ok(),
            None => false,
        }
    }

    /// A disaster recovery of etcd: a snapshot, work going on for a while, then
    /// every member restored from the snapshot (revisions go back to it). The
    /// workers are cut off from etcd from just before the restore until it is
    /// done (and, `bumped`, until the revision is past every one handed out
    /// before), so the last revision handed out is known exactly, and for at
    /// least 1.2 x TTL, so their sessions end and the locks the snapshot brings
    /// back expire with their leases (as they would in a real recovery, which
    /// takes longer than a lease).
    async fn restore_etcd(&mut self, bumped: bool, rng: &mut StdRng) -> anyhow::Result<()> {
        let snapshot = self.dir.join("restore.snap");
        let at = self.stack.etcd_snapshot(&snapshot)?;
        tokio::time::sleep(ms(rng, Duration::from_secs(1), Duration::from_secs(3))).await;
        for s in &self.slots {
            s.proxy.set(Mode::Cut);
        }
        let reopen = Instant::now() + self.args.ttl.mul_f64(1.2);
        let before = etcd_revision(&self.stack.etcd_endpoints()).await?;
        self.stack
            .etcd_restore(&snapshot, Duration::from_secs(60))
            .await?;
        if bumped {
            self.stack.etcd_bump_revision(before).await?;
        } else {
            self.reused_revisions.push((at, before));
        }
        tokio::time::sleep_until(reopen).await;
        for s in &self.slots {
            s.proxy.set(Mode::Pass);
        }
        self.ready().await
    }

    /// Injects `f` (on worker `w` where it targets a worker) and heals it.
    async fn inject(
        &mut self,
        f: Fault,
        w: usize,
        armed: bool,
        rng: &mut StdRng,
    ) -> anyhow::Result<()> {
        let injected = if f.is_coordinator_fault() && self.args.mode == RunMode::RedisLock {
            self.redis_fault(f, rng).await?;
            f
        } else {
            self.inject_kind(f, w, armed, rng).await?
        };
        self.count(injected);
        Ok(())
    }

    /// Injects `f` and heals it; returns the fault that happened (a kill after
    /// commit with no commit in time is a plain kill).
    async fn inject_kind(
        &mut self,
        f: Fault,
        w: usize,
        armed: bool,
        rng: &mut StdRng,
    ) -> anyhow::Result<Fault> {
        let ttl = self.args.ttl;
        match f {
            Fault::WorkerPause => self.worker_pause(w, rng).await,
            Fault::WorkerKill => self.worker_kill(w, rng).await?,
            Fault::KillAfterCommit => return self.kill_after_commit(w, armed).await,
            Fault::EtcdKill | Fault::EtcdLeaderKill => {
                self.etcd_member_kill(f == Fault::EtcdLeaderKill, rng)
                    .await?;
            }
            Fault::EtcdQuorumLoss => self.etcd_quorum_loss(rng).await?,
            Fault::NatsRestart => {
                // Every node of a cluster: NATS as a whole goes down.
                for node in self.stack.nats_nodes() {
                    node.restart()?;
                }
                self.ready().await?;
            }
            Fault::NatsNodeKill | Fault::NatsMetaLeaderKill => {
                self.nats_node_kill(f == Fault::NatsMetaLeaderKill, rng)
                    .await?;
            }
            Fault::PgRestart => self.postgres_restart().await?,
            Fault::PostgresFailover => {
                let pool = self.client.store().pool().clone();
                pg_failover::failover(&mut self.stack, &pool, &self.ns).await?;
                self.ready().await?;
            }
            // The worker still reaches NATS and PostgreSQL directly.
            Fault::EtcdPartition => cut_for_a_while(&self.slots[w].proxy, ttl, rng).await,
            Fault::SlowKeepalive => self.slow_keepalives(w, rng).await,
            Fault::EtcdRestore | Fault::EtcdRestoreBumped => {
                self.restore_etcd(f == Fault::EtcdRestoreBumped, rng)
                    .await?;
            }
            Fault::OperatorRedriveRunning => self.redrive_running().await?,
            Fault::OperatorPauseType => self.pause_types_for_a_while(rng).await?,
            // Alive in etcd, unable to work: its lease and its share stay.
            Fault::WorkerCutFromPostgres => {
                cut_for_a_while(&self.slots[w].pg_proxy, ttl, rng).await
            }
            Fault::WorkerCutFromNats => cut_for_a_while(&self.slots[w].nats_proxy, ttl, rng).await,
            Fault::EtcdPauseDuringHandover => self.etcd_pause_during_handover(w, rng).await?,
            Fault::NatsPause => self.nats_pause(rng).await?,
            Fault::WorkerJoin => self.worker_join(rng).await?,
            Fault::EtcdMemberReplace => self.etcd_member_replace(rng).await?,
            Fault::EtcdGrowShrink => self.etcd_grow_shrink(rng).await?,
            Fault::WorkerLeaveGraceful => {
                self.leave(w).await;
                self.rejoin_after_a_while(w, rng).await?;
            }
        }
        Ok(f)
    }

    /// `worker_sigstop`: longer than the lease and the broker's ack wait, so
    /// another worker takes the jobs over while this one sleeps right before a
    /// write.
    async fn worker_pause(&mut self, w: usize, rng: &mut StdRng) {
        let hold =
            self.args.ttl * 2 + ms(rng, Duration::from_millis(500), Duration::from_millis(1500));
        self.pause_before_write(w, hold).await;
    }

    /// `worker_sigkill`: worker `w` killed at a random moment, replaced a moment later.
    async fn worker_kill(&mut self, w: usize, rng: &mut StdRng) -> anyhow::Result<()> {
        tokio::time::sleep(ms(rng, Duration::ZERO, Duration::from_millis(300))).await;
        self.kill_worker(w);
        tokio::time::sleep(ms(rng, Duration::ZERO, Duration::from_millis(500))).await;
        self.spawn(w)
    }

    /// `worker_kill_after_commit`: worker `w`, if `armed` to crash after its
    /// next commit, gets up to 10 s to do so; then it is killed and replaced.
    /// Returns the fault that happened: with no commit in time, a plain kill.
    async fn kill_after_commit(&mut self, w: usize, armed: bool) -> anyhow::Result<Fault> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut crashed = false;
        while armed && Instant::now() < deadline {
            if let Some(c) = self.slots[w].child.as_mut()
                && let Ok(Some(_)) = c.try_wait()
            {
                crashed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill_worker(w);
        self.spawn(w)?;
        Ok(if crashed {
            Fault::KillAfterCommit
        } else {
            Fault::WorkerKill
        })
    }

    /// `etcd_member_kill` (a follower, drawn by `rng`) or `etcd_leader_kill`:
    /// the member is down for 0.5 to 2.5 s.
    async fn etcd_member_kill(
        &mut self,
        leader_only: bool,
        rng: &mut StdRng,
    ) -> anyhow::Result<()> {
        let leader = self.stack.etcd_leader().await.unwrap_or(0);
        let m = if leader_only {
            leader
        } else {
            (leader + rng.random_range(1..self.stack.etcd_members())) % self.stack.etcd_members()
        };
        self.stack.etcd_member(m).kill()?;
        tokio::time::sleep(ms(
            rng,
            Duration::from_millis(500),
            Duration::from_millis(2500),
        ))
        .await;
        self.stack.etcd_member(m).restart()?;
        self.ready().await
    }

    /// `etcd_quorum_loss`: two members paused for up to twice the TTL.
    async fn etcd_quorum_loss(&mut self, rng: &mut StdRng) -> anyhow::Result<()> {
        let n = self.stack.etcd_members();
        let a = rng.random_range(0..n);
        let b = (a + rng.random_range(1..n)) % n;
        self.stack.etcd_member(a).pause()?;
        self.stack.etcd_member(b).pause()?;
        tokio::time::sleep(ms(rng, Duration::from_millis(500), self.args.ttl * 2)).await;
        self.stack.etcd_member(a).resume()?;
        self.stack.etcd_member(b).resume()?;
        self.ready().await
    }

    /// `postgres_restart`, and with `--target mariadb` a restart of the fenced
    /// resource too.
    async fn postgres_restart(&mut self) -> anyhow::Result<()> {
        self.stack.postgres().restart()?;
        if self.mysql_url.is_some() {
            self.stack.mariadb_server().restart()?;
        }
        self.ready().await
    }

    /// `slow_keepalives`: worker `w`'s etcd link delayed for 2 to 5 s.
    async fn slow_keepalives(&mut self, w: usize, rng: &mut StdRng) {
        let ttl = self.args.ttl;
        let d = ms(rng, ttl / 6, ttl.mul_f64(0.6));
        self.slots[w].proxy.set(Mode::Delay(d));
        tokio::time::sleep(ms(rng, Duration::from_secs(2), Duration::from_secs(5))).await;
        self.slots[w].proxy.set(Mode::Pass);
    }

    /// `etcd_pause_during_handover`: a graceful leave hands worker `w`'s
    /// partitions over while etcd's leader is paused (the resigns may time
    /// out); it joins again later.
    async fn etcd_pause_during_handover(
        &mut self,
        w: usize,
        rng: &mut StdRng,
    ) -> anyhow::Result<()> {
        let leader = self.stack.etcd_leader().await.unwrap_or(0);
        self.leave_started(w);
        self.stack.etcd_member(leader).pause()?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.stack.etcd_member(leader).resume()?;
        self.leave_finished(w).await;
        self.ready().await?;
        self.rejoin_after_a_while(w, rng).await
    }

    /// `nats_pause`: publishes, fetches and acks stall; leases go on. On a
    /// cluster every node is paused.
    async fn nats_pause(&mut self, rng: &mut StdRng) -> anyhow::Result<()> {
        for node in self.stack.nats_nodes() {
            node.pause()?;
        }
        tokio::time::sleep(ms(rng, Duration::from_millis(500), self.args.ttl * 2)).await;
        for node in self.stack.nats_nodes() {
            node.resume()?;
        }
        self.ready().await
    }

    /// `nats_node_kill` (a node drawn by `rng`) or `nats_meta_leader_kill`
    /// (the JetStream meta leader, from `/jsz`): the node is down for 0.5 to
    /// 2.5 s, then restarted on its ports and store.
    async fn nats_node_kill(&mut self, meta_leader: bool, rng: &mut StdRng) -> anyhow::Result<()> {
        let n = self.stack.nats_nodes().len();
        let drawn = rng.random_range(0..n);
        let leader = self.stack.nats_meta_leader().await;
        let node = if meta_leader {
            leader.unwrap_or(drawn)
        } else {
            drawn
        };
        self.stack.nats_node(node).kill()?;
        let down = ms(rng, Duration::from_millis(500), Duration::from_millis(2500));
        tokio::time::sleep(down).await;
        self.stack.nats_node(node).restart()?;
        let restarted = Instant::now();
        self.ready().await?;
        eprintln!(
            "torture: nats node {node} killed (meta leader: node {leader:?}), down {down:?}, \
             every node answering {:?} after its restart",
            restarted.elapsed()
        );
        Ok(())
    }

    /// `worker_join`: the spare worker joins (leaving first if it runs).
    async fn worker_join(&mut self, rng: &mut StdRng) -> anyhow::Result<()> {
        let spare = self.args.workers;
        if self.slots[spare].active {
            self.leave(spare).await;
            tokio::time::sleep(ms(rng, Duration::ZERO, Duration::from_millis(500))).await;
        }
        self.spawn(spare)?;
        self.joined(spare).await;
        Ok(())
    }

    /// Restarts worker `w` after 0.2 s to a TTL and waits until it joined.
    async fn rejoin_after_a_while(&mut self, w: usize, rng: &mut StdRng) -> anyhow::Result<()> {
        tokio::time::sleep(ms(rng, Duration::from_millis(200), self.args.ttl)).await;
        self.spawn(w)?;
        self.joined(w).await;
        Ok(())
    }
}

/// Cuts the link through `proxy` for 1.2 to 2.5 lease TTLs.
async fn cut_for_a_while(proxy: &Proxy, ttl: Duration, rng: &mut StdRng) {
    proxy.set(Mode::Cut);
    tokio::time::sleep(ms(rng, ttl.mul_f64(1.2), ttl.mul_f64(2.5))).await;
    proxy.set(Mode::Pass);
}

impl Run {
    /// An operator redrives up to three running jobs (the doc calls it always
    /// safe): a second message for each, which must change nothing.
    async fn redrive_running(&self) -> anyhow::Result<()> {
        let sql = format!(
            "SELECT id FROM {}.jobs WHERE status = 'running' ORDER BY random() LIMIT 3",
            self.ns
        );
        let ids: Vec<sqlx::types::Uuid> = sqlx::query_scalar(&sql)
            .fetch_all(self.client.store().pool())
            .await?;
        for id in ids {
            match self.client.redrive(JobId::from_uuid(id)).await {
                // Finished meanwhile: nothing to redrive.
                Ok(_) | Err(tenure::ClientError::NotDead { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

impl Run {
    /// `operator_pause_type`: both transfer types paused for 0.5 to 2.5 s,
    /// then resumed (faults come one at a time: the servers are up).
    async fn pause_types_for_a_while(&self, rng: &mut StdRng) -> anyhow::Result<()> {
        const TYPES: [&str; 2] = ["torture.transfer", "torture.transfer5"];
        for t in TYPES {
            self.client.pause(t).await?;
        }
        tokio::time::sleep(ms(
            rng,
            Duration::from_millis(500),
            Duration::from_millis(2500),
        ))
        .await;
        for t in TYPES {
            self.client.resume(t).await?;
        }
        Ok(())
    }
}

/// The cluster's current revision (the last one handed out).
async fn etcd_revision(endpoints: &[String]) -> anyhow::Result<i64> {
    let mut etcd = etcd_client::Client::connect(endpoints, None).await?;
    let resp = etcd.get("__torture_revision", None).await?;
    Ok(resp.header().map_or(0, |h| h.revision()))
}

// ---------------------------------------------------------------------------
// The parent: set up, load, faults, checks.

async fn retry<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "{what} failed; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.context(what.to_string())),
        }
    }
}

async fn enqueue_batch(client: &Client, batch: &[(String, Xfer)]) -> anyhow::Result<Vec<JobId>> {
    let results: Vec<anyhow::Result<JobId>> = futures::stream::iter(batch.iter().cloned())
        .map(|(key, x)| async move {
            retry("enqueue", || {
                let (key, x) = (key.clone(), x.clone());
                async move {
                    Ok(if steps() == 5 {
                        client.enqueue::<Transfer5>(&key, &x).await?.job_id
                    } else {
                        client.enqueue::<Transfer>(&key, &x).await?.job_id
                    })
                }
            })
            .await
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn setup_schema(client: &Client, s: &str, guard: bool) -> anyhow::Result<()> {
    client.migrate().await?;
    let pool = client.store().pool();
    sqlx::query(&format!(
        "CREATE TABLE {s}.accounts (id int PRIMARY KEY, balance bigint NOT NULL)"
    ))
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "CREATE TABLE {s}.history (
            seq bigserial PRIMARY KEY,
            job_id uuid NOT NULL,
            step int NOT NULL,
            token bigint NOT NULL,
            worker text NOT NULL,
            account int,
            delta bigint NOT NULL,
            txid bigint NOT NULL DEFAULT txid_current(),
            at timestamptz NOT NULL DEFAULT clock_timestamp())"
    ))
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "CREATE INDEX history_job ON {s}.history (job_id, seq)"
    ))
    .execute(pool)
    .await?;
    let mut tx = pool.begin().await?;
    client.store().bypass_guard(&mut tx).await?;
    for a in 0..ACCOUNTS {
        sqlx::query(&format!("INSERT INTO {s}.accounts VALUES ($1, $2)"))
            .bind(a)
            .bind(INITIAL)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    if guard {
        client
            .store()
            .install_guard(&format!("{s}.accounts"))
            .await?;
        client
            .store()
            .install_guard(&format!("{s}.history"))
            .await?;
    }
    cron::setup(client, s, guard).await
}

#[derive(Debug, Default)]
struct Verdict {
    done: u64,
    dead: u64,
    lost: u64,
    double_commits: i64,
    token_regressions: i64,
    ledger_violations: i64,
    unconfirmed_commits: u64,
    accepted_reported: u64,
    stale_rejected: u64,
    history_rows: i64,
    /// MariaDB: re-runs absorbed by the idempotency key.
    replays: i64,
    lost_ids: Vec<JobId>,
    /// Jobs that ended `cancelled` (the operator action `cancel`).
    cancelled: u64,
    /// Cancelled jobs partly committed, written to after the cancel, or
    /// cancelled by a call whose row did not end `cancelled`.
    cancel_violations: i64,
}

async fn parent_main(args: Args) -> anyhow::Result<i32> {
    let started = Instant::now();
    let (mut run, mariadb) = Run::start(args).await?;
    run.start_workers().await?;
    let args = run.args.clone();
    let (client, s, dir) = (run.client.clone(), run.ns.clone(), run.dir.clone());

    // The load and the schedule, both from the seed.
    let jobs = transfers(&args);
    let mut rng = StdRng::seed_from_u64(args.seed);
    let kinds = Fault::kinds(&args);
    let schedule = fault_schedule(&args, &kinds, &mut rng)?;
    let load = run
        .load_under_faults(&jobs, &schedule, &mut rng, started)
        .await?;

    run.quiesce(load.ids.len()).await?;
    let verdict = settled_verdict(&client, &s, mariadb.as_ref(), &load, &dir).await?;
    // The cron schedule (Tenure's modes: the Redis runner has no scheduler).
    let cron = if args.mode == RunMode::RedisLock {
        cron::Verdict::default()
    } else {
        cron::check(&client, &s, Duration::from_secs(30)).await?
    };
    for id in &verdict.lost_ids {
        diagnose(&client, &s, *id, &dir).await;
        lock_holder(&run.stack.etcd_endpoints(), &s, *id).await;
        nats_state::dump(&client, &run.stack.nats_url(), *id).await;
    }
    if !verdict.lost_ids.is_empty() {
        for node in run.stack.nats_nodes() {
            nats_state::server_log(node.log_path());
        }
    }
    for i in 0..run.slots.len() {
        run.kill_worker(i);
    }

    print_fault_counts(&kinds, &run.counts);
    let alarms = regression_alarms(&dir, &run.reused_revisions)?;
    if args.cancel > 0.0 {
        print_cancels(&client, &load.cancels).await;
    }
    let outcome = Outcome {
        verdict,
        alarms,
        cron,
    };
    outcome.print(&run, load.ids.len(), started);
    let code = outcome.exit_code(args.mode);
    if code == 0 && std::env::var_os("TORTURE_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("torture: keeping {}", dir.display());
    }
    drop(run);
    Ok(code)
}

impl Run {
    /// The dev stack, the schema (and with `--target mariadb` its database), the
    /// workers' slots; no worker started yet. Also returns the MariaDB fence.
    async fn start(args: Args) -> anyhow::Result<(Run, Option<MySqlFence>)> {
        let stack = DevStack::start_with(tenure::devstack::DevStackOptions {
            redis: args.mode == RunMode::RedisLock,
            mariadb: args.target == Target::Mariadb,
            nats_cluster: args.nats_cluster,
            postgres_standby: args.postgres_standby,
            ..Default::default()
        })
        .await
        .context("dev stack")?;
        let ns = DevStack::unique_namespace("torture");
        let dir = std::env::temp_dir().join(&ns);
        std::fs::create_dir_all(&dir)?;
        let exe = std::env::current_exe()?;
        let cfg = parent_config(&args, &stack, &ns);
        let client = Client::connect(&cfg).await.context("client")?;
        setup_schema(&client, &ns, args.mode == RunMode::Fenced)
            .await
            .context("schema")?;
        let mariadb = match args.target {
            Target::Postgres => None,
            Target::Mariadb => Some(setup_mariadb(&args, &stack, &ns, &cfg).await?),
        };
        print_banner(&args, &ns, &dir);
        let slots = worker_slots(&args, &stack).await?;
        let run = Run {
            args,
            stack,
            ns,
            dir,
            exe,
            slots,
            counts: BTreeMap::new(),
            unexpected_exits: 0,
            mysql_url: mariadb.as_ref().map(|(url, _)| url.clone()),
            reused_revisions: Vec::new(),
            client,
        };
        Ok((run, mariadb.map(|(_, fence)| fence)))
    }

    /// Starts the workers (not the spare) and waits up to 120 s until they are
    /// all ready.
    async fn start_workers(&mut self) -> anyhow::Result<()> {
        for i in 0..self.args.workers {
            self.spawn(i)?;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self
            .slots
            .iter()
            .filter(|s| s.active)
            .all(|s| s.ready.load(Ordering::SeqCst))
        {
            if Instant::now() > deadline {
                bail!("workers did not start; see {}", self.dir.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// The operator's client configuration.
fn parent_config(args: &Args, stack: &DevStack, ns: &str) -> Config {
    let mut cfg = Config::new(ns.to_owned())
        .with_schema(ns.to_owned())
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_nats_url(stack.nats_url())
        .with_database_url(stack.database_url())
        .with_lease_ttl(args.ttl);
    cfg.max_in_flight = 16;
    cfg.partitions = args.partitions;
    cfg.stream_replicas = stream_replicas(args);
    cfg
}

/// R3 on a NATS cluster, R1 on one server.
fn stream_replicas(args: &Args) -> usize {
    if args.nats_cluster > 1 { 3 } else { 1 }
}

/// `--target mariadb`: the database of namespace `ns` and its tables; its URL
/// and its fence.
async fn setup_mariadb(
    args: &Args,
    stack: &DevStack,
    ns: &str,
    cfg: &Config,
) -> anyhow::Result<(String, MySqlFence)> {
    let url = stack.create_mysql_database(ns).await?;
    let fence = MySqlFence::connect(ns, &url, cfg).await?;
    resource::setup_mariadb(&fence, args.mode == RunMode::Fenced)
        .await
        .context("mariadb tables")?;
    Ok((url, fence))
}

/// The run's first line (stderr).
fn print_banner(args: &Args, ns: &str, dir: &Path) {
    eprintln!(
        "torture: ns={ns} dir={} jobs={} workers={} faults={} seed={} ttl={:?}{}",
        dir.display(),
        args.jobs,
        args.workers,
        args.faults,
        args.seed,
        args.ttl,
        match args.mode {
            RunMode::Fenced => "",
            RunMode::Unfenced => " UNSAFE-NO-FENCING",
            RunMode::RedisLock => " REDIS-LOCK",
        }
    );
}

/// One slot per worker (and in partition mode one spare, for `worker_join`),
/// each with its proxies to the coordinator, PostgreSQL and NATS.
async fn worker_slots(args: &Args, stack: &DevStack) -> anyhow::Result<Vec<Slot>> {
    let coordinator = match args.mode {
        RunMode::RedisLock => vec![stack.redis_url().replace("redis://", "http://")],
        _ => stack.etcd_endpoints(),
    };
    let mut slots = Vec::new();
    let spares = usize::from(args.partitions.is_some());
    for index in 0..args.workers + spares {
        let (pg_proxy, pg_url) = Proxy::relay_url(&stack.database_url()).await?;
        let (nats_proxy, nats_url) = relay_nats(&stack.nats_urls()).await?;
        slots.push(Slot {
            index,
            active: false,
            generation: 0,
            child: None,
            stdin: None,
            ready: Arc::new(AtomicBool::new(false)),
            paused_at: PausedAt::default(),
            proxy: Proxy::start(&coordinator).await?,
            pg_proxy,
            pg_url,
            nats_proxy,
            nats_url,
        });
    }
    Ok(slots)
}

/// The transfers to enqueue, from the seed.
fn transfers(args: &Args) -> Vec<(String, Xfer)> {
    let mut job_rng = StdRng::seed_from_u64(args.seed ^ 0x6a6f_6273);
    (0..args.jobs)
        .map(|i| {
            let from = job_rng.random_range(0..ACCOUNTS);
            let to = (from + job_rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
            let x = Xfer {
                from,
                to,
                amount: job_rng.random_range(1..=1000),
                delay_ms: args.delay_ms,
            };
            (format!("t{i}"), x)
        })
        .collect()
}

/// `--faults` faults, every kind in turn, shuffled by `rng` (or only `--only`).
fn fault_schedule(args: &Args, kinds: &[Fault], rng: &mut StdRng) -> anyhow::Result<Vec<Fault>> {
    let mut schedule: Vec<Fault> = (0..args.faults).map(|i| kinds[i % kinds.len()]).collect();
    schedule.shuffle(rng);
    if let Some(only) = &args.only {
        // One kind, or several comma-separated, in turn.
        let only: Vec<Fault> = only
            .split(',')
            .map(|name| {
                kinds
                    .iter()
                    .copied()
                    .find(|f| f.name() == name)
                    .with_context(|| format!("no fault kind {name}"))
            })
            .collect::<anyhow::Result<_>>()?;
        schedule = (0..args.faults).map(|i| only[i % only.len()]).collect();
    }
    Ok(schedule)
}

/// The jobs the parent enqueued, and the operator's cancels of them.
struct Load {
    ids: Vec<JobId>,
    cancels: cancel::Cancels,
    /// The operator's cancels draw from a seed of their own: the fault
    /// schedule is the same with and without them.
    cancel_rng: StdRng,
}

impl Load {
    fn new(args: &Args) -> Self {
        Load {
            ids: Vec::with_capacity(args.jobs),
            cancels: cancel::Cancels::default(),
            cancel_rng: StdRng::seed_from_u64(args.seed ^ 0x6361_6e63),
        }
    }

    /// Enqueues `batch`, and cancels a fraction `cancel` of it a while later.
    async fn enqueue(
        &mut self,
        client: &Client,
        batch: &[(String, Xfer)],
        cancel: f64,
    ) -> anyhow::Result<()> {
        let batch = enqueue_batch(client, batch).await?;
        self.cancels
            .spawn(client, &batch, cancel, &mut self.cancel_rng);
        self.ids.extend(batch);
        Ok(())
    }
}

impl Run {
    /// Enqueues the transfers in one batch per fault of `schedule`, each fault
    /// injected while its batch runs; then waits for the operator's cancels.
    async fn load_under_faults(
        &mut self,
        jobs: &[(String, Xfer)],
        schedule: &[Fault],
        rng: &mut StdRng,
        started: Instant,
    ) -> anyhow::Result<Load> {
        let mut load = Load::new(&self.args);
        let batches = schedule.len().max(1);
        for (k, fault) in schedule.iter().copied().enumerate() {
            let lo = self.args.jobs * k / batches;
            let hi = self.args.jobs * (k + 1) / batches;
            self.fault_round(fault, &jobs[lo..hi], &mut load, rng)
                .await?;
            let total: u64 = self.counts.values().sum();
            eprintln!(
                "torture: [{:>6.1}s] fault {}/{} {} (enqueued {})",
                started.elapsed().as_secs_f64(),
                total,
                self.args.faults,
                fault.name(),
                load.ids.len()
            );
        }
        if schedule.is_empty() {
            load.enqueue(&self.client, jobs, self.args.cancel).await?;
        }
        load.cancels.finish().await;
        Ok(load)
    }

    /// Enqueues `batch` and injects `fault` while it runs, on a worker drawn
    /// from `rng`; replaces the workers that died.
    async fn fault_round(
        &mut self,
        fault: Fault,
        batch: &[(String, Xfer)],
        load: &mut Load,
        rng: &mut StdRng,
    ) -> anyhow::Result<()> {
        let w = rng.random_range(0..self.args.workers);
        let armed = fault == Fault::KillAfterCommit && self.arm_crash(w);
        // A sigstop's workers are armed before its batch goes out, so one
        // meets a write of the batch (workers that drain a batch before the
        // arm reaches them wait idle: the negative control then caught nothing).
        if fault == Fault::WorkerPause {
            self.arm_pauses();
        }
        load.enqueue(&self.client, batch, self.args.cancel).await?;
        // Short enough that the batch is still running when the fault lands.
        tokio::time::sleep(ms(
            rng,
            Duration::from_millis(50),
            Duration::from_millis(400),
        ))
        .await;
        self.inject(fault, w, armed, rng)
            .await
            .with_context(|| format!("fault {}", fault.name()))?;
        self.reap()
    }

    /// Quiescence: heals every etcd link, then waits until every one of `jobs`
    /// jobs is terminal (at most `--quiesce-secs`), replacing workers that die.
    async fn quiesce(&mut self, jobs: usize) -> anyhow::Result<()> {
        for s in &self.slots {
            s.proxy.set(Mode::Pass);
        }
        self.ready().await?;
        let deadline = Instant::now() + self.args.quiesce;
        loop {
            self.reap()?;
            let terminal = terminal_transfers(&self.client, &self.ns).await?;
            if terminal as usize >= jobs || Instant::now() > deadline {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// How many transfers are `done`, `dead` or `cancelled` (retried through faults).
async fn terminal_transfers(client: &Client, s: &str) -> anyhow::Result<i64> {
    retry("count terminal", || async move {
        Ok(sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {s}.jobs WHERE status IN ('done', 'dead', 'cancelled') \
               AND job_type = $1"
        ))
        .bind(transfer_type())
        .fetch_one(client.store().pool())
        .await?)
    })
    .await
}

/// The checks' verdict, once the dead-lettering of the last dead jobs had up to
/// 30 s to finish.
async fn settled_verdict(
    client: &Client,
    s: &str,
    mariadb: Option<&MySqlFence>,
    load: &Load,
    dir: &Path,
) -> anyhow::Result<Verdict> {
    let cancels = &load.cancels.results;
    let mut v = check(client, s, mariadb, &load.ids, dir, cancels).await?;
    let dlq_deadline = Instant::now() + Duration::from_secs(30);
    while v.lost > 0 && Instant::now() < dlq_deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        v = check(client, s, mariadb, &load.ids, dir, cancels).await?;
    }
    Ok(v)
}

/// `torture: faults by kind: ...`.
fn print_fault_counts(kinds: &[Fault], counts: &BTreeMap<&'static str, u64>) {
    let kinds: Vec<String> = kinds
        .iter()
        .map(|f| format!("{}={}", f.name(), counts.get(f.name()).unwrap_or(&0)))
        .collect();
    println!("torture: faults by kind: {}", kinds.join(" "));
}

/// `torture: operator cancels: ...`, once the work stream drained.
async fn print_cancels(client: &Client, cancels: &cancel::Cancels) {
    let left = work_messages_left(client).await;
    println!(
        "torture: operator cancels: cancelled={} too_late={} failed={} work_messages_left={left}",
        cancels.count(cancel::Tried::Cancelled),
        cancels.count(cancel::Tried::TooLate),
        cancels.count(cancel::Tried::Failed),
    );
}

/// What the checks found.
struct Outcome {
    verdict: Verdict,
    alarms: Alarms,
    cron: cron::Verdict,
}

impl Outcome {
    /// The summary lines (stdout), for `jobs` jobs enqueued.
    fn print(&self, run: &Run, jobs: usize, started: Instant) {
        let (args, verdict, alarms) = (&run.args, &self.verdict, &self.alarms);
        println!(
            "torture: history_rows={} accepted_reported={} stale_rejected={} unconfirmed_commits={} \
             ledger_violations={} regression_alarms={} unexplained_alarms={} \
             worker_restarts_unplanned={} replays={} elapsed={:.1}s mode={}",
            verdict.history_rows,
            verdict.accepted_reported,
            verdict.stale_rejected,
            verdict.unconfirmed_commits,
            verdict.ledger_violations,
            alarms.total,
            alarms.unexplained,
            run.unexpected_exits,
            verdict.replays,
            started.elapsed().as_secs_f64(),
            args.mode.name()
        );
        println!("{}", self.cron.line());
        println!(
            "torture: mode={} target={} partitions={} steps={} nats_nodes={} fleet_max={} \
             postgres_standby={}",
            args.mode.name(),
            args.target.name(),
            args.partitions.unwrap_or(0),
            steps(),
            args.nats_cluster.max(1),
            args.fleet_max.unwrap_or(0),
            pg_failover::name(args.postgres_standby)
        );
        println!(
            "torture: jobs={} done={} dead={} cancelled={} lost={} double_commits={} token_regressions={} \
             cancel_violations={} stale_rejected={} faults={} seed={}",
            jobs,
            verdict.done,
            verdict.dead,
            verdict.cancelled,
            verdict.lost,
            verdict.double_commits,
            verdict.token_regressions,
            verdict.cancel_violations,
            verdict.stale_rejected,
            run.counts.values().sum::<u64>(),
            args.seed
        );
        let _ = std::io::stdout().flush();
    }

    /// The exit status: 0 when the run passed. A negative control passes when it
    /// finds violations.
    fn exit_code(&self, mode: RunMode) -> i32 {
        let (verdict, alarms) = (&self.verdict, &self.alarms);
        let violations = verdict.double_commits + verdict.token_regressions;
        if mode == RunMode::RedisLock {
            // Lost updates show in the ledger.
            i32::from(violations + verdict.ledger_violations == 0)
        } else if mode.is_control() {
            i32::from(violations == 0)
        } else {
            i32::from(
                violations != 0
                    || verdict.lost != 0
                    || verdict.cancel_violations != 0
                    || verdict.ledger_violations != 0
                    || verdict.unconfirmed_commits != 0
                    || alarms.unexplained != 0
                    || !self.cron.clean(),
            )
        }
    }
}

/// Messages still in the work stream once every job ended, after up to 15 s
/// for redeliveries to be acked at admission (-1: NATS did not answer).
async fn work_messages_left(client: &Client) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = match client.queue().stats().await {
            Ok(q) => i64::try_from(q.work_messages).unwrap_or(i64::MAX),
            Err(_) => -1,
        };
        if left == 0 || Instant::now() >= deadline {
            if left != 0 {
                eprintln!(
                    "torture: work stream at the end: {:?}",
                    client.queue().stats().await
                );
            }
            return left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn check(
    client: &Client,
    s: &str,
    mariadb: Option<&MySqlFence>,
    ids: &[JobId],
    dir: &Path,
    cancels: &HashMap<JobId, cancel::Tried>,
) -> anyhow::Result<Verdict> {
    let pool = client.store().pool();
    let mut v = Verdict::default();
    let rows: Vec<(sqlx::types::Uuid, String, Option<String>)> = sqlx::query_as(&format!(
        "SELECT id, status, last_error FROM {s}.jobs WHERE job_type = $1"
    ))
    .bind(transfer_type())
    .fetch_all(pool)
    .await?;
    let rows: HashMap<_, _> = rows.into_iter().map(|(id, st, e)| (id, (st, e))).collect();
    let in_dlq = dead_lettered(client).await?;
    let done: HashSet<_> = rows
        .iter()
        .filter(|(_, (st, _))| st == "done")
        .map(|(id, _)| *id)
        .collect();
    let (history, balances) = resource::load(pool, s, mariadb).await?;
    let judged = resource::judge(&history, &balances, &done);
    for id in ids {
        let u = id.as_uuid();
        match rows.get(&u) {
            Some((st, _)) if st == "done" => {
                if resource::complete(&judged, &u) {
                    v.done += 1;
                } else {
                    eprintln!("torture: LOST {u}: done but its history has missing steps");
                    v.lost += 1;
                }
            }
            // Checked below, against the cancel's promise.
            Some((st, _)) if st == "cancelled" => {}
            Some((st, reason)) if st == "dead" => {
                if reason.as_deref().is_some_and(|r| !r.is_empty()) && in_dlq.contains(&u) {
                    v.dead += 1;
                } else {
                    eprintln!("torture: LOST {u}: dead but not in the DLQ");
                    v.lost += 1;
                    v.lost_ids.push(*id);
                }
            }
            other => {
                eprintln!("torture: LOST {u}: {other:?}");
                v.lost += 1;
                v.lost_ids.push(*id);
            }
        }
    }
    (v.cancelled, v.cancel_violations) =
        cancel::check(pool, s, &judged, mariadb.is_none(), cancels).await?;
    v.history_rows = i64::try_from(history.len())?;
    v.double_commits = judged.double_commits;
    v.token_regressions = judged.token_regressions;
    v.ledger_violations = judged.ledger_violations;
    v.replays = judged.replays;
    let history: HashSet<(String, String, String)> = history
        .iter()
        .map(|h| (h.job.to_string(), h.step.to_string(), h.token.to_string()))
        .collect();
    let transfers: HashSet<String> = ids.iter().map(ToString::to_string).collect();
    worker_records(dir, &history, &transfers, &mut v)?;
    Ok(v)
}

/// The jobs in the DLQ with a reason, every page.
async fn dead_lettered(client: &Client) -> anyhow::Result<HashSet<sqlx::types::Uuid>> {
    let mut in_dlq = HashSet::new();
    let mut after = 0;
    loop {
        let page = client.queue().dead_letters_after(after, 500).await?;
        let Some(last) = page.last() else { break };
        after = last.dlq_sequence;
        for d in &page {
            if let Some(id) = d.job_id
                && !d.reason.is_empty()
            {
                in_dlq.insert(id.as_uuid());
            }
        }
    }
    Ok(in_dlq)
}

/// The workers' own records of attempted commits: every `C` must have its
/// history row.
/// The workers' commit and refusal records of the transfers (the cron
/// ticks' are checked by `cron::check`).
fn worker_records(
    dir: &Path,
    history: &HashSet<(String, String, String)>,
    transfers: &HashSet<String>,
    v: &mut Verdict,
) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("commits") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let [kind, job, step, token] = parts[..] else {
                continue;
            };
            if !transfers.contains(job) {
                continue;
            }
            match kind {
                "C" => {
                    v.accepted_reported += 1;
                    if !history.contains(&(job.to_string(), step.to_string(), token.to_string())) {
                        eprintln!("torture: a worker reported commit {line} with no history row");
                        v.unconfirmed_commits += 1;
                    }
                }
                "S" => v.stale_rejected += 1,
                _ => {}
            }
        }
    }
    Ok(())
}

/// The workers' token-regression alarms (`A` records).
#[derive(Debug, Default)]
struct Alarms {
    total: u64,
    /// Alarms on a token that no restore without a bump handed out again: a
    /// false alarm (a worker that stalled between acquire and claim is not a
    /// regression) or a regression nobody injected.
    unexplained: u64,
}

fn regression_alarms(dir: &Path, reused: &[(i64, i64)]) -> anyhow::Result<Alarms> {
    let mut a = Alarms::default();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("commits") {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let ["A", _job, _step, token] = parts[..] else {
                continue;
            };
            let token: i64 = token.parse()?;
            a.total += 1;
            if !reused
                .iter()
                .any(|(at, before)| *at < token && token <= *before)
            {
                eprintln!(
                    "torture: unexplained regression alarm {line} (reused ranges {reused:?})"
                );
                a.unexplained += 1;
            }
        }
    }
    Ok(a)
}

/// Prints what is known of a lost job: its row, its history, the workers' records.
async fn diagnose(client: &Client, s: &str, id: JobId, dir: &Path) {
    match client.job(id).await {
        Ok(row) => eprintln!("torture: lost {id}: row {row:?}"),
        Err(e) => eprintln!("torture: lost {id}: row unreadable: {e}"),
    }
    let history: Result<Vec<(i64, i32, i64, String)>, _> = sqlx::query_as(&format!(
        "SELECT seq, step, token, worker FROM {s}.history WHERE job_id = $1 ORDER BY seq"
    ))
    .bind(id.as_uuid())
    .fetch_all(client.store().pool())
    .await;
    eprintln!("torture: lost {id}: history {history:?}");
    let needle = id.as_uuid().to_string();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if let Ok(text) = std::fs::read_to_string(&path) {
                for line in text.lines().filter(|l| l.contains(&needle)) {
                    eprintln!(
                        "torture: lost {id}: {}: {line}",
                        path.file_name().and_then(|n| n.to_str()).unwrap_or("?")
                    );
                }
            }
        }
    }
}

/// Prints who holds a lost job's lock key in etcd, and whether that lease lives.
async fn lock_holder(endpoints: &[String], ns: &str, id: JobId) {
    let Ok(mut etcd) = etcd_client::Client::connect(endpoints, None).await else {
        eprintln!("torture: lost {id}: etcd unreachable");
        return;
    };
    let key = format!("{ns}/jobs/{id}");
    match etcd.get(key.as_str(), None).await {
        Ok(resp) => match resp.kvs().first() {
            Some(kv) => {
                let ttl = etcd
                    .lease_time_to_live(kv.lease(), None)
                    .await
                    .map(|t| t.ttl())
                    .unwrap_or(-2);
                eprintln!(
                    "torture: lost {id}: lock key {key} held: lease={:x} create_revision={} \
                     value={:?} lease_ttl_left={ttl}s",
                    kv.lease(),
                    kv.create_revision(),
                    kv.value_str().unwrap_or("?")
                );
            }
            None => eprintln!("torture: lost {id}: no lock key {key}"),
        },
        Err(e) => eprintln!("torture: lost {id}: etcd get failed: {e}"),
    }
}
