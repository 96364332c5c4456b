//! `StageActor`: runs one step function under its [`StepCtx`].
//!
//! One actor per step, linked to its `JobActor`. A panic in the user's step is
//! caught and becomes a retryable failure of this attempt; the context (and with it
//! the fenced transaction) is dropped, which rolls the transaction back.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use super::registry::DynJob;
use crate::StepIndex;
use crate::job::{BoxFuture, StepCtx, StepError, StepTimedOut, StepTimeout};

/// What a stage hands back: the context (unless the step panicked) and the result.
pub(crate) struct StageOutcome {
    pub(crate) ctx: Option<StepCtx>,
    pub(crate) result: Result<serde_json::Value, StepError>,
}

pub(crate) struct StageArgs {
    pub(crate) job: Arc<dyn DynJob>,
    pub(crate) step: StepIndex,
    pub(crate) ctx: StepCtx,
    pub(crate) input: serde_json::Value,
    pub(crate) reply: oneshot::Sender<StageOutcome>,
}

pub(crate) struct StageActor;

pub(crate) enum StageMsg {
    Run,
}

impl Actor for StageActor {
    type Msg = StageMsg;
    type State = Option<StageArgs>;
    type Arguments = StageArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: StageArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_message(StageMsg::Run)?;
        Ok(Some(args))
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        _msg: StageMsg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(args) = state.take() {
            let StageArgs {
                job,
                step,
                mut ctx,
                input,
                reply,
            } = args;
            let limit = job.step_timeout(step);
            let name = ctx.step_name();
            let running = within(limit, step, name, job.run_step(step, &mut ctx, input));
            let run = AssertUnwindSafe(running).catch_unwind().await;
            let outcome = match run {
                Ok(result) => StageOutcome {
                    ctx: Some(ctx),
                    result,
                },
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "non-string panic payload".into());
                    tracing::error!(step = %step, panic = %what, "step panicked");
                    StageOutcome {
                        ctx: None,
                        result: Err(StepError::retryable(format!("step panicked: {what}"))),
                    }
                }
            };
            // The job actor may have given up waiting (shutdown); nothing to do then.
            let _ = reply.send(outcome);
        }
        myself.stop(None);
        Ok(())
    }
}

/// The step's future, stopped (dropped at its next `.await`) at its
/// [`StepTimeout`], if it has one: then the attempt's error is a
/// [`StepTimedOut`].
async fn within(
    limit: Option<StepTimeout>,
    step: StepIndex,
    name: &'static str,
    running: BoxFuture<'_, Result<serde_json::Value, StepError>>,
) -> Result<serde_json::Value, StepError> {
    let Some(t) = limit else {
        return running.await;
    };
    match tokio::time::timeout(t.limit, running).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(step = %step, name, limit = ?t.limit, "step ran past its timeout; stopped");
            let limit = t.limit;
            Err(StepTimedOut { step, name, limit }.into_step_error(t.on_timeout))
        }
    }
}

/// Runs one step in a fresh `StageActor` linked to `parent` and waits for it.
pub(crate) async fn run_stage(
    parent: ractor::ActorCell,
    job: Arc<dyn DynJob>,
    step: StepIndex,
    ctx: StepCtx,
    input: serde_json::Value,
) -> StageOutcome {
    let (tx, rx) = oneshot::channel();
    let args = StageArgs {
        job,
        step,
        ctx,
        input,
        reply: tx,
    };
    match Actor::spawn_linked(None, StageActor, args, parent).await {
        Ok(_) => match rx.await {
            Ok(outcome) => outcome,
            Err(_) => StageOutcome {
                ctx: None,
                result: Err(StepError::retryable("stage actor died before replying")),
            },
        },
        Err(e) => StageOutcome {
            ctx: None,
            result: Err(StepError::retryable(format!(
                "cannot spawn stage actor: {e}"
            ))),
        },
    }
}
