//! # The provisioning demo: the fence crosses a hop
//!
//! A four-step infrastructure job (`allocate_network`, `create_volume`, `boot_vm`,
//! `register_dns`) whose steps do nothing in PostgreSQL: every side effect is a
//! request to a small resource service over NATS (request-reply, running in this
//! process). Each request carries two things:
//!
//! * the step's **idempotency key** (`ctx.idempotency_key("vm")`), the same for
//!   every owner and every retry of the step, so the service creates each resource
//!   at most once;
//! * the step's **fence** (`Tenure-Fence-Job-Id`, `Tenure-Fence` headers), which
//!   the service enforces on its own writes with a [`tenure::TokenGate`]: it
//!   keeps the largest token it has accepted per job and refuses smaller ones.
//!
//! Worker A (a separate process) boots the VM and is killed (SIGKILL) before the
//! step's checkpoint commits. Worker B takes the job over with a larger token,
//! resumes at `boot_vm`, and its request, carrying the same idempotency key, gets
//! the VM A created instead of a second one. Then a request with A's old token
//! reaches the service (a delayed packet, a zombie): refused. The demo exits 0 only
//! if exactly one VM exists, the job is done, and the stale request was refused.
//!
//! The gate orders callers; it does not say who they are. On the embedded dev
//! stack every party has a NATS user of its own (`callers.rs`): a worker may
//! call the service on its own subject `<subject>.<worker id>` only, so the
//! server vouches for the caller the service sees; a client without a user
//! cannot reach the service, and worker A cannot call as worker B.
//!
//! `cargo run --example provisioning` starts an embedded dev stack (3 etcd members,
//! NATS, PostgreSQL, authentication on each). With `TENURE_ETCD_ENDPOINTS`,
//! `TENURE_NATS_URL` and `TENURE_DATABASE_URL` set it uses those servers
//! instead, and says that it cannot authenticate callers there.

mod callers;
mod infra;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tenure_examples::{
    ChildWorker, in_memory_metrics, print_worker_b_metrics, serve_until_stdin_closes, spawn_worker,
    token_of, wait_for, wait_until,
};

use callers::{Parties, WORKERS};
use tenure::blocks::queue::nats_client;

use anyhow::{Context, bail};
use infra::{CreateReq, InfraClient, InfraService, Provision, ProvisionReq, Reply, Seen};
use tenure::JobStatus;
use tenure::{Client, Config, FencingToken, JobId, ObservedFence, StepIndex};
use tenure::{Worker, WorkerObserver};

const TTL: Duration = Duration::from_secs(2);
const ROLE_ENV: &str = "TENURE_PROVISIONING_WORKER";
const SUBJECT_ENV: &str = "TENURE_PROVISIONING_SUBJECT";
const CRASH_ENV: &str = "TENURE_PROVISIONING_CRASH_AFTER_BOOT";

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Ok(id) = std::env::var(ROLE_ENV) {
        return rt.block_on(worker_process(id));
    }
    if !rt.block_on(demo())? {
        bail!("the provisioning checks did NOT hold");
    }
    Ok(())
}

/// Timeline printing, relative to the demo's start.
#[derive(Clone)]
struct Timeline {
    start: tokio::time::Instant,
}

impl Timeline {
    fn say(&self, who: &str, what: impl std::fmt::Display) {
        let t = self.start.elapsed().as_secs_f64();
        println!("  t={t:>6.2}s  {who:<9} {what}");
        let _ = std::io::stdout().flush();
    }
}

fn step_name(step: &str) -> &'static str {
    step.parse::<usize>()
        .ok()
        .and_then(|i| infra::STEP_NAMES.get(i))
        .copied()
        .unwrap_or("?")
}

fn describe(seen: &Seen) -> String {
    let token = seen
        .token
        .map_or_else(|| "none".to_string(), |t| t.to_string());
    let what = match &seen.reply {
        Reply::Created { id } => format!("CREATED {id}"),
        Reply::Existing { id } => format!("already exists: {id} (deduplicated)"),
        Reply::Refused { reason, .. } => format!("REFUSED: {reason}"),
        Reply::Unavailable { reason } => format!("UNAVAILABLE: {reason}"),
    };
    format!(
        "create {:<7} token {token:<4} key {}: {what}",
        seen.kind,
        short_key(&seen.key)
    )
}

/// `<job uuid>:<step>:<label>` with the uuid shortened, for printing.
fn short_key(key: &str) -> String {
    match key.split_once(':') {
        Some((job, rest)) if job.len() > 8 => format!("{}..:{rest}", &job[..8]),
        _ => key.to_string(),
    }
}

struct Narrator {
    tl: Timeline,
}

impl WorkerObserver for Narrator {
    fn step_committed(&self, _job: JobId, step: StepIndex, token: FencingToken) {
        self.tl.say(
            "worker B",
            format!(
                "committed step {} with token {token}",
                step_name(&step.to_string())
            ),
        );
    }
    fn stale_rejected(&self, _job: JobId, step: StepIndex, token: FencingToken) {
        self.tl.say(
            "worker B",
            format!("step {step}: token {token} refused (stale)"),
        );
    }
}

/// The demo's configuration for `cfg`'s party: a short lease, quick
/// contention retries, and the claim committed before the first step (the
/// service verifies each token against the job rows).
fn tuned(cfg: Config) -> Config {
    let mut cfg = cfg.with_lease_ttl(TTL);
    cfg.contention_backoff.base = Duration::from_millis(100);
    cfg.contention_backoff.cap = Duration::from_millis(500);
    cfg.tuning.commit_claim_first = true;
    cfg
}

/// The resource service, in this process; it narrates every request it
/// answers and keeps them in the returned log.
async fn start_service(
    parties: &Parties,
    client: &Client,
    tl: &Timeline,
) -> anyhow::Result<(InfraService, Arc<Mutex<Vec<Seen>>>)> {
    let log: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let (tl, sink) = (tl.clone(), log.clone());
    let pool = client.store().pool().clone();
    let nats = parties.service_nats().await?;
    let service = InfraService::start(
        nats,
        parties.subject.clone(),
        pool,
        &parties.ns,
        move |seen| {
            tl.say("service", describe(seen));
            if let Ok(mut l) = sink.lock() {
                l.push(seen.clone());
            }
        },
    )
    .await
    .context("starting the resource service")?;
    Ok((service, log))
}

/// Narrates worker A's commits as its process prints them.
fn narrate_a(tl: Timeline, lines: Arc<Mutex<Vec<String>>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            let new: Vec<String> = match lines.lock() {
                Ok(l) => l[seen..].to_vec(),
                Err(_) => return,
            };
            seen += new.len();
            for line in new {
                let parts: Vec<&str> = line.split_whitespace().collect();
                match parts.as_slice() {
                    ["COMMIT", _, step, token] => tl.say(
                        "worker A",
                        format!("committed step {} with token {token}", step_name(step)),
                    ),
                    ["BOOTED", _, _, token] => tl.say(
                        "worker A",
                        format!("the VM is up (token {token}); about to checkpoint boot_vm..."),
                    ),
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Worker A, its own OS process (so that it can really be killed), as its
/// own NATS user; ready.
async fn start_worker_a(parties: &Parties, tl: &Timeline) -> anyhow::Result<ChildWorker> {
    let creds = parties.worker_env("A");
    let mut env: Vec<(&str, &str)> = vec![(SUBJECT_ENV, &parties.subject), (CRASH_ENV, "1")];
    env.extend(creds.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let a = spawn_worker(ROLE_ENV, "A", &tuned(parties.worker("A")), &env)?;
    wait_for(&a.lines, "READY", Duration::from_secs(30)).await?;
    tl.say("worker A", "ready (a separate process)");
    Ok(a)
}

/// What the checks look at once the job is done.
struct Run {
    row: tenure::JobRow,
    token_a: ObservedFence,
    zombie: Reply,
    unfenced: Reply,
    /// (no user refused, A could not call as B); `None` without users.
    callers: Option<(bool, bool)>,
}

async fn demo() -> anyhow::Result<bool> {
    println!("Tenure provisioning demo: idempotency keys and a fence that crosses a hop\n");
    // A namespace (etcd prefix, streams, schema, service subject) of this run's own.
    let parties = Parties::start("provisioning").await?;
    println!(
        "  namespace  {}, lease TTL {TTL:?}, service subject {}.<worker>",
        parties.ns, parties.subject
    );
    if parties.authenticated() {
        println!("  callers    a NATS user per worker, publishing on its own subject only\n");
    } else {
        println!(
            "  callers    NOT authenticated on these servers: give each worker a NATS user \
             that may publish to {}.<worker id> only, and the service a responder user\n",
            parties.subject
        );
    }
    let client = Client::connect(&parties.demo())
        .await
        .context("connecting")?;
    client.migrate().await.context("migrating")?;
    let tl = Timeline {
        start: tokio::time::Instant::now(),
    };
    let (service, log) = start_service(&parties, &client, &tl).await?;
    tl.say("demo", "resource service is listening");
    let mut a = start_worker_a(&parties, &tl).await?;
    let narrate = narrate_a(tl.clone(), a.lines.clone());

    let req = ProvisionReq {
        name: "web-1".into(),
    };
    let job = client
        .enqueue::<Provision>("web-1", &req)
        .await
        .context("enqueue")?
        .job_id;
    tl.say("demo", format!("enqueued provision(web-1), job {job}"));

    // A boots the VM; kill it before the checkpoint commits.
    let booted = format!("BOOTED {job} ");
    wait_for(&a.lines, &booted, Duration::from_secs(30)).await?;
    let token_a = token_of(&a.lines, &booted).context("worker A's token")?;
    a.kill();
    tl.say(
        "demo",
        format!("SIGKILL worker A (token {token_a}): the VM exists, its checkpoint does not"),
    );

    let (exporter, provider) = in_memory_metrics();
    let b = start_worker_b(&parties, &tl, &provider).await?;
    let row = wait_done(&client, job, &tl).await?;
    let (zombie, unfenced) = late_requests(&parties, &tl, job, token_a).await?;
    let callers = caller_checks(&parties, &tl).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    narrate.abort();

    println!();
    let seen = log.lock().map(|l| l.clone()).unwrap_or_default();
    print_worker_b_metrics(&provider, &exporter, 24);
    let run = Run {
        row,
        token_a,
        zombie,
        unfenced,
        callers,
    };
    let ok = verdict(&run, &seen, &service).await?;
    b.shutdown().await?;
    drop(service);
    drop(parties);
    Ok(ok)
}

/// Worker B, in this process, as its own NATS user, with metrics in memory.
async fn start_worker_b(
    parties: &Parties,
    tl: &Timeline,
    provider: &opentelemetry_sdk::metrics::SdkMeterProvider,
) -> anyhow::Result<Worker> {
    use opentelemetry::metrics::MeterProvider as _;
    let cfg = tuned(parties.worker("B"));
    let nats = nats_client(&cfg).await?;
    let b = Worker::builder(cfg)
        .register(Provision::new(
            InfraClient::new(nats, &parties.subject, "B"),
            false,
        ))
        .meter(provider.meter("tenure"))
        .observer(Arc::new(Narrator { tl: tl.clone() }))
        .start()
        .await
        .context("starting worker B")?;
    tl.say(
        "demo",
        format!("started worker B; it takes over once A's {TTL:?} lease expires"),
    );
    Ok(b)
}

/// Waits for `job` to be done; its row.
async fn wait_done(client: &Client, job: JobId, tl: &Timeline) -> anyhow::Result<tenure::JobRow> {
    let done = wait_until(Duration::from_secs(60), || async {
        matches!(client.job(job).await, Ok(Some(row)) if row.status == JobStatus::Done)
    })
    .await;
    if !done {
        bail!("the job did not finish within 60 s");
    }
    let row = client.job(job).await?.context("the job row")?;
    tl.say(
        "demo",
        format!(
            "job done; its fence is {} (takeovers: {})",
            row.fence, row.takeovers
        ),
    );
    Ok(row)
}

/// A zombie of worker A (a delayed packet, a process that was not quite dead)
/// asks for another VM with A's token, as A's own NATS user; then worker B's
/// user sends a request without any fence.
async fn late_requests(
    parties: &Parties,
    tl: &Timeline,
    job: JobId,
    token_a: ObservedFence,
) -> anyhow::Result<(Reply, Reply)> {
    tl.say(
        "demo",
        format!("a zombie request from worker A reaches the service, with token {token_a}"),
    );
    let as_a = InfraClient::new(
        nats_client(&parties.worker("A")).await?,
        &parties.subject,
        "A",
    );
    let zombie = as_a
        .send(
            Some((job, token_a)),
            &format!("{job}:2:vm-zombie"),
            &CreateReq {
                kind: "vm".into(),
                name: "web-1-zombie".into(),
            },
        )
        .await?;
    tl.say("demo", "a request without any fence reaches the service");
    let as_b = InfraClient::new(
        nats_client(&parties.worker("B")).await?,
        &parties.subject,
        "B",
    );
    let unfenced = as_b
        .send(
            None,
            "no-fence",
            &CreateReq {
                kind: "vm".into(),
                name: "web-1-unfenced".into(),
            },
        )
        .await?;
    Ok((zombie, unfenced))
}

/// A client without a NATS user, then worker A's user on worker B's subject:
/// (both refused); `None` when the servers have no users of ours.
async fn caller_checks(parties: &Parties, tl: &Timeline) -> anyhow::Result<Option<(bool, bool)>> {
    if !parties.authenticated() {
        return Ok(None);
    }
    tl.say(
        "demo",
        "a client without a NATS user tries to call the service",
    );
    let anonymous = parties.anonymous_refused().await;
    tl.say("demo", "worker A's NATS user tries to call as worker B");
    let impersonation = parties.impersonation_refused("A", "B").await?;
    Ok(Some((anonymous, impersonation)))
}

/// Prints what happened and each check; whether all hold.
async fn verdict(run: &Run, seen: &[Seen], service: &InfraService) -> anyhow::Result<bool> {
    let row = &run.row;
    let job = row.id;
    let token_a = run.token_a;
    let vm_key = format!("{job}:2:vm");
    let vm_requests: Vec<&Seen> = seen.iter().filter(|s| s.key == vm_key).collect();
    let token_b = ObservedFence::new(row.fence);
    let key_reused = vm_requests.len() == 2
        && matches!(vm_requests[0].reply, Reply::Created { .. })
        && matches!(vm_requests[1].reply, Reply::Existing { .. })
        && vm_requests[0].token == Some(token_a)
        && vm_requests[1].token == token_b;
    let token_grew =
        token_b.is_some_and(|b| b > token_a) && service.fence_of(job).await? == token_b;
    println!(
        "\nboot_vm requests with key {}: {} (A with token {token_a}, then B with token {})",
        short_key(&vm_key),
        vm_requests.len(),
        token_b.map_or_else(|| "none".to_string(), |t| t.to_string()),
    );
    let mut created = Vec::new();
    for kind in ["network", "volume", "vm", "dns"] {
        let n = service.created(kind).await?;
        println!("  {kind:<8} resources created: {n}");
        created.push(n);
    }
    println!();
    let own_subjects = seen.iter().all(|s| WORKERS.contains(&s.caller.as_str()))
        && vm_requests.iter().map(|s| s.caller.as_str()).eq(["A", "B"]);
    let mut checks = vec![
        ("the job finished", Some(row.status == JobStatus::Done)),
        (
            "exactly one of each resource (one VM)",
            Some(created.iter().all(|n| *n == 1)),
        ),
        ("B's retry reused A's idempotency key", Some(key_reused)),
        (
            "B's token is larger than A's, and the service holds it",
            Some(token_grew),
        ),
        (
            "A's stale token was refused by the service",
            Some(matches!(run.zombie, Reply::Refused { stale: Some(_), .. })),
        ),
        (
            "a write without a fence was refused",
            Some(matches!(run.unfenced, Reply::Refused { stale: None, .. })),
        ),
        ("one takeover was counted", Some(row.takeovers == 1)),
    ];
    checks.extend([
        (
            "a client without a NATS user could not reach the service",
            run.callers.map(|c| c.0),
        ),
        (
            "worker A's NATS user could not call as worker B",
            run.callers.map(|c| c.1),
        ),
        (
            "every answered request came from a worker's own subject",
            run.callers.map(|_| own_subjects),
        ),
    ]);
    let mut ok = true;
    for (what, holds) in checks {
        let mark = match holds {
            Some(true) => "ok",
            Some(false) => "FAILED",
            None => "skipped: no NATS users of ours on these servers",
        };
        println!("  [{mark}] {what}");
        ok &= holds != Some(false);
    }
    println!(
        "\n{}",
        if ok {
            "all checks hold"
        } else {
            "SOME CHECKS FAILED"
        }
    );
    Ok(ok)
}

/// Worker mode: run one worker until stdin closes (or SIGKILL), printing commits.
async fn worker_process(id: String) -> anyhow::Result<()> {
    struct Print;
    impl WorkerObserver for Print {
        fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
            println!("COMMIT {job_id} {step} {token}");
            let _ = std::io::stdout().flush();
        }
    }
    let mut cfg = Config::from_env()?;
    // The service verifies tokens against the job rows (see `demo`).
    cfg.tuning.commit_claim_first = true;
    let subject = std::env::var(SUBJECT_ENV).context(SUBJECT_ENV)?;
    let crash = std::env::var(CRASH_ENV).is_ok_and(|v| v == "1");
    // As this worker's own NATS user: it may call the service on its own subject only.
    let nats = nats_client(&cfg).await?;
    let infra = InfraClient::new(nats, &subject, &id);
    let worker = Worker::builder(cfg)
        .register(Provision::new(infra, crash))
        .observer(Arc::new(Print))
        .start()
        .await?;
    serve_until_stdin_closes(worker, &id).await
}
