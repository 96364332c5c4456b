//! The operators' controls (issue 35), against the real servers: step
//! timeouts (`#[step(timeout = "..")]`).
#![cfg(feature = "harness")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::testing::TestEnv;
use tenure::{JobId, JobStatus, StepCtx, StepError};

const WAIT: Duration = Duration::from_secs(60);

/// How many times a step's sleep ran to its end (never, for a step stopped at
/// its timeout: its future is dropped mid-sleep).
static WOKE: AtomicU32 = AtomicU32::new(0);

/// Input of the timeout jobs: how long the step hangs after its write.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Hang {
    ms: u64,
}

/// One write through `ctx.db()`, then a hang of `hang.ms`.
async fn write_then_hang(ctx: &mut StepCtx, schema: &str, hang: Hang) -> Result<(), StepError> {
    let sql = format!("INSERT INTO {schema}.timed (job_id) VALUES ($1)");
    sqlx::query(&sql)
        .bind(ctx.job_id().as_uuid())
        .execute(ctx.db().await?)
        .await?;
    tokio::time::sleep(Duration::from_millis(hang.ms)).await;
    WOKE.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// A step with a 300 ms limit whose expiry is retryable (one retry).
struct Retried {
    schema: String,
}

#[tenure::job(name = "test.timeout_retried", retries = 1)]
impl Retried {
    #[step(timeout = "300ms")]
    async fn hang(&self, ctx: &mut StepCtx, h: Hang) -> Result<Hang, StepError> {
        write_then_hang(ctx, &self.schema, h).await?;
        Ok(h)
    }
}

/// The job's default limit, whose expiry is permanent for its one step.
struct Permanent {
    schema: String,
}

#[tenure::job(name = "test.timeout_permanent", retries = 3, step_timeout = "300ms")]
impl Permanent {
    #[step(timeout = "300ms", on_timeout = "permanent")]
    async fn hang(&self, ctx: &mut StepCtx, h: Hang) -> Result<Hang, StepError> {
        write_then_hang(ctx, &self.schema, h).await?;
        Ok(h)
    }
}

/// Creates the guarded table the jobs write to.
async fn timed_table(env: &TestEnv) {
    let t = format!("{}.timed", env.schema());
    sqlx::query(&format!("CREATE TABLE {t} (job_id uuid NOT NULL)"))
        .execute(env.pool())
        .await
        .unwrap();
    env.client().store().install_guard(&t).await.unwrap();
}

async fn timed_rows(env: &TestEnv, job: JobId) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM {}.timed WHERE job_id = $1",
        env.schema()
    );
    sqlx::query_scalar(&sql)
        .bind(job.as_uuid())
        .fetch_one(env.pool())
        .await
        .unwrap()
}

/// The reason of `job`'s DLQ entry (published after the row is marked dead:
/// waited for).
async fn dead_letter_reason(env: &TestEnv, job: JobId) -> String {
    let until = tokio::time::Instant::now() + WAIT;
    loop {
        let dlq = env.client().queue().dead_letters(100).await.unwrap();
        if let Some(entry) = dlq.iter().find(|d| d.job_id == Some(job)) {
            return entry.reason.clone();
        }
        assert!(
            tokio::time::Instant::now() < until,
            "no DLQ entry for {job}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn enqueue<J: tenure::Job<Input = Hang>>(env: &TestEnv, key: &str, ms: u64) -> JobId {
    let enqueued = env.client().enqueue::<J>(key, &Hang { ms }).await;
    enqueued.unwrap().job_id
}

async fn workers(env: &TestEnv) -> tenure::Worker {
    let schema = env.schema().to_string();
    env.worker("w0", |cfg| async move {
        tenure::Worker::builder(cfg)
            .register(Retried {
                schema: schema.clone(),
            })
            .register(Permanent { schema })
    })
    .await
    .unwrap()
}

/// A step past its timeout is stopped (its sleep never ends), its write
/// rolled back, the attempt retried; after the retries it is dead-lettered
/// with the code `timeout`. A step within its limit commits as usual.
#[tenure::test(ttl_secs = 3)]
async fn a_step_past_its_timeout_is_retried_then_dead_lettered_as_timeout(env: TestEnv) {
    timed_table(&env).await;
    let w = workers(&env).await;
    let woke = WOKE.load(Ordering::SeqCst);
    let hung = enqueue::<Retried>(&env, "hung", 20_000).await;
    let row = env.run_until_done(hung, WAIT).await.unwrap();
    assert_eq!(row.status, JobStatus::Dead, "{row:?}");
    assert_eq!(row.attempts, 2, "one attempt and one retry: {row:?}");
    let last = row.last_error.clone().unwrap_or_default();
    assert!(
        last.ends_with("last error: timeout: step 0 (hang) ran past its limit of 300ms"),
        "{last}"
    );
    let reason = dead_letter_reason(&env, hung).await;
    assert!(reason.starts_with("timeout: failed 2 times"), "{reason}");
    assert_eq!(
        timed_rows(&env, hung).await,
        0,
        "a timed-out write committed"
    );
    assert_eq!(WOKE.load(Ordering::SeqCst), woke, "a timed-out step ran on");

    let quick = enqueue::<Retried>(&env, "quick", 0).await;
    let row = env.run_until_done(quick, WAIT).await.unwrap();
    assert_eq!((row.status, row.attempts), (JobStatus::Done, 0), "{row:?}");
    assert_eq!(timed_rows(&env, quick).await, 1);
    env.check().await.unwrap().assert_clean();
    w.shutdown().await.unwrap();
}

/// `on_timeout = "permanent"`: the first expiry dead-letters the job, no
/// retry, nothing committed.
#[tenure::test(ttl_secs = 3)]
async fn a_permanent_timeout_dead_letters_at_once(env: TestEnv) {
    timed_table(&env).await;
    let w = workers(&env).await;
    let hung = enqueue::<Permanent>(&env, "hung", 20_000).await;
    let row = env.run_until_done(hung, WAIT).await.unwrap();
    assert_eq!((row.status, row.attempts), (JobStatus::Dead, 0), "{row:?}");
    let reason = dead_letter_reason(&env, hung).await;
    assert!(
        reason.starts_with("timeout: timeout: step 0 (hang)"),
        "{reason}"
    );
    assert_eq!(timed_rows(&env, hung).await, 0);
    w.shutdown().await.unwrap();
}
