//! The keepalive loop of a session: sends keepalives on the bidi stream, feeds
//! the answers and the clock's deadlines to the [`HealthClock`], publishes the
//! state, and runs the watchdog on `Lost`.
//!
//! The loop never waits on the network without also waiting on the health
//! deadline: the answer stream is one branch of a `select!` next to the deadline
//! timer, and a send (a bounded channel push) is itself bounded by a timeout. So
//! a hung stream (a paused etcd member, quorum loss) still moves the state to
//! `Degraded` and `Lost` on time.
//!
//! The transport is behind two tiny traits so the loop is unit-tested with
//! tokio's paused time; in production they are etcd-client's `LeaseKeeper` and
//! `LeaseKeepAliveStream`.

use std::collections::VecDeque;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::health::{HealthClock, Transition};
use super::{Health, LostReason};
use crate::config::WatchdogPolicy;
use crate::types::LeaseId;

/// Sends one keepalive request. Must not block for long (it is bounded anyway).
pub(crate) trait KeepAliveSender: Send + 'static {
    fn send(&mut self) -> impl Future<Output = Result<(), String>> + Send;
}

/// The answers, in request order: `Some(Ok(ttl))`, `Some(Err(_))` when the stream
/// failed, `None` when it ended. Must be cancel-safe.
pub(crate) trait KeepAliveReceiver: Send + 'static {
    fn recv(&mut self) -> impl Future<Output = Option<Result<i64, String>>> + Send;
}

impl KeepAliveSender for etcd_client::LeaseKeeper {
    async fn send(&mut self) -> Result<(), String> {
        self.keep_alive().await.map_err(|e| e.to_string())
    }
}

impl KeepAliveReceiver for etcd_client::LeaseKeepAliveStream {
    async fn recv(&mut self) -> Option<Result<i64, String>> {
        // `StreamExt::next` is cancel-safe: the stream keeps its own state.
        self.next()
            .await
            .map(|r| r.map(|resp| resp.ttl()).map_err(|e| e.to_string()))
    }
}

/// Timings and policy of one keeper.
#[derive(Debug, Clone)]
pub(crate) struct KeeperParams {
    pub(crate) lease_id: LeaseId,
    /// Time between keepalive requests.
    pub(crate) period: Duration,
    pub(crate) watchdog: WatchdogPolicy,
}

/// What the keeper publishes; the session holds the receiving ends.
#[derive(Debug)]
pub(crate) struct Published {
    pub(crate) health: watch::Sender<Health>,
    pub(crate) lost_deadline: watch::Sender<Instant>,
    pub(crate) lost_reason: Arc<OnceLock<LostReason>>,
    pub(crate) cancel: CancellationToken,
    /// The round trip of the newest acknowledged keepalive (send to answer).
    pub(crate) keepalive_rtt: watch::Sender<Option<Duration>>,
}

/// More unanswered requests than this and the stream is clearly stuck: stop
/// queueing more (the clock declares `Lost` long before in any sane config).
const MAX_OUTSTANDING: usize = 32;

/// Runs until the session is `Lost`; returns why.
pub(crate) async fn run<S, R>(
    mut tx: S,
    mut rx: R,
    clock: HealthClock,
    params: KeeperParams,
    out: Published,
) -> LostReason
where
    S: KeepAliveSender,
    R: KeepAliveReceiver,
{
    let mut ticker = tokio::time::interval_at(Instant::now() + params.period, params.period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    out.lost_deadline.send_replace(clock.lost_deadline());
    let mut k = Keepalive {
        clock,
        params,
        out,
        pending: VecDeque::new(),
    };
    loop {
        let Some(deadline) = k.clock.next_deadline() else {
            // Unreachable: every path to Lost returns below.
            let since_last_ack = k.clock.since_last_ack(Instant::now());
            return k.lose_now(LostReason::Deadline { since_last_ack });
        };
        let step = tokio::select! {
            // Answers first: an ack that is ready must be counted before a deadline
            // that is ready at the same time (the clock judges it by its stamp).
            biased;
            answer = rx.recv() => k.answered(answer),
            _ = tokio::time::sleep_until(deadline) => k.deadline_passed(),
            _ = ticker.tick() => k.tick(&mut tx, deadline).await,
        };
        if let ControlFlow::Break(reason) = step {
            return reason;
        }
    }
}

/// The loop's state: the health clock, and the requests not answered yet.
struct Keepalive {
    clock: HealthClock,
    params: KeeperParams,
    out: Published,
    /// Send instants of the requests not answered yet, oldest first (etcd
    /// answers a stream's requests in order).
    pending: VecDeque<Instant>,
}

impl Keepalive {
    /// An answer (or the stream's end): an ack moves the clock; a `ttl` of 0
    /// (etcd's answer for a lease that is gone), an error or the end lose the
    /// session.
    fn answered(&mut self, answer: Option<Result<i64, String>>) -> ControlFlow<LostReason> {
        let now = Instant::now();
        let ttl = match answer {
            Some(Ok(ttl)) if ttl > 0 => ttl,
            Some(Ok(ttl)) => return ControlFlow::Break(self.lose_now(LostReason::Revoked { ttl })),
            Some(Err(e)) => return ControlFlow::Break(self.lose_now(LostReason::StreamError(e))),
            None => return ControlFlow::Break(self.lose_now(LostReason::StreamEnded)),
        };
        let Some(sent_at) = self.pending.pop_front() else {
            tracing::warn!(lease_id = %self.params.lease_id, ttl, "keepalive answer without a request; ignored");
            return ControlFlow::Continue(());
        };
        let rtt = now.saturating_duration_since(sent_at);
        tracing::trace!(
            lease_id = %self.params.lease_id,
            ttl,
            latency_ms = rtt.as_secs_f64() * 1e3,
            "keepalive acknowledged"
        );
        self.out.keepalive_rtt.send_replace(Some(rtt));
        let t = self.clock.ack(sent_at, now);
        self.out
            .lost_deadline
            .send_replace(self.clock.lost_deadline());
        self.transition(t, now, "keepalive acknowledged")
    }

    /// A health deadline passed without an ack.
    fn deadline_passed(&mut self) -> ControlFlow<LostReason> {
        let now = Instant::now();
        let t = self.clock.poll(now);
        let since = self.clock.since_last_ack(now);
        self.transition(t, now, &format!("no keepalive acknowledged for {since:?}"))
    }

    /// Publishes transition `t`, or loses the session if it leads to `Lost`.
    fn transition(
        &mut self,
        t: Option<Transition>,
        now: Instant,
        why: &str,
    ) -> ControlFlow<LostReason> {
        let Some(t) = t else {
            return ControlFlow::Continue(());
        };
        if t.to == Health::Lost {
            let since_last_ack = self.clock.since_last_ack(now);
            return ControlFlow::Break(self.lose(t.from, LostReason::Deadline { since_last_ack }));
        }
        publish(t, &self.out, &self.params, why);
        ControlFlow::Continue(())
    }

    /// Sends one keepalive, bounded by the period and the next health deadline
    /// (a blocked send never delays a transition).
    async fn tick<S: KeepAliveSender>(
        &mut self,
        tx: &mut S,
        deadline: Instant,
    ) -> ControlFlow<LostReason> {
        let lease_id = self.params.lease_id;
        if self.pending.len() >= MAX_OUTSTANDING {
            tracing::debug!(%lease_id, outstanding = self.pending.len(), "keepalive stream stuck; not sending");
            return ControlFlow::Continue(());
        }
        let sent_at = Instant::now();
        let give_up = (sent_at + self.params.period).min(deadline);
        match tokio::time::timeout_at(give_up, tx.send()).await {
            Ok(Ok(())) => {
                self.pending.push_back(sent_at);
                tracing::trace!(%lease_id, "keepalive sent");
            }
            Ok(Err(e)) => {
                return ControlFlow::Break(
                    self.lose_now(LostReason::StreamError(format!("send: {e}"))),
                );
            }
            Err(_) => {
                tracing::debug!(%lease_id, "keepalive send blocked; the health clock decides");
            }
        }
        ControlFlow::Continue(())
    }

    /// Declares the session lost from health `from`.
    fn lose(&mut self, from: Health, reason: LostReason) -> LostReason {
        lost(from, &mut self.clock, &self.out, &self.params, reason)
    }

    /// Declares the session lost from the clock's current state.
    fn lose_now(&mut self, reason: LostReason) -> LostReason {
        let from = self.clock.state();
        self.lose(from, reason)
    }
}

fn publish(t: Transition, out: &Published, params: &KeeperParams, reason: &str) {
    out.health.send_replace(t.to);
    match t.to {
        Health::Healthy => tracing::info!(
            lease_id = %params.lease_id, from = ?t.from, to = ?t.to, reason,
            "lease health changed"
        ),
        _ => tracing::warn!(
            lease_id = %params.lease_id, from = ?t.from, to = ?t.to, reason,
            "lease health changed"
        ),
    }
}

/// Declares the session lost. `clock` may already be `Lost` (a deadline), so the
/// state before is passed in.
fn lost(
    from: Health,
    clock: &mut HealthClock,
    out: &Published,
    params: &KeeperParams,
    reason: LostReason,
) -> LostReason {
    clock.fail();
    let _ = out.lost_reason.set(reason.clone());
    out.health.send_replace(Health::Lost);
    tracing::error!(
        lease_id = %params.lease_id, from = ?from, to = ?Health::Lost, reason = %reason,
        watchdog = ?params.watchdog,
        "lease health changed: session lost"
    );
    if params.watchdog == WatchdogPolicy::AbortProcess {
        tracing::error!(lease_id = %params.lease_id, "watchdog policy AbortProcess: aborting the process");
        std::process::abort();
    }
    out.cancel.cancel();
    reason
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    const TTL: Duration = Duration::from_secs(3);

    /// A scripted transport: each request is answered by the test's responder.
    struct FakeTx(mpsc::Sender<()>);
    struct FakeRx(mpsc::Receiver<Option<Result<i64, String>>>);

    impl KeepAliveSender for FakeTx {
        async fn send(&mut self) -> Result<(), String> {
            self.0.send(()).await.map_err(|e| e.to_string())
        }
    }
    impl KeepAliveReceiver for FakeRx {
        async fn recv(&mut self) -> Option<Result<i64, String>> {
            match self.0.recv().await {
                Some(item) => item,
                None => std::future::pending().await,
            }
        }
    }

    struct Harness {
        requests: mpsc::Receiver<()>,
        answers: mpsc::Sender<Option<Result<i64, String>>>,
        health: watch::Receiver<Health>,
        reason: Arc<OnceLock<LostReason>>,
        cancel: CancellationToken,
        rtt: watch::Receiver<Option<Duration>>,
        task: tokio::task::JoinHandle<LostReason>,
        t0: Instant,
    }

    fn start() -> Harness {
        let (req_tx, requests) = mpsc::channel(64);
        let (answers, ans_rx) = mpsc::channel(64);
        let t0 = Instant::now();
        let (health_tx, health) = watch::channel(Health::Healthy);
        let (deadline_tx, _deadline) = watch::channel(t0);
        let reason = Arc::new(OnceLock::new());
        let cancel = CancellationToken::new();
        let (rtt_tx, rtt) = watch::channel(None);
        let out = Published {
            health: health_tx,
            lost_deadline: deadline_tx,
            lost_reason: reason.clone(),
            cancel: cancel.clone(),
            keepalive_rtt: rtt_tx,
        };
        let params = KeeperParams {
            lease_id: LeaseId::new(1),
            period: TTL / 6,
            watchdog: WatchdogPolicy::CancelJobs,
        };
        let clock = HealthClock::new(t0, TTL / 3, TTL.mul_f64(0.7));
        let task = tokio::spawn(run(FakeTx(req_tx), FakeRx(ans_rx), clock, params, out));
        Harness {
            requests,
            answers,
            health,
            reason,
            cancel,
            rtt,
            task,
            t0,
        }
    }

    /// Records every health change with its instant, relative to t0.
    fn record(h: &Harness) -> tokio::task::JoinHandle<Vec<(Health, Duration)>> {
        let mut rx = h.health.clone();
        let t0 = h.t0;
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while rx.changed().await.is_ok() {
                let s = *rx.borrow_and_update();
                seen.push((s, t0.elapsed()));
                if s == Health::Lost {
                    break;
                }
            }
            seen
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn prompt_answers_stay_healthy_then_silence_degrades_and_loses_on_time() {
        let mut h = start();
        let rec = record(&h);
        // Answer the first 6 requests (sent every 500 ms) after 20 ms each.
        assert_eq!(*h.rtt.borrow(), None, "no round trip before an answer");
        for _ in 0..6 {
            h.requests.recv().await.unwrap();
            tokio::time::sleep(ms(20)).await;
            h.answers.send(Some(Ok(3))).await.unwrap();
        }
        tokio::time::sleep(ms(1)).await;
        assert_eq!(*h.rtt.borrow(), Some(ms(20)), "round trip published");
        // Last answered request was sent at 3000 ms. Now go silent (a hung stream:
        // requests are accepted, nothing comes back).
        let reason = h.task.await.unwrap();
        assert_eq!(
            reason,
            LostReason::Deadline {
                since_last_ack: ms(2100)
            }
        );
        let seen = rec.await.unwrap();
        assert_eq!(
            seen,
            vec![(Health::Degraded, ms(4000)), (Health::Lost, ms(5100))],
            "Degraded at last ack + TTL/3, Lost at last ack + 70% TTL"
        );
        assert!(h.cancel.is_cancelled());
        assert_eq!(h.reason.get(), Some(&reason));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_answer_brings_degraded_back_to_healthy() {
        let mut h = start();
        let rec = record(&h);
        // Request 1 (sent 500 ms) answered promptly.
        h.requests.recv().await.unwrap();
        h.answers.send(Some(Ok(3))).await.unwrap();
        // Requests 2 and 3 (1000, 1500 ms): no answer yet; Degraded at 1500 ms.
        h.requests.recv().await.unwrap();
        h.requests.recv().await.unwrap();
        tokio::time::sleep_until(h.t0 + ms(1700)).await;
        assert_eq!(*h.health.borrow(), Health::Degraded);
        // Both answered at 1700: the newest stamp is 1500 ms, 200 ms old: Healthy.
        h.answers.send(Some(Ok(3))).await.unwrap();
        h.answers.send(Some(Ok(3))).await.unwrap();
        tokio::time::sleep(ms(1)).await;
        assert_eq!(*h.health.borrow(), Health::Healthy);
        h.task.abort();
        let _ = h.task.await;
        let seen = rec.await.unwrap();
        assert_eq!(
            seen,
            vec![(Health::Degraded, ms(1500)), (Health::Healthy, ms(1700))]
        );
        assert!(
            !h.cancel.is_cancelled(),
            "a recovered session keeps its token"
        );
        assert!(h.reason.get().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_zero_is_lost_at_once() {
        let mut h = start();
        h.requests.recv().await.unwrap();
        h.answers.send(Some(Ok(0))).await.unwrap();
        let reason = h.task.await.unwrap();
        assert_eq!(reason, LostReason::Revoked { ttl: 0 });
        assert_eq!(
            h.t0.elapsed(),
            ms(500),
            "lost when the answer came, not at a deadline"
        );
        assert_eq!(*h.health.borrow(), Health::Lost);
        assert!(h.cancel.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn stream_end_and_stream_error_are_lost_at_once() {
        let h = start();
        h.answers.send(None).await.unwrap();
        assert_eq!(h.task.await.unwrap(), LostReason::StreamEnded);
        assert!(h.cancel.is_cancelled());

        let h = start();
        h.answers.send(Some(Err("boom".into()))).await.unwrap();
        assert_eq!(
            h.task.await.unwrap(),
            LostReason::StreamError("boom".into())
        );
        assert_eq!(h.t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_blocked_send_does_not_delay_the_clock() {
        // A request channel that is never drained: every send after the first
        // blocks. The clock must still reach Degraded and Lost exactly on time.
        let (blocked_tx, _keep) = mpsc::channel::<()>(1);
        let (_ans_tx, ans_rx) = mpsc::channel(1);
        let (health_tx, mut health) = watch::channel(Health::Healthy);
        let (deadline_tx, _d) = watch::channel(Instant::now());
        let cancel = CancellationToken::new();
        let out = Published {
            health: health_tx,
            lost_deadline: deadline_tx,
            lost_reason: Arc::new(OnceLock::new()),
            cancel: cancel.clone(),
            keepalive_rtt: watch::channel(None).0,
        };
        let t0 = Instant::now();
        let clock = HealthClock::new(t0, TTL / 3, TTL.mul_f64(0.7));
        let params = KeeperParams {
            lease_id: LeaseId::new(2),
            period: TTL / 6,
            watchdog: WatchdogPolicy::CancelJobs,
        };
        let rec = tokio::spawn(async move {
            let mut seen = Vec::new();
            while health.changed().await.is_ok() {
                seen.push((*health.borrow_and_update(), t0.elapsed()));
            }
            seen
        });
        let reason = run(FakeTx(blocked_tx), FakeRx(ans_rx), clock, params, out).await;
        assert_eq!(
            reason,
            LostReason::Deadline {
                since_last_ack: ms(2100)
            }
        );
        assert_eq!(t0.elapsed(), ms(2100));
        assert_eq!(
            rec.await.unwrap(),
            vec![(Health::Degraded, ms(1000)), (Health::Lost, ms(2100))]
        );
        assert!(cancel.is_cancelled());
    }
}
