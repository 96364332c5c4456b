//! The testing kit (`tenure::testing`) against real servers: each
//! `FaultPlan` point fires where it says and the history checker stays clean;
//! a job that writes outside `ctx.db()` to an unguarded table under a freeze
//! makes the checker report it (the kit can fail).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::testing::{Fault, FaultPlan, FaultPoint, TestEnv, Violation};
use tenure::{Config, JobId, StepCtx, StepError, StepIndex, Worker, WorkerBuilder};
use tenure_tests::{insert_in_step, step_rows, step_table};

/// A two-step job whose steps each write `(job, step, token)` to the guarded
/// table `tally` through their fenced transaction.
#[derive(Debug, Clone)]
struct Tally {
    schema: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Count {
    n: u64,
}

impl Tally {
    async fn write(&self, ctx: &mut StepCtx, step: u32) -> Result<(), StepError> {
        let sql = format!(
            "INSERT INTO {}.tally (job_id, token, step) VALUES ($1, $2, $3)",
            self.schema
        );
        insert_in_step(ctx, &sql, Some(step), None).await
    }
}

#[tenure::job(name = "kit.tally", retries = 5, max_takeovers = 5)]
impl Tally {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, c: Count) -> Result<Count, StepError> {
        self.write(ctx, 0).await?;
        Ok(c)
    }

    #[step]
    async fn second(&self, ctx: &mut StepCtx, c: Count) -> Result<u64, StepError> {
        self.write(ctx, 1).await?;
        Ok(c.n)
    }
}

/// A one-step job that does it wrong: it writes `(job, 0, token)` to the
/// unguarded table `leak` through a pool of its own (autocommit, outside
/// `ctx.db()`), then returns.
#[derive(Debug, Clone)]
struct Leaky {
    schema: String,
    pool: sqlx::PgPool,
}

#[tenure::job(name = "kit.leaky", retries = 5, max_takeovers = 5)]
impl Leaky {
    #[step]
    async fn only(&self, ctx: &mut StepCtx, c: Count) -> Result<u64, StepError> {
        let sql = format!(
            "INSERT INTO {}.leak (job_id, step, token) VALUES ($1, 0, $2)",
            self.schema
        );
        tenure_tests::insert_beside_step(ctx, &self.pool, &sql).await?;
        Ok(c.n)
    }
}

/// What every worker of these tests runs, in process or as a worker process.
async fn workers(cfg: Config) -> WorkerBuilder {
    let schema = cfg.schema.clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy(&cfg.database_url)
        .expect("lazy pool");
    Worker::builder(cfg)
        .register(Tally {
            schema: schema.clone(),
        })
        .register(Leaky { schema, pool })
}

/// Creates `tally` (guarded) and `leak` (unguarded) and has the checker
/// watch both.
async fn tables(env: &TestEnv) {
    step_table(env, "tally", true).await;
    step_table(env, "leak", false).await;
}

fn tally_job(key: &str) -> JobId {
    JobId::from_key("kit.tally", key)
}

async fn tally_rows(env: &TestEnv, job: JobId) -> Vec<(i32, i64)> {
    step_rows(env, "tally", job).await
}

const WAIT: Duration = Duration::from_secs(60);

#[tenure::test(ttl_secs = 3, worker = workers)]
async fn crash_after_commit_before_ack(env: TestEnv) {
    tables(&env).await;
    let job = tally_job("crash");
    let plan = FaultPlan::new().at(
        Some(job),
        StepIndex::new(0),
        FaultPoint::AfterCommit,
        Fault::Crash,
    );
    let w1 = env.worker_process("w1", plan).await.unwrap();
    env.client()
        .enqueue::<Tally>("crash", &Count { n: 7 })
        .await
        .unwrap();
    assert!(
        tenure::devstack::wait_until(WAIT, || async { w1.exited() }).await,
        "w1 did not crash"
    );
    assert!(w1.has_line("crash"), "{:?}", w1.lines());
    // Step 0 committed, the worker died before step 1 and before any ack.
    let row = env.client().job(job).await.unwrap().unwrap();
    assert_eq!(
        (row.step.get(), row.status),
        (1, tenure::JobStatus::Running)
    );
    let w2 = env.worker("w2", workers).await.unwrap();
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, tenure::JobStatus::Done);
    assert_eq!(env.result::<Tally>(job).await.unwrap(), Some(7));
    let rows = tally_rows(&env, job).await;
    assert_eq!(rows.len(), 2, "each step written once: {rows:?}");
    assert!(
        rows[1].1 > rows[0].1,
        "step 1 ran under the next owner: {rows:?}"
    );
    env.check().await.unwrap().assert_clean();
    w2.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 3, worker = workers)]
async fn freeze_in_step_lets_the_next_owner_take_over(env: TestEnv) {
    tables(&env).await;
    let job = tally_job("freeze");
    let freeze = Fault::Freeze(Duration::from_secs(6));
    let plan = FaultPlan::new().at(Some(job), StepIndex::new(1), FaultPoint::StepStart, freeze);
    let w1 = env.worker_process("w1", plan).await.unwrap();
    env.client()
        .enqueue::<Tally>("freeze", &Count { n: 1 })
        .await
        .unwrap();
    assert!(tenure::devstack::wait_until(WAIT, || async { w1.has_line("freeze") }).await);
    let w2 = env.worker("w2", workers).await.unwrap();
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, tenure::JobStatus::Done);
    assert!(
        row.takeovers >= 1,
        "the frozen owner was taken over: {row:?}"
    );
    let rows = tally_rows(&env, job).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows[1].1 > rows[0].1,
        "step 1 committed by the new owner: {rows:?}"
    );
    // The frozen worker continues after its freeze; nothing of it commits.
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.check().await.unwrap().assert_clean();
    w2.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 3)]
async fn etcd_cut_during_a_step(env: TestEnv) {
    tables(&env).await;
    let job = tally_job("cut");
    let cut = Fault::CutEtcd(Duration::from_secs(7));
    let plan = FaultPlan::new().at(Some(job), StepIndex::new(0), FaultPoint::StepStart, cut);
    let w1 = env.worker_with_faults("w1", plan, workers).await.unwrap();
    env.client()
        .enqueue::<Tally>("cut", &Count { n: 2 })
        .await
        .unwrap();
    assert!(tenure::devstack::wait_until(WAIT, || async { !env.faults_fired().is_empty() }).await);
    let w2 = env.worker("w2", workers).await.unwrap();
    // Cut off, w1's lease runs out while its step waits.
    assert!(
        tenure::devstack::wait_until(WAIT, || async { w1.health() == tenure::Health::Lost }).await
    );
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, tenure::JobStatus::Done);
    assert!(row.takeovers >= 1 || row.fence > 0, "{row:?}");
    assert_eq!(tally_rows(&env, job).await.len(), 2);
    tokio::time::sleep(Duration::from_secs(5)).await;
    env.check().await.unwrap().assert_clean();
    w2.shutdown().await.unwrap();
    w1.shutdown().await.unwrap();
}

#[tenure::test(own_stack)]
async fn postgres_restart_between_steps(env: TestEnv) {
    tables(&env).await;
    let job = tally_job("restart");
    let plan = FaultPlan::new().at(
        Some(job),
        StepIndex::new(0),
        FaultPoint::AfterCommit,
        Fault::RestartPostgres,
    );
    let w1 = env.worker_with_faults("w1", plan, workers).await.unwrap();
    env.client()
        .enqueue::<Tally>("restart", &Count { n: 3 })
        .await
        .unwrap();
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, tenure::JobStatus::Done);
    let fired = env.faults_fired();
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!((fired[0].job, fired[0].rule.step), (job, StepIndex::new(0)));
    assert_eq!(tally_rows(&env, job).await.len(), 2);
    env.check().await.unwrap().assert_clean();
    w1.shutdown().await.unwrap();
}

#[tenure::test(ttl_secs = 3, worker = workers)]
async fn the_checker_reports_an_unguarded_write_under_a_freeze(env: TestEnv) {
    tables(&env).await;
    let job = JobId::from_key("kit.leaky", "leak");
    let freeze = Fault::Freeze(Duration::from_secs(6));
    let plan = FaultPlan::new().at(
        Some(job),
        StepIndex::new(0),
        FaultPoint::BeforeCommit,
        freeze,
    );
    let w1 = env.worker_process("w1", plan).await.unwrap();
    env.client()
        .enqueue::<Leaky>("leak", &Count { n: 4 })
        .await
        .unwrap();
    assert!(tenure::devstack::wait_until(WAIT, || async { w1.has_line("freeze") }).await);
    let w2 = env.worker("w2", workers).await.unwrap();
    env.run_until_done(job, WAIT).await.unwrap();
    let report = env.check().await.unwrap();
    let leak = format!("{}.leak", env.schema());
    assert!(
        report
            .violations
            .iter()
            .any(|v| matches!(v, Violation::DoubleWrite { table, job: j, .. } if *table == leak && *j == job)),
        "the checker missed the double write:\n{report}"
    );
    assert!(
        report
            .violations
            .iter()
            .any(|v| matches!(v, Violation::StaleWrite { table, .. } if *table == leak)),
        "{report}"
    );
    w2.shutdown().await.unwrap();
}

#[tenure::test]
async fn run_step_commits_one_step_in_a_real_fenced_transaction(env: TestEnv) {
    tables(&env).await;
    let e = env
        .client()
        .enqueue::<Tally>("by-hand", &Count { n: 5 })
        .await
        .unwrap();
    let tally = Tally {
        schema: env.schema().to_string(),
    };
    let out = env
        .run_step(&tally, e.job_id, StepIndex::new(0))
        .await
        .unwrap();
    assert_eq!(out, serde_json::json!({ "n": 5 }));
    let row = env.client().job(e.job_id).await.unwrap().unwrap();
    assert_eq!(row.step.get(), 1, "step 0's checkpoint committed");
    assert_eq!(tally_rows(&env, e.job_id).await.len(), 1, "with its write");
    // The row is at step 1 now: step 0 again is refused, and writes nothing.
    let again = env.run_step(&tally, e.job_id, StepIndex::new(0)).await;
    assert!(again.is_err(), "{again:?}");
    // A worker takes the job over from the test and finishes it.
    let w = env.worker("w1", workers).await.unwrap();
    env.run_until_done(e.job_id, WAIT).await.unwrap();
    assert_eq!(env.result::<Tally>(e.job_id).await.unwrap(), Some(5));
    assert_eq!(tally_rows(&env, e.job_id).await.len(), 2);
    env.check().await.unwrap().assert_clean();
    w.shutdown().await.unwrap();
}

/// Ends every PostgreSQL session of application `app` (what a server restart
/// or an operator's `pg_terminate_backend` does to a client's idle pooled
/// connections): each gets `57P01`.
async fn terminate_sessions(env: &TestEnv, app: &str) -> i64 {
    let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
               WHERE application_name = $1 AND pid <> pg_backend_pid()";
    let (ended,): (i64,) = sqlx::query_as(sql)
        .bind(app)
        .fetch_one(env.pool())
        .await
        .unwrap();
    ended
}

/// An enqueue and a read whose pooled session the server ended a moment
/// after its last use go through on a fresh one, and the enqueue is not
/// mistaken for a duplicate. The idempotent statements skip the checkout's
/// ping (the next test): what replaces such a session for them is their
/// retry (`on_live_session`).
#[tenure::test]
async fn an_enqueue_right_after_the_server_ended_its_sessions_goes_through(env: TestEnv) {
    let app = format!("{}-terminated", env.namespace());
    let cfg = env.config().clone().with_worker_id(app.clone());
    let client = tenure::Client::connect(&cfg).await.unwrap();
    for round in 0..3 {
        // Several connections in the pool, each used a moment ago.
        let before = (0..6).map(|i| {
            let key = format!("before-{round}-{i}");
            let client = client.clone();
            async move { client.enqueue::<Tally>(&key, &Count { n: 1 }).await }
        });
        for done in futures::future::join_all(before).await {
            done.unwrap();
        }
        assert!(terminate_sessions(&env, &app).await >= 2);
        let key = format!("after-{round}");
        let after = client.enqueue::<Tally>(&key, &Count { n: 1 }).await;
        let after = after.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(!after.duplicate, "round {round}: {after:?}");
        assert!(terminate_sessions(&env, &app).await >= 1);
        // Several connections used a moment ago again (their reads may meet
        // sessions ended above; the read below is the one checked).
        let reads = (0..6).map(|_| client.job(after.job_id));
        futures::future::join_all(reads).await;
        assert!(terminate_sessions(&env, &app).await >= 1);
        let read = client.job(after.job_id).await;
        let read = read.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(read.map(|r| r.status), Some(tenure::JobStatus::Pending));
    }
}

/// Round trips a wire count may carry from outside its window on a loaded
/// machine: the warm-up's release ping landing after the 200 ms wait, one
/// more from a connection opened at its edge (seen once: 43 against 42).
const STRAGGLERS: u64 = 2;

/// A warm client's enqueue waits for one round trip to PostgreSQL, its row's
/// insert: the pool's checkout ping is skipped for the idempotent statements
/// (the test above is what replaces it). Counted on the wire by a proxy in
/// front of PostgreSQL (`tenure_tests::trips`: each `Query` and `Sync` a
/// client sends). The other one per enqueue is sqlx's ping of the connection
/// as it goes back to the pool, in a task of its own that nobody waits for;
/// a connection the pool opens meanwhile (the last one was still on its way
/// back) sends two more: its session settings, and the insert's prepare (a
/// statement's first use on a connection). With the checkout ping, three.
#[tenure::test]
async fn a_warm_enqueue_sends_its_insert_without_a_checkout_ping(env: TestEnv) {
    use tenure_tests::trips::Proxy;
    let (proxy, url) = Proxy::in_front_of(&env.config().database_url)
        .await
        .unwrap();
    let cfg = env.config().clone().with_database_url(url);
    let client = tenure::Client::connect(&cfg).await.unwrap();
    // The connection, and the namespace's way of owning jobs, read once.
    client
        .enqueue::<Tally>("warm-0", &Count { n: 1 })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.take();
    proxy.take_connections();
    const N: u64 = 20;
    for i in 1..=N {
        let key = format!("warm-{i}");
        let e = client
            .enqueue::<Tally>(&key, &Count { n: 1 })
            .await
            .unwrap();
        assert!(!e.duplicate, "{key}");
    }
    // The last connection's release ping.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (trips, opened) = (proxy.take(), proxy.take_connections());
    assert!(
        trips <= 2 * N + 2 * opened + STRAGGLERS,
        "{trips} round trips to PostgreSQL for {N} enqueues on a warm pool \
         ({opened} connections opened): more than the insert and the release's ping each"
    );
    assert!(trips >= N, "{trips}: the proxy saw fewer than the inserts");
}

/// A store on the production pool (`FenceStore::connect`) in the test's
/// schema, as worker `app` (its sessions' `application_name`), through `url`.
async fn store_on_pool(env: &TestEnv, app: &str, url: String) -> tenure::blocks::fence::FenceStore {
    let cfg = env
        .config()
        .clone()
        .with_worker_id(app)
        .with_database_url(url);
    tenure::blocks::fence::FenceStore::connect(&cfg)
        .await
        .unwrap()
}

/// `n` fresh job rows of type `test.claimed`, inserted through `store`.
async fn claimable(store: &tenure::blocks::fence::FenceStore, prefix: &str, n: u64) -> Vec<JobId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = JobId::from_key("test.claimed", &format!("{prefix}-{i}"));
        let input = serde_json::json!({ "i": i });
        store.insert_job(id, "test.claimed", &input).await.unwrap();
        ids.push(id);
    }
    ids
}

/// A warm worker's claim waits for two round trips, its `BEGIN` and the
/// claim itself: the checkout's ping is skipped for a transaction's `BEGIN`,
/// which runs again on a fresh connection when it meets a session the server
/// ended (the next test). Counted on the wire (`tenure_tests::trips`): each
/// claim here is `BEGIN` and the claim, then, as the dropped transaction's
/// connection goes back to the pool in a task nobody waits for, `ROLLBACK`
/// and sqlx's ping; a connection the pool opens meanwhile sends its session
/// settings and the claim's prepare. With the checkout ping, five.
#[tenure::test]
async fn a_warm_claim_sends_its_begin_without_a_checkout_ping(env: TestEnv) {
    use tenure_tests::trips::Proxy;
    let (proxy, url) = Proxy::in_front_of(&env.config().database_url)
        .await
        .unwrap();
    let store = store_on_pool(&env, "warm-claims", url).await;
    const N: u64 = 20;
    let ids = claimable(&store, "warm", 2 * N).await;
    let token = tenure::FencingToken::for_tests(7);
    let (warm, measured) = ids.split_at(N as usize);
    // Warm: the pool's connections (the inserts opened several, taken in
    // turn) and the claim's prepared statement on each.
    for id in warm {
        drop(store.claim_and_begin(*id, token).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.take();
    proxy.take_connections();
    for id in measured {
        let (claim, tx) = store.claim_and_begin(*id, token).await.unwrap();
        assert_eq!(claim.step, StepIndex::new(0));
        drop(tx);
    }
    // The last connection's rollback and release ping.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (trips, opened) = (proxy.take(), proxy.take_connections());
    assert!(
        trips <= 4 * N + 2 * opened + STRAGGLERS,
        "{trips} round trips to PostgreSQL for {N} claims on a warm pool \
         ({opened} connections opened): more than BEGIN, the claim, ROLLBACK \
         and the release's ping each"
    );
    assert!(
        trips >= 2 * N,
        "{trips}: the proxy saw fewer than the claims"
    );
}

/// A claim whose pooled sessions the server ended a moment after their last
/// use goes through on a fresh one: its `BEGIN` meets the ended session and
/// runs again (what the checkout's ping did before).
#[tenure::test]
async fn a_claim_right_after_the_server_ended_its_sessions_goes_through(env: TestEnv) {
    let app = format!("{}-claims-ended", env.namespace());
    let store = store_on_pool(&env, &app, env.config().database_url.clone()).await;
    let ids = claimable(&store, "ended", 6).await;
    let token = tenure::FencingToken::for_tests(9);
    for round in 0..3 {
        // Several connections in the pool, each used a moment ago (a dropped
        // claim's transaction rolls back: the next round claims again).
        let claims = ids.iter().map(|id| {
            let store = store.clone();
            async move { store.claim_and_begin(*id, token).await.map(drop) }
        });
        for done in futures::future::join_all(claims).await {
            done.unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(terminate_sessions(&env, &app).await >= 2, "round {round}");
        let claimed = store.claim_and_begin(ids[0], token).await;
        let (claim, tx) = claimed.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(claim.step, StepIndex::new(0));
        drop(tx);
    }
}
