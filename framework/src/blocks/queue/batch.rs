//! Many job messages at once: every publish is sent before any confirmation
//! is awaited (pipelined), then each confirmation is awaited and reported on
//! its own.

use crate::{JobId, Priority};

use super::{Published, Queue, QueueError, boxed, job_headers, validate_job_type};

/// One job message of [`Queue::publish_jobs`].
#[derive(Debug, Clone)]
pub struct JobMessage<'a> {
    /// The job (its id is the message's `Nats-Msg-Id`).
    pub job_id: JobId,
    /// Its type (the subject).
    pub job_type: &'a str,
    /// The input, as JSON bytes.
    pub payload: bytes::Bytes,
    /// Its priority level (the subject: [`QueueNames::priority_subject`](super::QueueNames::priority_subject)).
    pub priority: Priority,
}

impl Queue {
    /// Publishes each job message as [`Queue::publish_job`] does, pipelined:
    /// all are sent, then the server's confirmations are awaited. Returns one
    /// result per message, in order; a failed one may be published again (the
    /// `Nats-Msg-Id` makes that safe inside the duplicate window).
    pub async fn publish_jobs(
        &self,
        messages: &[JobMessage<'_>],
    ) -> Vec<Result<Published, QueueError>> {
        let mut pending = Vec::with_capacity(messages.len());
        for m in messages {
            pending.push(self.send_job(m).await);
        }
        let acks = pending.into_iter().map(|sent| async move {
            let (subject, ack) = sent?;
            let ack = ack.await.map_err(|e| QueueError::Publish {
                subject,
                source: boxed(e),
            })?;
            Ok(Published {
                sequence: ack.sequence,
                duplicate: ack.duplicate,
            })
        });
        futures::future::join_all(acks).await
    }

    /// Sends one job message; returns its subject and its pending confirmation.
    async fn send_job(
        &self,
        m: &JobMessage<'_>,
    ) -> Result<(String, async_nats::jetstream::context::PublishAckFuture), QueueError> {
        validate_job_type(m.job_type)?;
        let subject = self.job_subject_with_priority(m.job_type, m.job_id, m.priority);
        let h = job_headers(m.job_id, m.job_type, &m.job_id.to_string());
        let ack = self
            .inner
            .js
            .publish_with_headers(subject.clone(), h, m.payload.clone())
            .await
            .map_err(|e| QueueError::Publish {
                subject: subject.clone(),
                source: boxed(e),
            })?;
        Ok((subject, ack))
    }
}
