//! `tenure serve` in a real browser: headless Debian `chromium` driven over
//! WebDriver (`chromedriver` on a free loopback port, started here and stopped
//! by its pid) against the dev stack with real workers and jobs.
//!
//! Screenshots of each page go to `<target>/screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fantoccini::{Client as Browser, Locator};
use tenure::Worker;
use tenure::blocks::fence::JobStatus;
use tenure::devstack::DevStack;
use tenure::{Client, Config, JobId, JobLimits, StepCtx, StepError};
use tenure_tests::{ThreeStep, Work, config_for, prepare_schema, wait_until};

mod support;
use support::{Proc, browser, lines_of, log_in, wait_line};

/// Set in the child process that plays the worker that freezes.
const CHILD_ENV: &str = "TENURE_WEB_CHILD";

/// While set, `web.flaky` jobs fail permanently (straight to the DLQ).
static BROKEN: AtomicBool = AtomicBool::new(true);

#[derive(Debug, Clone)]
struct Flaky;

#[tenure::job(name = "web.flaky", retries = 0)]
impl Flaky {
    #[step]
    async fn call_downstream(&self, _ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        if BROKEN.load(Ordering::SeqCst) {
            return Err(StepError::permanent("downstream refused the request"));
        }
        Ok(n)
    }
}

/// The worker that freezes: this test binary again, running only `child_worker`.
/// Whether a `web.fails_once` job has failed yet (its first attempt fails).
static FAILED_ONCE: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Clone)]
struct FailsOnce;

#[tenure::job(name = "web.fails_once", retries = 3)]
impl FailsOnce {
    #[step]
    async fn once(&self, _ctx: &mut StepCtx, n: u64) -> Result<u64, StepError> {
        if !FAILED_ONCE.swap(true, Ordering::SeqCst) {
            return Err(StepError::retryable("the first attempt fails"));
        }
        Ok(n)
    }
}

fn spawn_frozen_worker(cfg: &Config) -> (Proc, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_worker", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "A")
        .env("TENURE_NAMESPACE", &cfg.namespace)
        .env("TENURE_ETCD_ENDPOINTS", cfg.etcd_endpoints.join(","))
        .env("TENURE_NATS_URL", &cfg.nats_url)
        .env("TENURE_DATABASE_URL", &cfg.database_url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child worker");
    let rx = lines_of(&mut child);
    (Proc(child), rx)
}

/// Not a test of its own: the body of the child process `spawn_frozen_worker`
/// starts (a worker "A" until its standard input closes); a no-op otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_worker() {
    let Ok(worker) = std::env::var(CHILD_ENV) else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let ns = var("TENURE_NAMESPACE");
    let mut cfg = Config::new(ns.clone())
        .with_schema(ns.clone())
        .with_etcd_endpoints(var("TENURE_ETCD_ENDPOINTS").split(','))
        .with_nats_url(var("TENURE_NATS_URL"))
        .with_database_url(var("TENURE_DATABASE_URL"))
        .with_lease_ttl(Duration::from_secs(2))
        .with_worker_id(worker.clone());
    cfg.contention_backoff.base = Duration::from_millis(50);
    cfg.contention_backoff.cap = Duration::from_millis(500);
    let w = Worker::builder(cfg)
        .register(ThreeStep {
            worker: worker.clone(),
            schema: ns,
        })
        .start()
        .await
        .expect("worker A");
    println!("READY {worker}");
    std::io::stdout().flush().unwrap();
    let _ = tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        while std::io::stdin()
            .read_line(&mut s)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    })
    .await;
    let _ = w.shutdown().await;
}

async fn status(client: &Client, id: JobId) -> Option<JobStatus> {
    client.job(id).await.unwrap().map(|r| r.status)
}

/// `tenure serve` on a free loopback port, in operator mode: (process, base URL).
fn spawn_serve(cfg: &Config, token: &str) -> (Proc, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenure"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TENURE_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .args(["--nats", &cfg.nats_url, "--database-url", &cfg.database_url])
        .args(["--namespace", &cfg.namespace, "--schema", &cfg.schema])
        .args(cfg.partitions.map(|p| format!("--partitions={p}")))
        .args(["serve", "--bind", "127.0.0.1:0", "--refresh", "1"])
        .env("TENURE_OPERATOR_TOKEN", token)
        .stdout(Stdio::piped())
        .spawn()
        .expect("tenure serve");
    let rx = lines_of(&mut child);
    let line = wait_line(&rx, "listening on ", Duration::from_secs(20));
    let url = line
        .trim_start_matches("listening on ")
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
    assert!(line.contains("(operator)"), "{line}");
    (Proc(child), url)
}

fn screenshots_dir() -> PathBuf {
    // <target>/debug/tenure -> <target>/screenshots
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tenure"));
    let dir = bin.parent().unwrap().parent().unwrap().join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(b: &Browser, name: &str) {
    let png = b.screenshot().await.unwrap();
    std::fs::write(screenshots_dir().join(format!("{name}.png")), png).unwrap();
}

async fn text(b: &Browser, css: &str) -> String {
    b.find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn count_status(pool: &sqlx::PgPool, ns: &str, status: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {ns}.jobs WHERE status = $1"))
        .bind(status)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A job frozen mid-step and taken over; a dead job redriven from the DLQ
/// page; the overview against the database, and its live update.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn web_view_in_a_real_browser() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let started = std::time::Instant::now();
    let stack = DevStack::shared().expect("dev stack");
    let ns = DevStack::unique_namespace("web");
    let cfg = config_for(stack, &ns, Duration::from_secs(2));
    let client = Client::connect(&cfg).await.expect("client");
    prepare_schema(&client).await;
    let pool = client.store().pool().clone();

    // A commits step 0, then freezes (SIGSTOP) inside step 1.
    let (a, a_lines) = spawn_frozen_worker(&cfg);
    wait_line(&a_lines, "READY A", Duration::from_secs(30));
    let work = Work {
        n: 1,
        slow_worker: Some("A".into()),
        slow_step: 1,
        slow_ms: 3000,
        ..Work::default()
    };
    let frozen = client
        .enqueue::<ThreeStep>("frozen", &work)
        .await
        .unwrap()
        .job_id;
    let at_step_1 = wait_until(Duration::from_secs(20), || async {
        client
            .job(frozen)
            .await
            .unwrap()
            .is_some_and(|r| r.step.get() == 1)
    })
    .await;
    assert!(at_step_1, "A commits step 0");
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.signal("-STOP");

    // B takes over and finishes; A wakes and its write under the old token is refused.
    let b = Worker::builder(cfg.clone().with_worker_id("B"))
        .register(ThreeStep {
            worker: "B".into(),
            schema: ns.clone(),
        })
        .register(Flaky)
        .schedule::<ThreeStep>("web-nightly", "0 0 3 * * *", &nightly_work())
        .start()
        .await
        .unwrap();
    let done = wait_until(Duration::from_secs(30), || async {
        status(&client, frozen).await == Some(JobStatus::Done)
    })
    .await;
    assert!(done, "B finishes the frozen job");
    a.signal("-CONT");
    let refused = wait_until(Duration::from_secs(20), || async {
        let events = client.store().job_events(frozen).await.unwrap();
        events
            .iter()
            .any(|e| e.kind == "stale_refused" && e.worker.as_deref() == Some("A"))
    })
    .await;
    assert!(refused, "A's stale write is refused and recorded");
    drop(a); // A would take the next jobs; it has done its part.

    // Two jobs die while the downstream is broken: one is redriven, one cancelled.
    let dead = client.enqueue::<Flaky>("dies", &7).await.unwrap().job_id;
    let given_up = client
        .enqueue::<Flaky>("dies-too", &8)
        .await
        .unwrap()
        .job_id;
    let died = wait_until(Duration::from_secs(20), || async {
        status(&client, dead).await == Some(JobStatus::Dead)
            && status(&client, given_up).await == Some(JobStatus::Dead)
    })
    .await;
    assert!(died, "the flaky jobs are dead-lettered");

    let token = "web-test-operator-token";
    let (_serve, base) = spawn_serve(&cfg, token);
    actions_without_a_session_are_refused(&base, dead);
    let (driver, browser) = browser().await;

    job_page_shows_both_owners_and_the_refusal(&browser, &base, frozen).await;
    overview_matches_the_database(&browser, &base, &client, &pool, &ns).await;
    browser
        .goto(&format!("{base}/jobs?takeovers=on"))
        .await
        .unwrap();
    let listed = text(&browser, "#jobs").await;
    assert!(
        listed.contains(&frozen.to_string()) && !listed.contains(&dead.to_string()),
        "{listed}"
    );
    shot(&browser, "jobs").await;
    browser.goto(&format!("{base}/workers")).await.unwrap();
    let workers = text(&browser, "#workers").await;
    assert!(workers.contains('A') && workers.contains('B'), "{workers}");
    shot(&browser, "workers").await;
    redrive_from_the_dlq_page(&browser, &base, &client, dead, token).await;
    cancel_from_the_dlq_and_job_pages(&browser, &base, &client, given_up).await;
    pause_and_resume_from_the_overview(&browser, &base, &client).await;
    reschedule_and_retry_now_from_the_job_page(&browser, &base, &cfg, &client).await;
    api_returns_what_the_cli_prints(&browser, &base, &cfg, frozen).await;
    pause_resume_and_trigger_from_the_schedules_page(&browser, &base, &cfg, &client).await;

    browser.close().await.unwrap();
    drop(driver); // chromedriver, by its pid
    b.shutdown().await.unwrap();
    eprintln!("browser test took {:?}", started.elapsed());
}

async fn job_page_shows_both_owners_and_the_refusal(b: &Browser, base: &str, id: JobId) {
    b.goto(&format!("{base}/jobs/{id}")).await.unwrap();
    let owners = text(b, "#owners").await;
    assert_eq!(owners, "A → B", "first A claimed, then B took over");
    assert_eq!(text(b, "#status").await, "done");
    assert_eq!(text(b, "#takeovers").await, "1");
    assert_eq!(text(b, "#step-names").await, "first → second → third");
    let stale = b
        .find_all(Locator::Css("#timeline tr.k-stale_refused"))
        .await
        .unwrap();
    assert_eq!(stale.len(), 1, "one refused stale write");
    let row = stale[0].text().await.unwrap();
    assert!(row.contains('A'), "refused write by A: {row}");
    let steps = b
        .find_all(Locator::Css("#timeline tr.k-step"))
        .await
        .unwrap();
    assert_eq!(steps.len(), 3);
    let first = steps[0]
        .find(Locator::Css("td.worker"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let second = steps[1]
        .find(Locator::Css("td.worker"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        (first.as_str(), second.as_str()),
        ("A", "B"),
        "A committed step 0, B step 1"
    );
    let t0: i64 = steps[0]
        .find(Locator::Css("td.token"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .parse()
        .unwrap();
    let t1: i64 = steps[1]
        .find(Locator::Css("td.token"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(t1 > t0, "B's token {t1} exceeds A's {t0}");
    let refused_token: i64 = stale[0]
        .find(Locator::Css("td.token"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(refused_token, t0, "the refused write carried A's token");
    ownership_picture_matches_the_history(b, t0, t1).await;
    shot(b, "job").await;
}

/// The job page's picture: A's bar under its token, B's under the larger
/// one, the refused write a cross on A's bar, the three commits dots (one on
/// A's bar, two on B's).
async fn ownership_picture_matches_the_history(b: &Browser, a_token: i64, b_token: i64) {
    let attr = |e: fantoccini::elements::Element, name: &'static str| async move {
        e.attr(name).await.unwrap().unwrap_or_default()
    };
    let mut bars = Vec::new();
    for bar in b
        .find_all(Locator::Css("#ownership rect.owner"))
        .await
        .unwrap()
    {
        let worker = attr(bar.clone(), "data-worker").await;
        bars.push((worker, attr(bar, "data-token").await));
    }
    assert_eq!(
        bars,
        [
            ("A".to_string(), a_token.to_string()),
            ("B".to_string(), b_token.to_string())
        ]
    );
    let marks = |css: &'static str| async move {
        let mut on = Vec::new();
        for m in b.find_all(Locator::Css(css)).await.unwrap() {
            on.push(attr(m, "data-worker").await);
        }
        on
    };
    assert_eq!(marks("#ownership g.refused").await, ["A"]);
    assert_eq!(marks("#ownership g.commit").await, ["A", "B", "B"]);
}

async fn overview_matches_the_database(
    b: &Browser,
    base: &str,
    client: &Client,
    pool: &sqlx::PgPool,
    ns: &str,
) {
    b.goto(base).await.unwrap();
    for status in ["pending", "running", "done", "dead"] {
        let shown: i64 = text(b, &format!("#ov-{status}")).await.parse().unwrap();
        assert_eq!(shown, count_status(pool, ns, status).await, "{status}");
    }
    let total: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {ns}.jobs"))
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(text(b, "#ov-total").await, total.to_string());
    let dlq = client.queue().stats().await.unwrap().dlq_messages;
    assert_eq!(text(b, "#ov-dlq_size").await, dlq.to_string());
    assert_eq!(text(b, "#ov-recent-takeovers").await, "1");
    assert_eq!(text(b, "#ov-recent-stale_refusals").await, "1");
    shot(b, "overview").await;

    // Live: one more job finishes; the count changes without a reload.
    let before = count_status(pool, ns, "done").await;
    BROKEN.store(false, Ordering::SeqCst);
    let id = client.enqueue::<Flaky>("live", &1).await.unwrap().job_id;
    assert!(
        wait_until(Duration::from_secs(20), || async {
            status(client, id).await == Some(JobStatus::Done)
        })
        .await
    );
    let want = (before + 1).to_string();
    let updated = wait_until(Duration::from_secs(10), || async {
        text(b, "#ov-done").await == want
    })
    .await;
    assert!(
        updated,
        "the overview's done count follows without a reload"
    );
}

async fn redrive_from_the_dlq_page(
    b: &Browser,
    base: &str,
    client: &Client,
    dead: JobId,
    token: &str,
) {
    // Read-only until logged in: no redrive button.
    b.goto(&format!("{base}/dlq")).await.unwrap();
    assert!(
        b.find_all(Locator::Css("button.redrive"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(text(b, "#reasons").await.contains("permanent_error"));
    log_in(b, base, token).await;
    let button = format!("button.redrive[data-job='{dead}']");
    let shown = wait_until(Duration::from_secs(5), || async {
        b.find(Locator::Css(&button)).await.is_ok()
    })
    .await;
    assert!(shown, "logged in: the DLQ page offers a redrive");
    shot(b, "dlq").await;
    b.find(Locator::Css(&button))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let flashed = wait_until(Duration::from_secs(5), || async {
        b.find(Locator::Css("#flash")).await.is_ok()
    })
    .await;
    assert!(flashed);
    assert!(text(b, "#flash").await.contains(&dead.to_string()));
    let finished = wait_until(Duration::from_secs(20), || async {
        status(client, dead).await == Some(JobStatus::Done)
    })
    .await;
    assert!(finished, "the redriven job runs to done");
    b.goto(&format!("{base}/jobs/{dead}")).await.unwrap();
    assert_eq!(text(b, "#status").await, "done");
    let redriven = b
        .find_all(Locator::Css("#timeline tr.k-redriven"))
        .await
        .unwrap();
    assert_eq!(redriven.len(), 1);
}

/// Logged in (by the redrive): a dead job cancelled from its DLQ row leaves
/// the DLQ, with the reason typed; a pending job cancelled from its page.
async fn cancel_from_the_dlq_and_job_pages(b: &Browser, base: &str, client: &Client, dead: JobId) {
    b.goto(&format!("{base}/dlq")).await.unwrap();
    let form = format!("form.cancel:has(button[data-job='{dead}'])");
    b.find(Locator::Css(&format!("{form} input[name=reason]")))
        .await
        .unwrap()
        .send_keys("given up in the browser")
        .await
        .unwrap();
    click(b, &format!("{form} button")).await;
    assert_eq!(flash(b).await, "cancelled");
    let row = client.job(dead).await.unwrap().unwrap();
    assert_eq!(row.status, JobStatus::Cancelled);
    assert_eq!(
        row.cancel_reason.as_deref(),
        Some("given up in the browser")
    );
    let dlq = client.queue().dead_letters(100).await.unwrap();
    assert!(dlq.iter().all(|d| d.job_id != Some(dead)), "left the DLQ");

    // A job of a type no worker runs waits; cancel it from its page.
    let waiting = client
        .enqueue_json("web.nobody", "waits", serde_json::json!({}))
        .await
        .unwrap()
        .job_id;
    b.goto(&format!("{base}/jobs/{waiting}")).await.unwrap();
    click(b, &format!("button.cancel[data-job='{waiting}']")).await;
    assert_eq!(flash(b).await, "cancelled");
    assert_eq!(text(b, "#status").await, "cancelled");
    assert_eq!(status(client, waiting).await, Some(JobStatus::Cancelled));
    shot(b, "job-cancelled").await;
}

/// Partition mode: the workers page (and `tenure workers --json`) says which
/// worker owns which partitions of which type, under which token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_page_shows_the_partition_owners() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let stack = DevStack::shared().expect("dev stack");
    let ns = DevStack::unique_namespace("web_parts");
    let cfg = config_for(stack, &ns, Duration::from_secs(2)).with_partitions(2);
    let client = Client::connect(&cfg).await.expect("client");
    prepare_schema(&client).await;
    let worker = Worker::builder(cfg.clone().with_worker_id("P1"))
        .register(ThreeStep {
            worker: "P1".into(),
            schema: ns.clone(),
        })
        .start()
        .await
        .unwrap();
    let owned = wait_until(Duration::from_secs(20), || async {
        client.store().partition_owners().await.unwrap().len() == 2
    })
    .await;
    assert!(owned, "P1 claims both partitions");
    let owners = client.store().partition_owners().await.unwrap();

    let listed = cli_json(&cfg, &["workers"]);
    let p1 = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker"] == "P1")
        .expect("P1 listed");
    let parts: Vec<(String, u64)> = p1["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["job_type"].as_str().unwrap().to_string(),
                p["partition"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        parts,
        [
            ("test.three_step".to_string(), 0),
            ("test.three_step".to_string(), 1)
        ]
    );

    let (_serve, base) = spawn_serve(&cfg, "web-parts-operator-token");
    let (driver, b) = browser().await;
    b.goto(&format!("{base}/workers")).await.unwrap();
    assert_eq!(
        text(&b, "#workers tr[data-worker='P1'] td.partitions").await,
        "test.three_step:0,1"
    );
    let rows = b
        .find_all(Locator::Css("#partition-owners tr[data-partition]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    for (row, owner) in rows.iter().zip(&owners) {
        let shown = row.text().await.unwrap();
        assert!(
            shown.contains("P1") && shown.contains(&owner.token.to_string()),
            "{shown}"
        );
    }
    shot(&b, "workers-partitions").await;
    b.close().await.unwrap();
    drop(driver);
    worker.shutdown().await.unwrap();
}

/// Issue 35: the controls an operator set can be seen. Each worker's limits
/// per type are on the workers page and in `tenure workers --json`; a job
/// enqueued with `tenure enqueue --priority low` shows its level in `tenure
/// job` and on its page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_and_a_jobs_priority_can_be_seen() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let stack = DevStack::shared().expect("dev stack");
    let ns = DevStack::unique_namespace("web_limits");
    let cfg = config_for(stack, &ns, Duration::from_secs(2));
    let client = Client::connect(&cfg).await.expect("client");
    prepare_schema(&client).await;
    let limits = JobLimits::default()
        .max_in_flight(3)
        .fleet_max(2)
        .rate(5, Duration::from_secs(1));
    let job = ThreeStep {
        worker: "L1".into(),
        schema: ns.clone(),
    };
    let worker = Worker::builder(cfg.clone().with_worker_id("L1"))
        .register_with(job, limits)
        .start()
        .await
        .unwrap();
    let reported = wait_until(Duration::from_secs(20), || async {
        !client.store().type_limits().await.unwrap().is_empty()
    });
    assert!(reported.await, "L1 reports its limits");
    let listed = cli_json(&cfg, &["workers"]);
    let l1 = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker"] == "L1");
    let expected = serde_json::json!([{"worker": "L1", "job_type": "test.three_step",
        "max_in_flight": 3, "fleet_max": 2, "rate": 5, "rate_per_ms": 1000}]);
    assert_eq!(l1.expect("L1 listed")["limits"], expected);

    let input = r#"{"n": 1}"#;
    let args = [
        "enqueue",
        "test.three_step",
        "--key",
        "low-1",
        "--input",
        input,
    ];
    let enqueued = cli_json(&cfg, &[&args[..], &["--priority", "low"]].concat());
    assert_eq!(enqueued["priority"], "low");
    let id = enqueued["job_id"].as_str().unwrap().to_string();
    assert_eq!(cli_json(&cfg, &["job", &id])["priority"], "low");

    let (_serve, base) = spawn_serve(&cfg, "web-limits-operator-token");
    let (driver, b) = browser().await;
    b.goto(&format!("{base}/workers")).await.unwrap();
    let row = "#type-limits tr[data-type='test.three_step'][data-worker='L1']";
    assert_eq!(text(&b, &format!("{row} td.max-in-flight")).await, "3");
    assert_eq!(text(&b, &format!("{row} td.fleet-max")).await, "2");
    assert_eq!(text(&b, &format!("{row} td.rate")).await, "5/1s");
    shot(&b, "workers-limits").await;
    b.goto(&format!("{base}/jobs/{id}")).await.unwrap();
    assert_eq!(text(&b, "#priority").await, "low");
    b.close().await.unwrap();
    drop(driver);
    worker.shutdown().await.unwrap();
}

/// A delayed job rescheduled from its page (later, then now: it runs); a job
/// waiting out a ten-minute retry backoff started from its page's Retry now
/// button (it ends done); retry now of the finished job is refused, said as
/// it is.
async fn reschedule_and_retry_now_from_the_job_page(
    b: &Browser,
    base: &str,
    cfg: &Config,
    client: &Client,
) {
    BROKEN.store(false, Ordering::SeqCst);
    let hour = Duration::from_secs(3600);
    let delayed = client
        .enqueue_after::<Flaky>("delayed", &3, hour)
        .await
        .unwrap()
        .job_id;
    b.goto(&format!("{base}/jobs/{delayed}")).await.unwrap();
    assert!(text(b, "#run-at").await.contains("delayed"));
    b.find(Locator::Css("form.reschedule input[name=after]"))
        .await
        .unwrap()
        .send_keys("2h")
        .await
        .unwrap();
    click(b, &format!("button.reschedule[data-job='{delayed}']")).await;
    assert!(flash(b).await.starts_with("rescheduled to "));
    let row = client.job(delayed).await.unwrap().unwrap();
    let ahead = row.run_at.unwrap() - chrono::Utc::now();
    assert!(ahead > chrono::Duration::minutes(110), "{row:?}");
    assert!(row.awaiting_publish);
    // Both fields empty: now.
    click(b, &format!("button.reschedule[data-job='{delayed}']")).await;
    assert!(flash(b).await.starts_with("rescheduled to "));
    let ran = wait_until(Duration::from_secs(20), || async {
        status(client, delayed).await == Some(JobStatus::Done)
    })
    .await;
    assert!(ran, "the job rescheduled to now runs");

    let mut slow = cfg.clone().with_worker_id("C");
    slow.retry_backoff.base = Duration::from_secs(600);
    slow.retry_backoff.cap = Duration::from_secs(1200);
    let c = Worker::builder(slow)
        .register(FailsOnce)
        .start()
        .await
        .unwrap();
    let waiting = client
        .enqueue::<FailsOnce>("waits", &4)
        .await
        .unwrap()
        .job_id;
    let failed = wait_until(Duration::from_secs(20), || async {
        let row = client.job(waiting).await.unwrap().unwrap();
        row.attempts == 1 && row.status == JobStatus::Pending
    })
    .await;
    assert!(failed, "the first attempt fails");
    b.goto(&format!("{base}/jobs/{waiting}")).await.unwrap();
    click(b, &format!("button.retry-now[data-job='{waiting}']")).await;
    assert_eq!(flash(b).await, "started");
    let done = wait_until(Duration::from_secs(20), || async {
        status(client, waiting).await == Some(JobStatus::Done)
    })
    .await;
    assert!(done, "retried now, it ends done long before its backoff");
    b.goto(&format!("{base}/jobs/{waiting}")).await.unwrap();
    assert!(text(b, "#timeline").await.contains("retried_now"));
    shot(b, "job-retried-now").await;
    c.shutdown().await.unwrap();
}

/// Pause a type from the overview's form, see it listed (and in the
/// client's read), then resume it with its row's button.
async fn pause_and_resume_from_the_overview(b: &Browser, base: &str, client: &Client) {
    b.goto(&format!("{base}/")).await.unwrap();
    assert!(text(b, "#paused-none").await.starts_with("None"));
    b.find(Locator::Css("form.pause input[name=job_type]"))
        .await
        .unwrap()
        .send_keys("web.billing")
        .await
        .unwrap();
    click(b, "form.pause button").await;
    assert_eq!(flash(b).await, "paused web.billing");
    assert!(text(b, "#paused").await.contains("web.billing"));
    let paused = client.paused().await.unwrap();
    assert_eq!(
        paused
            .iter()
            .map(|p| p.job_type.as_str())
            .collect::<Vec<_>>(),
        ["web.billing"]
    );
    shot(b, "overview-paused").await;
    click(b, "button.resume[data-type='web.billing']").await;
    assert_eq!(flash(b).await, "resumed web.billing");
    assert!(client.paused().await.unwrap().is_empty());
    assert!(text(b, "#paused-none").await.starts_with("None"));
}

/// Clicks what navigates (a link, a form's button) and waits for the next
/// page: chromedriver may return from the click while the old page (with the
/// previous action's flash) is still shown.
async fn click(b: &Browser, css: &str) {
    b.execute("window.tenureOldPage = true;", vec![])
        .await
        .unwrap();
    b.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let next_page = wait_until(Duration::from_secs(10), || async {
        let probe = "return !window.tenureOldPage && document.readyState === 'complete';";
        matches!(
            b.execute(probe, vec![]).await,
            Ok(serde_json::Value::Bool(true))
        )
    })
    .await;
    assert!(next_page, "{css} led to a page");
}

/// The flash message of the page an action redirected to.
async fn flash(b: &Browser) -> String {
    let shown = wait_until(Duration::from_secs(10), || async {
        b.find(Locator::Css("#flash")).await.is_ok()
    })
    .await;
    assert!(shown, "the action's page shows what happened");
    text(b, "#flash").await
}

/// `tenure ... --json` with the servers of `cfg`.
fn cli_json(cfg: &Config, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args([
            "--json",
            "--nats",
            &cfg.nats_url,
            "--database-url",
            &cfg.database_url,
        ])
        .args(["--namespace", &cfg.namespace, "--schema", &cfg.schema])
        .args(args)
        .env_remove("TENURE_OPERATOR_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn api_json(b: &Browser, url: &str) -> serde_json::Value {
    b.goto(url).await.unwrap();
    serde_json::from_str(&text(b, "body").await).unwrap()
}

/// The JSON behind the pages is what the CLI prints with `--json`.
async fn api_returns_what_the_cli_prints(b: &Browser, base: &str, cfg: &Config, id: JobId) {
    let job = id.to_string();
    assert_eq!(
        api_json(b, &format!("{base}/api/jobs/{job}")).await,
        cli_json(cfg, &["job", &job])
    );
    assert_eq!(
        api_json(b, &format!("{base}/api/dlq")).await,
        cli_json(cfg, &["dlq", "--limit", "500"])
    );
    let workers = api_json(b, &format!("{base}/api/workers")).await;
    assert!(
        workers
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["worker"] == "A")),
        "{workers}"
    );
}

/// The input of the `web-nightly` schedule's jobs.
fn nightly_work() -> Work {
    Work {
        n: 4242,
        ..Work::default()
    }
}

/// The schedules page lists `web-nightly` and the leader; Pause and Resume
/// change the row (and what the client reads); Trigger runs one job now, and
/// the trigger id its form carries makes a repeated submission that job
/// again; `/api/schedules` is what `tenure schedules --json` prints.
async fn pause_resume_and_trigger_from_the_schedules_page(
    b: &Browser,
    base: &str,
    cfg: &Config,
    client: &Client,
) {
    b.goto(&format!("{base}/")).await.unwrap();
    click(b, "header a[href='/schedules']").await;
    let listed = text(b, "#schedules").await;
    for needle in [
        "web-nightly",
        "0 0 3 * * *",
        "UTC",
        "skip",
        "test.three_step",
    ] {
        assert!(listed.contains(needle), "{needle:?} missing: {listed}");
    }
    assert!(text(b, "#leader").await.contains('B'), "B leads");
    let paused_cell = "tr[data-schedule='web-nightly'] td.paused";
    assert_eq!(text(b, paused_cell).await, "no");

    click(b, "button.pause[data-schedule='web-nightly']").await;
    assert_eq!(flash(b).await, "paused web-nightly");
    assert!(text(b, paused_cell).await.starts_with("since "));
    let row = |rows: Vec<tenure::blocks::fence::ScheduleRow>| {
        rows.into_iter().find(|r| r.name == "web-nightly").unwrap()
    };
    assert!(
        row(client.store().schedules().await.unwrap())
            .paused_at
            .is_some()
    );
    shot(b, "schedules").await;
    click(b, "button.resume[data-schedule='web-nightly']").await;
    assert_eq!(flash(b).await, "resumed web-nightly");
    assert_eq!(text(b, paused_cell).await, "no");
    assert!(
        row(client.store().schedules().await.unwrap())
            .paused_at
            .is_none()
    );

    let form = "form.trigger:has(button[data-schedule='web-nightly'])";
    let trigger_id = b
        .find(Locator::Css(&format!("{form} input[name=trigger_id]")))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .expect("a trigger id in the form");
    click(b, &format!("{form} button")).await;
    let note = flash(b).await;
    let job = note
        .strip_prefix("triggered web-nightly: job ")
        .unwrap_or_else(|| panic!("{note}"));
    let job: JobId = job.parse().unwrap();
    let again = client
        .trigger_schedule("web-nightly", &trigger_id)
        .await
        .unwrap();
    assert!(
        again.duplicate && again.job_id == job,
        "the form's id again is that job"
    );
    let ran = wait_until(Duration::from_secs(20), || async {
        status(client, job).await == Some(JobStatus::Done)
    })
    .await;
    assert!(ran, "the triggered job ran");
    let row = client.job(job).await.unwrap().unwrap();
    assert_eq!(row.input["n"], 4242);

    assert_eq!(
        api_json(b, &format!("{base}/api/schedules")).await,
        cli_json(cfg, &["schedules"])
    );
}

/// A POST over a raw connection: the status line and the body.
fn post(base: &str, path: &str, headers: &str, body: &str) -> (String, String) {
    use std::io::Read;
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.lines().next().unwrap_or_default().to_string();
    (status, out)
}

/// Without a session, or with a session but without its CSRF token, a redrive is refused.
fn actions_without_a_session_are_refused(base: &str, dead: JobId) {
    let form = format!("job_id={dead}&csrf=guess");
    let (status, body) = post(base, "/dlq/redrive", "", &form);
    assert!(status.contains(" 403 "), "{status}");
    assert!(body.contains("log in"), "{body}");
    let (status, _) = post(base, "/jobs/cancel", "", &form);
    assert!(
        status.contains(" 403 "),
        "cancel without a session: {status}"
    );
    for action in [
        "/schedules/pause",
        "/schedules/resume",
        "/schedules/trigger",
    ] {
        let form = "schedule=web-nightly&trigger_id=t&csrf=guess";
        let (status, _) = post(base, action, "", form);
        assert!(
            status.contains(" 403 "),
            "{action} without a session: {status}"
        );
    }
    for action in ["/types/pause", "/types/resume"] {
        let (status, _) = post(base, action, "", "job_type=web.billing&csrf=guess");
        assert!(
            status.contains(" 403 "),
            "{action} without a session: {status}"
        );
    }
    let (status, _) = post(base, "/login", "", "token=wrong-token-wrong");
    assert!(status.contains(" 403 "), "{status}");
    let (status, login) = post(
        base,
        "/login",
        "Authorization: Bearer web-test-operator-token\r\nAccept: application/json\r\n",
        "",
    );
    assert!(status.contains(" 200 "), "{status}");
    let cookie = login
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_string();
    let (status, body) = post(
        base,
        "/dlq/redrive",
        &format!("Cookie: {cookie}\r\n"),
        &form,
    );
    assert!(
        status.contains(" 403 ") && body.contains("CSRF"),
        "{status}"
    );
}
