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
use crate::queue::CancelNotices;

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
        if let Ok(mut map) = self.cancels.0.lock() {
            if let Some(entry) = map.get_mut(&self.job_id) {
                entry.watchers = entry.watchers.saturating_sub(1);
                if entry.watchers == 0 {
                    map.remove(&self.job_id);
                }
            }
        }
    }
}

/// The worker's listener: fires the watch of each job a notice names, until
/// `stop` or the subscription ends.
pub(crate) async fn listen(mut notices: CancelNotices, cancels: Cancels, stop: CancellationToken) {
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = notices.next() => next,
        };
        let Some(job_id) = next else {
            tracing::warn!("the cancel notice subscription ended");
            return;
        };
        if cancels.notify(job_id) {
            tracing::info!(%job_id, "operator cancel notice: cancelling the job's running step");
        }
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
