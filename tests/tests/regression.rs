//! Issue 15, item 1, end to end: a worker whose fresh job lock carries the same
//! etcd revision an earlier owner already claimed (what a snapshot restore without
//! `--bump-revision` produces) must raise the alarm and hand the job back, never
//! run it. The test has an etcd cluster of its own, so it can tell in advance which
//! revision the worker's lock will get: the one after the last write it made.
//! (Before the fix the worker took the equal token as its own and ran all three
//! steps under it.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tenure::Worker;
use tenure::blocks::lease::{Acquire, Session};
use tenure::testing::TestEnv;
use tenure::{JobId, StepIndex};
use tenure_tests::metered::Metered;
use tenure_tests::{ThreeStep, Work, done_within, on_kit, step_rows};

// A dev stack of its own: the test tells which revision the worker's lock gets.
#[tenure::test(own_stack, ttl_secs = 4)]
async fn a_fresh_lock_with_an_already_claimed_revision_is_never_run(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let metered = Metered::default();
    let worker = Worker::builder(cfg.clone().with_worker_id("w"))
        .meter(metered.meter())
        .register(ThreeStep {
            worker: "w".into(),
            schema: ns.clone(),
        })
        .start()
        .await
        .expect("worker");

    // The last write to this etcd: a probe lock. The worker's lock for the job is
    // the next write, so its token is `probe + 1`.
    let probe = Session::establish(&cfg.clone().with_worker_id("probe"))
        .await
        .unwrap();
    let Acquire::Acquired(lock) = probe.acquire(JobId::from_key("probe", "x")).await.unwrap()
    else {
        panic!("the probe lock is free");
    };
    let next = lock.token().get() + 1;

    // An earlier owner claimed revision `next` (before etcd was restored) and still
    // runs the job: its row says so.
    let input = serde_json::to_value(Work::default()).unwrap();
    let id = JobId::from_key("test.three_step", "regressed");
    client
        .store()
        .insert_job(id, "test.three_step", &input)
        .await
        .unwrap();
    sqlx::query(&format!(
        "UPDATE {ns}.jobs SET fence = $2, status = 'running' WHERE id = $1"
    ))
    .bind(id.as_uuid())
    .bind(next)
    .execute(client.store().pool())
    .await
    .unwrap();
    client
        .enqueue::<ThreeStep>("regressed", &Work::default())
        .await
        .unwrap();

    // The alarm fires, the job is handed back, and the next acquisition (a later
    // revision) takes it over: no step ever runs under the regressed token.
    let done = done_within(&client, id, Duration::from_secs(30)).await;
    let steps = step_rows(&env, "step_log", id).await;
    let tokens: Vec<i64> = steps.into_iter().map(|(_, token)| token).collect();
    assert!(
        tokens.iter().all(|t| *t > next),
        "a second owner with the regressed token {next} ran the job: steps logged under {tokens:?}"
    );
    assert!(
        done,
        "the job is taken over under a later revision and finishes"
    );
    let row = client.job(id).await.unwrap().unwrap();
    assert!(row.fence > next && row.step == StepIndex::new(3));
    assert_eq!(tokens.len(), 3);
    assert!(
        metered.counted("tenure.fence.token_regressions") >= 1,
        "tenure.fence.token_regressions counted the alarm"
    );
    worker.shutdown().await.unwrap();
}
