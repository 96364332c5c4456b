//! Probes and signals against real servers: a worker process under
//! `Worker::run_until_signal` gets a real SIGTERM mid-job and hands the job to
//! the next worker without a takeover; the probe server's `/readyz` turns 503
//! while PostgreSQL is stopped and 200 again once it is back, `/livez` stays
//! 200 throughout, `/metrics` is the Prometheus scrape on the same listener,
//! and bad requests get 404/405.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::probe::ProbeServer;
use tenure::telemetry::prometheus::PrometheusExporter;
use tenure::testing::{FaultPlan, TestEnv};
use tenure::{Config, JobId, JobStatus, StepCtx, StepError, Worker, WorkerBuilder};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const WAIT: Duration = Duration::from_secs(60);

/// A three-step job whose steps each take `STEP` and write `(job, step,
/// token)` to the guarded table `slow` through their fenced transaction.
#[derive(Debug, Clone)]
struct Slow {
    schema: String,
}

/// How long each step of [`Slow`] takes.
const STEP: Duration = Duration::from_millis(1500);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Count {
    n: u64,
}

impl Slow {
    async fn write(&self, ctx: &mut StepCtx, step: u32) -> Result<(), StepError> {
        tokio::time::sleep(STEP).await;
        let sql = format!(
            "INSERT INTO {}.slow (job_id, token, step) VALUES ($1, $2, $3)",
            self.schema
        );
        tenure_tests::insert_in_step(ctx, &sql, Some(step), None).await
    }
}

#[tenure::job(name = "probe.slow", retries = 5, max_takeovers = 5)]
impl Slow {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, c: Count) -> Result<Count, StepError> {
        self.write(ctx, 0).await?;
        Ok(c)
    }

    #[step]
    async fn second(&self, ctx: &mut StepCtx, c: Count) -> Result<Count, StepError> {
        self.write(ctx, 1).await?;
        Ok(c)
    }

    #[step]
    async fn third(&self, ctx: &mut StepCtx, c: Count) -> Result<u64, StepError> {
        self.write(ctx, 2).await?;
        Ok(c.n)
    }
}

/// What every worker of these tests runs, in process or as a worker process
/// (which runs under `Worker::run_until_signal`).
async fn workers(cfg: Config) -> WorkerBuilder {
    let schema = cfg.schema.clone();
    Worker::builder(cfg).register(Slow { schema })
}

/// Creates the guarded table `slow` and has the checker watch it.
async fn table(env: &TestEnv) {
    tenure_tests::step_table(env, "slow", true).await;
}

async fn slow_rows(env: &TestEnv, job: JobId) -> Vec<(i32, i64)> {
    tenure_tests::step_rows(env, "slow", job).await
}

#[tenure::test(ttl_secs = 3, worker = workers)]
async fn sigterm_mid_job_hands_the_job_over_without_a_takeover(env: TestEnv) {
    table(&env).await;
    let job = JobId::from_key("probe.slow", "sigterm");
    let a = env.worker_process("a", FaultPlan::new()).await.unwrap();
    env.client()
        .enqueue::<Slow>("sigterm", &Count { n: 9 })
        .await
        .unwrap();
    let first = format!("commit {} 0", job.as_uuid());
    assert!(
        tenure::devstack::wait_until(WAIT, || async { a.has_line(&first) }).await,
        "a never committed step 0: {:?}",
        a.lines()
    );
    // Step 1 is running on `a` now; `b` waits for the job.
    let b = env.worker("b", workers).await.unwrap();
    let started = std::time::Instant::now();
    let status = a.terminate();
    let stopped_in = started.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "a exits cleanly on SIGTERM: {status:?}"
    );
    assert!(
        tenure::devstack::wait_until(Duration::from_secs(5), || async { a.has_line("stopped") })
            .await,
        "{:?}",
        a.lines()
    );
    println!("a stopped {stopped_in:?} after SIGTERM (step takes {STEP:?})");
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, JobStatus::Done);
    assert_eq!(row.takeovers, 0, "released at a step boundary: {row:?}");
    let rows = slow_rows(&env, job).await;
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "each step once: {rows:?}"
    );
    let committed_by_a = a.lines().iter().filter(|l| l.starts_with("commit")).count();
    assert_eq!(
        committed_by_a,
        2,
        "a finished step 1 before stopping, b ran step 2: {:?}",
        a.lines()
    );
    assert!(
        rows[2].1 > rows[1].1,
        "step 2 ran under b's token: {rows:?}"
    );
    env.check().await.unwrap().assert_clean();
    b.shutdown().await.unwrap();
}

/// One HTTP/1.0 request; the status code and the body.
async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("{method} {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .expect("answered")
        .unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_string())
}

/// Polls `/readyz` until it answers `code`; its last body.
async fn readyz_turns(addr: SocketAddr, code: u16) -> String {
    let until = std::time::Instant::now() + WAIT;
    loop {
        let (got, body) = http(addr, "GET", "/readyz").await;
        let (live, _) = http(addr, "GET", "/livez").await;
        assert_eq!(live, 200, "/livez while the worker runs");
        if got == code {
            return body;
        }
        assert!(
            std::time::Instant::now() < until,
            "/readyz still {got} ({body}), not {code}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tenure::test(own_stack)]
async fn readyz_follows_postgres_and_livez_stays_up(env: TestEnv) {
    let exporter = PrometheusExporter::new().unwrap();
    let meter = exporter.meter();
    let worker = env
        .worker("w", |cfg| async move { workers(cfg).await.meter(meter) })
        .await
        .unwrap();
    let probe = worker.probe();
    let server = ProbeServer::serve_with_metrics(
        "127.0.0.1:0".parse().unwrap(),
        probe.clone(),
        exporter.clone(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback());
    let body = readyz_turns(addr, 200).await;
    assert!(body.starts_with("ready"), "{body}");
    assert!(worker.readiness().await.is_ready());

    let (code, metrics) = http(addr, "GET", "/metrics").await;
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains("tenure_"), "the scrape: {metrics}");
    assert_eq!(http(addr, "GET", "/nope").await.0, 404);
    assert_eq!(http(addr, "GET", "/readyz/extra").await.0, 404);
    assert_eq!(http(addr, "POST", "/readyz").await.0, 405);
    assert_eq!(http(addr, "BREW", "/").await.0, 405);

    env.stack().postgres().kill().unwrap();
    let stopped = std::time::Instant::now();
    let reason = readyz_turns(addr, 503).await;
    println!(
        "/readyz 503 {:?} after PostgreSQL stopped: {reason}",
        stopped.elapsed()
    );
    assert!(reason.contains("postgres"), "{reason}");
    let readiness = worker.readiness().await;
    assert!(!readiness.is_ready(), "{readiness:?}");
    assert!(
        readiness.reason().is_some_and(|r| r.contains("postgres")),
        "{readiness:?}"
    );

    env.stack().postgres().restart().unwrap();
    env.stack().wait_ready(WAIT).await.unwrap();
    let back = std::time::Instant::now();
    let body = readyz_turns(addr, 200).await;
    println!("/readyz 200 {:?} after PostgreSQL was back", back.elapsed());
    assert!(body.starts_with("ready"), "{body}");

    worker.shutdown().await.unwrap();
    assert!(!probe.is_live(), "a stopped worker is not live");
    let (code, body) = http(addr, "GET", "/livez").await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(http(addr, "GET", "/readyz").await.0, 503);
}
