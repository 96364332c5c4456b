//! TEST ONLY (feature `testing`): the runtime's hooks at the named points of
//! a job's run, applying the `FaultPlan` in `Config::fault_plan` (its types
//! live in `crate::faults`, below `config`).
//!
//! Never compiled without the `testing` feature: the hooks in `steps.rs` are
//! `#[cfg(feature = "testing")]` one-line calls.

use crate::faults::{Fault, FaultHit, FaultPoint};
use crate::{Config, JobId, StepIndex};

/// Hook: step `step` of `job` is about to run ([`FaultPoint::StepStart`]).
pub(crate) async fn step_start(cfg: &Config, job: JobId, step: StepIndex) {
    at(cfg, FaultPoint::StepStart, job, step).await;
}

/// Hook: step `step` of `job` returned, uncommitted ([`FaultPoint::BeforeCommit`]).
pub(crate) async fn before_commit(cfg: &Config, job: JobId, step: StepIndex) {
    at(cfg, FaultPoint::BeforeCommit, job, step).await;
}

/// Hook: step `step` of `job` committed ([`FaultPoint::AfterCommit`]).
pub(crate) async fn after_commit(cfg: &Config, job: JobId, step: StepIndex) {
    at(cfg, FaultPoint::AfterCommit, job, step).await;
}

/// Hook: a partition's hand-over is about to delete its key
/// ([`FaultPoint::PartitionResign`]).
pub(crate) async fn partition_resign(cfg: &Config) {
    let nil = JobId::from_uuid(uuid::Uuid::nil());
    at(cfg, FaultPoint::PartitionResign, nil, StepIndex::new(0)).await;
}

/// Hook: a partition's campaign was won, its fence not claimed yet
/// ([`FaultPoint::PartitionClaim`]).
pub(crate) async fn partition_claim(cfg: &Config) {
    let nil = JobId::from_uuid(uuid::Uuid::nil());
    at(cfg, FaultPoint::PartitionClaim, nil, StepIndex::new(0)).await;
}

/// Applies the fault planned at `point` of `job`'s `step`,
/// if any.
async fn at(cfg: &Config, point: FaultPoint, job: JobId, step: StepIndex) {
    let Some(plan) = &cfg.fault_plan else { return };
    let Some(rule) = plan.fire(point, job, step) else {
        return;
    };
    tracing::warn!(%job, %step, ?point, fault = ?rule.fault, "TEST ONLY: injecting a planned fault");
    match &plan.injector {
        Some(injector) => injector.inject(FaultHit { rule, job }).await,
        None if rule.fault == Fault::Crash => std::process::abort(),
        None => tracing::error!(fault = ?rule.fault, "no injector for this fault; skipped"),
    }
}
