//! Everyday operations never change a job's fate: an operator's redrive of a
//! running job, a prune of finished rows, a cancel while a compensation runs.
//! Each test is the sequence an operator or a user would run, against the dev
//! stack, asserting the job's end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::blocks::fence::JobStatus;
use tenure::testing::TestEnv;
use tenure::{Client, Config, DeadJob, JobId, Priority, StepCtx, StepError, Worker};
use tenure_tests::wait_until;

/// How many times each job's `on_dead` hook ran (tests share the process).
static COMPENSATED: Mutex<Option<HashMap<JobId, u32>>> = Mutex::new(None);

fn compensations(id: JobId) -> u32 {
    let map = COMPENSATED.lock().unwrap();
    map.as_ref().and_then(|m| m.get(&id).copied()).unwrap_or(0)
}

/// Input of [`Nap`]: how long its one step sleeps.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sleep {
    ms: u64,
}

/// One step that sleeps (not bound to cancellation, like a long external
/// call), with an `on_dead` hook that counts its runs.
struct Nap;

#[tenure::job(name = "ops.nap", on_dead = undo)]
impl Nap {
    #[step]
    async fn nap(&self, _ctx: &mut StepCtx, s: Sleep) -> Result<u64, StepError> {
        tokio::time::sleep(Duration::from_millis(s.ms)).await;
        Ok(s.ms)
    }

    async fn undo(&self, ctx: &mut StepCtx, _dead: DeadJob) -> Result<(), StepError> {
        let mut map = COMPENSATED.lock().unwrap();
        *map.get_or_insert_with(HashMap::new)
            .entry(ctx.job_id())
            .or_insert(0) += 1;
        Ok(())
    }
}

/// A worker of [`Nap`] on `cfg` whose broker gives up after 20 deliveries.
async fn nap_worker(mut cfg: Config, id: &str) -> Worker {
    cfg.max_deliver = 20;
    Worker::builder(cfg.with_worker_id(id))
        .register(Nap)
        .start()
        .await
        .expect("worker")
}

/// The operator's sequence: a 20 s step running, one `redrive` of it (its
/// doc says always safe), then the job must end `done`, its hook never run.
async fn redrive_while_running(client: &Client, cfg: &Config) {
    let w = nap_worker(cfg.clone(), "w0").await;
    let e = client
        .enqueue::<Nap>("long", &Sleep { ms: 20_000 })
        .await
        .unwrap();
    let running = wait_until(Duration::from_secs(20), || async {
        let row = client.job(e.job_id).await.unwrap().unwrap();
        row.status == JobStatus::Running
    })
    .await;
    assert!(running, "the job never started");
    assert_eq!(client.redrive(e.job_id).await.unwrap(), 1);
    let row = tenure_tests::wait_terminal(client, e.job_id, Duration::from_secs(60)).await;
    assert_eq!(
        row.status,
        JobStatus::Done,
        "a redrive of a running job changed its fate: {:?}",
        row.last_error
    );
    assert_eq!(compensations(e.job_id), 0, "the hook ran for a healthy job");
    w.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 2)]
async fn a_redrive_of_a_running_job_never_kills_it(env: TestEnv) {
    redrive_while_running(env.client(), env.config()).await;
}

#[tenure::test(ttl_secs = 2, partitions = 4)]
async fn a_redrive_of_a_running_job_never_kills_it_in_partition_mode(env: TestEnv) {
    redrive_while_running(env.client(), env.config()).await;
}

/// How many times each job's one step ran.
static RAN: Mutex<Option<HashMap<JobId, u32>>> = Mutex::new(None);

fn runs(id: JobId) -> u32 {
    let map = RAN.lock().unwrap();
    map.as_ref().and_then(|m| m.get(&id).copied()).unwrap_or(0)
}

/// A payment: one step that counts its runs.
struct Pay;

#[tenure::job(name = "ops.pay")]
impl Pay {
    #[step]
    async fn pay(&self, ctx: &mut StepCtx, amount: u64) -> Result<u64, StepError> {
        let mut map = RAN.lock().unwrap();
        *map.get_or_insert_with(HashMap::new)
            .entry(ctx.job_id())
            .or_insert(0) += 1;
        Ok(amount)
    }
}

/// The test environment's worker `w0` of [`Pay`].
async fn pay_worker(env: &TestEnv) -> Worker {
    let start = |cfg| async move { Worker::builder(cfg).register(Pay) };
    env.worker("w0", start).await.unwrap()
}

/// A payment done and its row pruned by retention (`done_after` = `every` =
/// 1 s, the broker's duplicate window `window`), on a worker that still runs.
struct Pruned {
    cfg: Config,
    client: Client,
    worker: Worker,
    first: tenure::Enqueued,
}

async fn paid_and_pruned(env: &TestEnv, window: Duration, key: &str, amount: u64) -> Pruned {
    let mut cfg = env.config().clone();
    cfg.retention.done_after = Some(Duration::from_secs(1));
    cfg.retention.every = Duration::from_secs(1);
    cfg.duplicate_window = window;
    let client = Client::connect(&cfg).await.unwrap();
    let worker = Worker::builder(cfg.clone().with_worker_id("w0"))
        .register(Pay)
        .start()
        .await
        .unwrap();
    let first = client.enqueue::<Pay>(key, &amount).await.unwrap();
    let row = tenure_tests::wait_terminal(&client, first.job_id, Duration::from_secs(30)).await;
    assert_eq!(row.status, JobStatus::Done);
    let pruned = wait_until(Duration::from_secs(30), || async {
        client.job(first.job_id).await.unwrap().is_none()
    })
    .await;
    assert!(pruned, "retention never pruned the done row");
    Pruned {
        cfg,
        client,
        worker,
        first,
    }
}

/// The user's sequence: `pay-42` done and pruned by retention, then enqueued
/// again inside the broker's duplicate window and once more after it: each
/// enqueue is a duplicate, the step ran once, no row waits `pending`.
#[tenure::test(ttl_secs = 3)]
async fn retention_never_reopens_an_idempotency_key(env: TestEnv) {
    let pruned = paid_and_pruned(&env, Duration::from_secs(3), "pay-42", 42).await;
    let (client, w, first) = (pruned.client, pruned.worker, pruned.first);
    for when in ["inside the duplicate window", "after the duplicate window"] {
        let again = client.enqueue::<Pay>("pay-42", &42).await.unwrap();
        assert!(again.duplicate, "enqueue {when} reopened the key");
        assert_eq!(again.job_id, first.job_id);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let row = client.job(first.job_id).await.unwrap();
        assert!(
            row.as_ref().is_none_or(|r| r.status != JobStatus::Pending),
            "a row waits pending {when}: {row:?}"
        );
    }
    assert_eq!(runs(first.job_id), 1, "the step ran more than once");
    // Another input under the retired key is the conflict it always was.
    let err = client.enqueue::<Pay>("pay-42", &43).await.unwrap_err();
    assert!(
        matches!(
            err,
            tenure::ClientError::Fence(tenure::blocks::fence::FenceError::PayloadConflict { .. })
        ),
        "{err:?}"
    );
    w.shutdown().await.unwrap();
}

/// Every enqueue path (batch, transactional) finds a pruned key used; past
/// the key horizon (`Retention::keys_after`) the tombstone goes and the key
/// runs again, once.
#[tenure::test(ttl_secs = 3)]
async fn every_enqueue_path_respects_a_tombstone_until_the_key_horizon(env: TestEnv) {
    let pruned = paid_and_pruned(&env, Duration::from_secs(2), "pay-7", 7).await;
    let (mut cfg, client, w, first) = (pruned.cfg, pruned.client, pruned.worker, pruned.first);
    let batch = client.enqueue_many::<Pay>(&[("pay-7", 7)]).await.unwrap();
    assert!(batch[0].as_ref().unwrap().duplicate, "{batch:?}");
    let mut tx = env.pool().begin().await.unwrap();
    let again = client
        .enqueue_in::<Pay>(&mut tx, "pay-7", &7)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(again.duplicate);
    let batch = client.enqueue_many::<Pay>(&[("pay-7", 8)]).await.unwrap();
    assert!(
        batch[0].is_err(),
        "another input under a pruned key: {batch:?}"
    );
    assert!(client.job(first.job_id).await.unwrap().is_none());
    w.shutdown().await.unwrap();

    // The key horizon: the tombstone goes, and the key is new again.
    cfg.retention.keys_after = Some(Duration::from_secs(2));
    let w = Worker::builder(cfg.clone().with_worker_id("w1"))
        .register(Pay)
        .start()
        .await
        .unwrap();
    let reopened = wait_until(Duration::from_secs(30), || async {
        !client.enqueue::<Pay>("pay-7", &7).await.unwrap().duplicate
    })
    .await;
    assert!(reopened, "the tombstone outlived keys_after");
    tenure_tests::wait_terminal(&client, first.job_id, Duration::from_secs(30)).await;
    assert_eq!(runs(first.job_id), 2, "once before the horizon, once after");
    w.shutdown().await.unwrap();
}

/// The race the tombstone trigger closes: an enqueue that waits on the row a
/// prune is deleting goes ahead when the prune commits, under a snapshot that
/// saw no tombstone; the trigger refuses it and the insert finds the
/// tombstone.
#[tenure::test]
async fn an_enqueue_racing_the_prune_of_its_key_finds_the_tombstone(env: TestEnv) {
    use tenure::blocks::fence::Inserted;
    let store = env.client().store().clone();
    let id = JobId::from_key("ops.pay", "racing");
    let input = serde_json::json!(5);
    assert_eq!(
        store.insert_job(id, "ops.pay", &input).await.unwrap(),
        Inserted::New
    );
    let jobs = format!("{}.jobs", env.schema());
    sqlx::query(&format!(
        "UPDATE {jobs} SET status = 'done', updated_at = now() - interval '1 hour', \
                created_at = now() - interval '1 hour' WHERE id = $1"
    ))
    .bind(id.as_uuid())
    .execute(env.pool())
    .await
    .unwrap();
    let mut prune = env.pool().begin().await.unwrap();
    let n: i64 = sqlx::query_scalar(&format!(
        "SELECT {}.tenure_prune_jobs('done', 60, 10)",
        env.schema()
    ))
    .fetch_one(&mut *prune)
    .await
    .unwrap();
    assert_eq!(n, 1);
    let racing = tokio::spawn(async move { store.insert_job(id, "ops.pay", &input).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !racing.is_finished(),
        "the insert did not wait on the pruned row"
    );
    prune.commit().await.unwrap();
    let inserted = racing.await.unwrap().unwrap();
    assert_eq!(inserted, Inserted::Pruned(JobStatus::Done));
    assert!(env.client().job(id).await.unwrap().is_none());
}

/// What a tombstone costs: its bytes with both indexes, per million pruned
/// jobs (the figure `Retention::keys_after` documents).
#[tenure::test]
async fn a_tombstone_costs_under_200_bytes(env: TestEnv) {
    let t = format!("{}.job_tombstones", env.schema());
    sqlx::query(&format!(
        "INSERT INTO {t} (id, job_type, input_md5, status, finished_at) \
         SELECT gen_random_uuid(), 'ledger.transfer', md5(g::text), 'done', now() \
           FROM generate_series(1, 200000) g"
    ))
    .execute(env.pool())
    .await
    .unwrap();
    sqlx::query(&format!("VACUUM ANALYZE {t}"))
        .execute(env.pool())
        .await
        .unwrap();
    let bytes: i64 = sqlx::query_scalar(&format!("SELECT pg_total_relation_size('{t}')"))
        .fetch_one(env.pool())
        .await
        .unwrap();
    let per = bytes / 200_000;
    eprintln!("tombstones: {per} bytes each, {} MB per million", per);
    assert!(per < 200, "{per} bytes per tombstone");
}

/// When each job's `on_dead` hook made its external call and when it
/// committed (tests share the process).
static HOOK: Mutex<Vec<(JobId, &'static str)>> = Mutex::new(Vec::new());

fn hook_events(id: JobId) -> Vec<&'static str> {
    let events = HOOK.lock().unwrap();
    events
        .iter()
        .filter(|(j, _)| *j == id)
        .map(|(_, e)| *e)
        .collect()
}

/// A job that fails for good at once, whose `on_dead` hook makes an
/// "external call", takes 3 s, then writes through its fenced transaction.
struct Doomed;

#[tenure::job(name = "ops.doomed", on_dead = refund)]
impl Doomed {
    #[step]
    async fn fail(&self, _ctx: &mut StepCtx, _n: u64) -> Result<u64, StepError> {
        Err(StepError::permanent("fails for good"))
    }

    async fn refund(&self, ctx: &mut StepCtx, _dead: DeadJob) -> Result<(), StepError> {
        HOOK.lock().unwrap().push((ctx.job_id(), "external call"));
        tokio::time::sleep(Duration::from_secs(3)).await;
        sqlx::query("SELECT 1").execute(ctx.db().await?).await?;
        HOOK.lock().unwrap().push((ctx.job_id(), "committing"));
        Ok(())
    }
}

/// An operator cancels a dead job while its refund runs: the cancel is
/// refused (typed) and the refund commits; once it has, the cancel goes
/// through.
#[tenure::test]
async fn a_cancel_never_abandons_a_running_compensation(env: TestEnv) {
    let w = env
        .worker(
            "w0",
            |cfg| async move { Worker::builder(cfg).register(Doomed) },
        )
        .await
        .unwrap();
    let client = env.client();
    let e = client.enqueue::<Doomed>("d1", &1).await.unwrap();
    let called = wait_until(Duration::from_secs(30), || async {
        !hook_events(e.job_id).is_empty()
    })
    .await;
    assert!(called, "the hook never ran");
    let cancel = client.cancel(e.job_id, "operator gives up").await;
    assert!(
        matches!(cancel, Err(tenure::ClientError::CompensationPending { job_id }) if job_id == e.job_id),
        "a cancel while the compensation runs: {cancel:?}"
    );
    let finished = wait_until(Duration::from_secs(30), || async {
        !client
            .job(e.job_id)
            .await
            .unwrap()
            .unwrap()
            .compensation_pending
    })
    .await;
    assert!(finished, "the compensation never ended");
    assert_eq!(hook_events(e.job_id), ["external call", "committing"]);
    let row = client.job(e.job_id).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Dead);
    let cancel = client.cancel(e.job_id, "operator gives up").await.unwrap();
    assert_eq!(cancel, tenure::Cancelled::Now);
    w.shutdown().await.unwrap();
}

/// Retention never prunes a row whose compensation has not ended: a dead
/// (or cancelled) job with `compensation = 'pending'` stays, however old.
#[tenure::test]
async fn retention_never_prunes_a_pending_compensation(env: TestEnv) {
    let store = env.client().store();
    let jobs = format!("{}.jobs", env.schema());
    for (key, status, compensation) in [
        ("a", "dead", "pending"),
        ("b", "cancelled", "pending"),
        ("c", "dead", "done"),
    ] {
        let id = JobId::from_key("ops.doomed", key);
        store
            .insert_job(id, "ops.doomed", &serde_json::json!(1))
            .await
            .unwrap();
        sqlx::query(&format!(
            "UPDATE {jobs} SET status = $2, compensation = $3, \
                    updated_at = now() - interval '1 hour', \
                    created_at = now() - interval '1 hour' WHERE id = $1"
        ))
        .bind(id.as_uuid())
        .bind(status)
        .bind(compensation)
        .execute(env.pool())
        .await
        .unwrap();
    }
    let age = Duration::from_secs(60);
    assert_eq!(store.prune_jobs(JobStatus::Dead, age, 10).await.unwrap(), 1);
    assert_eq!(
        store
            .prune_jobs(JobStatus::Cancelled, age, 10)
            .await
            .unwrap(),
        0
    );
    for key in ["a", "b"] {
        let id = JobId::from_key("ops.doomed", key);
        assert!(
            env.client().job(id).await.unwrap().is_some(),
            "{key} pruned"
        );
    }
}

/// A batch whose publishes fail hands its pending rows to the scheduler
/// leader; a row it cannot hand (a running job's republish) is reported as
/// the publish error it is, never as enqueued.
#[tenure::test(own_stack, ttl_secs = 3)]
async fn a_batch_never_reports_a_publish_nobody_will_make(env: TestEnv) {
    let w = env
        .worker(
            "w0",
            |cfg| async move { Worker::builder(cfg).register(Nap) },
        )
        .await
        .unwrap();
    let mut cfg = env.config().clone();
    cfg.nats_request_timeout = Duration::from_secs(1);
    let client = Client::connect(&cfg).await.unwrap();
    let long = Sleep { ms: 6_000 };
    let e = client.enqueue::<Nap>("long", &long).await.unwrap();
    let running = wait_until(Duration::from_secs(20), || async {
        client.job(e.job_id).await.unwrap().unwrap().status == JobStatus::Running
    })
    .await;
    assert!(running, "the job never started");
    env.stack().nats().pause().unwrap();
    let items = [("long", long.clone()), ("fresh", Sleep { ms: 1 })];
    let results = client.enqueue_many::<Nap>(&items).await;
    env.stack().nats().resume().unwrap();
    let results = results.unwrap();
    assert!(
        matches!(results[0], Err(tenure::EnqueueItemError::Publish { .. })),
        "the running job's republish failed and was not handed on: {:?}",
        results[0]
    );
    let fresh = results[1]
        .as_ref()
        .expect("the pending row is handed to the leader");
    let row = tenure_tests::wait_terminal(&client, fresh.job_id, Duration::from_secs(60)).await;
    assert_eq!(row.status, JobStatus::Done);
    w.shutdown().await.unwrap();
}

/// `enqueue_in` of an unfinished duplicate whose message was lost
/// republishes it, as `enqueue` does: the documented way to recover.
#[tenure::test]
async fn enqueue_in_of_an_unfinished_duplicate_republishes(env: TestEnv) {
    let env = &env;
    let w = pay_worker(env).await;
    let client = env.client();
    let id = JobId::from_key("ops.pay", "lost-message");
    // A row whose message never reached the broker.
    let steps = <Pay as tenure::Job>::STEPS;
    let store = client.store();
    store
        .insert_defined_job(id, "ops.pay", &serde_json::json!(9), None, steps)
        .await
        .unwrap();
    let mut tx = env.pool().begin().await.unwrap();
    let again = client
        .enqueue_in::<Pay>(&mut tx, "lost-message", &9)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(again.duplicate);
    let row = tenure_tests::wait_terminal(client, id, Duration::from_secs(30)).await;
    assert_eq!(row.status, JobStatus::Done);
    assert_eq!(runs(id), 1);
    w.shutdown().await.unwrap();
}

/// With the default retention (only `every` shortened to see it act), a done
/// job finished 31 days ago is pruned and one of 29 days is kept; the pruned
/// job's key stays used (tombstone) and its step never runs again. Prints
/// what the history trigger kept for the job that stays.
#[tenure::test(ttl_secs = 3)]
async fn the_default_retention_prunes_month_old_done_jobs_and_keeps_their_keys(env: TestEnv) {
    let mut cfg = env.config().clone();
    cfg.retention = tenure::config::Retention {
        every: Duration::from_secs(1),
        ..Default::default()
    };
    let client = Client::connect(&cfg).await.unwrap();
    let worker = Worker::builder(cfg.clone().with_worker_id("w0"))
        .register(Pay)
        .start()
        .await
        .unwrap();
    let old = client.enqueue::<Pay>("month-old", &1).await.unwrap().job_id;
    let recent = client.enqueue::<Pay>("recent", &2).await.unwrap().job_id;
    for id in [old, recent] {
        let row = tenure_tests::wait_terminal(&client, id, Duration::from_secs(30)).await;
        assert_eq!(row.status, JobStatus::Done);
    }
    let s = env.schema();
    for (id, days) in [(old, 31), (recent, 29)] {
        sqlx::query(&format!(
            "UPDATE {s}.jobs SET created_at = now() - make_interval(days => $2), \
                                 updated_at = now() - make_interval(days => $2) WHERE id = $1"
        ))
        .bind(id.as_uuid())
        .bind(days)
        .execute(env.pool())
        .await
        .unwrap();
    }
    let pruned = wait_until(Duration::from_secs(30), || async {
        client.job(old).await.unwrap().is_none()
    })
    .await;
    assert!(pruned, "the default retention kept a 31-day-old done job");
    assert!(client.job(recent).await.unwrap().is_some(), "29 days: kept");
    let again = client.enqueue::<Pay>("month-old", &1).await.unwrap();
    assert!(again.duplicate, "the pruned job's key was reopened");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(runs(old), 1, "the pruned job ran again");
    let (events, bytes): (i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*), coalesce(sum(pg_column_size(e.*)), 0)::bigint \
           FROM {s}.job_events e WHERE job_id = $1"
    ))
    .bind(recent.as_uuid())
    .fetch_one(env.pool())
    .await
    .unwrap();
    eprintln!("history of a one-step job: {events} rows, {bytes} bytes of tuples");
    worker.shutdown().await.unwrap();
}

/// Two messages of one job fetched in one group (its enqueue and a second
/// copy, as a redrive, a republished duplicate or a renewal leaves behind,
/// both stored before any worker runs): the job runs once, and the second
/// message is a duplicate the job row absorbs, never a dead letter that says
/// the job has no row (it was one: dead-lettered, its message terminated,
/// while the row stayed `pending` or `running`).
#[tenure::test]
async fn two_messages_of_one_job_in_one_fetch_are_absorbed(env: TestEnv) {
    let env = &env;
    let client = env.client();
    let e = client.enqueue::<Pay>("twice", &5).await.unwrap();
    let payload = serde_json::to_vec(&5).unwrap();
    client
        .queue()
        .publish_redrive((e.job_id, "ops.pay", Priority::Normal), payload.into())
        .await
        .unwrap();
    let w = pay_worker(env).await;
    let row = tenure_tests::wait_terminal(client, e.job_id, Duration::from_secs(30)).await;
    assert_eq!(row.status, JobStatus::Done, "{:?}", row.last_error);
    assert_eq!(runs(e.job_id), 1);
    // The duplicate's delivery settles after the job's: give it a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dead = client.queue().dead_letters_of(e.job_id, 10).await.unwrap();
    let reasons: Vec<&str> = dead.iter().map(|d| d.reason.as_str()).collect();
    assert!(
        reasons.is_empty(),
        "a duplicate message was dead-lettered: {reasons:?}"
    );
    w.shutdown().await.unwrap();
}
