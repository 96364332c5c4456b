//! Namespaces are walls on NATS, and each role of a namespace does only its
//! part (issue 31 item 3); the dev stack keeps its secrets private (item 7).
//!
//! A secured dev stack (TLS with client certificates, a user per role) with
//! two namespaces: `nsa`, whose users the tests act as, and `nsa_dlq` (its
//! stream names begin with `nsa`'s DLQ stream name, `TENURE_NSA_DLQ`), the
//! namespace they must not reach. A refused publish or subscription is
//! reported by the server as a permissions violation (and a refused request
//! is never answered); every test checks both that nothing came through and
//! that the server said why.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use tenure::blocks::fence::JobStatus;
use tenure::blocks::queue::{NatsRole, Queue};
use tenure::devstack::DevNatsUser;
use tenure::security::Secret;
use tenure::{Client, Config, JobId, Worker};
use tenure_tests::metered::{Metered, cancellable_worker};
use tenure_tests::{
    CancelProbe, Cancellable, Hold, ThreeStep, Work, create_test_tables, init_logs, secured_config,
    secured_stack, wait_until, work,
};

/// The namespace the tests act in.
const NS: &str = "nsa";
/// How long a message or an answer that must not come is waited for.
const QUIET: Duration = Duration::from_millis(1500);

fn other_ns() -> String {
    secured_stack(NS, false)
        .auth()
        .expect("auth")
        .other_namespace
        .clone()
}

/// The user of `role` in `nsa` (`other`: in `nsa_dlq`).
fn user(role: NatsRole, other: bool) -> DevNatsUser {
    let auth = secured_stack(NS, false).auth().expect("auth");
    let roles = if other { &auth.other_nats } else { &auth.nats };
    roles.get(role).clone()
}

/// A configuration of `nats`'s namespace as NATS user `nats` and
/// PostgreSQL role `pg_role`.
fn cfg_as(nats: &DevNatsUser, pg_role: &str, pg_password: &Secret) -> Config {
    let stack = secured_stack(NS, false);
    secured_config(stack, &nats.namespace, nats.auth(), pg_role, pg_password)
        .with_schema(NS)
        .with_lease_ttl(Duration::from_secs(5))
}

/// The operator's deployment step: the migrator's PostgreSQL role, the
/// namespace's NATS operator.
fn operator_cfg() -> Config {
    let auth = secured_stack(NS, false).auth().expect("auth");
    cfg_as(
        &user(NatsRole::Operator, false),
        "tenure_migrator",
        &auth.migrator_password,
    )
}

fn worker_cfg(id: &str) -> Config {
    let auth = secured_stack(NS, false).auth().expect("auth");
    cfg_as(
        &user(NatsRole::Worker, false),
        "tenure_worker",
        &auth.worker_password,
    )
    .with_worker_id(id)
}

const PRODUCER_PW: &str = "pw-nats-producer-role";

fn producer_cfg() -> Config {
    cfg_as(
        &user(NatsRole::Producer, false),
        "tenure_producer",
        &Secret::new(PRODUCER_PW),
    )
}

/// `nsa` migrated and granted, its streams provisioned by its operator, and
/// `nsa_dlq`'s by its own; once per test process.
async fn deployed() -> Client {
    static DEPLOYED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DEPLOYED
        .get_or_init(|| async {
            let operator = Client::connect(&operator_cfg()).await.expect("operator");
            operator.migrate().await.expect("migrate");
            create_test_tables(operator.store()).await;
            let store = operator.store();
            store.grant_worker("tenure_worker").await.expect("grant");
            producer_role().await;
            store
                .grant_producer("tenure_producer")
                .await
                .expect("grant");
            sqlx::query(&format!(
                "GRANT SELECT, INSERT ON {NS}.step_log TO tenure_worker"
            ))
            .execute(store.pool())
            .await
            .expect("grant step_log");
            Queue::provision(&operator_cfg()).await.expect("provision");
            let auth = secured_stack(NS, false).auth().expect("auth");
            let other = cfg_as(
                &user(NatsRole::Operator, true),
                "tenure_migrator",
                &auth.migrator_password,
            );
            Queue::provision(&other)
                .await
                .expect("provision the other namespace");
        })
        .await;
    Client::connect(&operator_cfg()).await.expect("operator")
}

/// PostgreSQL role `tenure_producer`, made by the superuser.
async fn producer_role() {
    let stack = secured_stack(NS, false);
    let auth = stack.auth().expect("auth");
    let su = stack.database_url_as("postgres", Some(&auth.postgres_password), "tenure");
    let pool = sqlx::PgPool::connect(&su).await.expect("superuser");
    for sql in [
        format!("CREATE ROLE tenure_producer LOGIN PASSWORD '{PRODUCER_PW}'"),
        "GRANT CONNECT ON DATABASE tenure TO tenure_producer".to_string(),
    ] {
        sqlx::query(&sql).execute(&pool).await.expect(&sql);
    }
    pool.close().await;
}

/// A plain NATS connection as `nats` with inbox prefix `inbox`, and what the
/// server reported to it.
struct Raw {
    client: async_nats::Client,
    errors: Arc<Mutex<Vec<String>>>,
}

async fn raw(nats: &DevNatsUser, inbox: &str) -> Raw {
    let stack = secured_stack(NS, false);
    let tls = stack.tls().expect("tls");
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let client = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(tls.ca_file.clone())
        .add_client_certificate(tls.client_cert.clone(), tls.client_key.clone())
        .user_and_password(nats.user.clone(), nats.password.expose().to_string())
        .custom_inbox_prefix(inbox)
        .request_timeout(Some(QUIET))
        .event_callback(move |event| {
            let seen = seen.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    seen.lock().unwrap().push(e.to_string());
                }
            }
        })
        .connect(stack.nats_url())
        .await
        .expect("raw NATS connection");
    Raw { client, errors }
}

/// A raw connection as `nats` with Tenure's inbox prefix for its namespace.
async fn raw_as(nats: &DevNatsUser) -> Raw {
    raw(nats, &format!("_INBOX_{}", nats.namespace)).await
}

impl Raw {
    /// The permissions violation the server reported about `subject`
    /// (waiting up to [`QUIET`] for it).
    async fn violation(&self, subject: &str) -> Option<String> {
        let needle = format!("\"{subject}\"").to_lowercase();
        let found = || {
            self.errors
                .lock()
                .unwrap()
                .iter()
                .find(|e| {
                    let e = e.to_lowercase();
                    e.contains("permissions violation") && e.contains(&needle)
                })
                .cloned()
        };
        wait_until(QUIET, || async { found().is_some() }).await;
        found()
    }

    /// Asserts the server refused `what` on `subject`, and says so.
    async fn assert_refused(&self, what: &str, subject: &str) {
        match self.violation(subject).await {
            Some(v) => eprintln!("{what}: refused as expected: {v}"),
            None => panic!(
                "{what}: no permissions violation for {subject:?}; the server said {:?}",
                self.errors.lock().unwrap()
            ),
        }
    }

    /// A raw JetStream API request: its answer, if any came.
    async fn api(&self, subject: &str, body: serde_json::Value) -> Option<String> {
        let reply = self
            .client
            .request(subject.to_string(), body.to_string().into())
            .await
            .ok()?;
        Some(String::from_utf8_lossy(&reply.payload).into_owned())
    }
}

/// Waits [`QUIET`] on `sub` and returns the payloads that came.
async fn received(sub: &mut async_nats::Subscriber) -> Vec<String> {
    let mut got = Vec::new();
    let until = tokio::time::Instant::now() + QUIET;
    while let Ok(Some(m)) = tokio::time::timeout_at(until, sub.next()).await {
        got.push(format!(
            "{}: {}",
            m.subject,
            String::from_utf8_lossy(&m.payload)
        ));
    }
    got
}

/// `nsa`'s worker subscribes to every inbox and to `nsa_dlq`'s inbox
/// prefix while `nsa_dlq`'s Tenure queue makes requests: it receives none of
/// their answers (pull deliveries and JetStream replies carry payloads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_read_another_namespaces_inbox() {
    init_logs();
    deployed().await;
    let other = other_ns();
    let spy = raw_as(&user(NatsRole::Worker, false)).await;
    let mut every = spy.client.subscribe("_INBOX.>").await.unwrap();
    let theirs = format!("_INBOX_{other}.>");
    let mut prefixed = spy.client.subscribe(theirs.clone()).await.unwrap();
    spy.client.flush().await.unwrap();

    let auth = secured_stack(NS, false).auth().expect("auth");
    let victim = cfg_as(
        &user(NatsRole::Worker, true),
        "tenure_worker",
        &auth.worker_password,
    );
    let queue = Queue::connect(&victim)
        .await
        .expect("the other namespace's queue");
    for _ in 0..3 {
        queue.stats().await.expect("the other namespace's requests");
    }
    let (a, b) = (received(&mut every).await, received(&mut prefixed).await);
    assert!(
        a.is_empty(),
        "read another namespace's inbox through _INBOX.>: {a:?}"
    );
    assert!(
        b.is_empty(),
        "read another namespace's inbox through {theirs}: {b:?}"
    );
    spy.assert_refused("subscribe to every inbox", "_INBOX.>")
        .await;
    spy.assert_refused("subscribe to the other inbox", &theirs)
        .await;
}

/// A dead letter in namespace `ns`'s DLQ (published by the administrator):
/// its payload.
async fn dead_letter_in(ns: &str) -> String {
    let admin = admin().await;
    let js = jetstream::new(admin.client.clone());
    let secret = format!("{ns}-secret-{}", rand::random::<u32>());
    let subject = format!("{ns}.dlq.{}", JobId::from_key("t", &secret));
    js.publish(subject, secret.clone().into())
        .await
        .expect("publish")
        .await
        .expect("stored in the DLQ");
    secret
}

/// `nsa`'s worker cannot read `nsa_dlq`'s streams, nor put a consumer on its
/// DLQ (the old rule `$JS.API.CONSUMER.*.*.TENURE_NSA_DLQ.>` let a consumer
/// named after `nsa`'s DLQ stream on any stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_read_another_namespaces_jobs_or_dlq() {
    init_logs();
    deployed().await;
    let secret = dead_letter_in(&other_ns()).await;
    let upper = other_ns().to_ascii_uppercase();
    let (jobs, dlq) = (
        format!("TENURE_{upper}_JOBS"),
        format!("TENURE_{upper}_DLQ"),
    );
    let spy = raw_as(&user(NatsRole::Worker, false)).await;

    for (subject, body) in [
        (format!("$JS.API.STREAM.INFO.{jobs}"), serde_json::json!({})),
        (
            format!("$JS.API.DIRECT.GET.{jobs}"),
            serde_json::json!({"seq": 1}),
        ),
        (
            format!("$JS.API.DIRECT.GET.{dlq}"),
            serde_json::json!({"seq": 1}),
        ),
        (
            format!("$JS.API.STREAM.MSG.GET.{dlq}"),
            serde_json::json!({"seq": 1}),
        ),
        (
            format!("$JS.API.STREAM.MSG.GET.{jobs}"),
            serde_json::json!({"seq": 1}),
        ),
    ] {
        let answer = spy.api(&subject, body).await;
        assert!(answer.is_none(), "{subject} answered: {answer:?}");
        spy.assert_refused("read the other namespace", &subject)
            .await;
    }

    let names = Queue::connect(&worker_cfg("spy"))
        .await
        .unwrap()
        .names()
        .clone();
    // A subject the worker may subscribe to, before the walls and after.
    let inbox = format!("{NS}.cancel.stolen");
    let mut stolen = spy.client.subscribe(inbox.clone()).await.unwrap();
    spy.client.flush().await.unwrap();
    let filter = format!("{}.dlq.>", other_ns());
    let subject = format!(
        "$JS.API.CONSUMER.CREATE.{dlq}.{}.{filter}",
        names.dlq_stream
    );
    let body = serde_json::json!({"stream_name": dlq, "config": {
        "durable_name": names.dlq_stream, "filter_subject": filter,
        "deliver_subject": inbox, "ack_policy": "none"}});
    let answer = spy.api(&subject, body).await;
    let got = received(&mut stolen).await;
    assert!(
        !got.iter().any(|m| m.contains(&secret)),
        "a consumer on the other namespace's DLQ delivered its dead letter: {got:?}"
    );
    assert!(answer.is_none(), "{subject} answered: {answer:?}");
    spy.assert_refused("a consumer on the other DLQ", &subject)
        .await;
}

/// A worker hears its own namespace's doorbell (`queue/ring.rs`) and never
/// another's: a ring carries a job's id (`Nats-Msg-Id`) and subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_hears_its_own_doorbell_and_not_another_namespaces() {
    init_logs();
    deployed().await;
    let spy = raw_as(&user(NatsRole::Worker, false)).await;
    let mut own = spy.client.subscribe(format!("{NS}.ring.>")).await.unwrap();
    let theirs_subject = format!("{}.ring.>", other_ns());
    let mut theirs = spy.client.subscribe(theirs_subject.clone()).await.unwrap();
    spy.client.flush().await.unwrap();
    let admin = admin().await;
    let js = jetstream::new(admin.client.clone());
    for ns in [NS.to_string(), other_ns()] {
        // A type no worker registers: the message stays and harms nobody.
        js.publish(format!("{ns}.jobs.nobody.rings"), "x".into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let heard = tokio::time::timeout(Duration::from_secs(5), own.next()).await;
    assert!(matches!(heard, Ok(Some(_))), "no ring of its own namespace");
    let overheard = tokio::time::timeout(Duration::from_millis(500), theirs.next()).await;
    assert!(
        !matches!(overheard, Ok(Some(_))),
        "heard another namespace's ring"
    );
    spy.assert_refused("another namespace's doorbell", &theirs_subject)
        .await;
}

/// A worker reads the age of its own work stream's oldest message
/// (`tenure.queue.oldest_age`): its role may get messages of that stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reads_its_own_oldest_message_age() {
    init_logs();
    let producer = deployed().await;
    producer
        .enqueue_json("nobody.registers", "oldest", serde_json::json!(1))
        .await
        .unwrap();
    let queue = Queue::connect(&worker_cfg("aged")).await.unwrap();
    let age = queue.oldest_stored_age("nobody.registers").await;
    assert!(
        matches!(age, Ok(Some(_))),
        "the worker role reads its work stream: {age:?}"
    );
}

/// The config of `stream` as the server has it.
async fn stream_config(stream: &str) -> jetstream::stream::Config {
    let admin = admin().await;
    let js = jetstream::new(admin.client.clone());
    js.get_stream(stream)
        .await
        .expect("stream")
        .cached_info()
        .config
        .clone()
}

async fn admin() -> Raw {
    let auth = secured_stack(NS, false).auth().expect("auth");
    let admin = DevNatsUser {
        namespace: NS.into(),
        role: NatsRole::Operator,
        user: "admin".into(),
        password: auth.nats_admin_password.clone(),
    };
    raw(&admin, "_INBOX").await
}

/// Puts `stream` back to `config` (a test that found a hole undoes it before
/// it fails, so the other tests keep their streams).
async fn restore(config: jetstream::stream::Config) {
    let admin = admin().await;
    jetstream::new(admin.client.clone())
        .update_stream(config)
        .await
        .expect("restore the stream");
}

/// A worker (or producer) may not create or update a stream, even one of
/// its own namespace's names: nats-server does not check a stream's
/// configuration against its creator's permissions, so one that sources
/// `nsa_dlq`'s DLQ, or captures its inbox, would read that namespace; and
/// an update can empty the DLQ (`max_msgs: 1`) as well as a purge can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_or_producer_cannot_make_its_stream_source_or_capture_another_namespace() {
    init_logs();
    deployed().await;
    let other = other_ns();
    let upper = other.to_ascii_uppercase();
    let names = tenure::blocks::queue::QueueNames::new(NS);
    let before = stream_config(&names.dlq_stream).await;
    for role in [NatsRole::Worker, NatsRole::Producer] {
        let spy = raw_as(&user(role, false)).await;
        let mut config = before.clone();
        config.sources = Some(vec![jetstream::stream::Source {
            name: format!("TENURE_{upper}_DLQ"),
            ..Default::default()
        }]);
        config.subjects.push(format!("_INBOX_{other}.>"));
        config.max_messages = 1;
        let subject = format!("$JS.API.STREAM.UPDATE.{}", names.dlq_stream);
        let answer = spy
            .api(&subject, serde_json::to_value(&config).unwrap())
            .await;
        let now = stream_config(&names.dlq_stream).await;
        if (&now.sources, &now.subjects, now.max_messages)
            != (&before.sources, &before.subjects, before.max_messages)
        {
            restore(before.clone()).await;
            panic!(
                "the {role:?} updated its DLQ stream to source or capture another namespace \
                 ({:?}, {:?}): {answer:?}",
                now.sources, now.subjects
            );
        }
        spy.assert_refused("update the DLQ stream", &subject).await;
        let create = format!("$JS.API.STREAM.CREATE.{}", names.dlq_stream);
        let answer = spy
            .api(&create, serde_json::to_value(&config).unwrap())
            .await;
        assert!(answer.is_none(), "{create} answered: {answer:?}");
        spy.assert_refused("create a stream", &create).await;
    }
    assert_eq!(
        stream_config(&names.dlq_stream).await.sources,
        before.sources
    );
}

/// A worker cannot delete or purge its own namespace's DLQ (nor its work
/// stream): dead letters are the operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_delete_or_purge_its_own_streams() {
    init_logs();
    deployed().await;
    let names = tenure::blocks::queue::QueueNames::new(NS);
    let letter = dead_letter_in(NS).await;
    let spy = raw_as(&user(NatsRole::Worker, false)).await;
    for stream in [&names.dlq_stream, &names.stream] {
        for verb in ["PURGE", "DELETE"] {
            let subject = format!("$JS.API.STREAM.{verb}.{stream}");
            let answer = spy.api(&subject, serde_json::json!({})).await;
            let kept = dead_letters(NS).await;
            if !kept.iter().any(|l| l.contains(&letter)) {
                Queue::provision(&operator_cfg())
                    .await
                    .expect("re-provision");
                panic!("the worker could {verb} {stream}: {answer:?}; the DLQ kept {kept:?}");
            }
            assert!(answer.is_none(), "{subject} answered: {answer:?}");
            spy.assert_refused("delete or purge a stream", &subject)
                .await;
        }
    }
}

/// The payloads in namespace `ns`'s DLQ (empty if it is gone), as the admin
/// reads them.
async fn dead_letters(ns: &str) -> Vec<String> {
    let admin = admin().await;
    let js = jetstream::new(admin.client.clone());
    let name = tenure::blocks::queue::QueueNames::new(ns).dlq_stream;
    let Ok(stream) = js.get_stream(&name).await else {
        return Vec::new();
    };
    let last = stream.cached_info().state.last_sequence;
    let mut payloads = Vec::new();
    for seq in 1..=last {
        if let Ok(m) = stream.direct_get(seq).await {
            payloads.push(String::from_utf8_lossy(&m.payload).into_owned());
        }
    }
    payloads
}

/// Only the operator and the producer may publish cancel notices; a worker
/// (whose job code could abort every running step) may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_and_producer_publish_cancel_notices() {
    init_logs();
    deployed().await;
    let watcher = admin().await;
    let mut notices = watcher
        .client
        .subscribe(format!("{NS}.cancel.>"))
        .await
        .unwrap();
    watcher.client.flush().await.unwrap();
    let job = JobId::from_key("t", "never-run");
    let subject = format!("{NS}.cancel.{job}");
    for (role, allowed) in [
        (NatsRole::Worker, false),
        (NatsRole::Producer, true),
        (NatsRole::Operator, true),
    ] {
        let sender = raw_as(&user(role, false)).await;
        sender
            .client
            .publish(subject.clone(), role.as_str().to_string().into())
            .await
            .unwrap();
        sender.client.flush().await.unwrap();
        let got = received(&mut notices).await;
        if allowed {
            assert_eq!(got.len(), 1, "the {role:?}'s notice: {got:?}");
        } else {
            assert!(
                got.is_empty(),
                "the {role:?} published a cancel notice: {got:?}"
            );
            sender
                .assert_refused("a worker's cancel notice", &subject)
                .await;
        }
    }
}

/// Only one test at a time runs a [`Cancellable`] worker (they share its
/// job type's consumer).
static CANCELLABLE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A running [`Cancellable`] job, after its worker, the worker's metrics,
/// the producer that enqueued it, and what its steps saw.
type Holding = (Worker, Metered, Client, Arc<CancelProbe>, JobId);

/// Worker `id` of [`Cancellable`] and a job (key `prefix-<random>`) that
/// the producer enqueued whose step 0 holds `hold_ms`, once its step 0
/// wrote (in its open transaction) and waits for a cancellation.
async fn holding_job(id: &str, prefix: &str, hold_ms: u64) -> Holding {
    let probe = Arc::new(CancelProbe::default());
    let (worker, metered) = cancellable_worker(worker_cfg(id), NS, &probe).await;
    let producer = Client::connect(&producer_cfg()).await.expect("producer");
    let key = format!("{prefix}-{}", rand::random::<u32>());
    let job = producer
        .enqueue::<Cancellable>(&key, &Hold { hold_ms })
        .await
        .expect("enqueue as the producer")
        .job_id;
    assert!(
        wait_until(Duration::from_secs(30), || async { probe.wrote(job, 0) }).await,
        "step 0 never started"
    );
    (worker, metered, producer, probe, job)
}

/// A cancel notice that a user allowed to send one (the producer) forges for
/// a job whose row is running does not stop the job: the worker confirms the
/// cancel through PostgreSQL before it aborts a step, counts the unconfirmed
/// notice, and the step goes on; the job ends `done` at its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forged_cancel_notice_does_not_stop_a_running_job() {
    init_logs();
    deployed().await;
    let _one = CANCELLABLE.lock().await;
    let (worker, metered, producer, probe, job) = holding_job("forged-w", "forged", 2500).await;

    let forger = raw_as(&user(NatsRole::Producer, false)).await;
    for _ in 0..3 {
        forger
            .client
            .publish(format!("{NS}.cancel.{job}"), "".into())
            .await
            .unwrap();
    }
    forger.client.flush().await.unwrap();
    let done = producer
        .wait::<Cancellable>(job, Duration::from_secs(30))
        .await;
    assert_eq!(done.ok(), Some(2500), "the job did not end done");
    assert!(
        probe.fired(job).is_none(),
        "a forged notice fired the step's cancellation"
    );
    let attempts = probe
        .wrote
        .lock()
        .unwrap()
        .iter()
        .filter(|(j, s)| *j == job && *s == 0)
        .count();
    assert_eq!(
        attempts, 1,
        "step 0 ran again: the forged notice aborted it"
    );
    let unconfirmed = metered.counted("tenure.cancel.unconfirmed");
    assert!(
        unconfirmed >= 1,
        "unconfirmed notices counted: {unconfirmed}"
    );
    worker.shutdown().await.expect("shutdown");
}

/// A real cancel (the operator's `Client::cancel`) still aborts the running
/// step at once, and the job ends `cancelled` with nothing of the step
/// committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operators_cancel_still_aborts_a_running_step() {
    init_logs();
    let operator = deployed().await;
    let _one = CANCELLABLE.lock().await;
    let (worker, metered, _producer, probe, job) =
        holding_job("cancel-w", "cancelled", 20_000).await;

    let asked = std::time::Instant::now();
    let outcome = operator
        .cancel(job, "operator: stop it")
        .await
        .expect("cancel");
    assert_eq!(outcome, tenure::Cancelled::Now);
    let fired = probe.fired(job).expect("the step's cancellation fired");
    let to_fire = fired.saturating_duration_since(asked);
    eprintln!("cancel as the operator: cancellation() fired {to_fire:?} after the call");
    assert!(to_fire < Duration::from_secs(1), "fired after {to_fire:?}");
    let row = operator.job(job).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Cancelled, "{row:?}");
    assert_eq!(
        row.step,
        tenure::StepIndex::new(0),
        "step 0 never committed"
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            metered.counted("tenure.job.cancelled") == 1
        })
        .await,
        "the delivery did not end cancelled"
    );
    assert_eq!(metered.counted("tenure.cancel.unconfirmed"), 0);
    worker.shutdown().await.expect("shutdown");
}

/// The whole pipeline as the per-role users: the operator migrates and
/// provisions, the producer enqueues (now and delayed) and waits for the
/// results, the worker runs the jobs, dead-letters one and publishes the
/// delayed one when due, and the operator reads the DLQ and redrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pipeline_runs_as_the_per_role_users() {
    init_logs();
    let operator = deployed().await;
    let worker = Worker::builder(worker_cfg("pipeline-w"))
        .register(ThreeStep {
            worker: "pipeline-w".into(),
            schema: NS.into(),
        })
        .start()
        .await
        .expect("worker as the worker user");
    let producer = Client::connect(&producer_cfg()).await.expect("producer");
    let run = format!("{}", rand::random::<u32>());
    let now = producer
        .enqueue::<ThreeStep>(&format!("now-{run}"), &work(7))
        .await
        .expect("enqueue");
    let later = producer
        .enqueue_after::<ThreeStep>(&format!("later-{run}"), &work(8), Duration::from_secs(1))
        .await
        .expect("enqueue_after");
    let fails = Work {
        n: 9,
        fail_times: u32::MAX,
        ..Work::default()
    };
    let dead = producer
        .enqueue::<ThreeStep>(&format!("dead-{run}"), &fails)
        .await
        .expect("enqueue");
    let wait = Duration::from_secs(60);
    assert_eq!(
        producer.wait::<ThreeStep>(now.job_id, wait).await.ok(),
        Some(7)
    );
    assert_eq!(
        producer.wait::<ThreeStep>(later.job_id, wait).await.ok(),
        Some(8)
    );
    let died = producer.wait::<ThreeStep>(dead.job_id, wait).await;
    assert!(died.is_err(), "{died:?}");

    let queue = operator.queue();
    let letters = queue
        .dead_letters(100)
        .await
        .expect("the operator reads the DLQ");
    assert!(
        letters.iter().any(|l| l.job_id == Some(dead.job_id)),
        "{letters:?}"
    );
    assert!(operator.redrive(dead.job_id).await.expect("redrive") >= 1);
    assert!(
        wait_until(wait, || async {
            dead_events(&operator, dead.job_id).await >= 2
        })
        .await,
        "the redriven job did not run and die again: {:?}",
        operator.job(dead.job_id).await
    );
    Queue::connect(&operator_cfg())
        .await
        .expect("the operator binds")
        .stats()
        .await
        .expect("stats");
    worker.shutdown().await.expect("shutdown");
}

/// How many times `job` died (its `dead` events).
async fn dead_events(client: &Client, job: JobId) -> usize {
    tenure_tests::events_of_kind(client, job, "dead")
        .await
        .len()
}

/// The dev stack writes private keys and every file carrying a password
/// 0600, and the NATS administrator's password is not etcd `root`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_stack_keeps_its_secrets_private() {
    use std::os::unix::fs::PermissionsExt;
    let stack = secured_stack(NS, false);
    let (tls, auth) = (stack.tls().expect("tls"), stack.auth().expect("auth"));
    let conf = stack.dir().join("nats.conf");
    for file in [
        &tls.server_key,
        &tls.client_key,
        &tls.expired_client_key,
        &conf,
    ] {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is {mode:o}", file.display());
    }
    assert_ne!(
        auth.nats_admin_password.expose(),
        auth.etcd_root_password.expose(),
        "the NATS admin shares etcd root's password"
    );
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(!text.contains(auth.etcd_root_password.expose()));
}
