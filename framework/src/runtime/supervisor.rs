//! `WorkerSupervisor`, the root of a worker's actor tree: it starts the
//! `LeaseKeeper` and the `Fetcher`, restarts a failed fetcher, stops the
//! worker when the keeper fails, and closes the session when asked.

use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};

use super::Shared;
use super::fetcher::{Fetcher, FetcherArgs, FetcherMsg};
use super::keeper::{KeeperArgs, KeeperMsg, LeaseKeeper};
use super::routes::TypeRoutes;
use super::slots::Slots;

pub(super) struct SupervisorArgs {
    pub(super) shared: Arc<Shared>,
    pub(super) slots: Arc<Slots>,
    pub(super) routes: Arc<TypeRoutes>,
    pub(super) keeper: Option<KeeperArgs>,
}

pub(crate) enum SupervisorMsg {
    CloseSession(ractor::RpcReplyPort<()>),
}

pub(super) struct SupervisorState {
    args: SupervisorArgs,
    keeper: Option<ActorRef<KeeperMsg>>,
    fetcher: Option<ActorRef<FetcherMsg>>,
}

/// The root of a worker's actor tree.
pub(super) struct WorkerSupervisor;

impl WorkerSupervisor {
    async fn spawn_fetcher(
        myself: &ActorRef<SupervisorMsg>,
        st: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let args = FetcherArgs {
            shared: st.args.shared.clone(),
            slots: st.args.slots.clone(),
            routes: st.args.routes.clone(),
            supervisor: myself.get_cell(),
        };
        let (fetcher, _) = Actor::spawn_linked(None, Fetcher, args, myself.get_cell()).await?;
        st.fetcher = Some(fetcher);
        Ok(())
    }
}

impl Actor for WorkerSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        mut args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let keeper_args = args.keeper.take();
        let mut st = SupervisorState {
            args,
            keeper: None,
            fetcher: None,
        };
        if let Some(k) = keeper_args {
            let (keeper, _) = Actor::spawn_linked(None, LeaseKeeper, k, myself.get_cell()).await?;
            st.keeper = Some(keeper);
        }
        Self::spawn_fetcher(&myself, &mut st).await?;
        Ok(st)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: SupervisorMsg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::CloseSession(reply) => {
                if let Some(keeper) = &st.keeper {
                    let _ = ractor::call!(keeper, KeeperMsg::Close);
                }
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let is = |cell: &ActorCell, r: &Option<ActorRef<FetcherMsg>>| {
            r.as_ref().is_some_and(|f| f.get_id() == cell.get_id())
        };
        match event {
            SupervisionEvent::ActorFailed(who, err) => {
                if is(&who, &st.fetcher) {
                    tracing::error!(error = %err, "fetcher failed; restarting it");
                    if !st.args.shared.draining.is_cancelled() {
                        Self::spawn_fetcher(&myself, st).await?;
                    }
                } else if st
                    .keeper
                    .as_ref()
                    .is_some_and(|k| k.get_id() == who.get_id())
                {
                    tracing::error!(error = %err, "lease keeper failed; stopping the worker");
                    myself.stop(Some("lease keeper failed".into()));
                } else {
                    // A job actor failed outside a step (a bug): its delivery is
                    // redelivered after AckWait; the worker stays up.
                    tracing::error!(actor = %who.get_id(), error = %err, "job actor failed");
                }
            }
            SupervisionEvent::ActorTerminated(..) | SupervisionEvent::ActorStarted(_) => {}
            _ => {}
        }
        Ok(())
    }
}
