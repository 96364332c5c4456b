//! The job types a worker runs, type-erased.

use std::collections::HashMap;
use std::sync::Arc;

use crate::StepIndex;
use crate::job::{BoxFuture, Job, StepCtx, StepError, StepInfo};

/// A [`Job`] behind a trait object (the runtime holds many job types at once).
pub(crate) trait DynJob: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn steps(&self) -> &'static [StepInfo];
    fn max_takeovers(&self) -> Option<u32>;
    fn retries(&self) -> Option<u32>;
    fn run_step<'a>(
        &'a self,
        step: StepIndex,
        ctx: &'a mut StepCtx,
        input: serde_json::Value,
    ) -> BoxFuture<'a, Result<serde_json::Value, StepError>>;
}

impl<J: Job> DynJob for J {
    fn name(&self) -> &'static str {
        J::NAME
    }
    fn steps(&self) -> &'static [StepInfo] {
        J::STEPS
    }
    fn max_takeovers(&self) -> Option<u32> {
        J::MAX_TAKEOVERS
    }
    fn retries(&self) -> Option<u32> {
        J::RETRIES
    }
    fn run_step<'a>(
        &'a self,
        step: StepIndex,
        ctx: &'a mut StepCtx,
        input: serde_json::Value,
    ) -> BoxFuture<'a, Result<serde_json::Value, StepError>> {
        Job::run_step(self, step, ctx, input)
    }
}

/// Job types by name.
#[derive(Default, Clone)]
pub(crate) struct Registry {
    jobs: HashMap<&'static str, Arc<dyn DynJob>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.jobs.keys()).finish()
    }
}

impl Registry {
    /// Adds a job type; `false` if the name was taken.
    pub(crate) fn insert<J: Job>(&mut self, job: J) -> bool {
        if self.jobs.contains_key(J::NAME) {
            return false;
        }
        self.jobs.insert(J::NAME, Arc::new(job));
        true
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<dyn DynJob>> {
        self.jobs.get(name).cloned()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}
