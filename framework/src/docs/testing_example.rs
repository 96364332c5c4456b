// The complete example of the guide "Testing your jobs" (`tenure::guide::testing`
// shows this file verbatim); `tests/tests/guide_testing.rs` includes it, so it
// runs in `make test`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::testing::{Fault, FaultPlan, FaultPoint, TestEnv};
use tenure::{Config, JobId, JobStatus, StepCtx, StepError, StepIndex, Worker, WorkerBuilder};

/// An order to charge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
    pub cents: i64,
}

/// What the payment provider answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charged {
    pub order: String,
    pub payment: String,
}

/// A stand-in for a payment provider, outside the job's fenced transaction:
/// it charges once per idempotency key (as real providers do) and counts
/// every call. Here it is a table written through a pool of its own.
#[derive(Debug, Clone)]
pub struct Payments {
    pool: sqlx::PgPool,
    schema: String,
}

impl Payments {
    pub async fn charge(&self, key: &str, cents: i64) -> Result<String, sqlx::Error> {
        sqlx::query(&format!(
            "INSERT INTO {}.payments (key, cents, calls) VALUES ($1, $2, 1)
             ON CONFLICT (key) DO UPDATE SET calls = payments.calls + 1",
            self.schema
        ))
        .bind(key)
        .bind(cents)
        .execute(&self.pool)
        .await?;
        Ok(format!("pay-{key}"))
    }
}

/// The job under test: charge (an external call), then record the payment
/// (a fenced write).
#[derive(Debug, Clone)]
pub struct Checkout {
    payments: Payments,
    schema: String,
}

#[tenure::job(name = "shop.checkout", retries = 3)]
impl Checkout {
    #[step]
    async fn charge(&self, ctx: &mut StepCtx, order: Order) -> Result<Charged, StepError> {
        let key = ctx.idempotency_key("charge"); // the same for every owner
        let payment = self.payments.charge(&key, order.cents).await?;
        Ok(Charged {
            order: order.id,
            payment,
        })
    }

    #[step]
    async fn record(&self, ctx: &mut StepCtx, c: Charged) -> Result<(), StepError> {
        let sql = format!(
            "INSERT INTO {}.orders_paid (order_id, payment, job_id, token) VALUES ($1, $2, $3, $4)",
            self.schema
        );
        sqlx::query(&sql)
            .bind(&c.order)
            .bind(&c.payment)
            .bind(ctx.job_id().as_uuid())
            .bind(ctx.token().get())
            .execute(ctx.db().await?)
            .await?;
        Ok(())
    }
}

/// What a worker of this test runs, in the test process or as a worker
/// process (`#[tenure::test(worker = checkout_worker)]`).
async fn checkout_worker(cfg: Config) -> WorkerBuilder {
    let pool = sqlx::PgPool::connect_lazy(&cfg.database_url).expect("a database url");
    let schema = cfg.schema.clone();
    let payments = Payments {
        pool,
        schema: schema.clone(),
    };
    Worker::builder(cfg).register(Checkout { payments, schema })
}

/// Freezes the first worker in the middle of `charge` (after the call, before
/// the commit) for two lease TTLs: a second worker takes the job over and
/// charges again with the same key. The provider charged once, the table
/// was written once, and the history checker finds nothing wrong.
#[tenure::test(ttl_secs = 3, worker = checkout_worker)]
async fn a_frozen_worker_charges_once_and_records_once(env: TestEnv) {
    let s = env.schema();
    for ddl in [
        format!(
            "CREATE TABLE {s}.payments (key text PRIMARY KEY, cents bigint NOT NULL, calls int NOT NULL)"
        ),
        format!(
            "CREATE TABLE {s}.orders_paid (order_id text NOT NULL, payment text NOT NULL, job_id uuid NOT NULL, token bigint NOT NULL)"
        ),
    ] {
        sqlx::query(&ddl).execute(env.pool()).await.unwrap();
    }
    // Writes outside ctx.db() are refused; the checker watches the table
    // (every row is step 1 of its job).
    env.client()
        .install_guard(&format!("{s}.orders_paid"))
        .await
        .unwrap();
    env.history()
        .watch_table(&format!("{s}.orders_paid"), "job_id", "1", Some("token"));

    // Worker 1, a child process, freezes (SIGSTOP, keepalives included) for
    // 2 x TTL once `charge` returned, before its commit.
    let job = JobId::from_key("shop.checkout", "order-42");
    let freeze = Fault::Freeze(Duration::from_secs(6));
    let plan = FaultPlan::new().at(
        Some(job),
        StepIndex::new(0),
        FaultPoint::BeforeCommit,
        freeze,
    );
    let w1 = env.worker_process("w1", plan).await.unwrap();
    let order = Order {
        id: "o-42".into(),
        cents: 1_250,
    };
    env.client()
        .enqueue::<Checkout>("order-42", &order)
        .await
        .unwrap();
    let frozen =
        tenure::devstack::wait_until(Duration::from_secs(60), || async { w1.has_line("freeze") });
    assert!(frozen.await, "worker 1 never reached the freeze");

    // Worker 2 takes the job over once worker 1's lease has lapsed (and
    // PostgreSQL ended worker 1's idle transaction, which held the job row).
    let w2 = env.worker("w2", checkout_worker).await.unwrap();
    let row = env
        .run_until_done(job, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(row.status, JobStatus::Done);
    // Worker 1 wakes up after its freeze and is refused; give it the time.
    tokio::time::sleep(Duration::from_secs(4)).await;

    // Called by both owners with one key, charged once.
    let payments: Vec<(String, i32)> =
        sqlx::query_as(&format!("SELECT key, calls FROM {s}.payments"))
            .fetch_all(env.pool())
            .await
            .unwrap();
    assert_eq!(
        payments.len(),
        1,
        "one charge per idempotency key: {payments:?}"
    );
    assert!(
        payments[0].1 >= 2,
        "the new owner called the provider again: {payments:?}"
    );
    // Written once, by the owner that committed.
    let paid: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {s}.orders_paid"))
        .fetch_one(env.pool())
        .await
        .unwrap();
    assert_eq!(paid, 1);
    env.check().await.unwrap().assert_clean();
    w2.shutdown().await.unwrap();
}
