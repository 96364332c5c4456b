//! The fence across a PostgreSQL failover (issue 36, items 2 and 3): the dev
//! stack's primary with a streaming standby behind a re-pointable front
//! (`DevStackOptions::postgres_standby`). Owner A (token 41) holds a job;
//! owner B raises the fence to 42 while the standby's replication link is
//! cut; the primary is killed, the standby promoted and the front pointed at
//! it. Then A, now stale, tries to commit a step.
//!
//! * Synchronous replication: B's raise is not acknowledged while the
//!   standby cannot have it, so every raise B saw succeed is on the promoted
//!   standby and A is refused. Run with asynchronous replication, the same
//!   test fails (that is the point of it).
//! * Asynchronous replication (the negative control): B's raise is
//!   acknowledged, committed on the old primary only, missing on the
//!   promoted standby, and A's stale step commits: a fencing violation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use tenure::blocks::fence::{FenceError, FenceStore, Inserted};
use tenure::devstack::{DevStack, DevStackOptions, Replication, wait_until};
use tenure::{FencingToken, JobId, StepIndex};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A stack of PostgreSQL alone, with a standby replicating as `replication`.
async fn stack(replication: Replication) -> DevStack {
    DevStack::start_with(DevStackOptions {
        etcd: false,
        nats: false,
        postgres_standby: Some(replication),
        ..DevStackOptions::default()
    })
    .await
    .expect("a primary and a standby")
}

/// A migrated store in a fresh schema, through the front.
async fn store(stack: &DevStack) -> FenceStore {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(TIMEOUT)
        .connect(&stack.database_url())
        .await
        .expect("connect through the front");
    let store = FenceStore::new(pool, &DevStack::unique_namespace("pgha")).unwrap();
    store.migrate().await.expect("migrate");
    store
}

fn tok(n: i64) -> FencingToken {
    FencingToken::for_tests(n)
}

/// A job claimed by owner A (token 41), replicated to the standby.
async fn job_of_a(stack: &DevStack, store: &FenceStore, key: &str) -> JobId {
    let id = JobId::from_key("test.pgha", key);
    let ins = store.insert_job(id, "test.pgha", &json!({})).await.unwrap();
    assert_eq!(ins, Inserted::New);
    store.claim(id, tok(41)).await.expect("A claims");
    stack
        .wait_postgres_standby_caught_up(TIMEOUT)
        .await
        .unwrap();
    id
}

/// The job's fence on the server on `port` itself (not through the front).
async fn fence_on(port: u16, store: &FenceStore, id: JobId) -> i64 {
    use sqlx::Connection;
    let url = format!("postgres://postgres@127.0.0.1:{port}/tenure?sslmode=disable");
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let sql = format!("SELECT fence FROM {}.jobs WHERE id = $1", store.schema());
    let fence = sqlx::query_scalar(&sql)
        .bind(id.as_uuid())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let _ = conn.close().await;
    fence
}

/// Whether a session on the primary waits for the synchronous standby.
async fn waits_for_standby(port: u16) -> bool {
    use sqlx::Connection;
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable");
    let Ok(mut conn) = sqlx::PgConnection::connect(&url).await else {
        return false;
    };
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            .fetch_one(&mut conn)
            .await
            .unwrap_or(0);
    let _ = conn.close().await;
    n > 0
}

/// What happened to B's raise and to A's stale step across the failover.
#[derive(Debug)]
struct Outcome {
    /// B's claim (token 42) returned success.
    raise_acknowledged: bool,
    /// The fence a new session read on the old primary just before it was
    /// killed.
    fence_on_old_primary: i64,
    /// The fence on the promoted standby.
    fence_after_failover: i64,
    /// A's step under token 41: committed (`Ok`) or refused.
    stale_step: Result<(), FenceError>,
}

/// Cuts the standby's replication link, lets B raise the fence to 42, fails
/// over, and has A (token 41) commit step 0 on the promoted standby.
async fn raise_across_failover(stack: &mut DevStack, store: &FenceStore) -> Outcome {
    let id = job_of_a(stack, store, "raised-then-failover").await;
    stack.cut_postgres_replication(TIMEOUT).await.unwrap();
    let b = store.clone();
    let raise = tokio::spawn(async move { b.claim(id, tok(42)).await });
    let primary = stack.postgres_primary_port();
    // The raise is committed on the primary: acknowledged, or waiting for
    // the (unreachable) synchronous standby.
    let committed = wait_until(TIMEOUT, || async {
        raise.is_finished() || waits_for_standby(primary).await
    })
    .await;
    assert!(
        committed,
        "B's raise neither returned nor waits for the standby"
    );
    let fence_on_old_primary = fence_on(primary, store, id).await;
    let failover = stack.postgres_failover(TIMEOUT).await.expect("failover");
    eprintln!("failover: {failover:?}");
    let raised = tokio::time::timeout(TIMEOUT, raise)
        .await
        .expect("B's claim ends");
    let raise_acknowledged = matches!(raised, Ok(Ok(_)));
    let fence_after_failover = store.job(id).await.unwrap().expect("the job row").fence;
    let stale_step = stale_step(store, id).await;
    Outcome {
        raise_acknowledged,
        fence_on_old_primary,
        fence_after_failover,
        stale_step,
    }
}

/// A's step 0 under its stale token 41, with a step output: `Ok` if it
/// committed.
async fn stale_step(store: &FenceStore, id: JobId) -> Result<(), FenceError> {
    let tx = store.begin_step(id, tok(41), StepIndex::new(0)).await?;
    tx.commit_step(&json!({ "by": "A, stale" }), false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_failover_keeps_every_fence_raise() {
    let mut stack = stack(Replication::Synchronous).await;
    let store = store(&stack).await;

    // A raise made while the standby streams survives a failover.
    let id = job_of_a(&stack, &store, "raised-while-streaming").await;
    store.claim(id, tok(42)).await.expect("B claims");
    stack.postgres_failover(TIMEOUT).await.expect("failover");
    let refused = stale_step(&store, id).await;
    assert!(
        matches!(refused, Err(FenceError::FencedOut { .. })),
        "A must stay fenced out after the failover: {refused:?}"
    );

    // A raise made while the standby cannot receive it is not acknowledged,
    // so no owner acts on a raise the promoted standby lacks.
    let out = raise_across_failover(&mut stack, &store).await;
    eprintln!("synchronous: {out:?}");
    // B's raise is in the old primary's WAL but, waiting for the standby,
    // not yet visible there (PostgreSQL shows a commit once acknowledged).
    if out.raise_acknowledged {
        assert_eq!(
            out.fence_after_failover, 42,
            "an acknowledged raise was lost"
        );
        assert!(
            out.stale_step.is_err(),
            "A committed after an acknowledged raise"
        );
    }
    assert!(
        !out.raise_acknowledged,
        "with a synchronous standby cut off, B's raise must wait: {out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_failover_can_lose_a_fence_raise() {
    let mut stack = stack(Replication::Asynchronous).await;
    let store = store(&stack).await;
    let out = raise_across_failover(&mut stack, &store).await;
    eprintln!("asynchronous (negative control): {out:?}");
    assert!(out.raise_acknowledged, "B's raise returned success");
    assert_eq!(out.fence_on_old_primary, 42, "committed on the old primary");
    assert_eq!(
        out.fence_after_failover, 41,
        "the promoted standby lacks B's acknowledged raise"
    );
    assert!(
        out.stale_step.is_ok(),
        "the violation: A, stale, commits a step after B's raise: {:?}",
        out.stale_step
    );
}
