//! Tenure next to apalis 1.0 on one job shape, in one run, against one
//! PostgreSQL (the dev stack's, `fsync=off`): `n` jobs of three steps, each
//! step one `UPDATE` of the job's own row, four producer tasks enqueueing while
//! the worker drains, the clock from the first enqueue to the last commit.
//!
//! ```sh
//! cargo run --release --manifest-path benches/peers/Cargo.toml
//! ```
//!
//! Knobs: `PEERS_JOBS` (5000), `PEERS_CONCURRENCY` (`8,32`), `PEERS_PARTITIONS`
//! (8). One line per concurrency:
//! `peers: c=C apalis_jobs_per_s=A tenure_locks_jobs_per_s=L tenure_partitions_jobs_per_s=P ratio_partitions_vs_apalis=R`.

mod apalis_run;
mod shape;
mod tenure_run;

use anyhow::{Context, Result};
use tenure::devstack::DevStack;

use shape::Figure;

struct Opts {
    jobs: usize,
    concurrency: Vec<usize>,
    partitions: u32,
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .ok()
            .with_context(|| format!("{name}={v}: not a number")),
        Err(_) => Ok(default),
    }
}

fn opts() -> Result<Opts> {
    let concurrency = std::env::var("PEERS_CONCURRENCY").unwrap_or_else(|_| "8,32".into());
    let concurrency = concurrency
        .split(',')
        .map(|c| {
            c.trim()
                .parse()
                .with_context(|| format!("PEERS_CONCURRENCY: {c}"))
        })
        .collect::<Result<_>>()?;
    Ok(Opts {
        jobs: env("PEERS_JOBS", 5000)?,
        concurrency,
        partitions: env("PEERS_PARTITIONS", 8)?,
    })
}

fn line(system: &str, c: usize, f: Figure) {
    println!(
        "peers.{system} c={c} jobs_per_s={:.0} enqueue_per_s={:.0} load={}",
        f.jobs_per_s,
        f.enqueue_per_s,
        load()
    );
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    let o = opts()?;
    let stack = DevStack::start().await?;
    let mut lines = Vec::new();
    for &c in &o.concurrency {
        let ns = DevStack::unique_namespace("peers_apalis");
        let apalis = apalis_run::run(&stack.database_url(), &ns, c, o.jobs).await?;
        line("apalis", c, apalis);
        let ns = DevStack::unique_namespace("peers_locks");
        let locks = tenure_run::run(&stack, &ns, c, o.jobs, None).await?;
        line("tenure_locks", c, locks);
        let ns = DevStack::unique_namespace("peers_parts");
        let parts = tenure_run::run(&stack, &ns, c, o.jobs, Some(o.partitions)).await?;
        line("tenure_partitions", c, parts);
        lines.push(format!(
            "peers: c={c} apalis_jobs_per_s={:.0} tenure_locks_jobs_per_s={:.0} tenure_partitions_jobs_per_s={:.0} ratio_partitions_vs_apalis={:.2}",
            apalis.jobs_per_s,
            locks.jobs_per_s,
            parts.jobs_per_s,
            parts.jobs_per_s / apalis.jobs_per_s
        ));
    }
    for l in lines {
        println!("{l}");
    }
    Ok(())
}
