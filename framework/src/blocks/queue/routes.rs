//! Routing by job type: one durable pull consumer per job type, each with the
//! one `filter_subject` `<ns>.jobs.<job_type>` (nats-server 2.9 ignores
//! `filter_subjects`). A worker fetches only from the consumers of the types it
//! registered, so a message of a type no running worker registers stays in the
//! work stream (work-queue retention keeps it until it is acked) and is
//! delivered once a worker registering that type creates its consumer.
//!
//! On a work-queue stream consumers may not overlap, so the one consumer of
//! every type that Tenure used before ([`QueueNames::legacy_consumer`]) is
//! removed when a worker provisions the namespace; its unacknowledged messages
//! stay in the stream and go to the per-type consumers.

use std::collections::{BTreeMap, HashMap};

use async_nats::jetstream::consumer;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::StreamExt;

use super::provision::{Provisioning, ensure_consumer};
use super::{Queue, QueueError, QueueNames, Settings, read, validate_job_type};
use crate::Priority;

/// The per-type consumers a queue handle has opened.
pub(super) struct Routes {
    pub(super) mode: Provisioning,
    consumers: std::sync::Mutex<HashMap<String, consumer::PullConsumer>>,
}

impl Routes {
    pub(super) fn new(mode: Provisioning) -> Self {
        Routes {
            mode,
            consumers: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, job_type: &str) -> Option<consumer::PullConsumer> {
        let map = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        map.get(job_type).cloned()
    }

    fn keep(&self, job_type: &str, c: consumer::PullConsumer) {
        let mut map = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(job_type.to_string(), c);
    }
}

/// The durable consumer of one job type's work subject.
pub(super) fn type_consumer_config(
    names: &QueueNames,
    settings: &Settings,
    job_type: &str,
) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(names.type_consumer(job_type)),
        description: Some(format!("Tenure workers of job type {job_type}")),
        filter_subject: names.work_subject(job_type),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: settings.ack_wait,
        max_deliver: settings.max_deliver,
        max_ack_pending: -1,
        ..Default::default()
    }
}

/// The durable consumer of one job type's subject at `priority`, or of one
/// partition of it (partition mode): `normal`'s is the type's or the
/// partition's consumer of before priorities, unchanged.
pub(super) fn level_consumer_config(
    names: &QueueNames,
    settings: &Settings,
    (job_type, partition, priority): (&str, Option<u32>, Priority),
) -> consumer::pull::Config {
    let level = match priority {
        Priority::Normal => String::new(),
        other => format!(", priority {other}"),
    };
    let description = match partition {
        Some(p) => format!("Tenure owner of partition {p} of job type {job_type}{level}"),
        None => format!("Tenure workers of job type {job_type}{level}"),
    };
    consumer::pull::Config {
        durable_name: Some(names.priority_consumer(job_type, partition, priority)),
        description: Some(description),
        filter_subject: names.priority_subject(job_type, partition, priority),
        ..type_consumer_config(names, settings, job_type)
    }
}

impl Queue {
    /// Opens the consumers of `job_types` (workers call it once at start, with
    /// the types they registered): created or updated by a queue from
    /// [`Queue::provision`], bound by one from [`Queue::connect`] (then
    /// [`QueueError::NotProvisioned`] if no worker of the type ever ran).
    ///
    /// # Errors
    /// [`QueueError::InvalidJobType`], [`QueueError::NotProvisioned`],
    /// [`QueueError::Setup`].
    pub async fn route(&self, job_types: &[&str]) -> Result<(), QueueError> {
        for job_type in job_types {
            self.type_consumer(job_type).await?;
        }
        Ok(())
    }

    /// The consumer of `job_type`, opened on first use as [`Queue::route`] says.
    pub(super) async fn type_consumer(
        &self,
        job_type: &str,
    ) -> Result<consumer::PullConsumer, QueueError> {
        self.level_consumer(job_type, None, Priority::Normal).await
    }

    /// The consumer of `job_type` (of its partition `partition`, in
    /// partition mode) at `priority`, opened on first use as
    /// [`Queue::route`] opens a type's (partition mode: a worker opens the
    /// consumers of the partitions it owns; a `high` or `low` consumer is
    /// opened at its first fetch).
    pub(super) async fn level_consumer(
        &self,
        job_type: &str,
        partition: Option<u32>,
        priority: Priority,
    ) -> Result<consumer::PullConsumer, QueueError> {
        let names = &self.inner.names;
        let name = names.priority_consumer(job_type, partition, priority);
        self.open_consumer(&name, job_type, |names, settings| {
            level_consumer_config(names, settings, (job_type, partition, priority))
        })
        .await
    }

    /// The consumer cached under `key`, or the one `spec` describes for
    /// `job_type`, created or updated by a queue from [`Queue::provision`],
    /// bound otherwise (a producer's queue never fetches), then cached.
    async fn open_consumer(
        &self,
        key: &str,
        job_type: &str,
        spec: impl FnOnce(&QueueNames, &Settings) -> consumer::pull::Config,
    ) -> Result<consumer::PullConsumer, QueueError> {
        let routes = &self.inner.routes;
        if let Some(c) = routes.cached(key) {
            return Ok(c);
        }
        validate_job_type(job_type)?;
        let spec = spec(&self.inner.names, &self.inner.settings);
        let mode = match routes.mode {
            Provisioning::Apply => Provisioning::Apply,
            _ => Provisioning::Bind,
        };
        let c = ensure_consumer(&self.inner.work_stream, spec, mode).await?;
        routes.keep(key, c.clone());
        Ok(c)
    }

    /// The job types that have a consumer on the server (a worker registering
    /// them ran at some time), with the messages each has not delivered yet.
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub async fn routed_types(&self) -> Result<BTreeMap<String, u64>, QueueError> {
        let infos = self.type_consumer_infos().await?;
        let mut out = BTreeMap::new();
        for (job_type, info) in infos {
            // Partition mode: a type's partitions, summed.
            *out.entry(job_type).or_insert(0) += info.num_pending;
        }
        Ok(out)
    }

    /// The server's info on every per-type consumer of the work stream, with
    /// its job type (other consumers are left out).
    pub(super) async fn type_consumer_infos(
        &self,
    ) -> Result<Vec<(String, consumer::Info)>, QueueError> {
        let names = &self.inner.names;
        let mut infos = self.inner.work_stream.consumers();
        let mut out = Vec::new();
        while let Some(info) = infos.next().await {
            let info = info.map_err(read(&names.stream))?;
            if let Some(job_type) = names.consumer_job_type(&info.name) {
                out.push((job_type, info));
            }
        }
        Ok(out)
    }

    /// Messages in the work stream by job type (the subject's last tokens),
    /// whether or not any consumer takes them.
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub async fn stored_by_type(&self) -> Result<BTreeMap<String, u64>, QueueError> {
        let names = &self.inner.names;
        let filter = format!("{}>", names.subject_prefix);
        let stream = self.inner.work_stream.clone();
        let mut subjects = stream
            .info_with_subjects(filter)
            .await
            .map_err(read(&names.stream))?;
        let mut out = BTreeMap::new();
        while let Some(entry) = subjects.next().await {
            let (subject, count) = entry.map_err(read(&names.stream))?;
            let partitioned = self.inner.settings.partitions.is_some();
            let source = subject
                .strip_prefix(&names.subject_prefix)
                .and_then(|tail| names.subject_source(tail, partitioned));
            if let Some((job_type, _, _)) = source {
                *out.entry(job_type).or_insert(0) += count as u64;
            }
        }
        Ok(out)
    }

    /// How long the oldest message of `job_type` has been stored in the work
    /// stream (a job waiting, or one running: a work-stream message stays
    /// until its job is settled); `None` when the type has none. One
    /// `STREAM.MSG.GET` (the first message on the type's subjects).
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub async fn oldest_stored_age(
        &self,
        job_type: &str,
    ) -> Result<Option<std::time::Duration>, QueueError> {
        let mut oldest = None;
        for priority in Priority::ALL {
            let age = self.oldest_at(job_type, priority).await?;
            oldest = oldest.max(age);
        }
        Ok(oldest)
    }

    /// [`Queue::oldest_stored_age`] of one priority level's subjects.
    async fn oldest_at(
        &self,
        job_type: &str,
        priority: Priority,
    ) -> Result<Option<std::time::Duration>, QueueError> {
        let names = &self.inner.names;
        let subject = names.priority_subject(job_type, None, priority);
        let subject = match self.inner.settings.partitions {
            Some(_) => format!("{subject}.*"),
            None => subject,
        };
        let stream = &self.inner.work_stream;
        let message = match stream.get_first_raw_message_by_subject(subject, 0).await {
            Ok(m) => m,
            Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => {
                return Ok(None);
            }
            Err(e) => return Err(read(&names.stream)(e)),
        };
        let stored = super::stored_at(message.time.unix_timestamp_nanos());
        let age = std::time::SystemTime::now().duration_since(stored);
        Ok(Some(age.unwrap_or_default()))
    }

    /// The `high` and `low` subjects that hold messages, each as its job
    /// type, partition and level, with its count (messages waiting or in
    /// flight: the stream keeps a message until it is acked). Two stream
    /// info requests (one per level's subjects, `<ns>.jobs.~high.>` and
    /// `<ns>.jobs.~low.>`), answered with the non-empty subjects only: the
    /// fetcher's look at the levels it does not fetch every round.
    ///
    /// # Errors
    /// [`QueueError::Read`].
    pub async fn waiting_levels(&self) -> Result<Vec<LevelCount>, QueueError> {
        let names = &self.inner.names;
        let partitioned = self.inner.settings.partitions.is_some();
        let mut out = Vec::new();
        for priority in [Priority::High, Priority::Low] {
            let filter = format!("{}~{priority}.>", names.subject_prefix);
            let stream = self.inner.work_stream.clone();
            let mut subjects = stream
                .info_with_subjects(filter)
                .await
                .map_err(read(&names.stream))?;
            while let Some(entry) = subjects.next().await {
                let (subject, count) = entry.map_err(read(&names.stream))?;
                let source = subject
                    .strip_prefix(&names.subject_prefix)
                    .and_then(|tail| names.subject_source(tail, partitioned));
                if let Some((job_type, partition, priority)) = source {
                    out.push(LevelCount {
                        job_type,
                        partition,
                        priority,
                        messages: count as u64,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// Messages stored on one priority level's subject of a job type (or of one
/// partition of it): [`Queue::waiting_levels`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LevelCount {
    /// The job type.
    pub job_type: String,
    /// Its partition, in partition mode.
    pub partition: Option<u32>,
    /// The level.
    pub priority: Priority,
    /// Messages stored on the subject (waiting or in flight).
    pub messages: u64,
}

/// Removes the consumer of every type that Tenure used before routing by job
/// type, if it is there (see the module docs).
pub(super) async fn remove_legacy_consumer(
    stream: &async_nats::jetstream::stream::Stream<()>,
    names: &QueueNames,
) -> Result<(), QueueError> {
    if stream.consumer_info(&names.legacy_consumer).await.is_err() {
        return Ok(());
    }
    stream
        .delete_consumer(&names.legacy_consumer)
        .await
        .map_err(super::setup_failed(&names.legacy_consumer))?;
    tracing::warn!(
        consumer = %names.legacy_consumer,
        "removed the consumer of all job types (Tenure before routing by job type); its messages go to the per-type consumers"
    );
    Ok(())
}
