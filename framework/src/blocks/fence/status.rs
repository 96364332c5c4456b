//! A job's status, as a row records it (below `row.rs` and `error.rs`, which
//! both name it).

use std::fmt;
use std::str::FromStr;

/// The terminal statuses ([`JobStatus::is_terminal`]) as an SQL condition:
/// the predicate of the partial index `jobs_finished_created_idx`
/// (migration 0023), spelled out beside `status = $n` so a generic plan
/// can still use the index.
pub(crate) const FINISHED_SQL: &str = "status IN ('done', 'dead', 'cancelled')";

/// A job's status.
///
/// `pending` (no live owner), `running` (a generation has claimed it and not
/// released it), `done` (the last step committed), `dead` (given up: poison,
/// retries exhausted, bad input), `cancelled` (an operator cancelled it,
/// [`Client::cancel`](crate::Client::cancel)). `done`, `dead` and `cancelled`
/// are terminal: no claim, no step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobStatus {
    /// Not owned by a live generation.
    Pending,
    /// Claimed by the generation in `fence`.
    Running,
    /// Finished: the last step committed.
    Done,
    /// Given up (in the DLQ); an operator may redrive it.
    Dead,
    /// Cancelled by an operator: ends as it is, never retried nor redriven.
    Cancelled,
}

impl JobStatus {
    /// The status as stored in the `status` column.
    ///
    /// ```
    /// use tenure::blocks::fence::JobStatus;
    /// assert_eq!(JobStatus::Dead.as_str(), "dead");
    /// assert_eq!("running".parse::<JobStatus>().unwrap(), JobStatus::Running);
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Done => "done",
            JobStatus::Dead => "dead",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// `done`, `dead` or `cancelled`.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Done | JobStatus::Dead | JobStatus::Cancelled
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that is not one of `pending|running|done|dead|cancelled`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown job status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for JobStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(JobStatus::Pending),
            "running" => Ok(JobStatus::Running),
            "done" => Ok(JobStatus::Done),
            "dead" => Ok(JobStatus::Dead),
            "cancelled" => Ok(JobStatus::Cancelled),
            other => Err(UnknownStatus(other.to_string())),
        }
    }
}

/// Why a retry-now or a reschedule does not apply to a job: what it is
/// instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WrongState {
    /// An owner runs it (or ran it and went silent: its next owner takes it
    /// over after its lease).
    Running,
    /// Finished.
    Done,
    /// Dead (in the DLQ): redrive it instead.
    Dead,
    /// Cancelled by an operator.
    Cancelled,
    /// Delayed, awaiting publication by the scheduler (retry-now refuses it:
    /// reschedule it instead).
    Delayed,
    /// Pending and never failed: queued, not waiting out a retry backoff
    /// (retry-now refuses it).
    NotFailed,
    /// Its message is out (reschedule refuses it: only a delayed job not yet
    /// published has a `run_at` to move).
    Published,
}

impl WrongState {
    /// The state's name as the row function reports it (and the CLI prints it).
    pub fn as_str(self) -> &'static str {
        match self {
            WrongState::Running => "running",
            WrongState::Done => "done",
            WrongState::Dead => "dead",
            WrongState::Cancelled => "cancelled",
            WrongState::Delayed => "delayed",
            WrongState::NotFailed => "not_failed",
            WrongState::Published => "published",
        }
    }

    /// The state a row function named, `None` for `ok` and `unknown`.
    pub(super) fn from_outcome(outcome: &str) -> Option<Self> {
        [
            WrongState::Running,
            WrongState::Done,
            WrongState::Dead,
            WrongState::Cancelled,
            WrongState::Delayed,
            WrongState::NotFailed,
            WrongState::Published,
        ]
        .into_iter()
        .find(|s| s.as_str() == outcome)
    }
}

impl fmt::Display for WrongState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WrongState::NotFailed => "pending and never failed (not waiting to retry)",
            WrongState::Published => "published (not delayed)",
            WrongState::Delayed => "delayed (awaiting publication)",
            s => s.as_str(),
        })
    }
}
