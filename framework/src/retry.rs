//! The backoff policy, in one place: exponential backoff with jitter,
//!
//! ```text
//! sleep = min(cap, base * 2^attempt) * rand(0.5, 1.5)
//! ```
//!
//! with `attempt` counting from 0 and `rand(0.5, 1.5)` uniform in `[0.5, 1.5)`.
//! It spaces new sessions after a lost one ([`Config::session_backoff`]),
//! re-acquire attempts of a contended job lock ([`Config::contention_backoff`]) and
//! retries of a failed step ([`Config::retry_backoff`]).
//!
//! The formula is implemented directly (it is two lines) rather than through the
//! `backoff` crate, whose `ExponentialBackoff` also has an elapsed-time limit and a
//! multiplier we would have to pin; here the policy is the formula and nothing else.
//!
//! ```
//! use std::time::Duration;
//! use tenure::config::BackoffConfig;
//! use tenure::retry::Backoff;
//!
//! let cfg = BackoffConfig { base: Duration::from_millis(100), cap: Duration::from_secs(5) };
//! let mut backoff = Backoff::new(cfg);
//! let first = backoff.next_delay(); // attempt 0: 100 ms * [0.5, 1.5)
//! assert!(first >= Duration::from_millis(50) && first < Duration::from_millis(150));
//! assert_eq!(backoff.attempt(), 1);
//! ```
//!
//! [`Config::session_backoff`]: crate::Config::session_backoff
//! [`Config::contention_backoff`]: crate::Config::contention_backoff
//! [`Config::retry_backoff`]: crate::Config::retry_backoff

use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::config::BackoffConfig;

/// Lower bound of the jitter factor (inclusive).
pub const JITTER_MIN: f64 = 0.5;
/// Upper bound of the jitter factor (exclusive).
pub const JITTER_MAX: f64 = 1.5;

/// The interval before jitter: `min(cap, base * 2^attempt)`, saturating (a huge
/// `attempt` gives `cap`, never an overflow).
///
/// ```
/// use std::time::Duration;
/// use tenure::config::BackoffConfig;
/// let cfg = BackoffConfig { base: Duration::from_millis(100), cap: Duration::from_secs(1) };
/// assert_eq!(tenure::retry::interval(&cfg, 0), Duration::from_millis(100));
/// assert_eq!(tenure::retry::interval(&cfg, 3), Duration::from_millis(800));
/// assert_eq!(tenure::retry::interval(&cfg, 4), Duration::from_secs(1));
/// assert_eq!(tenure::retry::interval(&cfg, u32::MAX), Duration::from_secs(1));
/// ```
pub fn interval(cfg: &BackoffConfig, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
    cfg.base.saturating_mul(factor).min(cfg.cap)
}

/// The sleep for `attempt` with an explicit jitter `factor` (clamped into
/// `[0.5, 1.5]`): `interval(cfg, attempt) * factor`. [`delay`] draws the factor.
pub fn delay_with_factor(cfg: &BackoffConfig, attempt: u32, factor: f64) -> Duration {
    let factor = if factor.is_nan() {
        1.0
    } else {
        factor.clamp(JITTER_MIN, JITTER_MAX)
    };
    interval(cfg, attempt).mul_f64(factor)
}

/// The sleep for `attempt`: `min(cap, base * 2^attempt) * rand(0.5, 1.5)`.
pub fn delay(cfg: &BackoffConfig, attempt: u32, rng: &mut impl Rng) -> Duration {
    delay_with_factor(cfg, attempt, rng.random_range(JITTER_MIN..JITTER_MAX))
}

/// [`delay`] with the thread-local random generator.
pub fn jittered(cfg: &BackoffConfig, attempt: u32) -> Duration {
    delay(cfg, attempt, &mut rand::rng())
}

/// A backoff sequence: each [`Backoff::next_delay`] uses the next attempt number.
#[derive(Debug, Clone)]
pub struct Backoff {
    cfg: BackoffConfig,
    attempt: u32,
}

impl Backoff {
    /// A sequence starting at attempt 0.
    pub fn new(cfg: BackoffConfig) -> Self {
        Backoff { cfg, attempt: 0 }
    }

    /// The configuration.
    pub fn config(&self) -> &BackoffConfig {
        &self.cfg
    }

    /// The number of delays handed out since the start or the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Starts over at attempt 0 (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The delay for the current attempt (jittered), then moves to the next one.
    pub fn next_delay(&mut self) -> Duration {
        let d = delay(&self.cfg, self.attempt, &mut rand::rng());
        self.attempt = self.attempt.saturating_add(1);
        d
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
    use rand::SeedableRng;

    fn cfg() -> BackoffConfig {
        BackoffConfig {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
        }
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

    #[test]
    fn jitter_stays_within_half_and_one_and_a_half() {
        let c = cfg();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for attempt in 0..12 {
            let center = interval(&c, attempt);
            let (lo, hi) = (center.mul_f64(0.5), center.mul_f64(1.5));
            let (mut min, mut max) = (Duration::MAX, Duration::ZERO);
            for _ in 0..2000 {
                let d = delay(&c, attempt, &mut rng);
                assert!(
                    d >= lo && d < hi,
                    "attempt {attempt}: {d:?} outside [{lo:?}, {hi:?})"
                );
                min = min.min(d);
                max = max.max(d);
            }
            // The draws actually spread over the range (a constant factor would fail).
            assert!(min < center.mul_f64(0.6), "attempt {attempt}: min {min:?}");
            assert!(max > center.mul_f64(1.4), "attempt {attempt}: max {max:?}");
        }
    }

    #[test]
    fn the_cap_applies_before_jitter() {
        let c = cfg();
        assert_eq!(delay_with_factor(&c, 40, 1.5), Duration::from_millis(7500));
        assert_eq!(delay_with_factor(&c, 40, 0.5), Duration::from_millis(2500));
        assert_eq!(delay_with_factor(&c, 0, 9.0), Duration::from_millis(150));
        assert_eq!(
            delay_with_factor(&c, 0, f64::NAN),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn the_sequence_counts_attempts_and_resets() {
        let mut b = Backoff::new(cfg());
        for expected in 0..5u32 {
            assert_eq!(b.attempt(), expected);
            let d = b.next_delay();
            let center = interval(&cfg(), expected);
            assert!(d >= center.mul_f64(0.5) && d < center.mul_f64(1.5));
        }
        b.reset();
        assert_eq!(b.attempt(), 0);
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
            slept >= Duration::from_secs(5) && slept < Duration::from_secs(15),
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
