//! Cron schedules: a job enqueued once per tick of a cron expression, across
//! the whole fleet. Definitions ([`Schedule`], [`MissedTicks`]) are given to
//! [`WorkerBuilder::schedule`](crate::WorkerBuilder::schedule); the elected
//! scheduler leader (`runtime/scheduler.rs`) decides each tick with [`plan`]
//! and enqueues it under the key `cron:<name>:<tick>`, so a tick is one job
//! whoever enqueues it and however often.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use croner::parser::{CronParser, Seconds};
use croner::{Cron, Direction};

/// What to do with ticks that passed while no leader ran (a tick older than
/// [`Config::missed_tick_after`](crate::Config::missed_tick_after), a leader
/// failover plus `Tuning::schedule_grace`, when the leader first sees it).
/// Ticks that are on time are always enqueued, also across a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedTicks {
    /// Enqueue none of them (the default).
    #[default]
    Skip,
    /// Enqueue the newest `max` of them, oldest first; skip the rest.
    CatchUp {
        /// At most this many missed ticks are enqueued.
        max: u32,
    },
}

impl MissedTicks {
    /// `skip` or `catch_up:<max>` (the `schedules` row's `missed`).
    pub fn as_text(&self) -> String {
        match self {
            MissedTicks::Skip => "skip".into(),
            MissedTicks::CatchUp { max } => format!("catch_up:{max}"),
        }
    }

    fn keep(&self) -> usize {
        match self {
            MissedTicks::Skip => 0,
            MissedTicks::CatchUp { max } => *max as usize,
        }
    }
}

/// A schedule that cannot be used: nothing is registered and the worker does
/// not start ([`WorkerError::Schedule`](crate::WorkerError::Schedule)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The cron expression does not parse.
    #[error("schedule {name:?}: cron expression {expr:?} does not parse: {reason}")]
    Expression {
        /// The schedule.
        name: String,
        /// The expression.
        expr: String,
        /// The parser's reason.
        reason: String,
    },
    /// The time zone is not an IANA name.
    #[error("schedule {name:?}: unknown time zone {zone:?}")]
    TimeZone {
        /// The schedule.
        name: String,
        /// The zone given.
        zone: String,
    },
    /// The name is empty, too long, or has characters other than
    /// `[A-Za-z0-9_.-]`.
    #[error("schedule name {0:?} must be 1-64 chars of [A-Za-z0-9_.-]")]
    Name(String),
    /// Two schedules share a name.
    #[error("schedule {0:?} defined twice")]
    Duplicate(String),
    /// The input does not serialise to JSON.
    #[error("schedule {name:?}: input does not serialise: {reason}")]
    Input {
        /// The schedule.
        name: String,
        /// The serde error.
        reason: String,
    },
    /// `MissedTicks::CatchUp { max: 0 }` (say `Skip`).
    #[error("schedule {0:?}: CatchUp needs max >= 1 (use Skip)")]
    CatchUpZero(String),
}

/// A cron schedule's definition: a name, a cron expression (five fields, or
/// six with seconds first), a time zone (default UTC) and a missed-ticks
/// policy (default [`MissedTicks::Skip`]).
///
/// ```
/// use tenure::{MissedTicks, Schedule};
/// let s = Schedule::new("nightly-report", "0 30 2 * * *")
///     .in_time_zone("Europe/Berlin")
///     .missed(MissedTicks::CatchUp { max: 1 });
/// assert!(s.check().is_ok());
/// assert!(Schedule::new("bad", "61 * * * *").check().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    name: String,
    expr: String,
    zone: String,
    missed: MissedTicks,
}

impl Schedule {
    /// A schedule named `name` (its ticks' keys are `cron:<name>:<tick>`)
    /// ticking at `cron_expr`, in UTC, skipping missed ticks.
    pub fn new(name: &str, cron_expr: &str) -> Self {
        Schedule {
            name: name.to_string(),
            expr: cron_expr.to_string(),
            zone: "UTC".into(),
            missed: MissedTicks::Skip,
        }
    }

    /// Reads the expression in the IANA time zone `zone` (e.g. `Europe/Berlin`).
    pub fn in_time_zone(mut self, zone: &str) -> Self {
        self.zone = zone.to_string();
        self
    }

    /// The missed-ticks policy.
    pub fn missed(mut self, missed: MissedTicks) -> Self {
        self.missed = missed;
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Checks name, expression, time zone and policy.
    ///
    /// # Errors
    /// The first [`ScheduleError`] found.
    pub fn check(&self) -> Result<(), ScheduleError> {
        self.parsed().map(|_| ())
    }

    pub(crate) fn parsed(&self) -> Result<Parsed, ScheduleError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !name_ok {
            return Err(ScheduleError::Name(self.name.clone()));
        }
        if self.missed == (MissedTicks::CatchUp { max: 0 }) {
            return Err(ScheduleError::CatchUpZero(self.name.clone()));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(&self.expr)
            .map_err(|e| ScheduleError::Expression {
                name: self.name.clone(),
                expr: self.expr.clone(),
                reason: e.to_string(),
            })?;
        let zone = chrono_tz::Tz::from_str(&self.zone).map_err(|_| ScheduleError::TimeZone {
            name: self.name.clone(),
            zone: self.zone.clone(),
        })?;
        Ok(Parsed {
            def: self.clone(),
            cron,
            zone,
        })
    }

    pub(crate) fn expr(&self) -> &str {
        &self.expr
    }

    pub(crate) fn zone(&self) -> &str {
        &self.zone
    }

    pub(crate) fn policy(&self) -> MissedTicks {
        self.missed
    }
}

/// A checked schedule: its parsed expression and zone.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub(crate) def: Schedule,
    cron: Cron,
    zone: chrono_tz::Tz,
}

/// What the leader decides for one schedule at one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Ticks to enqueue, oldest first.
    pub(crate) enqueue: Vec<DateTime<Utc>>,
    /// Missed ticks skipped (counted up to the scan limit).
    pub(crate) skipped: u64,
    /// The newest tick decided (`None`: no tick since `after`).
    pub(crate) last: Option<DateTime<Utc>>,
    /// The first tick after `now`.
    pub(crate) next: Option<DateTime<Utc>>,
}

impl Plan {
    /// The plan of a schedule that is paused (`paused`) or was resumed at
    /// `resumed_at`: a paused schedule enqueues no tick, and a resumed one
    /// no tick due at or before its resume (those came while it was
    /// paused); each tick held back is counted as skipped.
    pub(crate) fn held(mut self, paused: bool, resumed_at: Option<DateTime<Utc>>) -> Plan {
        let held = |t: &DateTime<Utc>| paused || resumed_at.is_some_and(|r| *t <= r);
        let before = self.enqueue.len();
        self.enqueue.retain(|t| !held(t));
        self.skipped += (before - self.enqueue.len()) as u64;
        self
    }
}

/// How many past ticks one look examines at most; older ones are skipped
/// uncounted (an every-second schedule a day behind is 86 400 ticks).
const SCAN_LIMIT: usize = 10_000;

impl Parsed {
    /// The ticks in `(after, now]`: those within `missed_after` of `now`
    /// ([`Config::missed_tick_after`](crate::Config::missed_tick_after)) are
    /// on time and enqueued; older ones are missed and follow the policy.
    pub(crate) fn plan(
        &self,
        after: DateTime<Utc>,
        now: DateTime<Utc>,
        missed_after: Duration,
    ) -> Plan {
        let local_now = now.with_timezone(&self.zone);
        let late = chrono::Duration::from_std(missed_after).unwrap_or(chrono::Duration::MAX);
        let on_time_from = now
            .checked_sub_signed(late)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let due: Vec<DateTime<Utc>> = self
            .cron
            .iter_from(local_now, Direction::Backward)
            .map(|t| t.with_timezone(&Utc))
            .take_while(|t| *t > after)
            .take(SCAN_LIMIT)
            .collect();
        let on_time = due.iter().take_while(|t| **t >= on_time_from).count();
        let keep = self.def.policy().keep().min(due.len() - on_time);
        let mut enqueue: Vec<DateTime<Utc>> = due[..on_time + keep].to_vec();
        enqueue.reverse();
        Plan {
            skipped: (due.len() - on_time - keep) as u64,
            last: due.first().copied(),
            next: self.next_after(now),
            enqueue,
        }
    }

    /// The first tick after `t`.
    pub(crate) fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.zone), false)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn every_second(missed: MissedTicks) -> Parsed {
        Schedule::new("s", "* * * * * *")
            .missed(missed)
            .parsed()
            .unwrap()
    }

    #[test]
    fn on_time_ticks_are_enqueued_oldest_first() {
        let p = every_second(MissedTicks::Skip);
        let plan = p.plan(
            at("2026-01-01T00:00:00Z"),
            at("2026-01-01T00:00:01.500Z"),
            Duration::from_secs(2),
        );
        assert_eq!(plan.enqueue, vec![at("2026-01-01T00:00:01Z")]);
        assert_eq!(plan.last, Some(at("2026-01-01T00:00:01Z")));
        assert_eq!(plan.next, Some(at("2026-01-01T00:00:02Z")));
        assert_eq!(plan.skipped, 0);
    }

    #[test]
    fn a_paused_plan_enqueues_nothing_and_a_resumed_one_nothing_before_its_resume() {
        let p = every_second(MissedTicks::CatchUp { max: 100 });
        let plan = || {
            p.plan(
                at("2026-01-01T00:00:00Z"),
                at("2026-01-01T00:00:04.500Z"),
                Duration::from_secs(10),
            )
        };
        assert_eq!(plan().enqueue.len(), 4);
        let paused = plan().held(true, None);
        assert!(paused.enqueue.is_empty());
        assert_eq!(paused.skipped, 4);
        assert_eq!(paused.last, Some(at("2026-01-01T00:00:04Z")), "decided");
        let resumed = plan().held(false, Some(at("2026-01-01T00:00:02.200Z")));
        assert_eq!(
            resumed.enqueue,
            vec![at("2026-01-01T00:00:03Z"), at("2026-01-01T00:00:04Z")]
        );
        assert_eq!(resumed.skipped, 2);
        assert_eq!(plan().held(false, None), plan());
    }

    #[test]
    fn skip_drops_every_missed_tick_and_catch_up_keeps_the_newest_max() {
        let after = at("2026-01-01T00:00:00Z");
        let now = at("2026-01-01T00:00:10.200Z");
        let grace = Duration::from_secs(2);
        let skip = every_second(MissedTicks::Skip).plan(after, now, grace);
        // On time: 9 s and 10 s (within 2 s of 10.2 s); missed: 1..=8 s.
        assert_eq!(
            skip.enqueue,
            vec![at("2026-01-01T00:00:09Z"), at("2026-01-01T00:00:10Z")]
        );
        assert_eq!(skip.skipped, 8);
        let catch = every_second(MissedTicks::CatchUp { max: 3 }).plan(after, now, grace);
        let secs: Vec<u32> = catch
            .enqueue
            .iter()
            .map(|t| t.timestamp() as u32 % 60)
            .collect();
        assert_eq!(secs, vec![6, 7, 8, 9, 10]);
        assert_eq!(catch.skipped, 5);
        assert_eq!(catch.last, Some(at("2026-01-01T00:00:10Z")));
    }

    #[test]
    fn nothing_is_due_twice_and_time_zones_move_the_ticks() {
        let p = every_second(MissedTicks::CatchUp { max: 100 });
        let t = at("2026-01-01T00:00:05Z");
        assert!(p.plan(t, t, Duration::from_secs(2)).enqueue.is_empty());
        // 02:30 every day in Berlin is 01:30 UTC in winter.
        let berlin = Schedule::new("b", "0 30 2 * * *")
            .in_time_zone("Europe/Berlin")
            .parsed()
            .unwrap();
        assert_eq!(
            berlin.next_after(at("2026-01-10T00:00:00Z")),
            Some(at("2026-01-10T01:30:00Z"))
        );
    }

    #[test]
    fn bad_definitions_are_typed_errors() {
        assert!(matches!(
            Schedule::new("x", "not cron").check(),
            Err(ScheduleError::Expression { .. })
        ));
        assert!(matches!(
            Schedule::new("x", "61 * * * * *").check(),
            Err(ScheduleError::Expression { .. })
        ));
        assert!(matches!(
            Schedule::new("x", "* * * * *")
                .in_time_zone("Mars/Olympus")
                .check(),
            Err(ScheduleError::TimeZone { .. })
        ));
        assert!(matches!(
            Schedule::new("a b", "* * * * *").check(),
            Err(ScheduleError::Name(_))
        ));
        assert!(matches!(
            Schedule::new("x", "* * * * *")
                .missed(MissedTicks::CatchUp { max: 0 })
                .check(),
            Err(ScheduleError::CatchUpZero(_))
        ));
    }
}
