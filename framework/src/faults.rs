//! TEST ONLY (feature `testing`): the fault plan's types, for
//! [`tenure::testing`](crate::testing). A [`FaultPlan`] in
//! `Config::fault_plan` lists rules ("job X, step k, at this point: this
//! fault"); the runtime's hooks (`runtime/faults.rs`) call
//! [`FaultPlan::fire`] at each point and the first matching rule that has not
//! fired yet fires (each rule fires once per process). What a fault does is
//! the plan's [`Injector`]'s business (the testing kit's: freeze the process,
//! cut its etcd connections, restart PostgreSQL); without one, only
//! [`Fault::Crash`] is applied (the process aborts), the others are logged and
//! skipped.
//!
//! A module of its own, below `config` and `runtime`: `Config` names
//! [`FaultPlan`], the runtime applies it, `testing` re-exports it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::types::{JobId, StepIndex};

/// Where in a step a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultPoint {
    /// The step is about to run: its owner holds the job (lock and fence), its
    /// body has not started.
    StepStart,
    /// The step's body returned `Ok`; its fenced transaction (with the step's
    /// writes) is open, not committed yet.
    BeforeCommit,
    /// The step committed (its checkpoint is in the row); the next step has
    /// not started, or, after the last step, the message is not acked yet.
    AfterCommit,
    /// Partition mode: a partition's hand-over is about to delete its key
    /// (its jobs have stopped). Not a point of a job: give its rules `job:
    /// None` and step 0; its [`FaultHit::job`] is the nil id.
    PartitionResign,
    /// Partition mode: a campaign for a partition was won (its key carries
    /// the new token) and its fence in PostgreSQL is not claimed yet. Not a
    /// point of a job: give its rules `job: None` and step 0; its
    /// [`FaultHit::job`] is the nil id.
    PartitionClaim,
}

/// What happens at a [`FaultPoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// The worker process aborts (`std::process::abort`): no rollback, no
    /// release, no ack. Only for worker processes.
    Crash,
    /// The whole worker process stops (`SIGSTOP`) for this long, keepalives
    /// included, then continues (`SIGCONT`). Only for worker processes.
    Freeze(Duration),
    /// The worker's connections to etcd are cut for this long (its keepalives
    /// fail, its lease runs out); the step waits the cut out.
    CutEtcd(Duration),
    /// PostgreSQL restarts (every connection drops) and the fault waits until
    /// it accepts connections again. Needs a test with its own stack.
    RestartPostgres,
    /// The etcd cluster's leader stops (`SIGSTOP`) for this long, then
    /// continues. The point does not wait: what follows it runs during the
    /// pause. Needs a test with its own stack.
    PauseEtcdLeader(Duration),
}

/// One rule of a [`FaultPlan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRule {
    /// The job it applies to (`None`: the first job to reach the point).
    pub job: Option<JobId>,
    /// The step.
    pub step: StepIndex,
    /// Where in the step.
    pub point: FaultPoint,
    /// What happens.
    pub fault: Fault,
}

/// A fault reached by a running job: the rule and the job it fired for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultHit {
    /// The rule that fired.
    pub rule: FaultRule,
    /// The job that reached the point.
    pub job: JobId,
}

/// Applies faults (the testing kit implements it for in-process workers and
/// for worker processes).
pub trait Injector: Send + Sync + 'static {
    /// Applies `hit.rule.fault`; the job continues when the future ends.
    fn inject(&self, hit: FaultHit) -> BoxFuture<'static, ()>;
}

/// Faults at named points of jobs, for `Config::fault_plan`: each rule fires
/// once per process, at the first job that reaches its point; its
/// [`Injector`] applies it (without one, only [`Fault::Crash`] is applied).
/// See the guide [`guide::testing`](crate::guide::testing).
///
/// ```
/// use std::time::Duration;
/// use tenure::StepIndex;
/// use tenure::testing::{Fault, FaultPlan, FaultPoint};
///
/// let plan = FaultPlan::new()
///     .at(None, StepIndex::new(1), FaultPoint::AfterCommit, Fault::Crash)
///     .at(None, StepIndex::new(0), FaultPoint::StepStart, Fault::Freeze(Duration::from_secs(6)));
/// assert_eq!(plan.rules().len(), 2);
/// ```
#[derive(Clone, Default)]
pub struct FaultPlan {
    rules: Vec<(FaultRule, Arc<AtomicBool>)>,
    pub(crate) injector: Option<Arc<dyn Injector>>,
}

impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultPlan")
            .field("rules", &self.rules())
            .field("injector", &self.injector.is_some())
            .finish()
    }
}

impl FaultPlan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule: at `job` (`None`: any job), step `step`, `point`: `fault`.
    #[must_use]
    pub fn at(
        mut self,
        job: Option<JobId>,
        step: StepIndex,
        point: FaultPoint,
        fault: Fault,
    ) -> Self {
        let rule = FaultRule {
            job,
            step,
            point,
            fault,
        };
        self.rules.push((rule, Arc::new(AtomicBool::new(false))));
        self
    }

    /// The rules, in order.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.rules.iter().map(|(r, _)| *r).collect()
    }

    /// The plan with `injector` applying its faults.
    #[must_use]
    pub fn with_injector(mut self, injector: Arc<dyn Injector>) -> Self {
        self.injector = Some(injector);
        self
    }

    /// Marks the first unfired rule matching the point as fired and returns it.
    pub(crate) fn fire(&self, point: FaultPoint, job: JobId, step: StepIndex) -> Option<FaultRule> {
        self.rules
            .iter()
            .find(|(r, fired)| {
                r.point == point
                    && r.step == step
                    && r.job.is_none_or(|j| j == job)
                    && !fired.swap(true, Ordering::SeqCst)
            })
            .map(|(r, _)| *r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_fires_once_at_its_job_step_and_point_only() {
        let job = JobId::from_key("t", "a");
        let other = JobId::from_key("t", "b");
        let (s0, s1) = (StepIndex::new(0), StepIndex::new(1));
        let plan = FaultPlan::new()
            .at(Some(job), s1, FaultPoint::AfterCommit, Fault::Crash)
            .at(None, s0, FaultPoint::StepStart, Fault::RestartPostgres);
        assert_eq!(plan.fire(FaultPoint::AfterCommit, other, s1), None);
        assert_eq!(plan.fire(FaultPoint::BeforeCommit, job, s1), None);
        assert_eq!(plan.fire(FaultPoint::AfterCommit, job, s0), None);
        let fired = plan.fire(FaultPoint::AfterCommit, job, s1);
        assert_eq!(fired.map(|r| r.fault), Some(Fault::Crash));
        assert_eq!(plan.fire(FaultPoint::AfterCommit, job, s1), None, "once");
        // Any job; clones share what fired.
        let copy = plan.clone();
        assert!(copy.fire(FaultPoint::StepStart, other, s0).is_some());
        assert!(plan.fire(FaultPoint::StepStart, job, s0).is_none());
    }
}
