//! The pipeline benchmark: fenced throughput against an unfenced baseline and the
//! machine's physical bounds, takeover latency, lease acquire latency and a
//! worker's peak RSS, all measured in one run on a dev stack it starts itself.
//!
//! `cargo bench -p tenure-benches --bench pipeline`
//!
//! Environment:
//! * `TENURE_BENCH_QUICK=1`: a short smoke run (one concurrency, fewer jobs and trials).
//! * `TENURE_BENCH_CONCURRENCY=8,32,128`: worker `max_in_flight` values.
//! * `TENURE_BENCH_JOBS=N`: jobs per throughput run.
//! * `TENURE_BENCH_TTL_MS=N`: lease TTL of the takeover trials (default 5000).
//! * `TENURE_BENCH_TRIALS=N`: takeover trials (default 24, at least 20 in a full run).
//! * `TENURE_BENCH_ONLY=throughput,enqueue,acquire,takeover,rss,partitions,scale,pickup,million`: run only these parts
//!   (the last line then reports NaN for what did not run).
//! * `TENURE_BENCH_PREFETCH=N`: the fenced worker's `Config::prefetch` (default:
//!   the `Config` default).
//! * `TENURE_BENCH_NO_HISTORY=1`: switch the job history off
//!   (`FenceStore::set_job_history(false)`) in the benchmark's schemas, to
//!   measure what it costs (it runs for the fenced runs and the unfenced
//!   baseline alike).
//! * `TENURE_BENCH_PARTITIONS=N`: partitions per job type of the partition-mode
//!   runs (default 16).
//! * `TENURE_BENCH_SCALE=1,2,4`: worker process counts of the scale-out part;
//!   `TENURE_BENCH_SCALE_LOCKS=1`: scale out in one-lock-per-job mode instead.
//! * `RUST_LOG=...`: logs of the in-process workers (and the worker children) to stderr.
//!
//! The `pickup` part (`pipeline/pickup.rs`) measures how soon an idle worker
//! starts a job, in both modes (line `pipeline.pickup`, `TENURE_BENCH_PICKUPS=N`
//! samples, default 30 quick, 100 full).
//!
//! The `million` part (`pipeline/million.rs`) measures throughput with a
//! million finished jobs and their history in the tables
//! (`TENURE_BENCH_PREFILL=N`), against empty ones, in both modes (line
//! `pipeline.million`); with `TENURE_BENCH_STATIO=1` every fenced run also
//! prints its buffer reads and hits per table and index and its HOT updates
//! (`pipeline.statio`).
//!
//! The `enqueue` part measures enqueue throughput with no worker running:
//! `Client::enqueue` with 64 in flight, and `Client::enqueue_many` one batch at a
//! time at batch sizes 1, 64 and 1000 (line `pipeline.enqueue`).
//!
//! Partition mode (`Config::partitions`, issue 20): at every concurrency the
//! throughput part also runs the fenced worker in partition mode, and counts
//! etcd's unary requests (its own `/metrics`) per job for both fenced modes;
//! the `partitions` part measures partition ownership moves (a crashed owner's
//! partitions taken, and the rebalance when a worker joins), the `scale` part
//! drains the same jobs with 1, 2 and 4 worker processes, and the `rss` part
//! measures the peak RSS in both modes.
//!
//! Writes `target/tenure-bench/pipeline.json`; prints one line per figure, the last
//! `pipeline: fenced_jobs_per_s=X unfenced_jobs_per_s=Y ratio=R partition_jobs_per_s=P
//! partition_ratio=Q etcd_requests_per_job=E takeover_p99_ms=T ttl_ms=L` (one line;
//! `E` is partition mode's).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Value, json};
use sqlx::postgres::{PgPool, PgPoolOptions};
use tenure::blocks::lease::{Acquire, Session};
use tenure::blocks::queue::{Delivery, Queue};
use tenure::devstack::DevStack;
use tenure::{Client, Config, FencingToken, JobId, StepIndex};
use tenure::{Worker, WorkerObserver};
use tenure_benches::{BenchInput, BenchJob, JOB_TYPE, create_table_sql, insert_sql};

#[path = "pipeline/million.rs"]
mod million;
#[path = "pipeline/partitions.rs"]
mod partitions;
#[path = "pipeline/pickup.rs"]
mod pickup;
use tokio::io::AsyncBufReadExt;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

struct Opts {
    quick: bool,
    concurrency: Vec<usize>,
    jobs: usize,
    ttl: Duration,
    trials: usize,
    bound_secs: f64,
    only: Option<Vec<String>>,
    partitions: u32,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Opts {
    fn from_env() -> Self {
        let quick = std::env::var("TENURE_BENCH_QUICK").is_ok_and(|v| v != "0" && !v.is_empty());
        let default_c = if quick { "32" } else { "8,32,128" };
        let concurrency = std::env::var("TENURE_BENCH_CONCURRENCY")
            .unwrap_or_else(|_| default_c.into())
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        Opts {
            partitions: env_or("TENURE_BENCH_PARTITIONS", 16),
            quick,
            concurrency,
            jobs: env_or("TENURE_BENCH_JOBS", if quick { 1000 } else { 4000 }),
            ttl: Duration::from_millis(env_or(
                "TENURE_BENCH_TTL_MS",
                if quick { 2000 } else { 5000 },
            )),
            trials: env_or("TENURE_BENCH_TRIALS", if quick { 4 } else { 24 }),
            bound_secs: if quick { 1.5 } else { 3.0 },
            only: std::env::var("TENURE_BENCH_ONLY")
                .ok()
                .map(|v| v.split(',').map(|p| p.trim().to_string()).collect()),
        }
    }

    fn runs(&self, part: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|p| p == part))
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn stats_ms(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.total_cmp(b));
    json!({
        "n": v.len(),
        "p50_ms": round1(percentile(&v, 50.0)),
        "p99_ms": round1(percentile(&v, 99.0)),
        "min_ms": round1(v.first().copied().unwrap_or(f64::NAN)),
        "max_ms": round1(v.last().copied().unwrap_or(f64::NAN)),
    })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn config(stack: &DevStack, ns: &str) -> Config {
    config_with(stack, ns, None)
}

/// [`config`] in partition mode when `partitions` is given.
fn config_with(stack: &DevStack, ns: &str, partitions: Option<u32>) -> Config {
    let mut cfg = Config::new(ns)
        .with_schema(ns)
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_nats_url(stack.nats_url())
        .with_database_url(stack.database_url());
    cfg.partitions = partitions;
    match std::env::var("TENURE_BENCH_PREFETCH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(prefetch) => cfg.with_prefetch(prefetch),
        None => cfg,
    }
}

/// A fresh namespace with its schema, the bench table and the streams.
async fn namespace(stack: &DevStack, prefix: &str) -> Result<(String, Client)> {
    namespace_with(stack, prefix, None).await
}

/// [`namespace`], recorded in partition mode when `partitions` is given.
async fn namespace_with(
    stack: &DevStack,
    prefix: &str,
    partitions: Option<u32>,
) -> Result<(String, Client)> {
    let ns = DevStack::unique_namespace(prefix);
    let client = Client::connect(&config_with(stack, &ns, partitions)).await?;
    client.migrate().await?;
    sqlx::query(&create_table_sql(&ns))
        .execute(client.store().pool())
        .await?;
    if std::env::var("TENURE_BENCH_NO_HISTORY").is_ok_and(|v| v == "1") {
        client.set_job_history(false).await?;
    }
    Ok((ns, client))
}

/// Enqueues `n` bench jobs through `Client::enqueue` (64 at a time); returns jobs/s.
async fn enqueue(client: &Client, n: usize, input: impl Fn(u64) -> BenchInput) -> Result<f64> {
    let started = Instant::now();
    let inputs: Vec<BenchInput> = (0..n as u64).map(input).collect();
    let mut results = futures::stream::iter(inputs.into_iter().map(|inp| {
        let client = client.clone();
        async move {
            client
                .enqueue::<BenchJob>(&format!("job-{}", inp.n), &inp)
                .await
        }
    }))
    .buffer_unordered(64);
    while let Some(r) = results.next().await {
        r?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Enqueue throughput (no worker running): `Client::enqueue`, 64 in flight,
/// then `Client::enqueue_many` one batch at a time at each size of
/// `ENQUEUE_BATCHES`; `n` jobs each, in a namespace of their own. Returns
/// jobs/s per mode.
async fn enqueue_throughput(stack: &DevStack, n: usize) -> Result<Vec<(String, f64)>> {
    let mut out = Vec::new();
    let (_, client) = namespace(stack, "bench_enq").await?;
    let single = enqueue(&client, n, |i| BenchInput {
        n: i,
        ..BenchInput::default()
    })
    .await?;
    out.push(("enqueue_c64".to_string(), single));
    out.extend(tombstone_guard_cost(stack, n).await?);
    for b in ENQUEUE_BATCHES {
        let (_, client) = namespace(stack, "bench_enq_many").await?;
        let items: Vec<(String, BenchInput)> = (0..n as u64)
            .map(|i| {
                (
                    format!("job-{i}"),
                    BenchInput {
                        n: i,
                        ..BenchInput::default()
                    },
                )
            })
            .collect();
        let started = Instant::now();
        for chunk in items.chunks(b) {
            for r in client.enqueue_many::<BenchJob>(chunk).await? {
                r?;
            }
        }
        out.push((
            format!("enqueue_many_b{b}"),
            n as f64 / started.elapsed().as_secs_f64(),
        ));
    }
    Ok(out)
}

/// What the tombstone guard (migration 0014's `jobs_refuse_tombstoned`
/// trigger) costs an enqueue: `Client::enqueue`, 64 in flight, with the
/// trigger and without it, alternating twice in fresh namespaces (the best
/// of two each). The insert's `NOT EXISTS` probe of `job_tombstones` stays in
/// both.
async fn tombstone_guard_cost(stack: &DevStack, n: usize) -> Result<Vec<(String, f64)>> {
    let (mut on, mut off) = (0.0_f64, 0.0_f64);
    for guarded in [true, false, true, false] {
        let (ns, client) = namespace(stack, "bench_enq_guard").await?;
        if !guarded {
            let sql = format!("ALTER TABLE {ns}.jobs DISABLE TRIGGER jobs_refuse_tombstoned");
            sqlx::query(&sql).execute(client.store().pool()).await?;
        }
        let rate = enqueue(&client, n, |i| BenchInput {
            n: i,
            ..BenchInput::default()
        })
        .await?;
        let best = if guarded { &mut on } else { &mut off };
        *best = best.max(rate);
    }
    Ok(vec![
        ("enqueue_c64_guarded".to_string(), on),
        ("enqueue_c64_unguarded".to_string(), off),
    ])
}

/// The batch sizes of the enqueue benchmark.
const ENQUEUE_BATCHES: [usize; 3] = [1, 64, 1000];

/// Counts last-step commits.
#[derive(Default)]
struct Done {
    n: AtomicU64,
    notify: Notify,
}

impl Done {
    fn add(&self) {
        self.n.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }
    async fn wait_for(&self, n: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.n.load(Ordering::Relaxed) < n {
            if tokio::time::timeout_at(deadline, self.notify.notified())
                .await
                .is_err()
            {
                bail!(
                    "only {} of {n} jobs done after {timeout:?}",
                    self.n.load(Ordering::Relaxed)
                );
            }
        }
        Ok(())
    }
}

impl WorkerObserver for Done {
    fn step_committed(&self, _job_id: JobId, step: StepIndex, _token: FencingToken) {
        if step.get() == 2 {
            self.add();
        }
    }
}

struct Run {
    jobs_per_s: f64,
    enqueue_per_s: f64,
    secs: f64,
    /// CPU milliseconds per job: etcd (3 members), nats, postgres, this process.
    cpu: Cpu,
    /// etcd unary requests per job while the jobs ran (fenced runs only).
    etcd_requests_per_job: f64,
}

/// CPU time (ms) by component.
#[derive(Clone, Copy, Default, Debug)]
struct Cpu {
    etcd: f64,
    nats: f64,
    pg: f64,
    client: f64,
}

impl Cpu {
    /// Reads utime+stime of every process in each server's process group (each
    /// server is its own group; PostgreSQL backends are the postmaster's children,
    /// and those that ended are in its cutime+cstime) and of this process (where
    /// the benchmarked worker runs).
    fn now(stack: &DevStack) -> Cpu {
        let tick_ms = 10.0; // CLK_TCK = 100
        let etcd: Vec<u32> = (0..stack.etcd_members())
            .filter_map(|i| stack.etcd_member(i).pid())
            .collect();
        let nats = stack.nats().pid();
        let pg = stack.postgres().pid();
        let me = std::process::id();
        let mut cpu = Cpu::default();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return cpu;
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            // After the comm: state(0) ppid(1) pgrp(2) ... utime(11) stime(12).
            let (Some(ppid), Some(pgrp), Some(ut), Some(st)) = (
                f.get(1).and_then(|v| v.parse::<u32>().ok()),
                f.get(2).and_then(|v| v.parse::<u32>().ok()),
                f.get(11).and_then(|v| v.parse::<f64>().ok()),
                f.get(12).and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            let mut ms = (ut + st) * tick_ms;
            if Some(pid) == pg {
                // Backends that ended (and autovacuum workers) count too: their
                // time lands in the postmaster's cutime/cstime when reaped.
                let reaped = f.get(13).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
                    + f.get(14).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                ms += reaped * tick_ms;
            }
            if etcd.contains(&pgrp) {
                cpu.etcd += ms;
            } else if Some(pgrp) == nats {
                cpu.nats += ms;
            } else if Some(pgrp) == pg || Some(ppid) == pg {
                // PostgreSQL backends call setsid(): they are the postmaster's
                // children but not in its process group.
                cpu.pg += ms;
            } else if pid == me {
                cpu.client += ms;
            }
        }
        cpu
    }

    fn per_job_since(self, before: Cpu, jobs: usize) -> Cpu {
        let n = jobs as f64;
        Cpu {
            etcd: (self.etcd - before.etcd) / n,
            nats: (self.nats - before.nats) / n,
            pg: (self.pg - before.pg) / n,
            client: (self.client - before.client) / n,
        }
    }

    fn json(&self) -> Value {
        json!({
            "etcd_ms": (self.etcd * 1000.0).round() / 1000.0,
            "nats_ms": (self.nats * 1000.0).round() / 1000.0,
            "postgres_ms": (self.pg * 1000.0).round() / 1000.0,
            "worker_ms": (self.client * 1000.0).round() / 1000.0,
        })
    }

    fn line(&self) -> String {
        format!(
            "cpu_ms_per_job(etcd={:.3} nats={:.3} pg={:.3} worker={:.3} total={:.3})",
            self.etcd,
            self.nats,
            self.pg,
            self.client,
            self.etcd + self.nats + self.pg + self.client
        )
    }
}

/// Fenced: one Tenure worker with `max_in_flight = c` drains `n` pre-enqueued
/// jobs (in partition mode with `partitions`: timed once it owns them all).
async fn fenced_run(stack: &DevStack, c: usize, n: usize, partitions: Option<u32>) -> Result<Run> {
    fenced_run_with(stack, c, n, partitions, 0).await
}

/// [`fenced_run`] in a namespace holding `prefill` finished jobs and their
/// history first (`pipeline/million.rs`).
async fn fenced_run_with(
    stack: &DevStack,
    c: usize,
    n: usize,
    partitions: Option<u32>,
    prefill: i64,
) -> Result<Run> {
    let prefix = if partitions.is_some() {
        "bench_part"
    } else {
        "bench_fenced"
    };
    let (ns, client) = namespace_with(stack, prefix, partitions).await?;
    if prefill > 0 {
        million::prefill(&client, &ns, prefill).await?;
    }
    let enqueue_per_s = enqueue(&client, n, |i| BenchInput {
        n: i,
        ..BenchInput::default()
    })
    .await?;
    let done = Arc::new(Done::default());
    let mut cfg = config_with(stack, &ns, partitions).with_worker_id(format!("fenced-{c}"));
    cfg.max_in_flight = c;
    let worker = Worker::builder(cfg.clone())
        .register(BenchJob::new("fenced", &ns))
        .observer(done.clone())
        .start()
        .await?;
    if let Some(p) = partitions {
        partitions::wait_owned(&cfg, p as usize, 1).await?;
    }
    let io0 = million::Io::now(client.store().pool(), &ns).await?;
    let multixact0 = partitions::next_multixact(client.store().pool()).await?;
    let etcd0 = stack.etcd_unary_requests().await?;
    let waits = partitions::LockWaits::start(client.store().pool().clone());
    let cpu0 = Cpu::now(stack);
    let started = Instant::now();
    done.wait_for(n as u64, Duration::from_secs(600)).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = Cpu::now(stack).per_job_since(cpu0, n);
    let etcd_requests = stack.etcd_unary_requests().await? - etcd0;
    let (samples, waiting, most) = waits.finish().await?;
    let multixacts = partitions::next_multixact(client.store().pool()).await? - multixact0;
    println!(
        "pipeline.pg_locks mode={} c={c} lock_wait_samples={waiting}/{samples} most_waiting={most} multixacts_created={multixacts}",
        if partitions.is_some() {
            "partition"
        } else {
            "fenced"
        }
    );
    worker.shutdown().await?;
    if std::env::var("TENURE_BENCH_STATIO").is_ok_and(|v| v == "1") {
        // The workers' last statistics reach the views as their connections close.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let io = million::Io::now(client.store().pool(), &ns).await?;
        io.print_since(&io0, &format!("prefill={prefill}"), n);
    }
    let rows: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {ns}.jobs WHERE status = 'done'"
    ))
    .fetch_one(client.store().pool())
    .await?;
    // The prefilled jobs: one in ten dead, the rest done.
    let prefilled_done = prefill - prefill / 10;
    if rows != n as i64 + prefilled_done {
        bail!("fenced run: {rows} of {n} job rows done (+{prefilled_done} prefilled)");
    }
    Ok(Run {
        jobs_per_s: n as f64 / secs,
        enqueue_per_s,
        secs,
        cpu,
        etcd_requests_per_job: etcd_requests as f64 / n as f64,
    })
}

/// What the unfenced baseline does per job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Baseline {
    /// Per step one transaction: the same `INSERT` as the fenced step plus an
    /// unfenced checkpoint `UPDATE` of the job row (what any durable multi-step
    /// runner records). No etcd, no claim, no admission `FOR UPDATE`, no fence.
    Checkpointed,
    /// Per step one transaction with only the `INSERT` (no job-row state at all).
    Bare,
}

/// The unfenced baseline: the same JetStream consumer (`Queue::fetch`/`ack`,
/// fetching up to the free slots like the runtime's fetcher), the same job rows
/// (read at admission like the runtime does), the same three step writes, each
/// step its own transaction; no etcd, no fence checks.
async fn unfenced_run(stack: &DevStack, c: usize, n: usize, mode: Baseline) -> Result<Run> {
    let (ns, client) = namespace(stack, "bench_plain").await?;
    let enqueue_per_s = enqueue(&client, n, |i| BenchInput {
        n: i,
        ..BenchInput::default()
    })
    .await?;
    let cfg = config(stack, &ns).with_worker_id(format!("plain-{c}"));
    let queue = Queue::provision(&cfg).await?;
    // Same pool shape as the runtime's FenceStore (max_in_flight + 4).
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(c + 4)?)
        .connect(&cfg.database_url)
        .await?;
    let job = BaselineJob::new(&ns, pool.clone(), mode);
    let done = job.done.clone();
    let cpu0 = Cpu::now(stack);
    let started = Instant::now();
    let fetcher = tokio::spawn(baseline_fetcher(queue, c, job));
    let waited = done.wait_for(n as u64, Duration::from_secs(600)).await;
    let secs = started.elapsed().as_secs_f64();
    let cpu = Cpu::now(stack).per_job_since(cpu0, n);
    fetcher.abort();
    let _ = fetcher.await;
    waited?;
    pool.close().await;
    Ok(Run {
        jobs_per_s: n as f64 / secs,
        enqueue_per_s,
        secs,
        cpu,
        etcd_requests_per_job: f64::NAN,
    })
}

/// What the baseline needs to run a delivered job: the pool, its statements,
/// its mode, and the count of jobs done.
#[derive(Clone)]
struct BaselineJob {
    pool: PgPool,
    insert: Arc<str>,
    read: Arc<str>,
    checkpoint: Arc<str>,
    mode: Baseline,
    done: Arc<Done>,
}

impl BaselineJob {
    /// The baseline's jobs of namespace `ns`.
    fn new(ns: &str, pool: PgPool, mode: Baseline) -> Self {
        BaselineJob {
            pool,
            insert: Arc::from(insert_sql(ns)),
            read: Arc::from(format!(
                "SELECT step, input, status FROM {ns}.jobs WHERE id = $1"
            )),
            checkpoint: Arc::from(format!(
                "UPDATE {ns}.jobs SET step = step + 1, checkpoint = $2, \
                 status = CASE WHEN $3 THEN 'done' ELSE 'running' END, updated_at = now() WHERE id = $1"
            )),
            mode,
            done: Arc::new(Done::default()),
        }
    }

    /// Runs a delivered job: reads its row, writes its remaining steps (one
    /// transaction each), acks; counts it done, or prints why it failed.
    async fn run(&self, d: Delivery) {
        let run = async {
            let id = d.job_id()?;
            let (step, input, status): (i32, Value, String) = sqlx::query_as(&self.read)
                .bind(id.as_uuid())
                .fetch_one(&self.pool)
                .await?;
            if status != "done" {
                for k in step..3 {
                    self.step(id, k, &input).await?;
                }
            }
            d.ack().await?;
            anyhow::Ok(())
        };
        match run.await {
            Ok(()) => self.done.add(),
            Err(e) => eprintln!("baseline job failed: {e:#}"),
        }
    }

    /// Step `k` of job `id`: the bench row, and in checkpointed mode the job row.
    async fn step(&self, id: JobId, k: i32, input: &Value) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&self.insert)
            .bind(id.as_uuid())
            .bind(k)
            .bind(0i64)
            .execute(&mut *tx)
            .await?;
        if self.mode == Baseline::Checkpointed {
            sqlx::query(&self.checkpoint)
                .bind(id.as_uuid())
                .bind(input)
                .bind(k == 2)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// The baseline's fetcher: fetches up to the free ones of `c` slots, and runs
/// each delivery in a task of its own, which frees its slot when it ends.
async fn baseline_fetcher(queue: Queue, c: usize, job: BaselineJob) {
    let permits = Arc::new(Semaphore::new(c));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let Some(mut slots) = free_slots(&permits, c).await else {
            return;
        };
        let Ok(deliveries) = queue
            .fetch(JOB_TYPE, slots.len(), Duration::from_millis(500))
            .await
        else {
            continue;
        };
        while tasks.try_join_next().is_some() {}
        for d in deliveries {
            let Some(slot) = slots.pop() else { break };
            let job = job.clone();
            tasks.spawn(async move {
                job.run(d).await;
                drop(slot);
            });
        }
    }
}

/// Waits for a free slot, then takes every other free one (`c` at most);
/// `None` once the semaphore is closed.
async fn free_slots(permits: &Arc<Semaphore>, c: usize) -> Option<Vec<OwnedSemaphorePermit>> {
    let first = permits.clone().acquire_owned().await.ok()?;
    let mut slots = vec![first];
    while slots.len() < c {
        match permits.clone().try_acquire_owned() {
            Ok(p) => slots.push(p),
            Err(_) => break,
        }
    }
    Some(slots)
}

/// Raw etcd: `c` concurrent loops of create-if-absent (with a lease) + guarded
/// delete on distinct keys, over 4 clients; pairs per second.
async fn etcd_bound(stack: &DevStack, c: usize, secs: f64) -> Result<f64> {
    let ns = DevStack::unique_namespace("bench_raw_etcd");
    let mut clients = Vec::new();
    for _ in 0..c.clamp(1, 4) {
        clients.push(etcd_client::Client::connect(stack.etcd_endpoints(), None).await?);
    }
    let lease = clients[0].lease_grant(60, None).await?.id();
    let pairs = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..c {
        let mut kv = clients[t % clients.len()].kv_client();
        let (pairs, ns) = (pairs.clone(), ns.clone());
        tasks.spawn(async move {
            use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
            let mut i = 0u64;
            while Instant::now() < deadline {
                let key = format!("{ns}/jobs/{t}-{i}");
                let create = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.as_str(),
                        "x",
                        Some(PutOptions::new().with_lease(lease)),
                    )]);
                let r = kv.txn(create).await?;
                let rev = r.header().map(|h| h.revision()).unwrap_or_default();
                let delete = Txn::new()
                    .when([Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        rev,
                    )])
                    .and_then([TxnOp::delete(key.as_str(), None)]);
                kv.txn(delete).await?;
                pairs.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        });
    }
    let started = Instant::now();
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let _ = clients[0].lease_revoke(lease).await;
    Ok(pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Raw PostgreSQL: `c` concurrent loops of `BEGIN; SELECT .. FOR UPDATE; UPDATE;
/// COMMIT` on distinct rows; commits per second.
async fn pg_bound(stack: &DevStack, c: usize, secs: f64) -> Result<f64> {
    let ns = DevStack::unique_namespace("bench_raw_pg");
    let pool: PgPool = PgPoolOptions::new()
        .max_connections(u32::try_from(c)?)
        .connect(&stack.database_url())
        .await?;
    sqlx::query(&format!("CREATE SCHEMA {ns}"))
        .execute(&pool)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE {ns}.rows (id int PRIMARY KEY, step int NOT NULL, checkpoint jsonb)"
    ))
    .execute(&pool)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO {ns}.rows SELECT g, 0, NULL FROM generate_series(0, $1) g"
    ))
    .bind(i32::try_from(c)?)
    .execute(&pool)
    .await?;
    let select: Arc<str> = Arc::from(format!(
        "SELECT step FROM {ns}.rows WHERE id = $1 FOR UPDATE"
    ));
    let update: Arc<str> = Arc::from(format!(
        "UPDATE {ns}.rows SET step = step + 1, checkpoint = $2 WHERE id = $1 AND step = $3"
    ));
    let commits = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..c {
        let (pool, commits, select, update) = (
            pool.clone(),
            commits.clone(),
            select.clone(),
            update.clone(),
        );
        let id = i32::try_from(t)?;
        tasks.spawn(async move {
            let cp = json!({"n": 1});
            while Instant::now() < deadline {
                let mut tx = pool.begin().await?;
                let step: i32 = sqlx::query_scalar(&select)
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
                sqlx::query(&update)
                    .bind(id)
                    .bind(&cp)
                    .bind(step)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                commits.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
    }
    let started = Instant::now();
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let rate = commits.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    sqlx::query(&format!("DROP SCHEMA {ns} CASCADE"))
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(rate)
}

/// Lease acquire latency: `n` sequential `Session::acquire` calls on distinct
/// jobs (create-if-absent Txn + linearizable re-read), each lock released after.
async fn acquire_latency(stack: &DevStack, n: usize) -> Result<Vec<f64>> {
    let ns = DevStack::unique_namespace("bench_acquire");
    let session = Session::establish(&config(stack, &ns)).await?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let id = JobId::from_key(JOB_TYPE, &format!("acq-{i}"));
        let t = Instant::now();
        let a = session.acquire(id).await?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
        match a {
            Acquire::Acquired(lock) => {
                lock.release(&session).await?;
            }
            other => bail!("acquire of a fresh job: {other:?}"),
        }
    }
    session.close().await?;
    Ok(out)
}

/// A `tenure-bench-worker` child process and the lines it printed.
struct Child {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
    _reader: tokio::task::JoinHandle<()>,
}

impl Child {
    async fn spawn(
        stack: &DevStack,
        ns: &str,
        id: &str,
        ttl: Duration,
        max_in_flight: Option<usize>,
        partitions: Option<u32>,
    ) -> Result<Self> {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tenure-bench-worker"));
        cmd.args([
            "--etcd",
            &stack.etcd_endpoints().join(","),
            "--nats",
            &stack.nats_url(),
            "--db",
            &stack.database_url(),
            "--ns",
            ns,
            "--ttl-ms",
            &ttl.as_millis().to_string(),
            "--worker",
            id,
        ]);
        if let Some(n) = max_in_flight {
            cmd.args(["--max-in-flight", &n.to_string()]);
        }
        if let Some(p) = partitions {
            cmd.args(["--partitions", &p.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("spawn tenure-bench-worker")?;
        let out = child.stdout.take().context("stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = tokio::spawn(async move {
            let mut rd = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = rd.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        let c = Child {
            child,
            lines,
            _reader: reader,
        };
        c.wait_line(|l| l.starts_with("READY"), Duration::from_secs(30))
            .await
            .context("worker child READY")?;
        Ok(c)
    }

    fn pid(&self) -> Result<i32> {
        Ok(i32::try_from(self.child.id().context("child exited")?)?)
    }

    fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()?), sig)?;
        Ok(())
    }

    fn last_line(&self, f: impl Fn(&str) -> bool) -> Option<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|l| f(l))
            .cloned()
    }

    async fn wait_line(&self, f: impl Fn(&str) -> bool, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.last_line(&f) {
                return Ok(l);
            }
            if Instant::now() > deadline {
                bail!("no such line after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `VmHWM` and `VmRSS` of the child, in KiB.
    fn memory_kib(&self) -> Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?))?;
        let field = |name: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{name} in /proc/pid/status"))
        };
        Ok((field("VmHWM:")?, field("VmRSS:")?))
    }

    async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Records the instant each (job, step) commits.
#[derive(Default)]
struct Commits {
    seen: Mutex<Vec<(JobId, u32, Instant)>>,
    notify: Notify,
}

impl WorkerObserver for Commits {
    fn step_committed(&self, job_id: JobId, step: StepIndex, _token: FencingToken) {
        self.seen
            .lock()
            .unwrap()
            .push((job_id, step.get(), Instant::now()));
        self.notify.notify_one();
    }
}

/// One lane of takeover trials, sequential, in its own namespace: worker A (a
/// child process) commits step 0 of a job and holds in step 1; worker B (in this
/// process, default `Config` but the TTL) is running; A is frozen with SIGSTOP;
/// the latency is the time from the freeze until B commits step 1.
async fn takeover_lane(
    stack: &DevStack,
    lane: usize,
    trials: usize,
    ttl: Duration,
) -> Result<Vec<f64>> {
    let (ns, client) = namespace(stack, &format!("bench_takeover{lane}")).await?;
    let mut out = Vec::new();
    for trial in 0..trials {
        let a_id = format!("a{lane}x{trial}");
        let a = Child::spawn(stack, &ns, &a_id, ttl, None, None).await?;
        let job = client
            .enqueue::<BenchJob>(
                &format!("takeover-{trial}"),
                &BenchInput {
                    n: trial as u64,
                    hold_worker: Some(a_id.clone()),
                    hold_step: 1,
                    hold_ms: u64::try_from(ttl.as_millis() * 20)?,
                },
            )
            .await?
            .job_id;
        let commit0 = format!("COMMIT {job} 0 ");
        a.wait_line(|l| l.starts_with(&commit0), Duration::from_secs(60))
            .await
            .context("A commits step 0")?;
        let commits = Arc::new(Commits::default());
        let mut cfg = config(stack, &ns)
            .with_worker_id(format!("b{lane}x{trial}"))
            .with_lease_ttl(ttl);
        cfg.shutdown_grace = Duration::from_secs(2);
        let b = Worker::builder(cfg)
            .register(BenchJob::new("b", &ns))
            .observer(commits.clone())
            .start()
            .await?;
        // Freeze A at a random point of its keepalive and progress-ack cycles.
        let jitter = rand_ms(u64::try_from(ttl.as_millis() / 3)?);
        tokio::time::sleep(Duration::from_millis(100 + jitter)).await;
        a.signal(nix::sys::signal::Signal::SIGSTOP)?;
        let frozen = Instant::now();
        let deadline = frozen + ttl * 10 + Duration::from_secs(10);
        let committed = loop {
            let hit = commits
                .seen
                .lock()
                .unwrap()
                .iter()
                .find(|(j, s, _)| *j == job && *s == 1)
                .map(|(_, _, t)| *t);
            if let Some(t) = hit {
                break t;
            }
            if tokio::time::timeout_at(deadline, commits.notify.notified())
                .await
                .is_err()
            {
                bail!("lane {lane} trial {trial}: B did not commit step 1");
            }
        };
        let ms = (committed - frozen).as_secs_f64() * 1e3;
        tracing::info!(lane, trial, %job, ms, "takeover trial");
        out.push(ms);
        b.shutdown().await?;
        a.kill().await;
    }
    Ok(out)
}

fn rand_ms(max: u64) -> u64 {
    // No rand dependency needed: the sub-second clock is random enough here.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0);
    if max == 0 { 0 } else { nanos % max }
}

/// Peak RSS of a worker process with 1,000 jobs in flight (each holding in step 0).
async fn rss_with_jobs_in_flight(
    stack: &DevStack,
    n: usize,
    partitions: Option<u32>,
) -> Result<Value> {
    let (ns, client) = namespace_with(stack, "bench_rss", partitions).await?;
    let id = "rss";
    let ttl = Duration::from_secs(5);
    let w = Child::spawn(stack, &ns, id, ttl, Some(n), partitions).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle_hwm, idle_rss) = w.memory_kib()?;
    enqueue(&client, n, |i| BenchInput {
        n: i,
        hold_worker: Some(id.into()),
        hold_step: 0,
        hold_ms: 600_000,
    })
    .await?;
    let want = format!("INFLIGHT {n}");
    w.wait_line(|l| l == want, Duration::from_secs(120))
        .await
        .context("1,000 jobs in flight")?;
    // Every job claimed (its row running) and holding in step 0.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let running: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {ns}.jobs WHERE status = 'running'"
        ))
        .fetch_one(client.store().pool())
        .await?;
        if running == n as i64 {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {running} of {n} jobs claimed");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let progress acks and keepalives run a while with everything in flight.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (hwm, rss) = w.memory_kib()?;
    w.kill().await;
    Ok(json!({
        "jobs_in_flight": n,
        "peak_rss_mib": round1(hwm as f64 / 1024.0),
        "rss_mib": round1(rss as f64 / 1024.0),
        "idle_peak_rss_mib": round1(idle_hwm as f64 / 1024.0),
        "idle_rss_mib": round1(idle_rss as f64 / 1024.0),
    }))
}

fn output_path() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        });
    target.join("tenure-bench").join("pipeline.json")
}

#[tokio::main]
async fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; nothing else to parse.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let opts = Opts::from_env();
    let wall = Instant::now();
    let uptime_before = load();
    println!(
        "pipeline.setup quick={} concurrency={:?} jobs={} ttl_ms={} trials={} loadavg_before=\"{}\" cores={}",
        opts.quick,
        opts.concurrency,
        opts.jobs,
        opts.ttl.as_millis(),
        opts.trials,
        uptime_before,
        cores(),
    );
    let stack = DevStack::start().await?;
    let results = Results::measure(&stack, &opts).await?;
    let uptime_after = load();
    let out = results.json(&opts, &uptime_before, &uptime_after, wall);
    let path = output_path();
    std::fs::create_dir_all(path.parent().context("output dir")?)?;
    std::fs::write(&path, serde_json::to_string_pretty(&out)?)?;
    println!(
        "pipeline.meta json={} wall_secs={:.0} loadavg_after=\"{uptime_after}\"",
        path.display(),
        wall.elapsed().as_secs_f64()
    );
    results.print_headline(&opts);
    drop(stack);
    Ok(())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// Rounded to three decimals.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Everything a run measured, part by part (empty for the parts that did not run).
struct Results {
    /// One JSON row per concurrency.
    throughput: Vec<Value>,
    headline: Headline,
    enqueue: serde_json::Map<String, Value>,
    acquire: Value,
    takeover_samples: Vec<f64>,
    takeover: Value,
    rss: Value,
    partition_rss: Value,
    partition_crash: Value,
    partition_join: Value,
    scale: Vec<(usize, f64)>,
    pickup: Value,
    million: Value,
}

impl Results {
    /// Runs every part `opts` asks for, in order, printing each one's lines.
    async fn measure(stack: &DevStack, opts: &Opts) -> Result<Results> {
        let (throughput, headline) = throughput(stack, opts).await?;
        let enqueue = enqueue_part(stack, opts).await?;
        let acquire = acquire_part(stack, opts).await?;
        let (takeover_samples, takeover) = takeover_part(stack, opts).await?;
        let (rss, partition_rss) = rss_part(stack, opts).await?;
        let (partition_crash, partition_join) = partition_moves_part(stack, opts).await?;
        let scale = scale_part(stack, opts).await?;
        let pickup = if opts.runs("pickup") {
            let n = env_or("TENURE_BENCH_PICKUPS", if opts.quick { 30 } else { 100 });
            pickup::part(stack, n, opts.partitions).await?
        } else {
            json!({})
        };
        let million = if opts.runs("million") {
            let rows = env_or("TENURE_BENCH_PREFILL", 1_000_000);
            let c = *opts.concurrency.first().context("no concurrency")?;
            million::part(stack, c, opts.jobs, rows, opts.partitions).await?
        } else {
            json!({})
        };
        Ok(Results {
            throughput,
            headline,
            enqueue,
            acquire,
            takeover_samples,
            takeover,
            rss,
            partition_rss,
            partition_crash,
            partition_join,
            scale,
            pickup,
            million,
        })
    }

    /// The contents of `pipeline.json`.
    fn json(&self, opts: &Opts, uptime_before: &str, uptime_after: &str, wall: Instant) -> Value {
        json!({
            "quick": opts.quick,
            "loadavg_before": uptime_before,
            "loadavg_after": uptime_after,
            "cores": cores(),
            "postgres_fsync": false,
            "throughput": self.throughput,
            "headline": self.headline.json(),
            "enqueue": self.enqueue,
            "lease_acquire": self.acquire,
            "takeover": {
                "ttl_ms": opts.ttl.as_millis() as u64,
                "samples_ms": self.takeover_samples.iter().map(|x| round1(*x)).collect::<Vec<_>>(),
                "stats": self.takeover,
            },
            "rss": self.rss,
            "partition": {
                "partitions": opts.partitions,
                "rss": self.partition_rss,
                "takeover_after_crash": self.partition_crash,
                "rebalance_on_join": self.partition_join,
                "scale_out_jobs_per_s": self.scale
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(round1(*v))))
                    .collect::<serde_json::Map<String, Value>>(),
            },
            "pickup": self.pickup,
            "million": self.million,
            "wall_secs": round1(wall.elapsed().as_secs_f64()),
        })
    }

    /// The last line, `pipeline: fenced_jobs_per_s=...`.
    fn print_headline(&self, opts: &Opts) {
        let h = &self.headline;
        println!(
            "pipeline: fenced_jobs_per_s={:.0} unfenced_jobs_per_s={:.0} ratio={:.2} partition_jobs_per_s={:.0} partition_ratio={:.2} etcd_requests_per_job={:.3} takeover_p99_ms={:.0} ttl_ms={}",
            h.fenced,
            h.unfenced,
            h.fenced / h.unfenced,
            h.partition,
            h.partition / h.unfenced,
            h.partition_etcd,
            self.takeover["p99_ms"].as_f64().unwrap_or(f64::NAN),
            opts.ttl.as_millis()
        );
    }
}

/// The throughput at the concurrency where the fenced worker was fastest.
struct Headline {
    concurrency: usize,
    fenced: f64,
    unfenced: f64,
    partition: f64,
    partition_etcd: f64,
}

impl Headline {
    /// No throughput measured.
    const NONE: Headline = Headline {
        concurrency: 0,
        fenced: f64::NAN,
        unfenced: f64::NAN,
        partition: f64::NAN,
        partition_etcd: f64::NAN,
    };

    fn json(&self) -> Value {
        json!({
            "concurrency": self.concurrency,
            "fenced_jobs_per_s": round1(self.fenced),
            "unfenced_jobs_per_s": round1(self.unfenced),
            "ratio": round3(self.fenced / self.unfenced),
            "partition_jobs_per_s": round1(self.partition),
            "partition_ratio": round3(self.partition / self.unfenced),
            "partition_etcd_requests_per_job": self.partition_etcd,
        })
    }
}

/// The throughput part: a warm-up, then the figures at every concurrency.
/// Returns their JSON rows and the headline.
async fn throughput(stack: &DevStack, opts: &Opts) -> Result<(Vec<Value>, Headline)> {
    let mut rows = Vec::new();
    let mut best: Option<Headline> = None;
    if !opts.runs("throughput") {
        return Ok((rows, Headline::NONE));
    }
    // Warm-up (PostgreSQL caches, first connections), not reported.
    let warm = if opts.quick { 200 } else { 500 };
    let c0 = *opts.concurrency.first().context("no concurrency")?;
    fenced_run(stack, c0, warm, None).await?;
    fenced_run(stack, c0, warm, Some(opts.partitions)).await?;
    unfenced_run(stack, c0, warm, Baseline::Checkpointed).await?;
    for &c in &opts.concurrency {
        let figures = Figures::measure(stack, opts, c).await?;
        figures.print();
        rows.push(figures.json());
        if best
            .as_ref()
            .is_none_or(|b| figures.fenced.jobs_per_s > b.fenced)
        {
            best = Some(Headline {
                concurrency: c,
                fenced: figures.fenced.jobs_per_s,
                unfenced: figures.plain.jobs_per_s,
                partition: figures.part.jobs_per_s,
                partition_etcd: figures.part.etcd_requests_per_job,
            });
        }
    }
    Ok((rows, best.unwrap_or(Headline::NONE)))
}

/// The throughput figures at one concurrency.
struct Figures {
    c: usize,
    n: usize,
    partitions: u32,
    /// etcd create+delete pairs per second.
    etcd: f64,
    /// PostgreSQL `SELECT .. FOR UPDATE` + commit per second.
    pg: f64,
    plain: Run,
    fenced: Run,
    part: Run,
    bare: Run,
    loadavg: String,
}

impl Figures {
    /// The physical bounds, the checkpointed baseline, fenced, partition mode,
    /// the bare baseline; `opts.jobs` jobs each.
    async fn measure(stack: &DevStack, opts: &Opts, c: usize) -> Result<Figures> {
        let n = opts.jobs;
        let etcd = etcd_bound(stack, c, opts.bound_secs).await?;
        let pg = pg_bound(stack, c, opts.bound_secs).await?;
        let plain = unfenced_run(stack, c, n, Baseline::Checkpointed).await?;
        let fenced = fenced_run(stack, c, n, None).await?;
        let part = fenced_run(stack, c, n, Some(opts.partitions)).await?;
        let bare = unfenced_run(stack, c, n, Baseline::Bare).await?;
        Ok(Figures {
            c,
            n,
            partitions: opts.partitions,
            etcd,
            pg,
            plain,
            fenced,
            part,
            bare,
            loadavg: load(),
        })
    }

    /// Bounds in jobs/s: an unbatched job pays one etcd create+delete pair;
    /// a three-step fenced job needs at least three FOR UPDATE + CAS commits.
    /// Returns etcd's, PostgreSQL's, and the binding one's name and value.
    fn bounds(&self) -> (f64, f64, &'static str, f64) {
        let etcd_jobs = self.etcd;
        let pg_jobs = self.pg / 3.0;
        if etcd_jobs <= pg_jobs {
            (etcd_jobs, pg_jobs, "etcd", etcd_jobs)
        } else {
            (etcd_jobs, pg_jobs, "postgresql", pg_jobs)
        }
    }

    fn print(&self) {
        let Figures { c, n, etcd, pg, .. } = *self;
        let (plain, fenced, part, bare) = (&self.plain, &self.fenced, &self.part, &self.bare);
        let (etcd_jobs, pg_jobs, binding, bound) = self.bounds();
        let ratio = fenced.jobs_per_s / plain.jobs_per_s;
        let part_ratio = part.jobs_per_s / plain.jobs_per_s;
        let load_now = &self.loadavg;
        println!(
            "pipeline.bounds c={c} etcd_create_delete_pairs_per_s={etcd:.0} pg_select_for_update_commits_per_s={pg:.0} etcd_bound_jobs_per_s={etcd_jobs:.0} pg_bound_jobs_per_s={pg_jobs:.0} binding={binding}"
        );
        println!(
            "pipeline.unfenced c={c} jobs={n} secs={:.2} jobs_per_s={:.0} enqueue_per_s={:.0} {}",
            plain.secs,
            plain.jobs_per_s,
            plain.enqueue_per_s,
            plain.cpu.line()
        );
        println!(
            "pipeline.unfenced_bare c={c} jobs={n} secs={:.2} jobs_per_s={:.0} {}",
            bare.secs,
            bare.jobs_per_s,
            bare.cpu.line()
        );
        println!(
            "pipeline.fenced c={c} jobs={n} secs={:.2} jobs_per_s={:.0} enqueue_per_s={:.0} ratio={ratio:.2} ratio_vs_bare={:.2} fraction_of_{binding}_bound={:.2} {} loadavg=\"{load_now}\"",
            fenced.secs,
            fenced.jobs_per_s,
            fenced.enqueue_per_s,
            fenced.jobs_per_s / bare.jobs_per_s,
            fenced.jobs_per_s / bound,
            fenced.cpu.line(),
        );
        println!(
            "pipeline.fenced_etcd c={c} etcd_requests_per_job={:.3}",
            fenced.etcd_requests_per_job
        );
        println!(
            "pipeline.partition c={c} partitions={} jobs={n} secs={:.2} jobs_per_s={:.0} ratio={part_ratio:.2} etcd_requests_per_job={:.3} {}",
            self.partitions,
            part.secs,
            part.jobs_per_s,
            part.etcd_requests_per_job,
            part.cpu.line(),
        );
    }

    /// The row of `throughput` in `pipeline.json`.
    fn json(&self) -> Value {
        let (plain, fenced, part, bare) = (&self.plain, &self.fenced, &self.part, &self.bare);
        let (etcd_jobs, pg_jobs, binding, bound) = self.bounds();
        json!({
            "concurrency": self.c,
            "jobs": self.n,
            "fenced_jobs_per_s": round1(fenced.jobs_per_s),
            "partition_jobs_per_s": round1(part.jobs_per_s),
            "partition_ratio": round3(part.jobs_per_s / plain.jobs_per_s),
            "partitions": self.partitions,
            "etcd_requests_per_job": {
                "fenced": round3(fenced.etcd_requests_per_job),
                "partition": round3(part.etcd_requests_per_job),
            },
            "unfenced_jobs_per_s": round1(plain.jobs_per_s),
            "unfenced_bare_jobs_per_s": round1(bare.jobs_per_s),
            "ratio": round3(fenced.jobs_per_s / plain.jobs_per_s),
            "ratio_vs_bare": round3(fenced.jobs_per_s / bare.jobs_per_s),
            "enqueue_jobs_per_s": round1(fenced.enqueue_per_s),
            "etcd_create_delete_pairs_per_s": round1(self.etcd),
            "pg_select_for_update_commits_per_s": round1(self.pg),
            "etcd_bound_jobs_per_s": round1(etcd_jobs),
            "pg_bound_jobs_per_s": round1(pg_jobs),
            "binding_bound": binding,
            "fraction_of_binding_bound": round3(fenced.jobs_per_s / bound),
            "cpu_ms_per_job": {
                "fenced": fenced.cpu.json(),
                "partition": part.cpu.json(),
                "unfenced": plain.cpu.json(),
                "unfenced_bare": bare.cpu.json(),
            },
            "loadavg": self.loadavg,
        })
    }
}

/// The enqueue part (line `pipeline.enqueue`); returns its JSON.
async fn enqueue_part(stack: &DevStack, opts: &Opts) -> Result<serde_json::Map<String, Value>> {
    let n = if opts.quick { 2000 } else { 10_000 };
    let enq = if opts.runs("enqueue") {
        enqueue_throughput(stack, n).await?
    } else {
        Vec::new()
    };
    let enq_line: Vec<String> = enq
        .iter()
        .map(|(k, v)| format!("{k}_per_s={v:.0}"))
        .collect();
    println!("pipeline.enqueue jobs={n} {}", enq_line.join(" "));
    Ok(enq
        .iter()
        .map(|(k, v)| (format!("{k}_jobs_per_s"), json!(round1(*v))))
        .collect())
}

/// The lease acquire part (line `pipeline.lease_acquire`); returns its stats.
async fn acquire_part(stack: &DevStack, opts: &Opts) -> Result<Value> {
    let acq = if opts.runs("acquire") {
        acquire_latency(stack, if opts.quick { 50 } else { 200 }).await?
    } else {
        Vec::new()
    };
    let acq = stats_ms(acq);
    println!(
        "pipeline.lease_acquire n={} p50_ms={} p99_ms={}",
        acq["n"], acq["p50_ms"], acq["p99_ms"]
    );
    Ok(acq)
}

/// The takeover part, in parallel lanes (line `pipeline.takeover`); returns
/// the samples and their stats.
async fn takeover_part(stack: &DevStack, opts: &Opts) -> Result<(Vec<f64>, Value)> {
    let lanes = if opts.quick { 2 } else { 4 };
    let per_lane = opts.trials.div_ceil(lanes);
    let lanes = if opts.runs("takeover") { lanes } else { 0 };
    let lane_runs = (0..lanes).map(|l| takeover_lane(stack, l, per_lane, opts.ttl));
    let mut takeovers = Vec::new();
    for r in futures::future::join_all(lane_runs).await {
        takeovers.extend(r?);
    }
    let tk = stats_ms(takeovers.clone());
    println!(
        "pipeline.takeover trials={} p50_ms={} p99_ms={} max_ms={} ttl_ms={}",
        tk["n"],
        tk["p50_ms"],
        tk["p99_ms"],
        tk["max_ms"],
        opts.ttl.as_millis()
    );
    Ok((takeovers, tk))
}

/// The RSS part, per lock and in partition mode (line `pipeline.rss`).
async fn rss_part(stack: &DevStack, opts: &Opts) -> Result<(Value, Value)> {
    let (rss, rss_part) = if opts.runs("rss") {
        (
            rss_with_jobs_in_flight(stack, 1000, None).await?,
            rss_with_jobs_in_flight(stack, 1000, Some(opts.partitions)).await?,
        )
    } else {
        (json!({}), json!({}))
    };
    println!(
        "pipeline.rss jobs_in_flight=1000 peak_rss_mib={} idle_peak_rss_mib={} partition_peak_rss_mib={}",
        rss["peak_rss_mib"], rss["idle_peak_rss_mib"], rss_part["peak_rss_mib"]
    );
    Ok((rss, rss_part))
}

/// The `partitions` part: partition ownership moves after a crash and on a
/// join (lines `pipeline.partition_takeover`, `pipeline.partition_rebalance`).
async fn partition_moves_part(stack: &DevStack, opts: &Opts) -> Result<(Value, Value)> {
    let moves = if opts.runs("partitions") {
        let trials = if opts.quick { 3 } else { 10 };
        partitions::ownership_trials(stack, trials, opts.ttl, opts.partitions).await?
    } else {
        partitions::Moves::default()
    };
    let (crash, join) = (
        stats_ms(moves.crash_ms.clone()),
        stats_ms(moves.join_ms.clone()),
    );
    for (line, stats) in [
        ("partition_takeover", &crash),
        ("partition_rebalance", &join),
    ] {
        println!(
            "pipeline.{line} trials={} p50_ms={} p99_ms={} max_ms={} ttl_ms={}",
            stats["n"],
            stats["p50_ms"],
            stats["p99_ms"],
            stats["max_ms"],
            opts.ttl.as_millis()
        );
    }
    Ok((crash, join))
}

/// The scale-out part (line `pipeline.scale_out`): jobs/s per worker count.
async fn scale_part(stack: &DevStack, opts: &Opts) -> Result<Vec<(usize, f64)>> {
    let scale = if opts.runs("scale") {
        let counts: Vec<usize> = std::env::var("TENURE_BENCH_SCALE")
            .unwrap_or_else(|_| "1,2,4".into())
            .split(',')
            .filter_map(|k| k.trim().parse().ok())
            .collect();
        let locks = std::env::var("TENURE_BENCH_SCALE_LOCKS").is_ok_and(|v| v == "1");
        let mode = if locks { None } else { Some(opts.partitions) };
        partitions::scale_out(stack, opts.jobs, mode, &counts).await?
    } else {
        Vec::new()
    };
    let scale_line: Vec<String> = scale
        .iter()
        .map(|(k, v)| format!("workers_{k}_jobs_per_s={v:.0}"))
        .collect();
    println!(
        "pipeline.scale_out partitions={} jobs={} {}",
        opts.partitions,
        opts.jobs,
        scale_line.join(" ")
    );
    Ok(scale)
}
