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
use tenure::devstack::DevStack;
use tenure::testing::TestEnv;
use tenure::{Client, Config, DeadJob, JobId, StepCtx, StepError, Worker};
use tenure_tests::{config_for, wait_until};

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

#[tokio::test]
async fn a_redrive_of_a_running_job_never_kills_it_in_partition_mode() {
    let stack = DevStack::shared().expect("dev stack");
    let ns = DevStack::unique_namespace("ops_redrive_p");
    let mut cfg = config_for(stack, &ns, Duration::from_secs(2));
    cfg.partitions = Some(4);
    let client = Client::connect(&cfg).await.unwrap();
    client.migrate().await.unwrap();
    redrive_while_running(&client, &cfg).await;
}
