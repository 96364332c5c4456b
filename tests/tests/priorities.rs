//! Priorities (issue 35, item 5), against the real servers: a backlog of
//! 1,000 `low` jobs, then 50 `high` ones. The worker takes high first, four
//! of every five deliveries while both levels wait (high : low = 4 : 1,
//! `runtime/levels.rs`), so the highs start ahead of most of the lows still
//! waiting, and lows keep starting while the highs run (no starvation).
#![cfg(feature = "harness")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tenure::blocks::queue::QueueNames;
use tenure::testing::TestEnv;
use tenure::{Config, EnqueueOptions, JobId, JobStatus, Priority, StepCtx, StepError, Worker};
use tenure_tests::{all_done, wait_until};

const WAIT: Duration = Duration::from_secs(300);
const LOWS: usize = 1000;
const HIGHS: usize = 50;
/// Lows started before the highs are enqueued.
const HEAD_START: usize = 50;

/// When each job's step started, and which job it was.
static STARTS: Mutex<Vec<(Instant, JobId)>> = Mutex::new(Vec::new());

/// A one-step job that notes its start and takes a few milliseconds.
struct Ranked;

#[tenure::job(name = "test.ranked")]
impl Ranked {
    #[step]
    async fn note(&self, ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        STARTS.lock().unwrap().push((Instant::now(), ctx.job_id()));
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(n)
    }
}

/// The first start of each of `ids`' jobs.
fn first_starts(ids: &[JobId]) -> Vec<(Instant, JobId)> {
    let mut starts = STARTS.lock().unwrap().clone();
    starts.retain(|s| ids.contains(&s.1));
    starts.sort_unstable_by_key(|s| s.0);
    let mut seen = std::collections::HashSet::new();
    starts.retain(|s| seen.insert(s.1));
    starts
}

/// Enqueues `n` jobs at `priority` in batches of 100 (keys of the test's
/// own: the jobs' starts are noted in one list for every test).
async fn enqueue(env: &TestEnv, prefix: &str, n: usize, priority: Priority) -> Vec<JobId> {
    let options = EnqueueOptions::default().priority(priority);
    let mut ids = Vec::with_capacity(n);
    let schema = env.schema();
    let key = |i| (format!("{schema}-{prefix}-{i}"), i as u32);
    let items: Vec<(String, u32)> = (0..n).map(key).collect();
    for chunk in items.chunks(100) {
        let results = env.client().enqueue_many_with::<Ranked>(chunk, options);
        for r in results.await.unwrap() {
            ids.push(r.unwrap().job_id);
        }
    }
    ids
}

/// Room for two running jobs and two locked ahead, so a backlog builds.
async fn worker(env: &TestEnv) -> Worker {
    env.worker("w0", |mut cfg: Config| async move {
        cfg.max_in_flight = 2;
        cfg.prefetch = 2;
        Worker::builder(cfg).register(Ranked)
    })
    .await
    .unwrap()
}

/// The test: 1,000 lows, then (once 50 have started) 50 highs.
/// Every high starts before most of the lows still waiting when the highs
/// were enqueued (at most a quarter of those, for the time the worker takes
/// to see the highs and the 1-in-5 share of low), and lows start between
/// the first and the last high (no starvation); every job is done once.
async fn highs_overtake_a_backlog_of_lows(env: TestEnv) {
    tenure_tests::init_logs();
    let w = worker(&env).await;
    let lows = enqueue(&env, "low", LOWS, Priority::Low).await;
    let head_start = wait_until(WAIT, || async { first_starts(&lows).len() >= HEAD_START });
    assert!(head_start.await, "the lows did not start");
    let highs = enqueue(&env, "high", HIGHS, Priority::High).await;
    let cut = Instant::now();
    let mut all = lows.clone();
    all.extend(&highs);
    let started = wait_until(WAIT, || async { first_starts(&all).len() == all.len() });
    assert!(started.await, "not every job started");
    assert!(
        all_done(env.client(), &all, WAIT).await,
        "not every job is done"
    );

    let high_starts = first_starts(&highs);
    let (first_high, last_high) = (high_starts[0].0, high_starts[HIGHS - 1].0);
    let waiting: Vec<Instant> = first_starts(&lows)
        .into_iter()
        .map(|s| s.0)
        .filter(|t| *t > cut)
        .collect();
    let overtaken = waiting.iter().filter(|t| **t > last_high).count();
    let during = waiting
        .iter()
        .filter(|t| **t > first_high && **t < last_high)
        .count();
    eprintln!(
        "lows waiting at the highs' enqueue: {}; started before the last high: {}; \
         between the first and the last high: {during}; the highs took {:?}",
        waiting.len(),
        waiting.len() - overtaken,
        last_high - first_high,
    );
    assert!(
        waiting.len() >= LOWS / 2,
        "the backlog ran out: {}",
        waiting.len()
    );
    assert!(
        overtaken * 4 >= waiting.len() * 3,
        "the highs overtook {overtaken} of {} waiting lows",
        waiting.len()
    );
    assert!(during >= 1, "no low started while the highs ran: starved");
    for id in &all {
        let row = env.client().job(*id).await.unwrap().unwrap();
        assert_eq!((row.status, row.attempts), (JobStatus::Done, 0), "{row:?}");
    }
    env.check().await.unwrap().assert_clean();
    w.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 3)]
async fn high_jobs_overtake_a_backlog_of_low_ones(env: TestEnv) {
    highs_overtake_a_backlog_of_lows(env).await;
}

#[tenure::test(ttl_secs = 3, partitions = 4)]
async fn high_jobs_overtake_a_backlog_of_low_ones_in_partition_mode(env: TestEnv) {
    highs_overtake_a_backlog_of_lows(env).await;
}

/// A type no worker of these tests runs: its messages stay in the stream.
const UNSERVED: &str = "test.unserved";

/// The `Nats-Msg-Id` of the last message on job `id`'s subject at `level`.
async fn last_msg_id(env: &TestEnv, id: JobId, level: Priority) -> Option<String> {
    let subject = env
        .client()
        .queue()
        .job_subject_with_priority(UNSERVED, id, level);
    let nats = async_nats::connect(env.stack().nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let stream = QueueNames::new(env.namespace()).stream;
    let stream = js.get_stream(stream).await.unwrap();
    let last = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .ok()?;
    last.headers.get("Nats-Msg-Id").map(ToString::to_string)
}

/// The level is the job's, not only its first message's (the row records
/// it): the scheduler leader publishes a delayed high job on the high
/// subject, and a redrive of a low job goes to the low subject.
async fn later_messages_keep_the_level(env: TestEnv) {
    tenure_tests::init_logs();
    // The scheduler leader; it does not run `UNSERVED`.
    let w = worker(&env).await;
    let client = env.client();
    let soon = chrono::Utc::now() + chrono::Duration::seconds(1);
    let high = EnqueueOptions::default()
        .priority(Priority::High)
        .run_at(soon);
    let input = serde_json::json!({});
    let enqueue = client.enqueue_json_with(UNSERVED, "delayed", input.clone(), high);
    let delayed = enqueue.await.unwrap().job_id;
    let low = EnqueueOptions::default().priority(Priority::Low);
    let enqueue = client.enqueue_json_with(UNSERVED, "redriven", input, low);
    let redriven = enqueue.await.unwrap().job_id;
    assert_eq!(client.redrive(redriven).await.unwrap(), 1);
    let published = wait_until(WAIT, || async {
        let row = client.job(delayed).await.unwrap().unwrap();
        !row.awaiting_publish
    });
    assert!(
        published.await,
        "the leader did not publish the delayed job"
    );

    let rows = (client.job(delayed).await, client.job(redriven).await);
    let levels = (
        rows.0.unwrap().unwrap().priority,
        rows.1.unwrap().unwrap().priority,
    );
    assert_eq!(levels, (Priority::High, Priority::Low), "the rows' levels");
    let on_high = last_msg_id(&env, delayed, Priority::High).await;
    assert_eq!(
        on_high,
        Some(delayed.to_string()),
        "the delayed job's message"
    );
    let on_low = last_msg_id(&env, redriven, Priority::Low).await;
    let on_low = on_low.expect("no message on the low subject");
    assert!(
        on_low.starts_with(&format!("{redriven}/redrive/")),
        "{on_low}"
    );
    w.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 3)]
async fn later_messages_of_a_job_keep_its_level(env: TestEnv) {
    later_messages_keep_the_level(env).await;
}

#[tenure::test(ttl_secs = 3, partitions = 4)]
async fn later_messages_of_a_job_keep_its_level_in_partition_mode(env: TestEnv) {
    later_messages_keep_the_level(env).await;
}
