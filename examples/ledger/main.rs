//! # The ledger demo: a paused worker cannot commit on top of its replacement
//!
//! Money transfers between accounts, as a four-step job (`reserve`, `debit`,
//! `credit`, `notify`), on two workers. Worker A runs as a separate process; it
//! starts a transfer, and in the middle of it the demo freezes it with SIGSTOP
//! (a GC pause, a disk stall, a suspended VM) for longer than its lease. Worker B
//! takes the transfer over with a larger fencing token and finishes it. Then A
//! wakes up and tries to write with its old token: PostgreSQL refuses the write.
//! The demo prints the timeline, the final balances and the metrics, and exits 0
//! only if the ledger is consistent and the stale write was refused.
//!
//! `cargo run --example ledger` starts an embedded dev stack (3 etcd members, NATS,
//! PostgreSQL). With `TENURE_ETCD_ENDPOINTS`, `TENURE_NATS_URL` and
//! `TENURE_DATABASE_URL` set it uses those servers instead.

mod bank;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tenure_examples::{
    demo_servers, in_memory_metrics, print_worker_b_metrics, serve_until_stdin_closes,
    spawn_worker, token_of, wait_for, wait_until,
};

use anyhow::{Context, bail};
use bank::{Bank, Transfer, TransferReq};
use tenure::{Client, Config, FencingToken, JobId, StepIndex};
use tenure::{Worker, WorkerObserver};

const TTL: Duration = Duration::from_secs(2);
const ROLE_ENV: &str = "TENURE_LEDGER_WORKER";

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Ok(id) = std::env::var(ROLE_ENV) {
        return rt.block_on(worker_process(id));
    }
    let ok = rt.block_on(demo())?;
    if !ok {
        bail!("the ledger is NOT consistent");
    }
    Ok(())
}

/// Timeline printing, relative to the demo's start.
#[derive(Clone)]
struct Timeline {
    start: tokio::time::Instant,
    names: Arc<Mutex<HashMap<JobId, String>>>,
}

impl Timeline {
    fn say(&self, who: &str, what: impl std::fmt::Display) {
        let t = self.start.elapsed().as_secs_f64();
        println!("  t={t:>6.2}s  {who:<9} {what}");
        let _ = std::io::stdout().flush();
    }
    fn name(&self, id: JobId) -> String {
        self.names
            .lock()
            .ok()
            .and_then(|m| m.get(&id).cloned())
            .unwrap_or_else(|| id.to_string())
    }
}

struct Narrator {
    tl: Timeline,
    who: &'static str,
    stale: Mutex<u32>,
}

impl WorkerObserver for Narrator {
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        let step_name = bank::STEP_NAMES.get(step.get() as usize).unwrap_or(&"?");
        self.tl.say(
            self.who,
            format!(
                "{} committed step {step_name} with token {token}",
                self.tl.name(job_id)
            ),
        );
    }
    fn stale_rejected(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        if let Ok(mut n) = self.stale.lock() {
            *n += 1;
        }
        self.tl.say(
            self.who,
            format!(
                "{} step {step}: write with token {token} REFUSED (stale)",
                self.tl.name(job_id)
            ),
        );
    }
}

async fn demo() -> anyhow::Result<bool> {
    println!("Tenure ledger demo: fencing a paused worker\n");
    // A namespace (etcd prefix, streams, schema) of this run's own.
    let (stack, cfg, ns) = demo_servers("ledger").await?;
    let cfg = cfg.with_lease_ttl(TTL);
    println!("  namespace  {ns}, lease TTL {TTL:?}\n");

    let client = Client::connect(&cfg).await.context("connecting")?;
    client.migrate().await.context("migrating")?;
    let bank = Bank::new(client.store().clone());
    bank.create(&[("alice", 1_000), ("bob", 1_000), ("carol", 1_000)])
        .await
        .context("creating accounts")?;

    let tl = Timeline {
        start: tokio::time::Instant::now(),
        names: Arc::new(Mutex::new(HashMap::new())),
    };

    // Worker A, its own OS process, so that it can really be frozen.
    tl.say("demo", "starting worker A (a separate process)");
    let a = spawn_worker(ROLE_ENV, "A", &cfg, &[])?;
    let a_lines = a.lines.clone();
    wait_for(&a_lines, "READY", Duration::from_secs(30)).await?;

    // T1: alice -> bob, 300. Its debit step calls a slow core-banking system.
    let t1 = TransferReq {
        from: "alice".into(),
        to: "bob".into(),
        amount: 300,
        debit_latency_ms: 1_500,
    };
    let e1 = client
        .enqueue::<Transfer>("T1", &t1)
        .await
        .context("enqueue T1")?;
    tl.names
        .lock()
        .map_err(|_| anyhow::anyhow!("lock"))?
        .insert(e1.job_id, "T1".into());
    tl.say("demo", "enqueued T1: alice -> bob, 300");
    // Narrate A's events as they arrive.
    let narrate = {
        let tl = tl.clone();
        let lines = a_lines.clone();
        tokio::spawn(async move {
            let mut seen = 0;
            loop {
                let new: Vec<String> = match lines.lock() {
                    Ok(l) => l[seen..].to_vec(),
                    Err(_) => return,
                };
                seen += new.len();
                for line in new {
                    narrate_child(&tl, &line);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let reserved = format!("COMMIT {} 0 ", e1.job_id);
    wait_for(&a_lines, &reserved, Duration::from_secs(30)).await?;
    let t1_token_a = token_of(&a_lines, &reserved)
        .map(|t| t.to_string())
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.signal("-STOP")?;
    tl.say(
        "demo",
        format!("SIGSTOP worker A inside T1's debit step (holding token {t1_token_a}): a pause longer than its {TTL:?} lease"),
    );

    // Worker B in this process, with metrics in memory.
    let (exporter, provider) = in_memory_metrics();
    use opentelemetry::metrics::MeterProvider as _;
    let b_observer = Arc::new(Narrator {
        tl: tl.clone(),
        who: "worker B",
        stale: Mutex::new(0),
    });
    let b = Worker::builder(cfg.clone().with_worker_id("B"))
        .register(Transfer::new(bank.clone()))
        .meter(provider.meter("tenure"))
        .observer(b_observer.clone())
        .start()
        .await
        .context("starting worker B")?;
    tl.say("demo", "started worker B");

    // More transfers while A is frozen; B runs them.
    let more = [
        ("T2", "bob", "carol", 120),
        ("T3", "carol", "alice", 75),
        ("T4", "alice", "carol", 40),
    ];
    let mut ids = vec![e1.job_id];
    for (name, from, to, amount) in more {
        let req = TransferReq {
            from: from.into(),
            to: to.into(),
            amount,
            debit_latency_ms: 0,
        };
        let e = client.enqueue::<Transfer>(name, &req).await?;
        tl.names
            .lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .insert(e.job_id, name.into());
        ids.push(e.job_id);
        tl.say("demo", format!("enqueued {name}: {from} -> {to}, {amount}"));
    }
    let all_done = wait_until(Duration::from_secs(60), || async {
        let mut done = 0;
        for id in &ids {
            if let Ok(Some(row)) = client.job(*id).await
                && row.status == tenure::JobStatus::Done
            {
                done += 1;
            }
        }
        done == ids.len()
    })
    .await;
    if !all_done {
        bail!("the transfers did not finish within 60 s");
    }
    let row = client.job(e1.job_id).await?.context("T1's row")?;
    tl.say(
        "demo",
        format!(
            "T1 is done; its fence is {} (takeovers: {})",
            row.fence, row.takeovers
        ),
    );

    // T5: alice -> dave, 50. Dave has no account: the credit fails for good
    // after the debit committed, the job dies, and its `on_dead` hook refunds
    // alice, once. `wait` returns when the job is over (compensated).
    let t5 = TransferReq {
        from: "alice".into(),
        to: "dave".into(),
        amount: 50,
        debit_latency_ms: 0,
    };
    let e5 = client.enqueue::<Transfer>("T5", &t5).await?;
    tl.names
        .lock()
        .map_err(|_| anyhow::anyhow!("lock"))?
        .insert(e5.job_id, "T5".into());
    tl.say("demo", "enqueued T5: alice -> dave (no such account), 50");
    let refunded = match client
        .wait::<Transfer>(e5.job_id, Duration::from_secs(60))
        .await
    {
        Err(tenure::ClientError::NoResult { status, reason, .. }) => {
            tl.say(
                "demo",
                format!(
                    "T5 ended {status}: {}; its on_dead hook refunded the debit",
                    reason.unwrap_or_default()
                ),
            );
            true
        }
        other => {
            tl.say("demo", format!("T5: unexpected {other:?}"));
            false
        }
    };

    // A wakes up and carries on with its debit, under its old token.
    a.signal("-CONT")?;
    tl.say(
        "demo",
        "SIGCONT worker A: it wakes up and carries on with T1's debit",
    );
    let stale_line = format!("STALE {} ", e1.job_id);
    let refused = wait_for(&a_lines, &stale_line, Duration::from_secs(30))
        .await
        .is_ok();
    tokio::time::sleep(Duration::from_millis(200)).await;
    narrate.abort();

    // The verdict.
    println!();
    let balances = bank.balances().await?;
    let total: i64 = balances.iter().map(|(_, b)| *b).sum();
    println!("final balances:");
    for (acct, bal) in &balances {
        println!("  {acct:<6} {bal:>6}");
    }
    let expected = [
        ("alice", 1_000 - 300 + 75 - 40),
        ("bob", 1_000 + 300 - 120),
        ("carol", 1_000 + 120 - 75 + 40),
    ];
    let balances_ok = expected
        .iter()
        .all(|(a, want)| balances.iter().any(|(n, b)| n == a && b == want));
    println!("  total  {total:>6} (started with 3000; T5's debit refunded by its on_dead hook)");
    let (sent, deduped) = bank.notifications().await?;
    println!(
        "notifications delivered: {sent} (duplicate requests absorbed by idempotency key: {deduped})"
    );
    let double = bank.double_applied().await?;

    print_worker_b_metrics(&provider, &exporter, 28);
    let a_stale = a_lines
        .lock()
        .map(|l| l.iter().filter(|l| l.starts_with("STALE")).count())
        .unwrap_or(0);
    println!("  tenure.fence.stale_rejections (worker A) {a_stale}");

    let consistent = total == 3_000 && balances_ok && double == 0 && sent == 4 && refunded;
    println!();
    println!(
        "ledger consistent: {}   stale write refused: {}",
        if consistent { "yes" } else { "NO" },
        if refused { "yes" } else { "NO" }
    );
    b.shutdown().await?;
    a.stop();
    drop(stack);
    Ok(consistent && refused)
}

fn narrate_child(tl: &Timeline, line: &str) {
    let parts: Vec<&str> = line.split_whitespace().collect();
    let job = |s: &str| s.parse::<JobId>().map(|id| tl.name(id)).unwrap_or_default();
    match parts.as_slice() {
        ["COMMIT", id, step, token] => {
            let i: usize = step.parse().unwrap_or(usize::MAX);
            let name = bank::STEP_NAMES.get(i).unwrap_or(&"?");
            tl.say(
                "worker A",
                format!("{} committed step {name} with token {token}", job(id)),
            );
        }
        ["STALE", id, step, token] => {
            let i: usize = step.parse().unwrap_or(usize::MAX);
            let name = bank::STEP_NAMES.get(i).unwrap_or(&"?");
            tl.say(
                "worker A",
                format!(
                    "{} step {name}: write with token {token} REFUSED by PostgreSQL (a newer owner holds the fence)",
                    job(id)
                ),
            );
        }
        ["READY", ..] => tl.say("worker A", "ready"),
        _ => {}
    }
}

/// Worker mode: run one worker until stdin closes, printing commits and stale
/// rejections for the demo to narrate.
async fn worker_process(id: String) -> anyhow::Result<()> {
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
    let cfg = Config::from_env()?;
    let client = Client::connect(&cfg).await?;
    let bank = Bank::new(client.store().clone());
    let worker = Worker::builder(cfg)
        .register(Transfer::new(bank))
        .observer(Arc::new(Print))
        .start()
        .await?;
    // Deployed (deploy/compose.yaml): probes on TENURE_LEDGER_PROBE_ADDR and a
    // graceful shutdown on SIGTERM; in the demo: until the demo closes stdin.
    match std::env::var("TENURE_LEDGER_PROBE_ADDR") {
        Ok(addr) => {
            let addr = addr.parse().context("TENURE_LEDGER_PROBE_ADDR")?;
            let probe =
                tenure::probe::ProbeServer::serve(addr, worker.probe(), Duration::from_secs(2))
                    .await?;
            println!("READY {id} probes on {}", probe.local_addr());
            worker.run_until_signal().await?;
            drop(probe);
            Ok(())
        }
        Err(_) => serve_until_stdin_closes(worker, &id).await,
    }
}
