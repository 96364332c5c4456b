//! The rest of a job's life (issue 19) against the dev stack: typed results
//! (`Client::result`, `Client::wait` on a completion notice), a step's own
//! retry delay (`StepError::retry_after`), and the `on_dead` hook that
//! compensates a dead job exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tenure::blocks::fence::JobStatus;
use tenure::testing::{FaultPlan, TestEnv};
use tenure::{ClientError, StepCtx, StepError};
use tenure_tests::{ThreeStep, Work, kit_and_worker, on_kit};

/// The same job type name as [`ThreeStep`], with another output type: a
/// client that asks for a result with the wrong type.
struct ThreeAsText;

#[tenure::job(name = "test.three_step")]
impl ThreeAsText {
    #[step]
    async fn only(&self, _ctx: &mut StepCtx, w: Work) -> Result<String, StepError> {
        Ok(w.n.to_string())
    }
}

/// Another job type altogether.
struct Other;

#[tenure::job(name = "test.other")]
impl Other {
    #[step]
    async fn only(&self, _ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        Ok(n)
    }
}

#[tenure::test]
async fn wait_returns_the_typed_output_and_result_is_none_while_running(env: TestEnv) {
    let (client, w) = kit_and_worker(&env, "w0").await;
    let slow = Work {
        n: 42,
        ..tenure_tests::slow_on("w0", 0, 1500)
    };
    let e = client.enqueue::<ThreeStep>("slow", &slow).await.unwrap();
    assert_eq!(client.result::<ThreeStep>(e.job_id).await.unwrap(), None);
    let started = Instant::now();
    let out = client
        .wait::<ThreeStep>(e.job_id, Duration::from_secs(30))
        .await
        .expect("wait");
    let waited = started.elapsed();
    assert_eq!(out, 42);
    assert_eq!(
        client.result::<ThreeStep>(e.job_id).await.unwrap(),
        Some(42)
    );
    eprintln!("wait returned {waited:?} after the enqueue (the first step sleeps 1.5 s)");

    // A finished job: wait reads the row and returns at once.
    let again = Instant::now();
    let out = client
        .wait::<ThreeStep>(e.job_id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(out, 42);
    assert!(again.elapsed() < Duration::from_secs(5));

    // The wrong output type is a typed decode error naming the job type.
    let err = client.result::<ThreeAsText>(e.job_id).await.unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Output {
                job_type: "test.three_step",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("test.three_step"), "{err}");
    // Another job type: refused before decoding.
    let err = client
        .wait::<Other>(e.job_id, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::WrongJobType { asked: "test.other", found, .. } if found == "test.three_step"),
        "{err:?}"
    );
    // An unknown job.
    let unknown = tenure::JobId::from_key("test.three_step", "never-enqueued");
    let err = client.result::<ThreeStep>(unknown).await.unwrap_err();
    assert!(
        matches!(err, ClientError::UnknownJob(id) if id == unknown),
        "{err:?}"
    );
    w.shutdown().await.unwrap();
}

#[tenure::test]
async fn wait_on_a_job_that_dies_or_is_cancelled_names_the_status(env: TestEnv) {
    let (client, w) = kit_and_worker(&env, "w0").await;
    let doomed = Work {
        n: 1,
        fail_times: u32::MAX,
        ..Work::default()
    };
    let e = client
        .enqueue::<ThreeStep>("doomed", &doomed)
        .await
        .unwrap();
    let err = wait_error(&client, e.job_id, Duration::from_secs(60)).await;
    match &err {
        ClientError::NoResult {
            status: JobStatus::Dead,
            reason: Some(reason),
            ..
        } => assert!(reason.contains("fails on purpose"), "{reason}"),
        other => panic!("expected NoResult(dead), got {other:?}"),
    }
    assert!(err.to_string().contains("dead"), "{err}");

    // A job cancelled while a waiter waits: the waiter hears of it.
    let held = Work {
        n: 2,
        ..tenure_tests::slow_on("w0", 1, 3000)
    };
    let e = client.enqueue::<ThreeStep>("held", &held).await.unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .wait::<ThreeStep>(e.job_id, Duration::from_secs(60))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.cancel(e.job_id, "no longer wanted").await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter returns after the cancel, well before its timeout")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::NoResult { status: JobStatus::Cancelled, reason: Some(r), .. } if r == "no longer wanted"),
        "{err:?}"
    );
    w.shutdown().await.unwrap();
}

#[tenure::test]
async fn wait_times_out_with_a_typed_error(env: TestEnv) {
    let (_ns, _cfg, client) = on_kit(&env).await;
    // No worker: the job stays pending.
    let e = client
        .enqueue::<ThreeStep>("nobody", &Work::default())
        .await
        .unwrap();
    let err = wait_error(&client, e.job_id, Duration::from_millis(300)).await;
    assert!(
        matches!(err, ClientError::WaitTimedOut { job_id, .. } if job_id == e.job_id),
        "{err:?}"
    );
}

/// When each attempt of [`Patient`]'s step started.
static PATIENT_ATTEMPTS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

/// A job whose step asks, on its first attempt, to be retried in 2 s.
struct Patient;

#[tenure::job(name = "test.patient", retries = 3)]
impl Patient {
    #[step]
    async fn only(&self, ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        PATIENT_ATTEMPTS.lock().unwrap().push(Instant::now());
        if ctx.attempt() == 0 {
            return Err(StepError::retry_after(Duration::from_secs(2)));
        }
        Ok(n)
    }
}

#[tenure::test]
async fn a_step_that_asks_for_two_seconds_is_not_retried_sooner(env: TestEnv) {
    let (_ns, cfg, client) = on_kit(&env).await;
    // The backoff would retry after 25..75 ms: the step's request must win.
    let w = tenure::Worker::builder(cfg.clone().with_worker_id("w0"))
        .register(Patient)
        .start()
        .await
        .unwrap();
    let e = client.enqueue::<Patient>("p", &7).await.unwrap();
    let out = client
        .wait::<Patient>(e.job_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(out, 7);
    let attempts = PATIENT_ATTEMPTS.lock().unwrap().clone();
    assert_eq!(attempts.len(), 2, "one failure, one success");
    let gap = attempts[1] - attempts[0];
    eprintln!("the retry came {gap:?} after the first attempt (asked: 2 s)");
    assert!(gap >= Duration::from_millis(1950), "retried after {gap:?}");
    let row = client.job(e.job_id).await.unwrap().unwrap();
    assert_eq!(row.attempts, 1);
    w.shutdown().await.unwrap();
}

/// A transfer whose credit step fails permanently, compensated by `refund`:
/// the debit is put back once. `flaky_hook`: the hook's first run writes its
/// refund and then fails (retryably), so its transaction rolls back and the
/// next run compensates.
#[derive(Clone)]
struct Transfer {
    schema: String,
    flaky_hook: bool,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Move {
    from: String,
    to: String,
    amount: i64,
}

impl Transfer {
    async fn add(&self, ctx: &mut StepCtx, account: &str, delta: i64) -> Result<(), StepError> {
        let sql = format!(
            "UPDATE {}.accounts SET balance = balance + $2 WHERE id = $1",
            self.schema
        );
        sqlx::query(&sql)
            .bind(account)
            .bind(delta)
            .execute(ctx.db().await?)
            .await?;
        Ok(())
    }
}

#[tenure::job(name = "test.transfer", retries = 1, on_dead = refund)]
impl Transfer {
    #[step]
    async fn debit(&self, ctx: &mut StepCtx, m: Move) -> Result<Move, StepError> {
        self.add(ctx, &m.from, -m.amount).await?;
        Ok(m)
    }

    #[step]
    async fn credit(&self, _ctx: &mut StepCtx, m: Move) -> Result<Move, StepError> {
        Err(StepError::permanent(format!("account {} is closed", m.to)))
    }

    async fn refund(&self, ctx: &mut StepCtx, dead: tenure::DeadJob) -> Result<(), StepError> {
        let Some(m) = dead.checkpoint_as::<Move>()? else {
            return Ok(()); // nothing was debited
        };
        // A redriven job resumes after its debit: a later death must not
        // refund the debit a previous death's compensation refunded already.
        let sql = format!(
            "SELECT count(*) FROM {}.refunds WHERE job_id = $1",
            self.schema
        );
        let done: i64 = sqlx::query_scalar(&sql)
            .bind(ctx.job_id().as_uuid())
            .fetch_one(ctx.db().await?)
            .await?;
        if done == 0 {
            self.add(ctx, &m.from, m.amount).await?;
        }
        // One row per committed run of the hook.
        let sql = format!(
            "INSERT INTO {}.refunds (job_id, token, reason) VALUES ($1, $2, $3)",
            self.schema
        );
        tenure_tests::insert_in_step(ctx, &sql, None, Some(&dead.reason)).await?;
        if self.flaky_hook && ctx.attempt() == 0 {
            return Err(StepError::retryable("the refund service timed out"));
        }
        Ok(())
    }
}

/// The error `wait` for [`ThreeStep`] job `id` ends with within `timeout`
/// (panics if it returns an output).
async fn wait_error(client: &tenure::Client, id: tenure::JobId, timeout: Duration) -> ClientError {
    client.wait::<ThreeStep>(id, timeout).await.unwrap_err()
}

/// The guarded tables `accounts` (alice 100, bob 0) and `refunds` (`job_id`,
/// `token` and the text column `note`).
async fn bank(client: &tenure::Client, ns: &str, note: &str) {
    let pool = client.store().pool();
    let ddl = [
        format!("CREATE TABLE {ns}.accounts (id text PRIMARY KEY, balance bigint NOT NULL)"),
        format!(
            "CREATE TABLE {ns}.refunds (job_id uuid NOT NULL, token bigint NOT NULL, {note} text NOT NULL)"
        ),
    ];
    tenure_tests::execute_all(pool, &ddl).await;
    for t in ["accounts", "refunds"] {
        client.install_guard(&format!("{ns}.{t}")).await.unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    client.bypass_guard(&mut tx).await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {ns}.accounts VALUES ('alice', 100), ('bob', 0)"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

async fn balances(client: &tenure::Client, ns: &str) -> Vec<(String, i64)> {
    sqlx::query_as(&format!(
        "SELECT id, balance FROM {ns}.accounts ORDER BY id"
    ))
    .fetch_all(client.store().pool())
    .await
    .unwrap()
}

/// Asserts that job `id` wrote `runs` rows of `refunds` (one per committed
/// run of its hook: `what`) and that the debit was refunded: alice holds 100
/// and bob 0 again.
async fn assert_refunded(
    client: &tenure::Client,
    ns: &str,
    id: tenure::JobId,
    runs: i64,
    what: &str,
) {
    assert_eq!(
        tenure_tests::rows_of(client, "refunds", id).await,
        runs,
        "{what}"
    );
    assert_eq!(
        balances(client, ns).await,
        vec![("alice".into(), 100), ("bob".into(), 0)],
        "the debit was refunded and the balances add up"
    );
}

async fn compensation(client: &tenure::Client, ns: &str, id: tenure::JobId) -> String {
    sqlx::query_scalar(&format!("SELECT compensation FROM {ns}.jobs WHERE id = $1"))
        .bind(id.as_uuid())
        .fetch_one(client.store().pool())
        .await
        .unwrap()
}

async fn run_failed_transfer(env: &TestEnv, flaky_hook: bool) {
    let (ns, cfg, client) = on_kit(env).await;
    bank(&client, &ns, "reason").await;
    let job = Transfer {
        schema: ns.clone(),
        flaky_hook,
    };
    let w = tenure::Worker::builder(cfg.clone().with_worker_id("w0"))
        .register(job)
        .start()
        .await
        .unwrap();
    let m = Move {
        from: "alice".into(),
        to: "bob".into(),
        amount: 30,
    };
    let e = client.enqueue::<Transfer>("t1", &m).await.unwrap();
    let err = client
        .wait::<Transfer>(e.job_id, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::NoResult { status: JobStatus::Dead, reason: Some(r), .. } if r.contains("is closed")),
        "{err:?}"
    );
    // The wait returns once the job is dead; its compensation runs before the
    // job's message is dead-lettered.
    let compensated = tenure_tests::wait_until(Duration::from_secs(30), || async {
        compensation(&client, &ns, e.job_id).await == "done"
    })
    .await;
    assert!(
        compensated,
        "compensation {}",
        compensation(&client, &ns, e.job_id).await
    );
    let dlq = tenure_tests::wait_until(Duration::from_secs(30), || async {
        client
            .queue()
            .stats()
            .await
            .map(|s| s.dlq_messages)
            .unwrap_or(0)
            >= 1
    })
    .await;
    assert!(dlq, "the job is dead-lettered after its compensation");
    // A while longer: nothing compensates twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_refunded(&client, &ns, e.job_id, 1, "the hook committed exactly once").await;

    // A redrive resets the compensation: the job (resuming at its credit)
    // dies again and its hook runs again, finding the debit refunded.
    client.redrive(e.job_id).await.unwrap();
    assert_eq!(compensation(&client, &ns, e.job_id).await, "none");
    let again = tenure_tests::wait_until(Duration::from_secs(60), || async {
        let row = client.job(e.job_id).await.unwrap().unwrap();
        row.status == JobStatus::Dead && compensation(&client, &ns, e.job_id).await == "done"
    })
    .await;
    assert!(again, "the second death is compensated");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_refunded(&client, &ns, e.job_id, 2, "one committed run per death").await;
    w.shutdown().await.unwrap();
}

#[tenure::test]
async fn a_transfer_whose_credit_fails_for_good_is_refunded_once(env: TestEnv) {
    run_failed_transfer(&env, false).await;
}

#[tenure::test]
async fn a_hook_that_fails_after_writing_rolls_back_and_compensates_once_on_retry(env: TestEnv) {
    run_failed_transfer(&env, true).await;
}

#[tenure::test(ttl_secs = 2, worker = tenure_tests::test_worker)]
async fn a_takeover_during_compensation_still_compensates_once(env: TestEnv) {
    // About lease loss: a short TTL on purpose.
    let (ns, cfg, client) = on_kit(&env).await;
    let pool = client.store().pool();
    bank(&client, &ns, "worker").await;

    // Returns once A is ready (the kit's ready wait).
    let a = env.worker_process("A", FaultPlan::new()).await.unwrap();
    let m = tenure_tests::Move {
        from: "alice".into(),
        to: "nobody".into(),
        amount: 30,
        slow_hook_worker: Some("A".into()),
        slow_hook_ms: 8000,
    };
    let e = client
        .enqueue::<tenure_tests::Compensated>("t", &m)
        .await
        .unwrap();
    // A marks the job dead, runs its hook, writes the refund in the hook's
    // open transaction, and sleeps there: paused mid-hook.
    let dead = tenure_tests::wait_until(Duration::from_secs(30), || async {
        matches!(client.job(e.job_id).await, Ok(Some(r)) if r.status == JobStatus::Dead)
    })
    .await;
    assert!(dead, "A dead-marks the job");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(compensation(&client, &ns, e.job_id).await, "pending");
    a.pause();

    let b = tenure::Worker::builder(cfg.clone().with_worker_id("B"))
        .register(tenure_tests::Compensated {
            worker: "B".into(),
            schema: ns.clone(),
        })
        .start()
        .await
        .unwrap();
    let done = tenure_tests::wait_until(Duration::from_secs(60), || async {
        compensation(&client, &ns, e.job_id).await == "done"
    })
    .await;
    assert!(done, "B takes over and compensates");
    // A wakes up, finishes its hook and tries to commit: refused.
    a.resume();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let rows: Vec<(i64, String)> = sqlx::query_as(&format!(
        "SELECT token, worker FROM {ns}.refunds WHERE job_id = $1"
    ))
    .bind(e.job_id.as_uuid())
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1, "compensated exactly once: {rows:?}");
    assert_eq!(rows[0].1, "B", "by the new owner: {rows:?}");
    let row = client.job(e.job_id).await.unwrap().unwrap();
    assert_eq!(row.fence, rows[0].0, "under the fence it raised");
    assert_eq!(
        balances(&client, &ns).await,
        vec![("alice".into(), 100), ("bob".into(), 0)],
        "the debit was refunded once"
    );
    eprintln!("A's output: {:?}", a.lines());
    b.shutdown().await.unwrap();
}
