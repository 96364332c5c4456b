//! The rate limit per job type (issue 35, item 4), against the real servers:
//! `JobLimits::rate(n, per)` is a token bucket per worker (burst `n`, refilled
//! at `n` per `per`); a throttled type's messages stay in the stream.
#![cfg(feature = "harness")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tenure::testing::TestEnv;
use tenure::{JobId, JobLimits, JobStatus, StepCtx, StepError};
use tenure_tests::metered::Metered as Readings;

const WAIT: Duration = Duration::from_secs(120);
const JOBS: usize = 30;
/// The bucket: a burst of `BURST`, refilled at `BURST` per second.
const BURST: u32 = 5;

/// When each job's step started, and which job it was.
static STARTS: Mutex<Vec<(Instant, JobId)>> = Mutex::new(Vec::new());

/// A one-step job that notes its start.
struct Metered;

#[tenure::job(name = "test.metered")]
impl Metered {
    #[step]
    async fn note(&self, ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        STARTS.lock().unwrap().push((Instant::now(), ctx.job_id()));
        Ok(n)
    }
}

/// The starts of `ids`' steps, in order (other tests run jobs too).
fn starts_of(ids: &[JobId]) -> Vec<(Instant, JobId)> {
    let mut starts = STARTS.lock().unwrap().clone();
    starts.retain(|s| ids.contains(&s.1));
    starts.sort_unstable_by_key(|s| s.0);
    starts
}

/// The most starts in any stretch, beyond what a full bucket allows: for
/// every pair of starts `i <= j`, `j - i + 1 - (BURST + BURST * span)`
/// (`span` in seconds). A bucket that is obeyed keeps this at or below 0,
/// plus the jitter between a token's take and its step's start.
fn excess(starts: &[Instant]) -> f64 {
    let mut worst = f64::MIN;
    for i in 0..starts.len() {
        for j in i..starts.len() {
            let span = (starts[j] - starts[i]).as_secs_f64();
            let allowed = f64::from(BURST) * (1.0 + span);
            worst = worst.max((j - i + 1) as f64 - allowed);
        }
    }
    worst
}

/// One worker, a type limited to 5 per second, 30 jobs: the starts obey the
/// bucket (in any 1 s window at most 5 + 5, the burst and one period's
/// refill, + 1 for jitter), the run lasts at least (30 - 5) / 5 s, every job
/// is done after one attempt, every message was delivered once, and the
/// throttled rounds were counted.
#[tenure::test(ttl_secs = 3)]
async fn a_rate_limited_type_starts_no_faster_than_its_bucket(env: TestEnv) {
    tenure_tests::init_logs();
    let limits = JobLimits::default().rate(BURST, Duration::from_secs(1));
    let readings = Readings::default();
    let meter = readings.meter();
    let w = env
        .worker("w0", |cfg| async move {
            tenure::Worker::builder(cfg)
                .meter(meter)
                .register_with(Metered, limits)
        })
        .await
        .unwrap();
    let began = Instant::now();
    let mut ids = Vec::new();
    for n in 0..JOBS {
        let key = format!("metered-{n}");
        let enqueued = env.client().enqueue::<Metered>(&key, &(n as u32)).await;
        ids.push(enqueued.unwrap().job_id);
    }
    for id in &ids {
        let row = env.run_until_done(*id, WAIT).await.unwrap();
        assert_eq!((row.status, row.attempts), (JobStatus::Done, 0), "{row:?}");
    }
    let took = began.elapsed();

    let starts = starts_of(&ids);
    let mut jobs: Vec<JobId> = starts.iter().map(|s| s.1).collect();
    jobs.sort_unstable();
    jobs.dedup();
    assert_eq!((starts.len(), jobs.len()), (JOBS, JOBS), "a step ran twice");
    let times: Vec<Instant> = starts.iter().map(|s| s.0).collect();
    let first = times[0];
    let offsets: Vec<u128> = times.iter().map(|t| (*t - first).as_millis()).collect();
    let excess = excess(&times);
    assert!(
        excess <= 1.0,
        "{excess} more starts than the bucket allows; starts (ms): {offsets:?}"
    );
    let least = Duration::from_secs_f64((JOBS as f64 - f64::from(BURST)) / f64::from(BURST));
    assert!(
        took >= least,
        "30 jobs in {took:?}, under {least:?}; starts (ms): {offsets:?}"
    );
    assert!(
        env.client()
            .queue()
            .dead_letters(10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        readings.counted("tenure.fetch.throttled") > 0,
        "no throttled round counted"
    );
    let (delivered, messages) = tenure_tests::consumer_deliveries(&env, "test.metered").await;
    assert_eq!(
        (delivered, messages),
        (JOBS as u64, JOBS as u64),
        "redelivered"
    );
    env.check().await.unwrap().assert_clean();
    w.shutdown().await.unwrap();
}

/// `rate(0, _)` and a zero period are refused before anything connects.
#[tenure::test(ttl_secs = 3)]
async fn a_rate_of_zero_is_refused_at_start(env: TestEnv) {
    let per = Duration::from_secs(1);
    for limits in [
        JobLimits::default().rate(0, per),
        JobLimits::default().rate(BURST, Duration::ZERO),
    ] {
        let refused = tenure::Worker::builder(env.config().clone())
            .register_with(Metered, limits)
            .start()
            .await;
        assert!(
            matches!(refused, Err(tenure::WorkerError::BadRate("test.metered"))),
            "{refused:?}"
        );
    }
}

/// Partition mode, 8 partitions led by one worker and a bucket 2 deep: the
/// few tokens of each round reach every partition in turn (a share of the
/// room that always went to the first partitions would leave the jobs of the
/// others in the stream for ever). Every job ends done after one attempt.
#[tenure::test(ttl_secs = 3, partitions = 8)]
async fn a_few_tokens_reach_every_partition_in_turn(env: TestEnv) {
    const JOBS: usize = 16;
    let limits = JobLimits::default().rate(2, Duration::from_millis(250));
    let w = env
        .worker("w0", |cfg| async move {
            tenure::Worker::builder(cfg).register_with(Metered, limits)
        })
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..JOBS {
        let key = format!("parted-{n}");
        let enqueued = env.client().enqueue::<Metered>(&key, &(n as u32)).await;
        ids.push(enqueued.unwrap().job_id);
    }
    let partitions: std::collections::BTreeSet<u32> =
        ids.iter().map(|id| id.partition(8)).collect();
    assert!(partitions.len() > 2, "the jobs fell in {partitions:?}");
    for id in &ids {
        let row = env.run_until_done(*id, WAIT).await.unwrap();
        assert_eq!((row.status, row.attempts), (JobStatus::Done, 0), "{row:?}");
    }
    assert_eq!(starts_of(&ids).len(), JOBS, "a step ran twice");
    env.check().await.unwrap().assert_clean();
    w.shutdown().await.unwrap();
}
