//! Tenure on the shape, one lock per job or in partition mode: a three-step
//! job whose every step makes its `UPDATE` in its fenced transaction
//! (`ctx.db()`), the default `Config` with `max_in_flight = c`, history on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Time the enqueue's two writes apart (`PEERS_PHASES=1`, [`Phases`]).
    pub phases: Option<Arc<Phases>>,
}

/// Where the producers' enqueue time goes (`PEERS_PHASES=1`): each enqueue
/// made as its two writes, the row's insert (`FenceStore::insert_job`, its
/// history trigger included) and the confirmed publish
/// (`Queue::publish_job`), each timed.
#[derive(Default)]
pub struct Phases {
    insert_ns: AtomicU64,
    publish_ns: AtomicU64,
    count: AtomicU64,
}

impl Phases {
    async fn enqueue(&self, client: &Client, id: i64) -> Result<()> {
        let job_id = JobId::from_key(JOB_TYPE, &format!("row-{id}"));
        let input = serde_json::json!(id);
        let t0 = Instant::now();
        client.store().insert_job(job_id, JOB_TYPE, &input).await?;
        let t1 = Instant::now();
        let payload = serde_json::to_vec(&input)?.into();
        client.queue().publish_job(job_id, JOB_TYPE, payload).await?;
        let t2 = Instant::now();
        let ns = |d: Duration| d.as_nanos() as u64;
        self.insert_ns.fetch_add(ns(t1 - t0), Ordering::Relaxed);
        self.publish_ns.fetch_add(ns(t2 - t1), Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `insert_ms=.. publish_ms=..`: the mean of each write per enqueue.
    pub fn line(&self) -> String {
        let n = self.count.load(Ordering::Relaxed).max(1) as f64;
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / n / 1e6;
        format!(
            "insert_ms={:.2} publish_ms={:.2}",
            ms(&self.insert_ns),
            ms(&self.publish_ns)
        )
    }
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
        phases,
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
    let enqueued = if std::env::var("PEERS_PRODUCERS_APART").is_ok_and(|v| v == "1") {
        apart(cfg.clone(), n, phases).await?
    } else {
        joined(producers(&client, n, phases)).await?
    };
    done.wait_for(n as u64, Duration::from_secs(900)).await?;
    let figure = Figure::of(n, started, enqueued, Instant::now());
    worker.shutdown().await?;
    check(&client, ns, n).await?;
    Ok(figure)
}

/// The four producer tasks, each enqueueing its share of the `n` jobs (each
/// enqueue timed apart with `phases`).
fn producers(
    client: &Client,
    n: usize,
    phases: Option<Arc<Phases>>,
) -> Vec<tokio::task::JoinHandle<Result<()>>> {
    (0..PRODUCERS)
        .map(|p| {
            let client = client.clone();
            let phases = phases.clone();
            tokio::spawn(async move {
                for id in shape::share(p, n) {
                    match &phases {
                        Some(phases) => phases.enqueue(&client, id).await?,
                        None => {
                            client.enqueue::<PeerJob>(&format!("row-{id}"), &id).await?;
                        }
                    }
                }
                Ok(())
            })
        })
        .collect()
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

/// The producers on a runtime (and a client) of their own, on their own
/// threads: what a service that enqueues looks like beside a worker
/// (`PEERS_PRODUCERS_APART=1`). Returns when the last enqueue returned.
async fn apart(cfg: Config, n: usize, phases: Option<Arc<Phases>>) -> Result<Instant> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build();
        let done = match rt {
            Ok(rt) => rt.block_on(async move {
                let client = Client::connect(&cfg).await?;
                joined(producers(&client, n, phases)).await
            }),
            Err(e) => Err(e.into()),
        };
        let _ = tx.send(done);
    });
    rx.await?
}
