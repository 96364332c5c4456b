//! What every phase of a delivery's life shares: [`JobRun`], the handle whose
//! `impl` blocks are the phases (`job_actor.rs`, `compensate.rs`,
//! `outcome.rs`), and [`Holding`], a job actor's entry in the worker's map of
//! jobs in hand. Below those three files, so their imports go one way:
//! `job_actor` uses `compensate` and `outcome`, `compensate` uses `outcome`.

use std::sync::Arc;

use super::Shared;
use super::slots::Slots;
use crate::JobId;

/// One job actor's run of a delivery.
pub(super) struct JobRun {
    pub(super) shared: Arc<Shared>,
    pub(super) me: ractor::ActorCell,
    pub(super) slots: Arc<Slots>,
}

/// A job actor's entry in [`Shared::holding`](super::Shared), from before it
/// asks for the job's lock until the actor ends.
pub(super) struct Holding {
    shared: Arc<Shared>,
    job_id: JobId,
}

impl Holding {
    pub(super) fn start(shared: Arc<Shared>, job_id: JobId) -> Self {
        if let Ok(mut held) = shared.holding.lock() {
            *held.entry(job_id).or_default() += 1;
        }
        Holding { shared, job_id }
    }

    /// Whether another job actor of this worker (besides the caller's own entry)
    /// works on `job_id`. A poisoned map says yes: never delete a lock that may
    /// be in use.
    pub(super) fn others_hold(shared: &Shared, job_id: JobId) -> bool {
        shared
            .holding
            .lock()
            .map_or(true, |held| held.get(&job_id).is_some_and(|n| *n > 1))
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if let Ok(mut held) = self.shared.holding.lock()
            && let Some(n) = held.get_mut(&self.job_id)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.job_id);
            }
        }
    }
}
