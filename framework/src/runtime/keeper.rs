//! `LeaseKeeper`: owns the worker's etcd session. Publishes the current session
//! (or none) to the rest of the worker, and forms a new session with backoff and
//! jitter after the old one is lost.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::Config;
use crate::lease::{Health, Session};
use crate::telemetry::Metrics;

pub(crate) struct KeeperArgs {
    pub(crate) cfg: Config,
    pub(crate) metrics: Metrics,
    pub(crate) current: watch::Sender<Option<Arc<Session>>>,
    pub(crate) stop: CancellationToken,
    /// Filled with the first session before the keeper's `pre_start` returns.
    pub(crate) first: Option<Session>,
}

pub(crate) enum KeeperMsg {
    /// The watched session reached `Lost`.
    Lost(u64),
    /// A new session was formed.
    Established(Box<Session>),
    /// Revoke the session (graceful shutdown; all job locks go with it).
    Close(ractor::RpcReplyPort<()>),
}

pub(crate) struct KeeperState {
    args: KeeperArgs,
    generation: u64,
    tasks: tokio::task::JoinSet<()>,
}

pub(crate) struct LeaseKeeper;

impl Actor for LeaseKeeper {
    type Msg = KeeperMsg;
    type State = KeeperState;
    type Arguments = KeeperArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        mut args: KeeperArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let first = args.first.take();
        let mut state = KeeperState {
            args,
            generation: 0,
            tasks: tokio::task::JoinSet::new(),
        };
        if let Some(session) = first {
            install(&myself, &mut state, session);
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: KeeperMsg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            KeeperMsg::Lost(generation) if generation == state.generation => {
                let old = state.args.current.send_replace(None);
                if state.args.stop.is_cancelled() {
                    return Ok(());
                }
                let reason = old.as_ref().and_then(|s| s.lost_reason());
                let cause = reason.as_ref().map_or("keeper_stopped", |r| r.code());
                state.args.metrics.lease_lost(cause);
                tracing::warn!(
                    worker = %state.args.cfg.worker_id,
                    lease_id = %old.as_ref().map(|s| s.lease_id().to_string()).unwrap_or_default(),
                    cause,
                    reason = %reason.map(|r| r.to_string()).unwrap_or_else(|| "keepalive task stopped".into()),
                    "session lost: its jobs' steps are cancelled and their locks left to expire; \
                     forming a new session with backoff"
                );
                let cfg = state.args.cfg.clone();
                let stop = state.args.stop.clone();
                let me = myself.clone();
                spawn_reaping(&mut state.tasks, async move {
                    match Session::establish_with_backoff(&cfg, &stop).await {
                        Ok(s) => {
                            let _ = me.send_message(KeeperMsg::Established(Box::new(s)));
                        }
                        Err(e) => tracing::info!(error = %e, "no new session (shutting down?)"),
                    }
                });
            }
            KeeperMsg::Lost(_) => {}
            KeeperMsg::Established(session) => {
                if state.args.stop.is_cancelled() {
                    let _ = session.close().await;
                } else {
                    install(&myself, state, *session);
                }
            }
            KeeperMsg::Close(reply) => {
                state.generation += 1;
                if let Some(session) = state.args.current.send_replace(None) {
                    match release_session(session).await {
                        Ok(session) => {
                            if let Err(e) = session.close().await {
                                tracing::warn!(error = %e, "revoking the session failed; it expires with its TTL");
                            }
                        }
                        Err(_) => tracing::info!(
                            "session still referenced by running jobs; it expires with its TTL"
                        ),
                    }
                }
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.tasks.abort_all();
        Ok(())
    }
}

/// Publishes `session` and watches it until it is lost.
fn install(myself: &ActorRef<KeeperMsg>, state: &mut KeeperState, session: Session) {
    state.generation += 1;
    let generation = state.generation;
    state.args.metrics.lease_granted();
    state.args.metrics.lease_state(level(Health::Healthy));
    let mut health = session.watch_health();
    let mut rtt = session.watch_keepalive_rtt();
    let metrics = state.args.metrics.clone();
    tracing::info!(lease_id = %session.lease_id(), worker = %state.args.cfg.worker_id, "session established");
    state.args.current.send_replace(Some(Arc::new(session)));
    let me = myself.clone();
    spawn_reaping(&mut state.tasks, async move {
        let mut last = *health.borrow();
        let mut rtt_open = true;
        loop {
            tokio::select! {
                changed = rtt.changed(), if rtt_open => {
                    match changed {
                        Ok(()) => {
                            if let Some(d) = *rtt.borrow_and_update() {
                                metrics.keepalive_rtt(d.as_secs_f64());
                            }
                        }
                        Err(_) => rtt_open = false,
                    }
                    continue;
                }
                changed = health.changed() => {
                    if changed.is_err() {
                        // The session (and its keepalive) is gone: treat as lost.
                        let _ = me.send_message(KeeperMsg::Lost(generation));
                        return;
                    }
                }
            }
            let now = *health.borrow_and_update();
            if now != last {
                metrics.lease_transition(last.as_str(), now.as_str(), level(now));
                last = now;
            }
            if now == Health::Lost {
                let _ = me.send_message(KeeperMsg::Lost(generation));
                return;
            }
        }
    });
}

/// Spawns `task` into `tasks` after collecting the tasks that have ended, so a
/// worker that loses and re-forms its session many times keeps only the tasks
/// still running (a `JoinSet` keeps every ended task until it is joined). A task
/// that panicked is logged.
fn spawn_reaping<F>(tasks: &mut tokio::task::JoinSet<()>, task: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    while let Some(ended) = tasks.try_join_next() {
        if let Err(e) = ended
            && e.is_panic()
        {
            tracing::error!(error = %e, "a lease keeper task panicked");
        }
    }
    tasks.spawn(task);
}

fn level(h: Health) -> i64 {
    match h {
        Health::Healthy => 0,
        Health::Degraded => 1,
        Health::Lost => 2,
    }
}

/// The session, once every other holder (a task that has just been told there
/// is no session any more) dropped it; given up after a moment.
async fn release_session(mut session: Arc<Session>) -> Result<Session, Arc<Session>> {
    for _ in 0..100 {
        match Arc::try_unwrap(session) {
            Ok(s) => return Ok(s),
            Err(shared) => session = shared,
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Arc::try_unwrap(session)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ended_tasks_are_collected_before_each_spawn() {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..100 {
            let (ended, wait) = tokio::sync::oneshot::channel();
            spawn_reaping(&mut tasks, async move {
                let _ = ended.send(());
            });
            wait.await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        // With a plain `spawn` all 100 ended tasks would still be held.
        assert!(tasks.len() <= 2, "{} tasks kept", tasks.len());
    }
}
