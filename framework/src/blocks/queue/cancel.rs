//! Operator cancel notices: core NATS (no stream) on `<ns>.cancel.<job_id>`.
//! The client publishes one before it cancels the job row; every worker
//! subscribes once and fires the cancellation of that job's running step.
//! A notice is a hint for speed: lost (no subscriber, a reconnect), the
//! cancel still holds, at the row (see `FenceStore::cancel_job`).

use futures::StreamExt;

use super::{Queue, QueueError, boxed};
use crate::JobId;

/// A worker's subscription to its namespace's cancel notices.
pub(crate) struct CancelNotices {
    sub: async_nats::Subscriber,
    prefix: String,
}

impl std::fmt::Debug for CancelNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelNotices")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl CancelNotices {
    /// The next cancelled job's id; `None` once the subscription ended. A
    /// subject whose last token is not a job id is skipped.
    pub(crate) async fn next(&mut self) -> Option<JobId> {
        while let Some(msg) = self.sub.next().await {
            let tail = msg.subject.as_str().strip_prefix(self.prefix.as_str());
            match tail.map(str::parse::<JobId>) {
                Some(Ok(id)) => return Some(id),
                _ => {
                    tracing::warn!(subject = %msg.subject, "cancel notice without a job id, skipped")
                }
            }
        }
        None
    }
}

impl Queue {
    /// Tells every worker of the namespace that job `job_id` is being
    /// cancelled: a core NATS publish on `<ns>.cancel.<job_id>`, flushed to
    /// the server. No stream keeps it: a worker not subscribed now never sees it.
    ///
    /// # Errors
    /// [`QueueError::Publish`] if the publish or the flush failed.
    pub async fn publish_cancel(&self, job_id: JobId) -> Result<(), QueueError> {
        let subject = self.inner.names.cancel_subject(job_id);
        let err = |source| QueueError::Publish {
            subject: subject.clone(),
            source,
        };
        let client = &self.inner.client;
        client
            .publish(subject.clone(), bytes::Bytes::new())
            .await
            .map_err(|e| err(boxed(e)))?;
        client.flush().await.map_err(|e| err(boxed(e)))?;
        Ok(())
    }

    /// Subscribes to every cancel notice of the namespace (`<ns>.cancel.*`).
    /// The client re-subscribes by itself after a reconnect.
    ///
    /// # Errors
    /// [`QueueError::Setup`] if the subscription was refused.
    pub(crate) async fn cancel_notices(&self) -> Result<CancelNotices, QueueError> {
        let prefix = self.inner.names.cancel_subject_prefix.clone();
        let sub = self
            .inner
            .client
            .subscribe(format!("{prefix}*"))
            .await
            .map_err(|e| QueueError::Setup {
                what: "the cancel notice subscription".into(),
                source: boxed(e),
            })?;
        // The subscription is on the server once a flush returns: a notice
        // published after `cancel_notices` returns reaches it.
        if let Err(e) = self.inner.client.flush().await {
            tracing::debug!(error = %e, "flush after subscribing failed");
        }
        Ok(CancelNotices { sub, prefix })
    }
}
