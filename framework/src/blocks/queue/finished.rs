//! Completion notices: core NATS (no stream) on `<ns>.finished.<job_id>`,
//! the payload the job's final status (`done`, `dead` or `cancelled`). A
//! worker publishes one after the commit that ended the job (the last step,
//! the dead mark and its compensation); the client publishes one after an
//! operator's cancel. [`Client::wait`](crate::Client::wait) subscribes to its
//! job's subject before it reads the row, so a notice cannot fall between the
//! read and the wait. A notice is a hint for speed: lost (no subscriber, a
//! reconnect), the waiter reads the row once more at its timeout.

use futures::StreamExt;

use super::{Queue, QueueError, boxed};
use crate::JobId;

/// A subscription to one job's completion notices
/// ([`Queue::finished_notices`]).
pub(crate) struct FinishedNotices {
    sub: async_nats::Subscriber,
    job_id: JobId,
}

impl std::fmt::Debug for FinishedNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FinishedNotices")
            .field("job_id", &self.job_id)
            .finish_non_exhaustive()
    }
}

impl FinishedNotices {
    /// Waits for the next notice: `true` when one came (the caller reads the
    /// row for the status), `false` once the subscription ended.
    pub(crate) async fn next(&mut self) -> bool {
        self.sub.next().await.is_some()
    }
}

impl Queue {
    /// Tells whoever waits for job `job_id` that it ended as `status` (the
    /// job row's status, `done`, `dead` or `cancelled`): a core
    /// NATS publish on `<ns>.finished.<job_id>`. Not flushed (the connection
    /// sends it within milliseconds); no stream keeps it.
    ///
    /// # Errors
    /// [`QueueError::Publish`] if the publish failed.
    pub async fn publish_finished(
        &self,
        job_id: JobId,
        status: &'static str,
    ) -> Result<(), QueueError> {
        let subject = self.inner.names.finished_subject(job_id);
        self.inner
            .client
            .publish(
                subject.clone(),
                bytes::Bytes::from_static(status.as_bytes()),
            )
            .await
            .map_err(|e| QueueError::Publish {
                subject,
                source: boxed(e),
            })
    }

    /// Subscribes to job `job_id`'s completion notices; once this returns,
    /// the subscription is on the server (flushed), so a notice published
    /// after it reaches it.
    ///
    /// # Errors
    /// [`QueueError::Setup`] if the subscription was refused.
    pub(crate) async fn finished_notices(
        &self,
        job_id: JobId,
    ) -> Result<FinishedNotices, QueueError> {
        let subject = self.inner.names.finished_subject(job_id);
        let setup = |source| QueueError::Setup {
            what: format!("the completion notice subscription {subject}"),
            source,
        };
        let client = &self.inner.client;
        let sub = client
            .subscribe(subject.clone())
            .await
            .map_err(|e| setup(boxed(e)))?;
        client.flush().await.map_err(|e| setup(boxed(e)))?;
        Ok(FinishedNotices { sub, job_id })
    }
}
