//! The `million` part of the pipeline benchmark (issue 33, item 6): does a
//! job cost more when the tables already hold a million finished jobs and
//! their history? Per mode: a run on empty tables, a run on tables
//! prefilled with `TENURE_BENCH_PREFILL` finished jobs (default 1,000,000,
//! one in ten dead) and six history events each (enqueued, claimed, three
//! steps, the end: what a three-step job leaves), and the empty run again.
//! Target: the prefilled run within 15% of the empty ones.

use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::{Value, json};
use sqlx::PgPool;
use tenure::Client;
use tenure::devstack::DevStack;
use tenure_benches::JOB_TYPE;
use tokio::time::Instant;

use super::fenced_run_with;

/// `n` finished jobs of the bench type in namespace `ns`, with their history.
pub(super) async fn prefill(client: &Client, ns: &str, n: i64) -> Result<()> {
    let started = Instant::now();
    // Each with the six-event trail of a finished three-step job.
    client.store().insert_synthetic_jobs(JOB_TYPE, n).await?;
    let pool = client.store().pool();
    // Settled, as autovacuum leaves a table that grew over months: a run
    // right after the bulk insert measured its vacuum and checkpoint too
    // (0.79-0.96 of empty in two runs).
    for sql in [
        format!("VACUUM (ANALYZE) {ns}.jobs"),
        format!("VACUUM (ANALYZE) {ns}.job_events"),
        "CHECKPOINT".to_string(),
    ] {
        sqlx::query(&sql).execute(pool).await?;
    }
    let events: i64 = sqlx::query_scalar(&format!(
        "SELECT coalesce(sum(cardinality(trail)), 0)::bigint FROM {ns}.jobs"
    ))
    .fetch_one(pool)
    .await?;
    println!(
        "pipeline.million prefill jobs={n} events={events} secs={:.0}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Both modes at concurrency `c`, `jobs` jobs a run; prints `pipeline.million`.
pub(super) async fn part(
    stack: &DevStack,
    c: usize,
    jobs: usize,
    rows: i64,
    partitions: u32,
) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (mode, p) in [("locks", None), ("partitions", Some(partitions))] {
        let empty_a = fenced_run_with(stack, c, jobs, p, 0).await?.jobs_per_s;
        let full = fenced_run_with(stack, c, jobs, p, rows).await?.jobs_per_s;
        let empty_b = fenced_run_with(stack, c, jobs, p, 0).await?.jobs_per_s;
        let ratio = full / ((empty_a + empty_b) / 2.0);
        println!(
            "pipeline.million mode={mode} c={c} jobs={jobs} prefilled_rows={rows} \
             empty_jobs_per_s={empty_a:.0},{empty_b:.0} prefilled_jobs_per_s={full:.0} ratio={ratio:.2}"
        );
        out.insert(
            mode.into(),
            json!({"empty": [empty_a, empty_b], "prefilled": full, "ratio": ratio}),
        );
    }
    Ok(Value::Object(out))
}

/// Buffer reads and hits per table and index of one schema, and the
/// `jobs` table's updates (all, HOT), from PostgreSQL's statistics views.
pub(super) struct Io {
    blocks: BTreeMap<String, (i64, i64)>,
    updates: (i64, i64),
}

impl Io {
    pub(super) async fn now(pool: &PgPool, ns: &str) -> Result<Io> {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT relname::text, coalesce(heap_blks_read, 0), coalesce(heap_blks_hit, 0) \
               FROM pg_statio_user_tables WHERE schemaname = $1 \
             UNION ALL \
             SELECT indexrelname::text, coalesce(idx_blks_read, 0), coalesce(idx_blks_hit, 0) \
               FROM pg_statio_user_indexes WHERE schemaname = $1",
        )
        .bind(ns)
        .fetch_all(pool)
        .await?;
        let updates: (i64, i64) = sqlx::query_as(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
              WHERE schemaname = $1 AND relname = 'jobs'",
        )
        .bind(ns)
        .fetch_one(pool)
        .await?;
        let blocks = rows
            .into_iter()
            .map(|(r, read, hit)| (r, (read, hit)))
            .collect();
        Ok(Io { blocks, updates })
    }

    /// Prints, per relation with any block touched since `before`, the
    /// blocks read (not in shared buffers) and hit per job.
    pub(super) fn print_since(&self, before: &Io, label: &str, jobs: usize) {
        let per_job = |x: i64| x as f64 / jobs as f64;
        for (rel, (read, hit)) in &self.blocks {
            let (r0, h0) = before.blocks.get(rel).copied().unwrap_or_default();
            if read - r0 + hit - h0 > 0 {
                println!(
                    "pipeline.statio {label} rel={rel} read_per_job={:.2} hit_per_job={:.2}",
                    per_job(read - r0),
                    per_job(hit - h0)
                );
            }
        }
        let (u, hot) = (
            self.updates.0 - before.updates.0,
            self.updates.1 - before.updates.1,
        );
        println!(
            "pipeline.statio {label} jobs_updates_per_job={:.2} hot_updates_per_job={:.2}",
            per_job(u),
            per_job(hot)
        );
    }
}
