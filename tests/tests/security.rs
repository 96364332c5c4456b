//! Tenure against a secured dev stack: TLS with client certificates and
//! authentication on etcd, NATS and PostgreSQL, least-privilege PostgreSQL
//! roles. Every refusal must come fast, typed, and name the server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use tenure::Worker;
use tenure::blocks::fence::{FenceError, FenceStore, JobStatus};
use tenure::blocks::lease::{LeaseError, Session};
use tenure::blocks::queue::{Queue, QueueError};
use tenure::devstack::DevStack;
use tenure::security::{AccessError, AccessStep, NatsAuth, Secret, Server, TlsFiles};
use tenure::{Client, ClientError, Config, EnqueueItemError, JobId};
use tenure_tests::{ThreeStep, Work, prepare_schema, wait_until, work};
use tenure_tests::{secured_config, secured_stack};

/// The namespace the stack's limited etcd and NATS users may use.
const NS: &str = "sec";
/// A refusal must come well before any timeout.
const FAST: Duration = Duration::from_secs(5);

/// A configuration for the secured stack as PostgreSQL role `role`.
fn secured(stack: &DevStack, role: &str, password: &Secret) -> Config {
    let nats = stack.auth().expect("auth").nats_auth();
    secured_config(stack, NS, nats, role, password)
        .with_schema(NS)
        .with_lease_ttl(Duration::from_secs(3))
}

fn worker_cfg(stack: &DevStack) -> Config {
    let auth = stack.auth().expect("auth");
    secured(stack, "tenure_worker", &auth.worker_password)
}

/// The operator's deployment step: the migrator's PostgreSQL role and the
/// namespace's NATS operator (only it may create the streams).
fn migrator_cfg(stack: &DevStack) -> Config {
    let auth = stack.auth().expect("auth");
    secured(stack, "tenure_migrator", &auth.migrator_password)
        .with_nats_auth(auth.nats.operator.auth())
}

/// Asserts `refusal` is about `server` at `step`, came within [`FAST`], and
/// shows no secret.
fn assert_refused(refusal: &AccessError, server: Server, step: AccessStep, started: Instant) {
    assert_eq!((refusal.server, refusal.step), (server, step), "{refusal}");
    assert!(
        started.elapsed() < FAST,
        "took {:?}: {refusal}",
        started.elapsed()
    );
    let text = refusal.to_string();
    assert!(text.starts_with(&server.to_string()), "{text}");
    assert!(!text.contains("pw-"), "a secret leaked: {text}");
    eprintln!("refused as expected: {text}");
}

async fn etcd_refusal(cfg: Config) -> (AccessError, Instant) {
    let started = Instant::now();
    match Session::establish(&cfg).await {
        Err(LeaseError::Access(refusal)) => (refusal, started),
        other => panic!("expected an etcd refusal, got {other:?}"),
    }
}

async fn nats_refusal(cfg: Config) -> (AccessError, Instant) {
    let started = Instant::now();
    match Queue::connect(&cfg).await {
        Err(QueueError::Access(refusal)) => (refusal, started),
        other => panic!("expected a NATS refusal, got {other:?}"),
    }
}

async fn pg_refusal(cfg: Config) -> (AccessError, Instant) {
    let started = Instant::now();
    match FenceStore::connect(&cfg).await {
        Err(FenceError::Access(refusal)) => (refusal, started),
        other => panic!("expected a PostgreSQL refusal, got {other:?}"),
    }
}

/// Replaces the TLS query of the stack's URL for `role` with `ssl`.
fn pg_url_with(stack: &DevStack, ssl: &str) -> String {
    let auth = stack.auth().expect("auth");
    let url = stack.database_url_as("tenure_worker", Some(&auth.worker_password), "tenure");
    let base = url.split('?').next().unwrap_or(&url).to_string();
    format!("{base}?{ssl}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_three_step_job_runs_over_tls_with_auth_as_the_worker_role() {
    let stack = secured_stack(NS, true);
    let migrator = migrated(stack).await;
    sqlx::query(&format!(
        "GRANT SELECT, INSERT ON {NS}.step_log TO tenure_worker"
    ))
    .execute(migrator.store().pool())
    .await
    .expect("grant step_log");

    // The worker runs on the application's own pool, built with Tenure's
    // per-connection settings.
    let cfg = worker_cfg(stack);
    let pool = tenure::blocks::fence::pool_options(&cfg)
        .connect_with(tenure::blocks::fence::connect_options(&cfg).expect("options"))
        .await
        .expect("the application's pool");
    let lock_timeout: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(&pool)
        .await
        .expect("show");
    assert_eq!(lock_timeout, "6s", "after_connect applies 2 x TTL");
    let worker = Worker::builder(
        cfg.clone()
            .with_database_pool(pool)
            .with_worker_id("secure-w"),
    )
    .register(ThreeStep {
        worker: "secure-w".into(),
        schema: NS.into(),
    })
    .start()
    .await
    .expect("worker over TLS as tenure_worker");
    let client = Client::connect(&cfg)
        .await
        .expect("producer as tenure_worker");
    let job = client
        .enqueue::<ThreeStep>("secured-1", &work(1))
        .await
        .expect("enqueue");
    let done = wait_until(Duration::from_secs(60), || async {
        matches!(client.job(job.job_id).await, Ok(Some(r)) if r.status == JobStatus::Done)
    })
    .await;
    assert!(
        done,
        "the job did not finish: {:?}",
        client.job(job.job_id).await
    );
    let steps: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {NS}.step_log WHERE job_id = $1"
    ))
    .bind(job.job_id.as_uuid())
    .fetch_one(migrator.store().pool())
    .await
    .expect("count steps");
    assert_eq!(steps, 3);
    worker.shutdown().await.expect("shutdown");

    // The worker role cannot do DDL on a guarded table, nor bypass its guard.
    let store = client.store();
    let table = format!("{NS}.step_log");
    let started = Instant::now();
    match store.remove_guard(&table).await {
        Err(FenceError::Access(r)) => {
            assert_refused(&r, Server::Postgres, AccessStep::Authorize, started)
        }
        other => panic!("the worker removed a guard: {other:?}"),
    }
    for ddl in [
        format!("ALTER TABLE {table} DISABLE TRIGGER ALL"),
        format!("DROP TABLE {table}"),
        "SET session_replication_role = replica".to_string(),
    ] {
        let started = Instant::now();
        let err = sqlx::query(&ddl)
            .execute(store.pool())
            .await
            .expect_err(&ddl);
        match FenceError::from(err) {
            FenceError::Access(r) => {
                assert_refused(&r, Server::Postgres, AccessStep::Authorize, started)
            }
            other => panic!("{ddl}: {other:?}"),
        }
    }
    let mut tx = store.pool().begin().await.expect("begin");
    let started = Instant::now();
    match store.bypass_guard(&mut tx).await {
        Err(FenceError::Access(r)) => {
            assert_refused(&r, Server::Postgres, AccessStep::Authorize, started)
        }
        other => panic!("the worker bypassed the guard: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_by_each_server() {
    let stack = secured_stack(NS, true);
    let tls = stack.tls().expect("tls");
    let wrong =
        TlsFiles::new(&tls.other_ca_file).with_client_cert(&tls.client_cert, &tls.client_key);
    let (r, t) = etcd_refusal(worker_cfg(stack).with_etcd_tls(wrong.clone())).await;
    assert_refused(&r, Server::Etcd, AccessStep::Tls, t);
    assert_eq!(r.detail, "unknown CA");
    let (r, t) = nats_refusal(worker_cfg(stack).with_nats_tls(wrong)).await;
    assert_refused(&r, Server::Nats, AccessStep::Tls, t);
    let ssl = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        tls.other_ca_file.display(),
        tls.client_cert.display(),
        tls.client_key.display()
    );
    let (r, t) = pg_refusal(worker_cfg(stack).with_database_url(pg_url_with(stack, &ssl))).await;
    assert_refused(&r, Server::Postgres, AccessStep::Tls, t);
}

/// `sslmode=require` with `sslrootcert` verifies the server's certificate
/// against it, as libpq does (`verify-ca`): a wrong CA is refused, the right
/// one connects. (sqlx alone accepts any certificate under `require`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_with_a_root_cert_verifies_the_server() {
    let stack = secured_stack(NS, true);
    let tls = stack.tls().expect("tls");
    let ssl = |ca: &std::path::Path| {
        format!(
            "sslmode=require&sslrootcert={}&sslcert={}&sslkey={}",
            ca.display(),
            tls.client_cert.display(),
            tls.client_key.display()
        )
    };
    let wrong = pg_url_with(stack, &ssl(&tls.other_ca_file));
    let (r, t) = pg_refusal(worker_cfg(stack).with_database_url(wrong)).await;
    assert_refused(&r, Server::Postgres, AccessStep::Tls, t);
    let right = pg_url_with(stack, &ssl(&tls.ca_file));
    FenceStore::connect(&worker_cfg(stack).with_database_url(right))
        .await
        .expect("the right CA connects");
}

/// MariaDB's TLS is its URL's, as the MySQL clients read it: `REQUIRED` with
/// `ssl-ca` verifies the server's certificate (`VERIFY_CA`), so a wrong CA is
/// refused; the right one connects, also with `VERIFY_IDENTITY`. (sqlx alone
/// accepts any certificate under `REQUIRED`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_required_with_a_ca_verifies_the_server() {
    use tenure::MySqlFence;
    let stack = secured_stack(NS, true);
    let tls = stack.tls().expect("tls");
    let cfg = worker_cfg(stack);
    let url = |query: String| format!("{}?{query}", stack.mysql_url());
    let wrong = url(format!(
        "ssl-mode=REQUIRED&ssl-ca={}",
        tls.other_ca_file.display()
    ));
    let fence = MySqlFence::connect("bank", &wrong, &cfg)
        .await
        .expect("the pool connects lazily");
    let err = sqlx::query("SELECT 1")
        .execute(fence.pool())
        .await
        .expect_err("the wrong CA connected");
    assert!(
        format!("{err:?}").contains("UnknownIssuer"),
        "not refused for its CA: {err:?}"
    );
    for mode in ["REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"] {
        let right = url(format!("ssl-mode={mode}&ssl-ca={}", tls.ca_file.display()));
        let fence = MySqlFence::connect("bank", &right, &cfg)
            .await
            .expect("connect");
        sqlx::query("SELECT 1")
            .execute(fence.pool())
            .await
            .unwrap_or_else(|e| panic!("{mode} with the right CA: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_or_expired_client_certificate_is_refused_by_each_server() {
    let stack = secured_stack(NS, true);
    let tls = stack.tls().expect("tls");
    let absent = TlsFiles::new(&tls.ca_file);
    let expired = TlsFiles::new(&tls.ca_file)
        .with_client_cert(&tls.expired_client_cert, &tls.expired_client_key);
    for files in [absent, expired] {
        let (r, t) = etcd_refusal(worker_cfg(stack).with_etcd_tls(files.clone())).await;
        assert_refused(&r, Server::Etcd, AccessStep::Tls, t);
        let (r, t) = nats_refusal(worker_cfg(stack).with_nats_tls(files.clone())).await;
        assert_refused(&r, Server::Nats, AccessStep::Tls, t);
        let mut ssl = format!("sslmode=verify-full&sslrootcert={}", tls.ca_file.display());
        if let (Some(c), Some(k)) = (&files.cert_file, &files.key_file) {
            ssl += &format!("&sslcert={}&sslkey={}", c.display(), k.display());
        }
        let (r, t) =
            pg_refusal(worker_cfg(stack).with_database_url(pg_url_with(stack, &ssl))).await;
        assert_refused(&r, Server::Postgres, AccessStep::Tls, t);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_by_each_server() {
    let stack = secured_stack(NS, true);
    let auth = stack.auth().expect("auth");
    let wrong = Secret::new("pw-wrong");
    let (r, t) =
        etcd_refusal(worker_cfg(stack).with_etcd_user(&auth.etcd_user, wrong.clone())).await;
    assert_refused(&r, Server::Etcd, AccessStep::Authenticate, t);
    let nats = NatsAuth::UserPassword {
        user: auth.nats.worker.user.clone(),
        password: wrong.clone(),
    };
    let (r, t) = nats_refusal(worker_cfg(stack).with_nats_auth(nats)).await;
    assert_refused(&r, Server::Nats, AccessStep::Authenticate, t);
    let url = stack.database_url_as("tenure_worker", Some(&wrong), "tenure");
    let (r, t) = pg_refusal(worker_cfg(stack).with_database_url(url)).await;
    assert_refused(&r, Server::Postgres, AccessStep::Authenticate, t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_is_refused_by_each_server() {
    let stack = secured_stack(NS, true);
    let auth = stack.auth().expect("auth");
    let mut cfg = worker_cfg(stack);
    cfg.etcd_tls = None;
    cfg.nats_tls = None;
    cfg.etcd_endpoints = stack
        .etcd_endpoints()
        .iter()
        .map(|e| e.replace("https://", "http://"))
        .collect();
    let (r, t) = etcd_refusal(cfg.clone()).await;
    assert_refused(&r, Server::Etcd, AccessStep::Tls, t);
    let (r, t) = nats_refusal(cfg.clone()).await;
    assert_refused(&r, Server::Nats, AccessStep::Tls, t);
    let url = stack.database_url_as("tenure_worker", Some(&auth.worker_password), "tenure");
    let url = format!("{}?sslmode=disable", url.split('?').next().unwrap_or(&url));
    let (r, t) = pg_refusal(cfg.with_database_url(url)).await;
    assert_refused(&r, Server::Postgres, AccessStep::Tls, t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_user_cannot_write_outside_its_prefix() {
    let stack = secured_stack(NS, true);
    // The `tenure` user's role covers `sec/` only; namespace `other` is outside.
    let cfg = worker_cfg(stack).with_namespace("other");
    let session = Session::establish(&cfg)
        .await
        .expect("a lease needs no key");
    let started = Instant::now();
    match session.acquire(JobId::from_key("t", "outside")).await {
        Err(LeaseError::Access(r)) => {
            assert_refused(&r, Server::Etcd, AccessStep::Authorize, started)
        }
        other => panic!("wrote outside the prefix: {other:?}"),
    }
    let _ = session.close().await;
}

#[test]
fn debug_of_a_secured_config_shows_no_secret() {
    let stack = secured_stack(NS, true);
    let text = format!("{:?}", worker_cfg(stack));
    assert!(!text.contains("pw-"), "{text}");
    assert!(text.contains("***"), "{text}");
}

// ---------------------------------------------------------------------------
// Least privilege on the job rows (migration 0015): no role that runs or
// enqueues jobs can forge a running job, move a fence, reopen a finished job
// or write the schedule and fence tables, and the walls on `jobs` refuse
// those writes even from a role that holds `UPDATE`.

/// A role of the secured stack's PostgreSQL, made on the fly by the superuser.
async fn extra_role(stack: &DevStack, role: &str) -> Config {
    let auth = stack.auth().expect("auth");
    let su = stack.database_url_as("postgres", Some(&auth.postgres_password), "tenure");
    let pool = sqlx::PgPool::connect(&su).await.expect("superuser");
    let password = Secret::new(format!("pw-{role}"));
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(role)
            .fetch_one(&pool)
            .await
            .expect("role lookup");
    if !exists {
        let create = format!("CREATE ROLE {role} LOGIN PASSWORD '{}'", password.expose());
        sqlx::query(&create)
            .execute(&pool)
            .await
            .expect("create role");
        let connect = format!("GRANT CONNECT ON DATABASE tenure TO {role}");
        sqlx::query(&connect).execute(&pool).await.expect("connect");
    }
    pool.close().await;
    secured(stack, role, &password)
}

/// A job id no test used before.
fn fresh_id() -> JobId {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    JobId::from_key("forged", &nanos.to_string())
}

/// The migrated, granted schema: the migrator's, the worker's and a
/// producer's stores.
async fn roles() -> (FenceStore, FenceStore, FenceStore) {
    let stack = secured_stack(NS, true);
    let migrator = migrated(stack).await;
    let store = migrator.store().clone();
    let producer_cfg = secured(stack, "tenure_producer", &Secret::new("pw-tenure_producer"));
    let worker = FenceStore::connect(&worker_cfg(stack))
        .await
        .expect("worker");
    let producer = FenceStore::connect(&producer_cfg).await.expect("producer");
    (store, worker, producer)
}

/// Runs `sql` on `store`'s pool and returns its refusal (panics if it ran).
async fn refusal_of(store: &FenceStore, sql: &str) -> FenceError {
    match sqlx::query(sql).execute(store.pool()).await {
        Ok(done) => panic!("ran ({} rows): {sql}", done.rows_affected()),
        Err(e) => FenceError::from(e),
    }
}

/// `err` is a privilege refusal or a wall's (never a silent success).
fn assert_forbidden(err: &FenceError, what: &str) {
    let ok = matches!(
        err,
        FenceError::Access(AccessError {
            step: AccessStep::Authorize,
            ..
        }) | FenceError::ProtocolRefused { .. }
    );
    assert!(ok, "{what}: expected a refusal, got {err:?}");
    eprintln!("{what}: refused as expected: {err}");
}

/// A pending `least-privilege` job `key` with `input`, inserted as `store`'s
/// role (it may: the producer and the worker).
async fn pending_job(store: &FenceStore, key: &str, input: serde_json::Value) -> JobId {
    let id = JobId::from_key("least-privilege", key);
    store
        .insert_job(id, "least-privilege", &input)
        .await
        .expect("the role inserts a pending job");
    id
}

/// A pending job of `store`'s schema, claimed by `token` (as the worker).
async fn claimed_job(worker: &FenceStore, key: &str, token: i64) -> JobId {
    let id = pending_job(worker, key, serde_json::json!({"k": key})).await;
    let tok = tenure::FencingToken::for_tests(token);
    let _ = worker.claim(id, tok).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_role_cannot_forge_a_running_job_past_a_guard() {
    let (_migrator, worker, _) = roles().await;
    let id = fresh_id();
    // 1. A running row with fence 1, inserted directly.
    let err = refusal_of(
        &worker,
        &format!(
            "INSERT INTO {NS}.jobs (id, job_type, input, status, fence) \
             VALUES ('{id}', 'forged', '{{}}', 'running', 1)"
        ),
    )
    .await;
    assert_forbidden(&err, "inserting a running row");
    // 2. A pending row (allowed), then the guard's settings set by hand and a
    //    guarded write: the guard admits only a definer-recorded admission.
    worker
        .insert_job(id, "forged", &serde_json::json!({}))
        .await
        .expect("a pending row is an enqueue");
    let mut tx = worker.pool().begin().await.expect("begin");
    sqlx::query(
        "SELECT set_config('tenure.job_id', $1, true), set_config('tenure.fence', '0', true)",
    )
    .bind(id.to_string())
    .execute(&mut *tx)
    .await
    .expect("settings are anyone's");
    let write = format!(
        "INSERT INTO {NS}.step_log (job_id, step, token, worker) VALUES ('{id}', 0, 0, 'forger')"
    );
    let err = sqlx::query(&write)
        .execute(&mut *tx)
        .await
        .expect_err("forged write");
    assert!(
        matches!(FenceError::from(err), FenceError::GuardRefused { .. }),
        "the guard must refuse a write admitted only by settings"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_role_can_lower_or_raise_a_fence_by_hand() {
    let (migrator, worker, producer) = roles().await;
    let id = claimed_job(&worker, "fence-moves", 100).await;
    for (who, store) in [("worker", &worker), ("producer", &producer)] {
        for fence in ["1", "9223372036854775807"] {
            let sql = format!("UPDATE {NS}.jobs SET fence = {fence} WHERE id = '{id}'");
            assert_forbidden(
                &refusal_of(store, &sql).await,
                &format!("{who}: fence {fence}"),
            );
        }
    }
    // The owner holds UPDATE; the wall still refuses a fence that goes down.
    let sql = format!("UPDATE {NS}.jobs SET fence = 1 WHERE id = '{id}'");
    let err = refusal_of(&migrator, &sql).await;
    assert!(matches!(err, FenceError::ProtocolRefused { .. }), "{err:?}");
    let row = migrator.job(id).await.expect("read").expect("row");
    assert_eq!(row.fence, 100, "the fence moved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_job_never_reopens_and_a_dead_one_only_by_redrive() {
    let (migrator, worker, _) = roles().await;
    let id = pending_job(&worker, "reopen", serde_json::json!({})).await;
    let tok = tenure::FencingToken::for_tests(7);
    let (claim, tx) = worker.claim_and_begin(id, tok).await.expect("claim");
    if claim.status != JobStatus::Done {
        tx.commit_step(&serde_json::json!({}), true)
            .await
            .expect("last step");
    }
    let reopen = format!("UPDATE {NS}.jobs SET status = 'pending' WHERE id = '{id}'");
    assert_forbidden(&refusal_of(&worker, &reopen).await, "worker reopens done");
    let err = refusal_of(&migrator, &reopen).await;
    assert!(
        matches!(err, FenceError::ProtocolRefused { .. }),
        "owner: {err:?}"
    );
    assert_eq!(
        migrator.job(id).await.expect("read").expect("row").status,
        JobStatus::Done
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_and_fence_tables_are_written_only_through_their_functions() {
    let (_migrator, worker, producer) = roles().await;
    for (who, store) in [("worker", &worker), ("producer", &producer)] {
        for sql in [
            format!("UPDATE {NS}.schedules SET last_tick = now() + interval '10 years'"),
            format!(
                "INSERT INTO {NS}.leader_fences (role, fence, worker) \
                 VALUES ('forged-{who}', 9223372036854775807, 'x')"
            ),
            format!("UPDATE {NS}.leader_fences SET fence = 1"),
            format!(
                "INSERT INTO {NS}.partition_fences (job_type, partition, fence, worker) \
                 VALUES ('forged-{who}', 0, 9223372036854775807, 'x')"
            ),
            format!("UPDATE {NS}.partition_fences SET fence = 1"),
        ] {
            assert_forbidden(&refusal_of(store, &sql).await, &format!("{who}: {sql}"));
        }
    }
    // Through the functions, the protocol's own writes still work.
    let tok = tenure::FencingToken::for_tests(5);
    worker
        .claim_leader("least-privilege-leader", tok, "w")
        .await
        .expect("a leader claim");
    worker
        .claim_partition("least-privilege", 0, tok, "w")
        .await
        .expect("a partition claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_inserts_only_pending_rows_and_changes_no_status() {
    let (_migrator, worker, producer) = roles().await;
    let id = pending_job(&producer, "producer", serde_json::json!({})).await;
    let tok = tenure::FencingToken::for_tests(3);
    for sql in [
        format!(
            "INSERT INTO {NS}.jobs (id, job_type, input, fence) \
             VALUES ('{}', 't', '{{}}', 9223372036854775807)",
            fresh_id()
        ),
        format!("UPDATE {NS}.jobs SET status = 'cancelled' WHERE id = '{id}'"),
        format!("SELECT * FROM {NS}.tenure_claim('{id}', 3, false, false)"),
    ] {
        assert_forbidden(&refusal_of(&producer, &sql).await, &sql);
    }
    worker.claim(id, tok).await.expect("the worker claims it");
}

/// The schema migrated, its test tables created and the worker role
/// granted, once per test process: concurrent `CREATE TABLE IF NOT EXISTS`
/// race in PostgreSQL's catalog, and two clients' first connects race to
/// create the namespace's streams (`subjects overlap with an existing
/// stream`).
async fn migrated(stack: &DevStack) -> Client {
    static MIGRATED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let connect = || async {
        Client::connect(&migrator_cfg(stack))
            .await
            .expect("migrator")
    };
    MIGRATED
        .get_or_init(|| async {
            let migrator = connect().await;
            prepare_schema(&migrator).await;
            let store = migrator.store();
            store.grant_worker("tenure_worker").await.expect("grant");
            // A producer role (least privilege on the job rows).
            extra_role(stack, "tenure_producer").await;
            store
                .grant_producer("tenure_producer")
                .await
                .expect("grant");
        })
        .await;
    connect().await
}

/// A client as the worker role on a migrated, granted schema.
async fn worker_client(stack: &DevStack) -> Client {
    migrated(stack).await;
    Client::connect(&worker_cfg(stack))
        .await
        .expect("client as tenure_worker")
}

async fn assert_no_row(client: &Client, job_id: JobId, what: &str) {
    let row = client.job(job_id).await.expect("read");
    assert!(row.is_none(), "{what} left a row: {row:?}");
}

fn assert_too_large<T: std::fmt::Debug>(r: &Result<T, ClientError>) {
    assert!(
        matches!(
            r,
            Err(ClientError::Queue(QueueError::MessageTooLarge { .. }))
        ),
        "{r:?}"
    );
}

/// An input whose message is larger than the server's `max_payload`.
fn too_large(client: &Client) -> Work {
    Work {
        n: 1,
        slow_worker: Some("x".repeat(client.queue().max_payload())),
        ..Work::default()
    }
}

/// Every enqueue path checks the job type and the size of the message it
/// will publish (NATS `max_payload`, headers included) before it writes: a
/// refusal is typed and leaves no row that no message would ever run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_enqueue_path_validates_before_it_writes() {
    use tenure::Job;
    let client = worker_client(secured_stack(NS, true)).await;
    let big = too_large(&client);
    let r = client
        .enqueue_json("bad type", "v-1", serde_json::json!(1))
        .await;
    assert!(
        matches!(
            r,
            Err(ClientError::Queue(QueueError::InvalidJobType { .. }))
        ),
        "{r:?}"
    );
    assert_no_row(&client, JobId::from_key("bad type", "v-1"), "a bad type").await;
    let json = serde_json::to_value(&big).unwrap();
    let r = client.enqueue_json("sec.big", "v-2", json).await;
    assert_too_large(&r);
    assert_no_row(&client, JobId::from_key("sec.big", "v-2"), "enqueue_json").await;
    let r = client.enqueue::<ThreeStep>("v-3", &big).await;
    assert_too_large(&r);
    assert_no_row(&client, JobId::from_key(ThreeStep::NAME, "v-3"), "enqueue").await;
    let later = Duration::from_secs(3600);
    let r = client.enqueue_after::<ThreeStep>("v-4", &big, later).await;
    assert_too_large(&r);
    assert_no_row(
        &client,
        JobId::from_key(ThreeStep::NAME, "v-4"),
        "enqueue_after",
    )
    .await;
    let mut tx = client.store().pool().begin().await.expect("begin");
    let r = client.enqueue_in::<ThreeStep>(&mut tx, "v-5", &big).await;
    assert_too_large(&r);
    sqlx::query("SELECT 1")
        .execute(&mut *tx)
        .await
        .expect("the caller's transaction is still usable");
    tx.commit().await.expect("commit");
    assert_no_row(
        &client,
        JobId::from_key(ThreeStep::NAME, "v-5"),
        "enqueue_in",
    )
    .await;
    let r = client
        .enqueue_many::<ThreeStep>(&[("v-6", big.clone())])
        .await
        .expect("a batch");
    assert!(
        matches!(r[0], Err(EnqueueItemError::TooLarge { .. })),
        "{r:?}"
    );
    assert_no_row(
        &client,
        JobId::from_key(ThreeStep::NAME, "v-6"),
        "enqueue_many",
    )
    .await;
}

/// A schedule whose input cannot be published is refused at the worker's
/// start, before the schedule is stored (each tick would otherwise leave a
/// row no message runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_too_large_to_publish_is_refused_at_start() {
    let stack = secured_stack(NS, true);
    let client = worker_client(stack).await;
    let big = too_large(&client);
    let started = Worker::builder(worker_cfg(stack).with_worker_id("sched-w"))
        .register(ThreeStep {
            worker: "sched-w".into(),
            schema: NS.into(),
        })
        .schedule::<ThreeStep>("too-large", "0 0 * * *", &big)
        .start()
        .await;
    match started {
        Err(tenure::WorkerError::Queue(QueueError::MessageTooLarge { .. })) => {}
        Err(other) => panic!("{other:?}"),
        Ok(worker) => {
            worker.shutdown().await.expect("shutdown");
            panic!("a worker started with a schedule too large to publish");
        }
    }
    let stored = client.store().schedules().await.expect("schedules");
    assert!(
        stored.iter().all(|s| s.name != "too-large"),
        "the schedule was stored: {stored:?}"
    );
}

/// The SQLSTATE of a refused statement (panics if it was not refused).
async fn refused_with<T: std::fmt::Debug>(r: Result<T, sqlx::Error>, what: &str) -> String {
    match r {
        Err(sqlx::Error::Database(d)) => {
            eprintln!("{what}: refused as expected: {}", d.message());
            d.code().map(|c| c.to_string()).unwrap_or_default()
        }
        other => panic!("{what} was not refused: {other:?}"),
    }
}

/// `tenure_prune_jobs` and `tenure_prune_tombstones` refuse, as the worker
/// role, an age below the schema's prune floor (1 s unless the schema's owner
/// raises it in `prune_floor`, which the worker cannot write) and a batch
/// outside 1..=10000 (SQLSTATE TF020): a worker cannot delete every finished
/// job, its history and its tombstone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_functions_refuse_ages_and_batches_out_of_bounds() {
    let stack = secured_stack(NS, true);
    let client = worker_client(stack).await;
    let pool = client.store().pool();
    let prunes = [
        (
            "prune jobs",
            format!("SELECT {NS}.tenure_prune_jobs('done', $1, $2)"),
        ),
        (
            "prune tombstones",
            format!("SELECT {NS}.tenure_prune_tombstones($1, $2)"),
        ),
    ];
    for (age, limit) in [(-1.0, 10), (0.0, 10), (0.5, 10), (60.0, 0), (60.0, 100_000)] {
        for (what, sql) in &prunes {
            let pruned = sqlx::query_scalar::<_, i64>(sql)
                .bind(age)
                .bind(limit)
                .fetch_one(pool)
                .await;
            let code = refused_with(pruned, &format!("{what} {age} s, {limit}")).await;
            assert_eq!(code, "TF020");
        }
    }
    let age = Duration::from_secs(60);
    client
        .store()
        .prune_jobs(JobStatus::Done, age, 10)
        .await
        .expect("an age above the floor");
    let r = client.store().prune_jobs(JobStatus::Done, age, 0).await;
    assert!(
        matches!(r, Err(FenceError::ArgumentRefused { .. })),
        "{r:?}"
    );
    let raise = format!("UPDATE {NS}.prune_floor SET job_age_secs = 7200");
    let r = sqlx::query(&raise).execute(pool).await;
    assert_eq!(
        refused_with(r, "the worker raising the floor").await,
        "42501"
    );
}

/// The floor the schema's owner sets binds the worker role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_sets_the_prune_floor() {
    let stack = secured_stack(NS, true);
    let migrator = migrated(stack).await;
    let client = worker_client(stack).await;
    let sql = format!("UPDATE {NS}.prune_floor SET job_age_secs = $1, key_age_secs = $1");
    let set = |secs: f64| sqlx::query(&sql).bind(secs);
    set(86_400.0)
        .execute(migrator.store().pool())
        .await
        .expect("the owner sets the floor");
    let hour = Duration::from_secs(3600);
    let r = client.store().prune_jobs(JobStatus::Done, hour, 10).await;
    set(1.0)
        .execute(migrator.store().pool())
        .await
        .expect("reset");
    assert!(
        matches!(r, Err(FenceError::ArgumentRefused { .. })),
        "{r:?}"
    );
    client
        .store()
        .prune_jobs(JobStatus::Done, hour, 10)
        .await
        .expect("above the floor again");
}

/// A second login role with the worker's privileges.
async fn second_worker_role(stack: &DevStack) -> Config {
    let admin = sqlx::PgPool::connect(&stack.database_url())
        .await
        .expect("superuser");
    let password = Secret::new("pw-second-worker");
    sqlx::query(&format!(
        "DO $$ BEGIN CREATE ROLE tenure_worker_b LOGIN PASSWORD '{}'; \
         EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        password.expose()
    ))
    .execute(&admin)
    .await
    .expect("create role");
    sqlx::query("GRANT CONNECT ON DATABASE tenure TO tenure_worker_b")
        .execute(&admin)
        .await
        .expect("connect");
    migrated(stack)
        .await
        .store()
        .grant_worker("tenure_worker_b")
        .await
        .expect("grant");
    let url = stack.database_url_as("tenure_worker_b", Some(&password), "tenure");
    worker_cfg(stack).with_database_url(url)
}

fn report(worker: &str, health: &'static str) -> tenure::blocks::fence::WorkerReport {
    tenure::blocks::fence::WorkerReport {
        worker: worker.into(),
        lease_id: Some(7),
        health,
        in_flight: 0,
        max_in_flight: 4,
        lease_ttl: Duration::from_secs(3),
        started_at: chrono::Utc::now(),
        job_types: vec!["sec.t".into()],
        type_limits: std::collections::BTreeMap::new(),
    }
}

/// A worker's report row remembers the role that wrote it: another role
/// cannot overwrite it (permission denied), and a report's values are
/// bounded (TF020).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_cannot_overwrite_another_roles_worker_report() {
    let stack = secured_stack(NS, true);
    let client = worker_client(stack).await;
    let a = client.store();
    let b = FenceStore::connect(&second_worker_role(stack).await)
        .await
        .expect("second role");
    a.report_worker(&report("owned-by-a", "healthy"))
        .await
        .expect("a reports itself");
    let started = Instant::now();
    match b.report_worker(&report("owned-by-a", "lost")).await {
        Err(FenceError::Access(r)) => {
            assert_refused(&r, Server::Postgres, AccessStep::Authorize, started)
        }
        other => panic!("another role overwrote the report: {other:?}"),
    }
    b.report_worker(&report("owned-by-b", "healthy"))
        .await
        .expect("b reports itself");
    a.report_worker(&report("owned-by-a", "stopped"))
        .await
        .expect("a reports itself again");
    let r = a.report_worker(&report("owned-by-a", "bogus")).await;
    assert!(
        matches!(r, Err(FenceError::ArgumentRefused { .. })),
        "{r:?}"
    );
}

/// `tenure_record_refusal` records only what a fence can have refused: a
/// token below the job's fence, of a job that exists, once, with a short
/// `where`; a made-up refusal is refused (TF020).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_record_a_made_up_refusal() {
    use tenure::FencingToken;
    let client = worker_client(secured_stack(NS, true)).await;
    let store = client.store();
    let id = JobId::from_key("sec.refusal", "r-1");
    store
        .insert_job(id, "sec.refusal", &serde_json::json!(1))
        .await
        .expect("insert");
    store
        .claim(id, FencingToken::for_tests(41))
        .await
        .expect("claim");
    let sql = format!("SELECT {NS}.tenure_record_refusal($1, $2, $3, $4, $5)");
    let record = |token: i64, current: Option<i64>, step: Option<i32>, at: String, job: JobId| {
        sqlx::query(&sql)
            .bind(job.as_uuid())
            .bind(token)
            .bind(current)
            .bind(step)
            .bind(at)
            .execute(store.pool())
    };
    let unknown = JobId::from_key("sec.refusal", "nobody");
    for (what, r) in [
        (
            "a token at the fence",
            record(41, Some(41), Some(0), "step".into(), id).await,
        ),
        (
            "a token above the fence",
            record(99, Some(41), Some(0), "step".into(), id).await,
        ),
        (
            "a winner above the fence",
            record(40, Some(99), Some(0), "step".into(), id).await,
        ),
        (
            "a step not reached",
            record(40, Some(41), Some(9), "step".into(), id).await,
        ),
        (
            "a long where",
            record(40, Some(41), Some(0), "x".repeat(10_000), id).await,
        ),
        (
            "an unknown job",
            record(1, Some(2), None, "claim".into(), unknown).await,
        ),
    ] {
        assert_eq!(refused_with(r, what).await, "TF020", "{what}");
    }
    for _ in 0..3 {
        record(40, Some(41), Some(0), "step".into(), id)
            .await
            .expect("a real refusal");
    }
    let owner = migrated(secured_stack(NS, true)).await;
    let events = owner.store().job_events(id).await.expect("events");
    let refusals = events.iter().filter(|e| e.kind == "stale_refused").count();
    assert_eq!(
        refusals, 1,
        "one event per refused token and step: {events:?}"
    );
}
