//! Step timeouts: a step's own, the job's default for the others, and what
//! their expiry counts as.

#![deny(warnings)]

use std::time::Duration;

use tenure::job::{OnTimeout, StepTimeout};
use tenure::{Job, StepCtx, StepError};

pub struct Provision;

#[tenure::job(name = "t.timeouts", step_timeout = "2m")]
impl Provision {
    #[step(timeout = "500ms")]
    async fn reserve(&self, _ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[step]
    async fn create(&self, _ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }

    #[step(timeout = "1h", on_timeout = "permanent")]
    async fn confirm(&self, _ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

pub struct NoTimeouts;

#[tenure::job(name = "t.no_timeouts")]
impl NoTimeouts {
    #[step]
    async fn only(&self, _ctx: &mut StepCtx, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

pub fn main() {
    let t = <Provision as Job>::STEP_TIMEOUTS;
    assert_eq!(
        t[0],
        Some(StepTimeout::retryable(Duration::from_millis(500)))
    );
    assert_eq!(t[1], Some(StepTimeout::retryable(Duration::from_secs(120))));
    assert_eq!(t[2].map(|t| t.on_timeout), Some(OnTimeout::Permanent));
    assert!(<NoTimeouts as Job>::STEP_TIMEOUTS.is_empty());
}
