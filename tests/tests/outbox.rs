//! Transactional enqueue (the outbox), batch enqueue and retention against
//! the dev stack: a rolled-back transaction leaves no job and no message; a
//! committed one runs once, soon; a scheduler leader killed between the commit
//! and the publish is replaced and the job still runs once; a batch reports
//! each item (duplicates inside it and against existing rows, an invalid
//! item alone, all-or-nothing); retention deletes old finished rows in
//! batches and keeps dead ones by default.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use chrono::Utc;
use serde::{Deserialize, Serialize};
use tenure::blocks::fence::{FenceError, JobStatus};
use tenure::testing::TestEnv;
use tenure::{BatchError, Client, ClientError, EnqueueItemError, JobId, StepCtx, StepError};
use tenure_tests::{
    ThreeStep, Work, claimed_at, count_status, double_commits, on_kit, steps_logged, wait_until,
};

use tenure_tests::{scheduler_leader as leader, work};

async fn is_done(client: &Client, id: JobId) -> bool {
    matches!(client.job(id).await, Ok(Some(r)) if r.status == JobStatus::Done)
}

async fn all_done(client: &Client, ids: &[JobId]) -> bool {
    for id in ids {
        if !is_done(client, *id).await {
            return false;
        }
    }
    true
}

/// A worker running `ThreeStep`, once it leads the scheduler.
async fn leading_worker(cfg: &tenure::Config, ns: &str, client: &Client) -> tenure::Worker {
    let w = tenure_tests::three_step_worker(cfg, ns, "w0").await;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            leader(client).await.is_some()
        })
        .await,
        "the worker leads the scheduler"
    );
    w
}

#[tenure::test]
async fn a_rolled_back_transaction_leaves_no_job_and_no_message(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let w = leading_worker(&cfg, &ns, &client).await;
    let pool = client.store().pool().clone();
    let mut tx = pool.begin().await.unwrap();
    let e = client
        .enqueue_in::<ThreeStep>(&mut tx, "rolled-back", &work(1))
        .await
        .expect("enqueue_in");
    assert!(!e.duplicate);
    // Visible inside the transaction only.
    let inside: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {ns}.jobs WHERE id = $1"))
        .bind(e.job_id.as_uuid())
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(inside, 1);
    tx.rollback().await.unwrap();
    // Two polls of the leader and more: nothing to publish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(client.job(e.job_id).await.unwrap().is_none(), "no job row");
    let stats = client.queue().stats().await.expect("stats");
    assert_eq!(stats.work_messages, 0, "no message");
    assert!(claimed_at(&client, e.job_id).await.is_none());
    w.shutdown().await.unwrap();
}

#[tenure::test]
async fn a_committed_transaction_runs_its_job_once_soon_whatever_the_search_path(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let w = leading_worker(&cfg, &ns, &client).await;
    let pool = client.store().pool().clone();
    sqlx::query(&format!("CREATE TABLE {ns}.orders (id int PRIMARY KEY)"))
        .execute(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    // The client qualifies its tables with Config::schema: the caller's
    // search_path does not matter.
    sqlx::query("SET LOCAL search_path TO public")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(&format!("INSERT INTO {ns}.orders (id) VALUES (1)"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let e = client
        .enqueue_in::<ThreeStep>(&mut tx, "order-1", &work(1))
        .await
        .expect("enqueue_in");
    assert!(!e.duplicate);
    // A duplicate and a conflicting key inside the same transaction: typed
    // answers, and the transaction stays usable.
    let again = client
        .enqueue_in::<ThreeStep>(&mut tx, "order-1", &work(1))
        .await
        .unwrap();
    assert_eq!((again.job_id, again.duplicate), (e.job_id, true));
    let conflict = client
        .enqueue_in::<ThreeStep>(&mut tx, "order-1", &work(2))
        .await;
    assert!(
        matches!(
            conflict,
            Err(ClientError::Fence(FenceError::PayloadConflict { .. }))
        ),
        "{conflict:?}"
    );
    // Not published before the commit.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(client.job(e.job_id).await.unwrap().is_none());
    tx.commit().await.unwrap();
    let committed = Utc::now();
    let started = Instant::now();
    assert!(
        wait_until(Duration::from_secs(30), || async {
            is_done(&client, e.job_id).await
        })
        .await,
        "the committed job ran"
    );
    let claimed = claimed_at(&client, e.job_id).await.expect("claimed");
    let latency = (claimed - committed).to_std().unwrap_or_default();
    eprintln!(
        "commit -> first claim: {latency:?} (commit -> done: {:?})",
        started.elapsed()
    );
    assert!(
        latency < Duration::from_secs(5),
        "started {latency:?} after the commit"
    );
    assert_eq!(steps_logged(&client, e.job_id).await, 3);
    assert_eq!(double_commits(&pool, &ns).await, 0);
    w.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 5, worker = tenure_tests::test_worker)]
async fn the_leader_killed_between_commit_and_publish_is_replaced_and_the_job_runs_once(
    env: TestEnv,
) {
    let (ns, _cfg, client) = on_kit(&env).await;
    let mut workers = tenure_tests::worker_processes(&env, &["w0", "w1", "w2"]).await;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            leader(&client).await.is_some()
        })
        .await
    );
    let (first, first_token) = leader(&client).await.unwrap();
    let at = workers
        .iter()
        .position(|(id, _)| *id == first)
        .expect("leader is ours");
    let (_, killed) = workers.remove(at);
    // The leader stops (before it can publish), the caller commits, then
    // the leader dies.
    killed.pause();
    let pool = client.store().pool().clone();
    let mut tx = pool.begin().await.unwrap();
    let e = client
        .enqueue_in::<ThreeStep>(&mut tx, "while-the-leader-sleeps", &work(7))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let row = client.job(e.job_id).await.unwrap().expect("committed row");
    assert!(
        row.awaiting_publish,
        "not published while the leader is stopped"
    );
    killed.kill();
    assert!(
        wait_until(Duration::from_secs(30), || async {
            is_done(&client, e.job_id).await
        })
        .await,
        "the job ran after the leader died"
    );
    let (second, second_token) = leader(&client).await.unwrap();
    assert!(second != first && second_token > first_token);
    assert_eq!(steps_logged(&client, e.job_id).await, 3);
    assert_eq!(double_commits(&pool, &ns).await, 0);
    eprintln!("leader {first} killed; {second} published the committed job; it ran once");
}

#[tenure::test]
async fn enqueue_many_reports_each_duplicate_and_runs_every_new_job_once(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let existing = client
        .enqueue::<ThreeStep>("k-1", &work(1))
        .await
        .unwrap()
        .job_id;
    let items = [
        ("k-0", work(0)),
        ("k-1", work(1)), // exists, same input
        ("k-2", work(2)),
        ("k-0", work(0)), // earlier in the batch, same input
        ("k-1", work(5)), // exists, another input
        ("k-2", work(9)), // earlier in the batch, another input
        ("k-3", work(3)),
    ];
    let r = client.enqueue_many::<ThreeStep>(&items).await.unwrap();
    assert_eq!(r.len(), items.len());
    let id = |k: &str| JobId::from_key("test.three_step", k);
    let ok = |i: usize| r[i].as_ref().map(|e| (e.job_id, e.duplicate)).ok();
    assert_eq!(ok(0), Some((id("k-0"), false)));
    assert_eq!(ok(1), Some((existing, true)));
    assert_eq!(ok(2), Some((id("k-2"), false)));
    assert_eq!(ok(3), Some((id("k-0"), true)));
    assert!(
        matches!(r[4], Err(EnqueueItemError::PayloadConflict { job_id }) if job_id == existing)
    );
    assert!(
        matches!(r[5], Err(EnqueueItemError::PayloadConflict { job_id }) if job_id == id("k-2"))
    );
    assert_eq!(ok(6), Some((id("k-3"), false)));
    let w = tenure_tests::three_step_worker(&cfg, &ns, "w0").await;
    let ids = [id("k-0"), id("k-1"), id("k-2"), id("k-3")];
    assert!(
        wait_until(Duration::from_secs(30), || async {
            all_done(&client, &ids).await
        })
        .await
    );
    for id in ids {
        assert_eq!(steps_logged(&client, id).await, 3, "{id} ran once");
        let input = client.job(id).await.unwrap().unwrap().input;
        assert_ne!(input["n"], 9, "the first item of a key wins");
    }
    assert_eq!(double_commits(client.store().pool(), &ns).await, 0);
    w.shutdown().await.unwrap();
}

/// Input of [`Picky`]: refuses to serialise when `refuse` is set.
#[derive(Debug, Clone, Deserialize)]
struct PickyInput {
    n: u64,
    refuse: bool,
}

impl Serialize for PickyInput {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeStruct};
        if self.refuse {
            return Err(S::Error::custom("this input refuses to serialise"));
        }
        let mut st = s.serialize_struct("PickyInput", 2)?;
        st.serialize_field("n", &self.n)?;
        st.serialize_field("refuse", &self.refuse)?;
        st.end()
    }
}

struct Picky;

#[tenure::job(name = "test.picky")]
impl Picky {
    #[step]
    async fn only(&self, _ctx: &mut StepCtx, p: PickyInput) -> Result<u64, StepError> {
        Ok(p.n)
    }
}

fn picky(n: u64, refuse: bool) -> PickyInput {
    PickyInput { n, refuse }
}

#[tenure::test]
async fn an_invalid_item_fails_alone_and_all_or_nothing_enqueues_none(env: TestEnv) {
    let (_ns, _cfg, client) = on_kit(&env).await;
    let id = |k: &str| JobId::from_key("test.picky", k);
    let exists = |k: &'static str| {
        let client = client.clone();
        async move { client.job(id(k)).await.unwrap().is_some() }
    };
    let r = client
        .enqueue_many::<Picky>(&[
            ("a", picky(1, false)),
            ("bad", picky(2, true)),
            ("b", picky(3, false)),
        ])
        .await
        .unwrap();
    assert!(r[0].is_ok() && r[2].is_ok(), "{r:?}");
    assert!(matches!(r[1], Err(EnqueueItemError::Input { .. })), "{r:?}");
    assert!(exists("a").await && exists("b").await && !exists("bad").await);

    // All or nothing: an invalid item, then a conflicting one.
    let invalid = client
        .enqueue_many_all_or_nothing::<Picky>(&[("c", picky(4, false)), ("bad", picky(5, true))])
        .await;
    match invalid {
        Err(BatchError::Rejected { items }) => {
            assert!(matches!(items[0], EnqueueItemError::NotEnqueued));
            assert!(matches!(items[1], EnqueueItemError::Input { .. }));
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let conflict = client
        .enqueue_many_all_or_nothing::<Picky>(&[("d", picky(6, false)), ("a", picky(99, false))])
        .await;
    match conflict {
        Err(BatchError::Rejected { items }) => {
            assert!(matches!(items[0], EnqueueItemError::NotEnqueued));
            assert!(matches!(items[1], EnqueueItemError::PayloadConflict { .. }));
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(!exists("c").await && !exists("d").await, "nothing enqueued");
    let fine = client
        .enqueue_many_all_or_nothing::<Picky>(&[("c", picky(4, false)), ("a", picky(1, false))])
        .await
        .expect("all valid");
    assert_eq!(
        fine.iter().map(|e| e.duplicate).collect::<Vec<_>>(),
        [false, true]
    );
    assert!(exists("c").await);
    // Messages: a, b, c (the duplicate `a` of a live job is published again
    // and dropped by the broker's duplicate window).
    let stats = client.queue().stats().await.unwrap();
    assert_eq!(stats.work_messages, 3);
}

/// History events of `ids`.
async fn events_of(client: &Client, ids: &[JobId]) -> usize {
    let mut n = 0;
    for id in ids {
        n += client.store().job_events(*id).await.unwrap().len();
    }
    n
}

#[tenure::test]
async fn retention_deletes_old_done_and_cancelled_rows_and_keeps_dead_ones_by_default(
    env: TestEnv,
) {
    let (ns, mut cfg, client) = on_kit(&env).await;
    cfg.retention = tenure::config::Retention {
        done_after: Some(Duration::from_secs(1)),
        cancelled_after: Some(Duration::from_secs(1)),
        batch: 2,
        every: Duration::from_millis(200),
        ..tenure::config::Retention::default()
    };
    let mut done = Vec::new();
    for n in 0..5 {
        done.push(
            client
                .enqueue::<ThreeStep>(&format!("d-{n}"), &work(n))
                .await
                .unwrap()
                .job_id,
        );
    }
    let dies = Work {
        fail_times: u32::MAX,
        ..work(100)
    };
    let dead = client
        .enqueue::<ThreeStep>("dies", &dies)
        .await
        .unwrap()
        .job_id;
    let cancelled = client
        .enqueue_after::<ThreeStep>("never", &work(200), Duration::from_secs(3600))
        .await
        .unwrap()
        .job_id;
    client.cancel(cancelled, "retention test").await.unwrap();
    let w = tenure_tests::three_step_worker(&cfg, &ns, "w0").await;
    let mut gone = done.clone();
    gone.push(cancelled);
    assert!(
        wait_until(Duration::from_secs(40), || async {
            count_status(&client, JobStatus::Done).await == 0
                && count_status(&client, JobStatus::Cancelled).await == 0
                && count_status(&client, JobStatus::Dead).await == 1
        })
        .await,
        "done and cancelled rows pruned, the dead one kept"
    );
    // Dead stays past several prune rounds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        client.job(dead).await.unwrap().unwrap().status,
        JobStatus::Dead
    );
    assert_eq!(events_of(&client, &gone).await, 0, "their history went too");
    assert!(events_of(&client, &[dead]).await > 0);
    w.shutdown().await.unwrap();
}

#[tenure::test]
async fn an_operator_prune_deletes_in_batches_and_counts_first(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let w = tenure_tests::three_step_worker(&cfg, &ns, "w0").await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(
            client
                .enqueue::<ThreeStep>(&format!("p-{n}"), &work(n))
                .await
                .unwrap()
                .job_id,
        );
    }
    assert!(
        wait_until(Duration::from_secs(30), || async {
            all_done(&client, &ids).await
        })
        .await
    );
    w.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let store = client.store();
    let age = Duration::from_secs(1);
    assert_eq!(
        store
            .prunable(JobStatus::Done, Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.prunable(JobStatus::Done, age).await.unwrap(), 5);
    assert_eq!(
        count_status(&client, JobStatus::Done).await,
        5,
        "counting changes nothing"
    );
    let mut batches = Vec::new();
    loop {
        let n = store.prune_jobs(JobStatus::Done, age, 2).await.unwrap();
        batches.push(n);
        if n == 0 {
            break;
        }
    }
    assert_eq!(batches, [2, 2, 1, 0]);
    assert!(matches!(
        store.prune_jobs(JobStatus::Running, age, 2).await,
        Err(FenceError::NotFinished(JobStatus::Running))
    ));
}

#[test]
fn a_zero_retention_is_a_typed_configuration_error() {
    let mut cfg = tenure::Config::new("x");
    cfg.retention.done_after = Some(Duration::ZERO);
    assert!(matches!(
        cfg.validate(),
        Err(tenure::config::ConfigError::Invalid {
            name: "retention.done_after",
            ..
        })
    ));
    let mut cfg = tenure::Config::new("x");
    cfg.retention.dlq_max_age = Some(Duration::from_secs(10));
    assert!(matches!(
        cfg.validate(),
        Err(tenure::config::ConfigError::Invalid {
            name: "retention.dlq_max_age",
            ..
        })
    ));
}

/// The DLQ stream's `max_age` as the broker has it.
async fn dlq_max_age(cfg: &tenure::Config) -> Duration {
    let names = tenure::blocks::queue::QueueNames::new(&cfg.namespace);
    let js = async_nats::jetstream::new(async_nats::connect(&cfg.nats_url).await.unwrap());
    let mut s = js.get_stream(&names.dlq_stream).await.unwrap();
    s.info().await.unwrap().config.max_age
}

#[tenure::test]
async fn dlq_max_age_is_applied_to_an_existing_dlq_stream_by_a_worker(env: TestEnv) {
    let (ns, mut cfg, _client) = on_kit(&env).await;
    // The client created the streams: dead letters kept forever by default.
    assert_eq!(dlq_max_age(&cfg).await, Duration::ZERO);
    cfg.retention.dlq_max_age = Some(Duration::from_secs(7 * 24 * 3600));
    let w = tenure_tests::three_step_worker(&cfg, &ns, "w0").await;
    assert_eq!(dlq_max_age(&cfg).await, Duration::from_secs(7 * 24 * 3600));
    w.shutdown().await.unwrap();
}
