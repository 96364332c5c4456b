//! The queue: NATS JetStream delivery of job messages, enqueue de-duplication,
//! and the dead-letter queue (DLQ). The only code in Tenure that talks to NATS.
//!
//! The queue only says "look at job X": job state lives in PostgreSQL (the
//! `fence` module's job rows), and this module never touches it. The
//! client composes the two: enqueue = insert the job row + [`Queue::publish_job`];
//! redrive = [`Queue::redrive`] + reset the row.
//!
//! # What [`Queue::provision`] sets up (idempotent, namespace-prefixed)
//! Workers provision; tools bind with [`Queue::connect`], which changes nothing
//! on the server, and producers ([`Queue::connect_or_create`]) only create what
//! is missing (see the table in `queue/setup.rs`).
//!
//! - the **work stream** `TENURE_<NS>_JOBS` on `<ns>.jobs.>`: file storage,
//!   work-queue retention (an acked or terminated message leaves the stream), a
//!   duplicate window of [`Config::duplicate_window`](crate::Config::duplicate_window) for `Nats-Msg-Id`;
//! - one durable pull **consumer per job type**, `<ns>_workers_<job type>`
//!   ([`QueueNames::type_consumer`]), created by the first worker that registers
//!   the type ([`Queue::route`]): explicit acks, the one
//!   `filter_subject` `<ns>.jobs.<job type>` (nats-server 2.9 ignores `filter_subjects`), `AckWait` =
//!   [`Config::ack_wait`](crate::Config::ack_wait) (the lease TTL), `MaxDeliver` = [`Config::max_deliver`](crate::Config::max_deliver),
//!   no `MaxAckPending` limit (each worker bounds its own in-flight jobs);
//! - the **DLQ stream** `TENURE_<NS>_DLQ` on `<ns>.dlq.>` (subject
//!   `<ns>.dlq.<job_id>`, or `<ns>.dlq._invalid` for a message without a valid
//!   job id), file storage, kept until an operator redrives or purges it;
//! - the **advisory stream** `TENURE_<NS>_ADVISORIES`, which captures the server's
//!   `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.*` events, and
//!   its durable consumer `<ns>_advisories`. Core NATS advisories are fire and
//!   forget; captured in a stream, an advisory raised while no worker listens (or
//!   while a worker reconnects) is handled later instead of lost, and several
//!   workers' listeners share the work (see [`Queue::spawn_max_deliveries_listener`]).
//!
//! # Server compatibility
//! Verified against nats-server 2.9.10 with async-nats 0.51: every typed call used
//! here (stream create/update/info, consumer create/info, publish acks, direct
//! get with `next_by_subj`, `MSG.DELETE`, pull requests with `no_wait` and no
//! `expires`, answered at once; see `queue/pull.rs` for why none waits at the
//! server) parses 2.9's replies. Stored messages are read with a direct get
//! (streams have `allow_direct`), not the typed `STREAM.MSG.GET`, whose header
//! parser keeps only the last value of a repeated header. Acks go as plain
//! requests on the ack subject, so the server's empty reply confirms them (this
//! is what "double ack" is).
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure::blocks::queue::QueueError> {
//! use std::time::Duration;
//! use tenure::blocks::queue::Queue;
//! use tenure::{Config, JobId};
//!
//! let cfg = Config::new("payments").with_nats_url("nats://127.0.0.1:4222");
//! let queue = Queue::provision(&cfg).await?;
//! let job = JobId::from_key("ledger.transfer", "transfer-42");
//! let published = queue.publish_job(job, "ledger.transfer", "{}".into()).await?;
//! assert!(!published.duplicate);
//!
//! let _listener = queue.spawn_max_deliveries_listener();
//! for delivery in queue.fetch("ledger.transfer", 64, Duration::from_secs(1)).await? {
//!     match delivery.job_id() {
//!         Ok(_id) => delivery.ack().await?,
//!         Err(bad) => delivery.dead_letter(bad.dead_letter_info()).await?,
//!     }
//! }
//! # Ok(()) }
//! ```

mod access;
mod batch;
mod cancel;
mod delivery;
mod dlq;
mod error;
mod finished;
pub mod headers;
mod names;
mod permissions;
mod provision;
mod pull;
mod ring;
mod routes;
mod setup;
mod stall;

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::BackoffConfig;
use crate::{JobId, Priority};

pub use batch::JobMessage;
pub(crate) use cancel::CancelNotices;
pub use delivery::{BadMessage, Delivery, HandedBack};
pub use dlq::{AdvisoryListener, DeadLetter, DeadLetterInfo, GaveUp, GaveUpNotice, reasons};
pub use error::QueueError;
use error::{Cause, boxed, read, setup_failed};
pub use names::QueueNames;
pub(crate) use names::validate_job_type;
pub use permissions::{NatsPermissions, NatsRole};
pub use routes::LevelCount;
pub use setup::nats_client;
pub(crate) use stall::Progress;

use crate::types::BoxError;

/// Bytes every job message keeps free below the server's `max_payload` for
/// the headers Tenure adds to it after the enqueue: a renewed copy's
/// `Tenure-Not-Before` and message id, a dead letter's reason, counts and
/// original subject. A message that fits only without them could be enqueued
/// but neither renewed nor dead-lettered.
pub const MESSAGE_HEADROOM: usize = 1024;

/// The size on the wire of job `job_id`'s message with a payload of
/// `payload_len` bytes, plus [`MESSAGE_HEADROOM`]: its headers (as the
/// server counts them, `NATS/1.0` line included) with the longest message id
/// a job message carries (a redrive's `<job_id>/redrive/<uuid>`).
fn job_message_size(job_id: JobId, job_type: &str, payload_len: usize) -> usize {
    let longest_id = format!("{job_id}/redrive/{}", uuid::Uuid::nil());
    let headers = job_headers(job_id, job_type, &longest_id);
    let lines: usize = headers
        .iter()
        .flat_map(|(name, values)| {
            let name: &str = name.as_ref();
            values
                .iter()
                .map(move |v| name.len() + 2 + v.as_str().len() + 2)
        })
        .sum();
    "NATS/1.0\r\n\r\n".len() + lines + payload_len + MESSAGE_HEADROOM
}

/// Checks, before anything is written, that job `job_id` of `job_type` can
/// be published with a payload of `payload_len` bytes to a server that takes
/// `max_payload`: a valid job type and a message that fits.
pub(crate) fn check_job_message(
    job_id: JobId,
    job_type: &str,
    payload_len: usize,
    max_payload: usize,
) -> Result<(), QueueError> {
    validate_job_type(job_type)?;
    let size = job_message_size(job_id, job_type, payload_len);
    if size > max_payload {
        return Err(QueueError::MessageTooLarge {
            job_type: job_type.to_string(),
            size,
            max_payload,
        });
    }
    Ok(())
}

/// The server's confirmation of a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The message's sequence in the work stream (for a duplicate: the sequence of
    /// the message stored first).
    pub sequence: u64,
    /// The broker dropped this publish as a duplicate of one inside the duplicate
    /// window (same `Nats-Msg-Id`). Outside the window the broker cannot tell:
    /// the job row is the source of truth for enqueue de-duplication.
    pub duplicate: bool,
}

/// Counts for operators and tests ([`Queue::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Messages stored in the work stream (not yet acked or terminated).
    pub work_messages: u64,
    /// Messages in the DLQ stream.
    pub dlq_messages: u64,
    /// Messages the per-type consumers have not delivered yet (a message of a
    /// type no worker ever registered is in `work_messages` only).
    pub pending: u64,
    /// Messages delivered and not yet acked.
    pub ack_pending: u64,
    /// Messages delivered more than once and not yet acked.
    pub redelivered: u64,
    /// Max-deliveries advisories not yet handled.
    pub advisories: u64,
}

/// Settings the queue keeps from [`Config`].
#[derive(Debug, Clone)]
struct Settings {
    request_timeout: Duration,
    /// How often a waiting fetch asks the server again
    /// (`Tuning::fetch_wait_several`).
    poll_period: Duration,
    ack_wait: Duration,
    max_deliver: i64,
    backoff: BackoffConfig,
    partitions: Option<u32>,
}

struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    names: QueueNames,
    routes: routes::Routes,
    work_stream: stream::Stream<()>,
    dlq_stream: stream::Stream<()>,
    advisories: consumer::PullConsumer,
    connected: watch::Receiver<bool>,
    doorbell: ring::Doorbell,
    settings: Settings,
}

/// A connection to the namespace's streams. Cheap to clone (one NATS connection
/// shared by the clones).
#[derive(Clone)]
pub struct Queue {
    inner: Arc<Inner>,
    /// Where the max-deliveries listener reports what it dead-lettered.
    gave_up: Option<tokio::sync::mpsc::Sender<dlq::GaveUpNotice>>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("names", &self.inner.names)
            .field("connection", &self.inner.client.connection_state())
            .finish_non_exhaustive()
    }
}

/// The headers of a job message: its message id, job id and job type.
fn job_headers(job_id: JobId, job_type: &str, msg_id: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(async_nats::header::NATS_MESSAGE_ID, headers::value(msg_id));
    h.insert(headers::JOB_ID, headers::value(&job_id.to_string()));
    h.insert(headers::JOB_TYPE, headers::value(job_type));
    crate::telemetry::propagation::inject_current(&mut h);
    h
}

/// When the server stored a message, from its time in nanoseconds since the
/// Unix epoch (the epoch itself for a time outside what a `u64` holds).
fn stored_at(unix_nanos: i128) -> std::time::SystemTime {
    let nanos = u64::try_from(unix_nanos).unwrap_or(0);
    std::time::UNIX_EPOCH + Duration::from_nanos(nanos)
}

impl Queue {
    /// The names of the streams, subjects and consumers.
    pub fn names(&self) -> &QueueNames {
        &self.inner.names
    }

    /// The largest message the server takes, headers included (its INFO
    /// `max_payload`, 1 MiB by default).
    pub fn max_payload(&self) -> usize {
        self.inner.client.max_payload()
    }

    /// [`check_job_message`] against this server's `max_payload`.
    pub(crate) fn check_job_message(
        &self,
        job_id: JobId,
        job_type: &str,
        payload_len: usize,
    ) -> Result<(), QueueError> {
        check_job_message(job_id, job_type, payload_len, self.max_payload())
    }

    /// Whether the NATS connection is up right now.
    pub fn is_connected(&self) -> bool {
        self.inner.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Publishes the message of job `job_id` to `<ns>.jobs.<job_type>` with
    /// `Nats-Msg-Id` = the job id and the [`headers::JOB_ID`] and
    /// [`headers::JOB_TYPE`] headers, and waits for the server to confirm it is
    /// stored (file storage).
    ///
    /// A second publish of the same job inside the duplicate window is dropped
    /// by the broker and reported as [`Published::duplicate`]. Outside the window
    /// the broker stores it again: enqueue de-duplication for good is the job
    /// row's primary key, and a second message for an existing job is harmless (the
    /// worker admits it against the row).
    ///
    /// # Errors
    /// [`QueueError::InvalidJobType`]; [`QueueError::Publish`] when the server did
    /// not confirm within [`Config::nats_request_timeout`](crate::Config::nats_request_timeout) (publishing again is safe).
    pub async fn publish_job(
        &self,
        job_id: JobId,
        job_type: &str,
        payload: bytes::Bytes,
    ) -> Result<Published, QueueError> {
        self.publish_job_with_priority(job_id, job_type, payload, Priority::Normal)
            .await
    }

    /// [`Queue::publish_job`] at `priority`: on the level's subject
    /// ([`QueueNames::priority_subject`]), taken by its own consumer.
    ///
    /// # Errors
    /// As [`Queue::publish_job`].
    pub async fn publish_job_with_priority(
        &self,
        job_id: JobId,
        job_type: &str,
        payload: bytes::Bytes,
        priority: Priority,
    ) -> Result<Published, QueueError> {
        let msg_id = job_id.to_string();
        self.publish_with_msg_id(job_id, (job_type, priority), payload, msg_id)
            .await
    }

    /// Publishes a job message afresh for an operator's redrive of a job whose
    /// DLQ entry is gone, at the job's priority level: the message id is
    /// `<job_id>/redrive/<random>`, so the duplicate window does not drop it.
    ///
    /// # Errors
    /// As [`Queue::publish_job`].
    pub async fn publish_redrive(
        &self,
        (job_id, job_type, priority): (JobId, &str, Priority),
        payload: bytes::Bytes,
    ) -> Result<Published, QueueError> {
        let msg_id = format!("{job_id}/redrive/{}", uuid::Uuid::new_v4());
        self.publish_with_msg_id(job_id, (job_type, priority), payload, msg_id)
            .await
    }

    /// Publishes one more message of job `job_id` (at its priority level)
    /// for an operator's retry-now of the job's `attempts`-th wait: the
    /// message id is
    /// `<job_id>/retry-now/<attempts>`, so a repeated retry-now of the same
    /// wait stores one message (inside the duplicate window). A worker admits,
    /// locks and claims it as any other message of the job.
    ///
    /// # Errors
    /// As [`Queue::publish_job`].
    pub async fn publish_retry_now(
        &self,
        (job_id, job_type, priority): (JobId, &str, Priority),
        payload: bytes::Bytes,
        attempts: u32,
    ) -> Result<Published, QueueError> {
        let msg_id = format!("{job_id}/retry-now/{attempts}");
        self.publish_with_msg_id(job_id, (job_type, priority), payload, msg_id)
            .await
    }

    async fn publish_with_msg_id(
        &self,
        job_id: JobId,
        (job_type, priority): (&str, Priority),
        payload: bytes::Bytes,
        msg_id: String,
    ) -> Result<Published, QueueError> {
        let span = tracing::debug_span!("tenure.queue.publish", %job_id, job_type, %priority);
        async move {
            validate_job_type(job_type)?;
            let subject = self.job_subject_with_priority(job_type, job_id, priority);
            let h = job_headers(job_id, job_type, &msg_id);
            let ack = self.publish_confirmed(subject, h, payload).await?;
            tracing::debug!(
                sequence = ack.sequence,
                duplicate = ack.duplicate,
                "published"
            );
            Ok(ack)
        }
        .instrument(span)
        .await
    }

    /// The work subject of job `job_id` of `job_type`: its partition's in
    /// partition mode ([`QueueNames::partition_subject`]), else its type's.
    pub fn job_subject(&self, job_type: &str, job_id: JobId) -> String {
        self.job_subject_with_priority(job_type, job_id, Priority::Normal)
    }

    /// [`Queue::job_subject`] at `priority` ([`QueueNames::priority_subject`]).
    pub fn job_subject_with_priority(
        &self,
        job_type: &str,
        job_id: JobId,
        priority: Priority,
    ) -> String {
        let partition = self.inner.settings.partitions.map(|p| job_id.partition(p));
        self.inner
            .names
            .priority_subject(job_type, partition, priority)
    }

    /// The partition count this queue publishes and fetches with
    /// (`Config::partitions`).
    pub fn partitions(&self) -> Option<u32> {
        self.inner.settings.partitions
    }

    /// Publishes to any subject of the namespace's streams and waits for the
    /// server's confirmation.
    async fn publish_confirmed(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: bytes::Bytes,
    ) -> Result<Published, QueueError> {
        let err = |source| QueueError::Publish {
            subject: subject.clone(),
            source,
        };
        let ack = self
            .inner
            .js
            .publish_with_headers(subject.clone(), headers, payload)
            .await
            .map_err(|e| err(boxed(e)))?
            .await
            .map_err(|e| err(boxed(e)))?;
        Ok(Published {
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// Up to `max` messages of `job_type`: waits up to `wait` for the first,
    /// then returns what the server has ready (at most `max`, maybe fewer; an
    /// empty `Vec` when nothing arrived within `wait`). The wait is the
    /// client's: it asks the server every poll period
    /// ([`Tuning::fetch_wait_several`](crate::config::Tuning::fetch_wait_several),
    /// 100 ms by default, so a message that arrives while it waits is taken
    /// within about that) with a pull request the server answers at once, and
    /// no request is left at the server when the call returns (nats-server
    /// 2.9 mishandles requests that wait there: see `queue/pull.rs`). Each
    /// [`Delivery`] must be acked, retried or dead-lettered; one that is
    /// dropped is redelivered after `AckWait`.
    ///
    /// Call it in a loop with `max` = the free slots of the worker. It uses the
    /// job type's own consumer ([`Queue::route`]), opened on the first call.
    ///
    /// # Errors
    /// [`QueueError::Disconnected`] when NATS is down for the rest of the
    /// `wait` (the client keeps reconnecting: call again later);
    /// [`QueueError::Fetch`] when the server refuses a request, or a request
    /// cannot be sent within [`Config::nats_request_timeout`](crate::Config::nats_request_timeout);
    /// as [`Queue::route`] when the consumer cannot be opened.
    pub async fn fetch(
        &self,
        job_type: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.fetch_with_priority(job_type, None, Priority::Normal, max, wait)
            .await
    }

    /// The one fetch of every level: up to `max` messages of `job_type` at
    /// `priority`, from the level's consumer of the type ([`Queue::fetch`]:
    /// waits up to `wait`) or of partition `partition` of it
    /// ([`Queue::fetch_partition`]: asks once). The consumer is opened on
    /// first use.
    ///
    /// # Errors
    /// As [`Queue::fetch`].
    pub async fn fetch_with_priority(
        &self,
        job_type: &str,
        partition: Option<u32>,
        priority: Priority,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let consumer = self.level_consumer(job_type, partition, priority).await?;
        self.fetch_from(&consumer, (job_type, partition), max, wait)
            .await
    }

    /// As [`Queue::fetch`], from the consumer of partition `partition` of
    /// `job_type` (partition mode), created on first use by a worker's queue,
    /// except that it asks once: one pull request, which the server answers at
    /// once with what it has (`wait` only bounds a wait for the connection).
    /// A worker owns many partitions; the fetcher pauses between rounds that
    /// found nothing instead of waiting on each.
    ///
    /// # Errors
    /// As [`Queue::fetch`].
    pub async fn fetch_partition(
        &self,
        job_type: &str,
        partition: u32,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.fetch_with_priority(job_type, Some(partition), Priority::Normal, max, wait)
            .await
    }

    /// The one fetch path: a type's consumer is asked every poll period
    /// until something comes or `wait` passes; a partition's is asked once
    /// (`wait` bounds only a wait for the connection).
    async fn fetch_from(
        &self,
        consumer: &consumer::PullConsumer,
        (job_type, partition): (&str, Option<u32>),
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let span = tracing::debug_span!(
            "tenure.queue.fetch",
            job_type,
            partition,
            max,
            got = tracing::field::Empty
        );
        let name = &consumer.cached_info().name;
        let messages = async {
            if partition.is_none() {
                return self.poll(consumer, (name, Some(job_type)), max, wait).await;
            }
            self.wait_connected(wait).await?;
            let quiet = wait.max(self.inner.settings.poll_period);
            self.pull(consumer, name, max, quiet).await
        }
        .instrument(span.clone())
        .await?;
        Ok(self.deliveries(messages, &span))
    }

    /// The pulled messages as deliveries, their number recorded on `span`.
    fn deliveries(&self, messages: Vec<jetstream::Message>, span: &tracing::Span) -> Vec<Delivery> {
        span.record("got", messages.len());
        let mut out = Vec::with_capacity(messages.len());
        for message in messages {
            match Delivery::new(message, self.clone()) {
                Ok(d) => out.push(d),
                Err(e) => tracing::error!(error = %e, "not a JetStream delivery, skipped"),
            }
        }
        out
    }

    /// Returns at once when connected; otherwise waits up to `wait` for the
    /// client to reconnect.
    async fn wait_connected(&self, wait: Duration) -> Result<(), QueueError> {
        let until = Instant::now() + wait;
        let mut rx = self.inner.connected.clone();
        loop {
            if self.is_connected() {
                return Ok(());
            }
            // Woken by every connection event; the client's own state is the truth.
            match tokio::time::timeout_at(until, rx.changed()).await {
                Ok(Ok(())) => tokio::task::yield_now().await,
                _ => break,
            }
        }
        if self.is_connected() {
            Ok(())
        } else {
            Err(QueueError::Disconnected { waited: wait })
        }
    }

    /// One JetStream round trip (the work stream's info), answered within
    /// [`Config::nats_request_timeout`](crate::Config::nats_request_timeout):
    /// whether the worker can reach NATS now. The runtime's probe of a NATS it
    /// suspects is unreachable (partition mode stands down without it).
    ///
    /// # Errors
    /// [`QueueError::Disconnected`] at once while the client is not connected;
    /// [`QueueError::Read`] when the server does not answer in time.
    pub async fn ping(&self) -> Result<(), QueueError> {
        if !self.is_connected() {
            return Err(QueueError::Disconnected {
                waited: Duration::ZERO,
            });
        }
        let name = &self.inner.names.stream;
        let info = self.inner.js.get_stream(name);
        match tokio::time::timeout(self.inner.settings.request_timeout, info).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(read(name)(e)),
            Err(_) => Err(read(name)(Cause::TimedOut(
                self.inner.settings.request_timeout,
            ))),
        }
    }

    /// Counts of the work stream, its per-type consumers (summed), the DLQ and
    /// pending advisories.
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub async fn stats(&self) -> Result<QueueStats, QueueError> {
        let names = &self.inner.names;
        let work = self
            .inner
            .js
            .get_stream(&names.stream)
            .await
            .map_err(read(&names.stream))?;
        let dlq = self
            .inner
            .js
            .get_stream(&names.dlq_stream)
            .await
            .map_err(read(&names.dlq_stream))?;
        let (mut pending, mut ack_pending, mut redelivered) = (0, 0, 0);
        for (_, info) in self.type_consumer_infos().await? {
            pending += info.num_pending;
            ack_pending += info.num_ack_pending as u64;
            redelivered += info.num_redelivered as u64;
        }
        let mut adv = self.inner.advisories.clone();
        let adv = adv.info().await.map_err(read(&names.advisory_consumer))?;
        Ok(QueueStats {
            work_messages: work.cached_info().state.messages,
            dlq_messages: dlq.cached_info().state.messages,
            pending,
            ack_pending,
            redelivered,
            advisories: adv.num_pending + adv.num_ack_pending as u64,
        })
    }

    /// A request on an ack subject, confirmed by the server's reply.
    async fn ack_request(
        &self,
        reply: async_nats::Subject,
        body: bytes::Bytes,
        kind: &'static str,
        stream_sequence: u64,
    ) -> Result<(), QueueError> {
        self.inner
            .client
            .send_request(
                reply,
                async_nats::Request::new()
                    .payload(body)
                    .timeout(Some(self.inner.settings.request_timeout)),
            )
            .await
            .map(|_| ())
            .map_err(|e| QueueError::Ack {
                kind,
                stream_sequence,
                source: boxed(e),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_message_is_measured_as_the_server_counts_it() {
        let id = JobId::from_key("t", "k");
        // NATS/1.0 line and blank line (12), `Nats-Msg-Id: <81>` (96),
        // `Tenure-Job-Id: <36>` (53), `Tenure-Job-Type: t` (20).
        assert_eq!(job_message_size(id, "t", 0), 181 + MESSAGE_HEADROOM);
        let fits = job_message_size(id, "t", 100);
        assert!(check_job_message(id, "t", 100, fits).is_ok());
        assert!(matches!(
            check_job_message(id, "t", 100, fits - 1),
            Err(QueueError::MessageTooLarge { size, max_payload, .. })
                if size == fits && max_payload == fits - 1
        ));
        assert!(matches!(
            check_job_message(id, "bad type", 0, usize::MAX),
            Err(QueueError::InvalidJobType { .. })
        ));
    }

    #[test]
    fn job_types_must_fit_in_a_subject() {
        assert!(validate_job_type("ledger.transfer").is_ok());
        assert!(validate_job_type("a-b_c.D9").is_ok());
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a.*",
            "a.>",
            "ä",
            &"x".repeat(129),
        ] {
            assert!(
                matches!(
                    validate_job_type(bad),
                    Err(QueueError::InvalidJobType { .. })
                ),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn dlq_subjects_name_the_job() {
        let n = QueueNames::new("ns");
        let id = JobId::from_key("t", "k");
        assert_eq!(n.dlq_subject(Some(id)), format!("ns.dlq.{id}"));
        assert_eq!(n.dlq_subject(None), "ns.dlq._invalid");
        assert_eq!(n.work_subject("a.b"), "ns.jobs.a.b");
        assert_eq!(n.cancel_subject(id), format!("ns.cancel.{id}"));
    }

    #[test]
    fn each_job_type_has_its_own_consumer_name() {
        let n = QueueNames::new("ns");
        let types = ["a.b", "a_b", "a_db", "a__b", "a-b", "a.b.c", "a_d.b"];
        let names: std::collections::HashSet<_> =
            types.iter().map(|t| n.type_consumer(t)).collect();
        assert_eq!(names.len(), types.len(), "one-to-one: {names:?}");
        for t in types {
            let name = n.type_consumer(t);
            assert!(!name.contains('.'), "{name}");
            assert_eq!(n.consumer_job_type(&name).as_deref(), Some(t));
        }
        assert_eq!(n.consumer_job_type("ns_workers"), None);
        assert_eq!(n.consumer_job_type("ns_advisories"), None);
        assert_eq!(n.consumer_job_type("ns_workers_a_x"), None);
        // Partition consumers name their type, whatever the type's spelling.
        for t in ["a", "a_p3", "a.b", "a__p"] {
            let name = n.partition_consumer(t, 12);
            assert!(!name.contains('.'), "{name}");
            assert_eq!(n.consumer_job_type(&name).as_deref(), Some(t), "{name}");
        }
        assert_eq!(n.partition_subject("a.b", 7), "ns.jobs.a.b.7");
        assert_eq!(n.consumer_job_type("ns_workers_a_p"), None);
        assert_eq!(n.consumer_job_type("ns_workers_a_p1x"), None);
    }

    #[test]
    fn each_priority_level_has_its_own_subject_and_consumer_of_its_type() {
        let n = QueueNames::new("ns");
        // Normal: the subjects and consumers of before priorities.
        assert_eq!(
            n.priority_subject("a.b", None, Priority::Normal),
            "ns.jobs.a.b"
        );
        assert_eq!(
            n.priority_subject("a", Some(3), Priority::Normal),
            "ns.jobs.a.3"
        );
        assert_eq!(
            n.priority_consumer("a.b", None, Priority::Normal),
            n.type_consumer("a.b")
        );
        assert_eq!(
            n.priority_consumer("a", Some(3), Priority::Normal),
            n.partition_consumer("a", 3)
        );
        assert_eq!(
            n.priority_subject("a.b", None, Priority::High),
            "ns.jobs.~high.a.b"
        );
        assert_eq!(
            n.priority_subject("a", Some(3), Priority::Low),
            "ns.jobs.~low.a.3"
        );
        // `~` is no job type's: a level's subject is never a type's.
        assert!(validate_job_type("~high.a").is_err());
        let mut names = std::collections::HashSet::new();
        for t in ["a", "a_h", "a.h", "a_l", "h", "a_p1"] {
            for partition in [None, Some(1), Some(12)] {
                for p in Priority::ALL {
                    let name = n.priority_consumer(t, partition, p);
                    assert!(!name.contains('.') && names.insert(name.clone()), "{name}");
                    assert_eq!(n.consumer_job_type(&name).as_deref(), Some(t), "{name}");
                    let subject = n.priority_subject(t, partition, p);
                    let tail = subject.strip_prefix(&n.subject_prefix).unwrap_or_default();
                    let source = n.subject_source(tail, partition.is_some());
                    assert_eq!(source, Some((t.to_string(), partition, p)), "{subject}");
                }
            }
        }
        assert_eq!(n.consumer_job_type("ns_workers_a_hx"), None);
        assert_eq!(n.consumer_job_type("ns_workers_a_h_p"), None);
        assert_eq!(n.subject_source("~normal.a", false), None);
        assert_eq!(n.subject_source("~urgent.a", false), None);
    }
}
