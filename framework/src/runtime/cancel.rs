//! Operator cancel on the worker side: one subscription per worker to the
//! namespace's cancel notices (`queue::CancelNotices`), mapped to the
//! cancellation of each delivery of that job in flight here. The notice only
//! makes the running step stop early; what ends the job is the row
//! (`cancelled`, written by `FenceStore::cancel_job`), which `steps` checks
//! before it acks (see `JobRun::cancel_asked`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::JobId;
use crate::blocks::fence::FenceStore;
use crate::queue::CancelNotices;
use crate::telemetry::Metrics;

/// The jobs in flight in this worker that a cancel notice can reach.
#[derive(Clone, Default)]
pub(crate) struct Cancels(Arc<Mutex<HashMap<JobId, Entry>>>);

struct Entry {
    /// Deliveries of the job watching (usually one).
    watchers: u32,
    token: CancellationToken,
}

impl Cancels {
    /// A delivery's watch on cancels of `job_id`, until it is dropped.
    pub(crate) fn watch(&self, job_id: JobId) -> CancelWatch {
        let token = match self.0.lock() {
            Ok(mut map) => {
                let entry = map.entry(job_id).or_insert_with(|| Entry {
                    watchers: 0,
                    token: CancellationToken::new(),
                });
                entry.watchers += 1;
                entry.token.clone()
            }
            // A poisoned map: this delivery is not reachable by a notice; the
            // cancel still holds at the row.
            Err(_) => CancellationToken::new(),
        };
        CancelWatch {
            cancels: self.clone(),
            job_id,
            token,
        }
    }

    /// Whether a delivery of `job_id` here watches for cancels.
    fn watched(&self, job_id: JobId) -> bool {
        self.0.lock().is_ok_and(|m| m.contains_key(&job_id))
    }

    /// Fires the cancellation of `job_id`'s deliveries here; whether any watched.
    fn notify(&self, job_id: JobId) -> bool {
        let map = self.0.lock();
        match map.as_ref().ok().and_then(|m| m.get(&job_id)) {
            Some(entry) => {
                entry.token.cancel();
                true
            }
            None => false,
        }
    }
}

/// One delivery's watch on operator cancels of its job.
pub(crate) struct CancelWatch {
    cancels: Cancels,
    job_id: JobId,
    token: CancellationToken,
}

impl CancelWatch {
    /// Fired when a cancel notice for the job arrived.
    pub(crate) fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}

impl Drop for CancelWatch {
    fn drop(&mut self) {
        if let Ok(mut map) = self.cancels.0.lock()
            && let Some(entry) = map.get_mut(&self.job_id)
        {
            entry.watchers = entry.watchers.saturating_sub(1);
            if entry.watchers == 0 {
                map.remove(&self.job_id);
            }
        }
    }
}

/// The worker's listener: fires the watch of each job a notice names, until
/// `stop` or the subscription ends; only once the cancel is confirmed through
/// PostgreSQL ([`FenceStore::cancel_confirmed`]: its cancel key is held or
/// its row is `cancelled`). An unconfirmed notice (forged by anyone who may
/// publish on the subject) is counted and logged, and the step goes on.
pub(crate) async fn listen(
    mut notices: CancelNotices,
    cancels: Cancels,
    confirm: Confirm,
    stop: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = notices.next() => next,
        };
        let Some(job_id) = next else {
            tracing::warn!("the cancel notice subscription ended");
            return;
        };
        if !cancels.watched(job_id) {
            continue;
        }
        // Checked apart from the loop: a slow check delays no other notice.
        let (cancels, confirm) = (cancels.clone(), confirm.clone());
        tokio::spawn(async move {
            if confirm.confirmed(job_id).await && cancels.notify(job_id) {
                tracing::info!(%job_id, "operator cancel notice: cancelling the job's running step");
            }
        });
    }
}

/// What confirms a cancel notice: the store, and where an unconfirmed one is counted.
#[derive(Clone)]
pub(crate) struct Confirm {
    pub(crate) store: FenceStore,
    pub(crate) metrics: Metrics,
}

impl Confirm {
    async fn confirmed(&self, job_id: JobId) -> bool {
        let why = match self.store.cancel_confirmed(job_id).await {
            Ok(true) => return true,
            Ok(false) => "no cancel holds its key and its row is not cancelled".to_string(),
            Err(e) => format!("the check failed: {e}"),
        };
        self.metrics.cancel_unconfirmed();
        tracing::warn!(%job_id, why, "cancel notice not confirmed, ignored: the step goes on");
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_reaches_every_watch_of_its_job_and_only_while_watched() {
        let cancels = Cancels::default();
        let (a, b) = (JobId::from_key("t", "a"), JobId::from_key("t", "b"));
        let wa1 = cancels.watch(a);
        let wa2 = cancels.watch(a);
        let wb = cancels.watch(b);
        assert!(cancels.notify(a));
        assert!(wa1.token().is_cancelled() && wa2.token().is_cancelled());
        assert!(!wb.token().is_cancelled());
        drop((wa1, wa2));
        assert!(!cancels.notify(a), "no watch left");
        assert!(
            !cancels.watch(a).token().is_cancelled(),
            "a new watch starts fresh"
        );
    }
}
