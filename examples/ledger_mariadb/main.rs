//! # The ledger on MariaDB: a paused worker's stale write refused by MariaDB
//!
//! The ledger demo's story with the accounts in MariaDB (issue 22): a
//! three-step transfer (`check`, `debit`, `credit`) whose money moves in
//! MariaDB through `ctx.mysql()`, its job row and checkpoints in PostgreSQL.
//! Worker A (a separate process) is frozen with SIGSTOP inside T1's debit for
//! longer than its lease; worker B takes T1 over with a larger token, finishes
//! it and the other transfers. A wakes up and tries its debit under its old
//! token: MariaDB's fence row refuses it. Exits 0 only if that stale write was
//! refused and the balances add up.
//!
//! `cargo run --example ledger_mariadb` starts its own dev stack (3 etcd
//! members, NATS, PostgreSQL and MariaDB).

mod bank;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bank::{Bank, Transfer, TransferReq};
use tenure::MySqlFence;
use tenure::devstack::{DevStack, DevStackOptions};
use tenure::{Client, Config, FencingToken, JobId, StepIndex};
use tenure::{Worker, WorkerObserver};
use tenure_examples::{serve_until_stdin_closes, spawn_worker, token_of, wait_for, wait_until};

const TTL: Duration = Duration::from_secs(2);
const ROLE_ENV: &str = "TENURE_LEDGER_MARIADB_WORKER";
const MYSQL_ENV: &str = "TENURE_LEDGER_MYSQL_URL";

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Ok(id) = std::env::var(ROLE_ENV) {
        return rt.block_on(worker_process(id));
    }
    if !rt.block_on(demo())? {
        bail!("the MariaDB ledger is NOT consistent, or the stale write was not refused");
    }
    Ok(())
}

/// Prints a worker's commits and refusals (`COMMIT|STALE <job> <step> <token>`).
struct Print(&'static str);

impl WorkerObserver for Print {
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        let name = bank::STEP_NAMES.get(step.get() as usize).unwrap_or(&"?");
        println!("{}COMMIT {job_id} {step} {token} ({name})", self.0);
        let _ = std::io::stdout().flush();
    }
    fn stale_rejected(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        println!("{}STALE {job_id} {step} {token}", self.0);
        let _ = std::io::stdout().flush();
    }
}

async fn demo() -> anyhow::Result<bool> {
    println!("Tenure ledger on MariaDB: fencing a paused worker at a MySQL-protocol database\n");
    let stack = DevStack::start_with(DevStackOptions {
        mariadb: true,
        ..Default::default()
    })
    .await
    .context("starting the dev stack")?;
    let ns = DevStack::unique_namespace("ledger_mariadb");
    let cfg = Config::new(ns.clone())
        .with_schema(ns.clone())
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_nats_url(stack.nats_url())
        .with_database_url(stack.database_url())
        .with_lease_ttl(TTL);
    let mysql_url = stack.create_mysql_database(&ns).await?;
    println!("  mariadb {mysql_url}\n  postgresql {}\n", cfg.database_url);
    let client = Client::connect(&cfg).await?;
    client.migrate().await?;
    let bank = Bank {
        fence: MySqlFence::connect("bank", &mysql_url, &cfg).await?,
    };
    bank.create(&[("alice", 1_000), ("bob", 1_000), ("carol", 1_000)])
        .await?;

    let a = spawn_worker(ROLE_ENV, "A", &cfg, &[(MYSQL_ENV, &mysql_url)])?;
    wait_for(&a.lines, "READY", Duration::from_secs(30)).await?;
    let t1 = TransferReq {
        from: "alice".into(),
        to: "bob".into(),
        amount: 300,
        debit_latency_ms: 1_500,
    };
    let t1 = client.enqueue::<Transfer>("T1", &t1).await?.job_id;
    println!("enqueued T1: alice -> bob, 300 (its debit calls a slow core-banking system)");
    let checked = format!("COMMIT {t1} 0 ");
    wait_for(&a.lines, &checked, Duration::from_secs(30)).await?;
    let a_token = token_of(&a.lines, &checked).context("A's token")?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.signal("-STOP")?;
    println!("SIGSTOP worker A inside T1's debit (token {a_token}), longer than its {TTL:?} lease");

    let b = Worker::builder(cfg.clone().with_worker_id("B"))
        .register(Transfer { bank: bank.clone() })
        .observer(Arc::new(Print("worker B: ")))
        .start()
        .await?;
    let mut ids = vec![t1];
    for (name, from, to, amount) in [("T2", "bob", "carol", 120), ("T3", "carol", "alice", 75)] {
        let req = TransferReq {
            from: from.into(),
            to: to.into(),
            amount,
            debit_latency_ms: 0,
        };
        ids.push(client.enqueue::<Transfer>(name, &req).await?.job_id);
        println!("enqueued {name}: {from} -> {to}, {amount}");
    }
    let all_done = wait_until(Duration::from_secs(60), || async {
        let mut done = 0;
        for id in &ids {
            if let Ok(Some(row)) = client.job(*id).await
                && row.status == tenure::blocks::fence::JobStatus::Done
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
    let mysql_fence = bank
        .fence
        .fence_of(t1)
        .await?
        .context("T1's MariaDB fence")?;
    println!("T1 done by worker B; MariaDB's fence for T1 is now {mysql_fence}");

    a.signal("-CONT")?;
    println!("SIGCONT worker A: it carries on with T1's debit under token {a_token}");
    let refused = wait_for(&a.lines, &format!("STALE {t1} 1 "), Duration::from_secs(30))
        .await
        .is_ok();
    if refused {
        println!(
            "worker A: T1's debit with token {a_token} REFUSED by MariaDB (fence {mysql_fence})"
        );
    }
    verdict(&bank, refused, b, a).await
}

async fn verdict(
    bank: &Bank,
    refused: bool,
    b: Worker,
    a: tenure_examples::ChildWorker,
) -> anyhow::Result<bool> {
    let balances = bank.balances().await?;
    println!("\nfinal balances (MariaDB):");
    for (acct, bal) in &balances {
        println!("  {acct:<6} {bal:>6}");
    }
    let expected = [
        ("alice", 1_000 - 300 + 75),
        ("bob", 1_000 + 300 - 120),
        ("carol", 1_000 + 120 - 75),
    ];
    let total: i64 = balances.iter().map(|(_, b)| *b).sum();
    let balances_ok = expected
        .iter()
        .all(|(a, want)| balances.iter().any(|(n, b)| n == a && b == want));
    let double = bank.double_applied().await?;
    println!("  total  {total:>6} (started with 3000); entries applied twice: {double}");
    let consistent = total == 3_000 && balances_ok && double == 0;
    println!(
        "\nledger consistent: {}   stale write refused by MariaDB: {}",
        if consistent { "yes" } else { "NO" },
        if refused { "yes" } else { "NO" }
    );
    b.shutdown().await?;
    a.stop();
    Ok(consistent && refused)
}

/// Worker mode: one worker until stdin closes.
async fn worker_process(id: String) -> anyhow::Result<()> {
    let cfg = Config::from_env()?;
    let url = std::env::var(MYSQL_ENV).context(MYSQL_ENV)?;
    let bank = Bank {
        fence: MySqlFence::connect("bank", &url, &cfg).await?,
    };
    let worker = Worker::builder(cfg)
        .register(Transfer { bank })
        .observer(Arc::new(Print("")))
        .start()
        .await?;
    serve_until_stdin_closes(worker, &id).await
}
