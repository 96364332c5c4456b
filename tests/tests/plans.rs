//! The fenced path's SQL keeps its plans: every statement PostgreSQL runs
//! inside Tenure's functions and triggers is planned once per session (a few
//! times, as the plan cache settles), never once per call. A function of
//! `LANGUAGE sql` that cannot be inlined (a `SET` clause, a subquery) is
//! parsed and planned again in every transaction that calls it: the guard's
//! `tenure_admitted`, called by every step's CAS, cost 16% of a three-step
//! job's PostgreSQL instructions that way (BENCHMARKS.md, "Plans kept").
//!
//! Counted with `pg_stat_statements` (`track = all`, `track_planning = on`)
//! on a stack of the test's own: after 100 three-step jobs, each nested
//! statement run 100 times or more must have been planned in fewer than half
//! of its calls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::testing::TestEnv;
use tenure::{Config, JobId, StepCtx, StepError, Worker, WorkerBuilder};
use tenure_tests::{insert_in_step, step_table};

/// Three steps, each a write to the guarded table `tally` through `ctx.db()`.
#[derive(Debug, Clone)]
struct Three {
    schema: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Nothing {}

impl Three {
    async fn write(&self, ctx: &mut StepCtx, step: u32) -> Result<Nothing, StepError> {
        let sql = format!(
            "INSERT INTO {}.tally (job_id, token, step) VALUES ($1, $2, $3)",
            self.schema
        );
        insert_in_step(ctx, &sql, Some(step), None).await?;
        Ok(Nothing {})
    }
}

#[tenure::job(name = "plans.three")]
impl Three {
    #[step]
    async fn one(&self, ctx: &mut StepCtx, _n: Nothing) -> Result<Nothing, StepError> {
        self.write(ctx, 0).await
    }

    #[step]
    async fn two(&self, ctx: &mut StepCtx, _n: Nothing) -> Result<Nothing, StepError> {
        self.write(ctx, 1).await
    }

    #[step]
    async fn three(&self, ctx: &mut StepCtx, _n: Nothing) -> Result<Nothing, StepError> {
        self.write(ctx, 2).await
    }
}

async fn workers(mut cfg: Config) -> WorkerBuilder {
    cfg.max_in_flight = 4;
    let schema = cfg.schema.clone();
    Worker::builder(cfg).register(Three { schema })
}

const JOBS: usize = 100;

/// Restarts the stack's PostgreSQL with `pg_stat_statements` counting nested
/// statements and their planning.
async fn count_plans(env: &TestEnv) {
    sqlx::query("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        .execute(env.pool())
        .await
        .unwrap();
    env.stack().postgres().restart().unwrap();
    env.stack()
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap();
    // Known to the server only once the library is loaded; both reload.
    for sql in [
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
        "ALTER SYSTEM SET pg_stat_statements.track = 'all'",
        "ALTER SYSTEM SET pg_stat_statements.track_planning = on",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::query(sql).execute(env.pool()).await.unwrap();
    }
}

#[tenure::test(own_stack)]
async fn the_fenced_path_plans_each_statement_once_per_session(env: TestEnv) {
    count_plans(&env).await;
    step_table(&env, "tally", true).await;
    let w = env.worker("w1", workers).await.unwrap();
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(env.pool())
        .await
        .unwrap();
    for k in 0..JOBS {
        let key = format!("p{k}");
        env.client()
            .enqueue::<Three>(&key, &Nothing {})
            .await
            .unwrap();
    }
    for k in 0..JOBS {
        let id = JobId::from_key("plans.three", &format!("p{k}"));
        let row = env.run_until_done(id, Duration::from_secs(120)).await;
        assert_eq!(row.unwrap().status, tenure::JobStatus::Done);
    }
    let replanned: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, plans FROM pg_stat_statements
          WHERE NOT toplevel AND calls >= $1 AND plans * 2 > calls ORDER BY calls DESC",
    )
    .bind(i64::try_from(JOBS).unwrap())
    .fetch_all(env.pool())
    .await
    .unwrap();
    assert!(
        replanned.is_empty(),
        "planned again on (nearly) every call (query, calls, plans): {replanned:#?}"
    );
    w.shutdown().await.unwrap();
}
