//! The `tenure` binary against the dev stack: run it, read what it prints.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tenure::Worker;
use tenure::blocks::fence::JobStatus;
use tenure::blocks::queue::{Queue, QueueNames};
use tenure::devstack::DevStack;
use tenure::{Client, Config, JobId, StepCtx, StepError};
use tenure_tests::{config_for, wait_until};

fn stack() -> &'static DevStack {
    DevStack::shared().expect("dev stack")
}

/// While set, `cli.flaky` jobs fail permanently (straight to the DLQ).
static BROKEN: AtomicBool = AtomicBool::new(true);

#[derive(Debug, Clone)]
struct Flaky;

#[tenure::job(name = "cli.flaky", retries = 0)]
impl Flaky {
    #[step]
    async fn call_downstream(&self, _ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        if BROKEN.load(Ordering::SeqCst) {
            return Err(StepError::permanent("downstream refused the request"));
        }
        Ok(n)
    }

    #[step]
    async fn record(&self, _ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        Ok(n * 2)
    }
}

/// Whether a `cli.fails_once` job has failed yet (its first attempt fails).
static FAILED_ONCE: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Clone)]
struct FailsOnce;

#[tenure::job(name = "cli.fails_once", retries = 3)]
impl FailsOnce {
    #[step]
    async fn once(&self, _ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        if !FAILED_ONCE.swap(true, Ordering::SeqCst) {
            return Err(StepError::retryable("the first attempt fails"));
        }
        Ok(n)
    }
}

/// A `tenure` command without any of this process's `TENURE_*` variables.
fn bare_tenure() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenure"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TENURE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs `tenure` with the servers of `cfg` as flags (and no `TENURE_*` variables).
fn tenure(cfg: &Config, args: &[&str]) -> Output {
    let mut cmd = bare_tenure();
    cmd.args([
        "--etcd",
        &cfg.etcd_endpoints.join(","),
        "--nats",
        &cfg.nats_url,
        "--database-url",
        &cfg.database_url,
        "--namespace",
        &cfg.namespace,
        "--schema",
        &cfg.schema,
    ])
    .args(args);
    cmd.output().expect("run tenure")
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "tenure failed: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure; stdout:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&ok(out)).expect("JSON output")
}

async fn status(client: &Client, id: JobId) -> Option<JobStatus> {
    client.job(id).await.unwrap().map(|r| r.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_job_dlq_and_redrive_against_the_dev_stack() {
    let ns = DevStack::unique_namespace("cli");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let worker = Worker::builder(cfg.clone().with_worker_id("w"))
        .register(Flaky)
        .start()
        .await
        .unwrap();

    // Two jobs die while the downstream is broken.
    let dead: Vec<JobId> = {
        let mut ids = Vec::new();
        for key in ["dead-1", "dead-2"] {
            ids.push(client.enqueue::<Flaky>(key, &7).await.unwrap().job_id);
        }
        ids
    };
    let all_dead = wait_until(Duration::from_secs(30), || async {
        status(&client, dead[0]).await == Some(JobStatus::Dead)
            && status(&client, dead[1]).await == Some(JobStatus::Dead)
    })
    .await;
    assert!(all_dead, "both jobs dead-lettered");
    // Then it recovers and three jobs complete.
    BROKEN.store(false, Ordering::SeqCst);
    let mut done = Vec::new();
    for i in 0..3u64 {
        let key = format!("ok-{i}");
        done.push(client.enqueue::<Flaky>(&key, &i).await.unwrap().job_id);
    }
    let all_done = wait_until(Duration::from_secs(30), || async {
        for id in &done {
            if status(&client, *id).await != Some(JobStatus::Done) {
                return false;
            }
        }
        true
    })
    .await;
    assert!(all_done, "three jobs done");

    // `jobs --status done`: exactly the three, as a table and as JSON.
    let table = ok(&tenure(&cfg, &["jobs", "--status", "done"]));
    let header = table.lines().next().unwrap();
    for col in [
        "ID",
        "TYPE",
        "STATUS",
        "STEP",
        "FENCE",
        "TAKEOVERS",
        "ATTEMPTS",
    ] {
        assert!(header.contains(col), "header: {header}");
    }
    for id in &done {
        let line = table
            .lines()
            .find(|l| l.starts_with(&id.to_string()))
            .unwrap_or_else(|| panic!("{id} missing from:\n{table}"));
        assert!(
            line.contains("cli.flaky") && line.contains(" done "),
            "{line}"
        );
    }
    for id in &dead {
        assert!(!table.contains(&id.to_string()), "dead job listed as done");
    }
    assert!(table.contains("(3 jobs)"), "{table}");
    let rows = json(&tenure(&cfg, &["--json", "jobs", "--status", "done"]));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r["status"] == "done" && r["step"] == 2));
    // `jobs` without a status lists all five; `--limit` bounds it.
    let all = json(&tenure(&cfg, &["--json", "jobs"]));
    assert_eq!(all.as_array().unwrap().len(), 5);
    let two = json(&tenure(&cfg, &["jobs", "--limit", "2", "--json"]));
    assert_eq!(two.as_array().unwrap().len(), 2);

    // `job <ID>`: the history fields of one done job.
    let detail = ok(&tenure(&cfg, &["job", &done[0].to_string()]));
    for (k, v) in [
        ("id", done[0].to_string()),
        ("type", "cli.flaky".into()),
        ("status", "done".into()),
        ("step", "2".into()),
        ("takeovers", "0".into()),
        ("attempts", "0".into()),
    ] {
        assert!(
            detail
                .lines()
                .any(|l| l.starts_with(k) && l.split_whitespace().last() == Some(v.as_str())),
            "{k} = {v} missing from:\n{detail}"
        );
    }
    assert!(detail.contains("fence") && detail.contains("created") && detail.contains("updated"));
    let one = json(&tenure(&cfg, &["--json", "job", &dead[0].to_string()]));
    assert_eq!(one["status"], "dead");
    assert!(one["fence"].as_i64().unwrap() > 0, "claimed before dying");
    assert_eq!(
        one["step_names"],
        serde_json::json!(["call_downstream", "record"]),
        "the definition's steps, recorded at enqueue"
    );
    assert_eq!(one["steps_fingerprint"].as_str().map(str::len), Some(16));
    assert!(
        one["last_error"]
            .as_str()
            .unwrap()
            .contains("downstream refused"),
        "{one}"
    );

    // `dlq`: both dead jobs with their type and reason.
    let dlq = ok(&tenure(&cfg, &["dlq"]));
    println!(
        "$ tenure jobs --status done\n{table}\n$ tenure job {}\n{detail}\n$ tenure dlq\n{dlq}",
        done[0]
    );
    for id in &dead {
        let line = dlq
            .lines()
            .find(|l| l.contains(&id.to_string()))
            .unwrap_or_else(|| panic!("{id} missing from the DLQ:\n{dlq}"));
        assert!(line.contains("cli.flaky"), "{line}");
        assert!(line.contains("permanent_error"), "{line}");
    }
    let entries = json(&tenure(&cfg, &["--json", "dlq"]));
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| e["deliveries"] == 1));

    // `redrive <ID>`, then `redrive --reason`: with the worker running, both finish.
    let out = ok(&tenure(&cfg, &["redrive", &dead[0].to_string()]));
    assert!(out.contains(&format!("redriven {}", dead[0])), "{out}");
    let finished = wait_until(Duration::from_secs(30), || async {
        status(&client, dead[0]).await == Some(JobStatus::Done)
    })
    .await;
    assert!(finished, "redriven job completes");
    let after = json(&tenure(&cfg, &["--json", "dlq"]));
    assert_eq!(after.as_array().unwrap().len(), 1, "moved out of the DLQ");
    let out = json(&tenure(
        &cfg,
        &["--json", "redrive", "--reason", "permanent_error"],
    ));
    assert_eq!(out.as_array().unwrap().len(), 1);
    assert_eq!(out[0]["job_id"], dead[1].to_string());
    let finished = wait_until(Duration::from_secs(30), || async {
        status(&client, dead[1]).await == Some(JobStatus::Done)
    })
    .await;
    assert!(finished, "job redriven by reason completes");
    assert!(ok(&tenure(&cfg, &["dlq"])).contains("(0 dead letters)"));

    // Redriving a job that is not dead says so.
    let out = tenure(&cfg, &["redrive", &done[0].to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not dead"), "{stderr}");

    // A job of a type no running worker registers waits, and says why.
    let nobody = client
        .enqueue_json("cli.nobody", "waits", serde_json::json!(1))
        .await
        .unwrap()
        .job_id;
    let table = ok(&tenure(&cfg, &["jobs", "--status", "pending"]));
    let line = table
        .lines()
        .find(|l| l.starts_with(&nobody.to_string()))
        .unwrap_or_else(|| panic!("{nobody} missing from:\n{table}"));
    assert!(line.contains("pending (no worker registered)"), "{line}");
    let listed = json(&tenure(&cfg, &["--json", "jobs", "--status", "pending"]));
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == nobody.to_string())
        .expect("listed");
    assert_eq!(entry["waiting"], "no worker registered", "{entry}");

    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_and_unreachable_servers_are_clear_errors() {
    let ns = DevStack::unique_namespace("cli_err");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));

    let out = tenure(&cfg, &["job", "not-a-uuid"]);
    let err = failed(&out);
    assert_eq!(out.status.code(), Some(2), "usage error");
    assert!(err.contains("not-a-uuid") && err.contains("UUID"), "{err}");

    let out = tenure(&cfg, &["jobs", "--status", "zombie"]);
    let err = failed(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("zombie") && err.contains("dead"), "{err}");

    let out = tenure(&cfg, &["redrive"]);
    assert_eq!(out.status.code(), Some(2), "{}", failed(&out));

    // Nothing listens on port 1.
    let mut bad_db = cfg.clone();
    bad_db.database_url = "postgres://postgres:hunter2@127.0.0.1:1/tenure".into();
    let out = tenure(&bad_db, &["--timeout", "3", "jobs"]);
    let err = failed(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("PostgreSQL at postgres://postgres:***@127.0.0.1:1/tenure"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "password leaked: {err}");
    assert!(err.contains("refused"), "the cause is given: {err}");

    let mut bad_nats = cfg.clone();
    bad_nats.nats_url = "nats://127.0.0.1:1".into();
    let err = failed(&tenure(&bad_nats, &["--timeout", "3", "dlq"]));
    assert!(err.contains("NATS at nats://127.0.0.1:1"), "{err}");
    assert!(err.contains("refused"), "the cause is given: {err}");

    // An unknown job in a reachable database.
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let missing = JobId::from_key("cli.flaky", "never-enqueued");
    let err = failed(&tenure(&cfg, &["job", &missing.to_string()]));
    assert!(err.contains(&format!("no job {missing}")), "{err}");
}

/// Every stream and consumer configuration of `cfg`'s namespace, as the server
/// reports it (JSON, so that any changed field shows).
async fn server_setup(cfg: &Config) -> Vec<String> {
    let names = QueueNames::new(&cfg.namespace);
    let js = async_nats::jetstream::new(async_nats::connect(&cfg.nats_url).await.unwrap());
    let mut out = Vec::new();
    let type_consumer = names.type_consumer("cli.flaky");
    for (stream, consumer) in [
        (&names.stream, Some(&type_consumer)),
        (&names.dlq_stream, None),
        (&names.advisory_stream, Some(&names.advisory_consumer)),
    ] {
        let mut s = js.get_stream(stream).await.unwrap();
        out.push(serde_json::to_string(&s.info().await.unwrap().config).unwrap());
        if let Some(c) = consumer {
            let info = s.consumer_info(c).await.unwrap();
            out.push(serde_json::to_string(&info.config).unwrap());
        }
    }
    out
}

/// Read-only commands never change servers: a `tenure dlq` with the CLI's
/// default settings, pointed at a namespace whose workers use another TTL
/// (AckWait), MaxDeliver and duplicate window, leaves every stream and consumer
/// configuration byte-for-byte as it was; a namespace no worker provisioned is a
/// clear error, and the CLI creates nothing there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_leave_the_workers_stream_settings_unchanged() {
    let ns = DevStack::unique_namespace("cli_ro");
    let mut workers_cfg = config_for(stack(), &ns, Duration::from_secs(7));
    workers_cfg.max_deliver = 9;
    workers_cfg.duplicate_window = Duration::from_secs(30);
    Queue::provision(&workers_cfg)
        .await
        .expect("provision")
        .route(&["cli.flaky"])
        .await
        .expect("the workers' consumer of their type");
    let client = Client::connect(&workers_cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let before = server_setup(&workers_cfg).await;
    assert!(
        before[1].contains("\"ack_wait\":7000000000"),
        "{}",
        before[1]
    );

    ok(&tenure(&workers_cfg, &["dlq"]));
    ok(&tenure(&workers_cfg, &["jobs"]));
    assert_eq!(
        server_setup(&workers_cfg).await,
        before,
        "a read-only command changed the namespace's streams or consumers"
    );

    let fresh = config_for(
        stack(),
        &DevStack::unique_namespace("cli_none"),
        Duration::from_secs(3),
    );
    let err = failed(&tenure(&fresh, &["dlq"]));
    let names = QueueNames::new(&fresh.namespace);
    assert!(
        err.contains(&names.stream) && err.contains("does not exist"),
        "{err}"
    );
    let js = async_nats::jetstream::new(async_nats::connect(&fresh.nats_url).await.unwrap());
    assert!(
        js.get_stream(&names.stream).await.is_err(),
        "the CLI created a stream"
    );
}

/// The TLS and credential flags (and their variables) reach NATS and
/// PostgreSQL on a secured stack; without them the server is named in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_credential_flags_reach_a_secured_stack() {
    let stack = DevStack::shared_with(tenure::devstack::DevStackOptions {
        tls: true,
        auth: true,
        namespace: "clisec".into(),
        ..Default::default()
    })
    .expect("secured dev stack");
    let (tls, auth) = (stack.tls().unwrap(), stack.auth().unwrap());
    let cfg = Config::new("clisec")
        .with_schema("clisec")
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_nats_url(stack.nats_url())
        .with_nats_tls(tls.client())
        // The operator's tool, as the namespace's NATS operator (only it may
        // create the streams).
        .with_nats_auth(auth.nats.operator.auth())
        .with_database_url(stack.database_url());
    Client::connect(&cfg)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    Queue::provision(&cfg).await.unwrap();
    let nats_tls = [
        "--nats-ca-file",
        tls.ca_file.to_str().unwrap(),
        "--nats-cert-file",
        tls.client_cert.to_str().unwrap(),
        "--nats-key-file",
        tls.client_key.to_str().unwrap(),
    ];
    let password_only = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenure"));
        cmd.env("TENURE_NATS_PASSWORD", auth.nats.operator.password.expose())
            .args(["--nats", &cfg.nats_url, "--database-url", &cfg.database_url])
            .args(["--namespace", "clisec", "--schema", "clisec", "--json"])
            .args(args);
        cmd.output().expect("run tenure")
    };
    // A password without its user is refused, not ignored.
    let lone = failed(&password_only(&["jobs"]));
    assert!(lone.contains("TENURE_NATS_USER"), "{lone}");
    let with_password = |args: &[&str]| {
        password_only(&[&["--nats-user", &auth.nats.operator.user][..], args].concat())
    };
    let listed = json(&with_password(&[&["dlq"][..], &nats_tls[..]].concat()));
    assert!(listed.as_array().is_some_and(|a| a.is_empty()), "{listed}");
    json(&with_password(&["jobs"]));

    let err = failed(&with_password(&["dlq"]));
    eprintln!("{err}");
    assert!(err.contains("nats") && err.contains("TLS"), "{err}");
    assert!(!err.contains(auth.nats.operator.password.expose()), "{err}");
    let plain = stack
        .database_url()
        .replace("sslmode=verify-full", "sslmode=disable");
    let err = failed(&with_password(&["jobs", "--database-url", &plain]));
    eprintln!("{err}");
    assert!(
        err.contains("postgresql") && err.contains("requires TLS"),
        "{err}"
    );
    assert!(!err.contains(auth.postgres_password.expose()), "{err}");
}

/// `tenure schedules` shows each schedule (expression, zone, policy, ticks)
/// and the scheduler leader PostgreSQL accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_lists_the_schedules_and_the_leader() {
    let ns = DevStack::unique_namespace("cli_sched");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let empty = ok(&tenure(&cfg, &["schedules"]));
    assert!(empty.contains("scheduler leader: none yet"), "{empty}");
    let worker = Worker::builder(cfg.clone().with_worker_id("sched-w"))
        .register(Flaky)
        .schedule_with::<Flaky>(
            tenure::Schedule::new("every-second", "* * * * * *")
                .missed(tenure::MissedTicks::CatchUp { max: 2 }),
            &1,
        )
        .schedule_with::<Flaky>(
            tenure::Schedule::new("nightly", "0 0 3 * * *").in_time_zone("Europe/Berlin"),
            &2,
        )
        .start()
        .await
        .unwrap();
    let ticked = wait_until(Duration::from_secs(15), || async {
        let v = json(&tenure(&cfg, &["--json", "schedules"]));
        v["schedules"][0]["enqueued"].as_i64().unwrap_or(0) >= 2
    })
    .await;
    assert!(ticked, "the every-second schedule ticked");
    let text = ok(&tenure(&cfg, &["schedules"]));
    assert!(text.contains("scheduler leader: sched-w (token "), "{text}");
    for needle in [
        "every-second",
        "* * * * * *",
        "catch_up:2",
        "nightly",
        "0 0 3 * * *",
        "Europe/Berlin",
        "skip",
        "cli.flaky",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    let v = json(&tenure(&cfg, &["--json", "schedules"]));
    assert_eq!(v["leader"]["worker"], "sched-w");
    let nightly = &v["schedules"][1];
    assert_eq!(nightly["name"], "nightly");
    assert_eq!(nightly["enqueued"], 0);
    let next: chrono::DateTime<chrono::Utc> =
        nightly["next_tick"].as_str().unwrap().parse().unwrap();
    assert!(
        next.format("%M:%S").to_string() == "00:00" && next > chrono::Utc::now(),
        "next 03:00 Berlin: {next}"
    );
    worker.shutdown().await.unwrap();
}

/// `tenure schedule pause|resume|trigger NAME`: each says what it did, twice
/// changes nothing (a trigger with the same `--id` is the same job),
/// `tenure schedules` shows the paused state, and an unknown schedule is an
/// error that writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_pause_resume_and_trigger_from_the_cli() {
    let ns = DevStack::unique_namespace("cli_schedctl");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let worker = Worker::builder(cfg.clone().with_worker_id("sched-w"))
        .register(Flaky)
        .schedule::<Flaky>("nightly", "0 0 3 * * *", &5)
        .start()
        .await
        .unwrap();
    worker.shutdown().await.unwrap();

    let run = |args: &[&str]| ok(&tenure(&cfg, args)).trim().to_string();
    assert_eq!(run(&["schedule", "pause", "nightly"]), "paused nightly");
    assert_eq!(
        run(&["schedule", "pause", "nightly"]),
        "already paused nightly"
    );
    let v = json(&tenure(&cfg, &["--json", "schedules"]));
    assert!(v["schedules"][0]["paused_at"].is_string(), "{v}");
    assert_eq!(v["schedules"][0]["paused_by"], "tenure-cli", "{v}");
    let table = ok(&tenure(&cfg, &["schedules"]));
    assert!(
        table.contains("PAUSED") && table.contains("since "),
        "{table}"
    );

    let first = json(&tenure(
        &cfg,
        &["--json", "schedule", "trigger", "nightly", "--id", "t-1"],
    ));
    assert_eq!(first["outcome"], "triggered", "{first}");
    let id: JobId = first["job_id"].as_str().unwrap().parse().unwrap();
    let again = run(&["schedule", "trigger", "nightly", "--id", "t-1"]);
    assert_eq!(again, format!("already triggered nightly: job {id}"));
    let row = client.job(id).await.unwrap().expect("the triggered job");
    assert_eq!(row.job_type, "cli.flaky");
    assert_eq!(row.input, serde_json::json!(5));
    let fresh = run(&["schedule", "trigger", "nightly"]);
    assert!(fresh.starts_with("triggered nightly: job "), "{fresh}");
    assert!(
        !fresh.contains(&id.to_string()),
        "a new id each time: {fresh}"
    );

    assert_eq!(run(&["schedule", "resume", "nightly"]), "resumed nightly");
    assert_eq!(
        run(&["schedule", "resume", "nightly"]),
        "not paused nightly"
    );
    let v = json(&tenure(&cfg, &["--json", "schedules"]));
    assert!(v["schedules"][0]["paused_at"].is_null(), "{v}");

    for action in ["pause", "resume", "trigger"] {
        let err = failed(&tenure(&cfg, &["schedule", action, "nope"]));
        assert!(err.contains("no schedule \"nope\""), "{action}: {err}");
    }
    let v = json(&tenure(&cfg, &["--json", "schedules"]));
    assert_eq!(v["schedules"].as_array().unwrap().len(), 1, "{v}");
}

/// `tenure cancel`: a queued job becomes `cancelled` (shown by `jobs
/// --status cancelled` and `job`), twice is a no-op, an unknown id is an error
/// that changes nothing, and a malformed one is a usage error (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_cancel_cancels_a_queued_job_and_refuses_bad_input() {
    let ns = DevStack::unique_namespace("cli_cancel");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let id = client
        .enqueue::<Flaky>("to-cancel", &1)
        .await
        .unwrap()
        .job_id;
    let text = id.to_string();

    let out = ok(&tenure(
        &cfg,
        &["cancel", &text, "--reason", "no longer needed"],
    ));
    assert_eq!(out.trim(), format!("cancelled {id}"));
    let out = ok(&tenure(&cfg, &["cancel", &text]));
    assert_eq!(out.trim(), format!("already cancelled {id}"));
    let row = client.job(id).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Cancelled);
    assert_eq!(row.cancel_reason.as_deref(), Some("no longer needed"));

    let listed = json(&tenure(&cfg, &["--json", "jobs", "--status", "cancelled"]));
    let listed = listed.as_array().expect("a list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], text.as_str());
    assert_eq!(listed[0]["cancel_reason"], "no longer needed");
    let shown = ok(&tenure(&cfg, &["job", &text]));
    assert!(
        shown.contains("cancelled") && shown.contains("no longer needed"),
        "{shown}"
    );

    let unknown = JobId::from_key("cli.flaky", "never");
    let err = failed(&tenure(&cfg, &["cancel", &unknown.to_string()]));
    assert!(err.contains(&format!("no job {unknown}")), "{err}");
    assert!(client.job(unknown).await.unwrap().is_none());
    let out = tenure(&cfg, &["cancel", "not-a-uuid"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `tenure reschedule` moves a delayed job's run time (`--after`, `--at`);
/// `tenure retry-now` starts a job waiting out a ten-minute retry backoff
/// (it ends done). Each refuses a job in another state (published, delayed,
/// never failed, done, unknown) and changes nothing; missing or malformed
/// arguments are usage errors (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_retry_now_and_reschedule_move_waiting_jobs_and_refuse_others() {
    let ns = DevStack::unique_namespace("cli_retry_now");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let hour = Duration::from_secs(3600);
    let delayed = client
        .enqueue_after::<Flaky>("later", &1, hour)
        .await
        .unwrap()
        .job_id;
    let d = delayed.to_string();
    let out = ok(&tenure(&cfg, &["reschedule", &d, "--after", "2h"]));
    assert!(
        out.starts_with("rescheduled to ") && out.trim().ends_with(&d),
        "{out}"
    );
    let row = client.job(delayed).await.unwrap().unwrap();
    let ahead = row.run_at.unwrap() - chrono::Utc::now();
    assert!(ahead > chrono::Duration::minutes(119), "{row:?}");
    let at = chrono::Utc::now() + chrono::Duration::hours(3);
    let at = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let out = ok(&tenure(&cfg, &["reschedule", &d, "--at", &at]));
    assert!(out.contains(&at), "{out}");
    let row = client.job(delayed).await.unwrap().unwrap();
    let shown = row
        .run_at
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert_eq!(shown, at);
    let err = failed(&tenure(&cfg, &["reschedule", &d, "--after", "400d"]));
    assert!(err.contains("exceeds the configured maximum"), "{err}");
    let err = failed(&tenure(&cfg, &["retry-now", &d]));
    assert!(err.contains("delayed"), "{err}");

    // Published (no worker runs it): nothing to reschedule, never failed.
    let queued = client.enqueue::<Flaky>("queued", &2).await.unwrap().job_id;
    let q = queued.to_string();
    let err = failed(&tenure(&cfg, &["reschedule", &q, "--after", "1h"]));
    assert!(err.contains("published"), "{err}");
    let err = failed(&tenure(&cfg, &["retry-now", &q]));
    assert!(err.contains("never failed"), "{err}");
    let row = client.job(queued).await.unwrap().unwrap();
    assert_eq!((row.run_at, row.awaiting_publish), (None, false));
    let unknown = JobId::from_key("cli.flaky", "never");
    let err = failed(&tenure(&cfg, &["retry-now", &unknown.to_string()]));
    assert!(err.contains(&format!("no job {unknown}")), "{err}");
    for args in [
        &["reschedule", d.as_str()][..],
        &["reschedule", &d, "--at", "tomorrow"],
        &["retry-now", "not-a-uuid"],
    ] {
        let out = tenure(&cfg, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }

    let mut slow = cfg.clone().with_worker_id("slow-retries");
    slow.retry_backoff.base = Duration::from_secs(600);
    slow.retry_backoff.cap = Duration::from_secs(1200);
    let worker = Worker::builder(slow)
        .register(FailsOnce)
        .start()
        .await
        .unwrap();
    let id = client
        .enqueue::<FailsOnce>("once", &5)
        .await
        .unwrap()
        .job_id;
    let waits = wait_until(Duration::from_secs(30), || async {
        let row = client.job(id).await.unwrap().unwrap();
        row.attempts == 1 && row.status == JobStatus::Pending
    })
    .await;
    assert!(waits, "the first attempt fails and waits out its backoff");
    let out = ok(&tenure(&cfg, &["retry-now", &id.to_string()]));
    assert_eq!(out.trim(), format!("started {id}"));
    let done = wait_until(Duration::from_secs(30), || async {
        status(&client, id).await == Some(JobStatus::Done)
    })
    .await;
    assert!(done, "started now, it ends done");
    let err = failed(&tenure(&cfg, &["retry-now", &id.to_string()]));
    assert!(err.contains("done"), "{err}");
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_prune_dry_run_changes_nothing_and_prune_deletes_old_finished_jobs() {
    let ns = DevStack::unique_namespace("cli_prune");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let mut ids = Vec::new();
    for n in 0..3u64 {
        let id = client
            .enqueue::<Flaky>(&format!("old-{n}"), &n)
            .await
            .unwrap()
            .job_id;
        client.cancel(id, "to prune").await.unwrap();
        ids.push(id);
    }
    let pending = client.enqueue::<Flaky>("live", &9).await.unwrap().job_id;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let out = ok(&tenure(
        &cfg,
        &[
            "prune",
            "--cancelled-older-than",
            "1s",
            "--done-older-than",
            "1d",
            "--dry-run",
        ],
    ));
    assert!(
        out.contains("would delete 3 cancelled jobs older than 1s"),
        "{out}"
    );
    assert!(
        out.contains("would delete 0 done jobs older than 86400s"),
        "{out}"
    );
    for id in &ids {
        assert_eq!(
            status(&client, *id).await,
            Some(JobStatus::Cancelled),
            "dry run kept {id}"
        );
    }
    let v = json(&tenure(
        &cfg,
        &[
            "--json",
            "prune",
            "--cancelled-older-than",
            "1s",
            "--batch",
            "2",
        ],
    ));
    assert_eq!(v["dry_run"], false);
    assert_eq!(v["statuses"][0]["status"], "cancelled");
    assert_eq!(v["statuses"][0]["jobs"], 3);
    for id in &ids {
        assert_eq!(status(&client, *id).await, None, "{id} pruned");
    }
    assert_eq!(status(&client, pending).await, Some(JobStatus::Pending));

    let err = failed(&tenure(&cfg, &["prune", "--dry-run"]));
    assert!(err.contains("give at least one of"), "{err}");
    for bad in ["0d", "7x", "-1h", "h"] {
        let out = tenure(&cfg, &["prune", "--done-older-than", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
    }
}

/// A job that always finishes: two steps, for `enqueue` and the history table.
#[derive(Debug, Clone)]
struct Echo;

#[tenure::job(name = "cli.echo")]
impl Echo {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        Ok(n + 1)
    }

    #[step]
    async fn second(&self, _ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        Ok(n * 10)
    }
}

/// A superuser pool on `cfg`'s database (catalog reads, roles).
async fn admin_pool(cfg: &Config) -> sqlx::PgPool {
    sqlx::PgPool::connect(&cfg.database_url).await.unwrap()
}

async fn has(pool: &sqlx::PgPool, check: &str, role: &str, object: &str, what: &str) -> bool {
    sqlx::query_scalar::<_, bool>(&format!("SELECT {check}($1, $2, $3)"))
        .bind(role)
        .bind(object)
        .bind(what)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `tenure migrate`: applies the migrations and says so, a second run
/// applies nothing and says so; `--grant-worker`/`--grant-producer` give
/// each role its privileges (and the producer none of the worker's); an
/// unknown role is an error before anything is done.
/// `tenure pause`, `paused` and `resume`: each says what it did, twice
/// changes nothing, the row is what a worker reads, and a name no job type
/// can have is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_pause_and_resume_a_type_and_refuse_a_bad_name() {
    let ns = DevStack::unique_namespace("cli_pause");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");

    assert_eq!(
        ok(&tenure(&cfg, &["pause", "cli.flaky"])).trim(),
        "paused cli.flaky"
    );
    assert_eq!(
        ok(&tenure(&cfg, &["pause", "cli.flaky"])).trim(),
        "already paused cli.flaky"
    );
    let listed = json(&tenure(&cfg, &["--json", "paused"]));
    let listed = listed.as_array().expect("a list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["job_type"], "cli.flaky");
    assert_eq!(listed[0]["paused_by"], "tenure-cli", "{listed:?}");
    let table = ok(&tenure(&cfg, &["paused"]));
    assert!(
        table.contains("cli.flaky") && table.contains("(1 paused)"),
        "{table}"
    );
    let paused = client.paused().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].job_type, "cli.flaky");

    assert_eq!(
        ok(&tenure(&cfg, &["resume", "cli.flaky"])).trim(),
        "resumed cli.flaky"
    );
    assert_eq!(
        ok(&tenure(&cfg, &["resume", "cli.flaky"])).trim(),
        "not paused cli.flaky"
    );
    assert!(client.paused().await.unwrap().is_empty());
    assert!(ok(&tenure(&cfg, &["paused"])).contains("(0 paused)"));

    let err = failed(&tenure(&cfg, &["pause", "no spaces allowed"]));
    assert!(err.contains("pausing no spaces allowed"), "{err}");
    assert!(client.paused().await.unwrap().is_empty(), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_then_with_grants_and_an_unknown_role() {
    let ns = DevStack::unique_namespace("cli_mig");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let pool = admin_pool(&cfg).await;

    // An unknown role first: refused, and nothing migrated.
    let out = tenure(&cfg, &["migrate", "--grant-worker", "no_such_role_x"]);
    let err = failed(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no_such_role_x") && err.contains("does not exist"),
        "{err}"
    );
    let schema: Option<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname = $1")
            .bind(&cfg.schema)
            .fetch_optional(&pool)
            .await
            .unwrap();
    assert_eq!(schema, None, "nothing done before the roles were checked");

    let first = ok(&tenure(&cfg, &["migrate"]));
    assert!(
        first.contains("applied") && first.contains(&cfg.schema),
        "{first}"
    );
    let second = json(&tenure(&cfg, &["--json", "migrate"]));
    assert_eq!(second["applied"], serde_json::json!([]), "{second}");
    assert!(second["up_to_date"].as_u64().unwrap() > 10, "{second}");
    let again = ok(&tenure(&cfg, &["migrate"]));
    assert!(
        again.contains("up to date") && again.contains("nothing applied"),
        "{again}"
    );

    let (worker, producer, operator) = (format!("{ns}_w"), format!("{ns}_p"), format!("{ns}_o"));
    for role in [&worker, &producer, &operator] {
        sqlx::query(&format!("CREATE ROLE \"{role}\" NOLOGIN"))
            .execute(&pool)
            .await
            .unwrap();
    }
    let claim = format!(
        "\"{}\".tenure_claim(uuid, bigint, boolean, boolean)",
        cfg.schema
    );
    let jobs = format!("\"{}\".jobs", cfg.schema);
    assert!(!has(&pool, "has_function_privilege", &worker, &claim, "EXECUTE").await);
    for _ in 0..2 {
        let out = ok(&tenure(
            &cfg,
            &[
                "migrate",
                "--grant-worker",
                &worker,
                "--grant-producer",
                &producer,
                "--grant-operator",
                &operator,
            ],
        ));
        assert!(out.contains("nothing applied"), "{out}");
        assert!(
            out.contains(&format!("granted the operator privileges to {operator}")),
            "{out}"
        );
        assert!(
            out.contains(&format!("granted the worker privileges to {worker}")),
            "{out}"
        );
        assert!(
            out.contains(&format!("granted the producer privileges to {producer}")),
            "{out}"
        );
    }
    assert!(has(&pool, "has_function_privilege", &worker, &claim, "EXECUTE").await);
    assert!(
        !has(
            &pool,
            "has_function_privilege",
            &producer,
            &claim,
            "EXECUTE"
        )
        .await
    );
    assert!(
        !has(
            &pool,
            "has_function_privilege",
            &operator,
            &claim,
            "EXECUTE"
        )
        .await
    );
    let cancel = format!("\"{}\".tenure_cancel(uuid, text)", cfg.schema);
    assert!(
        has(
            &pool,
            "has_function_privilege",
            &operator,
            &cancel,
            "EXECUTE"
        )
        .await
    );
    assert!(!has(&pool, "has_function_privilege", &worker, &cancel, "EXECUTE").await);
    for f in ["tenure_pause_schedule", "tenure_resume_schedule"] {
        let f = format!("\"{}\".{f}(text)", cfg.schema);
        let (o, w) = (&operator, &worker);
        assert!(has(&pool, "has_function_privilege", o, &f, "EXECUTE").await);
        assert!(!has(&pool, "has_function_privilege", w, &f, "EXECUTE").await);
        let public = has(&pool, "has_function_privilege", &producer, &f, "EXECUTE");
        assert!(!public.await, "{f}: not PUBLIC");
    }
    assert!(has(&pool, "has_table_privilege", &operator, &jobs, "SELECT").await);
    assert!(!has(&pool, "has_table_privilege", &operator, &jobs, "INSERT").await);
    for role in [&worker, &producer] {
        assert!(
            has(&pool, "has_table_privilege", role, &jobs, "SELECT").await,
            "{role}"
        );
        assert!(
            !has(&pool, "has_table_privilege", role, &jobs, "UPDATE").await,
            "{role}"
        );
        let insert: bool =
            sqlx::query_scalar("SELECT has_column_privilege($1, $2, 'job_type', 'INSERT')")
                .bind(role)
                .bind(&jobs)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert!(insert, "{role} may enqueue");
    }
    for role in [&worker, &producer, &operator] {
        for stmt in ["DROP OWNED BY", "DROP ROLE"] {
            sqlx::query(&format!("{stmt} \"{role}\""))
                .execute(&pool)
                .await
                .unwrap();
        }
    }
}

/// `tenure enqueue` goes through the producers' path: the job runs, a
/// second identical enqueue is a duplicate and says so, `--after`/`--at`
/// delay it; `job --key TYPE:KEY` finds it and shows its history as a table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_then_job_by_key_with_its_history_table() {
    let ns = DevStack::unique_namespace("cli_enq");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let worker = Worker::builder(cfg.clone().with_worker_id("enq-w"))
        .register(Echo)
        .start()
        .await
        .unwrap();

    let args = ["enqueue", "cli.echo", "--key", "order:1", "--input", "4"];
    let out = ok(&tenure(&cfg, &args));
    let id = JobId::from_key("cli.echo", "order:1");
    assert!(out.contains(&format!("enqueued {id}")), "{out}");
    let again = ok(&tenure(&cfg, &args));
    assert!(
        again.contains("duplicate") && again.contains(&id.to_string()),
        "{again}"
    );
    let v = json(&tenure(&cfg, &[&["--json"][..], &args[..]].concat()));
    assert_eq!(v["duplicate"], true, "{v}");
    assert_eq!(v["job_id"], id.to_string());
    let conflict = failed(&tenure(
        &cfg,
        &["enqueue", "cli.echo", "--key", "order:1", "--input", "5"],
    ));
    assert!(
        conflict.contains("another job type or payload"),
        "{conflict}"
    );
    let finished = wait_until(Duration::from_secs(30), || async {
        status(&client, id).await == Some(JobStatus::Done)
    })
    .await;
    assert!(finished, "the enqueued job ran");
    assert_eq!(
        client.job(id).await.unwrap().unwrap().input,
        serde_json::json!(4)
    );

    // `job --key`: the same detail as `job <ID>`, then the history table.
    let by_key = ok(&tenure(&cfg, &["job", "--key", "cli.echo:order:1"]));
    let by_id = ok(&tenure(&cfg, &["job", &id.to_string()]));
    assert_eq!(by_key, by_id);
    println!("$ tenure job --key cli.echo:order:1\n{by_key}");
    let header = by_key
        .lines()
        .find(|l| l.starts_with("# "))
        .unwrap_or_else(|| panic!("no history table:\n{by_key}"));
    for col in ["AT", "EVENT", "TOKEN", "STEP", "WORKER", "DETAIL"] {
        assert!(header.contains(col), "{header}");
    }
    let events = client.store().job_events(id).await.unwrap();
    for (i, e) in events.iter().enumerate() {
        let n = (i + 1).to_string();
        let line = by_key
            .lines()
            .find(|l| l.split_whitespace().next() == Some(n.as_str()))
            .unwrap_or_else(|| panic!("event {n} missing:\n{by_key}"));
        assert!(line.contains(&e.kind), "{line}");
    }
    for kind in ["enqueued", "claimed", "step", "done"] {
        assert!(events.iter().any(|e| e.kind == kind), "{kind}: {events:?}");
    }
    assert!(by_key.contains("enq-w"), "the worker is named:\n{by_key}");
    let js = json(&tenure(
        &cfg,
        &["--json", "job", "--key", "cli.echo:order:1"],
    ));
    assert_eq!(js["id"], id.to_string());
    assert_eq!(js["events"].as_array().unwrap().len(), events.len());
    let missing = failed(&tenure(&cfg, &["job", "--key", "cli.echo:never"]));
    assert!(
        missing.contains("no job") && missing.contains("never"),
        "{missing}"
    );
    let out = tenure(&cfg, &["job", "--key", "no-colon"]);
    assert_eq!(out.status.code(), Some(2), "{}", failed(&out));

    // Delayed: `--after` and `--at` leave the row waiting for its time.
    let at = (chrono::Utc::now() + chrono::Duration::hours(2)).to_rfc3339();
    for (key, when) in [("later-1", ["--after", "1h"]), ("later-2", ["--at", &at])] {
        let v = json(&tenure(
            &cfg,
            &[
                &[
                    "--json", "enqueue", "cli.echo", "--key", key, "--input", "1",
                ][..],
                &when[..],
            ]
            .concat(),
        ));
        assert_eq!(v["duplicate"], false, "{v}");
        let row = client
            .job(JobId::from_key("cli.echo", key))
            .await
            .unwrap()
            .expect("enqueued");
        assert_eq!(row.status, JobStatus::Pending);
        assert!(row.awaiting_publish, "{key} waits for its time");
        let run_at = row.run_at.expect("run_at");
        assert!(
            run_at > chrono::Utc::now() + chrono::Duration::minutes(50),
            "{run_at}"
        );
    }
    worker.shutdown().await.unwrap();
}

/// Bad `enqueue` input is a usage error (exit 2) or the client's error
/// (exit 1), and nothing is enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_refuses_bad_input_and_enqueues_nothing() {
    let ns = DevStack::unique_namespace("cli_enq_bad");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let base = ["enqueue", "cli.echo", "--key", "bad"];
    let cases: [(&[&str], i32, &[&str]); 6] = [
        (&["--input", "{not json"], 2, &["--input", "JSON"]),
        (
            &[
                "--input",
                "1",
                "--at",
                "2030-01-01T00:00:00Z",
                "--after",
                "5m",
            ],
            2,
            &["--at", "--after"],
        ),
        (&["--input", "1", "--after", "5x"], 2, &["5x"]),
        (
            &["--input", "1", "--at", "tomorrow"],
            2,
            &["tomorrow", "RFC 3339"],
        ),
        (
            &["--input", "1", "--after", "3650d"],
            1,
            &["exceeds", "nothing enqueued"],
        ),
        (&["--input", "1"][..0], 2, &["--input"]),
    ];
    for (extra, code, needles) in cases {
        let out = tenure(&cfg, &[&base[..], extra].concat());
        let err = failed(&out);
        assert_eq!(out.status.code(), Some(code), "{extra:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{extra:?}: {n:?} missing: {err}");
        }
    }
    let bad_type = tenure(
        &cfg,
        &["enqueue", "no spaces", "--key", "k", "--input", "1"],
    );
    assert!(
        failed(&bad_type).contains("invalid job type"),
        "{bad_type:?}"
    );
    assert!(
        client
            .job(JobId::from_key("cli.echo", "bad"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        client
            .job(JobId::from_key("no spaces", "k"))
            .await
            .unwrap()
            .is_none()
    );
}

/// `jobs --type`, `--age` and `--key` narrow the list, next to `--status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_filters_by_type_age_and_key() {
    let ns = DevStack::unique_namespace("cli_filter");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let old = client
        .enqueue_json("cli.a", "old", serde_json::json!(1))
        .await
        .unwrap()
        .job_id;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let new_a = client
        .enqueue_json("cli.a", "new", serde_json::json!(2))
        .await
        .unwrap()
        .job_id;
    let new_b = client
        .enqueue_json("cli.b", "new", serde_json::json!(3))
        .await
        .unwrap()
        .job_id;
    client.cancel(new_b, "filtered").await.unwrap();
    let ids = |args: &[&str]| -> Vec<String> {
        let v = json(&tenure(&cfg, &[&["--json", "jobs"][..], args].concat()));
        let mut ids: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let sorted = |mut v: Vec<JobId>| {
        v.sort_by_key(|id| id.to_string());
        v.iter().map(JobId::to_string).collect::<Vec<_>>()
    };
    assert_eq!(ids(&[]), sorted(vec![old, new_a, new_b]));
    assert_eq!(ids(&["--type", "cli.a"]), sorted(vec![old, new_a]));
    assert_eq!(ids(&["--age", "2s"]), sorted(vec![new_a, new_b]));
    assert_eq!(
        ids(&["--type", "cli.a", "--age", "2s"]),
        sorted(vec![new_a])
    );
    assert_eq!(ids(&["--status", "cancelled"]), sorted(vec![new_b]));
    assert_eq!(
        ids(&["--type", "cli.a", "--status", "cancelled"]),
        sorted(vec![])
    );
    assert_eq!(ids(&["--type", "cli.a", "--key", "old"]), sorted(vec![old]));
    assert_eq!(
        ids(&["--type", "cli.a", "--key", "old", "--age", "2s"]),
        sorted(vec![])
    );
    assert_eq!(
        ids(&["--type", "cli.b", "--key", "new", "--status", "cancelled"]),
        sorted(vec![new_b])
    );
    assert_eq!(ids(&["--type", "cli.b", "--key", "nope"]), sorted(vec![]));
    let table = ok(&tenure(&cfg, &["jobs", "--type", "cli.a", "--key", "new"]));
    assert!(
        table.contains(&new_a.to_string()) && table.contains("(1 job)"),
        "{table}"
    );

    let out = tenure(&cfg, &["jobs", "--key", "old"]);
    let err = failed(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("--type"), "{err}");
    let out = tenure(&cfg, &["jobs", "--age", "ten"]);
    assert_eq!(out.status.code(), Some(2), "{}", failed(&out));
}

/// The CLI reads the workers' variables through the same table
/// (`config::SETTINGS`): a `TENURE_*` value a worker would refuse is
/// refused here too, naming the variable, and a flag overrides its variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_the_workers_variables_and_refuses_a_bad_one() {
    let ns = DevStack::unique_namespace("cli_env");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3));
    Client::connect(&cfg)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let with_env = |var: &str, value: &str| {
        let mut cmd = bare_tenure();
        cmd.env("TENURE_NATS_URL", &cfg.nats_url)
            .env("TENURE_DATABASE_URL", &cfg.database_url)
            .env("TENURE_NAMESPACE", &cfg.namespace)
            .env("TENURE_SCHEMA", &cfg.schema)
            .env(var, value);
        cmd
    };
    for (var, bad) in [
        ("TENURE_PREFETCH", "many"),
        ("TENURE_RETENTION_BATCH", "0"),
        ("TENURE_LEASE_TTL", "5"),
    ] {
        let err = failed(&with_env(var, bad).arg("jobs").output().unwrap());
        assert!(err.contains(var), "{var}={bad}: {err}");
    }
    ok(&with_env("TENURE_LEASE_TTL", "3s")
        .arg("jobs")
        .output()
        .unwrap());
    let flag_wins = with_env("TENURE_NAMESPACE", "Bad-NS")
        .args(["--namespace", &cfg.namespace, "jobs"])
        .output()
        .unwrap();
    ok(&flag_wins);
}

/// In a namespace that owns jobs by partition, `enqueue` needs the
/// namespace's partition count (`--partitions` or `TENURE_PARTITIONS`):
/// without it the client's refusal names the setting and nothing is enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_into_a_partitioned_namespace_takes_its_partition_count() {
    let ns = DevStack::unique_namespace("cli_part");
    let cfg = config_for(stack(), &ns, Duration::from_secs(3)).with_partitions(4);
    let client = Client::connect(&cfg).await.expect("client");
    client.migrate().await.expect("migrate");
    let args = ["enqueue", "cli.echo", "--key", "p1", "--input", "1"];
    let err = failed(&tenure(&cfg, &args));
    assert!(err.contains("TENURE_PARTITIONS"), "{err}");
    let id = JobId::from_key("cli.echo", "p1");
    assert!(client.job(id).await.unwrap().is_none(), "nothing enqueued");
    let out = ok(&tenure(
        &cfg,
        &[&["--partitions", "4"][..], &args[..]].concat(),
    ));
    assert!(out.contains(&format!("enqueued {id}")), "{out}");
    let row = client.job(id).await.unwrap().expect("enqueued");
    assert_eq!(row.status, JobStatus::Pending);
    for bad in ["0", "1025", "x"] {
        let out = tenure(&cfg, &["--partitions", bad, "jobs"]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
    }
}
