//! The fenced resource against a real PostgreSQL (the dev stack's): claims, fenced
//! transactions, the guard on user tables, migrations per schema, and a property
//! test of random interleavings of claims and step commits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use serde_json::json;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};
use tenure::blocks::fence::{
    Admitted, FenceError, FenceStore, FencedTx, GateError, Inserted, JobStatus, PgFenceMarks,
    TokenGate,
};
use tenure::devstack::DevStack;
use tenure::{FencingToken, JobId, ObservedFence, StepIndex};
use tenure_tests::database_stack;

async fn pool(max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&database_stack(false).database_url())
        .await
        .expect("connect")
}

/// A migrated store in a fresh schema, with a user table `<schema>.ledger`.
async fn store(prefix: &str) -> FenceStore {
    let store = FenceStore::new(pool(12).await, &DevStack::unique_namespace(prefix)).unwrap();
    store.migrate().await.expect("migrate");
    let ledger = ledger(&store);
    store
        .pool()
        .execute(
            format!(
                "CREATE TABLE {ledger} (n bigserial PRIMARY KEY, job uuid NOT NULL, \
                 step int NOT NULL, token bigint NOT NULL, note text)"
            )
            .as_str(),
        )
        .await
        .expect("create ledger");
    store
}

fn ledger(store: &FenceStore) -> String {
    format!("{}.ledger", store.schema())
}

fn tok(n: i64) -> FencingToken {
    FencingToken::for_tests(n)
}

fn step(k: u32) -> StepIndex {
    StepIndex::new(k)
}

async fn new_job(store: &FenceStore, key: &str) -> JobId {
    let id = JobId::from_key("test.job", key);
    let ins = store
        .insert_job(id, "test.job", &json!({ "key": key }))
        .await
        .unwrap();
    assert_eq!(ins, Inserted::New);
    id
}

/// A step's own write, as user code would do it.
async fn write_ledger(
    conn: &mut PgConnection,
    table: &str,
    id: JobId,
    k: u32,
    token: FencingToken,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "INSERT INTO {table} (job, step, token) VALUES ($1, $2, $3)"
    ))
    .bind(id.as_uuid())
    .bind(k as i32)
    .bind(token.get())
    .execute(conn)
    .await
    .map(|_| ())
}

async fn ledger_rows(store: &FenceStore, id: JobId) -> Vec<(i32, i64)> {
    sqlx::query_as(&format!(
        "SELECT step, token FROM {} WHERE job = $1 ORDER BY n",
        ledger(store)
    ))
    .bind(id.as_uuid())
    .fetch_all(store.pool())
    .await
    .unwrap()
}

fn assert_fenced_out(res: Result<impl std::fmt::Debug, FenceError>, current: i64) {
    match res {
        Err(e @ FenceError::FencedOut { .. }) => {
            assert!(e.is_fenced_out());
            let FenceError::FencedOut { current: c, .. } = e else {
                unreachable!()
            };
            assert_eq!(
                c,
                Some(tok(current).observed()),
                "current fence in the error"
            );
        }
        other => panic!("expected FencedOut (current {current}), got {other:?}"),
    }
}

fn assert_guard_refused(res: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) {
    let err = res.expect_err("the guard must refuse this write");
    assert!(
        tenure::blocks::fence::is_guard_refusal(&err),
        "not a guard refusal: {err}"
    );
    let err = FenceError::from(err);
    assert!(err.is_fenced_out());
    assert!(matches!(err, FenceError::GuardRefused { .. }));
}

// ---------------------------------------------------------------------------------

/// The migrations `framework/migrations` holds (its `.sql` files).
fn migrations() -> i64 {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../framework/migrations");
    let sql = std::fs::read_dir(dir)
        .expect("the migrations folder")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
        })
        .count();
    i64::try_from(sql).expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_idempotent_concurrent_and_per_schema() {
    let p = pool(16).await;
    let a = FenceStore::new(p.clone(), &DevStack::unique_namespace("mig_a")).unwrap();
    let b = FenceStore::new(p.clone(), &DevStack::unique_namespace("mig_b")).unwrap();
    // Several "processes" migrate both schemas at once.
    let mut tasks = Vec::new();
    for i in 0..6 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move { s.migrate().await }));
    }
    for t in tasks {
        t.await.unwrap().expect("concurrent migrate");
    }
    a.migrate().await.expect("idempotent");

    let expected = migrations();
    assert!(expected >= 10, "the folder was read: {expected}");
    for s in [&a, &b] {
        let applied: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}._sqlx_migrations WHERE success",
            s.schema()
        ))
        .fetch_one(&p)
        .await
        .unwrap();
        assert_eq!(
            applied,
            expected,
            "each of the {expected} migrations recorded once in {}",
            s.schema()
        );
    }
    let public: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('public._sqlx_migrations')::text")
            .fetch_one(&p)
            .await
            .unwrap();
    assert_eq!(public, None, "bookkeeping stays inside the tenure schemas");

    let id = new_job(&a, "only-in-a").await;
    assert!(a.job(id).await.unwrap().is_some());
    assert!(
        b.job(id).await.unwrap().is_none(),
        "schemas are independent"
    );

    assert!(matches!(
        FenceStore::new(p.clone(), "Bad-Name"),
        Err(FenceError::InvalidName { what: "schema", .. })
    ));
    assert!(matches!(
        FenceStore::new(p, "x; drop table y"),
        Err(FenceError::InvalidName { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_job_is_idempotent_and_never_overwrites() {
    let s = store("insert").await;
    let id = JobId::from_key("ledger.transfer", "t-1");
    let input = json!({"from": 1, "to": 2, "amount": 10});
    assert_eq!(
        s.insert_job(id, "ledger.transfer", &input).await.unwrap(),
        Inserted::New
    );
    // Same payload with another key order: the same job.
    let reordered = json!({"amount": 10, "to": 2, "from": 1});
    assert_eq!(
        s.insert_job(id, "ledger.transfer", &reordered)
            .await
            .unwrap(),
        Inserted::Existing
    );
    assert!(matches!(
        s.insert_job(id, "ledger.transfer", &json!({"amount": 11})).await,
        Err(FenceError::PayloadConflict { job_id }) if job_id == id
    ));
    assert!(matches!(
        s.insert_job(id, "other.type", &input).await,
        Err(FenceError::PayloadConflict { .. })
    ));
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!(row.input, input);
    assert_eq!(row.job_type, "ledger.transfer");
    assert_eq!(
        (row.fence, row.step, row.status),
        (0, step(0), JobStatus::Pending)
    );
    assert_eq!((row.takeovers, row.attempts), (0, 0));

    let other = new_job(&s, "second").await;
    let all = s.list_jobs(None, 10).await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![id, other]
    );
    assert_eq!(
        s.list_jobs(Some(JobStatus::Running), 10)
            .await
            .unwrap()
            .len(),
        0
    );
    s.claim(other, tok(5)).await.unwrap();
    let running = s.list_jobs(Some(JobStatus::Running), 10).await.unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].id, other);
}

/// The seed's timeline: 41 claims and writes; 42 claims; 41 is refused before and
/// during 42's transaction; 42's writes succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_timeline_41_then_42() {
    let s = store("seed").await;
    let table = ledger(&s);
    let id = new_job(&s, "seed").await;

    let c41 = s.claim(id, tok(41)).await.unwrap();
    assert_eq!(
        (c41.step, c41.checkpoint.clone(), c41.takeovers),
        (step(0), None, 0)
    );
    assert!(!c41.takeover && c41.previous.is_none());
    assert_eq!(c41.input, json!({"key": "seed"}));
    let mut tx = s.begin_step(id, tok(41), step(0)).await.unwrap();
    write_ledger(tx.conn(), &table, id, 0, tok(41))
        .await
        .unwrap();
    tx.commit_step(&json!({"by": 41}), false).await.unwrap();

    // 42 takes over (41 never released: a lost owner).
    let c42 = s.claim(id, tok(42)).await.unwrap();
    assert!(c42.takeover);
    assert_eq!(c42.previous, Some(tok(41).observed()));
    assert_eq!((c42.step, c42.takeovers), (step(1), 1));
    assert_eq!(c42.checkpoint, Some(json!({"by": 41})));

    // Before 42's transaction: every write under 41 is refused.
    assert_fenced_out(s.begin_step(id, tok(41), step(1)).await, 42);
    assert_fenced_out(s.claim(id, tok(41)).await, 42);
    assert_fenced_out(s.record_failure(id, tok(41), "late").await, 42);
    assert_fenced_out(s.record_release(id, tok(41)).await, 42);
    assert_fenced_out(s.mark_dead(id, tok(41), "late", false).await, 42);

    // During 42's transaction: still refused, and without waiting for 42's row lock
    // (42's claim is committed, so the admission's WHERE already fails).
    let mut tx42 = s.begin_step(id, tok(42), step(1)).await.unwrap();
    write_ledger(tx42.conn(), &table, id, 1, tok(42))
        .await
        .unwrap();
    let during = tokio::time::timeout(Duration::from_secs(20), s.begin_step(id, tok(41), step(1)))
        .await
        .expect("a stale admission must not wait for the newer owner's lock");
    assert_fenced_out(during, 42);
    // 41 even retrying its old step 0 is stale, not a "step mismatch".
    assert_fenced_out(s.begin_step(id, tok(41), step(0)).await, 42);
    tx42.commit_step(&json!({"by": 42}), false).await.unwrap();

    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!(
        (row.fence, row.step, row.status),
        (42, step(2), JobStatus::Running)
    );
    assert_eq!(row.checkpoint, Some(json!({"by": 42})));
    assert_eq!(ledger_rows(&s, id).await, vec![(0, 41), (1, 42)]);
}

/// A stale owner whose transaction started before the takeover committed cannot
/// write: two connections and the row lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_transaction_started_before_takeover_cannot_commit() {
    let s = store("stale_tx").await;
    let table = ledger(&s);
    let id = new_job(&s, "stale").await;
    s.claim(id, tok(41)).await.unwrap();

    // (a) 42 claims and opens its step in one transaction: it holds the row lock,
    // its claim is not committed yet. 41's step transaction starts now and blocks
    // on the row lock; once 42 commits, READ COMMITTED re-checks 41's WHERE on the
    // new row version: zero rows, FencedOut, before any user write.
    let (claim42, mut tx42) = s.claim_and_begin(id, tok(42)).await.unwrap();
    assert!(claim42.takeover);
    let s41 = s.clone();
    let stale = tokio::spawn(async move { s41.begin_step(id, tok(41), step(0)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !stale.is_finished(),
        "41's admission must wait for the row lock"
    );
    write_ledger(tx42.conn(), &table, id, 0, tok(42))
        .await
        .unwrap();
    tx42.commit_step(&json!({"by": 42}), false).await.unwrap();
    let res = tokio::time::timeout(Duration::from_secs(20), stale)
        .await
        .expect("unblocked by 42's commit")
        .unwrap();
    assert_fenced_out(res, 42);
    assert_eq!(ledger_rows(&s, id).await, vec![(0, 42)]);

    // (b) The other order: 42's step transaction holds the lock and has written;
    // 43 takes over meanwhile. 43's claim waits for the lock, so 42's step commits
    // entirely before the takeover (and 43 resumes from it); 42's next step is
    // refused.
    let mut tx42 = s.begin_step(id, tok(42), step(1)).await.unwrap();
    write_ledger(tx42.conn(), &table, id, 1, tok(42))
        .await
        .unwrap();
    let s43 = s.clone();
    let claim43 = tokio::spawn(async move { s43.claim(id, tok(43)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !claim43.is_finished(),
        "a claim must wait for a step in progress"
    );
    tx42.commit_step(&json!({"by": 42, "k": 1}), false)
        .await
        .unwrap();
    let c43 = claim43.await.unwrap().unwrap();
    assert_eq!(c43.step, step(2));
    assert_eq!(c43.checkpoint, Some(json!({"by": 42, "k": 1})));
    assert_fenced_out(s.begin_step(id, tok(42), step(2)).await, 43);

    // (c) Same, but the stale side gives up (its pre-commit check saw the lease
    // lost): nothing of its step survives, the new owner redoes the step.
    let mut tx43 = s.begin_step(id, tok(43), step(2)).await.unwrap();
    write_ledger(tx43.conn(), &table, id, 2, tok(43))
        .await
        .unwrap();
    let s44 = s.clone();
    let claim44 = tokio::spawn(async move { s44.claim(id, tok(44)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!claim44.is_finished());
    tx43.rollback().await.unwrap();
    let c44 = claim44.await.unwrap().unwrap();
    assert_eq!(c44.step, step(2));
    assert_fenced_out(s.begin_step(id, tok(43), step(2)).await, 44);

    // (d) A stale generation's plain transaction (not a FencedTx) that carried its
    // settings from before the takeover: the guard refuses its write once the
    // takeover committed.
    s.install_guard(&table).await.unwrap();
    let mut conn = s.pool().acquire().await.unwrap();
    let mut plain = conn.begin().await.unwrap();
    set_generation(&mut plain, id, 44).await;
    let s45 = s.clone();
    s45.claim(id, tok(45)).await.unwrap();
    assert_guard_refused(
        sqlx::query(&format!(
            "INSERT INTO {table} (job, step, token) VALUES ($1, 2, 44)"
        ))
        .bind(id.as_uuid())
        .execute(&mut *plain)
        .await,
    );
    drop(plain);

    assert_eq!(ledger_rows(&s, id).await, vec![(0, 42), (1, 42)]);
}

async fn set_generation(conn: &mut PgConnection, id: JobId, fence: i64) {
    sqlx::query(
        "SELECT set_config('tenure.job_id', $1, true), set_config('tenure.fence', $2, true)",
    )
    .bind(id.to_string())
    .bind(fence.to_string())
    .execute(conn)
    .await
    .unwrap();
}

/// Calls the admission function directly (as a `FencedTx` does): whether job
/// `id` at `step` under `fence` was admitted in this transaction.
async fn admit_by_hand(
    conn: &mut PgConnection,
    s: &FenceStore,
    id: JobId,
    fence: i64,
    step: i32,
) -> bool {
    sqlx::query_scalar(&format!(
        "SELECT \"{}\".tenure_admit($1, $2, $3)",
        s.schema()
    ))
    .bind(id.as_uuid())
    .bind(fence)
    .bind(step)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// In a fresh transaction, `job` at step 1 under `fence` is not admitted,
/// and `insert` (for ledger row `row`) is refused by the guard.
async fn refused_unadmitted(s: &FenceStore, insert: &str, job: JobId, row: JobId, fence: i64) {
    let mut plain = s.pool().begin().await.unwrap();
    assert!(!admit_by_hand(&mut plain, s, job, fence, 1).await);
    assert_guard_refused(
        sqlx::query(insert)
            .bind(row.as_uuid())
            .execute(&mut *plain)
            .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_refuses_plain_sql_and_stale_generations_and_the_escape_works() {
    let s = store("guard").await;
    let table = ledger(&s);
    let id = new_job(&s, "guarded").await;
    let insert = format!("INSERT INTO {table} (job, step, token) VALUES ($1, 0, 0)");

    assert!(!s.is_guarded(&table).await.unwrap());
    s.install_guard(&table).await.unwrap();
    s.install_guard(&table).await.unwrap(); // idempotent
    assert!(s.is_guarded(&table).await.unwrap());

    // Plain SQL outside any fenced transaction: every kind of write is refused.
    assert_guard_refused(
        sqlx::query(&insert)
            .bind(id.as_uuid())
            .execute(s.pool())
            .await,
    );
    assert_guard_refused(
        s.pool()
            .execute(format!("UPDATE {table} SET note = 'x'").as_str())
            .await,
    );
    assert_guard_refused(
        s.pool()
            .execute(format!("DELETE FROM {table}").as_str())
            .await,
    );
    assert_guard_refused(s.pool().execute(format!("TRUNCATE {table}").as_str()).await);
    // Reads are not guarded.
    let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, 0);

    // Inside the current generation's fenced transaction: allowed.
    s.claim(id, tok(41)).await.unwrap();
    let mut tx = s.begin_step(id, tok(41), step(0)).await.unwrap();
    write_ledger(tx.conn(), &table, id, 0, tok(41))
        .await
        .unwrap();
    sqlx::query(&format!(
        "UPDATE {table} SET note = 'in step' WHERE job = $1"
    ))
    .bind(id.as_uuid())
    .execute(tx.conn())
    .await
    .unwrap();
    // A step that grabbed its own pool connection meanwhile is refused.
    assert_guard_refused(
        sqlx::query(&insert)
            .bind(id.as_uuid())
            .execute(s.pool())
            .await,
    );
    tx.commit_step(&json!(0), false).await.unwrap();

    // Settings any code can set open nothing: the current generation's
    // `tenure.job_id` / `tenure.fence`, set by hand, are refused (migration 0015).
    let mut plain = s.pool().begin().await.unwrap();
    set_generation(&mut plain, id, 41).await;
    assert_guard_refused(
        sqlx::query(&insert)
            .bind(id.as_uuid())
            .execute(&mut *plain)
            .await,
    );
    drop(plain);

    // An admission (the definer function a FencedTx calls) holds the job row: a
    // guarded write in its transaction keeps a takeover waiting until the
    // transaction ends, so the guard's check cannot go stale while it runs.
    let mut plain = s.pool().begin().await.unwrap();
    assert!(admit_by_hand(&mut plain, &s, id, 41, 1).await);
    sqlx::query(&format!(
        "UPDATE {table} SET note = 'current generation' WHERE job = $1"
    ))
    .bind(id.as_uuid())
    .execute(&mut *plain)
    .await
    .unwrap();
    let s42 = s.clone();
    let claim42 = tokio::spawn(async move { s42.claim(id, tok(42)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !claim42.is_finished(),
        "a takeover must wait for a guarded write in flight"
    );
    plain.commit().await.unwrap();
    claim42.await.unwrap().unwrap();

    // A stale generation (41 after 42 claimed) is not admitted, and its write
    // is refused...
    refused_unadmitted(&s, &insert, id, id, 41).await;
    // ...and so is a generation that released the job, and a job that does not exist.
    s.record_release(id, tok(42)).await.unwrap();
    refused_unadmitted(&s, &insert, id, id, 42).await;
    refused_unadmitted(&s, &insert, JobId::from_key("test.job", "nope"), id, 42).await;

    // The escape hatch: explicit, for this transaction only.
    let mut ops = s.pool().begin().await.unwrap();
    s.bypass_guard(&mut ops).await.unwrap();
    sqlx::query(&insert)
        .bind(id.as_uuid())
        .execute(&mut *ops)
        .await
        .unwrap();
    ops.execute(format!("UPDATE {table} SET note = 'ops fix'").as_str())
        .await
        .unwrap();
    ops.commit().await.unwrap();
    // It cannot be hit by accident: a session-wide bypass on a pooled connection
    // (even set to a real transaction id) opens nothing in later transactions.
    let mut conn = s.pool().acquire().await.unwrap();
    conn.execute("SET tenure.guard_bypass = 'on'")
        .await
        .unwrap();
    assert_guard_refused(
        sqlx::query(&insert)
            .bind(id.as_uuid())
            .execute(&mut *conn)
            .await,
    );
    conn.execute("SELECT set_config('tenure.guard_bypass', txid_current()::text, false)")
        .await
        .unwrap();
    assert_guard_refused(
        sqlx::query(&insert)
            .bind(id.as_uuid())
            .execute(&mut *conn)
            .await,
    );
    conn.execute("RESET tenure.guard_bypass").await.unwrap();
    drop(conn);

    let rows = ledger_rows(&s, id).await;
    assert_eq!(rows, vec![(0, 41), (0, 0)]);

    // Removing the guard restores plain writes.
    s.remove_guard(&table).await.unwrap();
    assert!(!s.is_guarded(&table).await.unwrap());
    sqlx::query(&insert)
        .bind(id.as_uuid())
        .execute(s.pool())
        .await
        .unwrap();

    for bad in ["", "a.b.c", "x; drop table y", "1abc", "t\"x"] {
        assert!(
            matches!(
                s.install_guard(bad).await,
                Err(FenceError::InvalidName { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        s.install_guard("no_such_table").await,
        Err(FenceError::Db(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_returns_the_last_committed_checkpoint_and_counts_takeovers() {
    let s = store("resume").await;
    let table = ledger(&s);
    let id = new_job(&s, "resume").await;

    let (c, tx) = s.claim_and_begin(id, tok(10)).await.unwrap();
    assert_eq!(c.step, step(0));
    assert!(tx.carries_claim());
    tx.commit_step(&json!({"out": "a"}), false).await.unwrap();
    let tx = s.begin_step(id, tok(10), step(1)).await.unwrap();
    tx.commit_step(&json!({"out": "b"}), false).await.unwrap();
    // Step 2 in flight when the owner dies: its writes never commit.
    let mut tx = s.begin_step(id, tok(10), step(2)).await.unwrap();
    write_ledger(tx.conn(), &table, id, 2, tok(10))
        .await
        .unwrap();
    drop(tx);

    let c = s.claim(id, tok(20)).await.unwrap();
    assert_eq!(c.step, step(2));
    assert_eq!(c.checkpoint, Some(json!({"out": "b"})));
    assert!(c.takeover);
    assert_eq!(c.takeovers, 1);
    assert!(ledger_rows(&s, id).await.is_empty());
    // Same token again: a second acquisition with it (etcd regressed), refused.
    assert!(
        s.claim(id, tok(20))
            .await
            .unwrap_err()
            .is_token_regression()
    );
    // A duplicate commit of an already committed step is a step mismatch, not stale.
    assert!(matches!(
        s.begin_step(id, tok(20), step(1)).await,
        Err(FenceError::StepMismatch { actual, .. }) if actual == step(2)
    ));

    // A failed attempt releases voluntarily: attempts counts, takeovers does not.
    assert_eq!(s.record_failure(id, tok(20), "boom").await.unwrap(), 1);
    assert!(matches!(
        s.begin_step(id, tok(20), step(2)).await,
        Err(FenceError::Released { .. })
    ));
    assert!(matches!(
        s.claim(id, tok(20)).await,
        Err(FenceError::TokenRegression { .. })
    ));
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.released, row.attempts),
        (JobStatus::Pending, true, 1)
    );
    assert_eq!(row.last_error.as_deref(), Some("boom"));
    let c = s.claim(id, tok(30)).await.unwrap();
    assert_eq!(
        (c.step, c.takeovers, c.attempts, c.takeover),
        (step(2), 1, 1, false)
    );
    assert_eq!(c.checkpoint, Some(json!({"out": "b"})));

    // A graceful release: no takeover either; idempotent.
    s.record_release(id, tok(30)).await.unwrap();
    s.record_release(id, tok(30)).await.unwrap();
    let c = s.claim(id, tok(40)).await.unwrap();
    assert_eq!((c.takeovers, c.takeover), (1, false));

    // The last step marks the row done; a done job is not claimable (not stale).
    let (c, tx) = s.claim_and_begin(id, tok(50)).await.unwrap();
    assert!(c.takeover, "40 neither released nor failed");
    assert_eq!(c.takeovers, 2);
    tx.commit_step(&json!({"out": "c"}), true).await.unwrap();
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!((row.status, row.step), (JobStatus::Done, step(3)));
    let err = s.claim(id, tok(60)).await.unwrap_err();
    assert!(matches!(
        err,
        FenceError::Terminal {
            status: JobStatus::Done,
            ..
        }
    ));
    assert!(!err.is_fenced_out());
    assert!(matches!(
        s.begin_step(id, tok(50), step(3)).await,
        Err(FenceError::Terminal { .. })
    ));
    assert!(matches!(
        s.claim(JobId::from_key("x", "y"), tok(1)).await,
        Err(FenceError::NotFound(_))
    ));
}

/// Step 1's ledger write, then SQL of the step's own that changes its job row
/// (`UPDATE jobs SET <set>`): what makes the step CAS miss under a held row lock.
async fn write_then_touch_the_job_row(tx: &mut FencedTx, s: &FenceStore, id: JobId, set: &str) {
    write_ledger(tx.conn(), &ledger(s), id, 1, tok(10))
        .await
        .unwrap();
    sqlx::query(&format!(
        "UPDATE {}.jobs SET {set} WHERE id = $1",
        s.schema()
    ))
    .bind(id.as_uuid())
    .execute(tx.conn())
    .await
    .unwrap();
}

/// `commit_step_and_begin` sends the step CAS, `COMMIT`, `BEGIN` and the next
/// admission as one string with the output as a literal: the output comes back
/// byte for byte (quotes, backslashes, non-ASCII), the step's writes commit once,
/// and when the CAS matches no row nothing of the step commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_commit_keeps_the_output_exact_and_commits_nothing_when_the_cas_misses() {
    let s = store("chained").await;
    let table = ledger(&s);
    let id = new_job(&s, "chained").await;
    let (_, mut tx) = s.claim_and_begin(id, tok(10)).await.unwrap();
    write_ledger(tx.conn(), &table, id, 0, tok(10))
        .await
        .unwrap();
    let nasty = json!({
        "quote": "O'Brien said \"no\"; COMMIT; --",
        "backslashes": "C:\\temp\\ \\' \\\\",
        "dollar": "$$ $tenure$ E'x'",
        "unicode": "é ß 漢 \u{1F600}",
        "control": "tab\tnewline\n",
        "n": [1, 2.5, -3e10, null, true]
    });
    let mut tx1 = tx
        .commit_step_and_begin(&nasty, step(1))
        .await
        .unwrap()
        .expect("step 1 admitted in the same round trip");
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!((row.step, row.fence), (step(1), 10));
    assert_eq!(
        row.checkpoint.as_ref(),
        Some(&nasty),
        "the output round-trips exactly"
    );
    assert_eq!(ledger_rows(&s, id).await, vec![(0, 10)]);

    // Step 1 writes, then its own SQL moves the job row: the CAS misses, and
    // neither that write nor the row change commits.
    write_then_touch_the_job_row(&mut tx1, &s, id, "step = step + 5").await;
    let refused = tx1.commit_step_and_begin(&json!("b"), step(2)).await;
    assert!(
        matches!(refused, Err(FenceError::Corrupt { ref reason, .. }) if reason.contains("own SQL")),
        "{refused:?}"
    );
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!(row.step, step(1), "{row:?}");
    assert_eq!(ledger_rows(&s, id).await, vec![(0, 10)]);
    // The generation still holds the job: step 1 can run again. The same
    // refusal through `commit_step` (the last step's commit, also one string).
    let mut tx1 = s.begin_step(id, tok(10), step(1)).await.unwrap();
    write_then_touch_the_job_row(&mut tx1, &s, id, "checkpoint = 'null', step = 0").await;
    let refused = tx1.commit_step(&json!("b"), true).await;
    assert!(
        matches!(refused, Err(FenceError::Corrupt { ref reason, .. }) if reason.contains("own SQL")),
        "{refused:?}"
    );
    assert_eq!(ledger_rows(&s, id).await, vec![(0, 10)]);
    let mut tx1 = s.begin_step(id, tok(10), step(1)).await.unwrap();
    write_ledger(tx1.conn(), &table, id, 1, tok(10))
        .await
        .unwrap();
    tx1.commit_step(&json!("b"), true).await.unwrap();
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.step),
        (JobStatus::Done, step(2)),
        "{row:?}"
    );
    assert_eq!(row.checkpoint, Some(json!("b")));
    assert_eq!(ledger_rows(&s, id).await, vec![(0, 10), (1, 10)]);
    // Every connection the commits used went back to the pool usable, outside
    // any transaction.
    let mut held = Vec::new();
    for _ in 0..s.pool().size() {
        let mut conn = s.pool().acquire().await.unwrap();
        // SAVEPOINT works only inside a transaction block.
        let probe = conn.execute("SAVEPOINT probe").await;
        assert!(
            probe.is_err(),
            "a connection came back inside a transaction"
        );
        held.push(conn);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_and_begin_rollback_keeps_the_claim_and_drop_loses_it() {
    let s = store("cab").await;
    let id = new_job(&s, "cab").await;

    let (_, tx) = s.claim_and_begin(id, tok(7)).await.unwrap();
    tx.rollback().await.unwrap();
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!((row.fence, row.status), (7, JobStatus::Running));
    assert_eq!(
        s.record_failure(id, tok(7), "step failed").await.unwrap(),
        1
    );

    let (_, tx) = s.claim_and_begin(id, tok(8)).await.unwrap();
    drop(tx);
    assert_eq!(s.job(id).await.unwrap().unwrap().fence, 7);
    assert!(matches!(
        s.record_failure(id, tok(8), "x").await,
        Err(FenceError::NotClaimed { current: Some(c), .. }) if c == tok(7)
    ));

    // claim_and_begin under a token that already holds the fence: the alarm,
    // and the owner that holds it goes on.
    s.claim(id, tok(9)).await.unwrap();
    assert!(matches!(
        s.claim_and_begin(id, tok(9)).await,
        Err(FenceError::TokenRegression { job_id, token }) if job_id == id && token == tok(9)
    ));
    let tx = s.begin_step(id, tok(9), step(0)).await.unwrap();
    assert!(!tx.carries_claim());
    tx.commit_step(&json!(1), false).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_jobs_and_redrive() {
    let s = store("dead").await;
    let id = new_job(&s, "dead").await;
    s.claim(id, tok(3)).await.unwrap();
    s.begin_step(id, tok(3), step(0))
        .await
        .unwrap()
        .commit_step(&json!("s0"), false)
        .await
        .unwrap();
    assert_eq!(s.record_failure(id, tok(3), "e1").await.unwrap(), 1);
    // The released generation may still bury the job (retries exhausted).
    s.mark_dead(id, tok(3), "retries exhausted", false)
        .await
        .unwrap();
    s.mark_dead(id, tok(3), "again", false).await.unwrap();
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Dead);
    assert_eq!(row.last_error.as_deref(), Some("retries exhausted"));
    assert!(matches!(
        s.claim(id, tok(4)).await,
        Err(FenceError::Terminal {
            status: JobStatus::Dead,
            ..
        })
    ));
    s.mark_dead_unfenced(id, "broker gave up", false)
        .await
        .unwrap();
    assert_eq!(
        s.job(id).await.unwrap().unwrap().last_error.as_deref(),
        Some("retries exhausted")
    );

    s.reset_for_redrive(id).await.unwrap();
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.takeovers, row.attempts, row.step),
        (JobStatus::Pending, 0, 0, step(1))
    );
    assert!(matches!(
        s.reset_for_redrive(id).await,
        Err(FenceError::NotDead {
            status: JobStatus::Pending,
            ..
        })
    ));
    let c = s.claim(id, tok(4)).await.unwrap();
    assert_eq!(
        (c.step, c.takeover, c.checkpoint),
        (step(1), false, Some(json!("s0")))
    );

    // Fenced death by a stale token is refused; by the owner it works.
    assert_fenced_out(s.mark_dead(id, tok(3), "stale", false).await, 4);
    s.mark_dead(id, tok(4), "poison", false).await.unwrap();

    // Unfenced death: bad input on a job nobody ever claimed.
    let other = new_job(&s, "bad-input").await;
    s.mark_dead_unfenced(other, "payload does not deserialize", false)
        .await
        .unwrap();
    assert_eq!(s.job(other).await.unwrap().unwrap().status, JobStatus::Dead);
    assert!(matches!(
        s.mark_dead_unfenced(JobId::from_key("x", "none"), "r", false)
            .await,
        Err(FenceError::NotFound(_))
    ));
    assert!(matches!(
        s.reset_for_redrive(JobId::from_key("x", "none")).await,
        Err(FenceError::NotFound(_))
    ));
}

/// Latency of the two ways into a step. Prints, asserts nothing about speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_claim_and_begin_vs_claim_then_begin() {
    let s = store("latency").await;
    let id = new_job(&s, "latency").await;
    let mut t = 0i64;
    let mut k = 0u32;
    let mut fused = Vec::new();
    let mut separate = Vec::new();
    // Warm up the pool's connections and statement caches.
    for round in 0..220 {
        t += 1;
        let start = tokio::time::Instant::now();
        if round % 2 == 0 {
            let (c, tx) = s.claim_and_begin(id, tok(t)).await.unwrap();
            assert_eq!(c.step, step(k));
            tx.commit_step(&json!(k), false).await.unwrap();
            if round >= 20 {
                fused.push(start.elapsed());
            }
        } else {
            let c = s.claim(id, tok(t)).await.unwrap();
            assert_eq!(c.step, step(k));
            let tx = s.begin_step(id, tok(t), c.step).await.unwrap();
            tx.commit_step(&json!(k), false).await.unwrap();
            if round >= 20 {
                separate.push(start.elapsed());
            }
        }
        k += 1;
    }
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        let mean = v.iter().sum::<Duration>() / v.len() as u32;
        (mean, v[v.len() / 2], v[v.len() * 9 / 10])
    };
    let (fm, f50, f90) = stats(&mut fused);
    let (sm, s50, s90) = stats(&mut separate);
    println!(
        "claim_and_begin + commit_step:        mean {fm:?} p50 {f50:?} p90 {f90:?} (n={})",
        fused.len()
    );
    println!(
        "claim + begin_step + commit_step:     mean {sm:?} p50 {s50:?} p90 {s90:?} (n={})",
        separate.len()
    );
    assert_eq!(s.job(id).await.unwrap().unwrap().step, step(k));
}

// ---------------------------------------------------------------------------------
// Property test: random interleavings of claims and step commits from several
// tokens never advance a step under a token lower than the fence at that time, and
// commit every step index at most once.

const STEPS: u32 = 6;

#[derive(Debug, Clone)]
enum Action {
    /// Take a fresh token (the next "etcd revision") and claim with it.
    Claim { fused: bool },
    /// Run the next step: admission, a user write, a pause, then commit or roll back.
    Step { pause_ms: u8, commit: bool },
    /// Voluntary release of our generation.
    Release,
    /// Record a failure of our generation.
    Fail,
    /// Do nothing for a while.
    Pause { ms: u8 },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => any::<bool>().prop_map(|fused| Action::Claim { fused }),
        6 => (0u8..4, prop::bool::weighted(0.85)).prop_map(|(pause_ms, commit)| Action::Step { pause_ms, commit }),
        1 => Just(Action::Release),
        1 => Just(Action::Fail),
        2 => (0u8..4).prop_map(|ms| Action::Pause { ms }),
    ]
}

fn schedule() -> impl Strategy<Value = Vec<Vec<Action>>> {
    prop::collection::vec(prop::collection::vec(action(), 1..10), 2..5)
}

struct Prop {
    rt: tokio::runtime::Runtime,
    store: FenceStore,
    revision: AtomicI64,
}

fn prop_env() -> &'static Prop {
    static ENV: OnceLock<Prop> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let store = rt.block_on(async {
            let s = store("prop").await;
            // An audit of every change of every job row, in commit order per row
            // (the row lock serializes them), with the generation that made it.
            s.pool()
                .execute(
                    format!(
                        "CREATE TABLE {sc}.audit (n bigserial PRIMARY KEY, job uuid, \
                           old_fence bigint, new_fence bigint, old_step int, new_step int, \
                           writer text); \
                         CREATE FUNCTION {sc}.audit_jobs() RETURNS trigger LANGUAGE plpgsql AS $$ \
                         BEGIN \
                           INSERT INTO {sc}.audit (job, old_fence, new_fence, old_step, new_step, writer) \
                           VALUES (NEW.id, OLD.fence, NEW.fence, OLD.step, NEW.step, \
                                   current_setting('tenure.fence', true)); \
                           RETURN NULL; \
                         END $$; \
                         CREATE TRIGGER audit AFTER UPDATE ON {sc}.jobs \
                           FOR EACH ROW EXECUTE FUNCTION {sc}.audit_jobs();",
                        sc = s.schema()
                    )
                    .as_str(),
                )
                .await
                .unwrap();
            s.install_guard(&ledger(&s)).await.unwrap();
            s
        });
        Prop {
            rt,
            store,
            revision: AtomicI64::new(0),
        }
    })
}

async fn run_worker(s: FenceStore, id: JobId, actions: Vec<Action>, revision: &'static AtomicI64) {
    let table = ledger(&s);
    let mut token: Option<FencingToken> = None;
    let mut next = StepIndex::new(0);
    for a in actions {
        match a {
            Action::Claim { fused } => {
                let t = tok(revision.fetch_add(1, Ordering::SeqCst) + 1);
                if fused {
                    match s.claim_and_begin(id, t).await {
                        Ok((c, mut tx)) => {
                            token = Some(t);
                            write_ledger(tx.conn(), &table, id, c.step.get(), t)
                                .await
                                .expect("the guard admits the current generation");
                            let last = c.step.get() + 1 == STEPS;
                            tx.commit_step(&json!({"step": c.step.get(), "token": t.get()}), last)
                                .await
                                .expect("a claimed step commits: the row lock is ours");
                            next = c.step.next();
                        }
                        Err(e) => {
                            check_refusal(&e);
                            token = None;
                        }
                    }
                } else {
                    match s.claim(id, t).await {
                        Ok(c) => {
                            token = Some(t);
                            next = c.step;
                        }
                        Err(e) => {
                            check_refusal(&e);
                            token = None;
                        }
                    }
                }
            }
            Action::Step { pause_ms, commit } => {
                let Some(t) = token else { continue };
                match s.begin_step(id, t, next).await {
                    Ok(mut tx) => {
                        write_ledger(tx.conn(), &table, id, next.get(), t)
                            .await
                            .expect("the guard admits the current generation");
                        tokio::time::sleep(Duration::from_millis(pause_ms.into())).await;
                        if commit {
                            let last = next.get() + 1 == STEPS;
                            tx.commit_step(&json!({"step": next.get(), "token": t.get()}), last)
                                .await
                                .expect("an admitted step commits: the row lock is ours");
                            next = next.next();
                        } else {
                            tx.rollback().await.unwrap();
                        }
                    }
                    Err(e) => {
                        check_refusal(&e);
                        token = None;
                    }
                }
            }
            Action::Release => {
                if let Some(t) = token.take()
                    && let Err(e) = s.record_release(id, t).await
                {
                    check_refusal(&e);
                }
            }
            Action::Fail => {
                if let Some(t) = token.take()
                    && let Err(e) = s.record_failure(id, t, "random failure").await
                {
                    check_refusal(&e);
                }
            }
            Action::Pause { ms } => tokio::time::sleep(Duration::from_millis(ms.into())).await,
        }
    }
}

/// Refusals a worker may legitimately meet; anything else (I/O, corruption) fails.
fn check_refusal(e: &FenceError) {
    assert!(
        matches!(
            e,
            FenceError::FencedOut { .. } | FenceError::Terminal { .. }
        ),
        "unexpected error: {e:?}"
    );
}

async fn check_invariants(s: &FenceStore, id: JobId) {
    let audit: Vec<(i64, i64, i32, i32, Option<String>)> = sqlx::query_as(&format!(
        "SELECT old_fence, new_fence, old_step, new_step, writer FROM {}.audit WHERE job = $1 ORDER BY n",
        s.schema()
    ))
    .bind(id.as_uuid())
    .fetch_all(s.pool())
    .await
    .unwrap();
    let mut committed_by = Vec::new();
    let mut fence = 0i64;
    let mut steps = 0i32;
    for (old_fence, new_fence, old_step, new_step, writer) in &audit {
        assert_eq!(
            (*old_fence, *old_step),
            (fence, steps),
            "audit is the row's history"
        );
        assert!(new_fence >= old_fence, "the fence never goes down");
        if new_step != old_step {
            assert_eq!(*new_step, old_step + 1, "one step at a time");
            assert_eq!(new_fence, old_fence, "a step commit never moves the fence");
            let writer: i64 = writer
                .as_deref()
                .expect("a step commits in a FencedTx")
                .parse()
                .unwrap();
            assert_eq!(
                writer, *old_fence,
                "step {old_step} advanced under {writer}, fence was {old_fence}"
            );
            committed_by.push((*old_step, writer));
        }
        fence = *new_fence;
        steps = *new_step;
    }
    // Every step index committed at most once, with the user's writes of exactly
    // that generation.
    let rows = ledger_rows(s, id).await;
    assert_eq!(rows, committed_by, "user writes == committed steps");
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!(row.fence, fence);
    assert_eq!(row.step.get() as i32, steps);
    match committed_by.last() {
        Some((k, t)) => assert_eq!(row.checkpoint, Some(json!({"step": k, "token": t}))),
        None => assert_eq!(row.checkpoint, None),
    }
    assert_eq!(row.status == JobStatus::Done, row.step.get() == STEPS);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 40,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_interleavings_keep_the_fence(workers in schedule()) {
        let env = prop_env();
        let s = env.store.clone();
        env.rt.block_on(async {
            static CASE: AtomicI64 = AtomicI64::new(0);
            let n = CASE.fetch_add(1, Ordering::SeqCst);
            let id = new_job(&s, &format!("prop-{n}")).await;
            let mut tasks = Vec::new();
            for actions in workers {
                let s = s.clone();
                tasks.push(tokio::spawn(run_worker(s, id, actions, &env.revision)));
            }
            for t in tasks {
                t.await.expect("worker");
            }
            check_invariants(&s, id).await;
        });
    }
}

/// Issue 15, item 1: after an etcd snapshot restore without `--bump-revision` a
/// new lock can carry the `create_revision` an earlier owner already claimed. A
/// claim on a fresh lock must strictly raise the fence: an equal token is the
/// regression alarm, never "ours" (two owners would pass `fence = token`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equal_token_on_a_fresh_claim_is_a_revision_regression_not_ours() {
    let s = store("regress").await;
    let id = new_job(&s, "regress").await;
    // The earlier owner claims revision 77, commits step 0 and keeps running.
    let earlier = tok(77);
    let (_, tx) = s.claim_and_begin(id, earlier).await.unwrap();
    tx.commit_step(&json!("s0"), false).await.unwrap();

    // A second acquisition that etcd handed the same revision again.
    let again = tok(77);
    let res = s.claim(id, again).await;
    assert!(
        matches!(&res, Err(FenceError::TokenRegression { job_id, token }) if *job_id == id && *token == again),
        "an equal token on a fresh claim was accepted as ours: {res:?}"
    );
    let err = res.unwrap_err();
    assert!(err.is_token_regression() && !err.is_fenced_out());
    let res = s.claim_and_begin(id, again).await.map(|(c, _)| c);
    assert!(
        matches!(res, Err(FenceError::TokenRegression { .. })),
        "an equal token on a fresh claim_and_begin was accepted as ours: {res:?}"
    );
    // Also when the earlier owner had released: the token was still issued twice.
    s.record_release(id, earlier).await.unwrap();
    assert!(s.claim(id, again).await.unwrap_err().is_token_regression());
    let tx = s.claim_and_begin(id, tok(78)).await.unwrap().1;
    tx.rollback().await.unwrap();
    // A later revision claims normally; the refused claims changed nothing.
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!((row.fence, row.step, row.takeovers), (78, step(1), 0));
}

/// The downstream service of the gate tests: a `vms` table next to its fence
/// marks (both in `store`'s schema), each write admitted in its own transaction.
async fn gated_service(store: &FenceStore) -> TokenGate<PgFenceMarks> {
    gated_service_with(store, PgFenceMarks::new(store.schema()).unwrap()).await
}

async fn gated_service_with(store: &FenceStore, marks: PgFenceMarks) -> TokenGate<PgFenceMarks> {
    let mut conn = store.pool().acquire().await.unwrap();
    marks.install(&mut conn).await.unwrap();
    marks.install(&mut conn).await.unwrap();
    conn.execute(
        format!(
            "CREATE TABLE {}.vms (job uuid NOT NULL, token bigint NOT NULL)",
            store.schema()
        )
        .as_str(),
    )
    .await
    .unwrap();
    TokenGate::new(marks)
}

/// One service write under `token`: admission and insert in one transaction.
async fn service_write(
    gate: &TokenGate<PgFenceMarks>,
    store: &FenceStore,
    id: JobId,
    token: i64,
) -> Result<Admitted, GateError> {
    let mut tx = store.pool().begin().await?;
    let admitted = gate
        .admit(&mut tx, id, ObservedFence::new(token).unwrap())
        .await?;
    sqlx::query(&format!(
        "INSERT INTO {}.vms (job, token) VALUES ($1, $2)",
        store.schema()
    ))
    .bind(id.as_uuid())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(admitted)
}

async fn vm_tokens(store: &FenceStore, id: JobId) -> Vec<i64> {
    sqlx::query_scalar(&format!(
        "SELECT token FROM {}.vms WHERE job = $1 ORDER BY token",
        store.schema()
    ))
    .bind(id.as_uuid())
    .fetch_all(store.pool())
    .await
    .unwrap()
}

/// A gate orders callers, it does not authenticate them: anyone who reaches
/// the service can send the largest token. A verifying gate (tokens checked
/// against the job row's fence) refuses it, and the real owner goes on.
/// (With `PgFenceMarks::new` the forged token is admitted, the mark jumps to
/// `i64::MAX` and the owner's next write is refused as stale.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_maximum_token_cannot_poison_a_verifying_gate() {
    let s = store("gate_forged").await;
    let marks = PgFenceMarks::verified(s.schema(), s.schema()).unwrap();
    let gate = gated_service_with(&s, marks).await;
    let id = new_job(&s, "gate-forged").await;
    // Planted before the job runs (job ids are predictable), and while it runs.
    let early = service_write(&gate, &s, id, i64::MAX).await;
    assert!(
        matches!(early, Err(GateError::Unverified { .. })),
        "{early:?}"
    );
    s.claim(id, tok(41)).await.unwrap();
    let forged = service_write(&gate, &s, id, i64::MAX).await;
    assert!(
        matches!(forged, Err(GateError::Unverified { .. })),
        "{forged:?}"
    );
    assert_eq!(
        service_write(&gate, &s, id, 41).await.unwrap(),
        Admitted::First,
        "the owner's write"
    );
    assert_eq!(vm_tokens(&s, id).await, vec![41]);
    // A successor's real token is admitted; the stale owner then is not.
    s.claim(id, tok(42)).await.unwrap();
    assert!(matches!(
        service_write(&gate, &s, id, 42).await.unwrap(),
        Admitted::Raised { .. }
    ));
    assert!(matches!(
        service_write(&gate, &s, id, 41).await,
        Err(GateError::Stale(_))
    ));
}

/// Issue 15, item 2: a downstream service's gate must not forget a job's mark
/// while a paused owner can still wake up. A pauses after its service call; B
/// takes over and finishes the job; A wakes and calls the service again.
/// (Before the fix, following the old gate's advice to `forget` a finished job,
/// A's write was admitted as `First`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_paused_across_the_jobs_completion_is_refused_by_the_gate() {
    let s = store("gate").await;
    let id = new_job(&s, "gate").await;
    let gate = gated_service(&s).await;

    s.claim(id, tok(41)).await.unwrap();
    assert_eq!(
        service_write(&gate, &s, id, 41).await.unwrap(),
        Admitted::First
    );
    // A pauses. B takes over, calls the service, finishes the job.
    let (_, tx) = s.claim_and_begin(id, tok(42)).await.unwrap();
    assert_eq!(
        service_write(&gate, &s, id, 42).await.unwrap(),
        Admitted::Raised {
            previous: ObservedFence::new(41).unwrap()
        }
    );
    tx.commit_step(&json!("done"), true).await.unwrap();
    assert_eq!(s.job(id).await.unwrap().unwrap().status, JobStatus::Done);
    // Retention keeps the mark of a job that finished less than its age ago.
    let mut conn = s.pool().acquire().await.unwrap();
    let hour = Duration::from_secs(3600);
    assert_eq!(
        gate.marks()
            .prune(&mut conn, s.schema(), hour)
            .await
            .unwrap(),
        0
    );

    // A wakes up and writes again under 41: refused, and nothing is written.
    let late = service_write(&gate, &s, id, 41).await;
    assert!(
        matches!(&late, Err(GateError::Stale(st)) if st.ours == tok(41) && st.current == tok(42)),
        "the gate re-admitted a stale owner after the job finished: {late:?}"
    );
    assert_eq!(vm_tokens(&s, id).await, vec![41, 42]);
    assert_eq!(
        gate.marks().current(&mut conn, id).await.unwrap(),
        Some(tok(42).observed())
    );
    // Past the retention age the finished job's mark may go; a running job's never.
    let running = new_job(&s, "gate-running").await;
    s.claim(running, tok(50)).await.unwrap();
    service_write(&gate, &s, running, 50).await.unwrap();
    let pruned = gate
        .marks()
        .prune(&mut conn, s.schema(), Duration::ZERO)
        .await;
    assert_eq!(pruned.unwrap(), 1);
    assert_eq!(gate.marks().current(&mut conn, id).await.unwrap(), None);
    assert_eq!(
        gate.marks().current(&mut conn, running).await.unwrap(),
        Some(tok(50).observed())
    );
}

/// The gate's check is atomic with the service's write: while an owner's
/// admitted write is open, a newer owner's admission waits for it, and a stale
/// admission that lost writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_holds_its_mark_until_the_admitted_write_commits() {
    let s = store("gate_atomic").await;
    let id = new_job(&s, "gate-atomic").await;
    let gate = gated_service(&s).await;

    let mut tx41 = s.pool().begin().await.unwrap();
    let first = gate.admit(&mut tx41, id, tok(41).observed()).await.unwrap();
    assert_eq!(first, Admitted::First);
    let (g, st) = (gate.clone(), s.clone());
    let newer = tokio::spawn(async move { service_write(&g, &st, id, 43).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !newer.is_finished(),
        "43 was admitted while 41's write was open"
    );
    sqlx::query(&format!(
        "INSERT INTO {}.vms (job, token) VALUES ($1, 41)",
        s.schema()
    ))
    .bind(id.as_uuid())
    .execute(&mut *tx41)
    .await
    .unwrap();
    tx41.commit().await.unwrap();
    assert_eq!(
        newer.await.unwrap().unwrap(),
        Admitted::Raised {
            previous: tok(41).observed()
        }
    );
    assert!(
        service_write(&gate, &s, id, 42)
            .await
            .unwrap_err()
            .stale()
            .is_some()
    );
    assert_eq!(
        service_write(&gate, &s, id, 43).await.unwrap(),
        Admitted::Same
    );
    assert_eq!(vm_tokens(&s, id).await, vec![41, 43, 43]);
}

/// A refused stale step is noted in the job's history even when the store's
/// pool has a single connection: the note is written after the refused
/// transaction gave its connection back, not while it still holds it (issue 23
/// review: the note used to wait, inside the open transaction, for a second
/// connection, and with none free it timed out and the refusal went unrecorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stale_step_is_recorded_after_its_transaction_ends() {
    let wide = store("refusal_note").await;
    let id = new_job(&wide, "stale").await;
    wide.claim(id, tok(41)).await.unwrap();
    wide.claim(id, tok(42)).await.unwrap();

    let narrow = FenceStore::new(pool(1).await, wide.schema()).unwrap();
    let res = narrow.begin_step(id, tok(41), step(0)).await;
    assert_fenced_out(res, 42);

    let events = wide.job_events(id).await.unwrap();
    let refusals: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "stale_refused")
        .collect();
    assert_eq!(refusals.len(), 1, "one stale_refused event: {events:?}");
    assert_eq!(refusals[0].token, Some(41));
    assert_eq!(refusals[0].other_token, Some(42));
}

/// A store on `schema` whose connections are named `worker` (the writer the
/// history records).
async fn named_store(schema: &str, worker: &str) -> FenceStore {
    let opts = database_stack(false)
        .database_url()
        .parse::<sqlx::postgres::PgConnectOptions>()
        .unwrap()
        .application_name(worker);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(opts)
        .await
        .expect("connect");
    FenceStore::new(pool, schema).unwrap()
}

/// A job's history rides on its own row (issue 33.3): a job that ran to the
/// end, with a takeover on the way and a step rolled back, left no
/// `job_events` row (the trigger used to insert one per event), and its
/// timeline still tells every event in order with its writer, tokens and
/// counts; the window counts and the workers page read it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_history_is_kept_on_its_row() {
    let s = store("trail").await;
    let (w1, w2) = (
        named_store(s.schema(), "trail-w1").await,
        named_store(s.schema(), "trail-w2").await,
    );
    let id = new_job(&s, "trail").await;
    let (_, tx) = w1.claim_and_begin(id, tok(9)).await.unwrap();
    tx.commit_step(&json!({"k": 0}), false).await.unwrap();
    let tx = w1.begin_step(id, tok(9), step(1)).await.unwrap();
    tx.rollback().await.unwrap();
    let (_, tx) = w2.claim_and_begin(id, tok(10)).await.unwrap();
    tx.commit_step(&json!({"k": 1}), false).await.unwrap();
    let tx = w2.begin_step(id, tok(10), step(2)).await.unwrap();
    tx.commit_step(&json!({"k": 2}), true).await.unwrap();

    let rows: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {}.job_events WHERE job_id = $1",
        s.schema()
    ))
    .bind(id.as_uuid())
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert_eq!(rows, 0, "history rows written beside the job row");
    let events = s.job_events(id).await.unwrap();
    type Seen<'a> = (
        &'a str,
        Option<i32>,
        Option<&'a str>,
        Option<i64>,
        Option<i32>,
    );
    let seen: Vec<Seen<'_>> = events
        .iter()
        .map(|e| {
            (
                e.kind.as_str(),
                e.step,
                e.worker.as_deref(),
                e.token,
                e.takeovers,
            )
        })
        .collect();
    let (one, two) = (Some("trail-w1"), Some("trail-w2"));
    assert_eq!(
        seen,
        [
            ("enqueued", Some(0), None, Some(0), Some(0)),
            ("claimed", Some(0), one, Some(9), Some(0)),
            ("step", Some(0), one, Some(9), Some(0)),
            ("taken_over", Some(1), two, Some(10), Some(1)),
            ("step", Some(1), two, Some(10), Some(1)),
            ("step", Some(2), two, Some(10), Some(1)),
            ("done", Some(3), two, Some(10), Some(1)),
        ],
        "{events:?}"
    );
    assert_eq!(
        events[3].other_token,
        Some(9),
        "the takeover's fence before"
    );

    let recent = s.overview(Duration::from_secs(600)).await.unwrap().recent;
    assert_eq!((recent.steps, recent.done, recent.takeovers), (3, 1, 1));
    let workers = s.workers_seen(Duration::from_secs(600)).await.unwrap();
    let counts: Vec<(&str, i64, i64)> = workers
        .iter()
        .filter(|w| w.worker.starts_with("trail-"))
        .map(|w| (w.worker.as_str(), w.claims, w.steps))
        .collect();
    assert_eq!(counts, [("trail-w1", 1, 1), ("trail-w2", 1, 2)]);
}

/// A job enqueued before migration 0024 keeps its events in `job_events`
/// and has no trail: its timeline is those rows, then what happened since on
/// its row, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_from_before_the_trail_keeps_its_earlier_events() {
    let s = store("trail_legacy").await;
    let id = new_job(&s, "legacy").await;
    let ns = s.schema();
    for sql in [
        format!("UPDATE {ns}.jobs SET trail = NULL WHERE id = $1"),
        format!(
            "INSERT INTO {ns}.job_events (job_id, at, kind, token, step, worker) \
             VALUES ($1, now() - interval '1 day', 'enqueued', 0, 0, 'old-producer')"
        ),
    ] {
        sqlx::query(&sql)
            .bind(id.as_uuid())
            .execute(s.pool())
            .await
            .unwrap();
    }
    let (_, tx) = s.claim_and_begin(id, tok(3)).await.unwrap();
    tx.commit_step(&json!({"k": 0}), true).await.unwrap();
    let kinds: Vec<(String, bool)> = s
        .job_events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.seq.is_some()))
        .collect();
    let expect = [
        ("enqueued", true),
        ("claimed", false),
        ("step", false),
        ("done", false),
    ];
    assert_eq!(kinds, expect.map(|(k, row)| (k.to_string(), row)));
}

/// The job history can be switched off and on for a schema, and pruned: with
/// the trigger off a claim and a step commit leave no event (the fence works
/// the same), with it on again they do; pruning by age deletes old events only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_history_switches_off_and_on_and_prunes_by_age() {
    let s = store("history_switch").await;
    assert!(s.job_history().await.unwrap());
    s.set_job_history(false).await.unwrap();
    s.set_job_history(false).await.unwrap(); // idempotent
    assert!(!s.job_history().await.unwrap());

    let quiet = new_job(&s, "quiet").await;
    let (_, tx) = s.claim_and_begin(quiet, tok(7)).await.unwrap();
    tx.commit_step(&json!({"k": 0}), false).await.unwrap();
    assert_eq!(s.job_events(quiet).await.unwrap(), vec![]);
    // The history's switch never takes the update wall with it (one trigger
    // runs both since migration 0025): a fence still only rises.
    let lower = format!("UPDATE {}.jobs SET fence = 1 WHERE id = $1", s.schema());
    let err = sqlx::query(&lower)
        .bind(quiet.as_uuid())
        .execute(s.pool())
        .await;
    let err = FenceError::from(err.expect_err("a fence lowered by hand"));
    assert!(matches!(err, FenceError::ProtocolRefused { .. }), "{err:?}");

    s.set_job_history(true).await.unwrap();
    assert!(s.job_history().await.unwrap());
    let loud = new_job(&s, "loud").await;
    let (_, tx) = s.claim_and_begin(loud, tok(8)).await.unwrap();
    tx.commit_step(&json!({"k": 0}), false).await.unwrap();
    let kinds: Vec<String> = s
        .job_events(loud)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["enqueued", "claimed", "step"]);

    assert_eq!(
        s.prune_job_events(Duration::from_secs(3600)).await.unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        s.prune_job_events(Duration::from_millis(10)).await.unwrap(),
        3
    );
    assert_eq!(s.job_events(loud).await.unwrap(), vec![]);
}

/// A fenced transaction whose begin is abandoned half way (the caller's
/// future dropped once sqlx has queued or sent the `BEGIN`, before the
/// answer: a step cancelled at shutdown, a leader stepping down) must not
/// go back to the pool inside a transaction. Every autocommit write on that
/// connection after it (a release, a failure record) would be held in that
/// transaction and lost when the pool closes it: sqlx 0.8.6 counts a
/// transaction only once the server answered its `BEGIN`, so its own
/// rollback guard does nothing then. Found as a graceful shutdown's
/// release that never landed (`versions.rs`, about 1 run in 30 under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_abandoned_half_way_leaves_no_connection_in_a_transaction() {
    use std::str::FromStr;
    let app = format!("abandoned-begin-{}", std::process::id());
    let url = database_stack(false).database_url();
    let options = sqlx::postgres::PgConnectOptions::from_str(&url)
        .unwrap()
        .application_name(&app);
    let pooled = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    let store = FenceStore::new(pooled, &DevStack::unique_namespace("abandon")).unwrap();
    store.migrate().await.unwrap();
    let id = new_job(&store, "abandoned").await;
    store.claim(id, tok(5)).await.unwrap();
    let observer = pool(1).await;
    let stuck_now = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity \
              WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
        )
        .bind(&app)
        .fetch_one(&observer)
        .await
        .unwrap()
    };
    let mut stuck_seen = 0;
    for i in 0..200u64 {
        let begin = store.begin_step(id, tok(5), step(0));
        let _ = tokio::time::timeout(Duration::from_micros(i % 50 * 20), begin).await;
        // Dropped transactions and connections go back to the pool in tasks,
        // which a loaded machine may run later than 20 ms (`make test`,
        // 2026-12-07): one seen inside a transaction counts only if it still
        // is half a second on, with nothing else using the pool meanwhile.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if stuck_now().await > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            stuck_seen += stuck_now().await;
        }
    }
    let stuck = stuck_seen;
    assert_eq!(
        stuck, 0,
        "pooled connections seen left inside a transaction"
    );
}

/// Statistics that saw no live job (a table of finished jobs, analysed in a
/// quiet moment) make `status = 'running'` look as selective as the primary
/// key: the admission's, the step CAS's and the claim's lookups of a live
/// job by id must still take the primary key (migration 0023), not a status
/// index whose `running` entries they would all read (issue 33.6: 77 more
/// buffer hits per job with a million finished rows). Generic plans, as the
/// definer functions' cached ones.
#[tenure::test]
async fn a_live_jobs_lookups_by_id_take_the_primary_key_whatever_the_statistics(
    env: tenure::testing::TestEnv,
) {
    let store = env.client().store();
    store
        .insert_synthetic_jobs("t.finished", 5000)
        .await
        .expect("finished rows");
    let t = format!("\"{}\".jobs", env.namespace());
    let mut conn = store.pool().acquire().await.expect("conn");
    for sql in [
        format!("ANALYZE {t}"),
        "SET plan_cache_mode = force_generic_plan".to_string(),
        format!(
            "PREPARE admission(uuid, bigint, int) AS SELECT 1 FROM {t} WHERE id = $1 \
             AND fence = $2 AND step = $3 AND status = 'running' AND NOT released FOR UPDATE"
        ),
        format!(
            "PREPARE step_cas(uuid, bigint, int) AS UPDATE {t} SET step = step + 1 \
             WHERE id = $1 AND fence = $2 AND step = $3 AND status = 'running' AND NOT released"
        ),
        format!(
            "PREPARE claim(uuid, bigint, int) AS SELECT 1 FROM {t} WHERE id = $1 \
             AND fence < $2 AND step >= $3 AND status IN ('pending', 'running') FOR UPDATE"
        ),
        // Retention's pick (`tenure_prune_jobs`) keeps an index to walk.
        format!(
            "PREPARE prune(text, timestamptz, int) AS SELECT id FROM {t} \
             WHERE status IN ('done', 'dead', 'cancelled') AND status = $1 \
               AND created_at < $2 AND updated_at < $2 AND compensation <> 'pending' \
             ORDER BY status, created_at, id LIMIT $3 FOR UPDATE SKIP LOCKED"
        ),
    ] {
        sqlx::query(&sql).execute(&mut *conn).await.expect(&sql);
    }
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN (COSTS OFF) EXECUTE prune('done', now(), 100)")
            .fetch_all(&mut *conn)
            .await
            .expect("explain");
    let plan = plan.join("\n");
    assert!(!plan.contains("Seq Scan"), "prune:\n{plan}");
    for name in ["admission", "step_cas", "claim"] {
        let plan: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (COSTS OFF) EXECUTE {name}('{}', 1, 0)",
            sqlx::types::Uuid::nil()
        ))
        .fetch_all(&mut *conn)
        .await
        .expect("explain");
        let plan = plan.join("\n");
        assert!(
            plan.contains("jobs_pkey") && !plan.contains("status_created"),
            "{name}:\n{plan}"
        );
    }
}

/// What PostgreSQL parses again in every statement that writes `jobs`: its
/// CHECK constraints, kept as text and read into expression trees per
/// statement, never cached (seven of them cost 32% of a three-step job's
/// PostgreSQL instructions). Since migration 0027 the row triggers test the
/// same values, so that text is empty; a CHECK added back would show here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_jobs_parses_no_check_expression() {
    let s = store("no_checks").await;
    let (checks, text): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(length(conbin::text)), 0)::bigint FROM pg_constraint
          WHERE conrelid = to_regclass(format('%I.jobs', $1)) AND contype = 'c'",
    )
    .bind(s.schema())
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert_eq!((checks, text), (0, 0), "CHECK constraints on jobs");
}

/// The row's values are refused out of range for every writer, the owner
/// included, on insert and on update: SQLSTATE 23514 naming the column's
/// constraint, as the CHECK constraints did before migration 0027.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_rows_values_out_of_range_are_refused_for_every_writer() {
    let s = store("values").await;
    let id = new_job(&s, "v").await;
    let refused = |what: &str, e: sqlx::Error| {
        let db = e.as_database_error().expect("a database error");
        assert_eq!(db.code().as_deref(), Some("23514"), "{what}: {db}");
        db.constraint().map(str::to_owned)
    };
    for (set, constraint) in [
        ("step = -1", "jobs_step_check"),
        ("attempts = -1", "jobs_attempts_check"),
        ("takeovers = -1", "jobs_takeovers_check"),
        ("status = 'bogus'", "jobs_status_check"),
        ("compensation = 'maybe'", "jobs_compensation_check"),
        ("priority = 'urgent'", "jobs_priority_level"),
    ] {
        let sql = format!("UPDATE {}.jobs SET {set} WHERE id = $1", s.schema());
        let err = sqlx::query(&sql).bind(id.as_uuid()).execute(s.pool()).await;
        let name = refused(set, err.expect_err(set));
        assert_eq!(name.as_deref(), Some(constraint), "{set}");
    }
    for (column, value, constraint) in [
        ("fence", "-1", "jobs_fence_check"),
        ("step", "-1", "jobs_step_check"),
        ("status", "'bogus'", "jobs_status_check"),
        ("compensation", "'maybe'", "jobs_compensation_check"),
        ("priority", "'urgent'", "jobs_priority_level"),
    ] {
        let sql = format!(
            "INSERT INTO {}.jobs (id, job_type, input, {column}) \
             VALUES (gen_random_uuid(), 'test.job', '{{}}', {value})",
            s.schema()
        );
        let err = sqlx::query(&sql).execute(s.pool()).await;
        let name = refused(column, err.expect_err(column));
        assert_eq!(name.as_deref(), Some(constraint), "{column}");
    }
    let row = s.job(id).await.unwrap().unwrap();
    assert_eq!((row.step, row.attempts), (step(0), 0), "nothing changed");
    // The update wall speaks first, as it did while the checks were
    // constraints (a row trigger runs before them): a fence below the old
    // one, or a done job set to a bad status, is the protocol's refusal.
    let (_, tx) = s.claim_and_begin(id, tok(7)).await.unwrap();
    tx.commit_step(&json!({"k": 0}), true).await.unwrap();
    for set in ["fence = -1", "status = 'bogus'"] {
        let sql = format!("UPDATE {}.jobs SET {set} WHERE id = $1", s.schema());
        let err = sqlx::query(&sql).bind(id.as_uuid()).execute(s.pool()).await;
        let err = FenceError::from(err.expect_err(set));
        assert!(
            matches!(err, FenceError::ProtocolRefused { .. }),
            "{set}: {err:?}"
        );
    }
}
