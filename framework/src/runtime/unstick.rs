//! The scheduler leader's watch on stalled consumers (nats-server 2.9, see
//! `queue/stall.rs`): every AckWait it reads where each consumer of the work
//! stream stands; one that has not moved since the last look while it had
//! redelivered entries pending has the entries the stream no longer holds
//! acked, so it delivers again.

use std::collections::HashMap;

use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::queue::Progress;

/// Watches the work stream's consumers until `leading` is cancelled.
pub(crate) async fn watch_consumers(sh: &Shared, leading: &CancellationToken) {
    let every = sh.cfg.ack_wait();
    let mut seen: HashMap<String, Progress> = HashMap::new();
    loop {
        tokio::select! {
            () = leading.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match sh.queue.consumer_progress().await {
            Ok(now) => seen = look(sh, &seen, now).await,
            Err(e) => tracing::debug!(error = %e, "reading the consumers failed; next look later"),
        }
    }
}

/// Clears every consumer of `now` stuck since `before`; returns `now`.
async fn look(
    sh: &Shared,
    before: &HashMap<String, Progress>,
    now: Vec<(String, Progress)>,
) -> HashMap<String, Progress> {
    for (name, at) in &now {
        if !before.get(name).is_some_and(|b| at.stuck_since(b)) {
            continue;
        }
        match sh.queue.clear_deleted_pending(name, *at).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                consumer = %name,
                cleared = n,
                "a consumer held acked messages the stream had removed (nats-server 2.9 after a crash); acked them"
            ),
            Err(e) => {
                tracing::warn!(consumer = %name, error = %e, "clearing a stalled consumer failed")
            }
        }
    }
    now.into_iter().collect()
}
