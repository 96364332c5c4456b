//! The job types a worker runs, type-erased.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::routes::Route;
use crate::StepIndex;
use crate::fence::ReportedLimits;
use crate::job::{BoxFuture, DeadJob, Job, StepCtx, StepError, StepInfo, StepTimeout};

/// A [`Job`] behind a trait object (the runtime holds many job types at once).
pub(crate) trait DynJob: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn steps(&self) -> &'static [StepInfo];
    fn max_takeovers(&self) -> Option<u32>;
    fn retries(&self) -> Option<u32>;
    fn step_timeout(&self, step: StepIndex) -> Option<StepTimeout>;
    fn has_on_dead(&self) -> bool;
    fn on_dead<'a>(
        &'a self,
        ctx: &'a mut StepCtx,
        dead: DeadJob,
    ) -> BoxFuture<'a, Result<(), StepError>>;
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
    fn step_timeout(&self, step: StepIndex) -> Option<StepTimeout> {
        J::STEP_TIMEOUTS.get(step.get() as usize).copied().flatten()
    }
    fn has_on_dead(&self) -> bool {
        J::ON_DEAD
    }
    fn on_dead<'a>(
        &'a self,
        ctx: &'a mut StepCtx,
        dead: DeadJob,
    ) -> BoxFuture<'a, Result<(), StepError>> {
        Job::on_dead(self, ctx, dead)
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

/// How much of a worker one job type may take
/// ([`WorkerBuilder::register_with`](crate::WorkerBuilder::register_with)).
///
/// ```
/// let limits = tenure::JobLimits::default().max_in_flight(4);
/// assert_eq!(limits.get_max_in_flight(), Some(4));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobLimits {
    max_in_flight: Option<usize>,
    fleet_max: Option<u32>,
    rate: Option<(u32, std::time::Duration)>,
}

impl JobLimits {
    /// At most `n` deliveries of this type in hand at once (running, or locked
    /// and waiting for a run slot); the worker's own
    /// [`Config::max_in_flight`](crate::Config::max_in_flight) and
    /// [`Config::prefetch`](crate::Config::prefetch) bound all types together.
    /// `0` is refused by [`WorkerBuilder::start`](crate::WorkerBuilder::start).
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = Some(n);
        self
    }

    /// The limit set, if any.
    pub fn get_max_in_flight(&self) -> Option<usize> {
        self.max_in_flight
    }

    /// At most `n` jobs of this type hold a delivery at once across the whole
    /// fleet (every worker of the namespace): a fleet-wide limit, kept in
    /// etcd as `n` slot keys under the holders' session leases, so a worker
    /// that dies gives its slots back with its lease. Every worker that runs
    /// the type should set the same `n` (while they differ, the larger one
    /// bounds). `0` is refused by
    /// [`WorkerBuilder::start`](crate::WorkerBuilder::start). See the
    /// production guide, "A fleet-wide limit per type".
    #[must_use]
    pub fn fleet_max(mut self, n: u32) -> Self {
        self.fleet_max = Some(n);
        self
    }

    /// The fleet-wide limit set, if any.
    pub fn get_fleet_max(&self) -> Option<u32> {
        self.fleet_max
    }

    /// At most `n` deliveries of this type taken from the stream per `per`,
    /// by this worker: a token bucket `n` deep (a burst of `n` after a quiet
    /// spell), refilled continuously at `n` per `per`. A type out of tokens is
    /// not fetched: its messages stay in the stream, nothing is nak'ed,
    /// dead-lettered or counted as a delivery because of the rate.
    ///
    /// Per worker, not fleet-wide: it needs no coordination on the fetch
    /// path, and it is exact and predictable. The fleet's rate is the number
    /// of workers running the type times this rate (for a fleet-wide bound on
    /// concurrency there is a separate control). `n == 0` or a zero `per` is
    /// refused by [`WorkerBuilder::start`](crate::WorkerBuilder::start)
    /// ([`WorkerError::BadRate`](crate::WorkerError::BadRate)).
    ///
    /// ```
    /// use std::time::Duration;
    /// let limits = tenure::JobLimits::default().rate(5, Duration::from_secs(1));
    /// assert_eq!(limits.get_rate(), Some((5, Duration::from_secs(1))));
    /// ```
    #[must_use]
    pub fn rate(mut self, n: u32, per: std::time::Duration) -> Self {
        self.rate = Some((n, per));
        self
    }

    /// The rate set, if any: deliveries and their period.
    pub fn get_rate(&self) -> Option<(u32, std::time::Duration)> {
        self.rate
    }
}

/// Job types by name.
#[derive(Default, Clone)]
pub(crate) struct Registry {
    jobs: HashMap<&'static str, Arc<dyn DynJob>>,
    limits: HashMap<&'static str, JobLimits>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.jobs.keys()).finish()
    }
}

impl Registry {
    /// Adds a job type; `false` if the name was taken.
    pub(crate) fn insert<J: Job>(&mut self, job: J, limits: JobLimits) -> bool {
        if self.jobs.contains_key(J::NAME) {
            return false;
        }
        self.jobs.insert(J::NAME, Arc::new(job));
        self.limits.insert(J::NAME, limits);
        true
    }

    /// Every type with its deliveries limit (`usize::MAX`: none) and its
    /// rate, by name.
    pub(crate) fn routes(&self) -> Vec<Route> {
        let mut out: Vec<_> = self
            .jobs
            .keys()
            .map(|&name| {
                let limits = self.limits.get(name).copied().unwrap_or_default();
                let limit = limits.max_in_flight.unwrap_or(usize::MAX);
                (name, limit, limits.rate)
            })
            .collect();
        out.sort_unstable_by_key(|r| r.0);
        out
    }

    /// The limits of every type that has some, as the worker reports them.
    pub(crate) fn reported_limits(&self) -> BTreeMap<String, ReportedLimits> {
        let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.limits
            .iter()
            .filter(|(_, l)| l.max_in_flight.is_some() || l.fleet_max.is_some() || l.rate.is_some())
            .map(|(name, l)| {
                let reported = ReportedLimits {
                    max_in_flight: l.max_in_flight.map(|n| n as u64),
                    fleet_max: l.fleet_max,
                    rate: l.rate.map(|r| r.0),
                    rate_per_ms: l.rate.map(|r| millis(r.1)),
                };
                ((*name).to_string(), reported)
            })
            .collect()
    }

    /// Every type's name, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        self.routes().into_iter().map(|r| r.0.to_string()).collect()
    }

    /// A type whose limit is zero, if any.
    pub(crate) fn zero_limit(&self) -> Option<&'static str> {
        self.routes().into_iter().find(|r| r.1 == 0).map(|r| r.0)
    }

    /// A type whose rate is zero deliveries, or per a zero period, if any.
    pub(crate) fn bad_rate(&self) -> Option<&'static str> {
        self.routes()
            .into_iter()
            .find(|r| r.2.is_some_and(|(n, per)| n == 0 || per.is_zero()))
            .map(|r| r.0)
    }

    /// Every type with a fleet-wide limit, and the limit.
    pub(crate) fn fleet_limits(&self) -> HashMap<&'static str, u32> {
        let limited = self.limits.iter();
        limited
            .filter_map(|(&name, l)| l.fleet_max.map(|n| (name, n)))
            .collect()
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<dyn DynJob>> {
        self.jobs.get(name).cloned()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}
