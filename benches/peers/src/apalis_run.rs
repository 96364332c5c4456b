//! apalis 1.0 (`apalis-postgres`, `apalis-workflow`) on the shape: a
//! `SteppedFlow` of three `and_then` steps, each its own task row, each one
//! `UPDATE` (autocommit; apalis is at-least-once, nothing is fenced).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use apalis::prelude::*;
use apalis_postgres::{Config, PgPool, PostgresStorage};
use apalis_workflow::{SteppedFlow, WorkflowSink};
use sqlx09::AssertSqlSafe;
use sqlx09::postgres::PgPoolOptions;
use tokio::time::Instant;

use crate::shape::{self, Done, Figure, PRODUCERS, joined};

/// What every step gets: the pool, its `UPDATE` and the counter.
#[derive(Clone)]
struct Ctx {
    pool: PgPool,
    update: Arc<str>,
    done: Arc<Done>,
}

async fn update(id: i64, ctx: &Ctx) -> Result<i64, BoxDynError> {
    sqlx09::query(AssertSqlSafe(&*ctx.update))
        .bind(id)
        .execute(&ctx.pool)
        .await?;
    Ok(id)
}

async fn first(id: i64, ctx: Data<Ctx>) -> Result<i64, BoxDynError> {
    update(id, &ctx).await
}

async fn second(id: i64, ctx: Data<Ctx>) -> Result<i64, BoxDynError> {
    update(id, &ctx).await
}

async fn third(id: i64, ctx: Data<Ctx>) -> Result<(), BoxDynError> {
    update(id, &ctx).await?;
    ctx.done.add();
    Ok(())
}

/// One apalis run of `n` jobs at concurrency `c` on `database_url`, in a
/// fresh schema `schema` (apalis's own tables live in its `apalis` schema;
/// each run uses its own queue).
pub async fn run(database_url: &str, schema: &str, c: usize, n: usize) -> Result<Figure> {
    let pool = PgPoolOptions::new()
        .max_connections(c as u32 + 4)
        .connect(database_url)
        .await
        .context("apalis: connect")?;
    PostgresStorage::setup(&pool)
        .await
        .context("apalis: setup")?;
    prepare(&pool, schema, n).await?;
    let config = Config::default().queue(schema).batch_size(c.max(10));
    let sink = PostgresStorage::<i64>::new(&pool).with_config(config.clone());
    let backend = PostgresStorage::<i64>::new(&pool)
        .with_config(config)
        .with_pubsub()
        .poll_with_interval(Duration::from_millis(50));
    let done = Arc::new(Done::default());
    let ctx = Ctx {
        pool: pool.clone(),
        update: Arc::from(shape::update_sql(schema)),
        done: done.clone(),
    };
    let flow = SteppedFlow::new("peers")
        .and_then(first)
        .and_then(second)
        .and_then(third);
    let worker = WorkerBuilder::new(format!("apalis-{schema}"))
        .backend(backend)
        .data(ctx)
        .concurrency(c)
        .build(flow);
    let running = tokio::spawn(async move { worker.run().await });
    let started = Instant::now();
    let producers = (0..PRODUCERS)
        .map(|p| {
            let mut sink = sink.clone();
            tokio::spawn(async move {
                for id in shape::share(p, n) {
                    let pushed = sink.push_start(id).await;
                    pushed.map_err(|e| anyhow::anyhow!("apalis: push: {e}"))?;
                }
                Ok(())
            })
        })
        .collect();
    let enqueued = joined(producers).await?;
    done.wait_for(n as u64, Duration::from_secs(900)).await?;
    let figure = Figure::of(n, started, enqueued, Instant::now());
    running.abort();
    check(&pool, schema, n).await?;
    Ok(figure)
}

/// The schema and its rows.
async fn prepare(pool: &PgPool, schema: &str, n: usize) -> Result<()> {
    for sql in [
        format!("CREATE SCHEMA {schema}"),
        shape::create_rows_sql(schema),
        shape::insert_rows_sql(schema, n),
    ] {
        sqlx09::query(AssertSqlSafe(sql))
            .execute(pool)
            .await
            .context("apalis: prepare")?;
    }
    Ok(())
}

/// Every row was updated exactly three times.
async fn check(pool: &PgPool, schema: &str, n: usize) -> Result<()> {
    let (three, more): (i64, i64) = sqlx09::query_as(AssertSqlSafe(shape::check_sql(schema)))
        .fetch_one(pool)
        .await?;
    shape::verdict("apalis", n, three, more)
}
