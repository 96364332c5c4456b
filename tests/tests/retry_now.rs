//! The operators' retry-now and reschedule (issue 35, item 6), against the
//! real servers: a job waiting in retry backoff starts at once, under the
//! normal lock and claim (one owner, one claim per attempt); a delayed job's
//! `run_at` moves; each refused while a job is running, finished or (for a
//! reschedule) already published, changing nothing.
#![cfg(feature = "harness")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::testing::TestEnv;
use tenure::{ClientError, JobId, JobStatus, StepCtx, StepError, WrongState};

const WAIT: Duration = Duration::from_secs(60);
/// A retry backoff no test waits out.
const LONG: Duration = Duration::from_secs(600);

/// How many times `Flaky`'s step started.
static FLAKY_STARTS: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Work {
    /// How long the step runs before it answers.
    ms: u64,
}

/// Fails its first attempt, then succeeds.
struct Flaky;

#[tenure::job(name = "test.retry_flaky", retries = 3)]
impl Flaky {
    #[step]
    async fn once(&self, ctx: &mut StepCtx, w: Work) -> Result<Work, StepError> {
        let n = FLAKY_STARTS.fetch_add(1, Ordering::SeqCst);
        let _ = ctx;
        if n == 0 {
            return Err(StepError::retryable("the first attempt fails"));
        }
        Ok(w)
    }
}

/// Runs for `w.ms`, then succeeds.
struct Slow;

#[tenure::job(name = "test.retry_slow", retries = 1)]
impl Slow {
    #[step]
    async fn slow(&self, _ctx: &mut StepCtx, w: Work) -> Result<Work, StepError> {
        tokio::time::sleep(Duration::from_millis(w.ms)).await;
        Ok(w)
    }
}

/// One worker running both types, retrying only after `LONG`.
async fn worker(env: &TestEnv) -> tenure::Worker {
    env.worker("w0", |mut cfg| async move {
        cfg.retry_backoff.base = LONG;
        cfg.retry_backoff.cap = LONG * 2;
        tenure::Worker::builder(cfg).register(Flaky).register(Slow)
    })
    .await
    .unwrap()
}

/// Polls `job`'s row until `pred` holds.
async fn until_row(
    env: &TestEnv,
    job: JobId,
    pred: impl Fn(&tenure::JobRow) -> bool,
) -> tenure::JobRow {
    let until = tokio::time::Instant::now() + WAIT;
    loop {
        let row = env.client().store().job(job).await.unwrap().unwrap();
        if pred(&row) {
            return row;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "row never matched: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The kinds of `job`'s history events, in order.
async fn kinds(env: &TestEnv, job: JobId) -> Vec<String> {
    let events = env.client().store().job_events(job).await.unwrap();
    events.into_iter().map(|e| e.kind).collect()
}

fn count(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

/// How many messages the work stream stored so far, and how many times the
/// type's consumer delivered (redeliveries included).
async fn messages(env: &TestEnv, job_type: &str) -> (u64, u64) {
    let nats = async_nats::connect(env.stack().nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let names = env.client().queue().names();
    let mut stream = js.get_stream(&names.stream).await.unwrap();
    let last_seq = stream.info().await.unwrap().state.last_sequence;
    let info = stream
        .consumer_info(names.type_consumer(job_type))
        .await
        .unwrap();
    (last_seq, info.delivered.consumer_sequence)
}

/// The state a refused reschedule of `job` to `at` named.
async fn reschedule_refused(
    env: &TestEnv,
    job: JobId,
    at: chrono::DateTime<chrono::Utc>,
) -> WrongState {
    match env.client().reschedule(job, at).await {
        Err(ClientError::CannotReschedule { job_id, state }) if job_id == job => state,
        other => panic!("{other:?}"),
    }
}

/// Enqueues job `key` of type `J` whose step works `ms`.
async fn enqueued<J: tenure::Job<Input = Work>>(env: &TestEnv, key: &str, ms: u64) -> JobId {
    let enqueued = env.client().enqueue::<J>(key, &Work { ms }).await;
    enqueued.unwrap().job_id
}

/// A job whose first attempt failed waits out a ten-minute backoff; retry-now
/// starts it at once: it ends done after two attempts' deliveries (the
/// original and the retry-now message), one failure, one claim per attempt,
/// no takeover and no stale refusal. The original message, still naked for
/// minutes, is absorbed when it comes back (the row is done).
#[tenure::test(ttl_secs = 3)]
async fn retry_now_starts_a_job_waiting_in_retry_backoff_at_once(env: TestEnv) {
    let _w = worker(&env).await;
    let job = enqueued::<Flaky>(&env, "flaky", 0).await;
    let waiting = until_row(&env, job, |r| {
        r.attempts == 1 && r.status == JobStatus::Pending
    })
    .await;
    assert!(waiting.released && !waiting.awaiting_publish, "{waiting:?}");
    // Still waiting a moment later: the backoff is minutes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(FLAKY_STARTS.load(Ordering::SeqCst), 1);

    env.client().retry_now(job).await.unwrap();
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, JobStatus::Done, "{row:?}");
    assert_eq!(row.attempts, 1, "one failure, then the retry: {row:?}");
    assert_eq!(row.takeovers, 0, "{row:?}");
    assert_eq!(FLAKY_STARTS.load(Ordering::SeqCst), 2, "two attempts");
    let (stored, delivered) = messages(&env, "test.retry_flaky").await;
    assert_eq!(
        (stored, delivered),
        (2, 2),
        "the original and the retry-now message, each delivered once"
    );

    let k = kinds(&env, job).await;
    assert_eq!(count(&k, "claimed"), 2, "one claim per attempt: {k:?}");
    assert_eq!(count(&k, "taken_over"), 0, "{k:?}");
    assert_eq!(count(&k, "stale_refused"), 0, "{k:?}");
    assert_eq!(count(&k, "retried_now"), 1, "{k:?}");
    assert_eq!(count(&k, "done"), 1, "{k:?}");

    // A finished job is refused, and an unknown one.
    let again = env.client().retry_now(job).await.unwrap_err();
    assert!(
        matches!(
            again,
            ClientError::CannotRetryNow {
                state: WrongState::Done,
                ..
            }
        ),
        "{again:?}"
    );
    let nobody = JobId::from_key("test.retry_flaky", "never enqueued");
    let unknown = env.client().retry_now(nobody).await.unwrap_err();
    assert!(
        matches!(unknown, ClientError::UnknownJob(id) if id == nobody),
        "{unknown:?}"
    );
    env.check().await.unwrap().assert_clean();
}

/// Retry-now of a running job is refused and changes nothing: no message, no
/// event, the row as it was; the job ends with one claim. A queued job (never
/// failed) and a delayed one are refused too.
#[tenure::test(ttl_secs = 3)]
async fn retry_now_refuses_a_running_job_and_changes_nothing(env: TestEnv) {
    let _w = worker(&env).await;
    let job = enqueued::<Slow>(&env, "slow", 2_000).await;
    let running = until_row(&env, job, |r| r.status == JobStatus::Running).await;
    let before = (
        kinds(&env, job).await,
        messages(&env, "test.retry_slow").await,
    );
    let refused = env.client().retry_now(job).await.unwrap_err();
    assert!(
        matches!(refused, ClientError::CannotRetryNow { job_id, state: WrongState::Running } if job_id == job),
        "{refused:?}"
    );
    let after = (
        kinds(&env, job).await,
        messages(&env, "test.retry_slow").await,
    );
    assert_eq!(before, after, "nothing written, nothing published");
    let now = env.client().store().job(job).await.unwrap().unwrap();
    assert_eq!(
        (now.fence, now.step, now.attempts),
        (running.fence, running.step, running.attempts)
    );

    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, JobStatus::Done, "{row:?}");
    let k = kinds(&env, job).await;
    assert_eq!(count(&k, "claimed"), 1, "{k:?}");
    assert_eq!(count(&k, "retried_now"), 0, "{k:?}");

    // A delayed job is not waiting to retry: reschedule it instead.
    let delayed = env
        .client()
        .enqueue_after::<Slow>("later", &Work { ms: 0 }, Duration::from_secs(3600))
        .await
        .unwrap()
        .job_id;
    let refused = env.client().retry_now(delayed).await.unwrap_err();
    assert!(
        matches!(
            refused,
            ClientError::CannotRetryNow {
                state: WrongState::Delayed,
                ..
            }
        ),
        "{refused:?}"
    );
    // The history checker wants every job finished.
    env.client().cancel(delayed, "test over").await.unwrap();
    env.check().await.unwrap().assert_clean();
}

/// A job delayed an hour, rescheduled to now, runs at once (its history says
/// so); one rescheduled later keeps waiting with its new `run_at`.
#[tenure::test(ttl_secs = 3)]
async fn a_delayed_job_rescheduled_to_now_runs(env: TestEnv) {
    let _w = worker(&env).await;
    let hour = Duration::from_secs(3600);
    let enqueue = |key: &'static str| {
        let client = env.client().clone();
        async move {
            client
                .enqueue_after::<Slow>(key, &Work { ms: 0 }, hour)
                .await
                .unwrap()
                .job_id
        }
    };
    let soon = enqueue("soon").await;
    let later = enqueue("later").await;
    env.client()
        .reschedule(soon, chrono::Utc::now())
        .await
        .unwrap();
    let row = env
        .run_until_done(soon, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(row.status, JobStatus::Done, "{row:?}");
    let k = kinds(&env, soon).await;
    assert_eq!(count(&k, "rescheduled"), 1, "{k:?}");
    assert_eq!(count(&k, "claimed"), 1, "{k:?}");

    let at = chrono::Utc::now() + chrono::Duration::hours(2);
    env.client().reschedule(later, at).await.unwrap();
    let row = env.client().store().job(later).await.unwrap().unwrap();
    assert!(
        row.awaiting_publish && row.status == JobStatus::Pending,
        "{row:?}"
    );
    let moved = row.run_at.unwrap();
    assert!((moved - at).num_milliseconds().abs() < 5, "{moved} vs {at}");

    // Further ahead than `Config::max_delay`: refused, nothing changed.
    let far = chrono::Utc::now() + chrono::Duration::days(3650);
    let refused = env.client().reschedule(later, far).await.unwrap_err();
    assert!(
        matches!(refused, ClientError::DelayTooLong { .. }),
        "{refused:?}"
    );
    let same = env.client().store().job(later).await.unwrap().unwrap();
    assert_eq!(same.run_at, row.run_at);
    env.client().cancel(later, "test over").await.unwrap();
    env.check().await.unwrap().assert_clean();
}

/// Reschedule of a job whose message is out (published), running or done is
/// refused and changes nothing.
#[tenure::test(ttl_secs = 3)]
async fn reschedule_refuses_a_running_or_published_job(env: TestEnv) {
    let in_an_hour = chrono::Utc::now() + chrono::Duration::hours(1);
    // No worker yet: the job is published and waits in the stream.
    let queued = enqueued::<Slow>(&env, "queued", 2_000).await;
    assert_eq!(
        reschedule_refused(&env, queued, in_an_hour).await,
        WrongState::Published
    );
    let _w = worker(&env).await;
    until_row(&env, queued, |r| r.status == JobStatus::Running).await;
    let before = kinds(&env, queued).await;
    assert_eq!(
        reschedule_refused(&env, queued, in_an_hour).await,
        WrongState::Running
    );
    assert_eq!(kinds(&env, queued).await, before);
    let row = env.run_until_done(queued, WAIT).await.unwrap();
    assert_eq!(row.status, JobStatus::Done);
    assert_eq!(row.run_at, None, "{row:?}");
    assert_eq!(
        reschedule_refused(&env, queued, in_an_hour).await,
        WrongState::Done
    );
    env.check().await.unwrap().assert_clean();
}
