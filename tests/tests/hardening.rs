//! Issue 15's liveness findings, each against the real servers: the transaction
//! that carries a job's claim can be lost in many ways (a commit error other
//! than the fence's, a panic after `ctx.db()`, an idle-in-transaction timeout)
//! and every such attempt must still be counted; a guard refusal under our own
//! current fence is the step's bug, not a stale owner.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tenure::Worker;
use tenure::blocks::fence::{JobRow, JobStatus};
use tenure::blocks::lease::{Acquire, Session};
use tenure::testing::TestEnv;
use tenure::{Client, JobId, StepCtx, StepError};
use tenure_tests::{on_kit, wait_until};

/// Ways a first step loses the transaction that carries the claim.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
enum Loss {
    /// The output holds `\u0000`, which jsonb refuses in the step CAS.
    NulInOutput,
    /// A deferred foreign key fails at `COMMIT`, after the CAS matched.
    DeferredConstraint,
    /// `ctx.db()`, then longer than the TTL (PostgreSQL ends the idle transaction).
    IdlePastTtl,
    /// `ctx.db()`, then a panic (the context and its transaction are dropped).
    PanicAfterDb,
}

#[derive(Debug, Clone)]
struct LosesClaim {
    schema: String,
    ttl: Duration,
}

#[tenure::job(name = "hardening.loses_claim", retries = 2)]
impl LosesClaim {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, loss: Loss) -> Result<String, StepError> {
        match loss {
            Loss::NulInOutput => Ok("nul \u{0000} byte".into()),
            Loss::DeferredConstraint => {
                let sql = format!("INSERT INTO {}.child (parent) VALUES (42)", self.schema);
                sqlx::query(&sql).execute(ctx.db().await?).await?;
                Ok("orphan written".into())
            }
            Loss::IdlePastTtl => {
                ctx.db().await?;
                tokio::time::sleep(self.ttl + self.ttl / 2).await;
                Ok("slept".into())
            }
            Loss::PanicAfterDb => {
                ctx.db().await?;
                panic!("the step panics with the claim's transaction open");
            }
        }
    }

    #[step]
    async fn second(&self, _ctx: &mut StepCtx, s: String) -> Result<String, StepError> {
        Ok(s)
    }
}

async fn row(client: &Client, id: JobId) -> JobRow {
    client.job(id).await.unwrap().expect("row")
}

async fn dead_within(client: &Client, id: JobId, within: Duration) -> bool {
    wait_until(within, || async {
        row(client, id).await.status == JobStatus::Dead
    })
    .await
}

/// Item 4: every way of losing the claim's transaction in the first step is a
/// counted attempt; after `retries = 2` the job is dead-lettered with
/// `max_retries` and `attempts = 3`. Before the fix `record_failure` found the
/// claim missing (`NotClaimed`), handed the job back uncounted, and the next
/// attempt did the same until the broker's MaxDeliver.
#[tenure::test(ttl_secs = 2)]
async fn losing_the_claims_transaction_still_counts_the_attempt(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let ttl = cfg.lease_ttl;
    let pool = client.store().pool();
    let ddl = [
        format!("CREATE TABLE {ns}.parent (id int PRIMARY KEY)"),
        format!(
            "CREATE TABLE {ns}.child (parent int REFERENCES {ns}.parent (id) \
             DEFERRABLE INITIALLY DEFERRED)"
        ),
    ];
    tenure_tests::execute_all(pool, &ddl).await;
    let worker = Worker::builder(cfg.clone().with_worker_id("w"))
        .register(LosesClaim {
            schema: ns.clone(),
            ttl,
        })
        .start()
        .await
        .unwrap();
    let losses = [
        Loss::NulInOutput,
        Loss::DeferredConstraint,
        Loss::IdlePastTtl,
        Loss::PanicAfterDb,
    ];
    let mut ids = Vec::new();
    for loss in losses {
        let key = format!("{loss:?}");
        ids.push(
            client
                .enqueue::<LosesClaim>(&key, &loss)
                .await
                .unwrap()
                .job_id,
        );
    }
    for (loss, id) in losses.iter().zip(&ids) {
        let dead = dead_within(&client, *id, Duration::from_secs(60)).await;
        let r = row(&client, *id).await;
        assert!(dead, "{loss:?}: not dead-lettered: {r:?}");
        assert_eq!(r.attempts, 3, "{loss:?}: every attempt counted: {r:?}");
        assert_eq!(r.step.get(), 0, "{loss:?}: nothing committed");
    }
    let dlq = client.queue().dead_letters(100).await.unwrap();
    for (loss, id) in losses.iter().zip(&ids) {
        let entry = dlq.iter().find(|d| d.job_id == Some(*id));
        let reason = entry.map(|e| e.reason.clone()).unwrap_or_default();
        assert!(reason.contains("max_retries"), "{loss:?}: {reason:?}");
    }
    let orphans: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {ns}.child"))
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(orphans, 0, "the failed commits wrote nothing");
    worker.shutdown().await.unwrap();
}

/// A step that writes a guarded table through its own connection (not
/// `ctx.db()`) while it is the job's current owner.
#[derive(Debug, Clone)]
struct WritesAroundTheFence {
    schema: String,
    pool: sqlx::PgPool,
}

#[tenure::job(name = "hardening.around_the_fence", retries = 1)]
impl WritesAroundTheFence {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, n: i64) -> Result<i64, StepError> {
        let sql = format!(
            "INSERT INTO {}.step_log (job_id, step, token, worker) VALUES ($1, 0, $2, 'own-pool')",
            self.schema
        );
        tenure_tests::insert_beside_step(ctx, &self.pool, &sql).await?;
        Ok(n)
    }
}

/// Item 5: a guard refusal raised by the current owner is the step's own bug: a
/// permanent failure whose reason names the table, dead-lettered at once, the
/// lock released. Before the fix it was taken for a stale owner: nothing was
/// released or nak'ed, and the job's own healthy lease kept its lock while the
/// message came back every AckWait until MaxDeliver.
#[tenure::test(ttl_secs = 2)]
async fn a_guard_refusal_under_our_own_fence_is_a_permanent_step_failure(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let worker = Worker::builder(cfg.clone().with_worker_id("w"))
        .register(WritesAroundTheFence {
            schema: ns.clone(),
            pool: client.store().pool().clone(),
        })
        .start()
        .await
        .unwrap();
    let id = client
        .enqueue::<WritesAroundTheFence>("own-pool", &7)
        .await
        .unwrap()
        .job_id;
    let dead = dead_within(&client, id, Duration::from_secs(20)).await;
    let r = row(&client, id).await;
    assert!(dead, "not dead-lettered: {r:?}");
    let reason = r.last_error.clone().unwrap_or_default();
    assert!(
        reason.contains("step_log"),
        "the reason names the table: {reason}"
    );
    let dlq = client.queue().dead_letters(10).await.unwrap();
    let entry = dlq
        .iter()
        .find(|d| d.job_id == Some(id))
        .expect("in the DLQ");
    assert!(entry.reason.contains("permanent_error"), "{}", entry.reason);
    worker.shutdown().await.unwrap();
}

/// Item 5, the lock side: a lock held by the acquiring session's own lease (one
/// this worker stranded) reads as contended by ourselves; `release_stranded`
/// deletes it, so the job can be acquired again at once (with a larger token),
/// and never deletes a lock of another lease.
#[tenure::test(ttl_secs = 5)]
async fn a_lock_stranded_under_our_own_lease_is_deleted_and_no_other_lease_is_touched(
    env: TestEnv,
) {
    let cfg = env.config();
    let ours = Session::establish(cfg).await.unwrap();
    let theirs = Session::establish(cfg).await.unwrap();
    let (job, other) = (JobId::from_key("t", "ours"), JobId::from_key("t", "theirs"));
    let first = ours
        .acquire(job)
        .await
        .unwrap()
        .into_lock()
        .expect("acquired");
    assert!(theirs.acquire(other).await.unwrap().is_acquired());

    // Our own lease holds it: acquisition is not re-entrant.
    assert!(matches!(
        ours.acquire(job).await.unwrap(),
        Acquire::Contended { holder: Some(h) } if h == ours.lease_id()
    ));
    assert!(
        !ours.release_stranded(other).await.unwrap(),
        "another lease's lock is never deleted"
    );
    assert!(matches!(
        ours.acquire(other).await.unwrap(),
        Acquire::Contended { holder: Some(h) } if h == theirs.lease_id()
    ));
    assert!(ours.release_stranded(job).await.unwrap());
    let again = ours
        .acquire(job)
        .await
        .unwrap()
        .into_lock()
        .expect("free again");
    assert!(again.token() > first.token(), "a new grant, a larger token");
    ours.close().await.unwrap();
    theirs.close().await.unwrap();
}

#[derive(Debug, Clone)]
struct Noop;

#[tenure::job(name = "hardening.noop")]
impl Noop {
    #[step]
    async fn only(&self, _ctx: &mut StepCtx, n: i64) -> Result<i64, StepError> {
        Ok(n)
    }
}

/// Item 6: a message the broker gives up on (MaxDeliver) leaves the work stream
/// only after its job row is dead. While the test holds the row locked (so
/// marking it dead cannot finish) the message stays and the DLQ holds nothing
/// for the job; once the lock goes, the row is dead and the DLQ has the entry.
/// Before the fix the listener dead-lettered and deleted the message first and
/// marked the row in another task that only logged a failure: a crash or a
/// database error there left a `pending` row with no message.
#[tenure::test(ttl_secs = 2)]
async fn a_given_up_message_leaves_the_stream_only_after_its_row_is_dead(env: TestEnv) {
    let (ns, mut cfg, _) = on_kit(&env).await;
    cfg.max_deliver = 2;
    let client = Client::connect(&cfg).await.expect("client");
    let id = client.enqueue::<Noop>("held", &1).await.unwrap().job_id;
    // The row is locked on a plain connection (no idle-in-transaction timeout).
    let mut blocker =
        <sqlx::PgConnection as sqlx::Connection>::connect(&env.stack().database_url())
            .await
            .unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query(&format!("SELECT 1 FROM {ns}.jobs WHERE id = $1 FOR UPDATE"))
        .bind(id.as_uuid())
        .execute(&mut blocker)
        .await
        .unwrap();
    // Delivered until the broker gives up, never settled (a worker that
    // crashes each time; nobody holds the job); the advisory waits in its
    // stream for the worker's listener.
    let queue = tenure::blocks::queue::Queue::provision(&cfg).await.unwrap();
    tenure_tests::deliver_unsettled_past_max(&queue, "hardening.noop", 2).await;
    let worker = Worker::builder(cfg.clone().with_worker_id("w"))
        .register(Noop)
        .start()
        .await
        .unwrap();
    // Well past the advisory.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let dlq = client.queue().dead_letters(100).await.unwrap();
    assert!(
        dlq.iter().all(|d| d.job_id != Some(id)),
        "dead-lettered while its row could not be marked dead: {dlq:?}"
    );
    let stats = client.queue().stats().await.unwrap();
    assert_eq!(stats.work_messages, 1, "the message is kept: {stats:?}");
    assert_ne!(row(&client, id).await.status, JobStatus::Dead);

    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    assert!(
        dead_within(&client, id, Duration::from_secs(30)).await,
        "the row is marked dead once it can be"
    );
    let listed = wait_until(Duration::from_secs(30), || async {
        let dlq = client.queue().dead_letters(100).await.unwrap();
        dlq.iter()
            .any(|d| d.job_id == Some(id) && d.reason.contains("max_deliveries"))
    })
    .await;
    assert!(listed, "then the message is dead-lettered");
    let stats = client.queue().stats().await.unwrap();
    assert_eq!(
        stats.work_messages, 0,
        "and leaves the work stream: {stats:?}"
    );
    worker.shutdown().await.unwrap();
}

/// Item 6, redrive: a `pending` job whose message is gone (what the old order
/// could leave behind) is published again by `redrive` and runs to done; a
/// `done` job is refused.
#[tenure::test(ttl_secs = 2)]
async fn redrive_republishes_a_live_job_whose_message_is_gone(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let id = client
        .enqueue::<Noop>("lost-message", &5)
        .await
        .unwrap()
        .job_id;
    // The message vanishes (as a crash between DLQ publish and row update did).
    let js = async_nats::jetstream::new(async_nats::connect(&cfg.nats_url).await.unwrap());
    let work = js.get_stream(&client.queue().names().stream).await.unwrap();
    work.purge().await.unwrap();
    assert_eq!(client.queue().stats().await.unwrap().work_messages, 0);
    assert_eq!(row(&client, id).await.status, JobStatus::Pending);
    assert_eq!(client.redrive(id).await.unwrap(), 1);
    let worker = Worker::builder(cfg.clone().with_worker_id("w"))
        .register(Noop)
        .start()
        .await
        .unwrap();
    let done = wait_until(Duration::from_secs(30), || async {
        row(&client, id).await.status == JobStatus::Done
    })
    .await;
    assert!(
        done,
        "the republished job runs: {:?}",
        row(&client, id).await
    );
    assert!(matches!(
        client.redrive(id).await,
        Err(tenure::ClientError::NotDead { .. })
    ));
    drop(ns);
    worker.shutdown().await.unwrap();
}

/// Item 8: the guard is a statement-level trigger, which PostgreSQL does not
/// fire for a write straight into a partition of a guarded partitioned table
/// (nor, on a guarded partition, for a write through its parent). Both are
/// refused at `install_guard` with a typed error, and no trigger is left.
/// Before the fix the partitioned parent was "guarded" and a direct
/// `INSERT INTO <partition>` went through.
#[tenure::test(ttl_secs = 2)]
async fn partitioned_tables_and_partitions_are_refused_by_the_guard(env: TestEnv) {
    let (ns, _cfg, client) = on_kit(&env).await;
    let pool = client.store().pool();
    let ddl = [
        format!("CREATE TABLE {ns}.parted (k int) PARTITION BY RANGE (k)"),
        format!(
            "CREATE TABLE {ns}.parted_low PARTITION OF {ns}.parted FOR VALUES FROM (0) TO (100)"
        ),
    ];
    tenure_tests::execute_all(pool, &ddl).await;
    for table in [format!("{ns}.parted"), format!("{ns}.parted_low")] {
        let err = client
            .store()
            .install_guard(&table)
            .await
            .expect_err("refused");
        assert!(
            matches!(&err, tenure::blocks::fence::FenceError::Unguardable { table: t, .. } if *t == table),
            "{err}"
        );
        assert!(!client.store().is_guarded(&table).await.unwrap(), "{table}");
    }
    // A plain table still takes the guard.
    assert!(
        client
            .store()
            .is_guarded(&format!("{ns}.step_log"))
            .await
            .unwrap()
    );
}

/// Set by [`RestartMidStep`] once it holds its transaction; the test restarts
/// PostgreSQL, then sets `RESTARTED`.
static IN_STEP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static RESTARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Debug, Clone)]
struct RestartMidStep;

#[tenure::job(name = "hardening.restart_mid_step", retries = 0)]
impl RestartMidStep {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, n: i64) -> Result<i64, StepError> {
        use std::sync::atomic::Ordering::SeqCst;
        ctx.db().await?;
        IN_STEP.store(true, SeqCst);
        while !RESTARTED.load(SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(n)
    }
}

/// Item 4, the fourth trigger: PostgreSQL restarts while the first step holds
/// the claim's transaction. The commit fails, the claim went with the
/// connection, and the attempt must still be counted: with `retries = 0` the
/// job is dead with `attempts = 1`. Before the fix the attempt was handed back
/// uncounted and the next delivery simply ran the job again.
#[tenure::test(own_stack, ttl_secs = 3)]
async fn a_postgres_restart_mid_step_is_a_counted_attempt(env: TestEnv) {
    use std::sync::atomic::Ordering::SeqCst;
    let (_, cfg, client) = on_kit(&env).await;
    let stack = env.stack();
    let worker = Worker::builder(cfg.clone().with_worker_id("w"))
        .register(RestartMidStep)
        .start()
        .await
        .unwrap();
    let id = client
        .enqueue::<RestartMidStep>("restart", &3)
        .await
        .unwrap()
        .job_id;
    assert!(wait_until(Duration::from_secs(30), || async { IN_STEP.load(SeqCst) }).await);
    stack.postgres().restart().expect("restart PostgreSQL");
    stack
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("PostgreSQL back");
    RESTARTED.store(true, SeqCst);
    let settled = wait_until(Duration::from_secs(60), || async {
        matches!(client.job(id).await, Ok(Some(r)) if r.status.is_terminal())
    })
    .await;
    let r = row(&client, id).await;
    assert!(settled, "{r:?}");
    assert_eq!(r.status, JobStatus::Dead, "retries = 0: {r:?}");
    assert_eq!(r.attempts, 1, "the attempt was counted: {r:?}");
    worker.shutdown().await.unwrap();
}
