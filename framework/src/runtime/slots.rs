//! How many deliveries a worker holds, and how many of them run.
//!
//! A delivery takes a *hold* slot when it is fetched and keeps it until its job
//! actor ends; it takes a *run* slot (one of `Config::max_in_flight`) after its
//! job lock is acquired and before its claim, and keeps it until the job actor
//! ends. Up to `Config::prefetch` deliveries may hold their lock while waiting
//! for a run slot.
//!
//! Why: a worker's etcd cost is per lock batch (one Txn, one Raft entry), not
//! per job. Without deliveries in hand, the fetcher refills one slot at a time
//! as jobs finish, so at low concurrency a lock batch holds two or three jobs.
//! With a few deliveries locked ahead, the fetcher waits until half of the
//! ahead room is free and fetches (and locks) that many at once, while the run
//! slots stay busy.
//!
//! Holding a job it does not run yet keeps it from other workers, so the room
//! ahead is bounded by time as well: it is sized so that a delivery waits about
//! `Tuning::hold_ahead_budget` for a run slot, from the mean time a job holds one
//! (no room ahead until a job has finished, and none for jobs that run long).
//! A delivery that waits longer than `min(lease_ttl / 4, Tuning::hold_ahead_max_wait)` anyway (jobs
//! turned slow) gives its lock back and is redelivered at once, and the room
//! ahead closes until jobs finish fast again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

#[derive(Debug)]
pub(crate) struct Slots {
    max_in_flight: usize,
    prefetch: usize,
    hold: Arc<Semaphore>,
    run: Arc<Semaphore>,
    /// Deliveries locked and waiting for a run slot.
    waiting: AtomicUsize,
    /// A slot was given back, or a delivery started waiting or running.
    changed: Notify,
    /// Mean time a job holds a run slot, in microseconds (0: none finished yet).
    mean_run_us: AtomicU64,
    /// How long the last delivery held ahead is meant to wait for a run slot.
    budget: Duration,
    /// The weight of a new sample in the mean run time, `1 / 2^mean_shift`.
    mean_shift: u32,
    max_wait: Duration,
}

/// A fetched delivery's place in the worker (until its job actor ends).
#[derive(Debug)]
pub(crate) struct HoldSlot {
    _permit: OwnedSemaphorePermit,
    slots: Arc<Slots>,
    /// The delivery's place in its job type's limit.
    typed: Option<super::routes::TypeHold>,
    /// Its type's fleet-wide slot, if the type is limited fleet-wide.
    fleet: Option<super::fleet::FleetSlot>,
}

impl HoldSlot {
    /// The worker's slots this one belongs to.
    pub(crate) fn slots(&self) -> &Arc<Slots> {
        &self.slots
    }

    /// The slot of a delivery of a job type whose limit `typed` counts it in.
    pub(crate) fn of_type(mut self, typed: super::routes::TypeHold) -> Self {
        self.typed = Some(typed);
        self
    }

    /// The slot of a delivery that holds `fleet`, its type's fleet-wide slot
    /// (given back when the hold ends).
    pub(crate) fn with_fleet(mut self, fleet: Option<super::fleet::FleetSlot>) -> Self {
        self.fleet = fleet;
        self
    }
}

impl Drop for HoldSlot {
    fn drop(&mut self) {
        // The type's count first, so a fetcher woken below sees it.
        drop(self.typed.take());
        drop(self.fleet.take());
        // The permit returns after this body; `notify_one` keeps the wakeup
        // until the fetcher next waits.
        self.slots.changed.notify_one();
    }
}

/// One of `max_in_flight` run slots.
#[derive(Debug)]
pub(crate) struct RunSlot {
    _permit: OwnedSemaphorePermit,
    slots: Arc<Slots>,
    since: Instant,
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        self.slots.record_run(self.since.elapsed());
        self.slots.changed.notify_one();
    }
}

/// Why a delivery held ahead got no run slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRunSlot {
    /// It waited longer than the bound: jobs run slower than when it was fetched.
    TooLong,
    /// The worker is shutting down.
    Draining,
    /// The delivery's job type was paused while it waited (`pauses`).
    Paused,
}

impl Slots {
    pub(crate) fn new(cfg: &crate::Config) -> Arc<Self> {
        let (max_in_flight, prefetch, t) = (cfg.max_in_flight, cfg.prefetch, &cfg.tuning);
        Arc::new(Slots {
            max_in_flight,
            prefetch,
            hold: Arc::new(Semaphore::new(max_in_flight + prefetch)),
            run: Arc::new(Semaphore::new(max_in_flight)),
            waiting: AtomicUsize::new(0),
            changed: Notify::new(),
            mean_run_us: AtomicU64::new(0),
            budget: t.hold_ahead_budget,
            mean_shift: t.run_time_mean_shift,
            max_wait: (cfg.lease_ttl / 4).min(t.hold_ahead_max_wait),
        })
    }

    /// Every slot a worker can hand out (what shutdown waits to get back).
    pub(crate) fn capacity(&self) -> usize {
        self.max_in_flight + self.prefetch
    }

    /// Jobs past their lock, running.
    pub(crate) fn running(&self) -> usize {
        self.max_in_flight
            .saturating_sub(self.run.available_permits())
    }

    /// Waits until every hold slot is back (every job actor ended).
    pub(crate) async fn all_back(&self) {
        let all = u32::try_from(self.capacity()).unwrap_or(u32::MAX);
        let _ = self.hold.acquire_many(all).await;
    }

    /// How many deliveries may wait for a run slot now: sized so that the last
    /// of them waits about the hold-ahead budget, at most `prefetch`.
    pub(crate) fn room_ahead(&self) -> usize {
        let mean = self.mean_run_us.load(Ordering::Relaxed);
        if mean == 0 || self.prefetch == 0 {
            return 0;
        }
        let budget = u64::try_from(self.budget.as_micros()).unwrap_or(u64::MAX);
        let fits = budget.saturating_mul(self.max_in_flight as u64) / mean;
        usize::try_from(fits)
            .unwrap_or(usize::MAX)
            .min(self.prefetch)
    }

    /// Waits until the fetcher should fetch, and returns the hold slots to fetch
    /// for (at least one). It fetches at once while a run slot is free and no
    /// delivery waits for it; otherwise once half of the room ahead is free, so
    /// that deliveries (and their lock requests) come in groups.
    pub(crate) async fn to_fetch(self: &Arc<Self>) -> Vec<HoldSlot> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let want = self.wanted();
            if want > 0 {
                let mut got = Vec::with_capacity(want);
                while got.len() < want {
                    match self.hold.clone().try_acquire_owned() {
                        Ok(permit) => got.push(HoldSlot {
                            _permit: permit,
                            slots: self.clone(),
                            typed: None,
                            fleet: None,
                        }),
                        Err(_) => break,
                    }
                }
                if !got.is_empty() {
                    return got;
                }
            }
            // Every change of the inputs of `wanted` notifies; the timeout only
            // bounds how stale `room_ahead` can get (as long as a delivery is
            // meant to wait ahead).
            let _ = tokio::time::timeout(self.budget, changed).await;
        }
    }

    /// Deliveries to fetch now (0: wait).
    fn wanted(&self) -> usize {
        let in_hand = self.capacity() - self.hold.available_permits();
        let ahead = self.room_ahead();
        let room = (self.max_in_flight + ahead).saturating_sub(in_hand);
        if room == 0 {
            return 0;
        }
        let waiting = self.waiting.load(Ordering::Acquire);
        let idle_run = self.run.available_permits() > waiting;
        let in_groups = (ahead / 2).max(1);
        if idle_run || room >= in_groups {
            room
        } else {
            0
        }
    }

    /// [`run_slot_until`](Self::run_slot_until) a shutdown.
    #[cfg(test)]
    pub(crate) async fn run_slot(
        self: &Arc<Self>,
        draining: &tokio_util::sync::CancellationToken,
    ) -> Result<RunSlot, NoRunSlot> {
        self.run_slot_until(async {
            draining.cancelled().await;
            NoRunSlot::Draining
        })
        .await
    }

    /// A run slot for a delivery whose lock is held: at once if one is free,
    /// else after the deliveries ahead of it, bounded (see the module docs);
    /// `stop`'s answer ends the wait early.
    pub(crate) async fn run_slot_until(
        self: &Arc<Self>,
        stop: impl std::future::Future<Output = NoRunSlot>,
    ) -> Result<RunSlot, NoRunSlot> {
        let slot = |permit| RunSlot {
            _permit: permit,
            slots: self.clone(),
            since: Instant::now(),
        };
        if let Ok(permit) = self.run.clone().try_acquire_owned() {
            return Ok(slot(permit));
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        let got = tokio::select! {
            why = stop => Err(why),
            r = tokio::time::timeout(self.max_wait, self.run.clone().acquire_owned()) => match r {
                Ok(Ok(permit)) => Ok(slot(permit)),
                // The semaphore is never closed; treat it like a timeout.
                Ok(Err(_)) | Err(_) => Err(NoRunSlot::TooLong),
            },
        };
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        if got.as_ref().err() == Some(&NoRunSlot::TooLong) {
            self.slow_down();
        }
        self.changed.notify_one();
        got
    }

    /// A delivery waited past the bound: the running jobs are slower than the
    /// mean says (it only learns from jobs that finished). Raise the mean so that
    /// no room is left ahead until fast jobs bring it down again (each finished
    /// job moves it an eighth of the way), instead of fetching, locking and
    /// giving back deliveries once per bound.
    fn slow_down(&self) {
        let floor = self
            .max_wait
            .saturating_mul(u32::try_from(self.max_in_flight).unwrap_or(u32::MAX));
        let floor = u64::try_from(floor.as_micros()).unwrap_or(u64::MAX);
        self.mean_run_us.fetch_max(floor, Ordering::Relaxed);
    }

    fn record_run(&self, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let mean = self.mean_run_us.load(Ordering::Relaxed);
        let next = if mean == 0 {
            sample
        } else {
            // mean + (sample - mean) / 2^shift, in integers.
            let scaled = (mean << self.mean_shift) - mean + sample;
            (scaled >> self.mean_shift).max(1)
        };
        self.mean_run_us.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn make(max_in_flight: usize, prefetch: usize, lease_ttl: Duration) -> Arc<Slots> {
        let mut cfg = crate::Config::new("t");
        (cfg.max_in_flight, cfg.prefetch, cfg.lease_ttl) = (max_in_flight, prefetch, lease_ttl);
        Slots::new(&cfg)
    }

    #[test]
    fn no_room_ahead_before_a_job_finished_nor_for_long_jobs() {
        let slots = make(8, 16, Duration::from_secs(5));
        assert_eq!(slots.room_ahead(), 0);
        slots.record_run(Duration::from_millis(10));
        // 8 slots x 50 ms / 10 ms = 40, capped at 16.
        assert_eq!(slots.room_ahead(), 16);
        let slow = make(8, 16, Duration::from_secs(5));
        slow.record_run(Duration::from_secs(1));
        assert_eq!(slow.room_ahead(), 0);
        let off = make(8, 0, Duration::from_secs(5));
        off.record_run(Duration::from_millis(1));
        assert_eq!(off.room_ahead(), 0);
    }

    #[test]
    fn the_mean_moves_an_eighth_towards_each_sample() {
        let slots = make(1, 1, Duration::from_secs(5));
        slots.record_run(Duration::from_micros(800));
        slots.record_run(Duration::from_micros(1600));
        assert_eq!(slots.mean_run_us.load(Ordering::Relaxed), 900);
    }

    #[tokio::test]
    async fn with_deliveries_waiting_the_fetcher_waits_for_half_the_room() {
        let slots = make(2, 8, Duration::from_secs(5));
        // Jobs of 10 ms: room ahead 2 x 50 / 10 = 10, capped at 8; groups of 4.
        slots.record_run(Duration::from_millis(10));
        let draining = tokio_util::sync::CancellationToken::new();
        let first = slots.to_fetch().await;
        assert_eq!(first.len(), 10, "both run slots and the whole room ahead");
        let run_a = slots.run_slot(&draining).await.unwrap();
        let run_b = slots.run_slot(&draining).await.unwrap();
        // Two deliveries are waiting for a run slot.
        let waiter = {
            let (s, d) = (slots.clone(), draining.clone());
            tokio::spawn(async move { s.run_slot(&d).await.map(drop) })
        };
        tokio::task::yield_now().await;
        let mut first = first;
        // Three deliveries end: less than half of the room is free, no fetch.
        first.truncate(7);
        assert_eq!(slots.wanted(), 0);
        // A fourth: four free, fetch four.
        first.truncate(6);
        assert_eq!(slots.wanted(), 4);
        drop((run_a, run_b));
        assert!(waiter.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_waiting_delivery_gives_up_when_draining() {
        let slots = make(1, 4, Duration::from_secs(5));
        let draining = tokio_util::sync::CancellationToken::new();
        let _running = slots.run_slot(&draining).await.unwrap();
        let waiter = {
            let (s, d) = (slots.clone(), draining.clone());
            tokio::spawn(async move { s.run_slot(&d).await.map(drop) })
        };
        tokio::task::yield_now().await;
        draining.cancel();
        assert_eq!(waiter.await.unwrap(), Err(NoRunSlot::Draining));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_delivery_gives_up_after_the_bound() {
        let slots = make(1, 4, Duration::from_secs(2));
        let draining = tokio_util::sync::CancellationToken::new();
        let _running = slots.run_slot(&draining).await.unwrap();
        let started = Instant::now();
        assert_eq!(
            slots.run_slot(&draining).await.map(drop),
            Err(NoRunSlot::TooLong)
        );
        assert_eq!(started.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_delivery_gave_up_no_room_is_left_ahead_until_jobs_run_fast_again() {
        let slots = make(2, 8, Duration::from_secs(4));
        slots.record_run(Duration::from_millis(10));
        assert_eq!(slots.room_ahead(), 8);
        let draining = tokio_util::sync::CancellationToken::new();
        let _a = slots.run_slot(&draining).await.unwrap();
        let _b = slots.run_slot(&draining).await.unwrap();
        assert_eq!(
            slots.run_slot(&draining).await.map(drop),
            Err(NoRunSlot::TooLong)
        );
        assert_eq!(
            slots.room_ahead(),
            0,
            "jobs hold their slots past the bound"
        );
        let mut finished = 0;
        while slots.room_ahead() == 0 {
            slots.record_run(Duration::from_millis(10));
            finished += 1;
            assert!(finished < 100, "fast jobs bring the room back");
        }
        assert!(finished > 10, "not after one fast job: {finished}");
    }
}
