//! The operators' controls (issue 35), against the real servers: step
//! timeouts (`#[step(timeout = "..")]`), pausing and resuming a job type.
#![cfg(feature = "harness")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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

/// When each step of [`Paced`] started, by any worker of this process.
static STARTS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

/// A three-step job whose steps note their start and take 50 ms.
struct Paced;

#[tenure::job(name = "test.paced")]
impl Paced {
    #[step]
    async fn one(&self, ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        pace(ctx).await;
        Ok(n)
    }
    #[step]
    async fn two(&self, ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        pace(ctx).await;
        Ok(n)
    }
    #[step]
    async fn three(&self, ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        pace(ctx).await;
        Ok(n)
    }
}

async fn pace(_ctx: &mut StepCtx) {
    STARTS.lock().unwrap().push(Instant::now());
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn starts_after(t: Instant) -> usize {
    STARTS.lock().unwrap().iter().filter(|s| **s > t).count()
}

/// Two workers, 200 three-step jobs, a pause mid-run: within the pause's
/// propagation bound no step starts any more (running steps finish), nothing
/// is redelivered or dead-lettered, and after the resume every job ends done,
/// each message delivered once.
#[tenure::test(ttl_secs = 3)]
async fn a_paused_type_starts_no_step_until_resumed(env: TestEnv) {
    const JOBS: usize = 200;
    tenure_tests::init_logs();
    // Four jobs at a time each, so that the run outlasts the pause's start.
    let start = |id: &'static str| {
        env.worker(id, |mut cfg| async move {
            cfg.max_in_flight = 4;
            tenure::Worker::builder(cfg).register(Paced)
        })
    };
    let (w0, w1) = (start("w0").await.unwrap(), start("w1").await.unwrap());
    let mut ids = Vec::new();
    for n in 0..JOBS {
        let key = format!("paced-{n}");
        ids.push(
            env.client()
                .enqueue::<Paced>(&key, &(n as u32))
                .await
                .unwrap()
                .job_id,
        );
    }
    while starts_after(Instant::now() - Duration::from_secs(3600)) < 60 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(env.client().pause("test.paced").await.unwrap());
    assert!(
        !env.client().pause("test.paced").await.unwrap(),
        "paused twice"
    );
    // Two reads of `paused_types` (500 ms apart) and a step in flight.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let quiet_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(starts_after(quiet_from), 0, "a step started while paused");
    let done = env
        .client()
        .store()
        .overview(Duration::from_secs(60))
        .await
        .unwrap();
    let unfinished = done
        .by_type_status
        .iter()
        .filter(|c| c.job_type == "test.paced" && c.status != "done")
        .map(|c| c.count)
        .sum::<i64>();
    assert!(
        unfinished > 0,
        "every job ended before the pause: nothing shown"
    );
    let paused = env.client().paused().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].job_type, "test.paced");

    assert!(env.client().resume("test.paced").await.unwrap());
    for id in &ids {
        let row = env.run_until_done(*id, WAIT).await.unwrap();
        assert_eq!(row.status, JobStatus::Done, "{row:?}");
    }
    assert!(
        env.client()
            .queue()
            .dead_letters(10)
            .await
            .unwrap()
            .is_empty()
    );
    let (delivered, messages) = tenure_tests::consumer_deliveries(&env, "test.paced").await;
    assert_eq!(
        (delivered, messages),
        (JOBS as u64, JOBS as u64),
        "redelivered"
    );
    env.check().await.unwrap().assert_clean();
    w0.shutdown().await.unwrap();
    w1.shutdown().await.unwrap();
}
