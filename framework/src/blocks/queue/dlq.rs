//! The dead-letter queue: writing entries, reading them back, redriving them, and
//! the listener that dead-letters messages the broker gave up on.

use async_nats::HeaderMap;
use async_nats::jetstream::stream::{DirectGetErrorKind, Stream};
use async_nats::jetstream::{AckKind, message::StreamMessage};
use bytes::Bytes;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::{Published, Queue, QueueError, boxed, headers};
use crate::retry::Backoff;
use crate::{JobId, ObservedFence};

/// Stable DLQ reasons written by the queue itself.
pub mod reasons {
    /// The broker delivered the message `MaxDeliver` times without an ack.
    pub const MAX_DELIVERIES: &str = "max_deliveries";
    /// Prefix of the reasons of [`BadMessage`](super::super::BadMessage)s.
    pub const BAD_MESSAGE: &str = "bad_message";
}

/// What the worker knows when it dead-letters a job (from the job row).
///
/// ```
/// use tenure::blocks::queue::DeadLetterInfo;
/// let info = DeadLetterInfo::new("poison: 6 takeovers");
/// assert_eq!(info.attempts, 0);
/// assert!(info.last_token.is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterInfo {
    /// Why (e.g. `takeovers`, `retries_exhausted`, a [`BadMessage`](super::BadMessage) reason).
    pub reason: String,
    /// The token of the last owner that claimed the job, if any.
    pub last_token: Option<ObservedFence>,
    /// Owners the job lost.
    pub takeovers: u32,
    /// Failed attempts.
    pub attempts: u32,
}

impl DeadLetterInfo {
    /// A reason with no owner, takeovers or attempts.
    pub fn new(reason: impl Into<String>) -> Self {
        DeadLetterInfo {
            reason: reason.into(),
            last_token: None,
            takeovers: 0,
            attempts: 0,
        }
    }
}

/// An entry of the DLQ stream, as [`Queue::dead_letters`] reads it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The entry's sequence in the DLQ stream.
    pub dlq_sequence: u64,
    /// The job id, when the message carried a valid one.
    pub job_id: Option<JobId>,
    /// The job type header, when present.
    pub job_type: Option<String>,
    /// Why it was dead-lettered (empty if the header is missing).
    pub reason: String,
    /// Every header, sorted by name.
    pub headers: Vec<(String, String)>,
    /// The original payload.
    pub payload: Bytes,
    /// The message's sequence in the work stream.
    pub original_sequence: Option<u64>,
    /// The message's subject in the work stream.
    pub original_subject: Option<String>,
    /// How many times the broker had delivered it.
    pub deliveries: Option<u64>,
    /// Failed attempts, when the worker knew them.
    pub attempts: Option<u32>,
    /// Lost owners, when the worker knew them.
    pub takeovers: Option<u32>,
    /// The last owner's token, when there was one.
    pub last_token: Option<ObservedFence>,
}

impl DeadLetter {
    fn from_stored(m: StreamMessage) -> Self {
        let get = |name: &str| m.headers.get(name).map(|v| v.as_str().to_string());
        let num = |name: &str| get(name).and_then(|v| v.parse::<u64>().ok());
        let small = |name: &str| get(name).and_then(|v| v.parse::<u32>().ok());
        DeadLetter {
            dlq_sequence: m.sequence,
            job_id: get(headers::JOB_ID).and_then(|v| v.parse().ok()),
            job_type: get(headers::JOB_TYPE),
            reason: get(headers::REASON).unwrap_or_default(),
            headers: headers::to_pairs(Some(&m.headers)),
            original_sequence: num(headers::ORIGINAL_SEQ),
            original_subject: get(headers::ORIGINAL_SUBJECT),
            deliveries: num(headers::DELIVERIES),
            attempts: small(headers::ATTEMPTS),
            takeovers: small(headers::TAKEOVERS),
            last_token: get(headers::LAST_TOKEN)
                .and_then(|v| v.parse::<i64>().ok())
                .and_then(ObservedFence::new),
            payload: m.payload,
        }
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The work message being dead-lettered.
pub(super) struct Original<'a> {
    pub(super) subject: &'a str,
    pub(super) headers: Option<&'a HeaderMap>,
    pub(super) payload: Bytes,
    pub(super) sequence: u64,
    pub(super) deliveries: u64,
}

/// Owns the task started by [`Queue::spawn_max_deliveries_listener`]; dropping
/// it stops the task.
#[derive(Debug)]
pub struct AdvisoryListener {
    task: JoinHandle<()>,
}

impl AdvisoryListener {
    /// Whether the task has ended (it only ends when stopped).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the task (as dropping the handle does).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for AdvisoryListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A job message the broker gave up on (max deliveries) and the listener
/// dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GaveUp {
    /// The job.
    pub job_id: JobId,
    /// Its type, from the message header.
    pub job_type: Option<String>,
    /// How many times it was delivered.
    pub deliveries: u64,
}

/// A [`GaveUp`] handed to the listener's owner, who settles the job's row
/// (marks it dead) and then answers with [`GaveUpNotice::settled`], or finds
/// a live owner holding the job and answers [`GaveUpNotice::owner_alive`].
/// The listener dead-letters and deletes the message only after a `true`; after
/// `owner_alive` it stores a renewed copy of the message (its delivery count
/// starts over) and deletes the old one, with no dead letter; on `false`, a
/// dropped notice or no answer, the advisory is retried later, so a message
/// never leaves the stream while its row is still `pending`/`running`.
#[derive(Debug)]
pub struct GaveUpNotice {
    /// What the broker gave up on.
    pub gave_up: GaveUp,
    reply: tokio::sync::oneshot::Sender<RowVerdict>,
}

/// The owner's answer to a [`GaveUpNotice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowVerdict {
    Terminal,
    OwnerAlive,
    Unsettled,
}

impl GaveUpNotice {
    /// Answers the listener: `true` once the job's row is terminal.
    pub fn settled(self, row_is_terminal: bool) {
        let verdict = if row_is_terminal {
            RowVerdict::Terminal
        } else {
            RowVerdict::Unsettled
        };
        let _ = self.reply.send(verdict);
    }

    /// Answers the listener: a live owner holds the job (its lock or its
    /// partition), so the broker's count says nothing about the job; the
    /// message is renewed instead of dead-lettered.
    pub fn owner_alive(self) {
        let _ = self.reply.send(RowVerdict::OwnerAlive);
    }
}

/// The server's `io.nats.jetstream.advisory.v1.max_deliver` event.
#[derive(Debug, serde::Deserialize)]
struct MaxDeliveriesAdvisory {
    stream: String,
    consumer: String,
    stream_seq: u64,
    deliveries: u64,
}

/// Headers a direct get adds to the stored ones.
const DIRECT_GET_HEADERS: [&str; 6] = [
    "Nats-Stream",
    "Nats-Sequence",
    "Nats-Subject",
    "Nats-Time-Stamp",
    "Nats-Last-Sequence",
    "Nats-Num-Pending",
];

/// The message as it was stored: without the headers the direct get added.
fn as_stored(mut m: StreamMessage) -> StreamMessage {
    let mut h = HeaderMap::new();
    for (name, values) in m.headers.iter() {
        if DIRECT_GET_HEADERS.contains(&name.to_string().as_str()) {
            continue;
        }
        for v in values {
            h.append(name.clone(), v.clone());
        }
    }
    m.headers = h;
    m
}

impl Queue {
    /// Publishes a dead letter for `original` and waits for the confirmation.
    pub(super) async fn publish_dead_letter(
        &self,
        original: Original<'_>,
        reason: &str,
        known: Option<&DeadLetterInfo>,
    ) -> Result<Published, QueueError> {
        let mut h = HeaderMap::new();
        if let Some(orig) = original.headers {
            for (name, values) in orig.iter() {
                let text = name.to_string();
                let target = if headers::is_nats_header(&text) {
                    match headers::name(&format!("{}{text}", headers::ORIGINAL_PREFIX)) {
                        Some(n) => n,
                        None => continue,
                    }
                } else {
                    name.clone()
                };
                for v in values {
                    h.append(target.clone(), v.clone());
                }
            }
        }
        h.insert(headers::REASON, headers::value(reason));
        h.insert(
            headers::DELIVERIES,
            headers::value(&original.deliveries.to_string()),
        );
        h.insert(
            headers::ORIGINAL_SEQ,
            headers::value(&original.sequence.to_string()),
        );
        h.insert(headers::ORIGINAL_SUBJECT, headers::value(original.subject));
        if let Some(k) = known {
            h.insert(headers::TAKEOVERS, headers::value(&k.takeovers.to_string()));
            h.insert(headers::ATTEMPTS, headers::value(&k.attempts.to_string()));
            if let Some(t) = k.last_token {
                h.insert(headers::LAST_TOKEN, headers::value(&t.get().to_string()));
            }
        }
        // One entry per work message, however many paths dead-letter it.
        h.insert(
            async_nats::header::NATS_MESSAGE_ID,
            headers::value(&format!("tenure-dlq/{}", original.sequence)),
        );
        let job_id = original
            .headers
            .and_then(|h| h.get(headers::JOB_ID))
            .and_then(|v| v.as_str().parse::<JobId>().ok());
        let subject = self.inner.names.dlq_subject(job_id);
        // Measured on nats-server 2.9: a publish that follows the first one's
        // confirmation closely is sometimes stored although it carries the same
        // `Nats-Msg-Id`. So look first: if the job's last DLQ entry is this very
        // work message, it is dead-lettered already.
        if job_id.is_some() {
            let last = self
                .inner
                .dlq_stream
                .direct_get_builder()
                .last_by_subject(subject.clone())
                .send()
                .await;
            if let Ok(last) = last {
                let last = as_stored(last);
                let seq = original.sequence.to_string();
                if last.headers.get(headers::ORIGINAL_SEQ).map(|v| v.as_str()) == Some(seq.as_str())
                {
                    return Ok(Published {
                        sequence: last.sequence,
                        duplicate: true,
                    });
                }
            }
        }
        self.publish_confirmed(subject, h, original.payload).await
    }

    /// Reads up to `limit` DLQ entries, oldest first.
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        self.dead_letters_after(0, limit).await
    }

    /// Reads up to `limit` DLQ entries with a sequence above `after` (paging:
    /// pass the last [`DeadLetter::dlq_sequence`] seen).
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub async fn dead_letters_after(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        let all = format!("{}>", self.inner.names.dlq_subject_prefix);
        self.dead_letters_on(&all, after.saturating_add(1), limit)
            .await
    }

    /// Reads up to `limit` DLQ entries of `job_id`, oldest first: direct gets
    /// by the job's DLQ subject, so other jobs' entries are never read, however
    /// many come before them.
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub async fn dead_letters_of(
        &self,
        job_id: JobId,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        let subject = self.inner.names.dlq_subject(Some(job_id));
        self.dead_letters_on(&subject, 1, limit).await
    }

    /// Up to `limit` DLQ entries on `subject` (a wildcard or one job's
    /// subject) from sequence `seq` on, oldest first.
    async fn dead_letters_on(
        &self,
        subject: &str,
        mut seq: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        let mut out = Vec::new();
        while out.len() < limit {
            match self.next_dead_letter(subject, seq).await? {
                Some(m) => {
                    seq = m.sequence.saturating_add(1);
                    out.push(DeadLetter::from_stored(m));
                }
                None => break,
            }
        }
        Ok(out)
    }

    /// The first DLQ entry on `subject` at or after `seq`.
    async fn next_dead_letter(
        &self,
        subject: &str,
        seq: u64,
    ) -> Result<Option<StreamMessage>, QueueError> {
        let names = &self.inner.names;
        self.get_stored(
            &self.inner.dlq_stream,
            &names.dlq_stream,
            seq,
            Some(subject),
        )
        .await
    }

    /// A stored message by sequence (or the first at or after `seq` on `subject`);
    /// `None` when there is none.
    ///
    /// A direct get, not the typed `STREAM.MSG.GET` of async-nats 0.51: that one
    /// keeps only the last value of a header that has several. The headers the
    /// direct get adds (`Nats-Stream`, `Nats-Sequence`, ...) are removed.
    pub(super) async fn get_stored(
        &self,
        stream: &Stream<()>,
        name: &str,
        seq: u64,
        subject: Option<&str>,
    ) -> Result<Option<StreamMessage>, QueueError> {
        let mut get = stream.direct_get_builder().sequence(seq);
        if let Some(subject) = subject {
            get = get.next_by_subject(subject);
        }
        match get.send().await {
            Ok(m) => Ok(Some(as_stored(m))),
            Err(e) if matches!(e.kind(), DirectGetErrorKind::NotFound) => Ok(None),
            Err(e) => Err(QueueError::Read {
                stream: name.to_string(),
                source: boxed(e),
            }),
        }
    }

    /// The DLQ's last sequence now: a scan stops there, so entries that fail
    /// again while it runs are not redriven twice in one pass.
    async fn dlq_last_sequence(&self) -> Result<u64, QueueError> {
        let stream = self
            .inner
            .js
            .get_stream(&self.inner.names.dlq_stream)
            .await
            .map_err(|e| QueueError::Read {
                stream: self.inner.names.dlq_stream.clone(),
                source: boxed(e),
            })?;
        Ok(stream.cached_info().state.last_sequence)
    }

    /// Republishes every DLQ entry of `job_id` to the work stream (its original
    /// subject, its original headers minus the DLQ ones, a fresh `Nats-Msg-Id`
    /// `<job_id>/redrive/<dlq_sequence>` so the duplicate window does not drop it),
    /// waits for each confirmation, then deletes the entry from the DLQ. Returns
    /// how many entries were redriven (0: none for that job).
    ///
    /// Running it twice, or concurrently, is safe: inside the duplicate window the
    /// republish is de-duplicated; later a second message for the job is admitted
    /// against the job row like any duplicate.
    ///
    /// # Fencing
    /// The job row's takeovers and attempts must be reset too (with a fenced
    /// update, by the caller), or the job goes straight back to the DLQ.
    ///
    /// # Errors
    /// [`QueueError::Read`], [`QueueError::Publish`], [`QueueError::Delete`],
    /// [`QueueError::Redrive`] (an entry without an original subject or job type).
    pub async fn redrive(&self, job_id: JobId) -> Result<usize, QueueError> {
        let span = tracing::info_span!("tenure.queue.redrive", %job_id);
        async move {
            let last = self.dlq_last_sequence().await?;
            let subject = self.inner.names.dlq_subject(Some(job_id));
            let mut seq = 1;
            let mut n = 0;
            while let Some(m) = self.next_dead_letter(&subject, seq).await? {
                if m.sequence > last {
                    break;
                }
                seq = m.sequence.saturating_add(1);
                self.redrive_entry(DeadLetter::from_stored(m)).await?;
                n += 1;
            }
            tracing::info!(entries = n, "redriven");
            Ok(n)
        }
        .instrument(span)
        .await
    }

    /// Deletes every DLQ entry of `job_id` (an operator cancelled the dead job:
    /// it is never redriven); returns how many were deleted (0: none).
    /// Running it twice, or concurrently, is safe: an entry already gone
    /// counts as deleted.
    ///
    /// # Errors
    /// [`QueueError::Read`], [`QueueError::Delete`]; entries deleted before
    /// the error stay deleted.
    pub async fn discard(&self, job_id: JobId) -> Result<usize, QueueError> {
        let span = tracing::info_span!("tenure.queue.discard", %job_id);
        async move {
            let last = self.dlq_last_sequence().await?;
            let subject = self.inner.names.dlq_subject(Some(job_id));
            let (mut seq, mut n) = (1, 0);
            while let Some(m) = self.next_dead_letter(&subject, seq).await? {
                if m.sequence > last {
                    break;
                }
                seq = m.sequence.saturating_add(1);
                let names = &self.inner.names;
                self.delete_stored(&self.inner.dlq_stream, &names.dlq_stream, m.sequence)
                    .await?;
                n += 1;
            }
            tracing::info!(entries = n, "DLQ entries discarded");
            Ok(n)
        }
        .instrument(span)
        .await
    }

    /// Redrives every DLQ entry whose reason is exactly `reason` and that names a
    /// valid job (entries without one stay: they would fail the same way); returns
    /// the job ids, each once, in DLQ order. See [`Queue::redrive`].
    ///
    /// # Fencing
    /// Reset each returned job's row as for [`Queue::redrive`].
    ///
    /// # Errors
    /// As [`Queue::redrive`]; entries redriven before the error stay redriven.
    pub async fn redrive_reason(&self, reason: &str) -> Result<Vec<JobId>, QueueError> {
        let span = tracing::info_span!("tenure.queue.redrive_reason", reason);
        async move {
            let last = self.dlq_last_sequence().await?;
            let all = format!("{}>", self.inner.names.dlq_subject_prefix);
            let mut seq = 1;
            let mut jobs = Vec::new();
            while let Some(m) = self.next_dead_letter(&all, seq).await? {
                if m.sequence > last {
                    break;
                }
                seq = m.sequence.saturating_add(1);
                let entry = DeadLetter::from_stored(m);
                if entry.reason != reason {
                    continue;
                }
                let Some(job) = entry.job_id else {
                    tracing::warn!(
                        dlq_sequence = entry.dlq_sequence,
                        "entry without a valid job id is not redriven"
                    );
                    continue;
                };
                self.redrive_entry(entry).await?;
                if !jobs.contains(&job) {
                    jobs.push(job);
                }
            }
            tracing::info!(jobs = jobs.len(), "redriven");
            Ok(jobs)
        }
        .instrument(span)
        .await
    }

    async fn redrive_entry(&self, entry: DeadLetter) -> Result<(), QueueError> {
        let names = &self.inner.names;
        let subject = match (&entry.original_subject, &entry.job_type) {
            (Some(s), _) if s.starts_with(&names.subject_prefix) => s.clone(),
            (_, Some(t)) if super::validate_job_type(t).is_ok() => match entry.job_id {
                Some(id) => self.job_subject(t, id),
                None => names.work_subject(t),
            },
            _ => {
                return Err(QueueError::Redrive {
                    dlq_sequence: entry.dlq_sequence,
                    reason: "no original subject in the work stream and no valid job type".into(),
                });
            }
        };
        let mut h = HeaderMap::new();
        for (k, v) in &entry.headers {
            let dlq_only = headers::DLQ_ONLY.contains(&k.as_str())
                || k.starts_with(headers::ORIGINAL_PREFIX)
                || headers::is_nats_header(k);
            if dlq_only {
                continue;
            }
            if let Some(name) = headers::name(k) {
                h.append(name, headers::value(v));
            }
        }
        let job = entry
            .job_id
            .map_or_else(|| "_invalid".to_string(), |j| j.to_string());
        h.insert(
            async_nats::header::NATS_MESSAGE_ID,
            headers::value(&format!("{job}/redrive/{}", entry.dlq_sequence)),
        );
        let published = self.publish_confirmed(subject, h, entry.payload).await?;
        tracing::info!(
            dlq_sequence = entry.dlq_sequence,
            sequence = published.sequence,
            duplicate = published.duplicate,
            "republished to the work stream"
        );
        self.delete_stored(
            &self.inner.dlq_stream,
            &names.dlq_stream,
            entry.dlq_sequence,
        )
        .await
    }

    /// Deletes a stored message; one already gone counts as deleted.
    async fn delete_stored(
        &self,
        stream: &Stream<()>,
        name: &str,
        sequence: u64,
    ) -> Result<(), QueueError> {
        match stream.delete_message(sequence).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // nats-server 2.9 answers a missing sequence with error 10057 and
                // varying descriptions: ask whether the message is still there.
                if self
                    .get_stored(stream, name, sequence, None)
                    .await?
                    .is_none()
                {
                    Ok(())
                } else {
                    Err(QueueError::Delete {
                        stream: name.to_string(),
                        sequence,
                        source: boxed(e),
                    })
                }
            }
        }
    }

    /// Starts the task that dead-letters every message the broker gives up on
    /// (reason [`reasons::MAX_DELIVERIES`]): for each max-deliveries advisory it
    /// loads the message by its stream sequence, publishes it to the DLQ (server
    /// confirmed), deletes it from the work stream, then acks the advisory.
    ///
    /// The advisories are captured in the advisory stream, so one raised while no
    /// listener runs is handled when one starts; every worker may run a listener
    /// (they share the durable consumer, and a message is dead-lettered once even
    /// if two listeners race). Errors are logged and retried with
    /// [`Config::retry_backoff`](crate::Config::retry_backoff); the task ends only
    /// when the returned handle is dropped.
    pub fn spawn_max_deliveries_listener(&self) -> AdvisoryListener {
        self.spawn_max_deliveries_listener_notify(None)
    }

    /// As [`Queue::spawn_max_deliveries_listener`], and reports each message it
    /// dead-lettered on `notify` (so the caller can mark the job row dead). A full
    /// channel delays the listener; it never drops a report.
    pub fn spawn_max_deliveries_listener_notify(
        &self,
        notify: Option<tokio::sync::mpsc::Sender<GaveUpNotice>>,
    ) -> AdvisoryListener {
        let mut queue = self.clone();
        queue.gave_up = notify;
        let span = tracing::info_span!(
            "tenure.queue.advisory_listener",
            consumer = %self.inner.names.advisory_consumer
        );
        AdvisoryListener {
            task: tokio::spawn(async move { queue.advisory_loop().await }.instrument(span)),
        }
    }

    async fn advisory_loop(self) {
        let mut backoff = Backoff::new(self.inner.settings.backoff);
        loop {
            match self.advisory_round().await {
                Ok(()) => backoff.reset(),
                Err(e) => {
                    let sleep = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?sleep, "max-deliveries listener");
                    tokio::time::sleep(sleep).await;
                }
            }
        }
    }

    /// Advisories from the advisory stream (asked for every poll period, up
    /// to `AckWait`, like [`Queue::fetch`]), each handled and acked.
    async fn advisory_round(&self) -> Result<(), QueueError> {
        let wait = self.inner.settings.ack_wait;
        let batch = self
            .poll(
                &self.inner.advisories,
                (&self.inner.names.advisory_consumer, None),
                16,
                wait,
            )
            .await?;
        for message in batch {
            let reply = message.reply.clone();
            let outcome = self.handle_advisory(&message.payload).await;
            let Some(reply) = reply else { continue };
            match outcome {
                Ok(()) => {
                    self.ack_request(reply, Bytes::from(AckKind::Ack), "ack", 0)
                        .await?
                }
                Err(e) => {
                    let delay = self.inner.settings.backoff.base;
                    // Without the nak it comes back after AckWait anyway.
                    let _ = self
                        .ack_request(reply, Bytes::from(AckKind::Nak(Some(delay))), "nak", 0)
                        .await;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    async fn handle_advisory(&self, payload: &[u8]) -> Result<(), QueueError> {
        let names = &self.inner.names;
        let adv: MaxDeliveriesAdvisory = match serde_json::from_slice(payload) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "unreadable max-deliveries advisory, dropped");
                return Ok(());
            }
        };
        if adv.stream != names.stream || names.consumer_job_type(&adv.consumer).is_none() {
            return Ok(());
        }
        let span = tracing::info_span!(
            "tenure.queue.max_deliveries",
            stream_sequence = adv.stream_seq,
            deliveries = adv.deliveries,
            job_id = tracing::field::Empty,
        );
        async move {
            let stored = self
                .get_stored(&self.inner.work_stream, &names.stream, adv.stream_seq, None)
                .await?;
            let Some(stored) = stored else {
                tracing::debug!("message already gone");
                return Ok(());
            };
            if let Some(id) = stored.headers.get(headers::JOB_ID) {
                tracing::Span::current().record("job_id", id.as_str());
            }
            if self.settle_row(&stored.headers, adv.deliveries).await? == RowVerdict::OwnerAlive {
                return self.renew_stored(&stored, adv.stream_seq).await;
            }
            let original = Original {
                subject: stored.subject.as_str(),
                headers: Some(&stored.headers),
                payload: stored.payload.clone(),
                sequence: adv.stream_seq,
                deliveries: adv.deliveries,
            };
            let published = self
                .publish_dead_letter(original, reasons::MAX_DELIVERIES, None)
                .await?;
            self.delete_stored(&self.inner.work_stream, &names.stream, adv.stream_seq)
                .await?;
            tracing::warn!(
                dlq_sequence = published.sequence,
                "the broker gave up on the message: dead-lettered"
            );
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// A given-up message of a job a live owner holds: a renewed copy is
    /// stored (the listener's `Nats-Msg-Id` `<seq>/renew-given-up`, so a
    /// retried advisory stores one), then the old one is deleted.
    async fn renew_stored(&self, stored: &StreamMessage, seq: u64) -> Result<(), QueueError> {
        let msg_id = format!("{seq}/renew-given-up");
        let h = headers::renewed(Some(&stored.headers), &[], &msg_id);
        let subject = stored.subject.to_string();
        let renewed = self
            .publish_confirmed(subject, h, stored.payload.clone())
            .await?;
        let names = &self.inner.names;
        self.delete_stored(&self.inner.work_stream, &names.stream, seq)
            .await?;
        tracing::info!(
            renewed_as = renewed.sequence,
            "the broker gave up on a message of a job a live owner holds: renewed, not dead-lettered"
        );
        Ok(())
    }

    /// Before a given-up message leaves the stream: has the owner (the worker)
    /// mark its job's row terminal, and waits for that. Without an owner, or
    /// for a message that names no job, there is no row to settle.
    async fn settle_row(
        &self,
        stored: &HeaderMap,
        deliveries: u64,
    ) -> Result<RowVerdict, QueueError> {
        let Some(tx) = &self.gave_up else {
            return Ok(RowVerdict::Terminal);
        };
        let Some(job_id) = stored
            .get(headers::JOB_ID)
            .and_then(|v| v.as_str().parse::<JobId>().ok())
        else {
            return Ok(RowVerdict::Terminal);
        };
        let job_type = stored
            .get(headers::JOB_TYPE)
            .map(|v| v.as_str().to_string());
        let (reply, answer) = tokio::sync::oneshot::channel();
        let notice = GaveUpNotice {
            gave_up: GaveUp {
                job_id,
                job_type,
                deliveries,
            },
            reply,
        };
        let verdict = match tx.send(notice).await {
            Ok(()) => answer.await.unwrap_or(RowVerdict::Unsettled),
            Err(_) => RowVerdict::Unsettled,
        };
        match verdict {
            RowVerdict::Unsettled => Err(QueueError::RowNotSettled { job_id }),
            v => Ok(v),
        }
    }
}
