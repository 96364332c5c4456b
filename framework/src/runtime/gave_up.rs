//! Jobs the broker gave up on (JetStream `MaxDeliver`): a worker marks
//! their rows `dead` before the advisory listener dead-letters and deletes
//! the message, unless a live owner holds the job (then the message is
//! renewed), so no row stays `pending` or `running` with no message behind it.

use std::sync::Arc;

use super::{Shared, outcome};
use crate::fence::FenceError;

/// Messages the broker gives up on (MaxDeliver): their rows are marked dead
/// here first, and only then does the listener dead-letter and delete the
/// message, so no row stays `pending`/`running` with no message behind it.
pub(super) fn spawn_gave_up_marking(
    shared: &Arc<Shared>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> crate::queue::AdvisoryListener {
    let (gave_up_tx, mut gave_up_rx) = tokio::sync::mpsc::channel::<crate::queue::GaveUpNotice>(64);
    let advisories = shared
        .queue
        .spawn_max_deliveries_listener_notify(Some(gave_up_tx));
    let shared = shared.clone();
    tasks.spawn(async move {
        while let Some(notice) = gave_up_rx.recv().await {
            match held_by_live_owner(&shared, &notice.gave_up).await {
                Ok(true) => notice.owner_alive(),
                Ok(false) => {
                    let settled = mark_given_up_dead(&shared, &notice.gave_up).await;
                    notice.settled(settled);
                }
                Err(e) => {
                    tracing::warn!(job_id = %notice.gave_up.job_id, error = %e, "cannot tell whether a live owner holds the given-up job; retried later");
                    notice.settled(false);
                }
            }
        }
    });
    advisories
}

/// Whether a live owner holds the job the broker gave up on (see
/// `Owning::live_holder`).
async fn held_by_live_owner(shared: &Shared, g: &crate::queue::GaveUp) -> Result<bool, String> {
    let session = shared
        .session
        .borrow()
        .clone()
        .ok_or_else(|| "no etcd session".to_string())?;
    shared.owning.live_holder(shared, &session, g).await
}

/// Marks the row of a job the broker gave up on `dead`; whether it is terminal now.
async fn mark_given_up_dead(shared: &Shared, g: &crate::queue::GaveUp) -> bool {
    let reason = format!(
        "max_deliveries: the broker gave up after {} deliveries",
        g.deliveries
    );
    // Compensation pending unless this worker runs the type and knows it has
    // no `on_dead` hook: a worker of another type cannot tell, and one that
    // runs it decides (a type without a hook just marks it done).
    let compensate = g
        .job_type
        .as_deref()
        .and_then(|t| shared.registry.get(t))
        .is_none_or(|job| job.has_on_dead());
    let marked = shared
        .store
        .mark_dead_unfenced(g.job_id, &reason, compensate);
    match marked.await {
        Ok(()) => {
            republish_for_compensation(shared, g.job_id).await;
            let job_type = g.job_type.as_deref().unwrap_or("unknown");
            shared.metrics.dead_lettered(job_type, "max_deliveries");
            outcome::notify_finished(shared, g.job_id, crate::fence::JobStatus::Dead).await;
            tracing::warn!(job_id = %g.job_id, %reason, "job dead-lettered by the broker");
            true
        }
        // No row: nothing can stay non-terminal.
        Err(FenceError::NotFound(_)) => true,
        Err(e) => {
            tracing::warn!(job_id = %g.job_id, error = %e, "marking the given-up job dead failed; the message is kept and retried");
            false
        }
    }
}

/// A job the broker gave up on has no message left to run its `on_dead`
/// hook: if its compensation is pending, a fresh message (the redrive's kind)
/// takes it to a worker of its type, whose admission compensates and then
/// dead-letters it (so its DLQ holds a second entry). Best effort: a failure
/// is logged, the compensation stays pending until a redrive.
async fn republish_for_compensation(shared: &Shared, job_id: crate::JobId) {
    let row = match shared.store.job(job_id).await {
        Ok(Some(row)) if row.compensation_pending => row,
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(%job_id, error = %e, "reading the given-up job failed; its on_dead hook waits for a redrive");
            return;
        }
    };
    let payload = serde_json::to_vec(&row.input).unwrap_or_default();
    let published = shared
        .queue
        .publish_redrive((job_id, &row.job_type, row.priority), payload.into())
        .await;
    if let Err(e) = published {
        tracing::warn!(%job_id, error = %e, "publishing the compensation message failed; its on_dead hook waits for a redrive");
    }
}
