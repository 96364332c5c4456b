//! Statements per job (`PEERS_STATEMENTS=1`): the dev stack's PostgreSQL
//! restarted with `pg_stat_statements` (top-level statements only, so each
//! counted call is one round trip of a client), reset before each system's
//! run and read after it. The counts include the run's setup (a migration,
//! the rows' insert: a few hundred statements over the run's jobs) and
//! whatever the system does in the background while it runs (polls,
//! keepalives, progress).

use anyhow::{Context, Result};
use sqlx::PgPool;
use tenure::devstack::DevStack;

/// Restarts the stack's PostgreSQL with `pg_stat_statements` loaded.
pub async fn enable(stack: &DevStack) -> Result<()> {
    let pool = PgPool::connect(&stack.database_url()).await?;
    // `pg_stat_statements.track` defaults to `top`.
    sqlx::query("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        .execute(&pool)
        .await?;
    pool.close().await;
    stack.postgres().restart()?;
    stack.wait_ready(std::time::Duration::from_secs(60)).await?;
    let pool = PgPool::connect(&stack.database_url()).await?;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await
        .context("pg_stat_statements")?;
    Ok(())
}

/// Forgets every count so far.
pub async fn reset(stack: &DevStack) -> Result<()> {
    let pool = PgPool::connect(&stack.database_url()).await?;
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(())
}

/// Prints the statements per job since the last [`reset`], and each
/// statement made at least once per ten jobs, by calls.
pub async fn print(stack: &DevStack, system: &str, c: usize, n: usize) -> Result<()> {
    let pool = PgPool::connect(&stack.database_url()).await?;
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls FROM pg_stat_statements
          WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY calls DESC",
    )
    .fetch_all(&pool)
    .await?;
    pool.close().await;
    let total: i64 = rows.iter().map(|(_, calls)| calls).sum();
    let per_job = |calls: i64| calls as f64 / n as f64;
    println!(
        "peers.statements system={system} c={c} per_job={:.2}",
        per_job(total)
    );
    for (query, calls) in rows.iter().filter(|(_, calls)| *calls * 10 >= n as i64) {
        let short: String = query.chars().take(140).collect();
        println!(
            "peers.statement system={system} c={c} per_job={:.2} {short}",
            per_job(*calls)
        );
    }
    Ok(())
}
