//! The `postgres_failover` fault (issue 36, item 2): with
//! `--postgres-standby sync|async` the dev stack's PostgreSQL has a streaming
//! standby behind a front, the one address every worker, client and checker
//! uses. The fault is an HA manager's failover: the primary killed
//! (SIGKILL, by its pid), the standby promoted (`pg_ctl promote`), the front
//! pointed at it, and a new standby made from it.
//!
//! What it costs is measured on the database's own clock: from the last
//! history row committed before the kill to the first one committed on the
//! promoted standby (commit timestamps: the dev stack's replicated servers
//! run with `track_commit_timestamp`), printed per failover.

use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tenure::devstack::{DevStack, Replication};

/// How long a failover (and the first commit after it) may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// `--postgres-standby`'s value.
pub fn parse(s: &str) -> anyhow::Result<Replication> {
    match s {
        "sync" => Ok(Replication::Synchronous),
        "async" => Ok(Replication::Asynchronous),
        other => anyhow::bail!("--postgres-standby must be sync or async, not {other:?}"),
    }
}

/// How the run's standby replicates, for the mode line.
pub fn name(standby: Option<Replication>) -> &'static str {
    match standby {
        None => "none",
        Some(Replication::Synchronous) => "sync",
        Some(Replication::Asynchronous) => "async",
    }
}

/// `postgres_failover` on `stack`, whose jobs write history rows to
/// `<ns>.history` (read through `pool`). Returns once the new standby
/// streams; the commit gap is measured and printed by a task of its own.
pub async fn failover(stack: &mut DevStack, pool: &PgPool, ns: &str) -> anyhow::Result<()> {
    let before: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .context("the primary's clock")?;
    let took = stack
        .postgres_failover(TIMEOUT)
        .await
        .context("postgres failover")?;
    eprintln!(
        "torture: postgres failover: promoted {:?} (pg_ctl promote {:?}), new standby \
         streaming {:?} after the kill",
        took.promoted_after, took.promote, took.standby_after
    );
    // Nothing commits on the promoted standby before it was promoted.
    let promoted = before + chrono::TimeDelta::from_std(took.promoted_after)?;
    let (pool, ns) = (pool.clone(), ns.to_string());
    tokio::spawn(async move { print_commit_gap(&pool, &ns, promoted).await });
    Ok(())
}

/// Prints how long no history row committed around a failover whose
/// standby was promoted by `promoted`: the last commit before that to the
/// first one after it.
async fn print_commit_gap(pool: &PgPool, ns: &str, promoted: DateTime<Utc>) {
    let committed = format!("(SELECT pg_xact_commit_timestamp(xmin) AS at FROM {ns}.history) c");
    let last = format!("SELECT max(at) FROM {committed} WHERE at <= $1");
    let first = format!("SELECT min(at) FROM {committed} WHERE at > $1");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while tokio::time::Instant::now() < deadline {
        let after: Option<DateTime<Utc>> = sqlx::query_scalar(&first)
            .bind(promoted)
            .fetch_one(pool)
            .await
            .unwrap_or(None);
        if let Some(after) = after {
            let last: Option<DateTime<Utc>> = sqlx::query_scalar(&last)
                .bind(promoted)
                .fetch_one(pool)
                .await
                .unwrap_or(None);
            let gap = last.map(|l| (after - l).to_std().unwrap_or_default());
            eprintln!("torture: postgres failover: no step committed for {gap:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("torture: postgres failover: no commit within {TIMEOUT:?} after it");
}
