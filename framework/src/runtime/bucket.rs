//! A job type's rate limit ([`JobLimits::rate`](crate::JobLimits::rate)): a
//! token bucket per worker, `n` tokens deep, refilled continuously at `n` per
//! `per`. The fetcher asks a type for at most its whole tokens and takes one
//! per delivery it hands out, so a throttled type's messages stay in the
//! stream. Pure logic: every call is given the time.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// One type's bucket, kept as the time it will be full again (exact: no
/// floating point).
#[derive(Debug)]
pub(crate) struct Bucket {
    burst: u32,
    /// The time one token takes to refill (`per / n`).
    refill: Duration,
    /// When the bucket is full again if nothing more is taken; past: full.
    /// Each delivery moves it one `refill` later, so after more deliveries
    /// than tokens the refill pays that debt first.
    full_at: Mutex<Instant>,
}

impl Bucket {
    /// A full bucket of `n` tokens refilled at `n` per `per` (both above 0:
    /// checked by `WorkerBuilder::start`).
    pub(crate) fn new(n: u32, per: Duration, now: Instant) -> Self {
        let n = n.max(1);
        Bucket {
            burst: n,
            refill: (per / n).max(Duration::from_nanos(1)),
            full_at: Mutex::new(now),
        }
    }

    /// How long the bucket takes to be full again from `now`.
    fn deficit(&self, now: Instant) -> Duration {
        let full_at = *self.full_at.lock().unwrap_or_else(|e| e.into_inner());
        full_at.saturating_duration_since(now)
    }

    /// The deliveries that may be taken now: the whole tokens.
    pub(crate) fn available(&self, now: Instant) -> usize {
        let refill = self.refill.as_nanos();
        let missing = self.deficit(now).as_nanos().div_ceil(refill);
        let tokens = u128::from(self.burst).saturating_sub(missing);
        usize::try_from(tokens).unwrap_or(usize::MAX)
    }

    /// Takes one token for a delivery handed out.
    pub(crate) fn take(&self, now: Instant) {
        let mut full_at = self.full_at.lock().unwrap_or_else(|e| e.into_inner());
        *full_at = (*full_at).max(now) + self.refill;
    }

    /// How long until a whole token is there (zero if one is).
    pub(crate) fn next_token(&self, now: Instant) -> Duration {
        let room = self.refill * (self.burst - 1);
        self.deficit(now).saturating_sub(room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_full_bucket_gives_its_burst_then_one_token_per_refill() {
        let t0 = Instant::now();
        let b = Bucket::new(5, Duration::from_secs(1), t0);
        assert_eq!(b.available(t0), 5);
        for _ in 0..5 {
            b.take(t0);
        }
        assert_eq!(b.available(t0), 0);
        assert_eq!(b.next_token(t0), 200 * MS);
        assert_eq!(b.available(t0 + 199 * MS), 0);
        assert_eq!(b.next_token(t0 + 150 * MS), 50 * MS);
        assert_eq!(b.available(t0 + 200 * MS), 1);
        assert_eq!(b.next_token(t0 + 200 * MS), Duration::ZERO);
        b.take(t0 + 200 * MS);
        assert_eq!(b.available(t0 + 799 * MS), 2, "0.2 s to 0.8 s: 3 refills");
    }

    #[test]
    fn an_idle_bucket_fills_up_to_its_burst_only() {
        let t0 = Instant::now();
        let b = Bucket::new(3, Duration::from_secs(60), t0);
        b.take(t0);
        assert_eq!(b.available(t0 + Duration::from_secs(3600)), 3);
    }

    #[test]
    fn a_debt_is_paid_before_the_next_token() {
        let t0 = Instant::now();
        let b = Bucket::new(2, Duration::from_secs(2), t0);
        for _ in 0..3 {
            b.take(t0); // one delivery more than the tokens
        }
        assert_eq!(b.next_token(t0), Duration::from_secs(2));
        assert_eq!(b.available(t0 + Duration::from_millis(1999)), 0);
        assert_eq!(b.available(t0 + Duration::from_secs(2)), 1);
    }

    #[test]
    fn over_a_long_run_the_rate_holds() {
        // Taking every token as soon as it is there, for 10 s at 5/s: the
        // burst plus 50 refills.
        let t0 = Instant::now();
        let b = Bucket::new(5, Duration::from_secs(1), t0);
        let mut taken = 0;
        let mut now = t0;
        while now <= t0 + Duration::from_secs(10) {
            for _ in 0..b.available(now) {
                b.take(now);
                taken += 1;
            }
            now += b.next_token(now).max(MS);
        }
        assert_eq!(taken, 55);
    }
}
