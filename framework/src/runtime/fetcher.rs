//! `Fetcher`: pulls deliveries from JetStream only while the session is
//! `Healthy`, as many as the worker's [`Slots`] allow (at most
//! `Config::max_in_flight` running, up to `Config::prefetch` more locked and
//! waiting, fetched in groups), and spawns one `JobActor` per delivery under the
//! supervisor.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

use super::Shared;
use super::job_actor::{JobActor, JobArgs};
use super::slots::Slots;
use crate::JobId;
use crate::fence::JobRow;
use crate::lease::Health;
use crate::queue::Delivery;

pub(crate) struct FetcherArgs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) slots: Arc<Slots>,
    pub(crate) supervisor: ActorCell,
}

pub(crate) enum FetcherMsg {
    Tick,
}

pub(crate) struct Fetcher;

impl Actor for Fetcher {
    type Msg = FetcherMsg;
    type State = FetcherArgs;
    type Arguments = FetcherArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: FetcherArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_message(FetcherMsg::Tick)?;
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        _msg: FetcherMsg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let sh = &st.shared;
        if sh.draining.is_cancelled() {
            return Ok(());
        }
        // Fetch only while the session is Healthy.
        if sh.healthy_session().is_none() {
            let mut current = sh.session.clone();
            tokio::select! {
                () = sh.draining.cancelled() => return Ok(()),
                _ = current.changed() => {}
                () = wait_healthy(sh) => {}
                () = tokio::time::sleep(sh.cfg.tuning.fetch_unhealthy_recheck) => {}
            }
            myself.send_message(FetcherMsg::Tick)?;
            return Ok(());
        }
        let mut holds = tokio::select! {
            () = sh.draining.cancelled() => return Ok(()),
            h = st.slots.to_fetch() => h,
        };
        let fetched = tokio::select! {
            () = sh.draining.cancelled() => return Ok(()),
            r = sh.queue.fetch(holds.len(), sh.cfg.tuning.fetch_wait) => r,
        };
        match fetched {
            Ok(deliveries) => {
                let mut rows = admission_rows(sh, &deliveries).await;
                for delivery in deliveries {
                    let Some(hold) = holds.pop() else {
                        tracing::error!(
                            "queue returned more deliveries than asked for; the extra is redelivered"
                        );
                        break;
                    };
                    let admitted = match (&mut rows, delivery.job_id()) {
                        (Some(rows), Ok(id)) => Some(rows.remove(&id)),
                        _ => None,
                    };
                    let args = JobArgs {
                        shared: st.shared.clone(),
                        admitted,
                        delivery,
                        hold,
                    };
                    if let Err(e) =
                        Actor::spawn_linked(None, JobActor, args, st.supervisor.clone()).await
                    {
                        tracing::error!(error = %e, "cannot spawn a job actor; the delivery is redelivered after AckWait");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "fetch failed; retrying");
                tokio::time::sleep(st.shared.cfg.tuning.fetch_error_pause).await;
            }
        }
        myself.send_message(FetcherMsg::Tick)?;
        Ok(())
    }
}

/// The job rows of a group of deliveries, read in one query (the admission
/// reads of the whole group). `None` if the read failed: each job actor then
/// reads its own row (and retries the delivery if that fails too).
async fn admission_rows(sh: &Shared, deliveries: &[Delivery]) -> Option<HashMap<JobId, JobRow>> {
    let ids: Vec<JobId> = deliveries.iter().filter_map(|d| d.job_id().ok()).collect();
    if ids.is_empty() {
        return None;
    }
    match sh.store.jobs(&ids).await {
        Ok(rows) => Some(rows.into_iter().map(|r| (r.id, r)).collect()),
        Err(e) => {
            tracing::warn!(error = %e, jobs = ids.len(), "reading a group's job rows failed; each job reads its own");
            None
        }
    }
}

async fn wait_healthy(sh: &Shared) {
    let session = sh.session.borrow().clone();
    if let Some(session) = session {
        let mut h = session.watch_health();
        let _ = h.wait_for(|h| *h == Health::Healthy).await;
    } else {
        std::future::pending::<()>().await;
    }
}
