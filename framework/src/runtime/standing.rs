//! Partition mode: whether this worker can work its partitions, i.e. reach
//! PostgreSQL and NATS, though etcd sees it alive.
//!
//! The runtime reports every failure that says a server may be unreachable
//! (an admission read, a claim, a fetch); from the first one, the server is
//! *suspected* and probed every `Tuning::server_probe`. A probe sent after
//! the first failure that answers in time clears the suspicion. A server
//! suspected for [`Config::stand_down_after`](crate::Config::stand_down_after)
//! (about a TTL) makes the worker [`Standing::StoodDown`]: the rebalancer
//! hands its partitions back and leaves the members, so the other workers'
//! fair shares cover them. It is [`Standing::Ready`] again, and rejoins, once
//! no server is suspected.
//!
//! [`StandingClock`] holds these decisions, pure (instants in, transitions
//! out); [`keep`] is the loop that probes and publishes, its I/O behind
//! [`Probe`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A server the worker needs besides etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    Postgres,
    Nats,
}

impl Server {
    const ALL: [Server; 2] = [Server::Postgres, Server::Nats];

    fn index(self) -> usize {
        match self {
            Server::Postgres => 0,
            Server::Nats => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Server::Postgres => "PostgreSQL",
            Server::Nats => "NATS",
        }
    }
}

/// Whether the worker takes a share of the partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Both servers reachable (none suspected past the bound): a member with
    /// a fair share.
    Ready,
    /// A server was unreachable for the bound: no member, no share, until no
    /// server is suspected.
    StoodDown,
}

/// The standing as the failures and probes say, on the monotonic clock.
#[derive(Debug, Clone)]
pub(crate) struct StandingClock {
    bound: Duration,
    /// Per server, the first failure not cleared by a later probe.
    suspected_since: [Option<Instant>; 2],
    standing: Standing,
}

impl StandingClock {
    /// A ready clock that stands down after `bound` of suspicion.
    pub(crate) fn new(bound: Duration) -> Self {
        StandingClock {
            bound,
            suspected_since: [None; 2],
            standing: Standing::Ready,
        }
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn standing(&self) -> Standing {
        self.standing
    }

    /// The servers suspected now.
    pub(crate) fn suspected(&self) -> Vec<Server> {
        Server::ALL
            .into_iter()
            .filter(|s| self.suspected_since[s.index()].is_some())
            .collect()
    }

    /// When [`poll`](Self::poll) stands a ready worker down, if a server is
    /// suspected.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let first = self.suspected_since.iter().flatten().min()?;
        (self.standing == Standing::Ready).then_some(*first + self.bound)
    }

    /// A failure reaching `server` at `at`: suspected from `at` unless it
    /// already was (the earlier instant counts).
    pub(crate) fn failed(&mut self, server: Server, at: Instant) -> Option<Standing> {
        let since = &mut self.suspected_since[server.index()];
        if since.is_none() {
            *since = Some(at);
        }
        self.poll(at)
    }

    /// A probe of `server` sent at `sent_at` answered: it clears a suspicion
    /// that began no later than the probe was sent (a failure reported after
    /// the probe left may be news the probe does not answer). With no server
    /// suspected, a stood-down worker is ready again.
    pub(crate) fn reached(&mut self, server: Server, sent_at: Instant) -> Option<Standing> {
        let since = &mut self.suspected_since[server.index()];
        if since.is_some_and(|s| s <= sent_at) {
            *since = None;
        }
        let clear = self.suspected_since.iter().all(Option::is_none);
        (clear && self.standing == Standing::StoodDown).then(|| self.set(Standing::Ready))
    }

    /// Applies the bound at `now`: a server suspected for `bound` stands the
    /// worker down.
    pub(crate) fn poll(&mut self, now: Instant) -> Option<Standing> {
        let due = self.deadline().is_some_and(|d| now >= d);
        due.then(|| self.set(Standing::StoodDown))
    }

    fn set(&mut self, to: Standing) -> Standing {
        self.standing = to;
        to
    }
}

/// Probes a server: whether it answered (the caller bounds the time).
pub(crate) trait Probe: Send + Sync + 'static {
    fn probe(&self, server: Server) -> BoxFuture<'_, bool>;
}

/// The worker's standing: failures in (from any task), standing out.
#[derive(Debug)]
pub(crate) struct Reachability {
    clock: Mutex<StandingClock>,
    /// Wakes [`keep`] at a failure (a permit is kept if it is busy).
    news: Notify,
    standing: watch::Sender<Standing>,
}

impl Reachability {
    pub(crate) fn new(bound: Duration) -> Arc<Self> {
        Arc::new(Reachability {
            clock: Mutex::new(StandingClock::new(bound)),
            news: Notify::new(),
            standing: watch::Sender::new(Standing::Ready),
        })
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, StandingClock> {
        self.clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call to `server` failed in a way that may mean it is unreachable.
    pub(crate) fn failed(&self, server: Server) {
        let change = self.clock().failed(server, Instant::now());
        self.publish(change);
        self.news.notify_one();
    }

    /// Every change of the standing.
    pub(crate) fn watch(&self) -> watch::Receiver<Standing> {
        self.standing.subscribe()
    }

    fn publish(&self, change: Option<Standing>) {
        let Some(to) = change else { return };
        let suspected: Vec<&str> = self.clock().suspected().iter().map(|s| s.name()).collect();
        match to {
            Standing::StoodDown => tracing::warn!(
                ?suspected,
                "unreachable past the bound: handing the partitions back until reachable again"
            ),
            Standing::Ready => tracing::info!("reachable again: taking a share of the partitions"),
        }
        self.standing.send_replace(to);
    }
}

/// Until `stop`: while a server is suspected, probes it every `period`
/// (each probe bounded by `period`), applies the bound, and publishes every
/// change; sleeps until the next failure otherwise.
pub(crate) async fn keep(
    reach: Arc<Reachability>,
    probe: impl Probe,
    period: Duration,
    stop: CancellationToken,
) {
    loop {
        let suspected = reach.clock().suspected();
        if suspected.is_empty() {
            tokio::select! {
                () = stop.cancelled() => return,
                () = reach.news.notified() => continue,
            }
        }
        let sent = Instant::now();
        for server in suspected {
            let answered = tokio::time::timeout(period, probe.probe(server)).await;
            if answered.unwrap_or(false) {
                let change = reach.clock().reached(server, sent);
                reach.publish(change);
            }
        }
        let next = sent + period;
        let wake = reach.clock().deadline().map_or(next, |d| d.min(next));
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(wake) => {}
        }
        let change = reach.clock().poll(Instant::now());
        reach.publish(change);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    const BOUND: Duration = Duration::from_secs(3);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_suspected_for_the_bound_stands_the_worker_down() {
        let t0 = Instant::now();
        let mut c = StandingClock::new(BOUND);
        assert_eq!(c.deadline(), None, "nothing suspected, nothing due");
        assert_eq!(c.failed(Server::Postgres, t0), None);
        // A later failure does not move the start of the suspicion.
        assert_eq!(c.failed(Server::Postgres, t0 + ms(2000)), None);
        assert_eq!(c.deadline(), Some(t0 + BOUND));
        assert_eq!(c.poll(t0 + ms(2999)), None);
        assert_eq!(c.poll(t0 + BOUND), Some(Standing::StoodDown));
        assert_eq!(c.standing(), Standing::StoodDown);
        assert_eq!(c.deadline(), None, "stood down: nothing more is due");
        assert_eq!(c.poll(t0 + ms(9000)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_answers_clears_the_suspicion_before_the_bound() {
        let t0 = Instant::now();
        let mut c = StandingClock::new(BOUND);
        c.failed(Server::Nats, t0);
        assert_eq!(c.suspected(), [Server::Nats]);
        assert_eq!(c.reached(Server::Nats, t0 + ms(500)), None);
        assert!(c.suspected().is_empty());
        assert_eq!(c.poll(t0 + ms(5000)), None, "cleared: never stands down");
        assert_eq!(c.standing(), Standing::Ready);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_sent_before_the_failure_clears_nothing() {
        let t0 = Instant::now();
        let mut c = StandingClock::new(BOUND);
        // The probe left at t0, the failure came at t0 + 100 ms, then the
        // probe's answer: the failure is news the probe cannot answer.
        c.failed(Server::Postgres, t0 + ms(100));
        assert_eq!(c.reached(Server::Postgres, t0), None);
        assert_eq!(c.suspected(), [Server::Postgres]);
        assert_eq!(c.poll(t0 + ms(3100)), Some(Standing::StoodDown));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stood_down_worker_is_ready_once_no_server_is_suspected() {
        let t0 = Instant::now();
        let mut c = StandingClock::new(BOUND);
        c.failed(Server::Postgres, t0);
        c.failed(Server::Nats, t0 + ms(1000));
        assert_eq!(c.poll(t0 + BOUND), Some(Standing::StoodDown));
        assert_eq!(
            c.reached(Server::Postgres, t0 + ms(4000)),
            None,
            "NATS still suspected"
        );
        assert_eq!(
            c.reached(Server::Nats, t0 + ms(4500)),
            Some(Standing::Ready)
        );
        // Suspected again later: a whole bound again before it stands down.
        c.failed(Server::Nats, t0 + ms(6000));
        assert_eq!(c.poll(t0 + ms(8999)), None);
        assert_eq!(c.poll(t0 + ms(9000)), Some(Standing::StoodDown));
    }

    /// A probe that answers once `up` is set.
    struct Switch(Arc<AtomicBool>);

    impl Probe for Switch {
        fn probe(&self, _server: Server) -> BoxFuture<'_, bool> {
            let up = self.0.load(Ordering::SeqCst);
            Box::pin(async move { up })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_stands_down_after_the_bound_and_comes_back_at_a_probe() {
        let reach = Reachability::new(BOUND);
        let up = Arc::new(AtomicBool::new(false));
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(
            reach.clone(),
            Switch(up.clone()),
            ms(500),
            stop.clone(),
        ));
        let mut standing = reach.watch();
        let t0 = Instant::now();
        reach.failed(Server::Postgres);
        standing.changed().await.unwrap();
        assert_eq!(*standing.borrow(), Standing::StoodDown);
        let took = t0.elapsed();
        assert!(took >= BOUND && took <= BOUND + ms(10), "{took:?}");
        up.store(true, Ordering::SeqCst);
        standing.changed().await.unwrap();
        assert_eq!(*standing.borrow(), Standing::Ready);
        assert!(t0.elapsed() <= BOUND + ms(510), "{:?}", t0.elapsed());
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_the_next_probe_answers_never_stands_down() {
        let reach = Reachability::new(BOUND);
        let stop = CancellationToken::new();
        let up = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(keep(reach.clone(), Switch(up), ms(500), stop.clone()));
        let standing = reach.watch();
        tokio::task::yield_now().await;
        reach.failed(Server::Nats);
        tokio::time::sleep(BOUND * 3).await;
        assert_eq!(*standing.borrow(), Standing::Ready);
        assert!(reach.clock().suspected().is_empty());
        stop.cancel();
        task.await.unwrap();
    }
}
