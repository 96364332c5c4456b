//! Helpers shared by the runnable examples under `examples/` (`cargo run --example
//! ledger`, `cargo run --example provisioning`).
//!
//! Built with feature `harness` only (the dev stack the demos start): the
//! examples and their tests turn it on, a plain `cargo build --release` does not.
#![cfg(feature = "harness")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use opentelemetry_sdk::metrics::InMemoryMetricExporter;

/// Sums of every `u64` counter the exporter collected, by instrument name.
pub fn read_metrics(exporter: &InMemoryMetricExporter) -> HashMap<String, u64> {
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    let mut out = HashMap::new();
    for rm in exporter.get_finished_metrics().unwrap_or_default() {
        for scope in rm.scope_metrics() {
            for metric in scope.metrics() {
                if let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() {
                    let total: u64 = sum.data_points().map(|p| p.value()).sum();
                    out.insert(metric.name().to_string(), total);
                }
            }
        }
    }
    out
}

/// Waits until a line starting with `prefix` appears in `lines` (a child
/// worker's collected stdout).
///
/// # Errors
/// If no such line appears within `timeout`.
pub async fn wait_for(
    lines: &Arc<Mutex<Vec<String>>>,
    prefix: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let ok = wait_until(timeout, || async {
        lines
            .lock()
            .map(|l| l.iter().any(|l| l.starts_with(prefix)))
            .unwrap_or(false)
    })
    .await;
    if ok {
        Ok(())
    } else {
        bail!("worker A did not print {prefix:?} within {timeout:?}")
    }
}

pub use tenure::devstack::wait_until;

/// A worker child process (the example's own binary, in worker mode) and the
/// lines it printed to stdout.
#[derive(Debug)]
pub struct ChildWorker {
    child: std::process::Child,
    /// Its stdout, line by line, as printed so far.
    pub lines: Arc<Mutex<Vec<String>>>,
}

/// Starts this same binary as worker `id` on `cfg`'s servers: `role_env` (set to
/// `id`) tells `main` to run as a worker, `extra_env` is passed on as well.
///
/// # Errors
/// If the process cannot be spawned.
pub fn spawn_worker(
    role_env: &str,
    id: &str,
    cfg: &tenure::Config,
    extra_env: &[(&str, &str)],
) -> anyhow::Result<ChildWorker> {
    use anyhow::Context as _;
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .env(role_env, id)
        .envs(extra_env.iter().copied())
        .env("TENURE_ETCD_ENDPOINTS", cfg.etcd_endpoints.join(","))
        .env("TENURE_NATS_URL", &cfg.nats_url)
        .env("TENURE_DATABASE_URL", &cfg.database_url)
        .env("TENURE_NAMESPACE", &cfg.namespace)
        .env("TENURE_SCHEMA", &cfg.schema)
        .env("TENURE_WORKER_ID", id)
        .env(
            "TENURE_LEASE_TTL",
            tenure::config::format_duration(cfg.lease_ttl),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning worker {id}"))?;
    let out = child.stdout.take().context("worker stdout")?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(mut l) = sink.lock() {
                l.push(line);
            }
        }
    });
    Ok(ChildWorker { child, lines })
}

impl ChildWorker {
    /// Sends `sig` (as `kill` takes it, e.g. `-STOP`) to the worker.
    ///
    /// # Errors
    /// If `kill` fails.
    pub fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let status = std::process::Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()?;
        if !status.success() {
            bail!("kill {sig} failed");
        }
        Ok(())
    }

    /// Ends the worker gracefully: wakes it if stopped and closes its stdin
    /// (the worker exits then); kills it after 10 s.
    pub fn stop(mut self) {
        let _ = self.signal("-CONT");
        drop(self.child.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }

    /// SIGKILL: no release, no ack, no revoke; the lease expires on its own.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// Worker-mode main loop: prints `READY <id>` for the parent, runs until the
/// parent closes stdin, then shuts the worker down gracefully.
///
/// # Errors
/// Writing stdout, or the worker's shutdown.
pub async fn serve_until_stdin_closes(worker: tenure::Worker, id: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use tokio::io::AsyncReadExt as _;
    println!("READY {id}");
    std::io::stdout().flush()?;
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 16];
    while !matches!(stdin.read(&mut buf).await, Ok(0) | Err(_)) {}
    worker.shutdown().await?;
    Ok(())
}

/// The token in the first line of `lines` that starts with `prefix`: the fourth
/// word, as the workers print it (`COMMIT <job> <step> <token>`,
/// `BOOTED <job> <step> <token>`).
pub fn token_of(lines: &Arc<Mutex<Vec<String>>>, prefix: &str) -> Option<tenure::ObservedFence> {
    lines.lock().ok().and_then(|l| {
        l.iter()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(3).and_then(|t| t.parse().ok()))
            .and_then(tenure::ObservedFence::new)
    })
}

/// A meter provider whose readings land in an in-memory exporter (for
/// [`read_metrics`]).
pub fn in_memory_metrics() -> (
    InMemoryMetricExporter,
    opentelemetry_sdk::metrics::SdkMeterProvider,
) {
    let exporter = InMemoryMetricExporter::default();
    let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_reader(opentelemetry_sdk::metrics::PeriodicReader::builder(exporter.clone()).build())
        .build();
    (exporter, provider)
}

/// Flushes `provider` and prints worker B's job counters (claims, takeovers,
/// contention, completions) from `exporter`, names padded to `width`.
pub fn print_worker_b_metrics(
    provider: &opentelemetry_sdk::metrics::SdkMeterProvider,
    exporter: &InMemoryMetricExporter,
    width: usize,
) {
    let _ = provider.force_flush();
    let metrics = read_metrics(exporter);
    println!("metrics recorded by worker B:");
    for name in [
        "tenure.fence.claims",
        "tenure.fence.takeovers",
        "tenure.lock.contention",
        "tenure.job.completed",
    ] {
        println!(
            "  {name:<width$} {}",
            metrics.get(name).copied().unwrap_or(0)
        );
    }
}

/// The servers a demo runs on: those named by `TENURE_ETCD_ENDPOINTS`,
/// `TENURE_NATS_URL` and `TENURE_DATABASE_URL` when all three are set, else an
/// embedded dev stack (returned, so it lives as long as the demo). The config
/// gets a namespace and schema of this run's own (`<name>_<pid>_<n>`), returned
/// too; the server addresses are printed.
///
/// # Errors
/// A bad `TENURE_*` value, or a dev stack that does not start.
pub async fn demo_servers(
    name: &str,
) -> anyhow::Result<(Option<tenure::devstack::DevStack>, tenure::Config, String)> {
    use anyhow::Context as _;
    use tenure::Config;
    use tenure::devstack::DevStack;
    let (stack, base) = if Config::env_has_servers() {
        println!("using the servers named by TENURE_*");
        (None, Config::from_env()?)
    } else {
        println!(
            "starting the embedded dev stack (3 etcd members, NATS JetStream, PostgreSQL 15)..."
        );
        let stack = DevStack::start().await.context("starting the dev stack")?;
        let cfg = Config::new(name)
            .with_etcd_endpoints(stack.etcd_endpoints())
            .with_nats_url(stack.nats_url())
            .with_database_url(stack.database_url());
        (Some(stack), cfg)
    };
    let ns = DevStack::unique_namespace(name);
    let cfg = base.with_namespace(ns.clone()).with_schema(ns.clone());
    println!("  etcd       {}", cfg.etcd_endpoints.join(","));
    println!("  nats       {}", cfg.nats_url);
    println!("  postgresql {}", cfg.database_url);
    Ok((stack, cfg, ns))
}
