//! MariaDB as a fenced resource (issue 22), against the dev stack's real
//! MariaDB 10.11: a stale token's write is refused, the guard refuses writes
//! outside a fenced transaction, and a crash between the MySQL commit and the
//! PostgreSQL checkpoint moves the money once (fence + idempotency key).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::mysql::MySqlPool;
use tenure::blocks::fence::{FenceStore, Inserted};
use tenure::devstack::DevStack;
use tenure::job::StepCtx;
use tenure::{FencingToken, JobId, StepIndex};
use tenure::{MySqlFence, MySqlFenceError};
use tenure_tests::database_stack;
use tokio::sync::Barrier;

fn tok(n: i64) -> FencingToken {
    FencingToken::for_tests(n)
}

/// A migrated fence on a fresh database with a guarded `accounts` table
/// (account 1 holds 100) and an unguarded `applied` table of idempotency keys.
async fn bank(prefix: &str) -> MySqlFence {
    let db = DevStack::unique_namespace(prefix);
    let url = database_stack(true)
        .create_mysql_database(&db)
        .await
        .expect("database");
    let fence = MySqlFence::connect(
        &db,
        &url,
        &tenure::Config::new("t").with_lease_ttl(Duration::from_secs(5)),
    )
    .await
    .expect("connect");
    fence.migrate().await.expect("migrate");
    sqlx::raw_sql(
        "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB;
         INSERT INTO accounts VALUES (1, 100);
         CREATE TABLE applied (idem_key VARCHAR(200) PRIMARY KEY) ENGINE=InnoDB;",
    )
    .execute(fence.pool())
    .await
    .expect("tables");
    fence.install_guard("accounts").await.expect("guard");
    fence
}

async fn balance(pool: &MySqlPool) -> i64 {
    sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The step's write: debit 10 once per idempotency key, in `fence`'s fenced
/// transaction for `job` under `token`, committed.
async fn debit(
    fence: &MySqlFence,
    job: JobId,
    token: FencingToken,
    key: &str,
) -> Result<(), MySqlFenceError> {
    let mut tx = fence.begin(job, token).await?;
    let fresh = sqlx::query("INSERT IGNORE INTO applied (idem_key) VALUES (?)")
        .bind(key)
        .execute(tx.conn())
        .await?
        .rows_affected();
    if fresh == 1 {
        sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
            .execute(tx.conn())
            .await?;
    }
    tx.commit().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_tokens_write_is_refused_by_mariadb() {
    let fence = bank("stale").await;
    let job = JobId::from_key("test.mysql", "stale");
    debit(&fence, job, tok(9), "k1").await.expect("owner 9");
    let err = debit(&fence, job, tok(5), "k2").await.unwrap_err();
    match err {
        MySqlFenceError::FencedOut { ours, current, .. } => {
            assert_eq!(ours.get(), 5);
            assert_eq!(i64::from(current), 9);
        }
        other => panic!("expected FencedOut, got {other:?}"),
    }
    assert_eq!(balance(fence.pool()).await, 90, "only owner 9's debit");
    assert_eq!(i64::from(fence.fence_of(job).await.unwrap().unwrap()), 9);
    // An equal token is the same owner: admitted again.
    debit(&fence, job, tok(9), "k3")
        .await
        .expect("owner 9 again");
    assert_eq!(balance(fence.pool()).await, 80);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_refuses_writes_outside_a_fenced_transaction() {
    let fence = bank("guard").await;
    let job = JobId::from_key("test.mysql", "guard");
    let plain = sqlx::query("UPDATE accounts SET balance = 0 WHERE id = 1")
        .execute(fence.pool())
        .await
        .unwrap_err();
    assert!(
        tenure::blocks::fence::mysql::is_mysql_guard_refusal(&plain),
        "{plain}"
    );
    assert!(matches!(
        MySqlFenceError::from(plain),
        MySqlFenceError::GuardRefused { .. }
    ));
    // Inside a fenced transaction the same statement goes through; on the same
    // connection after the commit it is refused again.
    let mut tx = fence.begin(job, tok(3)).await.unwrap();
    sqlx::query("UPDATE accounts SET balance = 50 WHERE id = 1")
        .execute(tx.conn())
        .await
        .expect("fenced write");
    tx.commit().await.unwrap();
    let mut conn = fence.pool().acquire().await.unwrap();
    let after = sqlx::query("DELETE FROM accounts WHERE id = 1")
        .execute(&mut *conn)
        .await;
    assert!(after.is_err(), "a write after the fenced commit passed");
    // A transaction whose token a newer owner overtook since its admission
    // cannot happen (the row lock), but a marker with an old token can be
    // forged by hand: the guard compares it with the fence.
    debit(&fence, job, tok(8), "k").await.unwrap();
    let forged = sqlx::raw_sql(&format!(
        "BEGIN; REPLACE INTO tenure_fence_tx VALUES (CONNECTION_ID(), '{}', 3); \
         UPDATE accounts SET balance = 0 WHERE id = 1; COMMIT;",
        job.as_uuid()
    ))
    .execute(fence.pool())
    .await;
    assert!(forged.is_err(), "a stale marker let a write through");
    assert_eq!(balance(fence.pool()).await, 40);
    assert!(matches!(
        fence.install_guard("accounts; DROP TABLE x").await,
        Err(MySqlFenceError::BadTableName(_))
    ));
}

/// A newer owner's admission waits for the older owner's open transaction;
/// the older one commits first, the newer one then wins and the older one is
/// refused from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_serialize_on_the_fence_row() {
    let fence = bank("serial").await;
    let job = JobId::from_key("test.mysql", "serial");
    let mut old = fence.begin(job, tok(5)).await.unwrap();
    let newer = {
        let fence = fence.clone();
        tokio::spawn(async move { debit(&fence, job, tok(7), "new").await })
    };
    sqlx::query("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
        .execute(old.conn())
        .await
        .unwrap();
    old.commit()
        .await
        .expect("the older owner held the row first");
    newer.await.unwrap().expect("the newer owner after it");
    assert_eq!(balance(fence.pool()).await, 89);
    assert!(
        debit(&fence, job, tok(5), "old-again")
            .await
            .unwrap_err()
            .is_fenced_out()
    );
}

/// The two commits of a step that writes to MariaDB: the MySQL write commits,
/// the owner crashes before its PostgreSQL checkpoint. A newer owner claims,
/// re-runs the step with the same idempotency key (a no-op at MySQL) and
/// checkpoints; the old owner is refused at both databases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_mysql_commit_and_the_checkpoint_moves_the_money_once() {
    let fence = bank("crash").await;
    let ns = DevStack::unique_namespace("crash");
    let cfg = tenure::Config::new(ns.clone())
        .with_schema(ns)
        .with_database_url(database_stack(true).database_url());
    let store = FenceStore::connect(&cfg).await.unwrap();
    store.migrate().await.unwrap();
    let job = JobId::from_key("test.mysql", "crash");
    let ins = store
        .insert_job(job, "test.mysql", &json!({}))
        .await
        .unwrap();
    assert_eq!(ins, Inserted::New);
    let key = StepCtx::detached_for_tests(job, StepIndex::new(0), tok(1)).idempotency_key("debit");

    // Owner 11: claim, MySQL write committed, then the crash (its PostgreSQL
    // transaction ends without the checkpoint).
    let (claim, pg) = store.claim_and_begin(job, tok(11)).await.unwrap();
    assert_eq!(claim.step.get(), 0);
    debit(&fence, job, tok(11), &key).await.unwrap();
    drop(pg);
    assert_eq!(balance(fence.pool()).await, 90);

    // Owner 12 resumes at step 0: the same key makes its MySQL write a no-op.
    let (claim, pg) = store.claim_and_begin(job, tok(12)).await.unwrap();
    assert_eq!(claim.step.get(), 0, "the checkpoint never committed");
    debit(&fence, job, tok(12), &key).await.unwrap();
    pg.commit_step(&json!({"debited": true}), true)
        .await
        .unwrap();
    assert_eq!(balance(fence.pool()).await, 90, "the money moved once");

    // Owner 11 wakes up: refused at MySQL and at PostgreSQL.
    assert!(
        debit(&fence, job, tok(11), &key)
            .await
            .unwrap_err()
            .is_fenced_out()
    );
    let row = store.job(job).await.unwrap().unwrap();
    assert_eq!((row.step.get(), row.fence), (1, 12));
}

/// Rounds of [`two_concurrent_admissions_of_one_job_wait_and_never_deadlock`].
const RACE_ROUNDS: i64 = 50;
/// How long an admitted owner holds the fence row before it commits.
const RACE_HOLD: Duration = Duration::from_millis(15);

/// One owner of a race: when it was admitted and started its commit, or why
/// not (and when it was told).
struct Raced {
    token: FencingToken,
    outcome: Result<(Instant, Instant), (Instant, MySqlFenceError)>,
}

/// Admits `token` for `job` once `start` opens, holds the row for
/// [`RACE_HOLD`], commits.
async fn admit_hold_commit(
    fence: MySqlFence,
    job: JobId,
    token: FencingToken,
    start: Arc<Barrier>,
) -> Raced {
    start.wait().await;
    let outcome = match fence.begin(job, token).await {
        Ok(tx) => {
            let admitted = Instant::now();
            tokio::time::sleep(RACE_HOLD).await;
            let committing = Instant::now();
            match tx.commit().await {
                Ok(()) => Ok((admitted, committing)),
                Err(e) => Err((Instant::now(), e)),
            }
        }
        Err(e) => Err((Instant::now(), e)),
    };
    Raced { token, outcome }
}

/// Two owners (tokens `low` < `high`) admit `job` at once. What went wrong,
/// if anything: the larger token is always admitted; the smaller one is
/// admitted only after the larger one's commit started (or before: then the
/// larger waits), or refused as fenced out by `high` after that commit.
async fn race(fence: &MySqlFence, job: JobId, low: i64, high: i64) -> Option<String> {
    let start = Arc::new(Barrier::new(2));
    let spawn = |t| tokio::spawn(admit_hold_commit(fence.clone(), job, tok(t), start.clone()));
    let (a, b) = (spawn(low), spawn(high));
    let both = tokio::time::timeout(Duration::from_secs(30), async {
        (a.await.unwrap(), b.await.unwrap())
    });
    let Ok((low, high)) = both.await else {
        return Some("an admission never ended".into());
    };
    let (h_admitted, h_committing) = match high.outcome {
        Ok(held) => held,
        Err((_, e)) => return Some(format!("token {}: {e}", high.token.get())),
    };
    match low.outcome {
        Ok((l_admitted, l_committing)) => {
            let waited = l_admitted >= h_committing || h_admitted >= l_committing;
            (!waited).then(|| "both held the fence row at once".into())
        }
        Err((told, MySqlFenceError::FencedOut { current, .. })) => {
            if i64::from(current) != high.token.get() {
                Some(format!(
                    "fenced out by {}, not {}",
                    i64::from(current),
                    high.token.get()
                ))
            } else {
                (told < h_committing).then(|| "refused before the owner ahead committed".into())
            }
        }
        Err((_, e)) => Some(format!("token {}: {e}", low.token.get())),
    }
}

/// Two owners admit the same job at the same moment (issue 30.11), on a job
/// whose fence row does not exist yet and on one whose row does: one waits
/// for the other's commit, neither deadlocks (MariaDB 1213), and the second
/// is either admitted after the first committed or refused as fenced out by
/// the first's larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_admissions_of_one_job_wait_and_never_deadlock() {
    let fence = bank("race").await;
    let existing = JobId::from_key("test.mysql", "race-existing");
    fence
        .begin(existing, tok(1))
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    let mut failures = Vec::new();
    for round in 0..RACE_ROUNDS {
        let fresh = JobId::from_key("test.mysql", &format!("race-{round}"));
        if let Some(f) = race(&fence, fresh, 1, 2).await {
            failures.push(format!("round {round}, new row: {f}"));
        }
        let base = 10 * (round + 1);
        if let Some(f) = race(&fence, existing, base + 1, base + 2).await {
            failures.push(format!("round {round}, existing row: {f}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} races failed:\n{}",
        failures.len(),
        2 * RACE_ROUNDS,
        failures.join("\n")
    );
    let last = fence.fence_of(existing).await.unwrap().unwrap();
    assert_eq!(i64::from(last), 10 * RACE_ROUNDS + 2);
}

/// What `MySqlFence::connect` reads as a server without the idle bound
/// (MySQL 8 answers `SET SESSION idle_transaction_timeout` so): an unknown
/// system variable is error 1193 on MariaDB too, and MariaDB 10.11 itself
/// has the setting, so connecting to it is not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_session_variable_is_error_1193_and_mariadb_has_the_idle_bound() {
    let fence = bank("vars").await;
    let err = sqlx::query("SET SESSION tenure_no_such_variable = 1")
        .execute(fence.pool())
        .await
        .unwrap_err();
    let number = err
        .as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|d| d.number());
    assert_eq!(number, Some(1193), "{err}");
    let idle: u64 = sqlx::query_scalar("SELECT @@SESSION.idle_transaction_timeout")
        .fetch_one(fence.pool())
        .await
        .unwrap();
    assert_eq!(
        idle, 5,
        "the pool's sessions end an idle transaction after a TTL"
    );
}
