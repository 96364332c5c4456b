//! The ledger example's transfer job on the testing kit (`#[tenure::test]`):
//! a worker process frozen in the middle of the debit, for two lease TTLs,
//! is taken over; the money moves once, the notification goes out once, and
//! the history checker finds nothing wrong in the job's own ledger table.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tenure::blocks::fence::FenceStore;
use tenure::testing::{Fault, FaultPlan, FaultPoint, TestEnv};
use tenure::{Config, JobId, JobStatus, StepIndex, Worker, WorkerBuilder};

#[path = "../ledger/bank.rs"]
#[allow(dead_code)] // The demo's narration helpers.
mod bank;

use bank::{Bank, Transfer, TransferReq};

/// A ledger worker (in process, or as a worker process of the test).
async fn ledger_worker(cfg: Config) -> WorkerBuilder {
    let store = FenceStore::connect(&cfg).await.expect("the test database");
    Worker::builder(cfg).register(Transfer::new(Bank::new(store)))
}

#[tenure::test(ttl_secs = 3, worker = ledger_worker)]
async fn a_transfer_frozen_in_its_debit_moves_the_money_once(env: TestEnv) {
    let bank = Bank::new(env.client().store().clone());
    bank.create(&[("alice", 100), ("bob", 0)]).await.unwrap();
    let entries = format!("{}.entries", env.schema());
    env.history()
        .watch_table(&entries, "job_id", "step", Some("token"));

    // The debit (step 1) applied in its fenced transaction, not committed:
    // the worker freezes for 2 x TTL.
    let job = JobId::from_key("ledger.transfer", "t-1");
    let freeze = Fault::Freeze(Duration::from_secs(6));
    let plan = FaultPlan::new().at(
        Some(job),
        StepIndex::new(1),
        FaultPoint::BeforeCommit,
        freeze,
    );
    let w1 = env.worker_process("w1", plan).await.unwrap();
    let req = TransferReq {
        from: "alice".into(),
        to: "bob".into(),
        amount: 40,
        debit_latency_ms: 0,
    };
    env.client().enqueue::<Transfer>("t-1", &req).await.unwrap();
    let frozen =
        tenure::devstack::wait_until(Duration::from_secs(60), || async { w1.has_line("freeze") });
    assert!(frozen.await, "w1 never froze: {:?}", w1.lines());

    let w2 = env.worker("w2", ledger_worker).await.unwrap();
    let row = env
        .run_until_done(job, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(row.status, JobStatus::Done);
    assert!(row.takeovers >= 1, "w2 took the transfer over: {row:?}");
    // w1 wakes up after its freeze; its debit never commits.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let balances = bank.balances().await.unwrap();
    assert_eq!(balances, vec![("alice".into(), 60), ("bob".into(), 40)]);
    assert_eq!(bank.double_applied().await.unwrap(), 0);
    assert_eq!(bank.notifications().await.unwrap().0, 1, "one notification");
    env.check().await.unwrap().assert_clean();
    w2.shutdown().await.unwrap();
}
