//! The runtime against the dev stack: many jobs on several workers, the seed's
//! paused-worker timeline, poison jobs, failing steps, quorum loss.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::blocks::fence::JobStatus;
use tenure::blocks::lease::{Acquire, Session};
use tenure::testing::{FaultPlan, TestEnv};
use tenure::{Cancelled, Client, Config, FencingToken, JobId, Priority, StepIndex};
use tenure::{Worker, WorkerObserver};
use tenure_tests::metered::cancellable_worker;
use tenure_tests::{
    CancelProbe, Cancellable, Hold, ThreeStep, Work, assert_dead_lettered, count_status,
    done_within, double_commits, events_of_kind, on_kit, slow_on, steps_logged, three_step_worker,
    wait_until, work,
};

#[tenure::test(ttl_secs = 5)]
async fn thousand_three_step_jobs_on_three_workers_commit_each_step_once(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;

    let mut workers = Vec::new();
    for i in 0..3 {
        let cfg = cfg.clone().with_worker_id(format!("w{i}"));
        let job = ThreeStep {
            worker: format!("w{i}"),
            schema: ns.clone(),
        };
        workers.push(
            Worker::builder(cfg)
                .register(job)
                .start()
                .await
                .expect("worker"),
        );
    }

    const N: u64 = 1000;
    let mut ids = Vec::new();
    for chunk in (0..N).collect::<Vec<_>>().chunks(100) {
        let futs = chunk.iter().map(|n| {
            let client = client.clone();
            async move {
                client
                    .enqueue::<ThreeStep>(&format!("job-{n}"), &work(*n))
                    .await
                    .expect("enqueue")
            }
        });
        ids.extend(futures::future::join_all(futs).await);
    }
    assert!(ids.iter().all(|e| !e.duplicate));

    let done = wait_until(Duration::from_secs(240), || async {
        count_status(&client, JobStatus::Done).await == N as i64
    })
    .await;
    let done_count = count_status(&client, JobStatus::Done).await;
    assert!(done, "only {done_count} of {N} jobs done");

    let pool = client.store().pool();
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {ns}.step_log"))
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(rows, 3 * N as i64, "every step committed exactly once");
    assert_eq!(double_commits(pool, &ns).await, 0);
    let per_job: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM (SELECT job_id FROM {ns}.step_log GROUP BY job_id
          HAVING count(DISTINCT step) = 3) j"
    ))
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(per_job, N as i64, "every job has all three steps");
    // Duplicate enqueue after completion: the row dedups, nothing runs again.
    let again = client
        .enqueue::<ThreeStep>("job-7", &work(7))
        .await
        .unwrap();
    assert!(again.duplicate);

    for w in workers {
        w.shutdown().await.expect("shutdown");
    }
}

#[derive(Default)]
struct Record {
    commits: Mutex<Vec<(JobId, StepIndex, FencingToken, tokio::time::Instant)>>,
    stale: Mutex<Vec<(JobId, StepIndex, FencingToken)>>,
}

impl WorkerObserver for Record {
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        self.commits
            .lock()
            .unwrap()
            .push((job_id, step, token, tokio::time::Instant::now()));
    }
    fn stale_rejected(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        self.stale.lock().unwrap().push((job_id, step, token));
    }
}

/// The seed's timeline: A (token t1) commits step 0 and stalls in step 1; it is
/// paused past its TTL; B takes over with t2 > t1, resumes at step 1 and
/// finishes; A wakes, tries to write under t1 and is refused.
#[tenure::test(ttl_secs = 2, worker = tenure_tests::test_worker)]
async fn paused_worker_is_fenced_out_after_takeover(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let a = env.worker_process("A", FaultPlan::new()).await.unwrap();

    let work = Work {
        n: 1,
        ..slow_on("A", 1, 8000)
    };
    let job_id = client
        .enqueue::<ThreeStep>("seed-timeline", &work)
        .await
        .unwrap()
        .job_id;
    let pool = client.store().pool().clone();
    let log = |step: i32| {
        let pool = pool.clone();
        let ns = ns.clone();
        async move {
            sqlx::query_as::<_, (i64, String)>(&format!(
                "SELECT token, worker FROM {ns}.step_log WHERE job_id = $1 AND step = $2"
            ))
            .bind(job_id.as_uuid())
            .bind(step)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    assert!(
        wait_until(Duration::from_secs(30), || async {
            !log(0).await.is_empty()
        })
        .await,
        "A commits step 0"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.pause(); // t1: A stalls inside step 1, past its lease

    let rec = Arc::new(Record::default());
    let b = Worker::builder(cfg.clone().with_worker_id("B"))
        .register(ThreeStep {
            worker: "B".into(),
            schema: ns.clone(),
        })
        .observer(rec.clone())
        .start()
        .await
        .expect("worker B");
    let done = done_within(&client, job_id, Duration::from_secs(60)).await;
    assert!(done, "B finishes the job");

    let s0 = log(0).await;
    let s1 = log(1).await;
    let s2 = log(2).await;
    assert_eq!(s0.len(), 1);
    assert_eq!(s1.len(), 1);
    assert_eq!(s2.len(), 1);
    let (t1, t2) = (s0[0].0, s1[0].0);
    assert_eq!(s0[0].1, "A");
    assert_eq!(s1[0].1, "B", "B resumed at the uncommitted step");
    assert!(t2 > t1, "B's token {t2} must exceed A's {t1}");
    let row = client.job(job_id).await.unwrap().unwrap();
    assert_eq!(row.fence, t2);
    assert_eq!(row.takeovers, 1, "A did not release: one takeover");

    a.resume(); // A wakes and tries to write step 1 under t1
    let stale_line = format!("refused {job_id} 1 {t1}");
    assert!(
        wait_until(Duration::from_secs(30), || async {
            a.has_line(&stale_line)
        })
        .await,
        "A's write under {t1} must be refused; A printed {:?}",
        a.lines()
    );
    assert!(!a.has_line(&format!("commit {job_id} 1")));
    assert_eq!(log(1).await.len(), 1, "A's stale write did not land");
    assert_eq!(double_commits(&pool, &ns).await, 0);
    b.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 2)]
async fn job_that_keeps_losing_its_owner_is_dead_lettered(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let job_id = client
        .enqueue::<ThreeStep>("poison", &Work::default())
        .await
        .unwrap()
        .job_id;
    // Four owners claim the job and vanish without releasing (max_takeovers = 3):
    // the first claim is no takeover, the next three are.
    for _ in 0..4 {
        let session = Session::establish(&cfg).await.expect("session");
        let Acquire::Acquired(lock) = session.acquire(job_id).await.expect("acquire") else {
            panic!("contended");
        };
        client
            .store()
            .claim(job_id, lock.token())
            .await
            .expect("claim");
        session.close().await.expect("close"); // revokes the lease: lock gone, no release recorded
    }
    assert_eq!(client.job(job_id).await.unwrap().unwrap().takeovers, 3);

    let w = three_step_worker(&cfg, &ns, "w").await;
    let dead = wait_until(Duration::from_secs(30), || async {
        matches!(client.job(job_id).await.unwrap(), Some(r) if r.status == JobStatus::Dead)
    })
    .await;
    assert!(dead, "a fifth owner is one takeover too many");
    let row = client.job(job_id).await.unwrap().unwrap();
    assert_eq!(row.takeovers, 4);
    assert_dead_lettered(&client, &[job_id], "max_takeovers").await;
    w.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 3)]
async fn failing_and_panicking_steps_are_retried_then_dead_lettered_and_the_worker_lives(
    env: TestEnv,
) {
    let (ns, cfg, client) = on_kit(&env).await;
    let w = three_step_worker(&cfg, &ns, "w").await;

    let always = client
        .enqueue::<ThreeStep>(
            "always-fails",
            &Work {
                fail_times: u32::MAX,
                ..Work::default()
            },
        )
        .await
        .unwrap()
        .job_id;
    let panics = client
        .enqueue::<ThreeStep>(
            "always-panics",
            &Work {
                fail_times: u32::MAX,
                panic: true,
                ..Work::default()
            },
        )
        .await
        .unwrap()
        .job_id;
    let flaky = client
        .enqueue::<ThreeStep>(
            "fails-once",
            &Work {
                fail_times: 1,
                ..Work::default()
            },
        )
        .await
        .unwrap()
        .job_id;

    let settled = wait_until(Duration::from_secs(60), || async {
        let a = client.job(always).await.unwrap().unwrap().status;
        let p = client.job(panics).await.unwrap().unwrap().status;
        let f = client.job(flaky).await.unwrap().unwrap().status;
        a == JobStatus::Dead && p == JobStatus::Dead && f == JobStatus::Done
    })
    .await;
    assert!(
        settled,
        "retries = 2: two failures are retried, the third dead-letters"
    );
    let a = client.job(always).await.unwrap().unwrap();
    assert_eq!(a.attempts, 3);
    assert!(
        a.last_error
            .as_deref()
            .unwrap_or("")
            .contains("step two fails on purpose"),
        "{:?}",
        a.last_error
    );
    let p = client.job(panics).await.unwrap().unwrap();
    assert!(
        p.last_error.as_deref().unwrap_or("").contains("panicked"),
        "{:?}",
        p.last_error
    );
    let f = client.job(flaky).await.unwrap().unwrap();
    assert_eq!(f.attempts, 1);
    assert_eq!(
        f.takeovers, 0,
        "a retry is a voluntary release, not a takeover"
    );
    assert_dead_lettered(&client, &[always, panics], "max_retries").await;
    // The worker survived the panics and still runs jobs.
    let after = client
        .enqueue::<ThreeStep>("after-panics", &Work::default())
        .await
        .unwrap()
        .job_id;
    assert!(done_within(&client, after, Duration::from_secs(30)).await);
    w.shutdown().await.unwrap();
}

#[tenure::test(own_stack, ttl_secs = 3)]
async fn quorum_loss_stops_commits_before_lease_can_lapse_and_work_resumes(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let (stack, ttl) = (env.stack(), cfg.lease_ttl);
    let rec = Arc::new(Record::default());
    let w = Worker::builder(cfg.clone().with_worker_id("w"))
        .register(ThreeStep {
            worker: "w".into(),
            schema: ns.clone(),
        })
        .observer(rec.clone())
        .start()
        .await
        .unwrap();
    // A steady stream of jobs while etcd loses quorum.
    let producer = {
        let client = client.clone();
        tokio::spawn(async move {
            for n in 0..400u64 {
                let _ = client
                    .enqueue::<ThreeStep>(&format!("q-{n}"), &work(n))
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    assert!(
        wait_until(Duration::from_secs(30), || async {
            rec.commits.lock().unwrap().len() > 20
        })
        .await
    );
    let leader = stack.etcd_leader().await.unwrap();
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let paused_at = tokio::time::Instant::now();
    stack.etcd_member(others[0]).pause().unwrap();
    stack.etcd_member(leader).pause().unwrap();
    tokio::time::sleep(ttl * 2).await;
    let last_commit = rec
        .commits
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.3)
        .max()
        .unwrap();
    let lost_after = cfg.lost_after();
    // No commit once the lease could have lapsed (70% of TTL), with slack for a
    // commit already on the wire.
    assert!(
        last_commit <= paused_at + lost_after + Duration::from_millis(300),
        "committed {:?} after quorum loss (bound {:?})",
        last_commit - paused_at,
        lost_after
    );
    stack.etcd_member(others[0]).resume().unwrap();
    stack.etcd_member(leader).resume().unwrap();
    producer.await.unwrap();
    let all_done = wait_until(Duration::from_secs(120), || async {
        count_status(&client, JobStatus::Done).await == 400
    })
    .await;
    assert!(
        all_done,
        "after recovery every job completes ({} done)",
        count_status(&client, JobStatus::Done).await
    );
    assert_eq!(double_commits(client.store().pool(), &ns).await, 0);
    w.shutdown().await.unwrap();
}

/// The test's namespace with a broker that gives up after `max_deliver`
/// deliveries, with one `ThreeStep` job enqueued under `key`: its name,
/// config, a client on that config and the job.
async fn one_job(env: &TestEnv, max_deliver: i64, key: &str) -> (String, Config, Client, JobId) {
    let (ns, mut cfg, _) = on_kit(env).await;
    cfg.max_deliver = max_deliver;
    let client = Client::connect(&cfg).await.expect("client");
    let job_id = client
        .enqueue::<ThreeStep>(key, &Work::default())
        .await
        .unwrap()
        .job_id;
    (ns, cfg, client, job_id)
}

/// A worker of a type other than `ThreeStep`'s: its max-deliveries listener
/// handles the advisories of every type.
async fn other_type_worker(cfg: &Config, ns: &str) -> Worker {
    Worker::builder(cfg.clone().with_worker_id("other"))
        .register(Cancellable {
            schema: ns.to_string(),
            probe: Arc::default(),
        })
        .start()
        .await
        .expect("worker")
}

#[tenure::test(ttl_secs = 2)]
async fn a_job_a_live_session_holds_is_never_given_up_by_the_broker(env: TestEnv) {
    let (ns, cfg, client, job_id) = one_job(&env, 3, "held-for-a-while").await;
    // Another live session holds the job's lock: every delivery waits behind
    // it, many times MaxDeliver, and the job's fate does not change.
    let holder = Session::establish(&cfg).await.expect("session");
    assert!(holder.acquire(job_id).await.unwrap().is_acquired());
    let w = three_step_worker(&cfg, &ns, "w").await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let row = client.job(job_id).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Pending, "{:?}", row.last_error);
    let dlq = client.queue().dead_letters(100).await.unwrap();
    assert!(dlq.iter().all(|d| d.job_id != Some(job_id)), "{dlq:?}");
    // The holder goes: the job runs, with no redrive.
    holder.close().await.unwrap();
    assert!(
        done_within(&client, job_id, Duration::from_secs(30)).await,
        "the job runs once its lock is free"
    );
    w.shutdown().await.unwrap();
}

/// The broker gives up on a message while a live session holds the job's
/// lock: the job is not dead, its message is renewed (no dead letter), and
/// it runs once the holder is gone.
#[tenure::test(ttl_secs = 2)]
async fn the_backstop_renews_the_message_of_a_job_a_live_owner_holds(env: TestEnv) {
    let (ns, cfg, client, job_id) = one_job(&env, 2, "held-unsettled").await;
    let holder = Session::establish(&cfg).await.expect("session");
    assert!(holder.acquire(job_id).await.unwrap().is_acquired());
    let queue = tenure::blocks::queue::Queue::provision(&cfg).await.unwrap();
    let other = other_type_worker(&cfg, &ns).await;
    tenure_tests::deliver_unsettled_past_max(&queue, "test.three_step", 2).await;
    // Long enough for the listener to act (it marks a job nobody holds dead
    // within seconds: the test below).
    let dead = wait_until(Duration::from_secs(20), || async {
        client.job(job_id).await.unwrap().unwrap().status == JobStatus::Dead
    })
    .await;
    assert!(!dead, "the backstop ended a job a live owner holds");
    let row = client.job(job_id).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Pending, "{:?}", row.last_error);
    let dlq = client.queue().dead_letters(100).await.unwrap();
    assert!(dlq.iter().all(|d| d.job_id != Some(job_id)), "{dlq:?}");
    other.shutdown().await.unwrap();
    holder.close().await.unwrap();
    let w = three_step_worker(&cfg, &ns, "w").await;
    assert!(
        done_within(&client, job_id, Duration::from_secs(30)).await,
        "the renewed message runs the job once its lock is free"
    );
    w.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 2)]
async fn a_message_nobody_settles_is_given_up_and_its_row_marked_dead(env: TestEnv) {
    let (ns, cfg, client, job_id) = one_job(&env, 2, "never-settled").await;
    // A consumer that takes the message and neither acks nor naks it (a
    // worker that crashes before settling), until the broker gives up; the
    // listener of a worker of another type marks the row.
    let queue = tenure::blocks::queue::Queue::provision(&cfg).await.unwrap();
    let w = other_type_worker(&cfg, &ns).await;
    tenure_tests::deliver_unsettled_past_max(&queue, "test.three_step", 2).await;
    let dead = wait_until(Duration::from_secs(60), || async {
        matches!(client.job(job_id).await.unwrap(), Some(r) if r.status == JobStatus::Dead)
    })
    .await;
    assert!(dead, "the row follows the broker's verdict");
    let row = client.job(job_id).await.unwrap().unwrap();
    assert!(
        row.last_error
            .as_deref()
            .unwrap_or("")
            .contains("max_deliveries"),
        "{:?}",
        row.last_error
    );
    assert_dead_lettered(&client, &[job_id], "max_deliveries").await;
    w.shutdown().await.unwrap();
    // Redriven to a worker of its type: the job completes.
    let w = three_step_worker(&cfg, &ns, "w").await;
    assert_eq!(client.redrive(job_id).await.unwrap(), 1);
    assert!(
        done_within(&client, job_id, Duration::from_secs(30)).await,
        "a redriven job runs to completion"
    );
    w.shutdown().await.unwrap();
}

#[tenure::test]
async fn graceful_shutdown_releases_jobs_without_counting_takeovers(env: TestEnv) {
    // A long TTL: this test is about the release, not about lease loss. With 2 s, a CPU-starved
    // CI machine once missed keepalives for 2.3 s, the watchdog cancelled the slow step, and the
    // job stood at step 1 instead of 2.
    let (ns, cfg, client) = on_kit(&env).await;
    let first = three_step_worker(&cfg, &ns, "first").await;
    // Slow step 1 on `first`: it is mid-job when shutdown begins. Three seconds, not half of
    // one: CI failed here once, most likely a poll that saw step 1 begin only after it ended
    // (the job then ran on to done before the shutdown); the grace (10 s) still covers it.
    let job_id = client
        .enqueue::<ThreeStep>("shutdown-mid-job", &slow_on("first", 1, 3000))
        .await
        .unwrap()
        .job_id;
    assert!(
        wait_until(Duration::from_secs(30), || async {
            client.job(job_id).await.unwrap().unwrap().step.get() >= 1
        })
        .await
    );
    // Step 0 committed; a second on, slow step 1 has begun (it takes 3 s).
    // Without the wait, a shutdown between step 0's commit and step 1's
    // start released the job at step 1 (a correct release; seen once under
    // make test's load).
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.shutdown().await.unwrap();
    let row = client.job(job_id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.step.get()),
        (JobStatus::Pending, 2),
        "shutdown lets the running step finish, then releases the job between steps"
    );

    let second = three_step_worker(&cfg, &ns, "second").await;
    assert!(done_within(&client, job_id, Duration::from_secs(30)).await);
    let row = client.job(job_id).await.unwrap().unwrap();
    assert_eq!(row.takeovers, 0, "a graceful release is not a lost owner");
    assert_eq!(double_commits(client.store().pool(), &ns).await, 0);
    second.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 2)]
async fn enqueue_dedup_outlives_the_brokers_duplicate_window(env: TestEnv) {
    let (ns, mut cfg, _) = on_kit(&env).await;
    cfg.duplicate_window = Duration::from_secs(1);
    let client = Client::connect(&cfg).await.expect("client");
    let five = work(5);
    let first = client.enqueue::<ThreeStep>("once", &five).await.unwrap();
    assert!(!first.duplicate);
    // Inside the broker's window: the row says duplicate, the broker drops the copy.
    let inside = client.enqueue::<ThreeStep>("once", &five).await.unwrap();
    assert!(inside.duplicate);
    assert_eq!(inside.job_id, first.job_id);
    // After the window the broker stores the message again; the row still knows.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = client.enqueue::<ThreeStep>("once", &five).await.unwrap();
    assert!(after.duplicate);
    assert_eq!(after.job_id, first.job_id);
    // The same key with another payload is refused, not silently overwritten.
    let other = client.enqueue::<ThreeStep>("once", &work(6)).await;
    assert!(
        matches!(
            other,
            Err(tenure::ClientError::Fence(
                tenure::blocks::fence::FenceError::PayloadConflict { .. }
            ))
        ),
        "{other:?}"
    );

    let w = three_step_worker(&cfg, &ns, "w").await;
    assert!(done_within(&client, first.job_id, Duration::from_secs(30)).await);
    // Both stored messages are consumed; the job ran once.
    assert!(
        wait_until(Duration::from_secs(30), || async {
            client.queue().stats().await.unwrap().work_messages == 0
        })
        .await,
        "the second message is acked at admission"
    );
    let rows = steps_logged(&client, first.job_id).await;
    assert_eq!(rows, 3, "one job, three steps, once");
    w.shutdown().await.unwrap();
}

/// The claim opens the first step's transaction. A first step that works longer
/// than `idle_in_transaction_session_timeout` (one TTL) before its first write
/// must not lose the claim with it: after the claim window the claim is
/// committed alone and the step opens its own transaction. Without that, the
/// idle transaction is killed and every attempt fails the same way.
#[tenure::test(ttl_secs = 2)]
async fn a_first_step_that_works_past_the_ttl_before_writing_commits_once(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let worker = three_step_worker(&cfg, &ns, "slow").await;
    // Past the TTL, so past the idle-in-transaction timeout.
    let work = Work {
        n: 1,
        ..slow_on("slow", 0, 3_000)
    };
    let id = client
        .enqueue::<ThreeStep>("slow-first", &work)
        .await
        .expect("enqueue")
        .job_id;
    let done = done_within(&client, id, Duration::from_secs(60)).await;
    let row = client.job(id).await.unwrap().unwrap();
    assert!(done, "job not done: {row:?}");
    // Without the claim window the idle claim transaction is killed and the
    // step's first write fails: a failed attempt, every time.
    assert_eq!(row.attempts, 0, "no attempt may fail: {row:?}");
    let rows = steps_logged(&client, id).await;
    assert_eq!(rows, 3, "every step once");
    worker.shutdown().await.expect("shutdown");
}

/// A finished job's lock delete waits for the next acquisition to ride along
/// with, but not for long: with no other job coming, it goes on its own within
/// the release linger, while the worker keeps running.
#[tenure::test(ttl_secs = 5)]
async fn a_finished_jobs_lock_is_deleted_soon_even_when_no_other_job_comes(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let worker = three_step_worker(&cfg, &ns, "rel").await;
    let id = client
        .enqueue::<ThreeStep>("lonely", &Work::default())
        .await
        .expect("enqueue")
        .job_id;
    assert!(
        done_within(&client, id, Duration::from_secs(60)).await,
        "job done"
    );
    let mut etcd = etcd_client::Client::connect(env.stack().etcd_endpoints(), None)
        .await
        .expect("etcd");
    let key = format!("{}jobs/{id}", cfg.etcd_prefix());
    let gone = wait_until(Duration::from_secs(5), || {
        let mut etcd = etcd.clone();
        let key = key.clone();
        async move {
            etcd.get(key, None)
                .await
                .map(|r| r.kvs().is_empty())
                .unwrap_or(false)
        }
    })
    .await;
    let left = etcd.get(key.as_str(), None).await.expect("get");
    assert!(
        gone,
        "the lock of a finished job is still there: {:?}",
        left.kvs()
    );
    worker.shutdown().await.expect("shutdown");
}

/// Admission, for deliveries fetched together (their rows are read in one
/// query): a redelivered message of a finished job is acked without running a
/// step again; a message with no job row and one whose row names an unknown job
/// type go to the DLQ, the latter's row marked dead; a normal job in the same
/// group runs.
#[tenure::test(ttl_secs = 5)]
async fn admission_acks_finished_jobs_and_dead_letters_rowless_and_unknown_types(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let done = client
        .enqueue::<ThreeStep>("admit-done", &work(1))
        .await
        .unwrap()
        .job_id;
    let worker = three_step_worker(&cfg, &ns, "admit").await;
    assert!(done_within(&client, done, Duration::from_secs(60)).await);
    worker.shutdown().await.unwrap();

    // With no worker running, queue a group: the finished job's message again,
    // a message without a row, one whose row names a type this worker does not
    // run, and a new job.
    let queue = client.queue();
    queue
        .publish_redrive((done, "test.three_step", Priority::Normal), "{}".into())
        .await
        .unwrap();
    let rowless = JobId::from_key("test.three_step", "admit-rowless");
    queue
        .publish_job(rowless, "test.three_step", "{}".into())
        .await
        .unwrap();
    let unknown = JobId::from_key("test.nobody", "admit-unknown");
    client
        .store()
        .insert_job(unknown, "test.nobody", &serde_json::json!({}))
        .await
        .unwrap();
    // On this worker's subject, but row and header name a type it does not
    // run (routing by type makes this a forged or misrouted message).
    let js = async_nats::jetstream::new(async_nats::connect(&cfg.nats_url).await.unwrap());
    let mut h = async_nats::HeaderMap::new();
    h.insert(
        tenure::blocks::queue::headers::JOB_ID,
        unknown.to_string().as_str(),
    );
    h.insert(tenure::blocks::queue::headers::JOB_TYPE, "test.nobody");
    let subject = queue.names().work_subject("test.three_step");
    js.publish_with_headers(subject, h, "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let fresh_job = client
        .enqueue::<ThreeStep>("admit-new", &work(2))
        .await
        .unwrap()
        .job_id;

    let worker = three_step_worker(&cfg, &ns, "admit").await;
    assert!(done_within(&client, fresh_job, Duration::from_secs(60)).await);
    let settled = wait_until(Duration::from_secs(30), || async {
        let s = queue.stats().await.unwrap();
        s.work_messages == 0 && s.dlq_messages == 2
    })
    .await;
    assert!(settled, "{:?}", queue.stats().await.unwrap());
    worker.shutdown().await.unwrap();

    assert_dead_lettered(&client, &[rowless], "no job row").await;
    assert_dead_lettered(&client, &[unknown], "unknown job type").await;
    let row = client.job(unknown).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Dead, "{row:?}");
    let row = client.job(done).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.fence > 0, row.takeovers),
        (JobStatus::Done, true, 0),
        "{row:?}"
    );
    let dlq = queue.dead_letters(100).await.unwrap();
    assert!(dlq.iter().all(|d| d.job_id != Some(done)), "{dlq:#?}");
    // The finished job ran each step once: the redelivery ran none again.
    assert_eq!(double_commits(client.store().pool(), &ns).await, 0);
}

/// The health a worker last reported on the workers page (`None`: no row).
async fn reported(client: &Client, worker: &str) -> Option<(String, Option<i64>)> {
    let seen = client
        .store()
        .workers_seen(Duration::from_secs(3600))
        .await
        .expect("workers");
    seen.into_iter()
        .find(|w| w.worker == worker)
        .and_then(|w| w.health.map(|h| (h, w.lease_id)))
}

/// Waits (20 s at most) for worker `reporter-1`'s report to say one of `want`;
/// returns the lease id it reported.
async fn await_report(client: &Client, want: &[&str]) -> Option<i64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let last = reported(client, "reporter-1").await;
        if let Some((h, lease)) = &last
            && want.contains(&h.as_str())
        {
            return *lease;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no report in {want:?}; last: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A worker reports its session lease and the lease's health for operators:
/// healthy with its lease, then the loss of etcd's quorum as lost
/// (reported while PostgreSQL is up, on the health change itself), healthy
/// again on a new session once the quorum is back, and stopped at shutdown.
/// Its own dev stack: the quorum loss would disturb the shared one.
#[tenure::test(own_stack, ttl_secs = 2)]
async fn a_worker_reports_its_lease_health_through_a_quorum_loss_and_its_stop(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let stack = env.stack();
    let worker = three_step_worker(&cfg, &ns, "reporter-1").await;
    let first = await_report(&client, &["healthy"])
        .await
        .expect("a lease id");

    stack.etcd_member(1).pause().unwrap();
    stack.etcd_member(2).pause().unwrap();
    // Degraded first (TTL/3 without an ack), then Lost (70% of the TTL): wait for
    // Lost, which ends the session, so the next one has a new lease.
    await_report(&client, &["lost"]).await;
    stack.etcd_member(1).resume().unwrap();
    stack.etcd_member(2).resume().unwrap();
    let second = await_report(&client, &["healthy"])
        .await
        .expect("a lease id");
    assert_ne!(first, second, "a lost session is replaced by a new lease");

    worker.shutdown().await.expect("shutdown");
    await_report(&client, &["stopped"]).await;
}

/// The `detail` of `job`'s `cancelled` events.
async fn cancel_events(client: &Client, job: JobId) -> Vec<serde_json::Value> {
    let events = events_of_kind(client, job, "cancelled").await;
    events
        .into_iter()
        .map(|e| e.detail.unwrap_or_default())
        .collect()
}

/// Whether the work stream is empty (every message acked) within `within`.
async fn work_stream_empty_within(client: &Client, within: Duration) -> bool {
    wait_until(within, || async {
        client.queue().stats().await.unwrap().work_messages == 0
    })
    .await
}

#[tenure::test(ttl_secs = 5)]
async fn cancel_mid_step_rolls_back_its_writes_and_no_later_step_runs(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let probe = Arc::new(CancelProbe::default());
    let (worker, metered) = cancellable_worker(cfg.clone().with_worker_id("c1"), &ns, &probe).await;
    let hold = Hold { hold_ms: 20_000 };
    let job = client
        .enqueue::<Cancellable>("mid", &hold)
        .await
        .unwrap()
        .job_id;
    // Step 0 wrote its row in its open fenced transaction and waits.
    assert!(
        wait_until(Duration::from_secs(30), || async { probe.wrote(job, 0) }).await,
        "step 0 never started"
    );

    let asked = std::time::Instant::now();
    let outcome = client.cancel(job, "operator: wrong account").await.unwrap();
    let returned = asked.elapsed();
    assert_eq!(outcome, Cancelled::Now);
    let fired = probe.fired(job).expect("the step's cancellation fired");
    let to_fire = fired.saturating_duration_since(asked);
    eprintln!(
        "cancel: cancellation() fired {to_fire:?} after the call; the call returned after {returned:?}"
    );
    assert!(to_fire < Duration::from_secs(1), "fired after {to_fire:?}");

    let row = client.job(job).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Cancelled, "{row:?}");
    assert_eq!(row.step, StepIndex::new(0), "step 0 never committed");
    assert_eq!(
        row.cancel_reason.as_deref(),
        Some("operator: wrong account")
    );
    // The message is acked, and nothing of the job runs again.
    assert!(work_stream_empty_within(&client, Duration::from_secs(10)).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        steps_logged(&client, job).await,
        0,
        "step 0's write rolled back"
    );
    assert!(!probe.wrote(job, 1), "step 1 never ran");
    assert_eq!(
        cancel_events(&client, job).await,
        vec![serde_json::json!("operator: wrong account")]
    );
    assert_eq!(metered.counted("tenure.job.cancelled"), 1);
    assert_eq!(metered.counted("tenure.job.retries"), 0);

    // Twice: a no-op.
    let again = client.cancel(job, "again").await.unwrap();
    assert_eq!(again, Cancelled::Already);
    let after = client.job(job).await.unwrap().unwrap();
    assert_eq!(after, row, "the second cancel changed nothing");
    assert_eq!(cancel_events(&client, job).await.len(), 1);
    worker.shutdown().await.unwrap();
    assert_eq!(client.queue().stats().await.unwrap().dlq_messages, 0);
}

#[tenure::test(ttl_secs = 5)]
async fn cancel_of_a_pending_job_acks_its_message_and_never_runs_it(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let probe = Arc::new(CancelProbe::default());
    let job = client
        .enqueue::<Cancellable>("pending", &Hold { hold_ms: 0 })
        .await
        .unwrap()
        .job_id;
    // No worker yet: the notice reaches nobody, the row update is the cancel.
    assert_eq!(
        client.cancel(job, "before any worker").await.unwrap(),
        Cancelled::Now
    );
    assert_eq!(client.queue().stats().await.unwrap().work_messages, 1);

    let (worker, metered) = cancellable_worker(cfg.clone().with_worker_id("c2"), &ns, &probe).await;
    assert!(
        work_stream_empty_within(&client, Duration::from_secs(30)).await,
        "the worker acked the cancelled job's message"
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            metered.counted("tenure.job.cancelled") == 1
        })
        .await
    );
    let row = client.job(job).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.fence, row.step.get()),
        (JobStatus::Cancelled, 0, 0),
        "never claimed: {row:?}"
    );
    assert!(!probe.wrote(job, 0) && steps_logged(&client, job).await == 0);
    worker.shutdown().await.unwrap();
    assert_eq!(client.queue().stats().await.unwrap().dlq_messages, 0);
}

#[tenure::test(ttl_secs = 5)]
async fn cancel_of_an_unknown_or_finished_job_is_a_typed_error_and_changes_nothing(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let unknown = JobId::from_key("test.cancellable", "never-enqueued");
    let err = client.cancel(unknown, "no such job").await.unwrap_err();
    assert!(
        matches!(err, tenure::ClientError::UnknownJob(id) if id == unknown),
        "{err:?}"
    );
    assert!(client.job(unknown).await.unwrap().is_none());
    assert!(cancel_events(&client, unknown).await.is_empty());

    let probe = Arc::new(CancelProbe::default());
    let (worker, _metered) =
        cancellable_worker(cfg.clone().with_worker_id("c3"), &ns, &probe).await;
    let job = client
        .enqueue::<Cancellable>("finished", &Hold { hold_ms: 0 })
        .await
        .unwrap()
        .job_id;
    assert!(done_within(&client, job, Duration::from_secs(60)).await);
    worker.shutdown().await.unwrap();
    let before = client.job(job).await.unwrap().unwrap();

    let err = client.cancel(job, "too late").await.unwrap_err();
    assert!(
        matches!(
            err,
            tenure::ClientError::JobFinished {
                status: JobStatus::Done,
                ..
            }
        ),
        "{err:?}"
    );
    let long = "x".repeat(tenure::MAX_CANCEL_REASON + 1);
    let err = client.cancel(job, &long).await.unwrap_err();
    assert!(
        matches!(err, tenure::ClientError::InvalidReason(_)),
        "{err:?}"
    );
    assert_eq!(client.job(job).await.unwrap().unwrap(), before);
    assert!(cancel_events(&client, job).await.is_empty());
    assert_eq!(
        steps_logged(&client, job).await,
        2,
        "both steps committed once"
    );
}

#[tenure::test]
async fn cancel_of_a_dead_job_takes_it_out_of_the_dlq_for_good(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let w = three_step_worker(&cfg, &ns, "w").await;
    let fails = Work {
        fail_times: u32::MAX,
        ..Work::default()
    };
    let job = client
        .enqueue::<ThreeStep>("dies", &fails)
        .await
        .unwrap()
        .job_id;
    let dead = wait_until(Duration::from_secs(60), || async {
        client.job(job).await.unwrap().unwrap().status == JobStatus::Dead
    })
    .await;
    assert!(dead, "retries exhausted");
    assert_dead_lettered(&client, &[job], "max_retries").await;

    let cancelled = client.cancel(job, "refunded by hand").await.unwrap();
    assert_eq!(cancelled, Cancelled::Now);
    let row = client.job(job).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Cancelled);
    assert_eq!(row.cancel_reason.as_deref(), Some("refunded by hand"));
    let dlq = client.queue().dead_letters(100).await.unwrap();
    assert!(
        dlq.iter().all(|d| d.job_id != Some(job)),
        "its DLQ entries are deleted"
    );
    let err = client.redrive(job).await.unwrap_err();
    assert!(
        matches!(
            err,
            tenure::ClientError::NotDead {
                status: JobStatus::Cancelled,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        client.cancel(job, "again").await.unwrap(),
        Cancelled::Already
    );
    let row = client.job(job).await.unwrap().unwrap();
    assert_eq!(row.cancel_reason.as_deref(), Some("refunded by hand"));
    w.shutdown().await.unwrap();
}

/// Counts each job's first step commit and when it came.
#[derive(Default)]
struct FirstSteps(Mutex<Vec<tokio::time::Instant>>);

impl WorkerObserver for FirstSteps {
    fn step_committed(&self, _job_id: JobId, step: StepIndex, _token: FencingToken) {
        if step.get() == 0 {
            self.0.lock().unwrap().push(tokio::time::Instant::now());
        }
    }
}

/// How long after each `enqueue` an idle worker committed the job's first
/// step: one warm-up job, then `n` jobs, each after the worker was idle
/// for 0.5 to 1 s. The worker asks the broker every 10 s
/// (`fetch_wait`, `fetch_wait_several`).
async fn idle_pickups(env: &TestEnv, n: u64) -> Vec<Duration> {
    let (ns, mut cfg, client) = on_kit(env).await;
    cfg.tuning.fetch_wait = Duration::from_secs(10);
    cfg.tuning.fetch_wait_several = Duration::from_secs(10);
    let seen = Arc::new(FirstSteps::default());
    let job = ThreeStep {
        worker: "idle".into(),
        schema: ns,
    };
    let worker = Worker::builder(cfg.with_worker_id("idle"))
        .register(job)
        .observer(seen.clone())
        .start()
        .await
        .expect("worker");
    let mut pickups = Vec::new();
    for i in 0..=n {
        tokio::time::sleep(Duration::from_millis(500 + 100 * (i % 6))).await;
        let enqueued = tokio::time::Instant::now();
        client
            .enqueue::<ThreeStep>(&format!("idle-{i}"), &work(i))
            .await
            .expect("enqueue");
        let started = wait_until(Duration::from_secs(30), || async {
            seen.0.lock().unwrap().len() > i as usize
        })
        .await;
        assert!(started, "job {i} never started");
        let at = seen.0.lock().unwrap()[i as usize];
        if i > 0 {
            pickups.push(at - enqueued);
        }
    }
    worker.shutdown().await.expect("shutdown");
    pickups
}

/// An idle worker starts a job once it is stored (the work stream's
/// doorbell, `queue/ring.rs`), not at its next ask: with the asks 10 s
/// apart, each of four jobs starts within 3 s (without the doorbell each
/// had a 30% chance). Speed is the pipeline benchmark's `pickup` part.
#[tenure::test]
async fn an_idle_worker_starts_a_new_job_without_waiting_for_its_next_ask(env: TestEnv) {
    let pickups = idle_pickups(&env, 4).await;
    assert!(
        pickups.iter().all(|p| *p < Duration::from_secs(3)),
        "{pickups:?}"
    );
}

/// [`an_idle_worker_starts_a_new_job_without_waiting_for_its_next_ask`] in
/// partition mode, where the idle fetcher pauses between rounds instead.
#[tenure::test(partitions = 4)]
async fn an_idle_partition_owner_starts_a_new_job_without_waiting_for_its_next_round(env: TestEnv) {
    let pickups = idle_pickups(&env, 4).await;
    assert!(
        pickups.iter().all(|p| *p < Duration::from_secs(3)),
        "{pickups:?}"
    );
}
