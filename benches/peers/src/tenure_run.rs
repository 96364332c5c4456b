//! Tenure on the shape, one lock per job or in partition mode: a three-step
//! job whose every step makes its `UPDATE` in its fenced transaction
//! (`ctx.db()`), the default `Config` with `max_in_flight = c`, history on.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use tenure::blocks::lease::Session;
use tenure::devstack::DevStack;
use tenure::{Client, Config, FencingToken, JobId, StepCtx, StepError, StepIndex};
use tenure::{Worker, WorkerObserver};
use tokio::time::Instant;

use crate::shape::{self, Done, Figure, PRODUCERS, joined};

/// The job type's name.
const JOB_TYPE: &str = "peers.three_step";

/// The shape's job: three steps, one `UPDATE` of the job's row each.
#[derive(Clone)]
struct PeerJob {
    update: Arc<str>,
}

impl PeerJob {
    async fn update(&self, ctx: &mut StepCtx, id: i64) -> Result<i64, StepError> {
        sqlx::query(&self.update)
            .bind(id)
            .execute(ctx.db().await?)
            .await?;
        Ok(id)
    }
}

#[tenure::job(name = "peers.three_step")]
impl PeerJob {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, id: i64) -> Result<i64, StepError> {
        self.update(ctx, id).await
    }

    #[step]
    async fn second(&self, ctx: &mut StepCtx, id: i64) -> Result<i64, StepError> {
        self.update(ctx, id).await
    }

    #[step]
    async fn third(&self, ctx: &mut StepCtx, id: i64) -> Result<i64, StepError> {
        self.update(ctx, id).await
    }
}

impl WorkerObserver for Done {
    fn step_committed(&self, _job: JobId, step: StepIndex, _token: FencingToken) {
        if step.get() == 2 {
            self.add();
        }
    }
}

fn config(stack: &DevStack, db: &str, ns: &str, partitions: Option<u32>) -> Config {
    let mut cfg = Config::new(ns)
        .with_schema(ns)
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_nats_url(stack.nats_url())
        .with_database_url(db);
    cfg.partitions = partitions;
    cfg
}

/// What a Tenure run is: the servers, the database URL (the stack's, or a
/// counting proxy's), the namespace, the concurrency, the jobs, the mode.
pub struct Run<'a> {
    /// The dev stack (etcd, NATS).
    pub stack: &'a DevStack,
    /// The PostgreSQL URL.
    pub db: &'a str,
    /// A fresh namespace.
    pub ns: &'a str,
    /// `max_in_flight`.
    pub c: usize,
    /// Jobs.
    pub n: usize,
    /// Partition mode with that many partitions; `None`: one lock per job.
    pub partitions: Option<u32>,
}

/// One Tenure run.
pub async fn run(r: Run<'_>) -> Result<Figure> {
    let Run {
        stack,
        db,
        ns,
        c,
        n,
        partitions,
    } = r;
    let cfg = config(stack, db, ns, partitions);
    let client = Client::connect(&cfg).await?;
    client.migrate().await?;
    for sql in [shape::create_rows_sql(ns), shape::insert_rows_sql(ns, n)] {
        sqlx::query(&sql).execute(client.store().pool()).await?;
    }
    let done = Arc::new(Done::default());
    let mut wcfg = cfg.clone().with_worker_id(format!("peers-{ns}"));
    wcfg.max_in_flight = c;
    let worker = Worker::builder(wcfg.clone())
        .register(PeerJob {
            update: Arc::from(shape::update_sql(ns)),
        })
        .observer(done.clone())
        .start()
        .await?;
    if let Some(p) = partitions {
        owned(&wcfg, p as usize).await?;
    }
    let started = Instant::now();
    let producers = (0..PRODUCERS)
        .map(|p| {
            let client = client.clone();
            tokio::spawn(async move {
                for id in shape::share(p, n) {
                    client.enqueue::<PeerJob>(&format!("row-{id}"), &id).await?;
                }
                Ok(())
            })
        })
        .collect();
    let enqueued = joined(producers).await?;
    done.wait_for(n as u64, Duration::from_secs(900)).await?;
    let figure = Figure::of(n, started, enqueued, Instant::now());
    worker.shutdown().await?;
    check(&client, ns, n).await?;
    Ok(figure)
}

/// Waits until the worker owns all `p` partitions of the job type.
async fn owned(cfg: &Config, p: usize) -> Result<()> {
    let observer = Session::establish(cfg).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = observer.ownership().await?;
        let have = view
            .owners
            .iter()
            .filter(|o| o.job_type == JOB_TYPE)
            .count();
        if have == p {
            break;
        }
        if Instant::now() > deadline {
            bail!("the worker owns {have} of {p} partitions after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    observer.close().await?;
    Ok(())
}

/// Every row was updated exactly three times (the fence: never more).
async fn check(client: &Client, ns: &str, n: usize) -> Result<()> {
    let (three, more): (i64, i64) = sqlx::query_as(&shape::check_sql(ns))
        .fetch_one(client.store().pool())
        .await?;
    shape::verdict("tenure", n, three, more)
}
