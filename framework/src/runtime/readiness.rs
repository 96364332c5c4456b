//! Whether a worker runs at all (liveness) and whether it can do work now
//! (readiness), for an orchestrator's probes: [`WorkerProbe`],
//! [`Worker::readiness`](super::Worker::readiness), and the HTTP endpoints of
//! `tenure::probe` (feature `http`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorRef, ActorStatus};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::supervisor::SupervisorMsg;
use crate::lease::Health;

/// How long a readiness check that asks a server (PostgreSQL's `SELECT 1`,
/// etcd's partition owners) waits for its answer before it fails.
pub const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

/// The outcome of one check of [`Readiness`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadinessCheck {
    /// The check passed.
    Passed,
    /// The check failed, and why (one line).
    Failed(String),
}

impl ReadinessCheck {
    /// Whether the check passed.
    pub fn passed(&self) -> bool {
        matches!(self, ReadinessCheck::Passed)
    }

    fn failed_if(failed: bool, why: impl FnOnce() -> String) -> ReadinessCheck {
        if failed {
            ReadinessCheck::Failed(why())
        } else {
            ReadinessCheck::Passed
        }
    }
}

/// Per check, whether a worker can do work now ([`WorkerProbe::readiness`]).
/// Ready when every check passed; [`reason`](Self::reason) names the first
/// one that failed, in the order of the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Readiness {
    /// The worker is not shutting down (a draining worker takes no new job).
    pub running: ReadinessCheck,
    /// Its etcd lease session is `Healthy` (a `Degraded` or `Lost` session
    /// takes no new job).
    pub lease: ReadinessCheck,
    /// PostgreSQL answers a `SELECT 1` on the worker's pool within
    /// [`READINESS_TIMEOUT`].
    pub postgres: ReadinessCheck,
    /// The NATS client is connected.
    pub nats: ReadinessCheck,
    /// Partition mode ([`Config::partitions`](crate::Config::partitions)):
    /// the worker takes part in the partitions (not stood down) and holds its
    /// fair share of every registered type's partitions. `None` otherwise.
    pub partitions: Option<ReadinessCheck>,
}

impl Readiness {
    /// Whether every check passed.
    pub fn is_ready(&self) -> bool {
        self.checks().all(|(_, c)| c.passed())
    }

    /// The first failing check as one line, `<check>: <why>`
    /// (e.g. `postgres: SELECT 1 timed out after 2s`); `None` when ready.
    pub fn reason(&self) -> Option<String> {
        self.checks().find_map(|(name, c)| match c {
            ReadinessCheck::Passed => None,
            ReadinessCheck::Failed(why) => Some(format!("{name}: {why}")),
        })
    }

    fn checks(&self) -> impl Iterator<Item = (&'static str, &ReadinessCheck)> {
        [
            ("running", Some(&self.running)),
            ("lease", Some(&self.lease)),
            ("postgres", Some(&self.postgres)),
            ("nats", Some(&self.nats)),
            ("partitions", self.partitions.as_ref()),
        ]
        .into_iter()
        .filter_map(|(name, c)| c.map(|c| (name, c)))
    }
}

impl fmt::Display for Readiness {
    /// `ready`, or the [`reason`](Self::reason).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            None => f.write_str("ready"),
            Some(reason) => f.write_str(&reason),
        }
    }
}

/// A handle on one worker's liveness and readiness
/// ([`Worker::probe`](super::Worker::probe)): cheap to clone, it outlives the
/// worker (which [`Worker::shutdown`](super::Worker::shutdown) consumes), so
/// a probe server can answer until the process exits.
#[derive(Clone)]
pub struct WorkerProbe {
    shared: Arc<Shared>,
    supervisor: ActorRef<SupervisorMsg>,
    stopped: CancellationToken,
}

impl fmt::Debug for WorkerProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerProbe")
            .field("worker_id", &self.shared.cfg.worker_id)
            .field("live", &self.is_live())
            .finish_non_exhaustive()
    }
}

impl WorkerProbe {
    pub(super) fn new(
        shared: Arc<Shared>,
        supervisor: ActorRef<SupervisorMsg>,
        stopped: CancellationToken,
    ) -> Self {
        WorkerProbe {
            shared,
            supervisor,
            stopped,
        }
    }

    /// Liveness: the worker's actor tree runs (it was not shut down, and its
    /// supervisor did not stop on its own, as it does when its lease keeper
    /// fails). A worker draining for shutdown is still live.
    pub fn is_live(&self) -> bool {
        !self.stopped.is_cancelled()
            && matches!(
                self.supervisor.get_status(),
                ActorStatus::Starting | ActorStatus::Running
            )
    }

    /// Readiness: every check of [`Readiness`], those that ask a server
    /// concurrently, each bounded by [`READINESS_TIMEOUT`].
    pub async fn readiness(&self) -> Readiness {
        let sh = &self.shared;
        let running =
            ReadinessCheck::failed_if(sh.draining.is_cancelled() || !self.is_live(), || {
                "shutting down".into()
            });
        let health = self
            .shared
            .session
            .borrow()
            .as_ref()
            .map_or(Health::Lost, |s| s.health());
        let lease = ReadinessCheck::failed_if(health != Health::Healthy, || {
            format!("etcd session {}", health.as_str())
        });
        let nats = ReadinessCheck::failed_if(!sh.queue.is_connected(), || "not connected".into());
        let owning = sh.owning.readiness(sh, READINESS_TIMEOUT);
        let (postgres, partitions) = tokio::join!(postgres(sh), owning);
        let partitions = partitions.map(|r| match r {
            Ok(()) => ReadinessCheck::Passed,
            Err(why) => ReadinessCheck::Failed(why),
        });
        Readiness {
            running,
            lease,
            postgres,
            nats,
            partitions,
        }
    }
}

/// PostgreSQL answers `SELECT 1` on the worker's pool in time.
async fn postgres(sh: &Shared) -> ReadinessCheck {
    match tokio::time::timeout(READINESS_TIMEOUT, sh.store.ping()).await {
        Ok(Ok(())) => ReadinessCheck::Passed,
        Ok(Err(e)) => ReadinessCheck::Failed(e.to_string()),
        Err(_) => ReadinessCheck::Failed(format!("SELECT 1 timed out after {READINESS_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{Readiness, ReadinessCheck};

    fn all_passed() -> Readiness {
        Readiness {
            running: ReadinessCheck::Passed,
            lease: ReadinessCheck::Passed,
            postgres: ReadinessCheck::Passed,
            nats: ReadinessCheck::Passed,
            partitions: None,
        }
    }

    #[test]
    fn ready_when_every_check_passed() {
        let r = all_passed();
        assert!(r.is_ready());
        assert_eq!(r.reason(), None);
        assert_eq!(r.to_string(), "ready");
    }

    #[test]
    fn the_reason_is_the_first_failing_check_in_field_order() {
        let mut r = all_passed();
        r.nats = ReadinessCheck::Failed("not connected".into());
        r.postgres = ReadinessCheck::Failed("SELECT 1 timed out after 2s".into());
        r.partitions = Some(ReadinessCheck::Failed("holds 0 of its 4".into()));
        assert!(!r.is_ready());
        assert_eq!(
            r.reason().as_deref(),
            Some("postgres: SELECT 1 timed out after 2s")
        );
        assert_eq!(r.to_string(), "postgres: SELECT 1 timed out after 2s");
    }

    #[test]
    fn partition_mode_adds_its_check() {
        let mut r = all_passed();
        r.partitions = Some(ReadinessCheck::Failed(
            "holds 1 of its 2 partitions of t".into(),
        ));
        assert_eq!(
            r.reason().as_deref(),
            Some("partitions: holds 1 of its 2 partitions of t")
        );
    }
}
