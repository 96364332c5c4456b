//! A fleet-wide limit per job type (`JobLimits::fleet_max`, issue 35 item 3),
//! against the real servers: three worker processes, limit 2, jobs that note
//! when they start and end (PostgreSQL's clock, one for every process): never
//! more than two overlap, also across a worker's SIGKILL, in both ownership
//! modes.
#![cfg(feature = "harness")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chrono::{DateTime, Utc};
use tenure::testing::TestEnv;
use tenure::{Config, JobLimits, StepCtx, StepError, Worker, WorkerBuilder};
use tenure_tests::all_done;

const LIMIT: u32 = 2;
const JOBS: u32 = 24;

/// A one-step job that notes its start, works 300 ms, notes its end (its own
/// pool, autocommit: the notes stay whatever becomes of the attempt).
#[derive(Debug, Clone)]
struct Spanned {
    schema: String,
    pool: sqlx::PgPool,
}

#[tenure::job(name = "test.fleet_limited", retries = 5, max_takeovers = 5)]
impl Spanned {
    #[step]
    async fn work(&self, ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        let start = format!(
            "INSERT INTO {}.spans (job_id, started) VALUES ($1, clock_timestamp()) RETURNING id",
            self.schema
        );
        let id: i64 = sqlx::query_scalar(&start)
            .bind(ctx.job_id().as_uuid())
            .fetch_one(&self.pool)
            .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let end = format!(
            "UPDATE {}.spans SET ended = clock_timestamp() WHERE id = $1",
            self.schema
        );
        sqlx::query(&end).bind(id).execute(&self.pool).await?;
        Ok(n)
    }
}

/// What every worker process runs: room for eight jobs, the type limited to
/// two fleet-wide.
async fn workers(mut cfg: Config) -> WorkerBuilder {
    cfg.max_in_flight = 8;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_lazy(&cfg.database_url)
        .expect("lazy pool");
    let job = Spanned {
        schema: cfg.schema.clone(),
        pool,
    };
    Worker::builder(cfg).register_with(job, JobLimits::default().fleet_max(LIMIT))
}

/// Every attempt's span; one a SIGKILL cut short ends at `killed`.
async fn spans(env: &TestEnv, killed: DateTime<Utc>) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let sql = format!("SELECT started, ended FROM {}.spans", env.schema());
    let rows: Vec<(DateTime<Utc>, Option<DateTime<Utc>>)> =
        sqlx::query_as(&sql).fetch_all(env.pool()).await.unwrap();
    rows.into_iter()
        .map(|(s, e)| (s, e.unwrap_or(killed)))
        .collect()
}

/// The most spans open at one instant (an end before a start at the same
/// instant).
fn most_at_once(spans: &[(DateTime<Utc>, DateTime<Utc>)]) -> usize {
    let mut edges: Vec<(DateTime<Utc>, i32)> =
        spans.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Three worker processes, 24 jobs, one worker killed mid-run: every job
/// ends done and no instant had more than two running.
async fn never_more_than_the_limit(env: TestEnv) {
    tenure_tests::init_logs();
    let t = format!("{}.spans", env.schema());
    let ddl = format!(
        "CREATE TABLE {t} (id bigserial PRIMARY KEY, job_id uuid NOT NULL, \
         started timestamptz NOT NULL, ended timestamptz)"
    );
    sqlx::query(&ddl).execute(env.pool()).await.unwrap();
    let procs = tenure_tests::worker_processes(&env, &["w1", "w2", "w3"]).await;
    let mut ids = Vec::new();
    for n in 0..JOBS {
        let key = format!("spanned-{n}");
        let enqueued = env.client().enqueue::<Spanned>(&key, &n).await.unwrap();
        ids.push(enqueued.job_id);
    }
    let count = format!("SELECT count(*) FROM {t}");
    let started = tenure::devstack::wait_until(Duration::from_secs(60), || async {
        let n: i64 = sqlx::query_scalar(&count)
            .fetch_one(env.pool())
            .await
            .unwrap();
        n >= 6
    })
    .await;
    assert!(started, "jobs start");
    procs[0].1.kill();
    let killed: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(env.pool())
        .await
        .unwrap();
    assert!(
        all_done(env.client(), &ids, Duration::from_secs(120)).await,
        "every job ends done"
    );
    let spans = spans(&env, killed).await;
    assert!(spans.len() >= JOBS as usize, "{} spans", spans.len());
    let most = most_at_once(&spans);
    assert!(
        most <= LIMIT as usize,
        "{most} jobs of a type limited to {LIMIT} ran at once"
    );
    assert_eq!(
        most, LIMIT as usize,
        "the limit's slots are used, not leaked"
    );
    for (_, p) in &procs[1..] {
        p.shutdown();
    }
}

#[tenure::test(ttl_secs = 3, worker = workers)]
async fn a_fleet_limit_holds_across_three_worker_processes_and_a_kill(env: TestEnv) {
    never_more_than_the_limit(env).await;
}

#[tenure::test(ttl_secs = 3, worker = workers, partitions = 4)]
async fn a_fleet_limit_holds_in_partition_mode(env: TestEnv) {
    never_more_than_the_limit(env).await;
}

/// A slot key brought back under a live worker's lease (as an etcd restore
/// from a snapshot does: the key was given back after the snapshot) is no
/// job's: the worker gives it back when it finds it, instead of running the
/// type one slot short for as long as it lives.
#[tenure::test(ttl_secs = 3)]
async fn a_slot_key_no_job_holds_is_given_back(env: TestEnv) {
    let schema = env.schema().to_string();
    let pool = env.pool().clone();
    let w = env
        .worker("w", |cfg| async move {
            let job = Spanned { schema, pool };
            Worker::builder(cfg).register_with(job, JobLimits::default().fleet_max(1))
        })
        .await
        .unwrap();
    let ddl = format!(
        "CREATE TABLE {}.spans (id bigserial PRIMARY KEY, job_id uuid NOT NULL, \
         started timestamptz NOT NULL, ended timestamptz)",
        env.schema()
    );
    sqlx::query(&ddl).execute(env.pool()).await.unwrap();
    let mut etcd = etcd_client::Client::connect(&env.config().etcd_endpoints, None)
        .await
        .unwrap();
    let key = format!("{}fleet/test.fleet_limited/0", env.config().etcd_prefix());
    let first = env.client().enqueue::<Spanned>("first", &1).await.unwrap();
    // The slot's lease and key version while the job holds it; then that key
    // is given back. An idle fetch round of the worker takes the slot anew
    // for the round (a new key: a new create revision), so "given back" is
    // "not that key any more", not "no key" (under load an idle worker holds
    // a round's slot most of the time).
    let (mut lease, mut held) = (0, 0);
    while lease == 0 {
        let got = etcd.get(key.as_str(), None).await.unwrap();
        (lease, held) = got
            .kvs()
            .first()
            .map_or((0, 0), |kv| (kv.lease(), kv.create_revision()));
    }
    env.run_until_done(first.job_id, Duration::from_secs(30))
        .await
        .unwrap();
    let gone = tenure::devstack::wait_until(Duration::from_secs(10), || async {
        let got = etcd.clone().get(key.as_str(), None).await.unwrap();
        got.kvs()
            .first()
            .is_none_or(|kv| kv.create_revision() != held)
    })
    .await;
    assert!(gone, "the slot is given back when the job ends");
    let put = etcd_client::PutOptions::new().with_lease(lease);
    etcd.put(key.as_str(), "w", Some(put)).await.unwrap();

    let second = env.client().enqueue::<Spanned>("second", &2).await.unwrap();
    let row = env
        .run_until_done(second.job_id, Duration::from_secs(30))
        .await;
    assert!(
        row.is_ok_and(|r| r.status == tenure::JobStatus::Done),
        "the worker ran on one slot short of a limit of one"
    );
    w.shutdown().await.unwrap();
}

/// A limit of zero would never run the type: refused before anything
/// connects, by name.
#[tenure::test]
async fn a_fleet_limit_of_zero_is_refused(env: TestEnv) {
    let job = Spanned {
        schema: env.schema().to_string(),
        pool: env.pool().clone(),
    };
    let zero = Worker::builder(env.config().clone())
        .register_with(job, JobLimits::default().fleet_max(0))
        .start()
        .await;
    assert!(
        matches!(
            zero,
            Err(tenure::WorkerError::ZeroFleetLimit("test.fleet_limited"))
        ),
        "{zero:?}"
    );
}

#[test]
fn spans_that_touch_do_not_overlap() {
    let t = |s: i64| DateTime::<Utc>::from_timestamp(s, 0).unwrap();
    assert_eq!(most_at_once(&[(t(0), t(2)), (t(2), t(4))]), 1);
    assert_eq!(most_at_once(&[(t(0), t(3)), (t(1), t(4)), (t(2), t(5))]), 3);
}
