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
//! (8), `PEERS_STATEMENTS=1` (statements per job: `statements.rs`),
//! `PEERS_PHASES=1` (Tenure's enqueue time, insert and publish apart:
//! `tenure_run::Phases`), `PEERS_SYSTEMS` (a comma list of `apalis`,
//! `tenure_locks`, `tenure_partitions`; all by default),
//! `PEERS_PRODUCERS_APART=1` (Tenure's producers on a runtime and a client of
//! their own, on their own threads, as a service beside the worker would be).
//! One line
//! per concurrency:
//! `peers: c=C apalis_jobs_per_s=A tenure_locks_jobs_per_s=L tenure_partitions_jobs_per_s=P ratio_partitions_vs_apalis=R`.

mod apalis_run;
mod shape;
mod statements;
mod tenure_run;
// The wire counter is the integration tests' (`kit.rs` counts an enqueue's
// round trips with it); shared by path, as this package is outside the
// workspace.
#[path = "../../../tests/src/trips.rs"]
mod trips;

use std::sync::Arc;

use anyhow::{Context, Result};
use tenure::devstack::DevStack;

use shape::Figure;

struct Opts {
    jobs: usize,
    concurrency: Vec<usize>,
    partitions: u32,
    statements: bool,
    phases: bool,
    systems: Vec<String>,
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
        statements: std::env::var("PEERS_STATEMENTS").is_ok_and(|v| v == "1"),
        phases: std::env::var("PEERS_PHASES").is_ok_and(|v| v == "1"),
        systems: std::env::var("PEERS_SYSTEMS")
            .unwrap_or_else(|_| SYSTEMS.join(","))
            .split(',')
            .map(|s| s.trim().to_string())
            .collect(),
    })
}

/// Every system, in the order a concurrency's runs go.
const SYSTEMS: [&str; 3] = ["apalis", "tenure_locks", "tenure_partitions"];

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

/// One run of `system` at concurrency `c` in a fresh namespace, its line
/// printed (and its statements, with `PEERS_STATEMENTS=1`).
async fn measured(s: &Servers<'_>, o: &Opts, system: &str, c: usize) -> Result<Figure> {
    let ns = DevStack::unique_namespace(&format!("peers_{}", &system[..1]));
    let (stack, n) = (s.stack, o.jobs);
    if let Some(proxy) = &s.proxy {
        statements::reset(stack).await?;
        proxy.take();
        proxy.take_connections();
    }
    let partitions = (system == "tenure_partitions").then_some(o.partitions);
    let db = &s.db;
    let phases = o.phases.then(|| Arc::new(tenure_run::Phases::default()));
    let figure = match system {
        "apalis" => apalis_run::run(db, &ns, c, n).await?,
        _ => {
            tenure_run::run(tenure_run::Run {
                stack,
                db,
                ns: &ns,
                c,
                n,
                partitions,
                phases: phases.clone(),
            })
            .await?
        }
    };
    line(system, c, figure);
    if let Some(phases) = phases {
        println!("peers.enqueue_phases system={system} c={c} {}", phases.line());
    }
    if let Some(proxy) = &s.proxy {
        let trips = proxy.take() as f64 / n as f64;
        let opened = proxy.take_connections();
        println!(
            "peers.round_trips system={system} c={c} per_job={trips:.2} connections_opened={opened}"
        );
        statements::print(stack, system, c, n).await?;
    }
    Ok(figure)
}

/// The servers every run uses: with `PEERS_STATEMENTS=1`, PostgreSQL through
/// a counting proxy.
struct Servers<'a> {
    stack: &'a DevStack,
    db: String,
    proxy: Option<trips::Proxy>,
}

impl<'a> Servers<'a> {
    async fn new(stack: &'a DevStack, count: bool) -> Result<Servers<'a>> {
        let db = stack.database_url();
        if !count {
            return Ok(Servers {
                stack,
                db,
                proxy: None,
            });
        }
        statements::enable(stack).await?;
        let (proxy, db) = trips::Proxy::in_front_of(&db).await?;
        Ok(Servers {
            stack,
            db,
            proxy: Some(proxy),
        })
    }
}

/// The run's line at concurrency `c`, from each of [`SYSTEMS`]' jobs/s
/// (`None`: not run, printed as `-`).
fn summary(c: usize, f: &[Option<f64>]) -> String {
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    let ratio = match (f[0], f[2]) {
        (Some(a), Some(p)) => format!("{:.2}", p / a),
        _ => "-".to_string(),
    };
    format!(
        "peers: c={c} apalis_jobs_per_s={} tenure_locks_jobs_per_s={} tenure_partitions_jobs_per_s={} ratio_partitions_vs_apalis={ratio}",
        show(f[0]),
        show(f[1]),
        show(f[2])
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let o = opts()?;
    let stack = DevStack::start().await?;
    let mut lines = Vec::new();
    let servers = Servers::new(&stack, o.statements).await?;
    for &c in &o.concurrency {
        let mut figures = Vec::new();
        for system in SYSTEMS {
            if o.systems.iter().any(|s| s == system) {
                figures.push(Some(measured(&servers, &o, system, c).await?.jobs_per_s));
            } else {
                figures.push(None);
            }
        }
        lines.push(summary(c, &figures));
    }
    for l in lines {
        println!("{l}");
    }
    Ok(())
}
