//! The backoff policy, in one place: exponential backoff with jitter,
//!
//! ```text
//! sleep = min(cap, base * 2^attempt) * rand(0.5, 1.5)
//! ```
//!
//! with `attempt` counting from 0 and `rand(0.5, 1.5)` uniform over `[0.5, 1.5]`.
//! It spaces new sessions after a lost one ([`Config::session_backoff`]),
//! re-acquire attempts of a contended job lock ([`Config::contention_backoff`]),
//! retries of a failed step ([`Config::retry_backoff`]) and the queue's own retries
//! (the max-deliveries listener).
//!
//! The sequence is the `backoff` crate's [`ExponentialBackoff`], pinned to exactly
//! that formula: `multiplier = 2`, `randomization_factor = 0.5`,
//! `max_interval = cap`, no elapsed-time limit (so it never gives up on its own).
//! This module is the only place that names the crate, so it can be swapped (for
//! `backon`, say) without touching a caller. The crate draws its jitter as
//! `interval * (0.5 + r)` with `r` in `[0, 1]` plus at most one nanosecond, so a
//! delay lies in `[interval / 2, interval * 3 / 2 + 1 ns]`.
//!
//! (The examples are the unit tests `the_module_example` and `interval_doubles_up_to_cap`.)
//!
//! [`Config::session_backoff`]: crate::Config::session_backoff
//! [`Config::contention_backoff`]: crate::Config::contention_backoff
//! [`Config::retry_backoff`]: crate::Config::retry_backoff
//! [`ExponentialBackoff`]: backoff::ExponentialBackoff

use std::time::{Duration, Instant};

use backoff::backoff::Backoff as _;
use backoff::{ExponentialBackoff, SystemClock};
use tokio_util::sync::CancellationToken;

use crate::config::BackoffConfig;

/// The jitter factor's range: a delay is `interval * f` with `f` in `[0.5, 1.5]`.
pub const JITTER: f64 = 0.5;

/// The interval before jitter: `min(cap, base * 2^attempt)`, saturating (a huge
/// `attempt` gives `cap`, never an overflow). The bound every delay is centred on.
pub fn interval(cfg: &BackoffConfig, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
    cfg.base.saturating_mul(factor).min(cfg.cap)
}

/// The sleep for `attempt`: `min(cap, base * 2^attempt) * rand(0.5, 1.5)`, for a
/// caller that keeps the attempt count itself (a job row's `attempts`).
pub fn jittered(cfg: &BackoffConfig, attempt: u32) -> Duration {
    let mut sequence = exponential(cfg, interval(cfg, attempt));
    next(&mut sequence, cfg)
}

/// The crate's sequence, pinned to the formula, starting at `current`.
fn exponential(cfg: &BackoffConfig, current: Duration) -> ExponentialBackoff {
    ExponentialBackoff {
        current_interval: current,
        initial_interval: cfg.base.min(cfg.cap),
        randomization_factor: JITTER,
        multiplier: 2.0,
        max_interval: cfg.cap,
        start_time: Instant::now(),
        max_elapsed_time: None,
        clock: SystemClock::default(),
    }
}

/// The next delay of `sequence`. Without an elapsed-time limit the crate always
/// answers; the cap is the answer should that ever change.
fn next(sequence: &mut ExponentialBackoff, cfg: &BackoffConfig) -> Duration {
    sequence.next_backoff().unwrap_or(cfg.cap)
}

/// A backoff sequence: each [`Backoff::next_delay`] uses the next attempt number.
#[derive(Debug, Clone)]
pub struct Backoff {
    cfg: BackoffConfig,
    attempt: u32,
    sequence: ExponentialBackoff,
}

impl Backoff {
    /// A sequence starting at attempt 0.
    pub fn new(cfg: BackoffConfig) -> Self {
        let sequence = exponential(&cfg, interval(&cfg, 0));
        Backoff {
            cfg,
            attempt: 0,
            sequence,
        }
    }

    /// The number of delays handed out since the start or the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Starts over at attempt 0 (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
        self.sequence.reset();
    }

    /// The delay for the current attempt (jittered), then moves to the next one.
    pub fn next_delay(&mut self) -> Duration {
        self.attempt = self.attempt.saturating_add(1);
        next(&mut self.sequence, &self.cfg)
    }

    /// Sleeps for [`Backoff::next_delay`] unless `stop` is cancelled first.
    /// Returns `false` when cancelled.
    pub async fn sleep_unless(&mut self, stop: &CancellationToken) -> bool {
        let d = self.next_delay();
        tokio::select! {
            _ = stop.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_module_example() {
        let cfg = BackoffConfig {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
        };
        let mut backoff = Backoff::new(cfg);
        let first = backoff.next_delay(); // attempt 0: 100 ms * [0.5, 1.5]
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(150));
        assert_eq!(backoff.attempt(), 1);
    }

    #[test]
    fn interval_doubles_up_to_cap() {
        let cfg = BackoffConfig {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        assert_eq!(interval(&cfg, 0), Duration::from_millis(100));
        assert_eq!(interval(&cfg, 3), Duration::from_millis(800));
        assert_eq!(interval(&cfg, 4), Duration::from_secs(1));
        assert_eq!(interval(&cfg, u32::MAX), Duration::from_secs(1));
    }

    fn cfg() -> BackoffConfig {
        BackoffConfig {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
        }
    }

    /// The formula's bounds for `attempt`, with the crate's one nanosecond.
    fn bounds(c: &BackoffConfig, attempt: u32) -> (Duration, Duration) {
        let center = interval(c, attempt);
        (center / 2, center + center / 2 + Duration::from_nanos(1))
    }

    #[test]
    fn interval_doubles_until_the_cap() {
        let c = cfg();
        let got: Vec<u128> = (0..9).map(|a| interval(&c, a).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        for a in [31, 32, 33, 64, 1000, u32::MAX] {
            assert_eq!(
                interval(&c, a),
                c.cap,
                "attempt {a} must saturate at the cap"
            );
        }
    }

    proptest! {
        /// Every delay of a sequence, and every attempt-indexed delay, lies within
        /// `[interval / 2, interval * 3 / 2]` of the seed's formula.
        #[test]
        fn delays_stay_inside_the_formula(
            base_ms in 1u64..20_000,
            cap_ms in 1u64..120_000,
            attempts in 1u32..80,
        ) {
            let c = BackoffConfig {
                base: Duration::from_millis(base_ms),
                cap: Duration::from_millis(cap_ms),
            };
            let mut sequence = Backoff::new(c);
            for attempt in 0..attempts {
                let (lo, hi) = bounds(&c, attempt);
                let d = sequence.next_delay();
                prop_assert!(d >= lo && d <= hi, "sequence attempt {attempt}: {d:?} outside [{lo:?}, {hi:?}]");
                let d = jittered(&c, attempt);
                prop_assert!(d >= lo && d <= hi, "jittered attempt {attempt}: {d:?} outside [{lo:?}, {hi:?}]");
            }
        }
    }

    #[test]
    fn jitter_spreads_over_the_whole_range() {
        let c = cfg();
        for attempt in 0..12 {
            let center = interval(&c, attempt);
            let draws: Vec<Duration> = (0..2000).map(|_| jittered(&c, attempt)).collect();
            let min = draws.iter().min().copied().unwrap();
            let max = draws.iter().max().copied().unwrap();
            // A constant factor, or a narrower randomization, would fail here.
            assert!(min < center.mul_f64(0.6), "attempt {attempt}: min {min:?}");
            assert!(max > center.mul_f64(1.4), "attempt {attempt}: max {max:?}");
        }
    }

    #[test]
    fn a_base_above_the_cap_starts_at_the_cap() {
        let c = BackoffConfig {
            base: Duration::from_secs(10),
            cap: Duration::from_secs(1),
        };
        let mut b = Backoff::new(c);
        for _ in 0..5 {
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(1500), "{d:?}");
        }
    }

    #[test]
    fn the_sequence_counts_attempts_and_resets() {
        let mut b = Backoff::new(cfg());
        for expected in 0..5u32 {
            assert_eq!(b.attempt(), expected);
            let d = b.next_delay();
            let (lo, hi) = bounds(&cfg(), expected);
            assert!(d >= lo && d <= hi, "attempt {expected}: {d:?}");
        }
        b.reset();
        assert_eq!(b.attempt(), 0);
        let d = b.next_delay();
        assert!(d <= Duration::from_millis(150), "after reset: {d:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_unless_sleeps_the_delay_or_stops_early() {
        let mut b = Backoff::new(BackoffConfig {
            base: Duration::from_secs(10),
            cap: Duration::from_secs(10),
        });
        let stop = CancellationToken::new();
        let t0 = tokio::time::Instant::now();
        assert!(b.sleep_unless(&stop).await);
        let slept = t0.elapsed();
        assert!(
            slept >= Duration::from_secs(5) && slept <= Duration::from_secs(15),
            "{slept:?}"
        );

        let t1 = tokio::time::Instant::now();
        let canceller = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            canceller.cancel();
        });
        assert!(!b.sleep_unless(&stop).await);
        assert_eq!(t1.elapsed(), Duration::from_secs(1));
    }
}
