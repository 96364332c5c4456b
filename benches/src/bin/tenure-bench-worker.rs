//! A worker process for the `pipeline` benchmark (takeover latency, peak RSS).
//!
//! `tenure-bench-worker --etcd E1,E2,E3 --nats URL --db URL --ns NS --ttl-ms N
//!  --worker ID [--max-in-flight N] [--partitions P]`
//!
//! `TENURE_BENCH_FETCH_NOW_MS` and `TENURE_BENCH_FETCH_SEVERAL_MS` set the
//! worker's `Tuning::fetch_wait_now` and `fetch_wait_several` (investigating
//! fetch rounds over many partitions).
//!
//! Runs [`tenure_benches::BenchJob`] with the default `Config` (but the given TTL
//! and `max_in_flight`). Prints `READY <id>`, `COMMIT <job> <step> <token>` per
//! committed step, and `INFLIGHT <n>` every 100 ms while it changes. Exits when its
//! standard input closes or on SIGTERM.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tenure::{FencingToken, JobId, StepIndex};
use tenure::{Worker, WorkerObserver};
use tenure_benches::BenchJob;
use tokio::io::AsyncReadExt;

struct Print;

impl WorkerObserver for Print {
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        println!("COMMIT {job_id} {step} {token}");
        let _ = std::io::stdout().flush();
    }
}

fn arg(args: &[String], name: &str) -> anyhow::Result<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .with_context(|| format!("missing {name}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let ns = arg(&args, "--ns")?;
    let worker = arg(&args, "--worker")?;
    let ttl: u64 = arg(&args, "--ttl-ms")?.parse()?;
    let mut cfg = tenure::Config::new(ns.clone())
        .with_schema(ns.clone())
        .with_etcd_endpoints(arg(&args, "--etcd")?.split(','))
        .with_nats_url(arg(&args, "--nats")?)
        .with_database_url(arg(&args, "--db")?)
        .with_lease_ttl(Duration::from_millis(ttl))
        .with_worker_id(worker.clone());
    if let Ok(n) = arg(&args, "--max-in-flight") {
        cfg.max_in_flight = n.parse()?;
    }
    if let Some(ms) = std::env::var("TENURE_BENCH_FETCH_NOW_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.tuning.fetch_wait_now = Duration::from_millis(ms);
    }
    if let Some(ms) = std::env::var("TENURE_BENCH_FETCH_SEVERAL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.tuning.fetch_wait_several = Duration::from_millis(ms);
    }
    if let Ok(p) = arg(&args, "--partitions") {
        cfg = cfg.with_partitions(p.parse()?);
    }
    let w = Worker::builder(cfg)
        .register(BenchJob::new(&worker, &ns))
        .observer(Arc::new(Print))
        .start()
        .await?;
    println!("READY {worker}");
    let _ = std::io::stdout().flush();

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut last = usize::MAX;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            n = stdin.read(&mut buf) => if matches!(n, Ok(0) | Err(_)) { break },
            _ = tick.tick() => {
                let n = w.in_flight();
                if n != last {
                    println!("INFLIGHT {n}");
                    let _ = std::io::stdout().flush();
                    last = n;
                }
            }
        }
    }
    w.shutdown().await?;
    Ok(())
}
