//! Pausing, resuming and triggering a cron schedule (issue 35, item 7)
//! against the dev stack: a paused per-second schedule enqueues no tick while
//! paused (counted in the rows) and goes on after resume without running the
//! ticks it missed; the advance function refuses a leader's ticks for a
//! paused schedule in their own transaction; a trigger runs one job now, and
//! the same trigger id again is the same job; an unknown schedule is a typed
//! error that writes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chrono::{DateTime, Utc};
use tenure::blocks::fence::{FenceError, TickBatch};
use tenure::testing::TestEnv;
use tenure::{Client, ClientError, FencingToken, MissedTicks, Schedule, Worker};
use tenure_tests::{ThreeStep, done_within, on_kit, wait_until, work};

/// The run times of schedule `n`'s tick rows (input `n`), oldest first.
async fn tick_times(client: &Client, ns: &str, n: u64) -> Vec<DateTime<Utc>> {
    let sql = format!(
        "SELECT coalesce(run_at, created_at) AS t FROM {ns}.jobs WHERE input->>'n' = '{n}' ORDER BY t"
    );
    sqlx::query_scalar(&sql)
        .fetch_all(client.store().pool())
        .await
        .unwrap()
}

/// How many job rows the schema holds.
async fn jobs(client: &Client, ns: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {ns}.jobs");
    sqlx::query_scalar(&sql)
        .fetch_one(client.store().pool())
        .await
        .unwrap()
}

async fn worker_with(cfg: &tenure::Config, ns: &str, schedule: Schedule, n: u64) -> Worker {
    Worker::builder(cfg.clone().with_worker_id("w0"))
        .register(ThreeStep {
            worker: "w0".into(),
            schema: ns.to_string(),
        })
        .schedule_with::<ThreeStep>(schedule, &work(n))
        .start()
        .await
        .expect("worker")
}

#[tenure::test(ttl_secs = 3)]
async fn a_paused_schedule_enqueues_no_tick_and_resumes_without_the_missed_ones(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    // Catch-up: without the pause's own rule, a resume would run the ticks
    // it missed (they are younger than `missed_tick_after`).
    let every = Schedule::new("every", "* * * * * *").missed(MissedTicks::CatchUp { max: 1000 });
    let w = worker_with(&cfg, &ns, every, 7).await;
    let ticking = wait_until(Duration::from_secs(15), || async {
        tick_times(&client, &ns, 7).await.len() >= 2
    })
    .await;
    assert!(ticking, "the schedule ticks before the pause");

    assert!(client.pause_schedule("every").await.unwrap(), "paused");
    let paused_at = Utc::now();
    let at_pause = tick_times(&client, &ns, 7).await.len();
    assert!(!client.pause_schedule("every").await.unwrap(), "twice");
    let row = schedule_row(&client, "every").await;
    assert!(row.paused_at.is_some(), "{row:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let while_paused = tick_times(&client, &ns, 7).await;
    assert_eq!(
        while_paused.len(),
        at_pause,
        "no tick enqueued after the pause committed: {while_paused:?}"
    );
    let skipped = schedule_row(&client, "every").await.skipped;
    assert!(skipped >= 3, "the paused ticks count as skipped: {skipped}");

    assert!(client.resume_schedule("every").await.unwrap(), "resumed");
    let resumed_at = Utc::now();
    assert!(!client.resume_schedule("every").await.unwrap(), "twice");
    assert!(schedule_row(&client, "every").await.paused_at.is_none());
    let goes_on = wait_until(Duration::from_secs(10), || async {
        tick_times(&client, &ns, 7).await.len() >= at_pause + 2
    })
    .await;
    assert!(goes_on, "ticks again after the resume");
    w.shutdown().await.unwrap();
    let ticks = tick_times(&client, &ns, 7).await;
    let in_pause: Vec<_> = ticks
        .iter()
        .filter(|t| **t > paused_at && **t < resumed_at - chrono::Duration::milliseconds(100))
        .collect();
    assert!(
        in_pause.is_empty(),
        "ticks of the pause ran after the resume: {in_pause:?} (paused {paused_at}, resumed {resumed_at})"
    );
}

async fn schedule_row(client: &Client, name: &str) -> tenure::blocks::fence::ScheduleRow {
    let rows = client.store().schedules().await.unwrap();
    rows.into_iter().find(|r| r.name == name).expect("the row")
}

/// The fence itself: a leader whose look at the schedule came before the
/// pause has its ticks refused by the advance function, in the transaction
/// that inserted them; the same leader's skip of a paused schedule (no
/// ticks) is accepted.
#[tenure::test(ttl_secs = 3)]
async fn the_advance_refuses_ticks_of_a_paused_schedule_in_their_transaction(env: TestEnv) {
    let (ns, _cfg, client) = on_kit(&env).await;
    let store = client.store();
    let token = FencingToken::for_tests(10);
    store.claim_leader("scheduler", token, "me").await.unwrap();
    sqlx::query(&format!(
        "SELECT {ns}.tenure_define_schedule('s', 'test.three_step', '* * * * * *', 'UTC', \
         'skip', '{{}}')"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    assert!(client.pause_schedule("s").await.unwrap());
    let tick = Utc::now();
    let input = serde_json::json!({"n": 0});
    let ticks = [tick];
    let batch = tenure_tests::tick_batch(&input, &ticks);
    let refused = store.enqueue_ticks("scheduler", token, &batch).await;
    assert!(
        matches!(refused, Err(FenceError::SchedulePaused { .. })),
        "{refused:?}"
    );
    assert_eq!(
        jobs(&client, &ns).await,
        0,
        "the refused tick's row is gone"
    );
    let skip = TickBatch {
        ticks: &[],
        skipped: 1,
        ..batch.clone()
    };
    assert_eq!(
        store
            .enqueue_ticks("scheduler", token, &skip)
            .await
            .unwrap(),
        0
    );
    assert_eq!(schedule_row(&client, "s").await.skipped, 1);
    assert!(client.resume_schedule("s").await.unwrap());
    let later = tick + chrono::Duration::seconds(1);
    let next = TickBatch {
        ticks: &[later],
        last_tick: later,
        ..batch
    };
    assert_eq!(
        store
            .enqueue_ticks("scheduler", token, &next)
            .await
            .unwrap(),
        1
    );
}

#[tenure::test(ttl_secs = 3)]
async fn a_trigger_runs_one_job_now_and_the_same_trigger_again_is_that_job(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    // Daily at 03:00: no tick of its own comes during the test.
    let w = worker_with(&cfg, &ns, Schedule::new("nightly", "0 0 3 * * *"), 9).await;
    let defined = wait_until(Duration::from_secs(10), || async {
        client.store().schedules().await.unwrap().len() == 1
    })
    .await;
    assert!(defined);

    let first = client.trigger_schedule("nightly", "click-1").await.unwrap();
    assert!(!first.duplicate);
    let again = client.trigger_schedule("nightly", "click-1").await.unwrap();
    assert!(again.duplicate, "a double click is one job");
    assert_eq!(again.job_id, first.job_id);
    assert!(done_within(&client, first.job_id, Duration::from_secs(15)).await);
    let row = client.job(first.job_id).await.unwrap().unwrap();
    assert_eq!(row.job_type, "test.three_step");
    assert_eq!(row.input, serde_json::to_value(work(9)).unwrap());
    assert_eq!(tick_times(&client, &ns, 9).await.len(), 1);

    // A paused schedule is triggered all the same: the pause stops its
    // clock, not an operator.
    assert!(client.pause_schedule("nightly").await.unwrap());
    let second = client.trigger_schedule("nightly", "click-2").await.unwrap();
    assert!(!second.duplicate && second.job_id != first.job_id);
    assert!(done_within(&client, second.job_id, Duration::from_secs(15)).await);
    w.shutdown().await.unwrap();

    let before = jobs(&client, &ns).await;
    for unknown in [
        client.pause_schedule("nope").await.map(|_| ()),
        client.resume_schedule("nope").await.map(|_| ()),
        client.trigger_schedule("nope", "click-3").await.map(|_| ()),
    ] {
        assert!(
            matches!(&unknown, Err(ClientError::UnknownSchedule(n)) if n == "nope"),
            "{unknown:?}"
        );
    }
    let bad_id = client.trigger_schedule("nightly", "").await;
    assert!(
        matches!(bad_id, Err(ClientError::InvalidTriggerId(_))),
        "{bad_id:?}"
    );
    assert_eq!(jobs(&client, &ns).await, before, "nothing written");
}
