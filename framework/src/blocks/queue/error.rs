//! The queue's error type and the helpers that wrap a client error into it.

use std::time::Duration;

use super::MESSAGE_HEADROOM;
use crate::JobId;
use crate::config::ConfigError;
use crate::types::BoxError;

/// Errors of the queue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The configuration is invalid.
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    /// The first connection to NATS failed.
    #[error("cannot connect to NATS at {url}")]
    Connect {
        /// The URL tried.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// NATS refused us: TLS or credentials (`nats 127.0.0.1:4222: authentication
    /// failed: ...`).
    #[error(transparent)]
    Access(#[from] crate::security::AccessError),
    /// A stream or consumer of the namespace does not exist, and the call only
    /// binds to existing ones ([`Queue::connect`](super::Queue::connect)): no worker has provisioned the
    /// namespace yet, or the namespace or NATS URL is not the workers'.
    #[error(
        "{what} does not exist: start a worker in this namespace first (tools never create or change streams)"
    )]
    NotProvisioned {
        /// The stream or consumer.
        what: String,
    },
    /// Creating or updating a stream or consumer failed (for instance an existing
    /// stream with a retention policy that cannot be changed).
    #[error("JetStream setup of {what} failed")]
    Setup {
        /// The stream or consumer.
        what: String,
        /// The server's or client's error.
        #[source]
        source: BoxError,
    },
    /// A job type that cannot be part of a NATS subject.
    #[error("invalid job type {job_type:?}: {reason}")]
    InvalidJobType {
        /// The job type given.
        job_type: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A job message would be larger than the server takes (its INFO
    /// `max_payload`): the input, the message's headers and
    /// [`MESSAGE_HEADROOM`] bytes for the headers Tenure adds to it later (a
    /// renewal, a dead letter). Checked before anything is written.
    #[error(
        "a job message of type {job_type} would be {size} bytes (input, headers and \
         {headroom} bytes of room for later headers); the NATS server takes at most {max_payload} \
         (max_payload): nothing written",
        headroom = MESSAGE_HEADROOM
    )]
    MessageTooLarge {
        /// The job type.
        job_type: String,
        /// The message's size with headers and headroom, in bytes.
        size: usize,
        /// The server's `max_payload`.
        max_payload: usize,
    },
    /// A publish was not confirmed by the server (it may still have been stored:
    /// publish again; the `Nats-Msg-Id` makes that safe inside the duplicate window).
    #[error("publish to {subject} was not confirmed")]
    Publish {
        /// The subject.
        subject: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// A pull request failed or got no answer in time.
    #[error("fetch from consumer {consumer} failed")]
    Fetch {
        /// The consumer.
        consumer: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The connection to NATS is down and did not come back within the wait; the
    /// client keeps reconnecting in the background.
    #[error("NATS is disconnected (waited {waited:?} for the reconnect)")]
    Disconnected {
        /// How long the call waited for a reconnect.
        waited: Duration,
    },
    /// An ack, nak, term or progress was not confirmed by the server. The message
    /// may or may not have been acknowledged: the protocol tolerates a redelivery.
    #[error("{kind} of stream sequence {stream_sequence} was not confirmed")]
    Ack {
        /// `ack`, `nak`, `term` or `progress`.
        kind: &'static str,
        /// The message's sequence in the work stream.
        stream_sequence: u64,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// Reading a stream (a stored message, stream or consumer info) failed.
    #[error("reading {stream} failed")]
    Read {
        /// The stream.
        stream: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// Deleting a stored message failed.
    #[error("deleting sequence {sequence} from {stream} failed")]
    Delete {
        /// The stream.
        stream: String,
        /// The message's sequence.
        sequence: u64,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The broker gave up on job `job_id`'s message, and the listener's owner did
    /// not confirm that the job's row is terminal: the message stays in the work
    /// stream and the advisory is handled again later.
    #[error("job {job_id}: its row was not marked dead; the given-up message is kept and retried")]
    RowNotSettled {
        /// The job.
        job_id: JobId,
    },
    /// A dead letter cannot be redriven (it names no work subject).
    #[error("DLQ entry {dlq_sequence} cannot be redriven: {reason}")]
    Redrive {
        /// The entry's sequence in the DLQ stream.
        dlq_sequence: u64,
        /// Why.
        reason: String,
    },
}

impl QueueError {
    /// Whether retrying the same call later can succeed (NATS down, a timeout),
    /// as opposed to a configuration or input error.
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            QueueError::Config(_)
                | QueueError::InvalidJobType { .. }
                | QueueError::Redrive { .. }
                | QueueError::NotProvisioned { .. }
        )
    }
}

/// Causes the queue reports as the `source` of a [`QueueError`].
#[derive(Debug, thiserror::Error)]
pub(super) enum Cause {
    #[error("no answer from NATS within {0:?}")]
    TimedOut(Duration),
    #[error("the server refused the pull request with status {0}")]
    Refused(u16),
}

/// A client error as the `source` of a [`QueueError`].
pub(super) fn boxed<E: std::error::Error + Send + Sync + 'static>(e: E) -> BoxError {
    Box::new(e)
}

pub(super) fn setup_failed<E: std::error::Error + Send + Sync + 'static>(
    what: &str,
) -> impl FnOnce(E) -> QueueError {
    let what = what.to_string();
    move |e| QueueError::Setup {
        what,
        source: boxed(e),
    }
}

pub(super) fn read<E: std::error::Error + Send + Sync + 'static>(
    stream: &str,
) -> impl FnOnce(E) -> QueueError {
    let stream = stream.to_string();
    move |e| QueueError::Read {
        stream,
        source: boxed(e),
    }
}
