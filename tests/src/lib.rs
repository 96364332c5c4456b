//! Shared pieces of the integration and torture tests: the test job types, the
//! schema they write to, and helpers to configure workers against a dev stack.
//!
//! Built with feature `harness` only (tenure's dev stack and testing kit): this
//! package's tests turn it on, `cargo build --workspace` does not.
#![cfg(feature = "harness")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod metered;
mod stacks;
pub mod trips;

pub use stacks::{database_stack, secured_config, secured_stack};

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::blocks::fence::JobStatus;
use tenure::devstack::DevStack;
use tenure::{Config, StepCtx, StepError, Worker, WorkerBuilder};

/// A `Config` for namespace `ns` on `stack` (schema = `ns`), with lease TTL
/// `ttl` and the kit's short backoffs: for the CLI's tests, which run
/// `tenure migrate` on namespaces nothing migrated yet (a `#[tenure::test]`
/// gets its config, migrated, from its `TestEnv`).
pub fn config_for(stack: &DevStack, ns: &str, ttl: Duration) -> Config {
    let mut cfg = Config::new(ns)
        .with_schema(ns)
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_nats_url(stack.nats_url())
        .with_database_url(stack.database_url())
        .with_lease_ttl(ttl);
    tenure::testing::short_backoffs(&mut cfg);
    cfg
}

/// The namespace, config and client of a `#[tenure::test]`'s environment,
/// with the test tables prepared ([`prepare_schema`]).
pub async fn on_kit(env: &tenure::testing::TestEnv) -> (String, Config, tenure::Client) {
    prepare_schema(env.client()).await;
    (
        env.namespace().to_string(),
        env.config().clone(),
        env.client().clone(),
    )
}

/// The client of a `#[tenure::test]`'s environment ([`on_kit`]) and its
/// worker `id` running [`ThreeStep`] ([`three_step_worker`]).
pub async fn kit_and_worker(
    env: &tenure::testing::TestEnv,
    id: &str,
) -> (tenure::Client, tenure::Worker) {
    let (ns, cfg, client) = on_kit(env).await;
    (client, three_step_worker(&cfg, &ns, id).await)
}

/// `cfg` moved to a namespace (and schema) of its own, on the same servers,
/// for a test that needs a second one; a client's `migrate` prepares it.
pub fn in_new_namespace(cfg: &Config, prefix: &str) -> Config {
    let ns = DevStack::unique_namespace(prefix);
    let mut cfg = cfg.clone();
    cfg.namespace = ns.clone();
    cfg.schema = ns;
    cfg
}

/// What the worker processes of these tests run (`#[tenure::test(worker =
/// tenure_tests::test_worker)]`, then `TestEnv::worker_process`): [`ThreeStep`]
/// and [`Compensated`] as worker `cfg.worker_id`, on `cfg.schema`.
pub async fn test_worker(cfg: Config) -> WorkerBuilder {
    let (worker, schema) = (cfg.worker_id.clone(), cfg.schema.clone());
    let compensated = Compensated {
        worker: worker.clone(),
        schema: schema.clone(),
    };
    Worker::builder(cfg)
        .register(ThreeStep { worker, schema })
        .register(compensated)
}

/// [`test_worker`] that also declares the schedule `tick`: a [`ThreeStep`]
/// job every second, missed ticks caught up (at most 1000).
pub async fn cron_test_worker(cfg: Config) -> WorkerBuilder {
    let every_second = tenure::Schedule::new("tick", "* * * * * *")
        .missed(tenure::MissedTicks::CatchUp { max: 1000 });
    test_worker(cfg)
        .await
        .schedule_with::<ThreeStep>(every_second, &Work::default())
}

/// The store's overview of `client`'s schema (its job rows by type and
/// status, as the CLI shows them).
pub async fn overview(client: &tenure::Client) -> tenure::blocks::fence::Overview {
    client
        .store()
        .overview(Duration::from_secs(60))
        .await
        .expect("overview")
}

/// How many of the jobs in `client`'s schema have `status` ([`overview`]).
pub async fn count_status(client: &tenure::Client, status: JobStatus) -> i64 {
    overview(client).await.count(status)
}

/// Whether job `id` is `done` within `within`.
pub async fn done_within(client: &tenure::Client, id: tenure::JobId, within: Duration) -> bool {
    all_done(client, &[id], within).await
}

/// Whether every job of `ids` is `done` within `within`.
pub async fn all_done(client: &tenure::Client, ids: &[tenure::JobId], within: Duration) -> bool {
    wait_until(within, || async {
        for id in ids {
            match client.job(*id).await {
                Ok(Some(row)) if row.status == JobStatus::Done => {}
                _ => return false,
            }
        }
        true
    })
    .await
}

/// The takeovers of all the jobs in `client`'s schema ([`overview`],
/// summed over types and statuses).
pub async fn total_takeovers(client: &tenure::Client) -> i64 {
    let overview = overview(client).await;
    overview.by_type_status.iter().map(|c| c.takeovers).sum()
}

/// Asserts that each of `jobs` has a DLQ entry whose reason mentions `reason`
/// (within 10 s: the row is marked dead before its entry is published).
pub async fn assert_dead_lettered(client: &tenure::Client, jobs: &[tenure::JobId], reason: &str) {
    wait_until(Duration::from_secs(10), || async {
        let dlq = client.queue().dead_letters(100).await.unwrap();
        jobs.iter()
            .all(|id| dlq.iter().any(|d| d.job_id == Some(*id)))
    })
    .await;
    let dlq = client.queue().dead_letters(100).await.unwrap();
    for id in jobs {
        let entry = dlq
            .iter()
            .find(|d| d.job_id == Some(*id))
            .expect("in the DLQ");
        assert!(entry.reason.contains(reason), "reason: {}", entry.reason);
    }
}

/// The events of kind `kind` of job `id` (its history, oldest first).
pub async fn events_of_kind(
    client: &tenure::Client,
    id: tenure::JobId,
    kind: &str,
) -> Vec<tenure::blocks::fence::JobEvent> {
    let events = client.store().job_events(id).await.expect("job events");
    events.into_iter().filter(|e| e.kind == kind).collect()
}

/// How many `step_log` rows job `id` wrote (committed writes of its steps).
pub async fn steps_logged(client: &tenure::Client, id: tenure::JobId) -> i64 {
    rows_of(client, "step_log", id).await
}

/// How many rows of the test's table `table` (in the client's schema) have
/// `job_id` = `id`.
pub async fn rows_of(client: &tenure::Client, table: &str, id: tenure::JobId) -> i64 {
    let schema = client.store().schema();
    let sql = format!("SELECT count(*) FROM {schema}.{table} WHERE job_id = $1");
    let count = sqlx::query_scalar(&sql).bind(id.as_uuid());
    count.fetch_one(client.store().pool()).await.expect("count")
}

/// Runs each statement of `ddl` (the test's own tables) on `pool`.
pub async fn execute_all(pool: &sqlx::PgPool, ddl: &[String]) {
    for statement in ddl {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
}

/// The scheduler leader's worker id and token (`None`: no leader yet).
pub async fn scheduler_leader(client: &tenure::Client) -> Option<(String, i64)> {
    let leader = client.store().leader("scheduler").await.unwrap();
    leader.map(|l| (l.worker, l.fence))
}

/// Starts a worker process of the test for each id of `ids` (each ready),
/// paired with its id.
pub async fn worker_processes(
    env: &tenure::testing::TestEnv,
    ids: &[&str],
) -> Vec<(String, tenure::testing::WorkerProcess)> {
    let mut workers = Vec::new();
    for id in ids {
        let plan = tenure::testing::FaultPlan::new();
        let process = env.worker_process(id, plan).await.unwrap();
        workers.push((id.to_string(), process));
    }
    workers
}

/// Prints the framework's warnings and errors (or what `RUST_LOG` asks for)
/// into the output of the test that calls it, which cargo shows when the test
/// fails: a timing test that fails on a loaded machine then says why (a lost
/// session, a failed publish). Idempotent.
pub fn init_logs() {
    init_logs_at("tenure=warn");
}

/// As [`init_logs`], with `default` as the filter when `RUST_LOG` is not set
/// (e.g. `"tenure=info"` for tests whose log tells the story of a fault).
pub fn init_logs_at(default: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .with_test_writer()
        .try_init();
}

/// A worker `id` (its log name too) running [`ThreeStep`] on `cfg`'s schema `ns`.
pub async fn three_step_worker(cfg: &Config, ns: &str, id: &str) -> tenure::Worker {
    tenure::Worker::builder(cfg.clone().with_worker_id(id))
        .register(ThreeStep {
            worker: id.into(),
            schema: ns.to_string(),
        })
        .start()
        .await
        .expect("worker")
}

/// Migrates `cfg.schema` (recording the client's way of owning jobs) and
/// creates the test tables (`step_log`, guarded).
pub async fn prepare_schema(client: &tenure::Client) {
    client.migrate().await.expect("migrate");
    create_test_tables(client.store()).await;
}

/// Creates the test tables (`step_log`, guarded) in `store`'s migrated schema.
pub async fn create_test_tables(store: &tenure::blocks::fence::FenceStore) {
    let schema = store.schema().to_string();
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.step_log (
            job_id uuid NOT NULL,
            step int NOT NULL,
            token bigint NOT NULL,
            worker text NOT NULL,
            at timestamptz NOT NULL DEFAULT now())"
    ))
    .execute(store.pool())
    .await
    .expect("create step_log");
    store
        .install_guard(&format!("{schema}.step_log"))
        .await
        .expect("guard step_log");
}

/// Input of [`ThreeStep`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Work {
    /// A number carried through the steps.
    pub n: u64,
    /// Worker id that sleeps (without noticing cancellation, like a GC pause or a
    /// blocking call) at the start of `slow_step`.
    #[serde(default)]
    pub slow_worker: Option<String>,
    /// The step that is slow.
    #[serde(default)]
    pub slow_step: u32,
    /// How long it sleeps.
    #[serde(default)]
    pub slow_ms: u64,
    /// Make step 1 fail this many times (on any worker) before succeeding;
    /// `u32::MAX` fails forever.
    #[serde(default)]
    pub fail_times: u32,
    /// Make step 1 panic instead of returning an error when failing.
    #[serde(default)]
    pub panic: bool,
}

/// A [`ThreeStep`] input carrying `n`, nothing slow or failing.
pub fn work(n: u64) -> Work {
    Work {
        n,
        ..Work::default()
    }
}

/// A [`ThreeStep`] input whose step `step` sleeps `ms` on worker `worker`.
pub fn slow_on(worker: &str, step: u32, ms: u64) -> Work {
    Work {
        slow_worker: Some(worker.into()),
        slow_step: step,
        slow_ms: ms,
        ..Work::default()
    }
}

/// A three-step job whose every step appends `(job, step, token, worker)` to the
/// guarded `step_log` table in its fenced transaction.
#[derive(Debug, Clone)]
pub struct ThreeStep {
    /// This worker's id (written to the log).
    pub worker: String,
    /// The schema of `step_log`.
    pub schema: String,
}

/// Runs `sql`, an `INSERT` of a step's row, in the step's fenced
/// transaction (`ctx.db()`): `$1` is the job's id, `$2` the step's token,
/// then `step` (if any) and `text` (if any), in that order.
pub async fn insert_in_step(
    ctx: &mut StepCtx,
    sql: &str,
    step: Option<u32>,
    text: Option<&str>,
) -> Result<(), StepError> {
    let mut q = sqlx::query(sql)
        .bind(ctx.job_id().as_uuid())
        .bind(ctx.token().get());
    if let Some(step) = step {
        q = q.bind(i32::try_from(step).unwrap_or(i32::MAX));
    }
    if let Some(text) = text {
        q = q.bind(text);
    }
    q.execute(ctx.db().await?).await?;
    Ok(())
}

/// Runs `sql`, an `INSERT` of the step's row with `$1` the job's id and `$2`
/// the step's token, on `pool`: a connection of its own (autocommit), not the
/// step's fenced transaction. What a job that writes around the fence does.
pub async fn insert_beside_step(
    ctx: &StepCtx,
    pool: &sqlx::PgPool,
    sql: &str,
) -> Result<(), StepError> {
    sqlx::query(sql)
        .bind(ctx.job_id().as_uuid())
        .bind(ctx.token().get())
        .execute(pool)
        .await?;
    Ok(())
}

/// Creates table `name` `(job_id, step, token)` in the test's schema, has
/// the kit's checker watch it, and guards it when `guarded`.
pub async fn step_table(env: &tenure::testing::TestEnv, name: &str, guarded: bool) {
    let table = format!("{}.{name}", env.schema());
    sqlx::query(&format!(
        "CREATE TABLE {table} (job_id uuid NOT NULL, step int NOT NULL, token bigint NOT NULL)"
    ))
    .execute(env.pool())
    .await
    .unwrap();
    env.history()
        .watch_table(&table, "job_id", "step", Some("token"));
    if guarded {
        env.client().install_guard(&table).await.unwrap();
    }
}

/// The `(step, token)` rows of `job` in the test's table `name` (a
/// [`step_table`]), by step.
pub async fn step_rows(
    env: &tenure::testing::TestEnv,
    name: &str,
    job: tenure::JobId,
) -> Vec<(i32, i64)> {
    let sql = format!(
        "SELECT step, token FROM {}.{name} WHERE job_id = $1 ORDER BY step",
        env.schema()
    );
    let rows = sqlx::query_as(&sql)
        .bind(job.as_uuid())
        .fetch_all(env.pool());
    rows.await.unwrap()
}

/// Appends `(job, step, token, worker)` to `schema.step_log` in the step's
/// fenced transaction.
async fn log_step(
    ctx: &mut StepCtx,
    schema: &str,
    step: u32,
    worker: &str,
) -> Result<(), StepError> {
    let sql = format!(
        "INSERT INTO {schema}.step_log (job_id, token, step, worker) VALUES ($1, $2, $3, $4)"
    );
    insert_in_step(ctx, &sql, Some(step), Some(worker)).await
}

impl ThreeStep {
    async fn log(&self, ctx: &mut StepCtx, w: &Work, step: u32) -> Result<(), StepError> {
        if w.slow_step == step && w.slow_worker.as_deref() == Some(self.worker.as_str()) {
            // Not bound to the cancellation token on purpose: a paused or blocked
            // worker does not notice that its lease is gone.
            tokio::time::sleep(Duration::from_millis(w.slow_ms)).await;
        }
        log_step(ctx, &self.schema, step, &self.worker).await
    }
}

#[tenure::job(name = "test.three_step", max_takeovers = 3, retries = 2)]
impl ThreeStep {
    #[step]
    async fn first(&self, ctx: &mut StepCtx, w: Work) -> Result<Work, StepError> {
        self.log(ctx, &w, 0).await?;
        Ok(w)
    }

    #[step]
    async fn second(&self, ctx: &mut StepCtx, w: Work) -> Result<Work, StepError> {
        if w.fail_times > ctx.attempt() {
            if w.panic {
                panic!("step two panics on purpose (attempt {})", ctx.attempt());
            }
            return Err(StepError::retryable(format!(
                "step two fails on purpose (attempt {})",
                ctx.attempt()
            )));
        }
        self.log(ctx, &w, 1).await?;
        Ok(w)
    }

    #[step]
    async fn third(&self, ctx: &mut StepCtx, w: Work) -> Result<u64, StepError> {
        // The job's input as enqueued reaches every step, whichever worker
        // claimed it (a takeover's claim re-reads it from the row).
        let enqueued: Work = ctx.input()?;
        if enqueued != w {
            return Err(StepError::permanent(format!(
                "ctx.input() {enqueued:?} is not the input {w:?}"
            )));
        }
        self.log(ctx, &w, 2).await?;
        Ok(w.n)
    }
}

/// Input of [`Cancellable`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Hold {
    /// How long step 0 waits for its cancellation after its write (0: not at all).
    pub hold_ms: u64,
}

/// What [`Cancellable`]'s steps saw, for the cancel tests.
#[derive(Debug, Default)]
pub struct CancelProbe {
    /// `(job, step)` each time a step wrote its `step_log` row (uncommitted yet).
    pub wrote: std::sync::Mutex<Vec<(tenure::JobId, u32)>>,
    /// When step 0's `ctx.cancellation()` fired, per job.
    pub fired: std::sync::Mutex<Vec<(tenure::JobId, std::time::Instant)>>,
}

impl CancelProbe {
    /// Whether step `step` of `job` wrote (in a transaction that may not commit).
    pub fn wrote(&self, job: tenure::JobId, step: u32) -> bool {
        self.wrote.lock().unwrap().contains(&(job, step))
    }
    /// When `job`'s step 0 saw its cancellation fire.
    pub fn fired(&self, job: tenure::JobId) -> Option<std::time::Instant> {
        self.fired
            .lock()
            .unwrap()
            .iter()
            .find(|(j, _)| *j == job)
            .map(|(_, t)| *t)
    }
}

/// A two-step job for the cancel tests. Step 0 writes its `step_log` row
/// through `ctx.db()`, then waits up to `hold_ms` for `ctx.cancellation()`,
/// and returns `Ok` either way: only the runtime stands between its write and
/// a commit. Step 1 writes its row.
#[derive(Debug, Clone)]
pub struct Cancellable {
    /// The schema of `step_log`.
    pub schema: String,
    /// What the steps saw.
    pub probe: std::sync::Arc<CancelProbe>,
}

impl Cancellable {
    async fn write(&self, ctx: &mut StepCtx, step: u32) -> Result<(), StepError> {
        log_step(ctx, &self.schema, step, "cancellable").await?;
        self.probe.wrote.lock().unwrap().push((ctx.job_id(), step));
        Ok(())
    }
}

#[tenure::job(name = "test.cancellable", retries = 2)]
impl Cancellable {
    #[step]
    async fn hold(&self, ctx: &mut StepCtx, h: Hold) -> Result<Hold, StepError> {
        self.write(ctx, 0).await?;
        let wait = Duration::from_millis(h.hold_ms);
        if tokio::time::timeout(wait, ctx.cancellation().cancelled())
            .await
            .is_ok()
        {
            let now = std::time::Instant::now();
            self.probe.fired.lock().unwrap().push((ctx.job_id(), now));
        }
        Ok(h)
    }

    #[step]
    async fn after(&self, ctx: &mut StepCtx, h: Hold) -> Result<u64, StepError> {
        self.write(ctx, 1).await?;
        Ok(h.hold_ms)
    }
}

/// When job `id` was first claimed (its first `claimed` or `taken_over`
/// event); `None` if never.
pub async fn claimed_at(
    client: &tenure::Client,
    id: tenure::JobId,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let events = client.store().job_events(id).await.expect("claimed_at");
    events
        .iter()
        .filter(|e| e.kind == "claimed" || e.kind == "taken_over")
        .map(|e| e.at)
        .min()
}

/// Counts rows of `step_log` per (job, step) that appear more than once.
pub async fn double_commits(pool: &sqlx::PgPool, schema: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM (SELECT job_id, step FROM {schema}.step_log
          GROUP BY job_id, step HAVING count(*) > 1) d"
    ))
    .fetch_one(pool)
    .await
    .expect("count doubles")
}

pub use tenure::devstack::wait_until;

/// Takes the one `job_type` message `max_deliver` times (its consumer's
/// `MaxDeliver`, AckWait 2 s) and settles it neither time (a worker that
/// crashes before settling), then pulls once more: the server raises its
/// max-deliveries advisory when a pull would get the message again. What
/// that last pull gets, if anything, is a fresh message a listener
/// published for a dead job's compensation: left unsettled.
pub async fn deliver_unsettled_past_max(
    queue: &tenure::blocks::queue::Queue,
    job_type: &str,
    max_deliver: usize,
) {
    for _ in 0..max_deliver {
        let got = queue
            .fetch(job_type, 1, Duration::from_secs(5))
            .await
            .expect("fetch");
        assert_eq!(got.len(), 1, "the message was not delivered");
        drop(got);
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    queue
        .fetch(job_type, 1, Duration::from_secs(1))
        .await
        .expect("fetch");
}

/// Waits until job `id`'s row is terminal and returns it; panics after
/// `timeout` with the row as it is.
pub async fn wait_terminal(
    client: &tenure::Client,
    id: tenure::JobId,
    timeout: Duration,
) -> tenure::JobRow {
    let until = std::time::Instant::now() + timeout;
    loop {
        let row = client.job(id).await.expect("read row").expect("job row");
        if row.status.is_terminal() {
            return row;
        }
        assert!(
            std::time::Instant::now() < until,
            "job {id} not finished after {timeout:?}: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Input of [`Compensated`]: move `amount` from `from` to `to` (an account
/// that does not exist makes the credit fail for good).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Move {
    /// The debited account.
    pub from: String,
    /// The credited account.
    pub to: String,
    /// How much.
    pub amount: i64,
    /// Worker id whose `on_dead` hook sleeps after its writes (a paused
    /// worker holding its compensation's transaction open).
    #[serde(default)]
    pub slow_hook_worker: Option<String>,
    /// How long it sleeps.
    #[serde(default)]
    pub slow_hook_ms: u64,
}

/// A transfer compensated by its `on_dead` hook: `debit`, then `credit`
/// (permanent failure when the destination has no row in `accounts`), and
/// `refund`, which puts the debit back and records `(job, token, worker)` in
/// `refunds`, both through its fenced transaction. Tables: `accounts (id,
/// balance)`, `refunds (job_id, token, worker)`, both guarded.
#[derive(Debug, Clone)]
pub struct Compensated {
    /// This worker's id.
    pub worker: String,
    /// The schema of the tables.
    pub schema: String,
}

impl Compensated {
    async fn add(&self, ctx: &mut StepCtx, account: &str, delta: i64) -> Result<u64, StepError> {
        let sql = format!(
            "UPDATE {}.accounts SET balance = balance + $2 WHERE id = $1",
            self.schema
        );
        let done = sqlx::query(&sql)
            .bind(account)
            .bind(delta)
            .execute(ctx.db().await?)
            .await?;
        Ok(done.rows_affected())
    }
}

#[tenure::job(name = "test.compensated", retries = 1, on_dead = refund)]
impl Compensated {
    #[step]
    async fn debit(&self, ctx: &mut StepCtx, m: Move) -> Result<Move, StepError> {
        self.add(ctx, &m.from, -m.amount).await?;
        Ok(m)
    }

    #[step]
    async fn credit(&self, ctx: &mut StepCtx, m: Move) -> Result<Move, StepError> {
        if self.add(ctx, &m.to, m.amount).await? == 0 {
            return Err(StepError::permanent(format!("no account {:?}", m.to)));
        }
        Ok(m)
    }

    async fn refund(&self, ctx: &mut StepCtx, dead: tenure::DeadJob) -> Result<(), StepError> {
        let Some(m) = dead.checkpoint_as::<Move>()? else {
            return Ok(());
        };
        self.add(ctx, &m.from, m.amount).await?;
        let sql = format!(
            "INSERT INTO {}.refunds (job_id, token, worker) VALUES ($1, $2, $3)",
            self.schema
        );
        insert_in_step(ctx, &sql, None, Some(&self.worker)).await?;
        if m.slow_hook_worker.as_deref() == Some(self.worker.as_str()) {
            // Not bound to cancellation: a paused worker notices nothing.
            tokio::time::sleep(Duration::from_millis(m.slow_hook_ms)).await;
        }
        Ok(())
    }
}

/// A tick batch of schedule `s` (`test.three_step`) enqueuing `ticks`
/// (oldest first, at least one) with `input`: nothing skipped, no next tick.
pub fn tick_batch<'a>(
    input: &'a serde_json::Value,
    ticks: &'a [chrono::DateTime<chrono::Utc>],
) -> tenure::blocks::fence::TickBatch<'a> {
    tenure::blocks::fence::TickBatch {
        name: "s",
        job_type: "test.three_step",
        input,
        ticks,
        skipped: 0,
        last_tick: *ticks.last().expect("a tick"),
        next_tick: None,
    }
}

/// How many times `job_type`'s consumer delivered (redeliveries included:
/// `delivered.consumer_seq`) and how many messages it delivered (its stream
/// sequence): a throttled or paused type must not burn deliveries.
pub async fn consumer_deliveries(env: &tenure::testing::TestEnv, job_type: &str) -> (u64, u64) {
    let nats = async_nats::connect(env.stack().nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let names = env.client().queue().names();
    let stream = js.get_stream(&names.stream).await.unwrap();
    let info = stream
        .consumer_info(names.type_consumer(job_type))
        .await
        .unwrap();
    (
        info.delivered.consumer_sequence,
        info.delivered.stream_sequence,
    )
}
