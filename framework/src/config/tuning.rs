//! The runtime's tuning numbers: every delay, window and size that shapes how
//! a worker batches, waits and retries, with the reason for its default.
//!
//! None of them affects safety (the fence does not depend on any timing here);
//! they trade latency against etcd and PostgreSQL load. The defaults were
//! measured with the pipeline benchmark (`BENCHMARKS.md`); change one only with
//! a benchmark run that shows why.

use std::time::Duration;

use super::{BackoffConfig, ConfigError};

/// Tuning numbers of a worker ([`Config::tuning`](super::Config::tuning)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tuning {
    /// A contended job lock (held by another worker) is retried at least every
    /// `lease_ttl / contention_retry_divisor` (default 20: every 250 ms at a 5 s
    /// TTL), so a lock freed by a crashed holder's expiry is taken soon after,
    /// without polling etcd faster than its keepalives.
    pub contention_retry_divisor: u32,
    /// The longest a transaction opened for a step (the claim's, or the one the
    /// previous step's commit opened) waits for the step to take it with
    /// `ctx.db()` (default 50 ms; never more than a quarter of the TTL). A step
    /// that writes asks at once; one that works elsewhere first should not hold a
    /// pooled connection and the job row lock meanwhile: with a thousand jobs in
    /// flight, a longer window held a thousand connections (the benchmark's RSS
    /// run reached PostgreSQL's `max_connections`).
    pub step_tx_window: Duration,
    /// How long a delivery held ahead (see [`Config::prefetch`](super::Config::prefetch))
    /// is meant to wait for a run slot (default 50 ms): the room ahead is sized
    /// from the mean job time so that the wait stays about this long.
    pub hold_ahead_budget: Duration,
    /// The longest a delivery held ahead waits for a run slot before its unclaimed
    /// lock is given back (default 1 s, and never more than a quarter of the TTL).
    pub hold_ahead_max_wait: Duration,
    /// The weight of a new job's run time in the mean that sizes the room ahead,
    /// as a shift: `1 / 2^shift` (default 3: 1/8, a mean over about the last
    /// eight jobs).
    pub run_time_mean_shift: u32,
    /// How long one fetch waits for the broker to deliver (default 500 ms),
    /// asking it every [`fetch_wait_several`](Self::fetch_wait_several)
    /// meanwhile: short enough that a draining worker stops fetching soon.
    pub fetch_wait: Duration,
    /// How often a waiting fetch asks the broker again, and how long a fetch
    /// round of a worker with several job types (or partitions) waits for the
    /// first message of any of them (default 100 ms). No pull request waits
    /// at the server (nats-server 2.9 loses a redelivery that comes due as a
    /// waiting request expires, until `AckWait`): the worker asks, the server
    /// answers at once. A new job rings the work stream's doorbell
    /// (`queue/ring.rs`) and is asked for at once; a retry coming due after
    /// its backoff, or a job on a stream without the doorbell, is taken
    /// within about this (measured at the default: 49-62 ms at the median,
    /// at most 129 ms; `BENCHMARKS.md`). The round ends when every
    /// type's fetch has: a burst of one type is fetched past its first
    /// messages only after this. The cost of shorter: an idle worker asks
    /// about each of its types (each partition it owns) more often, ten times
    /// a second at the default.
    pub fetch_wait_several: Duration,
    /// How long, after a round that delivered something, a worker with several
    /// job types waits on each type in turn (default 5 ms): the messages there
    /// come at once, an empty type costs this much.
    pub fetch_wait_now: Duration,
    /// Partition mode: how often a worker re-reads the partition owners even
    /// if its etcd watch reported no change (default 5 s). Every change wakes
    /// every worker through the watch; this is a backstop against a watch
    /// that stalls silently, and costs one etcd read per worker per period.
    pub partition_resync: Duration,
    /// Partition mode: how long a worker may fail to reach PostgreSQL or NATS
    /// before it stands down: it hands its partitions back and leaves the
    /// members, so the others' fair shares cover its partitions, until a probe
    /// reaches both again (default `None`: one lease TTL; read it with
    /// [`Config::stand_down_after`](super::Config::stand_down_after)). One TTL
    /// treats a worker that cannot work like one that crashed: a crashed
    /// worker's partitions move once its lease expires, a TTL after it went
    /// silent. Shorter would move partitions on every PostgreSQL restart or
    /// NATS reconnect; longer leaves its partitions' jobs waiting, each of their
    /// deliveries counting towards `max_deliver`.
    pub stand_down_after: Option<Duration>,
    /// Commit the claim on its own before the first step runs (default
    /// `false`: the claim commits with the first step, which saves a commit
    /// and an admission per job). Set it when a step calls a downstream
    /// service that verifies tokens against the job rows
    /// ([`PgFenceMarks::verified`](crate::blocks::fence::PgFenceMarks::verified)):
    /// until the claim commits, the row's committed fence is the previous
    /// owner's, and the service refuses the new owner's token as never issued
    /// ([`GateError::Unverified`](crate::blocks::fence::GateError::Unverified)).
    pub commit_claim_first: bool,
    /// Partition mode: how often a worker probes a PostgreSQL or NATS it
    /// suspects is unreachable (a read, claim or fetch failed), and how long
    /// one probe may take (default 500 ms). A probe is one `SELECT 1` or one
    /// JetStream request, sent only while a server is suspected; one that
    /// answers in time clears the suspicion, and a worker that stood down
    /// comes back at the first probe round that reaches both.
    pub server_probe: Duration,
    /// How often a fetcher whose session is not `Healthy` looks again (default
    /// 200 ms), besides waking on every health change.
    pub fetch_unhealthy_recheck: Duration,
    /// The pause after a failed fetch (default 250 ms), so a broker that refuses
    /// is not asked in a tight loop.
    pub fetch_error_pause: Duration,
    /// How long a lock batch about to leave waits for acquisitions that were
    /// announced but not asked yet (default 2 ms): jobs fetched together share one
    /// etcd transaction; a lone job (nothing announced) pays no wait.
    pub lock_acquire_linger: Duration,
    /// How long a deferred lock release (a finished job's; nothing waits for it)
    /// may wait to ride in a batch (default 100 ms).
    pub lock_release_linger: Duration,
    /// A batch leaves as soon as this many deferred releases are waiting
    /// (default 64, well under etcd's 128 operations per transaction).
    pub lock_release_flush: usize,
    /// A failed lock release is retried from `base`, doubling per failure up to
    /// `cap` (default 250 ms to 1 s); the lock expires with its session anyway,
    /// so a retry only frees the job sooner for the next owner. Partition mode
    /// retries a handed-over partition's key deletion with the same backoff,
    /// but never gives it up while the session lives: nobody else may take
    /// that partition until its key is gone.
    pub lock_release_retry: BackoffConfig,
    /// A failed lock release is given up this long after its first failure
    /// (default 5 s), leaving the key to expire with the session.
    pub lock_release_give_up: Duration,
    /// Lock requests queued for the lock service at most (default 4096); a
    /// caller beyond waits for room.
    pub lock_queue: usize,
    /// How long shutdown waits for cancelled steps to end, after
    /// [`Config::shutdown_grace`](super::Config::shutdown_grace) ran out and the
    /// running steps were cancelled (default 5 s): a step that ignores its
    /// cancellation is left behind, its lock expiring with the session.
    pub shutdown_cancel_wait: Duration,
    /// The shortest period of a running step's progress acks to the broker
    /// (default 100 ms; the period is a third of the broker's ack wait).
    pub progress_min_period: Duration,
    /// The longest the due-job publisher (the elected scheduler leader) sleeps
    /// between looks for due delayed jobs and cron ticks (default 250 ms): it
    /// wakes earlier for the earliest `run_at` it knows, and a job enqueued
    /// meanwhile for sooner is seen within this bound. A due job starts within
    /// about this much of its `run_at`.
    pub due_poll: Duration,
    /// How often a worker reads which job types are paused (default 500 ms;
    /// see [`Client::pause`](crate::Client::pause)): a pause or resume takes
    /// effect on every worker within about this.
    pub pause_poll: Duration,
    /// Due jobs published per batch (default 500): one read, concurrent
    /// publishes, one fenced update marking them published.
    pub due_batch: usize,
    /// How long one round of the due-job publisher goes on starting batches
    /// (default 1 s; a batch started within it is finished, each publish
    /// waiting at most the broker's ack timeout). A backlog of a million due
    /// jobs is worked off over rounds, between which retention gets its turn.
    /// Cron ticks do not wait for it: the leader enqueues them beside the
    /// publisher, through PostgreSQL only.
    pub due_round_budget: Duration,
    /// How often a worker that is not the scheduler leader tries the election
    /// again (default 500 ms); a leader that stopped gracefully is replaced
    /// within this, one that died within its session TTL plus this.
    pub leader_retry: Duration,
    /// How late, beyond a leader failover, a cron tick may be when the leader
    /// first sees it and still be on time (default 2 s). A tick is missed
    /// only when it is older than
    /// [`Config::missed_tick_after`](super::Config::missed_tick_after):
    /// `lease_ttl + leader_retry + schedule_grace` (7.5 s with the defaults),
    /// because a killed leader's key outlives it by up to the TTL and its
    /// successor campaigns within `leader_retry`; the 2 s cover the
    /// successor's election, fence claim and first look. Missed ticks follow
    /// the schedule's [`MissedTicks`](crate::MissedTicks) policy (a cluster
    /// down for an hour skips that hour under `Skip`); on-time ones are
    /// always enqueued.
    pub schedule_grace: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning::DEFAULT
    }
}

impl Tuning {
    /// The defaults (what [`Default`] gives), as a constant.
    pub const DEFAULT: Tuning = Tuning {
        contention_retry_divisor: 20,
        step_tx_window: Duration::from_millis(50),
        hold_ahead_budget: Duration::from_millis(50),
        hold_ahead_max_wait: Duration::from_secs(1),
        run_time_mean_shift: 3,
        fetch_wait: Duration::from_millis(500),
        fetch_wait_several: Duration::from_millis(100),
        fetch_wait_now: Duration::from_millis(5),
        partition_resync: Duration::from_secs(5),
        stand_down_after: None,
        commit_claim_first: false,
        server_probe: Duration::from_millis(500),
        fetch_unhealthy_recheck: Duration::from_millis(200),
        fetch_error_pause: Duration::from_millis(250),
        lock_acquire_linger: Duration::from_millis(2),
        lock_release_linger: Duration::from_millis(100),
        lock_release_flush: 64,
        lock_release_retry: BackoffConfig {
            base: Duration::from_millis(250),
            cap: Duration::from_secs(1),
        },
        lock_release_give_up: Duration::from_secs(5),
        lock_queue: 4096,
        shutdown_cancel_wait: Duration::from_secs(5),
        progress_min_period: Duration::from_millis(100),
        due_poll: Duration::from_millis(250),
        pause_poll: Duration::from_millis(500),
        due_batch: 500,
        due_round_budget: Duration::from_secs(1),
        leader_retry: Duration::from_millis(500),
        schedule_grace: Duration::from_secs(2),
    };

    /// Checks that every number can work.
    ///
    /// # Errors
    /// The first value that cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |name: &'static str, reason: &str| {
            Err(ConfigError::Invalid {
                name,
                reason: reason.into(),
            })
        };
        if self.contention_retry_divisor == 0 {
            return invalid("tuning.contention_retry_divisor", "must be at least 1");
        }
        if self.run_time_mean_shift > 16 {
            return invalid("tuning.run_time_mean_shift", "must be at most 16");
        }
        if self.fetch_wait.is_zero() {
            return invalid("tuning.fetch_wait", "must be positive");
        }
        if self.partition_resync < Duration::from_millis(100) {
            return invalid("tuning.partition_resync", "must be at least 100 ms");
        }
        if self.stand_down_after.is_some_and(|d| d.is_zero()) {
            return invalid(
                "tuning.stand_down_after",
                "must be positive (None: the lease TTL)",
            );
        }
        if self.server_probe.is_zero() {
            return invalid("tuning.server_probe", "must be positive");
        }
        if self.fetch_wait_several.is_zero() || self.fetch_wait_now.is_zero() {
            return invalid("tuning.fetch_wait_several", "fetch waits must be positive");
        }
        if self.lock_release_flush == 0 {
            return invalid("tuning.lock_release_flush", "must be at least 1");
        }
        if self.lock_queue == 0 {
            return invalid("tuning.lock_queue", "must be at least 1");
        }
        if self.lock_release_retry.base.is_zero()
            || self.lock_release_retry.cap < self.lock_release_retry.base
        {
            return invalid(
                "tuning.lock_release_retry",
                "base must be positive and at most cap",
            );
        }
        if self.progress_min_period.is_zero() {
            return invalid("tuning.progress_min_period", "must be positive");
        }
        if self.due_poll.is_zero() || self.leader_retry.is_zero() {
            return invalid(
                "tuning.due_poll",
                "due_poll and leader_retry must be positive",
            );
        }
        if self.pause_poll.is_zero() {
            return invalid("tuning.pause_poll", "must be positive");
        }
        if self.due_round_budget.is_zero() {
            return invalid("tuning.due_round_budget", "must be positive");
        }
        if self.due_batch == 0 {
            return invalid("tuning.due_batch", "must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_stands_down_after_one_ttl_unless_told_otherwise() {
        let cfg = crate::Config::new("ns").with_lease_ttl(Duration::from_secs(7));
        assert_eq!(cfg.stand_down_after(), Duration::from_secs(7));
        let mut cfg = cfg;
        cfg.tuning.stand_down_after = Some(Duration::from_secs(2));
        assert_eq!(cfg.stand_down_after(), Duration::from_secs(2));
    }

    #[test]
    fn defaults_are_valid_and_zeroes_are_refused_by_name() {
        assert_eq!(Tuning::default().validate(), Ok(()));
        let t = Tuning {
            contention_retry_divisor: 0,
            ..Tuning::default()
        };
        assert!(matches!(
            t.validate(),
            Err(ConfigError::Invalid {
                name: "tuning.contention_retry_divisor",
                ..
            })
        ));
        let t = Tuning {
            lock_queue: 0,
            ..Tuning::default()
        };
        assert!(t.validate().is_err());
        for t in [
            Tuning {
                stand_down_after: Some(Duration::ZERO),
                ..Tuning::default()
            },
            Tuning {
                server_probe: Duration::ZERO,
                ..Tuning::default()
            },
        ] {
            assert!(t.validate().is_err(), "{t:?}");
        }
        let t = Tuning {
            lock_release_retry: BackoffConfig {
                base: Duration::from_secs(2),
                cap: Duration::from_secs(1),
            },
            ..Tuning::default()
        };
        assert!(t.validate().is_err());
    }
}
