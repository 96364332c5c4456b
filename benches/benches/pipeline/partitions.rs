//! Partition mode's parts of the pipeline benchmark: partition ownership as
//! etcd shows it, ownership moves (a crashed owner's partitions taken, the
//! rebalance when a worker joins) and scale-out over worker processes.

use std::time::Duration;

use anyhow::{Result, bail};
use tenure::Config;
use tenure::Worker;
use tenure::blocks::lease::Session;
use tenure::devstack::DevStack;
use tenure_benches::{BenchInput, BenchJob, JOB_TYPE};
use tokio::time::Instant;

use super::{Child, config_with, namespace_with, rand_ms};

/// Partitions of the bench job type per owner, largest first.
async fn counts(observer: &Session) -> Result<Vec<usize>> {
    let view = observer.ownership().await?;
    let mut by_lease = std::collections::BTreeMap::new();
    for o in view.owners.iter().filter(|o| o.job_type == JOB_TYPE) {
        *by_lease.entry(o.lease.get()).or_insert(0usize) += 1;
    }
    let mut out: Vec<usize> = by_lease.into_values().collect();
    out.sort_unstable_by(|a, b| b.cmp(a));
    Ok(out)
}

/// The fair split of `p` partitions over `members` owners, largest first.
fn fair(p: usize, members: usize) -> Vec<usize> {
    (0..members)
        .map(|i| p / members + usize::from(i < p % members))
        .collect()
}

/// Polls (every 5 ms, up to `within`) until the owners are `want`.
async fn until(observer: &Session, want: &[usize], within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let now = counts(observer).await?;
        if now == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("partition owners {now:?}, wanted {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `members` workers own the `p` partitions of `cfg`'s namespace
/// in fair shares.
pub(super) async fn wait_owned(cfg: &Config, p: usize, members: usize) -> Result<()> {
    let observer = Session::establish(cfg).await?;
    let done = until(&observer, &fair(p, members), Duration::from_secs(60)).await;
    observer.close().await?;
    done
}

/// Ownership moves, in milliseconds.
#[derive(Default)]
pub(super) struct Moves {
    /// From a SIGKILL of one of two owners until the other owns every partition.
    pub(super) crash_ms: Vec<f64>,
    /// From a second worker's `start()` returning until the two own fair shares.
    pub(super) join_ms: Vec<f64>,
}

/// `trials` times: worker A (a child process) owns all `p` partitions; worker
/// B starts in this process (join: until the split is fair); A is killed at
/// a random point of its keepalive cycle (crash: until B owns them all).
pub(super) async fn ownership_trials(
    stack: &DevStack,
    trials: usize,
    ttl: Duration,
    p: u32,
) -> Result<Moves> {
    let mut moves = Moves::default();
    let all = p as usize;
    for trial in 0..trials {
        let (ns, _client) = namespace_with(stack, "bench_moves", Some(p)).await?;
        let cfg = config_with(stack, &ns, Some(p)).with_lease_ttl(ttl);
        let observer = Session::establish(&cfg).await?;
        let a = Child::spawn(stack, &ns, &format!("a{trial}"), ttl, None, Some(p)).await?;
        until(&observer, &[all], Duration::from_secs(60)).await?;
        let b = Worker::builder(cfg.clone().with_worker_id(format!("b{trial}")))
            .register(BenchJob::new("b", &ns))
            .start()
            .await?;
        let joined = Instant::now();
        until(&observer, &fair(all, 2), Duration::from_secs(60)).await?;
        moves.join_ms.push(joined.elapsed().as_secs_f64() * 1e3);
        let jitter = rand_ms(u64::try_from(ttl.as_millis() / 6)?);
        tokio::time::sleep(Duration::from_millis(100 + jitter)).await;
        a.signal(nix::sys::signal::Signal::SIGKILL)?;
        let killed = Instant::now();
        until(&observer, &[all], ttl * 4).await?;
        let ms = killed.elapsed().as_secs_f64() * 1e3;
        tracing::info!(trial, ms, "partition takeover trial");
        moves.crash_ms.push(ms);
        a.kill().await;
        b.shutdown().await?;
        observer.close().await?;
    }
    Ok(moves)
}

/// For each worker count `k`: `k` worker processes (`max_in_flight` 64 each)
/// started and owning fair shares first, then `n` jobs enqueued in batches of
/// 1,000 (`Client::enqueue_many`); timed from the first enqueue until every
/// job is done.
pub(super) async fn scale_out(
    stack: &DevStack,
    n: usize,
    partitions: Option<u32>,
    workers: &[usize],
) -> Result<Vec<(usize, f64)>> {
    let mut out = Vec::new();
    for &k in workers {
        let (ns, client) = namespace_with(stack, &format!("bench_scale{k}"), partitions).await?;
        let ttl = Duration::from_secs(5);
        let ids: Vec<String> = (0..k).map(|i| format!("s{k}x{i}")).collect();
        let spawns = ids
            .iter()
            .map(|id| Child::spawn(stack, &ns, id, ttl, None, partitions));
        let children: Vec<Child> = futures::future::try_join_all(spawns).await?;
        if let Some(p) = partitions {
            wait_owned(&config_with(stack, &ns, Some(p)), p as usize, k).await?;
        }
        let items: Vec<(String, BenchInput)> = (0..n)
            .map(|i| {
                let input = BenchInput {
                    n: i as u64,
                    ..BenchInput::default()
                };
                (format!("scale-{i}"), input)
            })
            .collect();
        let started = Instant::now();
        for chunk in items.chunks(1000) {
            client.enqueue_many::<BenchJob>(chunk).await?;
        }
        let done_sql = format!("SELECT count(*) FROM {ns}.jobs WHERE status = 'done'");
        let pool = client.store().pool();
        let deadline = started + Duration::from_secs(600);
        let mut trace = Vec::new();
        loop {
            let done: i64 = sqlx::query_scalar(&done_sql).fetch_one(pool).await?;
            if trace.last().is_none_or(|(_, d)| *d != done) {
                trace.push((started.elapsed().as_millis(), done));
            }
            if done as usize >= n {
                break;
            }
            if Instant::now() > deadline {
                bail!("scale-out with {k} workers: {done} of {n} done");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        if std::env::var_os("TENURE_BENCH_TRACE").is_some() {
            eprintln!("scale trace k={k}: {trace:?}");
        }
        let mode = partitions.map_or("locks".to_string(), |p| format!("partitions_{p}"));
        println!("pipeline.scale_out_run mode={mode} workers={k} jobs={n} jobs_per_s={rate:.0}");
        out.push((k, rate));
        for c in children {
            c.kill().await;
        }
    }
    Ok(out)
}

/// PostgreSQL's next MultiXact id, after a checkpoint (so the control data is
/// current): the difference over a run is how many MultiXacts it created.
pub(super) async fn next_multixact(pool: &sqlx::PgPool) -> Result<i64> {
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let id: String =
        sqlx::query_scalar("SELECT next_multixact_id::text FROM pg_control_checkpoint()")
            .fetch_one(pool)
            .await?;
    Ok(id.parse()?)
}

/// Samples, every 10 ms until stopped, how many backends wait for a lock.
pub(super) struct LockWaits {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64, i64)>,
}

impl LockWaits {
    pub(super) fn start(pool: sqlx::PgPool) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let until = stop.clone();
        let task = tokio::spawn(async move {
            let (mut samples, mut waiting, mut max) = (0u64, 0u64, 0i64);
            while !until.load(std::sync::atomic::Ordering::Acquire) {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                )
                .fetch_one(&pool)
                .await
                .unwrap_or(0);
                samples += 1;
                waiting += u64::from(n > 0);
                max = max.max(n);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (samples, waiting, max)
        });
        LockWaits { stop, task }
    }

    /// (samples, samples with a backend waiting for a lock, most waiting at once).
    pub(super) async fn finish(self) -> Result<(u64, u64, i64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        Ok(self.task.await?)
    }
}
