//! The `pickup` part of the pipeline benchmark (issue 33, item 6): how soon
//! an idle worker starts a job. One worker, idle between jobs (0.3 to 1.5 s,
//! and one wait of 7 s every ten jobs); each sample is the time from the
//! start of `Client::enqueue` to the commit of the job's first step (so it
//! includes that step's short transaction), one job at a time, in both modes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};
use tenure::devstack::DevStack;
use tenure::{FencingToken, JobId, StepIndex, Worker, WorkerObserver};
use tenure_benches::{BenchInput, BenchJob};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{config_with, namespace_with, partitions, rand_ms, stats_ms};

/// Counts first-step commits.
#[derive(Default)]
struct FirstSteps {
    n: AtomicU64,
    notify: Notify,
}

impl WorkerObserver for FirstSteps {
    fn step_committed(&self, _job_id: JobId, step: StepIndex, _token: FencingToken) {
        if step.get() == 0 {
            self.n.fetch_add(1, Ordering::SeqCst);
            self.notify.notify_one();
        }
    }
}

impl FirstSteps {
    async fn wait_for(&self, n: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.n.load(Ordering::SeqCst) < n {
            if tokio::time::timeout_at(deadline, self.notify.notified())
                .await
                .is_err()
            {
                anyhow::bail!("job {n} not started within 30 s");
            }
        }
        Ok(())
    }
}

/// `samples` pickups in one mode (`partitions`: partition mode), in ms:
/// enqueue to first step committed, and the enqueue calls alone.
async fn pickups(
    stack: &DevStack,
    partitions: Option<u32>,
    samples: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (ns, client) = namespace_with(stack, "bench_pickup", partitions).await?;
    let seen = Arc::new(FirstSteps::default());
    let cfg = config_with(stack, &ns, partitions).with_worker_id("pickup");
    let worker = Worker::builder(cfg.clone())
        .register(BenchJob::new("pickup", &ns))
        .observer(seen.clone())
        .start()
        .await?;
    if let Some(p) = partitions {
        partitions::wait_owned(&cfg, p as usize, 1).await?;
    }
    let (mut pickup, mut enqueue) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let idle = if i % 10 == 9 {
            7000
        } else {
            300 + rand_ms(1200)
        };
        tokio::time::sleep(Duration::from_millis(idle)).await;
        let started = Instant::now();
        let input = BenchInput {
            n: i as u64,
            ..BenchInput::default()
        };
        client
            .enqueue::<BenchJob>(&format!("pickup-{i}"), &input)
            .await?;
        enqueue.push(started.elapsed().as_secs_f64() * 1000.0);
        seen.wait_for(i as u64 + 1).await?;
        pickup.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    worker.shutdown().await?;
    Ok((pickup, enqueue))
}

/// Both modes; prints `pipeline.pickup` lines.
pub(super) async fn part(stack: &DevStack, samples: usize, partitions: u32) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (mode, p) in [("locks", None), ("partitions", Some(partitions))] {
        let (pickup, enqueue) = pickups(stack, p, samples).await?;
        let (pickup, enqueue) = (stats_ms(pickup), stats_ms(enqueue));
        println!(
            "pipeline.pickup mode={mode} n={} p50_ms={} p99_ms={} max_ms={} enqueue_p50_ms={} enqueue_p99_ms={}",
            pickup["n"],
            pickup["p50_ms"],
            pickup["p99_ms"],
            pickup["max_ms"],
            enqueue["p50_ms"],
            enqueue["p99_ms"]
        );
        out.insert(mode.into(), json!({"pickup": pickup, "enqueue": enqueue}));
    }
    Ok(Value::Object(out))
}
