//! Step timeouts: `#[step(timeout = "30s")]`, or a job's default
//! `#[tenure::job(step_timeout = "30s")]`.
//!
//! A step still running at its limit is stopped: its future is dropped at its
//! next `.await` (a step that blocks its thread is not stopped: keep blocking
//! work in `spawn_blocking` and await it), its fenced transaction is rolled
//! back, so none of its writes through [`StepCtx::db`](crate::StepCtx::db)
//! commit, and the attempt fails with a [`StepTimedOut`] error: retried like
//! any retryable failure (counted against the job's `retries`), or the job is
//! dead-lettered at once when the step says `on_timeout = "permanent"`.
//! Either way a job that dies of it is dead-lettered with the code `timeout`.
//! The lease is not touched: a timeout is the step's failure, not a lost
//! owner.

use std::time::Duration;

use crate::StepIndex;

/// A step's time limit and what its expiry means.
///
/// ```
/// use std::time::Duration;
/// use tenure::job::{OnTimeout, StepTimeout};
///
/// let t = StepTimeout::retryable(Duration::from_secs(30));
/// assert_eq!((t.limit, t.on_timeout), (Duration::from_secs(30), OnTimeout::Retryable));
/// assert_eq!(StepTimeout::permanent(Duration::from_secs(1)).on_timeout, OnTimeout::Permanent);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepTimeout {
    /// How long the step may run, from its start.
    pub limit: Duration,
    /// What a step past `limit` counts as.
    pub on_timeout: OnTimeout,
}

impl StepTimeout {
    /// A limit whose expiry is a retryable failure.
    pub const fn retryable(limit: Duration) -> Self {
        StepTimeout {
            limit,
            on_timeout: OnTimeout::Retryable,
        }
    }

    /// A limit whose expiry dead-letters the job at once.
    pub const fn permanent(limit: Duration) -> Self {
        StepTimeout {
            limit,
            on_timeout: OnTimeout::Permanent,
        }
    }
}

/// What a step that ran past its [`StepTimeout`] counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnTimeout {
    /// A retryable failure (`on_timeout = "retryable"`, the default).
    Retryable,
    /// A permanent failure: the job is dead-lettered (`on_timeout = "permanent"`).
    Permanent,
}

/// The error of a step stopped at its [`StepTimeout`]: the
/// [`source`](crate::StepError::source) of the step's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("timeout: step {step} ({name}) ran past its limit of {limit:?}")]
#[non_exhaustive]
pub struct StepTimedOut {
    /// The step.
    pub step: StepIndex,
    /// Its name.
    pub name: &'static str,
    /// Its limit.
    pub limit: Duration,
}

impl StepTimedOut {
    /// The step's failure: retryable or permanent as `timeout` says.
    pub(crate) fn into_step_error(self, on_timeout: OnTimeout) -> crate::StepError {
        let kind = match on_timeout {
            OnTimeout::Retryable => crate::job::StepErrorKind::Retryable,
            OnTimeout::Permanent => crate::job::StepErrorKind::Permanent,
        };
        crate::StepError::with_kind(kind, self)
    }
}
