//! One run of the peers shape's Tenure half against servers given in the
//! environment (`benches/bisect.sh` starts them once, with
//! `stack-holder`): `BISECT_JOBS` jobs (5,000) of three steps, each step one
//! `UPDATE` of the job's own row through `ctx.db()`, four producers
//! enqueueing while one worker (`max_in_flight = BISECT_C`, 32) drains them,
//! the clock from the first enqueue to the last step's commit; per-job locks,
//! or `BISECT_PARTITIONS` partitions (feature `partitions`). Prints
//! `bisect: label=.. mode=.. jobs_per_s=.. enqueue_per_s=.. cpu_ms_per_job(..)`.
//!
//! Written against the oldest API it is built with (`1158656`): the two
//! features name what moved since. The job and the CPU reading repeat
//! `benches/peers` and the pipeline benchmark's on purpose: this crate is
//! built in worktrees of commits that predate both, so it can share no code.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
#[cfg(feature = "old_paths")]
use tenure::runtime::{Worker, WorkerObserver};
use tenure::{Client, Config, FencingToken, JobId, StepCtx, StepError, StepIndex};
#[cfg(not(feature = "old_paths"))]
use tenure::{Worker, WorkerObserver};
use tokio::sync::Notify;
use tokio::time::Instant;

mod cpu;

const PRODUCERS: usize = 4;

#[derive(Clone)]
struct PeerJob {
    update: Arc<str>,
}

impl PeerJob {
    async fn update(&self, ctx: &mut StepCtx, id: i64) -> Result<i64, StepError> {
        sqlx::query(&self.update)
            .bind(id)
            .execute(ctx.db().await?)
            .await?;
        Ok(id)
    }
}

#[tenure::job(name = "peers.three_step")]
impl PeerJob {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, id: i64) -> Result<i64, StepError> {
        self.update(ctx, id).await
    }

    #[step]
    async fn second(&self, ctx: &mut StepCtx, id: i64) -> Result<i64, StepError> {
        self.update(ctx, id).await
    }

    #[step]
    async fn third(&self, ctx: &mut StepCtx, id: i64) -> Result<i64, StepError> {
        self.update(ctx, id).await
    }
}

#[derive(Default)]
struct Done {
    n: AtomicU64,
    notify: Notify,
}

impl WorkerObserver for Done {
    fn step_committed(&self, _job: JobId, step: StepIndex, _token: FencingToken) {
        if step.get() == 2 {
            self.n.fetch_add(1, Ordering::Relaxed);
            self.notify.notify_one();
        }
    }
}

impl Done {
    async fn wait_for(&self, n: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(600);
        while self.n.load(Ordering::Relaxed) < n {
            let _ = tokio::time::timeout(Duration::from_millis(200), self.notify.notified()).await;
            if Instant::now() > deadline {
                bail!("only {} of {n} jobs done", self.n.load(Ordering::Relaxed));
            }
        }
        Ok(())
    }
}

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A database of its own for this build (migrations of different commits
/// never meet), created on the holder's server.
async fn database(base: &str, label: &str) -> Result<String> {
    let name = format!("bisect_{label}");
    let pool = sqlx::PgPool::connect(base).await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&pool)
            .await?;
    if !exists {
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&pool)
            .await?;
    }
    pool.close().await;
    let (head, _) = base
        .rsplit_once('/')
        .context("a database URL ends in /<db>")?;
    let (_, query) = base.split_once('?').unwrap_or((base, ""));
    let tail = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    Ok(format!("{head}/{name}{tail}"))
}

fn config(db: &str, ns: &str, partitions: usize) -> Result<Config> {
    let etcd: Vec<String> = env("TENURE_ETCD_ENDPOINTS")?
        .split(',')
        .map(str::to_string)
        .collect();
    #[allow(unused_mut)]
    let mut cfg = Config::new(ns)
        .with_schema(ns)
        .with_etcd_endpoints(etcd)
        .with_nats_url(env("TENURE_NATS_URL")?)
        .with_database_url(db);
    #[cfg(feature = "partitions")]
    if partitions > 0 {
        cfg.partitions = Some(u32::try_from(partitions)?);
    }
    #[cfg(not(feature = "partitions"))]
    if partitions > 0 {
        bail!("this build has no partition mode");
    }
    Ok(cfg)
}

#[tokio::main]
async fn main() -> Result<()> {
    let label = env("BISECT_LABEL")?;
    let (n, c) = (env_or("BISECT_JOBS", 5000), env_or("BISECT_C", 32));
    let partitions = env_or("BISECT_PARTITIONS", 0);
    let db = database(&env("TENURE_DATABASE_URL")?, &label).await?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let ns = format!("b{}_{}", partitions, stamp.as_millis() % 1_000_000_000);
    let cfg = config(&db, &ns, partitions)?;
    let client = Client::connect(&cfg).await?;
    client.migrate().await?;
    let pool = client.store().pool();
    sqlx::query(&format!(
        "CREATE TABLE {ns}.peer_rows (id bigint PRIMARY KEY, n int NOT NULL)"
    ))
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO {ns}.peer_rows SELECT g, 0 FROM generate_series(0, {}) g",
        n - 1
    ))
    .execute(pool)
    .await?;
    let done = Arc::new(Done::default());
    let mut wcfg = cfg.clone().with_worker_id(format!("bisect-{ns}"));
    wcfg.max_in_flight = c;
    let update = format!("UPDATE {ns}.peer_rows SET n = n + 1 WHERE id = $1");
    let worker = Worker::builder(wcfg)
        .register(PeerJob {
            update: Arc::from(update),
        })
        .observer(done.clone())
        .start()
        .await?;
    // Partitions owned, consumers bound (the clock must not count start-up).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pids = cpu::Pids::from_env()?;
    let cpu0 = cpu::Cpu::now(&pids);
    let started = Instant::now();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let client = client.clone();
            tokio::spawn(async move {
                for id in (p..n).step_by(PRODUCERS) {
                    let id = i64::try_from(id)?;
                    client.enqueue::<PeerJob>(&format!("row-{id}"), &id).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for p in producers {
        p.await??;
    }
    let enqueued = started.elapsed().as_secs_f64();
    done.wait_for(n as u64).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu::Cpu::now(&pids).per_job_since(cpu0, n);
    worker.shutdown().await?;
    let (three, other): (i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*) FILTER (WHERE n = 3), count(*) FILTER (WHERE n <> 3) FROM {ns}.peer_rows"
    ))
    .fetch_one(pool)
    .await?;
    if three != n as i64 || other != 0 {
        bail!("{three} of {n} rows updated three times, {other} otherwise");
    }
    let mode = if partitions > 0 {
        format!("partitions{partitions}")
    } else {
        "locks".into()
    };
    println!(
        "bisect: label={label} mode={mode} c={c} jobs={n} jobs_per_s={:.0} enqueue_per_s={:.0} {}",
        n as f64 / secs,
        n as f64 / enqueued,
        cpu.line()
    );
    Ok(())
}
