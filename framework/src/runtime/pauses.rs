//! Paused job types ([`Client::pause`](crate::Client::pause)): which types
//! are paused, read from `paused_types` every `Tuning::pause_poll`, and the
//! two places a delivery of a paused type waits.
//!
//! A pause never hands a message back: a nak or a renewal would count as a
//! delivery (towards `MaxDeliver`) and could end in the DLQ. So the fetcher
//! asks no paused type's consumer (its messages stay in the stream), a
//! delivery already in hand waits before its lock, and a running job waits
//! between two steps (its current step finishes and commits; the transaction
//! the commit opened for the next step is rolled back, so no row stays
//! locked). Each waiting delivery keeps its message with progress acks and a
//! running job keeps its lock; a shutdown, a partition hand-over, a cancel
//! notice or a lost lease ends the wait as it would end a step.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outcome::{Attempt, Outcome, Owned};
use super::run::JobRun;
use crate::lease::Health;
use crate::queue::Delivery;

/// The paused types as last read.
#[derive(Debug)]
pub(crate) struct Pauses {
    paused: watch::Sender<Arc<BTreeSet<String>>>,
}

impl Default for Pauses {
    fn default() -> Self {
        Pauses {
            paused: watch::Sender::new(Arc::default()),
        }
    }
}

impl Pauses {
    pub(crate) fn is_paused(&self, job_type: &str) -> bool {
        self.paused.borrow().contains(job_type)
    }

    /// Returns once `job_type` is paused (never, if the worker is gone).
    pub(crate) async fn paused(&self, job_type: &str) {
        let mut seen = self.paused.subscribe();
        if seen.wait_for(|p| p.contains(job_type)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Returns once `job_type` is not paused.
    async fn resumed(&self, job_type: &str) {
        let mut seen = self.paused.subscribe();
        let _ = seen.wait_for(|p| !p.contains(job_type)).await;
    }

    /// Reads `paused_types` once; whether the read succeeded.
    pub(crate) async fn refresh(&self, shared: &Shared) -> bool {
        match shared.store.paused_types().await {
            Ok(rows) => {
                let now: BTreeSet<String> = rows.into_iter().map(|r| r.job_type).collect();
                self.paused.send_if_modified(|p| {
                    let changed = **p != now;
                    if changed {
                        tracing::info!(paused = ?now, "paused job types changed");
                        *p = Arc::new(now);
                    }
                    changed
                });
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the paused job types failed");
                false
            }
        }
    }
}

/// Reads the paused types every `Tuning::pause_poll` until `stop`. A read
/// that fails keeps the last known set (warned once per outage).
pub(crate) async fn watch_pauses(shared: Arc<Shared>, stop: CancellationToken) {
    let mut failing = false;
    loop {
        let ok = shared.pauses.refresh(&shared).await;
        if ok == failing {
            if failing {
                tracing::info!("paused job types readable again");
            } else {
                tracing::warn!(
                    "cannot read the paused job types (paused_types: migration 0018 and \
                     the worker's grant); keeping the last known ones"
                );
            }
            failing = !ok;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(shared.cfg.tuning.pause_poll) => {}
        }
    }
}

impl JobRun {
    /// A delivery of a paused type, before its lock: waits for the resume,
    /// keeping its message. A shutdown hands it back; a cancel notice lets it
    /// go on to its claim, which finds the job cancelled.
    pub(super) async fn hold_while_paused(&self, a: &Attempt) -> Result<(), Outcome> {
        let sh = &self.shared;
        if !sh.pauses.is_paused(&a.job_type) {
            return Ok(());
        }
        tracing::info!(job_type = %a.job_type, "job type paused: the delivery waits");
        let cancel = a.cancel.as_ref().map(|c| c.token()).unwrap_or_default();
        let mut ticker = self.progress_ticker();
        loop {
            tokio::select! {
                () = sh.pauses.resumed(&a.job_type) => return Ok(()),
                () = cancel.cancelled() => return Ok(()),
                () = sh.draining.cancelled() => return Err(Outcome::Retry { delay: Duration::ZERO }),
                _ = ticker.tick() => progress(a.delivery()).await,
            }
        }
    }

    /// A running job of a paused type, between two steps: waits for the
    /// resume, holding its lock and message.
    pub(super) async fn wait_between_steps(
        &self,
        owned: &Owned,
        delivery: &Delivery,
    ) -> Result<(), Outcome> {
        let sh = &self.shared;
        let job_type = owned.job.name();
        tracing::info!(
            job_type,
            "job type paused: the job waits before its next step"
        );
        let lost = owned.session.cancellation();
        let handover = owned.partition.as_ref().map(|g| g.handover.clone());
        let handover = handover.unwrap_or_default();
        let release = || {
            Err(Outcome::Release {
                after: Duration::ZERO,
            })
        };
        let mut ticker = self.progress_ticker();
        loop {
            tokio::select! {
                () = sh.pauses.resumed(job_type) => return Ok(()),
                () = owned.cancel.cancelled() => return Err(self.cancel_asked(owned).await),
                () = sh.draining.cancelled() => return release(),
                () = handover.cancelled() => return release(),
                () = lost.cancelled() => return Err(Outcome::LeaveToNextOwner),
                _ = ticker.tick() => {
                    if owned.session.health() == Health::Healthy {
                        progress(delivery).await;
                    }
                }
            }
        }
    }

    /// Ticks at the period of a running step's progress acks.
    fn progress_ticker(&self) -> tokio::time::Interval {
        let cfg = &self.shared.cfg;
        let period = (cfg.ack_wait() / 3).max(cfg.tuning.progress_min_period);
        tokio::time::interval_at(tokio::time::Instant::now() + period, period)
    }
}

async fn progress(delivery: &Delivery) {
    if let Err(e) = delivery.progress().await {
        tracing::debug!(error = %e, "progress ack failed");
    }
}
