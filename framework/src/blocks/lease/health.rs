//! The health state machine of a session, pure: instants in, transitions out.
//!
//! `Healthy` while the newest acknowledged keepalive is younger than TTL/3,
//! `Degraded` from then until it is 70% of the TTL old, `Lost` after that or on a
//! fatal keepalive answer. `Lost` is terminal.
//!
//! An acknowledgement is stamped with the instant its *request was sent*, not the
//! instant the answer arrived: etcd renewed the lease somewhere between the two, so
//! the lease lives at least until `sent + TTL`. Stamping with the send instant keeps
//! [`HealthClock::lost_deadline`] conservative however slow the answer was.

use std::time::Duration;

use tokio::time::Instant;

/// The health of a session, as the keeper sees it on the monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// A keepalive was acknowledged within the last TTL/3.
    Healthy,
    /// No keepalive acknowledged for TTL/3 (but less than 70% of the TTL): stop
    /// taking new jobs; running ones continue, and a commit must not start.
    Degraded,
    /// The lease must be presumed gone. Terminal. The session's cancellation token
    /// is cancelled.
    Lost,
}

impl Health {
    /// `healthy`, `degraded` or `lost`: the name in metrics and worker reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Degraded => "degraded",
            Health::Lost => "lost",
        }
    }
}

/// A change of state computed by the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) from: Health,
    pub(crate) to: Health,
}

/// The health clock: the last acknowledged keepalive and the thresholds.
#[derive(Debug, Clone)]
pub(crate) struct HealthClock {
    degraded_after: Duration,
    lost_after: Duration,
    last_ack: Instant,
    state: Health,
}

impl HealthClock {
    /// A healthy clock whose last acknowledged keepalive was sent at `last_ack`.
    pub(crate) fn new(last_ack: Instant, degraded_after: Duration, lost_after: Duration) -> Self {
        HealthClock {
            degraded_after,
            lost_after,
            last_ack,
            state: Health::Healthy,
        }
    }

    pub(crate) fn state(&self) -> Health {
        self.state
    }

    /// When the newest acknowledged keepalive was sent.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn last_ack(&self) -> Instant {
        self.last_ack
    }

    /// `last_ack + 70% TTL`: when the session is declared `Lost` without a new ack.
    pub(crate) fn lost_deadline(&self) -> Instant {
        self.last_ack + self.lost_after
    }

    /// `last_ack + TTL/3`: when a healthy session turns `Degraded` without a new ack.
    pub(crate) fn degraded_deadline(&self) -> Instant {
        self.last_ack + self.degraded_after
    }

    /// The next instant at which [`HealthClock::poll`] can change the state.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            Health::Healthy => Some(self.degraded_deadline()),
            Health::Degraded => Some(self.lost_deadline()),
            Health::Lost => None,
        }
    }

    /// How much time has passed since the newest acknowledged keepalive was sent.
    pub(crate) fn since_last_ack(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_ack)
    }

    /// The state the clock alone dictates at `now`.
    fn target(&self, now: Instant) -> Health {
        if now >= self.lost_deadline() {
            Health::Lost
        } else if now >= self.degraded_deadline() {
            Health::Degraded
        } else {
            Health::Healthy
        }
    }

    fn set(&mut self, to: Health) -> Option<Transition> {
        let from = self.state;
        if from == to || from == Health::Lost {
            return None;
        }
        self.state = to;
        Some(Transition { from, to })
    }

    /// Applies the deadlines at `now` (no new ack): `Healthy -> Degraded -> Lost`.
    pub(crate) fn poll(&mut self, now: Instant) -> Option<Transition> {
        let to = self.target(now).max_severity(self.state);
        self.set(to)
    }

    /// A keepalive whose request was sent at `sent_at` was acknowledged (ttl > 0)
    /// and is being processed at `now`. `Degraded -> Healthy` when it is recent
    /// enough; a late ack cannot bring back a session past its lost deadline.
    pub(crate) fn ack(&mut self, sent_at: Instant, now: Instant) -> Option<Transition> {
        if self.state == Health::Lost {
            return None;
        }
        // Judge the ack against the deadlines as they stood when it arrived: if the
        // lost deadline passed before this ack, the session is lost (the timer may
        // simply not have fired yet).
        if now >= self.lost_deadline() {
            return self.set(Health::Lost);
        }
        if sent_at > self.last_ack {
            self.last_ack = sent_at;
        }
        let to = self.target(now);
        self.set(to)
    }

    /// A fatal keepalive outcome (ttl <= 0, stream ended or failed): `Lost` now.
    pub(crate) fn fail(&mut self) -> Option<Transition> {
        self.set(Health::Lost)
    }
}

impl Health {
    fn rank(self) -> u8 {
        match self {
            Health::Healthy => 0,
            Health::Degraded => 1,
            Health::Lost => 2,
        }
    }

    /// The worse of the two states.
    fn max_severity(self, other: Health) -> Health {
        if self.rank() >= other.rank() {
            self
        } else {
            other
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    fn clock(at: Instant) -> HealthClock {
        HealthClock::new(at, TTL / 3, TTL.mul_f64(0.7))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn no_acks_go_healthy_degraded_lost_at_the_thresholds() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        assert_eq!(c.next_deadline(), Some(t0 + ms(1000)));
        assert_eq!(c.poll(t0 + ms(999)), None);
        assert_eq!(c.state(), Health::Healthy);
        assert_eq!(
            c.poll(t0 + ms(1000)),
            Some(Transition {
                from: Health::Healthy,
                to: Health::Degraded
            })
        );
        assert_eq!(c.next_deadline(), Some(t0 + ms(2100)));
        assert_eq!(c.poll(t0 + ms(2099)), None);
        assert_eq!(
            c.poll(t0 + ms(2100)),
            Some(Transition {
                from: Health::Degraded,
                to: Health::Lost
            })
        );
        assert_eq!(c.next_deadline(), None);
        assert_eq!(c.lost_deadline(), t0 + ms(2100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_timer_jumps_straight_to_lost() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        assert_eq!(
            c.poll(t0 + ms(5000)),
            Some(Transition {
                from: Health::Healthy,
                to: Health::Lost
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn acks_keep_it_healthy_and_bring_degraded_back() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        // Request sent at 500 ms, answered at 520 ms: deadlines move to 1500 / 2600.
        assert_eq!(c.ack(t0 + ms(500), t0 + ms(520)), None);
        assert_eq!(c.last_ack(), t0 + ms(500));
        assert_eq!(c.next_deadline(), Some(t0 + ms(1500)));
        assert_eq!(
            c.poll(t0 + ms(1500)),
            Some(Transition {
                from: Health::Healthy,
                to: Health::Degraded
            })
        );
        // A request sent at 1400 ms is answered at 1700 ms: in time, Healthy again.
        assert_eq!(
            c.ack(t0 + ms(1400), t0 + ms(1700)),
            Some(Transition {
                from: Health::Degraded,
                to: Health::Healthy
            })
        );
        assert_eq!(c.lost_deadline(), t0 + ms(3500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_ack_leaves_it_degraded() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        c.poll(t0 + ms(1000));
        assert_eq!(c.state(), Health::Degraded);
        // Sent at 200 ms, answered at 1300 ms: 1.1 s old on arrival, still Degraded,
        // but the lost deadline moved to 200 + 2100.
        assert_eq!(c.ack(t0 + ms(200), t0 + ms(1300)), None);
        assert_eq!(c.state(), Health::Degraded);
        assert_eq!(c.lost_deadline(), t0 + ms(2300));
        // An older answer never moves the clock back.
        assert_eq!(c.ack(t0 + ms(100), t0 + ms(1350)), None);
        assert_eq!(c.last_ack(), t0 + ms(200));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ack_after_the_lost_deadline_is_lost_and_lost_is_terminal() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        // The timer has not fired yet, but the answer arrives past the deadline.
        assert_eq!(
            c.ack(t0 + ms(2000), t0 + ms(2200)),
            Some(Transition {
                from: Health::Healthy,
                to: Health::Lost
            })
        );
        assert_eq!(c.ack(t0 + ms(2300), t0 + ms(2310)), None);
        assert_eq!(c.poll(t0 + ms(9000)), None);
        assert_eq!(c.fail(), None);
        assert_eq!(c.state(), Health::Lost);
    }

    #[tokio::test(start_paused = true)]
    async fn fail_is_lost_from_any_state() {
        let t0 = Instant::now();
        let mut c = clock(t0);
        assert_eq!(
            c.fail(),
            Some(Transition {
                from: Health::Healthy,
                to: Health::Lost
            })
        );
        let mut d = clock(t0);
        d.poll(t0 + ms(1500));
        assert_eq!(
            d.fail(),
            Some(Transition {
                from: Health::Degraded,
                to: Health::Lost
            })
        );
    }
}
