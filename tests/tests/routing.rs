//! Routing by job type (issue 18, item 1) against the dev stack: two worker
//! pools with disjoint job types in one namespace, a type nobody registers that
//! waits (never dead-lettered) and is shown as such, and per-type limits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tenure::blocks::fence::JobStatus;
use tenure::testing::TestEnv;
use tenure::{Client, JobId, JobLimits, StepCtx, StepError, Worker};
use tenure_tests::metered::Metered;
use tenure_tests::{all_done, on_kit, wait_until};

/// Appends `(job, job type, worker)` to `<schema>.ran` in the step's fenced
/// transaction, after sleeping `ms` (counting how many run at once).
async fn record(
    ctx: &mut StepCtx,
    schema: &str,
    job_type: &str,
    worker: &str,
    ms: u64,
    running: Option<&RunningMax>,
) -> Result<(), StepError> {
    if let Some(r) = running {
        r.enter();
    }
    tokio::time::sleep(Duration::from_millis(ms)).await;
    if let Some(r) = running {
        r.leave();
    }
    let sql = format!("INSERT INTO {schema}.ran (job_id, job_type, worker) VALUES ($1, $2, $3)");
    sqlx::query(&sql)
        .bind(ctx.job_id().as_uuid())
        .bind(job_type)
        .bind(worker)
        .execute(ctx.db().await?)
        .await?;
    Ok(())
}

/// How many steps run at once now, and the most at any time.
#[derive(Debug, Default)]
struct RunningMax {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl RunningMax {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Debug, Clone)]
struct Gpu {
    schema: String,
    worker: String,
}

#[tenure::job(name = "route.gpu")]
impl Gpu {
    #[step]
    async fn only(&self, ctx: &mut StepCtx, ms: u64) -> Result<u64, StepError> {
        record(ctx, &self.schema, "route.gpu", &self.worker, ms, None).await?;
        Ok(ms)
    }
}

#[derive(Debug, Clone)]
struct Pay {
    schema: String,
    worker: String,
    running: Option<Arc<RunningMax>>,
}

#[tenure::job(name = "route.pay")]
impl Pay {
    #[step]
    async fn only(&self, ctx: &mut StepCtx, ms: u64) -> Result<u64, StepError> {
        let running = self.running.as_deref();
        record(ctx, &self.schema, "route.pay", &self.worker, ms, running).await?;
        Ok(ms)
    }
}

#[derive(Debug, Clone)]
struct Late {
    schema: String,
    worker: String,
}

#[tenure::job(name = "route.late")]
impl Late {
    #[step]
    async fn only(&self, ctx: &mut StepCtx, ms: u64) -> Result<u64, StepError> {
        record(ctx, &self.schema, "route.late", &self.worker, ms, None).await?;
        Ok(ms)
    }
}

/// The test's namespace, config and client, with the table `ran`.
async fn fresh(env: &TestEnv) -> (String, tenure::Config, Client) {
    let (ns, cfg, client) = on_kit(env).await;
    let sql = format!(
        "CREATE TABLE {ns}.ran (job_id uuid NOT NULL, job_type text NOT NULL, worker text NOT NULL)"
    );
    sqlx::query(&sql)
        .execute(client.store().pool())
        .await
        .expect("ran table");
    (ns, cfg, client)
}

/// (job type, worker) -> number of steps run.
async fn ran(client: &Client, ns: &str) -> Vec<(String, String, i64)> {
    let sql =
        format!("SELECT job_type, worker, count(*) FROM {ns}.ran GROUP BY 1, 2 ORDER BY 1, 2");
    sqlx::query_as(&sql)
        .fetch_all(client.store().pool())
        .await
        .expect("ran")
}

async fn enqueue(client: &Client, job_type: &str, n: usize, ms: u64) -> Vec<JobId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let key = format!("{job_type}-{i}");
        let e = client
            .enqueue_json(job_type, &key, serde_json::json!(ms))
            .await
            .expect("enqueue");
        ids.push(e.job_id);
    }
    ids
}

/// The last value of the i64 gauge `name` with `job_type` = `t`.
fn gauge(metered: &Metered, name: &str, t: &str) -> Option<i64> {
    metered.gauge(name, t).map(|v| v as i64)
}

#[tenure::test(ttl_secs = 4)]
async fn two_pools_get_only_their_types_and_an_unregistered_type_waits_for_its_worker(
    env: TestEnv,
) {
    let (ns, cfg, client) = fresh(&env).await;
    let metered = Metered::default();
    let gpu_pool = Worker::builder(cfg.clone().with_worker_id("pool-gpu"))
        .register(Gpu {
            schema: ns.clone(),
            worker: "pool-gpu".into(),
        })
        .meter(metered.meter())
        .start()
        .await
        .expect("gpu pool");
    let pay_pool = Worker::builder(cfg.clone().with_worker_id("pool-pay"))
        .register(Pay {
            schema: ns.clone(),
            worker: "pool-pay".into(),
            running: None,
        })
        .start()
        .await
        .expect("pay pool");

    let late = enqueue(&client, "route.late", 3, 0).await;
    let late_enqueued = std::time::Instant::now();
    let gpu = enqueue(&client, "route.gpu", 20, 5).await;
    let pay = enqueue(&client, "route.pay", 20, 5).await;
    assert!(
        all_done(&client, &gpu, Duration::from_secs(60)).await,
        "gpu jobs done"
    );
    assert!(
        all_done(&client, &pay, Duration::from_secs(60)).await,
        "pay jobs done"
    );
    assert_eq!(
        ran(&client, &ns).await,
        vec![
            ("route.gpu".to_string(), "pool-gpu".to_string(), 20),
            ("route.pay".to_string(), "pool-pay".to_string(), 20),
        ],
        "each job ran once, on the pool of its type"
    );

    // The unregistered type waits: pending, in the stream, not dead-lettered,
    // shown as waiting for a worker and counted by the gauge.
    for id in &late {
        assert_eq!(
            client.job(*id).await.unwrap().unwrap().status,
            JobStatus::Pending
        );
    }
    assert_eq!(
        client
            .queue()
            .stored_by_type()
            .await
            .unwrap()
            .get("route.late"),
        Some(&3)
    );
    assert!(client.queue().dead_letters(10).await.unwrap().is_empty());
    let routed = client.store().registered_job_types().await.unwrap();
    assert!(
        routed.contains("route.gpu") && routed.contains("route.pay"),
        "{routed:?}"
    );
    assert!(!routed.contains("route.late"), "{routed:?}");
    let counted = wait_until(Duration::from_secs(10), || async {
        gauge(&metered, "tenure.queue.unrouted", "route.late") == Some(3)
            && gauge(&metered, "tenure.queue.backlog", "route.late") == Some(3)
    })
    .await;
    assert!(
        counted,
        "tenure.queue.unrouted and tenure.queue.backlog {{job_type=route.late}} = 3"
    );
    // The oldest waiting message's age grows with the wait: at least the
    // time since the enqueue at one report, at most that plus a report.
    let oldest = || metered.gauge("tenure.queue.oldest_age", "route.late");
    let aged = wait_until(Duration::from_secs(10), || async {
        oldest().is_some_and(|age| age >= 2.0)
    })
    .await;
    let (age, waited) = (oldest(), late_enqueued.elapsed().as_secs_f64());
    assert!(
        aged,
        "tenure.queue.oldest_age {{job_type=route.late}}: {age:?}"
    );
    assert!(
        age.is_some_and(|a| a <= waited + 0.5),
        "{age:?} is older than the wait, {waited} s"
    );

    // A worker that registers it starts: the waiting jobs run there.
    let late_pool = Worker::builder(cfg.clone().with_worker_id("pool-late"))
        .register(Late {
            schema: ns.clone(),
            worker: "pool-late".into(),
        })
        .start()
        .await
        .expect("late pool");
    assert!(
        all_done(&client, &late, Duration::from_secs(60)).await,
        "late jobs done"
    );
    assert!(
        ran(&client, &ns)
            .await
            .contains(&("route.late".into(), "pool-late".into(), 3))
    );
    let cleared = wait_until(Duration::from_secs(10), || async {
        gauge(&metered, "tenure.queue.unrouted", "route.late") == Some(0)
            && gauge(&metered, "tenure.queue.backlog", "route.late") == Some(0)
            && oldest() == Some(0.0)
    })
    .await;
    assert!(
        cleared,
        "the gauge goes back to 0 once a worker registers the type"
    );
    assert!(client.queue().dead_letters(10).await.unwrap().is_empty());
    for w in [gpu_pool, pay_pool, late_pool] {
        w.shutdown().await.expect("shutdown");
    }
}

/// `register_with(job, JobLimits::max_in_flight(1))`: however deep its backlog,
/// the slow type never holds more than one of the worker's slots, and the other
/// type's jobs run beside it.
#[tenure::test(ttl_secs = 4)]
async fn a_types_limit_keeps_its_backlog_from_taking_the_whole_worker(env: TestEnv) {
    let (ns, cfg, client) = fresh(&env).await;
    let mut cfg = cfg.with_worker_id("limited");
    cfg.max_in_flight = 4;
    let running = Arc::new(RunningMax::default());
    let slow = enqueue(&client, "route.pay", 6, 600).await;
    let fast = enqueue(&client, "route.gpu", 12, 5).await;
    let worker = Worker::builder(cfg)
        .register_with(
            Pay {
                schema: ns.clone(),
                worker: "limited".into(),
                running: Some(running.clone()),
            },
            JobLimits::default().max_in_flight(1),
        )
        .register(Gpu {
            schema: ns.clone(),
            worker: "limited".into(),
        })
        .start()
        .await
        .expect("worker");
    assert!(
        all_done(&client, &fast, Duration::from_secs(30)).await,
        "fast jobs done"
    );
    let slow_done = {
        let mut n = 0;
        for id in &slow {
            if client.job(*id).await.unwrap().unwrap().status == JobStatus::Done {
                n += 1;
            }
        }
        n
    };
    assert!(
        slow_done < slow.len(),
        "the fast type did not wait for the slow backlog"
    );
    assert!(
        all_done(&client, &slow, Duration::from_secs(60)).await,
        "slow jobs done"
    );
    assert_eq!(
        running.max.load(Ordering::SeqCst),
        1,
        "one slow job at a time"
    );
    worker.shutdown().await.expect("shutdown");

    let zero = Worker::builder(env.config().clone())
        .register_with(
            Gpu {
                schema: ns.clone(),
                worker: "z".into(),
            },
            JobLimits::default().max_in_flight(0),
        )
        .start()
        .await;
    assert!(
        matches!(zero, Err(tenure::WorkerError::ZeroLimit("route.gpu"))),
        "{zero:?}"
    );
}
