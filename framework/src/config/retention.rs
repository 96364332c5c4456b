//! [`Retention`]: how long finished job rows and dead letters are kept, and
//! how the elected scheduler leader prunes them (in small batches, a round at
//! most every [`Retention::every`]).
//!
//! The default ([`Retention::PRODUCTION`]) deletes `done` and `cancelled`
//! rows, with their history, 30 days after they finished, and keeps `dead`
//! rows, dead letters and every idempotency key. Why 30 days: each finished
//! row keeps its input, checkpoint and its history (six events on the row's
//! trail for a three-step job, migration 0024; a one-step job's row measured
//! in `operations.rs`), so a table
//! that keeps every job grows by that much per job for ever; 30 days covers a
//! month's investigations and a billing cycle. Idempotency does not shrink:
//! a pruned row leaves a tombstone (about 160 bytes) and its key stays used
//! for ever (`keys_after: None`), so nothing runs twice. [`Retention::KEEP`]
//! keeps everything.

use std::time::Duration;

use super::ConfigError;

/// How long finished job rows (and their history events) and DLQ entries are
/// kept ([`Config::retention`](crate::Config::retention)). `None` keeps them
/// until an operator acts (`tenure prune`). Ages count from the row's last
/// change (`updated_at`: when it finished).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Delete `done` rows this long after they finished (default: 30 days).
    pub done_after: Option<Duration>,
    /// Delete `cancelled` rows this long after they were cancelled (default: 30 days).
    pub cancelled_after: Option<Duration>,
    /// Delete `dead` rows this long after they died (default: keep until an
    /// operator redrives or prunes them: a dead job is a question to someone).
    pub dead_after: Option<Duration>,
    /// How long a pruned job's idempotency key stays used (default: forever).
    /// Pruning a row leaves a tombstone (id, type, input hash, final status,
    /// about 160 bytes with its indexes: 160 MB per million pruned jobs, measured), so an enqueue of the
    /// key is still a duplicate and nothing runs twice; past this age the
    /// tombstone goes too, and the key may run again.
    pub keys_after: Option<Duration>,
    /// The DLQ stream's `max_age`: the broker drops dead letters older than
    /// this (default: keep). Applied when a worker provisions the streams.
    pub dlq_max_age: Option<Duration>,
    /// Rows deleted per statement (default 500, at most
    /// [`MAX_PRUNE_BATCH`]): each batch is one short transaction that skips
    /// rows locked by anyone else.
    pub batch: usize,
    /// How often the leader prunes (default 60 s).
    pub every: Duration,
}

/// The largest [`Retention::batch`]: the prune functions (migration 0016)
/// refuse a larger one, so that a caller cannot delete without bound in one
/// statement.
pub const MAX_PRUNE_BATCH: usize = 10_000;

impl Default for Retention {
    /// [`Retention::PRODUCTION`].
    fn default() -> Self {
        Retention::PRODUCTION
    }
}

/// 30 days.
const MONTH: Duration = Duration::from_secs(30 * 24 * 3600);

impl Retention {
    /// The default: `done` and `cancelled` rows (and their history) go 30
    /// days after they finished; `dead` rows, dead letters and idempotency
    /// keys are kept. Why: each finished row keeps its input, checkpoint and
    /// history (a one-step job measured 4 rows, 410 bytes), so a table that
    /// keeps every job grows for ever; 30 days covers a month's
    /// investigations and a billing cycle. Idempotency does not shrink: a
    /// pruned row leaves a tombstone and its key stays used.
    pub const PRODUCTION: Retention = Retention {
        done_after: Some(MONTH),
        cancelled_after: Some(MONTH),
        ..Retention::KEEP
    };

    /// Keep everything (`tenure prune` by hand).
    pub const KEEP: Retention = Retention {
        done_after: None,
        cancelled_after: None,
        dead_after: None,
        keys_after: None,
        dlq_max_age: None,
        batch: 500,
        every: Duration::from_secs(60),
    };

    /// Whether the leader prunes anything: job rows or tombstones.
    pub fn prunes_rows(&self) -> bool {
        self.done_after.is_some()
            || self.cancelled_after.is_some()
            || self.dead_after.is_some()
            || self.keys_after.is_some()
    }

    /// Checks that every age and size can work: an age of zero is refused
    /// (it would delete a job as it finishes; use `None` to keep).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first value that cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ages = [
            ("retention.done_after", self.done_after),
            ("retention.cancelled_after", self.cancelled_after),
            ("retention.dead_after", self.dead_after),
            ("retention.keys_after", self.keys_after),
            ("retention.dlq_max_age", self.dlq_max_age),
        ];
        for (name, age) in ages {
            if age.is_some_and(|a| a < Duration::from_secs(1)) {
                return Err(ConfigError::Invalid {
                    name,
                    reason: "must be at least 1 s (None keeps forever)".into(),
                });
            }
        }
        if !(1..=MAX_PRUNE_BATCH).contains(&self.batch) {
            return Err(ConfigError::Invalid {
                name: "retention.batch",
                reason: format!("must be 1 to {MAX_PRUNE_BATCH}"),
            });
        }
        if self.every.is_zero() {
            return Err(ConfigError::Invalid {
                name: "retention.every",
                reason: "must be positive".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_ages_and_sizes_are_refused_by_name() {
        assert!(Retention::default().validate().is_ok());
        let bad = [
            Retention {
                done_after: Some(Duration::ZERO),
                ..Retention::KEEP
            },
            Retention {
                dlq_max_age: Some(Duration::from_millis(10)),
                ..Retention::KEEP
            },
            Retention {
                batch: 0,
                ..Retention::KEEP
            },
            Retention {
                every: Duration::ZERO,
                ..Retention::KEEP
            },
        ];
        let names: Vec<_> = bad
            .iter()
            .map(|r| match r.validate() {
                Err(ConfigError::Invalid { name, .. }) => name,
                _ => "accepted",
            })
            .collect();
        assert_eq!(
            names,
            [
                "retention.done_after",
                "retention.dlq_max_age",
                "retention.batch",
                "retention.every"
            ]
        );
    }
}
