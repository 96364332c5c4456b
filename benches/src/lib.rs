//! Benchmarks for tenure; see `cargo bench -p tenure-benches --bench pipeline`.
//!
//! This crate holds what the `pipeline` benchmark and its worker child process
//! (`tenure-bench-worker`) share: the benchmark job ([`BenchJob`]), its input and
//! the table its steps write to.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::{StepCtx, StepError};

/// Job type name of [`BenchJob`].
pub const JOB_TYPE: &str = "bench.three_step";

/// Input (and every checkpoint) of [`BenchJob`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct BenchInput {
    /// A number carried through the steps.
    pub n: u64,
    /// The worker that holds (sleeps, not bound to cancellation, like a GC pause
    /// or a blocking call) at the start of `hold_step`; `None`: nobody holds.
    #[serde(default)]
    pub hold_worker: Option<String>,
    /// The step that holds.
    #[serde(default)]
    pub hold_step: u32,
    /// How long it holds.
    #[serde(default)]
    pub hold_ms: u64,
}

/// The `INSERT` each step of the benchmark job makes (the same text is used by
/// the unfenced baseline).
pub fn insert_sql(schema: &str) -> String {
    format!("INSERT INTO {schema}.bench_log (job_id, step, token) VALUES ($1, $2, $3)")
}

/// The `CREATE TABLE` of the table the steps write to (unguarded: the step's
/// fenced transaction is the fence; see BENCHMARKS.md).
pub fn create_table_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {schema}.bench_log (
            job_id uuid NOT NULL,
            step int NOT NULL,
            token bigint NOT NULL,
            at timestamptz NOT NULL DEFAULT now())"
    )
}

/// A three-step job; each step makes one small PostgreSQL write (an `INSERT` into
/// `bench_log`) in its fenced transaction (`ctx.db()`).
#[derive(Debug, Clone)]
pub struct BenchJob {
    worker: Arc<str>,
    insert: Arc<str>,
}

impl BenchJob {
    /// The job as run by worker `worker` on schema `schema`.
    pub fn new(worker: &str, schema: &str) -> Self {
        BenchJob {
            worker: Arc::from(worker),
            insert: Arc::from(insert_sql(schema)),
        }
    }

    async fn write(&self, ctx: &mut StepCtx, w: &BenchInput, step: u32) -> Result<(), StepError> {
        if w.hold_step == step && w.hold_worker.as_deref() == Some(&*self.worker) {
            tokio::time::sleep(Duration::from_millis(w.hold_ms)).await;
        }
        let (job_id, token) = (ctx.job_id().as_uuid(), ctx.token().get());
        sqlx::query(&self.insert)
            .bind(job_id)
            .bind(i32::try_from(step).unwrap_or(i32::MAX))
            .bind(token)
            .execute(ctx.db().await?)
            .await?;
        Ok(())
    }
}

#[tenure::job(name = "bench.three_step", max_takeovers = 100, retries = 10)]
impl BenchJob {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, w: BenchInput) -> Result<BenchInput, StepError> {
        self.write(ctx, &w, 0).await?;
        Ok(w)
    }

    #[step]
    async fn second(&self, ctx: &mut StepCtx, w: BenchInput) -> Result<BenchInput, StepError> {
        self.write(ctx, &w, 1).await?;
        Ok(w)
    }

    #[step]
    async fn third(&self, ctx: &mut StepCtx, w: BenchInput) -> Result<BenchInput, StepError> {
        self.write(ctx, &w, 2).await?;
        Ok(w)
    }
}
