//! One in-flight message: [`Delivery`], and [`BadMessage`] for messages that do
//! not name a job.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind};
use bytes::Bytes;
use tracing::Instrument;

use super::dlq::{DeadLetterInfo, Original};
use super::{BoxError, Queue, QueueError, headers, validate_job_type};
use crate::JobId;

/// Why a message does not name a job: the worker dead-letters it with
/// [`BadMessage::dead_letter_info`] instead of running anything.
///
/// ```
/// use tenure::blocks::queue::BadMessage;
/// let bad = BadMessage::MissingHeader { header: "Tenure-Job-Id" };
/// assert_eq!(bad.reason(), "bad_message: missing header Tenure-Job-Id");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadMessage {
    /// A required header is absent.
    #[error("missing header {header}")]
    MissingHeader {
        /// The header's name.
        header: &'static str,
    },
    /// The job id header is not a UUID.
    #[error("invalid job id {value:?} in header {header}: {reason}", header = headers::JOB_ID)]
    InvalidJobId {
        /// The header's value.
        value: String,
        /// The parser's message.
        reason: String,
    },
    /// The job type header cannot be a job type.
    #[error("invalid job type {value:?} in header {header}: {reason}", header = headers::JOB_TYPE)]
    InvalidJobType {
        /// The header's value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl BadMessage {
    /// The DLQ reason: `bad_message: <what is wrong>`.
    pub fn reason(&self) -> String {
        format!("{}: {self}", super::reasons::BAD_MESSAGE)
    }

    /// A [`DeadLetterInfo`] with [`BadMessage::reason`] (no owner, no attempts).
    pub fn dead_letter_info(&self) -> DeadLetterInfo {
        DeadLetterInfo::new(self.reason())
    }
}

/// What [`Delivery::hand_back`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandedBack {
    /// A nak with the delay: the broker redelivers this message.
    Nak,
    /// A fresh copy carries the job on; this message was acked.
    Renewed,
}

/// Milliseconds since the Unix epoch (0 before it).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A message delivered by [`Queue::fetch`], in flight until it is acked, retried
/// or dead-lettered. `Send + 'static`: a job actor can hold it across awaits.
///
/// Dropping a delivery without settling it leaves it in flight: the broker
/// redelivers it after `AckWait` (the lease TTL), unless [`Delivery::progress`]
/// keeps it alive.
pub struct Delivery {
    message: async_nats::Message,
    reply: async_nats::Subject,
    delivered: u64,
    stream_sequence: u64,
    pending: u64,
    published: std::time::SystemTime,
    queue: Queue,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("subject", &self.message.subject.as_str())
            .field("stream_sequence", &self.stream_sequence)
            .field("delivery_count", &self.delivered)
            .field("job_id", &self.job_id().ok())
            .finish_non_exhaustive()
    }
}

impl Delivery {
    pub(super) fn new(message: jetstream::Message, queue: Queue) -> Result<Self, BoxError> {
        let info = message.info()?;
        let delivered = u64::try_from(info.delivered)?;
        let stream_sequence = info.stream_sequence;
        let pending = info.pending;
        let published = super::stored_at(info.published.unix_timestamp_nanos());
        let message = async_nats::Message::from(message);
        let reply = message
            .reply
            .clone()
            .ok_or("a JetStream delivery without a reply subject")?;
        Ok(Delivery {
            message,
            reply,
            delivered,
            stream_sequence,
            pending,
            published,
            queue,
        })
    }

    /// When the message was stored in the work stream (its publish: the
    /// enqueue, or for a delayed job its due-time publish), by the server's
    /// clock. A redelivery keeps the first publish's time.
    pub fn published_at(&self) -> std::time::SystemTime {
        self.published
    }

    /// The job id from the [`headers::JOB_ID`] header.
    ///
    /// # Errors
    /// [`BadMessage::MissingHeader`] or [`BadMessage::InvalidJobId`].
    pub fn job_id(&self) -> Result<JobId, BadMessage> {
        let value = self.header(headers::JOB_ID)?;
        value
            .parse()
            .map_err(|e: uuid::Error| BadMessage::InvalidJobId {
                value: value.to_string(),
                reason: e.to_string(),
            })
    }

    /// The job type from the [`headers::JOB_TYPE`] header. Whether a job type of
    /// that name is registered is the runtime's question.
    ///
    /// # Errors
    /// [`BadMessage::MissingHeader`] or [`BadMessage::InvalidJobType`].
    pub fn job_type(&self) -> Result<&str, BadMessage> {
        let value = self.header(headers::JOB_TYPE)?;
        match validate_job_type(value) {
            Ok(()) => Ok(value),
            Err(QueueError::InvalidJobType { reason, .. }) => Err(BadMessage::InvalidJobType {
                value: value.to_string(),
                reason,
            }),
            Err(_) => Err(BadMessage::InvalidJobType {
                value: value.to_string(),
                reason: "invalid",
            }),
        }
    }

    fn header(&self, name: &'static str) -> Result<&str, BadMessage> {
        self.message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str())
            .ok_or(BadMessage::MissingHeader { header: name })
    }

    /// The message's payload (the job's input).
    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    /// Every header of the message.
    pub fn headers(&self) -> Option<&HeaderMap> {
        self.message.headers.as_ref()
    }

    /// The subject the message was published to.
    pub fn subject(&self) -> &str {
        self.message.subject.as_str()
    }

    /// How many times the broker has delivered this message (1 the first time).
    pub fn delivery_count(&self) -> u64 {
        self.delivered
    }

    /// Whether this is the broker's last delivery (`delivery_count >= MaxDeliver`):
    /// if it is not acked, the broker gives up and the message is dead-lettered
    /// with reason `max_deliveries` by the listener.
    pub fn is_final_delivery(&self) -> bool {
        let max = self.queue.inner.settings.max_deliver;
        max > 0 && self.delivered >= max.unsigned_abs()
    }

    /// The messages its consumer had not delivered yet when it delivered
    /// this one (the server's count, in the delivery's reply subject).
    pub fn pending(&self) -> u64 {
        self.pending
    }

    /// The message's sequence in the work stream.
    pub fn stream_sequence(&self) -> u64 {
        self.stream_sequence
    }

    /// Tells the broker the job is still running (`+WPI`): `AckWait` starts over.
    /// Send it only while the session is `Healthy`, so the broker and the
    /// coordinator agree on when a worker is gone.
    ///
    /// # Errors
    /// [`QueueError::Ack`] when the server did not confirm it.
    pub async fn progress(&self) -> Result<(), QueueError> {
        self.settle_ref(AckKind::Progress, "progress").await
    }

    /// Acknowledges the message and waits for the server's confirmation; the
    /// message then leaves the work stream.
    ///
    /// # Fencing
    /// Ack only after the job row is terminal (or the message was found to be for
    /// a terminal job): the ack is not fenced, the row is.
    ///
    /// # Errors
    /// [`QueueError::Ack`]: the ack may not have arrived; the message may be
    /// redelivered, and admission against the job row acks it again.
    pub async fn ack(self) -> Result<(), QueueError> {
        self.settle_ref(AckKind::Ack, "ack").await
    }

    /// Negative ack with a delay: the broker redelivers the message after `delay`
    /// with a higher delivery count (counting towards `MaxDeliver`).
    ///
    /// # Errors
    /// [`QueueError::Ack`]: without the nak, the message comes back after `AckWait`.
    pub async fn retry_after(self, delay: Duration) -> Result<(), QueueError> {
        self.settle_ref(AckKind::Nak(Some(delay)), "nak").await
    }

    /// Hands the message back to be delivered again after `delay`, without the
    /// hand-backs adding up to `MaxDeliver`: a nak while the delivery count is
    /// below half of `MaxDeliver`, and from there a renewal
    /// ([`Delivery::renew`]): a fresh copy whose count starts at 1. So the
    /// broker's backstop counts only deliveries nobody settled (an owner that
    /// crashed or went silent past `AckWait`), never a job that waits its turn
    /// behind a live owner (a duplicate message, a retry, a hand-over).
    ///
    /// # Errors
    /// [`QueueError::Ack`] when the nak was not confirmed (the message comes
    /// back after `AckWait`); a failed renewal falls back to the nak.
    pub async fn hand_back(self, delay: Duration) -> Result<HandedBack, QueueError> {
        if !self.renewal_due() {
            self.retry_after(delay).await?;
            return Ok(HandedBack::Nak);
        }
        match self.renew(delay).await {
            Ok(()) => Ok(HandedBack::Renewed),
            Err(e) => {
                tracing::warn!(error = %e, "renewing the message failed; nak'ing it instead");
                self.retry_after(delay).await?;
                Ok(HandedBack::Nak)
            }
        }
    }

    /// Whether a hand-back renews the message: its delivery count has reached
    /// half of `MaxDeliver`.
    pub fn renewal_due(&self) -> bool {
        let max = self.queue.inner.settings.max_deliver;
        max > 0 && self.delivered.saturating_mul(2) >= max.unsigned_abs()
    }

    /// Publishes a fresh copy of this message (same subject, payload and
    /// headers; `Nats-Msg-Id` `<job>/renew/<stream sequence>`, so a retried
    /// renewal stores one copy; [`headers::NOT_BEFORE`] = now + `delay`), waits
    /// for its confirmation, then acks this one. At least one of the two is in
    /// the stream at every moment.
    ///
    /// # Errors
    /// [`QueueError::Publish`] (nothing changed), [`QueueError::Ack`] (the copy
    /// is stored and this message may come back once more: a duplicate, which
    /// the job row absorbs).
    pub async fn renew(&self, delay: Duration) -> Result<(), QueueError> {
        let job = self.header(headers::JOB_ID).unwrap_or("message");
        let msg_id = format!("{job}/renew/{}", self.stream_sequence);
        let mut h = headers::renewed(
            self.message.headers.as_ref(),
            &[headers::NOT_BEFORE],
            &msg_id,
        );
        let not_before =
            unix_ms().saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        h.insert(headers::NOT_BEFORE, headers::value(&not_before.to_string()));
        let subject = self.message.subject.to_string();
        let published = self
            .queue
            .publish_confirmed(subject, h, self.message.payload.clone())
            .await?;
        tracing::debug!(
            stream_sequence = self.stream_sequence,
            renewed_as = published.sequence,
            deliveries = self.delivered,
            "renewed the message"
        );
        self.settle_ref(AckKind::Ack, "ack").await
    }

    /// How long a renewed message still has to wait before it may run
    /// ([`headers::NOT_BEFORE`]); `None` when it may run now.
    pub fn not_before_wait(&self) -> Option<Duration> {
        let at: u64 = self.header(headers::NOT_BEFORE).ok()?.parse().ok()?;
        let wait = at.checked_sub(unix_ms())?;
        (wait > 0).then(|| Duration::from_millis(wait))
    }

    /// Publishes the message to the DLQ (subject `<ns>.dlq.<job_id>`) with every
    /// original header (`Nats-*` ones under `Tenure-Original-`), plus the reason,
    /// the delivery count, the original sequence and subject, and `info`'s last
    /// token, takeovers and attempts; waits for the server to confirm it is stored;
    /// then terminates the original (it leaves the work stream).
    ///
    /// Dead-lettering the same work message twice inside the duplicate window
    /// stores one entry (the DLQ `Nats-Msg-Id` is derived from the original's
    /// sequence).
    ///
    /// # Errors
    /// [`QueueError::Publish`] (nothing was terminated: the message comes back and
    /// can be dead-lettered again) or [`QueueError::Ack`] (the entry is in the DLQ
    /// but the original may be redelivered once more).
    pub async fn dead_letter(self, info: DeadLetterInfo) -> Result<(), QueueError> {
        let span = tracing::info_span!(
            "tenure.queue.dead_letter",
            stream_sequence = self.stream_sequence,
            reason = %info.reason,
            job_id = tracing::field::Empty,
        );
        if let Ok(id) = self.job_id() {
            span.record("job_id", tracing::field::display(id));
        }
        async move {
            let original = Original {
                subject: self.message.subject.as_str(),
                headers: self.message.headers.as_ref(),
                payload: self.message.payload.clone(),
                sequence: self.stream_sequence,
                deliveries: self.delivered,
            };
            let published = self
                .queue
                .publish_dead_letter(original, &info.reason, Some(&info))
                .await?;
            tracing::info!(dlq_sequence = published.sequence, "dead-lettered");
            self.settle_ref(AckKind::Term, "term").await
        }
        .instrument(span)
        .await
    }

    async fn settle_ref(&self, kind: AckKind, name: &'static str) -> Result<(), QueueError> {
        let span = tracing::debug_span!(
            "tenure.queue.settle",
            kind = name,
            stream_sequence = self.stream_sequence
        );
        self.queue
            .ack_request(
                self.reply.clone(),
                Bytes::from(kind),
                name,
                self.stream_sequence,
            )
            .instrument(span)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static<T: Send + Sync + 'static>() {}

    #[test]
    fn deliveries_can_move_between_tasks() {
        assert_send_static::<Delivery>();
        assert_send_static::<Queue>();
    }

    #[test]
    fn bad_message_reasons_are_precise() {
        let bad = BadMessage::InvalidJobId {
            value: "x".into(),
            reason: "invalid length".into(),
        };
        assert_eq!(
            bad.reason(),
            "bad_message: invalid job id \"x\" in header Tenure-Job-Id: invalid length"
        );
        assert_eq!(bad.dead_letter_info().reason, bad.reason());
    }
}
