//! A worker process for tests that need to pause (SIGSTOP) or kill a worker.
//!
//! `tenure-test-worker --etcd E1,E2,E3 --nats URL --db URL --ns NS --ttl-secs N --worker ID [--cron NAME] [--partitions P]`
//!
//! With `--cron NAME` it also declares the schedule NAME: a [`ThreeStep`] job
//! every second, missed ticks caught up (at most 1000).
//!
//! Prints `READY` once started, `COMMIT <job> <step> <token>` for each committed
//! step and `STALE <job> <step> <token>` for each refused stale write. Exits when
//! its standard input closes (so it dies with the test that started it) or on
//! SIGTERM (graceful shutdown).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use tenure::{FencingToken, JobId, StepIndex};
use tenure::{Worker, WorkerObserver};
use tenure_tests::ThreeStep;
use tokio::io::AsyncReadExt;

struct Print;

impl WorkerObserver for Print {
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        println!("COMMIT {job_id} {step} {token}");
        let _ = std::io::stdout().flush();
    }
    fn stale_rejected(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        println!("STALE {job_id} {step} {token}");
        let _ = std::io::stdout().flush();
    }
}

fn arg(args: &[String], name: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| panic!("missing {name}"))
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let ns = arg(&args, "--ns");
    let worker = arg(&args, "--worker");
    let ttl: u64 = arg(&args, "--ttl-secs").parse().expect("ttl");
    let mut cfg = tenure::Config::new(ns.clone())
        .with_schema(ns.clone())
        .with_etcd_endpoints(arg(&args, "--etcd").split(','))
        .with_nats_url(arg(&args, "--nats"))
        .with_database_url(arg(&args, "--db"))
        .with_lease_ttl(Duration::from_secs(ttl))
        .with_worker_id(worker.clone());
    if let Some(i) = args.iter().position(|a| a == "--partitions") {
        let p = args
            .get(i + 1)
            .and_then(|p| p.parse().ok())
            .expect("--partitions P");
        cfg = cfg.with_partitions(p);
    }
    cfg.contention_backoff.base = Duration::from_millis(50);
    cfg.contention_backoff.cap = Duration::from_millis(500);
    cfg.retry_backoff.base = Duration::from_millis(50);
    cfg.retry_backoff.cap = Duration::from_millis(500);
    let job = ThreeStep {
        worker: worker.clone(),
        schema: ns.clone(),
    };
    let compensated = tenure_tests::Compensated {
        worker: worker.clone(),
        schema: ns.clone(),
    };
    let mut builder = Worker::builder(cfg)
        .register(job)
        .register(compensated)
        .observer(Arc::new(Print));
    if let Some(i) = args.iter().position(|a| a == "--cron") {
        let name = args.get(i + 1).expect("--cron NAME");
        let every_second = tenure::Schedule::new(name, "* * * * * *")
            .missed(tenure::MissedTicks::CatchUp { max: 1000 });
        builder = builder.schedule_with::<ThreeStep>(every_second, &tenure_tests::Work::default());
    }
    let w = builder.start().await.expect("worker start");
    println!("READY {worker}");
    let _ = std::io::stdout().flush();

    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("sigterm");
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    loop {
        tokio::select! {
            _ = term.recv() => break,
            n = stdin.read(&mut buf) => if matches!(n, Ok(0) | Err(_)) { break },
        }
    }
    w.shutdown().await.expect("shutdown");
    println!("STOPPED {worker}");
}
