//! The lock service's decisions, as a pure state machine: when a batch leaves,
//! what rides in it, whether the previous batch's re-read is folded into it or
//! made alone, and when a failed release is tried again or given up. No I/O and
//! no clock of its own: every call takes `now`, so the tests drive it with
//! explicit instants (see [`super::service`] for the task that does the I/O).
//!
//! Generic over what an acquisition (`A`) and a release (`R`) carry, so the tests
//! need no session and no etcd.

use std::collections::VecDeque;
use tokio::time::Instant;

use super::batch::MAX_BATCH;
use crate::config::Tuning;

// The timing rules' numbers are `Tuning`'s `lock_*` fields (`Config::tuning`),
// each documented there with the reason for its default.

/// When a release goes to etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseMode {
    /// The job ended for good: ride along with the next acquisition (at most
    /// `Tuning::lock_release_linger`, 100 ms, later).
    Deferred,
    /// The job is handed back for another attempt: in the next batch.
    Prompt,
}

/// A release on its way to etcd, with its failures so far.
#[derive(Debug)]
pub(super) struct Release<R> {
    pub(super) item: R,
    /// When its first attempt failed (`None`: not failed yet).
    failed_since: Option<Instant>,
    /// Failed attempts so far.
    failures: u32,
}

impl<R> Release<R> {
    fn new(item: R) -> Self {
        Release {
            item,
            failed_since: None,
            failures: 0,
        }
    }

    /// Its item, and the release (with its failures so far) without it.
    pub(super) fn split(self) -> (R, Release<()>) {
        let rest = Release {
            item: (),
            failed_since: self.failed_since,
            failures: self.failures,
        };
        (self.item, rest)
    }

    /// The same release (and failures so far) carrying `f(item)`.
    pub(super) fn map<U>(self, f: impl FnOnce(R) -> U) -> Release<U> {
        Release {
            item: f(self.item),
            failed_since: self.failed_since,
            failures: self.failures,
        }
    }
}

/// A failed release waiting for its next attempt.
#[derive(Debug)]
struct Retry<R> {
    release: Release<R>,
    due: Instant,
}

/// What leaves in one batch.
#[derive(Debug)]
pub(super) struct Outgoing<A, R> {
    /// At most [`MAX_BATCH`] acquisitions, in arrival order.
    pub(super) acquires: Vec<A>,
    /// Prompt and deferred releases, and failed ones that are due again.
    pub(super) releases: Vec<Release<R>>,
    /// Whether the previous batch's re-read rides in this batch's Txn.
    pub(super) fold: bool,
}

/// What the service does next.
#[derive(Debug)]
pub(super) enum Decision<A, R> {
    /// Send this batch now.
    Send(Outgoing<A, R>),
    /// Make the previous batch's re-read on its own, now: nothing is ready to
    /// carry it.
    VerifyAlone,
    /// Wait for a request, or until this instant (`None`: for a request only).
    Wait(Option<Instant>),
}

/// The queued work of the lock service and its timing rules.
#[derive(Debug)]
pub(super) struct Planner<A, R> {
    acquires: VecDeque<A>,
    /// Prompt releases: they make a batch leave.
    prompt: Vec<Release<R>>,
    /// Deferred releases: they wait for a batch to ride along with.
    deferred: Vec<Release<R>>,
    /// When the oldest deferred release arrived.
    deferred_since: Option<Instant>,
    /// Failed releases, each with its next attempt.
    retries: Vec<Retry<R>>,
    /// When the work that makes the next batch leave (an acquisition, a prompt
    /// release, a re-read left pending) was first there.
    ready_since: Option<Instant>,
    /// When the previous batch's re-read was left pending (`None`: none is).
    pending_since: Option<Instant>,
    /// The `lock_*` numbers of the worker's tuning.
    tuning: Tuning,
}

impl<A, R> Planner<A, R> {
    pub(super) fn new(tuning: Tuning) -> Self {
        Planner {
            acquires: VecDeque::new(),
            prompt: Vec::new(),
            deferred: Vec::new(),
            deferred_since: None,
            retries: Vec::new(),
            ready_since: None,
            pending_since: None,
            tuning,
        }
    }

    /// An acquisition asked at `now`.
    pub(super) fn acquire(&mut self, item: A, now: Instant) {
        self.acquires.push_back(item);
        self.ready_since.get_or_insert(now);
    }

    /// A release asked at `now`.
    pub(super) fn release(&mut self, item: R, mode: ReleaseMode, now: Instant) {
        match mode {
            ReleaseMode::Prompt => {
                self.prompt.push(Release::new(item));
                self.ready_since.get_or_insert(now);
            }
            ReleaseMode::Deferred => {
                self.deferred.push(Release::new(item));
                self.deferred_since.get_or_insert(now);
            }
        }
    }

    /// The batch just sent left its re-read pending (at `now`): it rides in the
    /// next batch if one is ready within the acquire linger, else it goes alone.
    pub(super) fn verification_pending(&mut self, now: Instant) {
        self.pending_since = Some(now);
    }

    /// The pending re-read was made (alone or folded).
    fn verification_done(&mut self) {
        self.pending_since = None;
    }

    /// `releases` failed at `now`: each is tried again after a pause that
    /// doubles per failure, until `lock_release_give_up` after its first failure.
    /// Returns the ones given up (their locks expire with the session lease).
    pub(super) fn release_failed(&mut self, releases: Vec<Release<R>>, now: Instant) -> Vec<R> {
        let mut given_up = Vec::new();
        for mut r in releases {
            let since = *r.failed_since.get_or_insert(now);
            let retry = self.tuning.lock_release_retry;
            let delay = retry
                .base
                .saturating_mul(1 << r.failures.min(8))
                .min(retry.cap);
            r.failures += 1;
            let due = now + delay;
            if due > since + self.tuning.lock_release_give_up {
                given_up.push(r.item);
            } else {
                self.retries.push(Retry { release: r, due });
            }
        }
        given_up
    }

    /// Failed releases waiting for their next attempt.
    pub(super) fn retrying(&self) -> usize {
        self.retries.len()
    }

    /// What to do at `now`; `coming`: some acquisitions are announced but not
    /// asked yet (a batch about to leave may wait the acquire linger for them).
    pub(super) fn decide(&mut self, now: Instant, coming: bool) -> Decision<A, R> {
        let retry_due = self.retries.iter().any(|r| r.due <= now);
        let ready = !self.acquires.is_empty() || !self.prompt.is_empty() || retry_due;
        if ready || self.pending_since.is_some() {
            let first_due = self
                .retries
                .iter()
                .map(|r| r.due)
                .filter(|t| *t <= now)
                .min();
            let since = [self.ready_since, self.pending_since, first_due]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(now);
            let linger_until = since + self.tuning.lock_acquire_linger;
            let full = self.acquires.len() + self.prompt.len() >= MAX_BATCH;
            if coming && !full && now < linger_until {
                return Decision::Wait(Some(linger_until));
            }
            if !ready {
                // Deferred releases alone do not make a write Txn worth it: they
                // wait for the next acquisition, and the re-read goes alone.
                self.verification_done();
                return Decision::VerifyAlone;
            }
            return Decision::Send(self.take(now));
        }
        let deferred_due = self
            .deferred_since
            .map(|t| t + self.tuning.lock_release_linger);
        if self.deferred.len() >= self.tuning.lock_release_flush
            || deferred_due.is_some_and(|t| t <= now)
        {
            return Decision::Send(self.take(now));
        }
        let next_retry = self.retries.iter().map(|r| r.due).min();
        let wake = match (deferred_due, next_retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Decision::Wait(wake)
    }

    /// The next batch: up to [`MAX_BATCH`] acquisitions, every prompt and
    /// deferred release and every due retry (an oversized Txn is split by the
    /// lease layer), and the pending re-read if there is one.
    fn take(&mut self, now: Instant) -> Outgoing<A, R> {
        let n = self.acquires.len().min(MAX_BATCH);
        let acquires: Vec<A> = self.acquires.drain(..n).collect();
        let mut releases = std::mem::take(&mut self.prompt);
        releases.append(&mut self.deferred);
        self.deferred_since = None;
        let (due, waiting): (Vec<Retry<R>>, Vec<Retry<R>>) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|r| r.due <= now);
        self.retries = waiting;
        releases.extend(due.into_iter().map(|r| r.release));
        self.ready_since = (!self.acquires.is_empty()).then_some(now);
        let fold = self.pending_since.is_some();
        self.verification_done();
        Outgoing {
            acquires,
            releases,
            fold,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T: Tuning = Tuning::DEFAULT;
    const ACQUIRE_LINGER: Duration = T.lock_acquire_linger;
    const RELEASE_LINGER: Duration = T.lock_release_linger;
    const DEFERRED_FLUSH: usize = T.lock_release_flush;
    const RELEASE_RETRY_DELAY: Duration = T.lock_release_retry.base;
    const RELEASE_GIVE_UP: Duration = T.lock_release_give_up;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    type P = Planner<u32, &'static str>;

    fn sent(d: Decision<u32, &'static str>) -> Outgoing<u32, &'static str> {
        match d {
            Decision::Send(o) => o,
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    fn released(o: &Outgoing<u32, &'static str>) -> Vec<&'static str> {
        o.releases.iter().map(|r| r.item).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_acquisition_leaves_at_once() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        assert!(matches!(p.decide(t0, false), Decision::Wait(None)));
        p.acquire(1, t0);
        let o = sent(p.decide(t0, false));
        assert_eq!(o.acquires, vec![1]);
        assert!(!o.fold);
        assert!(matches!(p.decide(t0, false), Decision::Wait(None)));
    }

    #[tokio::test(start_paused = true)]
    async fn announced_acquisitions_are_waited_for_up_to_the_linger() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        p.acquire(1, t0);
        assert!(matches!(p.decide(t0, true), Decision::Wait(Some(t)) if t == t0 + ACQUIRE_LINGER));
        p.acquire(2, t0 + ms(1));
        assert!(matches!(
            p.decide(t0 + ms(1), true),
            Decision::Wait(Some(_))
        ));
        // Still announced ones, but the linger is over: it leaves.
        let o = sent(p.decide(t0 + ACQUIRE_LINGER, true));
        assert_eq!(o.acquires, vec![1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_leaves_without_lingering_and_the_rest_follows() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        for i in 0..(MAX_BATCH as u32 + 3) {
            p.acquire(i, t0);
        }
        let o = sent(p.decide(t0, true));
        assert_eq!(o.acquires.len(), MAX_BATCH);
        let o = sent(p.decide(t0 + ACQUIRE_LINGER, true));
        assert_eq!(o.acquires.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn deferred_releases_ride_along_or_flush_after_their_linger() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        p.release("done-1", ReleaseMode::Deferred, t0);
        assert!(matches!(p.decide(t0, false), Decision::Wait(Some(t)) if t == t0 + RELEASE_LINGER));
        // An acquisition comes: the deferred release rides in its batch.
        p.acquire(7, t0 + ms(10));
        let o = sent(p.decide(t0 + ms(10), false));
        assert_eq!(o.acquires, vec![7]);
        assert_eq!(released(&o), vec!["done-1"]);
        // Alone, it waits its linger, then goes on its own.
        p.release("done-2", ReleaseMode::Deferred, t0 + ms(20));
        assert!(matches!(p.decide(t0 + ms(119), false), Decision::Wait(_)));
        let o = sent(p.decide(t0 + ms(120), false));
        assert!(o.acquires.is_empty());
        assert_eq!(released(&o), vec!["done-2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn many_deferred_releases_leave_without_waiting() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        for _ in 0..DEFERRED_FLUSH {
            p.release("done", ReleaseMode::Deferred, t0);
        }
        assert_eq!(sent(p.decide(t0, false)).releases.len(), DEFERRED_FLUSH);
    }

    #[tokio::test(start_paused = true)]
    async fn a_prompt_release_leaves_at_once() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        p.release("retry", ReleaseMode::Prompt, t0);
        assert_eq!(released(&sent(p.decide(t0, false))), vec!["retry"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pending_reread_rides_in_the_next_batch_or_goes_alone() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        p.verification_pending(t0);
        // Nothing ready, nothing announced: the re-read goes alone at once.
        assert!(matches!(p.decide(t0, false), Decision::VerifyAlone));
        assert!(matches!(p.decide(t0, false), Decision::Wait(None)));

        // Announced acquisitions: wait for them, then fold.
        p.verification_pending(t0);
        assert!(matches!(p.decide(t0, true), Decision::Wait(Some(_))));
        p.acquire(3, t0 + ms(1));
        let o = sent(p.decide(t0 + ms(2), true));
        assert!(o.fold);
        assert_eq!(o.acquires, vec![3]);

        // A deferred release alone does not carry it.
        p.verification_pending(t0 + ms(5));
        p.release("done", ReleaseMode::Deferred, t0 + ms(5));
        assert!(matches!(p.decide(t0 + ms(5), false), Decision::VerifyAlone));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_release_does_not_delay_an_acquisition_queued_after_it() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        p.release("prompt", ReleaseMode::Prompt, t0);
        let o = sent(p.decide(t0, false));
        // Its Txn fails after 10 ms; an acquisition was asked meanwhile.
        let failed_at = t0 + ms(10);
        p.acquire(9, t0 + ms(5));
        assert!(p.release_failed(o.releases, failed_at).is_empty());
        assert_eq!(p.retrying(), 1);
        // The acquisition leaves at once, without the release (not due yet).
        let o = sent(p.decide(failed_at, false));
        assert_eq!(o.acquires, vec![9]);
        assert!(o.releases.is_empty());
        // The release is tried again 250 ms after its failure.
        let retry_at = failed_at + RELEASE_RETRY_DELAY;
        assert!(matches!(p.decide(failed_at, false), Decision::Wait(Some(t)) if t == retry_at));
        assert!(matches!(
            p.decide(retry_at - ms(1), false),
            Decision::Wait(_)
        ));
        let o = sent(p.decide(retry_at, false));
        assert_eq!(released(&o), vec!["prompt"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_retry_rides_with_an_acquisition() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        p.release("r", ReleaseMode::Prompt, t0);
        let o = sent(p.decide(t0, false));
        p.release_failed(o.releases, t0);
        p.acquire(1, t0 + ms(300));
        let o = sent(p.decide(t0 + ms(300), false));
        assert_eq!(o.acquires, vec![1]);
        assert_eq!(released(&o), vec!["r"]);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_and_are_given_up_after_five_seconds() {
        let t0 = Instant::now();
        let mut p = P::new(T);
        p.release("r", ReleaseMode::Prompt, t0);
        let mut o = sent(p.decide(t0, false));
        let mut now = t0;
        let mut attempts_at = Vec::new();
        loop {
            let given_up = p.release_failed(o.releases, now);
            if !given_up.is_empty() {
                assert_eq!(given_up, vec!["r"]);
                break;
            }
            let Decision::Wait(Some(due)) = p.decide(now, false) else {
                panic!("a retry is waiting")
            };
            now = due;
            attempts_at.push(now - t0);
            o = sent(p.decide(now, false));
        }
        assert_eq!(p.retrying(), 0);
        assert_eq!(
            attempts_at,
            vec![ms(250), ms(750), ms(1750), ms(2750), ms(3750), ms(4750)]
        );
        // Given up within the same total time as the inline retry it replaces.
        assert!(now - t0 <= RELEASE_GIVE_UP);
        assert!(matches!(p.decide(now, false), Decision::Wait(None)));
    }
}
