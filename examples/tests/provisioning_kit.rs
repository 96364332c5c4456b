//! The provisioning example's job on the testing kit (`#[tenure::test]`): a
//! worker process that crashes right after `boot_vm` commits, before the
//! next step and before any ack, is taken over; the next owner resumes at
//! `register_dns`, and the resource service holds exactly one of each
//! resource. The history checker finds nothing wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tenure::testing::{Fault, FaultPlan, FaultPoint, TestEnv};
use tenure::{Config, JobId, JobStatus, ObservedFence, StepIndex, Worker, WorkerBuilder};

#[path = "../provisioning/infra.rs"]
#[allow(dead_code)] // The demo's narration helpers.
mod infra;

use infra::{InfraClient, InfraService, Provision, ProvisionReq, Reply};

/// The resource service's subject in namespace `ns`.
fn subject(ns: &str) -> String {
    format!("{ns}.infra")
}

/// A provisioning worker (in process, or as a worker process of the test).
async fn provisioning_worker(mut cfg: Config) -> WorkerBuilder {
    // The service verifies tokens against the job rows: the claim commits
    // before the first step calls it.
    cfg.tuning.commit_claim_first = true;
    let nats = async_nats::connect(&cfg.nats_url).await.expect("NATS");
    let infra = InfraClient::new(nats, &subject(&cfg.namespace), &cfg.worker_id);
    Worker::builder(cfg).register(Provision::new(infra, false))
}

#[tenure::test(ttl_secs = 3, worker = provisioning_worker)]
async fn a_crash_after_boot_vm_commits_leaves_one_vm(env: TestEnv) {
    let nats = async_nats::connect(&env.config().nats_url).await.unwrap();
    let pool = env.pool().clone();
    let service = InfraService::start(nats, subject(env.namespace()), pool, env.schema(), |_| {})
        .await
        .unwrap();

    let job = JobId::from_key("infra.provision", "web-1");
    let plan = FaultPlan::new().at(
        Some(job),
        StepIndex::new(2),
        FaultPoint::AfterCommit,
        Fault::Crash,
    );
    let w1 = env.worker_process("w1", plan).await.unwrap();
    let req = ProvisionReq {
        name: "web-1".into(),
    };
    env.client()
        .enqueue::<Provision>("web-1", &req)
        .await
        .unwrap();
    let crashed = tenure::devstack::wait_until(Duration::from_secs(60), || async { w1.exited() });
    assert!(crashed.await, "w1 did not crash: {:?}", w1.lines());
    assert!(w1.has_line("crash"));
    let row = env.client().job(job).await.unwrap().unwrap();
    assert_eq!(
        row.step.get(),
        3,
        "boot_vm committed before the crash: {row:?}"
    );

    let w2 = env.worker("w2", provisioning_worker).await.unwrap();
    let row = env
        .run_until_done(job, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(row.status, JobStatus::Done);
    for kind in ["network", "volume", "vm", "dns"] {
        assert_eq!(service.created(kind).await.unwrap(), 1, "one {kind}");
    }
    env.check().await.unwrap().assert_clean();
    w2.shutdown().await.unwrap();
}

/// A raw client (no lock, no job; on this plain stack it may call on any
/// subject, here as caller `forger`) sends the largest token to the service,
/// before the job exists and while it runs: refused both times (the gate
/// verifies tokens against the job row's fence), and the real owner's steps
/// still succeed. With an unverified gate the mark jumped to `i64::MAX` and
/// every step of the owner was refused until the job died.
#[tenure::test(ttl_secs = 3, worker = provisioning_worker)]
async fn a_forged_maximum_token_is_refused_and_the_owner_goes_on(env: TestEnv) {
    let nats = async_nats::connect(&env.config().nats_url).await.unwrap();
    let subject = subject(env.namespace());
    let pool = env.pool().clone();
    let service = InfraService::start(nats.clone(), subject.clone(), pool, env.schema(), |_| {})
        .await
        .unwrap();
    let job = JobId::from_key("infra.provision", "web-forged");
    let forge = || async {
        let max = ObservedFence::new(i64::MAX).unwrap();
        let mut headers = tenure::blocks::queue::headers::fence_headers(job, max);
        headers.insert(infra::IDEMPOTENCY_KEY, "forged");
        let body = serde_json::to_vec(&infra::CreateReq {
            kind: "vm".into(),
            name: "forged".into(),
        })
        .unwrap();
        let reply = nats
            .request_with_headers(format!("{subject}.forger"), headers, body.into())
            .await
            .unwrap();
        serde_json::from_slice::<Reply>(&reply.payload).unwrap()
    };
    assert!(
        matches!(forge().await, Reply::Refused { .. }),
        "planted early"
    );
    let w = env.worker("w1", provisioning_worker).await.unwrap();
    let req = ProvisionReq {
        name: "web-forged".into(),
    };
    env.client()
        .enqueue::<Provision>("web-forged", &req)
        .await
        .unwrap();
    assert!(
        matches!(forge().await, Reply::Refused { .. }),
        "while it runs"
    );
    let row = env
        .run_until_done(job, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(row.status, JobStatus::Done);
    assert_eq!(
        service.created("vm").await.unwrap(),
        1,
        "the owner's vm only"
    );
    let mark = service.fence_of(job).await.unwrap();
    assert!(mark.is_some_and(|f| f.get() < i64::MAX), "{mark:?}");
    w.shutdown().await.unwrap();
}
