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
//! `cargo run --example provisioning` starts an embedded dev stack (3 etcd members,
//! NATS, PostgreSQL). With `TENURE_ETCD_ENDPOINTS`, `TENURE_NATS_URL` and
//! `TENURE_DATABASE_URL` set it uses those servers instead.

mod infra;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tenure_examples::{
    demo_servers, in_memory_metrics, print_worker_b_metrics, serve_until_stdin_closes,
    spawn_worker, token_of, wait_for, wait_until,
};

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

async fn demo() -> anyhow::Result<bool> {
    println!("Tenure provisioning demo: idempotency keys and a fence that crosses a hop\n");
    // A namespace (etcd prefix, streams, schema, service subject) of this run's own.
    let (stack, cfg, ns) = demo_servers("provisioning").await?;
    let mut cfg = cfg.with_lease_ttl(TTL);
    cfg.contention_backoff.base = Duration::from_millis(100);
    cfg.contention_backoff.cap = Duration::from_millis(500);
    // The service verifies each token against the job rows (a forged token
    // cannot poison its marks): the claim commits before the first step.
    cfg.tuning.commit_claim_first = true;
    let subject = format!("{ns}.infra.create");
    println!("  namespace  {ns}, lease TTL {TTL:?}, service subject {subject}\n");

    let client = Client::connect(&cfg).await.context("connecting")?;
    client.migrate().await.context("migrating")?;
    let nats = async_nats::connect(&cfg.nats_url)
        .await
        .context("connecting to NATS")?;
    let tl = Timeline {
        start: tokio::time::Instant::now(),
    };

    // The resource service, in this process; it narrates every request it answers.
    let log: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let service = {
        let (tl, log) = (tl.clone(), log.clone());
        let pool = client.store().pool().clone();
        InfraService::start(nats.clone(), subject.clone(), pool, &ns, move |seen| {
            tl.say("service", describe(seen));
            if let Ok(mut l) = log.lock() {
                l.push(seen.clone());
            }
        })
        .await
        .context("starting the resource service")?
    };
    tl.say("demo", "resource service is listening");

    // Worker A, its own OS process, so that it can really be killed.
    let mut a = spawn_worker(
        ROLE_ENV,
        "A",
        &cfg,
        &[(SUBJECT_ENV, &subject), (CRASH_ENV, "1")],
    )?;
    wait_for(&a.lines, "READY", Duration::from_secs(30)).await?;
    tl.say("worker A", "ready (a separate process)");
    let narrate = {
        let (tl, lines) = (tl.clone(), a.lines.clone());
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
    };

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

    // Worker B, in this process, with metrics in memory.
    let (exporter, provider) = in_memory_metrics();
    use opentelemetry::metrics::MeterProvider as _;
    let infra = InfraClient {
        nats: nats.clone(),
        subject: subject.clone(),
    };
    let b = Worker::builder(cfg.clone().with_worker_id("B"))
        .register(Provision::new(infra.clone(), false))
        .meter(provider.meter("tenure"))
        .observer(Arc::new(Narrator { tl: tl.clone() }))
        .start()
        .await
        .context("starting worker B")?;
    tl.say(
        "demo",
        format!("started worker B; it takes over once A's {TTL:?} lease expires"),
    );

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

    // A zombie of worker A (a delayed packet, a process that was not quite dead)
    // asks for another VM with A's token, then someone tries without any fence.
    tl.say(
        "demo",
        format!("a zombie request from worker A reaches the service, with token {token_a}"),
    );
    let zombie = infra
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
    let unfenced = infra
        .send(
            None,
            "no-fence",
            &CreateReq {
                kind: "vm".into(),
                name: "web-1-unfenced".into(),
            },
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    narrate.abort();

    // The verdict.
    println!();
    let seen = log.lock().map(|l| l.clone()).unwrap_or_default();
    let vm_key = format!("{job}:2:vm");
    let vm_requests: Vec<&Seen> = seen.iter().filter(|s| s.key == vm_key).collect();
    let vms = service.created("vm").await?;
    let token_b = ObservedFence::new(row.fence);
    let stale_refused = matches!(zombie, Reply::Refused { stale: Some(_), .. });
    let unfenced_refused = matches!(unfenced, Reply::Refused { stale: None, .. });
    let key_reused = vm_requests.len() == 2
        && matches!(vm_requests[0].reply, Reply::Created { .. })
        && matches!(vm_requests[1].reply, Reply::Existing { .. })
        && vm_requests[0].token == Some(token_a)
        && vm_requests[1].token == token_b;
    let token_grew =
        token_b.is_some_and(|b| b > token_a) && service.fence_of(job).await? == token_b;
    println!(
        "boot_vm requests with key {}: {} (A with token {token_a}, then B with token {})",
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

    print_worker_b_metrics(&provider, &exporter, 24);
    println!();
    let checks = [
        ("the job finished", row.status == JobStatus::Done),
        (
            "exactly one of each resource (one VM)",
            created.iter().all(|n| *n == 1),
        ),
        ("B's retry reused A's idempotency key", key_reused),
        (
            "B's token is larger than A's, and the service holds it",
            token_grew,
        ),
        ("A's stale token was refused by the service", stale_refused),
        ("a write without a fence was refused", unfenced_refused),
        ("one takeover was counted", row.takeovers == 1),
    ];
    let mut ok = true;
    for (what, holds) in checks {
        println!("  [{}] {what}", if holds { "ok" } else { "FAILED" });
        ok &= holds;
    }
    println!(
        "\n{}",
        if ok && vms == 1 {
            "all checks hold"
        } else {
            "SOME CHECKS FAILED"
        }
    );
    b.shutdown().await?;
    drop(service);
    drop(stack);
    Ok(ok && vms == 1)
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
    let nats = async_nats::connect(&cfg.nats_url).await?;
    let worker = Worker::builder(cfg)
        .register(Provision::new(InfraClient { nats, subject }, crash))
        .observer(Arc::new(Print))
        .start()
        .await?;
    serve_until_stdin_closes(worker, &id).await
}
