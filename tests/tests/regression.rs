//! Issue 15, item 1, end to end: a worker whose fresh job lock carries the same
//! etcd revision an earlier owner already claimed (what a snapshot restore without
//! `--bump-revision` produces) must raise the alarm and hand the job back, never
//! run it. The test has an etcd cluster of its own, so it can tell in advance which
//! revision the worker's lock will get: the one after the last write it made.
//! (Before the fix the worker took the equal token as its own and ran all three
//! steps under it.)
//!
//! The same in partition mode: a partition's campaign wins a key whose
//! revision the partition's fence already holds. The partition is handed
//! back, the alarm counted and told to the worker's observer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tenure::blocks::lease::{Acquire, Session};
use tenure::testing::{Fault, FaultHit, FaultPlan, FaultPoint, Injector, TestEnv};
use tenure::{FencingToken, JobId, StepIndex, Worker, WorkerObserver};
use tenure_tests::metered::Metered;
use tenure_tests::{ThreeStep, Work, done_within, on_kit, step_rows};

/// Worker `w` running [`ThreeStep`], counted by `metered`, told to `observer`.
async fn worker_w(
    cfg: tenure::Config,
    ns: &str,
    metered: &Metered,
    observer: Option<Arc<dyn WorkerObserver>>,
) -> Worker {
    let mut builder = Worker::builder(cfg).meter(metered.meter());
    if let Some(observer) = observer {
        builder = builder.observer(observer);
    }
    let job = ThreeStep {
        worker: "w".into(),
        schema: ns.to_string(),
    };
    builder.register(job).start().await.expect("worker")
}

// A dev stack of its own: the test tells which revision the worker's lock gets.
#[tenure::test(own_stack, ttl_secs = 4)]
async fn a_fresh_lock_with_an_already_claimed_revision_is_never_run(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let metered = Metered::default();
    let worker = worker_w(cfg.clone().with_worker_id("w"), &ns, &metered, None).await;

    // The last write to this etcd: a probe lock. The worker's lock for the job is
    // the next write, so its token is `probe + 1`.
    let probe = Session::establish(&cfg.clone().with_worker_id("probe"))
        .await
        .unwrap();
    let Acquire::Acquired(lock) = probe.acquire(JobId::from_key("probe", "x")).await.unwrap()
    else {
        panic!("the probe lock is free");
    };
    let next = lock.token().get() + 1;

    // An earlier owner claimed revision `next` (before etcd was restored) and still
    // runs the job: its row says so.
    let input = serde_json::to_value(Work::default()).unwrap();
    let id = JobId::from_key("test.three_step", "regressed");
    client
        .store()
        .insert_job(id, "test.three_step", &input)
        .await
        .unwrap();
    sqlx::query(&format!(
        "UPDATE {ns}.jobs SET fence = $2, status = 'running' WHERE id = $1"
    ))
    .bind(id.as_uuid())
    .bind(next)
    .execute(client.store().pool())
    .await
    .unwrap();
    client
        .enqueue::<ThreeStep>("regressed", &Work::default())
        .await
        .unwrap();

    // The alarm fires, the job is handed back, and the next acquisition (a later
    // revision) takes it over: no step ever runs under the regressed token.
    let done = done_within(&client, id, Duration::from_secs(30)).await;
    let steps = step_rows(&env, "step_log", id).await;
    let tokens: Vec<i64> = steps.into_iter().map(|(_, token)| token).collect();
    assert!(
        tokens.iter().all(|t| *t > next),
        "a second owner with the regressed token {next} ran the job: steps logged under {tokens:?}"
    );
    assert!(
        done,
        "the job is taken over under a later revision and finishes"
    );
    let row = client.job(id).await.unwrap().unwrap();
    assert!(row.fence > next && row.step == StepIndex::new(3));
    assert_eq!(tokens.len(), 3);
    assert!(
        metered.counted("tenure.fence.token_regressions") >= 1,
        "tenure.fence.token_regressions counted the alarm"
    );
    worker.shutdown().await.unwrap();
}

/// At [`FaultPoint::PartitionClaim`]: sets the fence of every owned partition
/// to the revision of its key, as if an earlier owner had claimed that revision
/// before etcd was restored without `--bump-revision`.
struct FenceAtGrant {
    observer: Arc<Session>,
    pool: sqlx::PgPool,
    schema: String,
}

impl Injector for FenceAtGrant {
    fn inject(&self, _hit: FaultHit) -> BoxFuture<'static, ()> {
        let (observer, pool) = (self.observer.clone(), self.pool.clone());
        let sql = format!(
            "INSERT INTO {}.partition_fences (job_type, partition, fence, worker) \
             VALUES ($1, $2, $3, 'before-the-restore') \
             ON CONFLICT (job_type, partition) DO UPDATE SET fence = EXCLUDED.fence",
            self.schema
        );
        Box::pin(async move {
            let view = observer.ownership().await.expect("ownership");
            for owner in view.owners {
                let p = i32::try_from(owner.partition).unwrap();
                sqlx::query(&sql)
                    .bind(&owner.job_type)
                    .bind(p)
                    .bind(owner.revision)
                    .execute(&pool)
                    .await
                    .expect("set the partition's fence");
            }
        })
    }
}

/// The partition alarms a worker told its observer.
#[derive(Default)]
struct PartitionAlarms(Mutex<Vec<(String, u32, i64)>>);

impl WorkerObserver for PartitionAlarms {
    fn partition_token_regression(&self, job_type: &str, partition: u32, token: FencingToken) {
        let mut seen = self.0.lock().unwrap();
        seen.push((job_type.to_string(), partition, token.get()));
    }
}

// A stack of its own: the injector reads every partition key of its etcd.
#[tenure::test(own_stack, ttl_secs = 4, partitions = 1)]
async fn a_partition_granted_an_already_claimed_revision_alarms_the_observer(env: TestEnv) {
    let (ns, cfg, client) = on_kit(&env).await;
    let observer = Arc::new(Session::establish(&cfg).await.expect("observer session"));
    let restore = FenceAtGrant {
        observer: observer.clone(),
        pool: client.store().pool().clone(),
        schema: ns.clone(),
    };
    let mut wcfg = cfg.clone().with_worker_id("w");
    let point = FaultPoint::PartitionClaim;
    let plan = FaultPlan::new().at(
        None,
        StepIndex::new(0),
        point,
        Fault::Freeze(Duration::ZERO),
    );
    wcfg.fault_plan = Some(plan.with_injector(Arc::new(restore)));
    let (metered, alarms) = (Metered::default(), Arc::new(PartitionAlarms::default()));
    let worker = worker_w(wcfg, &ns, &metered, Some(alarms.clone())).await;
    let id = client
        .enqueue::<ThreeStep>("after-the-restore", &Work::default())
        .await
        .unwrap()
        .job_id;
    let done = done_within(&client, id, Duration::from_secs(30)).await;
    let seen = alarms.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one alarm told to the observer: {seen:?}");
    let (job_type, partition, token) = seen[0].clone();
    assert_eq!((job_type.as_str(), partition), ("test.three_step", 0));
    assert!(done, "the partition is taken again under a later revision");
    let steps = step_rows(&env, "step_log", id).await;
    assert!(
        steps.iter().all(|(_, t)| *t > token),
        "{steps:?} under {token}"
    );
    assert!(metered.counted("tenure.fence.token_regressions") >= 1);
    worker.shutdown().await.unwrap();
    Arc::try_unwrap(observer)
        .ok()
        .unwrap()
        .close()
        .await
        .unwrap();
}
