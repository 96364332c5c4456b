//! Batch enqueue: many jobs in one round trip to PostgreSQL (one statement)
//! and pipelined, confirmed publishes, each item reported on its own.
//!
//! An item whose row was inserted but whose publish was not confirmed is not
//! lost: its row is handed to the scheduler leader (`awaiting_publish`, due
//! now), which publishes it like a delayed job; if even that fails, the item
//! is reported as [`EnqueueItemError::Publish`] and enqueuing it again
//! publishes it (an unfinished duplicate is published again, as
//! [`Client::enqueue`] does).

use crate::fence::{BatchInserted, NewJob};
use crate::job::{Job, StepInfo};
use crate::queue::{JobMessage, QueueError};
use crate::{Client, ClientError, EnqueueOptions, Enqueued, JobId, Priority};

/// Why one item of a batch was not enqueued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueItemError {
    /// Its input does not serialise to JSON: nothing was written for it.
    #[error("input of job type {job_type} does not serialise: {source}")]
    Input {
        /// The job type.
        job_type: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// Its message would be larger than the NATS server takes (see
    /// [`QueueError::MessageTooLarge`]): nothing was written for it.
    #[error(
        "job {job_id}: its message would be {size} bytes, the NATS server takes at most \
         {max_payload}: nothing written"
    )]
    TooLarge {
        /// The job.
        job_id: JobId,
        /// The message's size with headers and headroom, in bytes.
        size: usize,
        /// The server's `max_payload`.
        max_payload: usize,
    },
    /// Its key exists (before the batch or earlier in it) with another input:
    /// nothing was written for it.
    #[error("job {job_id} exists with another job type or payload")]
    PayloadConflict {
        /// The job.
        job_id: JobId,
    },
    /// Its row exists but its publish was not confirmed, and handing it to
    /// the scheduler leader failed too: enqueue it again (that publishes it).
    #[error("job {job_id} was stored but not published: {source}")]
    Publish {
        /// The job.
        job_id: JobId,
        /// The broker's error.
        #[source]
        source: QueueError,
    },
    /// All-or-nothing only: this item was fine, another one failed, so
    /// nothing was written for it.
    #[error("not enqueued: another item of the all-or-nothing batch failed")]
    NotEnqueued,
}

/// Why an all-or-nothing batch ([`Client::enqueue_many_all_or_nothing`])
/// failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Some items are invalid or conflict: nothing was enqueued. One result
    /// per item, in order (the valid ones are [`EnqueueItemError::NotEnqueued`]).
    #[error("{failed} of {total} items failed: nothing enqueued", failed = failed(.items), total = .items.len())]
    Rejected {
        /// Every item's error.
        items: Vec<EnqueueItemError>,
    },
    /// Every row was stored, but some publishes failed as
    /// [`EnqueueItemError::Publish`] says (enqueue those again); one result
    /// per item, in order.
    #[error("stored, but {failed} publishes failed", failed = .items.iter().filter(|i| i.is_err()).count())]
    Unpublished {
        /// Every item's result.
        items: Vec<Result<Enqueued, EnqueueItemError>>,
    },
    /// A server error before anything was stored.
    #[error(transparent)]
    Client(#[from] ClientError),
}

fn failed(items: &[EnqueueItemError]) -> usize {
    items
        .iter()
        .filter(|e| !matches!(e, EnqueueItemError::NotEnqueued))
        .count()
}

/// One item's result of [`Client::enqueue_many`].
pub type ItemResult = Result<Enqueued, EnqueueItemError>;

/// A serialised item: its id and input, or why it has none.
type Prepared = Result<(JobId, serde_json::Value), EnqueueItemError>;

impl Client {
    /// Enqueues many jobs of type `J`, each `(idempotency_key, input)`, in
    /// one statement to PostgreSQL and pipelined confirmed publishes. Returns
    /// one result per item, in order; an invalid item fails alone, the rest
    /// are enqueued. Each item follows [`Client::enqueue`]'s rules: a key that
    /// exists (before the batch, or earlier in it) with the same input is
    /// `duplicate: true` with the same job id; with another input it is
    /// [`EnqueueItemError::PayloadConflict`].
    ///
    /// ```no_run
    /// # async fn demo<J: tenure::Job>(client: &tenure::Client, a: J::Input, b: J::Input) -> Result<(), tenure::ClientError> {
    /// let results = client.enqueue_many::<J>(&[("order-1", a), ("order-2", b)]).await?;
    /// for r in results {
    ///     match r {
    ///         Ok(e) if e.duplicate => println!("{} existed", e.job_id),
    ///         Ok(e) => println!("{} enqueued", e.job_id),
    ///         Err(e) => println!("failed: {e}"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A database error or
    /// [`FenceError::PartitionsChanged`](crate::fence::FenceError::PartitionsChanged)
    /// (as for [`Client::enqueue`]), nothing enqueued. Per item: see
    /// [`EnqueueItemError`].
    pub async fn enqueue_many<J: Job>(
        &self,
        items: &[(impl AsRef<str>, J::Input)],
    ) -> Result<Vec<ItemResult>, ClientError> {
        self.enqueue_many_with::<J>(items, EnqueueOptions::default())
            .await
    }

    /// [`Client::enqueue_many`] with `options` for every item (see
    /// [`Client::enqueue_with`]).
    ///
    /// # Errors
    /// As [`Client::enqueue_many`].
    pub async fn enqueue_many_with<J: Job>(
        &self,
        items: &[(impl AsRef<str>, J::Input)],
        options: EnqueueOptions,
    ) -> Result<Vec<ItemResult>, ClientError> {
        let prepared = prepare::<J>(items, self.queue().max_payload());
        let batch = (J::NAME, J::STEPS, options.get_priority());
        self.enqueue_prepared(batch, prepared, false).await
    }

    /// [`Client::enqueue_many`], all or nothing: if any item is invalid or
    /// conflicts, nothing is enqueued and every item is reported. Once every
    /// row is stored (one transaction), the publishes are as in
    /// `enqueue_many`.
    ///
    /// # Errors
    /// [`BatchError::Rejected`] (nothing enqueued), [`BatchError::Unpublished`],
    /// [`BatchError::Client`].
    pub async fn enqueue_many_all_or_nothing<J: Job>(
        &self,
        items: &[(impl AsRef<str>, J::Input)],
    ) -> Result<Vec<Enqueued>, BatchError> {
        let prepared = prepare::<J>(items, self.queue().max_payload());
        if prepared.iter().any(Result::is_err) {
            let items = prepared
                .into_iter()
                .map(|p| p.err().unwrap_or(EnqueueItemError::NotEnqueued))
                .collect();
            return Err(BatchError::Rejected { items });
        }
        let batch = (J::NAME, J::STEPS, Priority::Normal);
        let results = self.enqueue_prepared(batch, prepared, true).await?;
        all_or_nothing_outcome(results)
    }

    /// Inserts the valid items, publishes the new ones (and unfinished
    /// duplicates), and reports each item.
    async fn enqueue_prepared(
        &self,
        (job_type, steps, priority): (&'static str, &'static [StepInfo], Priority),
        prepared: Vec<Prepared>,
        all_or_nothing: bool,
    ) -> Result<Vec<ItemResult>, ClientError> {
        crate::queue::validate_job_type(job_type)?;
        self.check_mode().await?;
        let mut out: Vec<Option<ItemResult>> = Vec::with_capacity(prepared.len());
        let mut values = Vec::with_capacity(prepared.len());
        for (i, p) in prepared.into_iter().enumerate() {
            match p {
                Ok((id, v)) => {
                    out.push(None);
                    values.push((i, id, v));
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let valid: Vec<(usize, JobId, &serde_json::Value)> =
            values.iter().map(|(i, id, v)| (*i, *id, v)).collect();
        let rows: Vec<NewJob<'_>> = valid
            .iter()
            .map(|(_, id, input)| NewJob {
                id: *id,
                job_type,
                input,
            })
            .collect();
        let found = if rows.is_empty() {
            Vec::new()
        } else {
            self.store()
                .insert_jobs(&rows, Some(steps), priority, all_or_nothing)
                .await?
        };
        let rolled_back = all_or_nothing && found.contains(&BatchInserted::Conflict);
        let mut to_publish = Vec::new();
        for ((i, job_id, input), f) in valid.iter().zip(&found) {
            out[*i] = Some(match f {
                BatchInserted::Conflict => {
                    Err(EnqueueItemError::PayloadConflict { job_id: *job_id })
                }
                _ if rolled_back => Err(EnqueueItemError::NotEnqueued),
                BatchInserted::New => {
                    to_publish.push((*i, *job_id, *input));
                    Ok(Enqueued {
                        job_id: *job_id,
                        duplicate: false,
                    })
                }
                BatchInserted::Existing { publish } => {
                    if *publish {
                        to_publish.push((*i, *job_id, *input));
                    }
                    Ok(Enqueued {
                        job_id: *job_id,
                        duplicate: true,
                    })
                }
            });
        }
        for (i, e) in self.publish_batch((job_type, priority), &to_publish).await {
            out[i] = Some(Err(e));
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or(Err(EnqueueItemError::NotEnqueued)))
            .collect())
    }

    /// Publishes `(index, job, input)` pipelined; a job whose publish failed
    /// is handed to the scheduler leader. Returns the items that are neither
    /// published nor handed over.
    async fn publish_batch(
        &self,
        (job_type, priority): (&str, Priority),
        jobs: &[(usize, JobId, &serde_json::Value)],
    ) -> Vec<(usize, EnqueueItemError)> {
        let messages: Vec<JobMessage<'_>> = jobs
            .iter()
            .map(|(_, job_id, input)| JobMessage {
                job_id: *job_id,
                job_type,
                payload: serde_json::to_vec(input).unwrap_or_default().into(),
                priority,
            })
            .collect();
        let sent = self.queue().publish_jobs(&messages).await;
        let failed: Vec<(usize, JobId, QueueError)> = jobs
            .iter()
            .zip(sent)
            .filter_map(|((i, id, _), r)| r.err().map(|e| (*i, *id, e)))
            .collect();
        if failed.is_empty() {
            return Vec::new();
        }
        let ids: Vec<JobId> = failed.iter().map(|(_, id, _)| *id).collect();
        match self.store().hand_to_publisher(&ids).await {
            Ok(handed) => {
                tracing::warn!(
                    failed = ids.len(),
                    handed = handed.len(),
                    "batch publishes failed; pending rows handed to the scheduler leader"
                );
                // A row the leader will not publish (running, claimed): its
                // failed publish is the item's result.
                failed
                    .into_iter()
                    .filter(|(_, job_id, _)| !handed.contains(job_id))
                    .map(|(i, job_id, source)| (i, EnqueueItemError::Publish { job_id, source }))
                    .collect()
            }
            Err(e) => {
                tracing::warn!(error = %e, "handing unpublished jobs to the scheduler leader failed");
                failed
                    .into_iter()
                    .map(|(i, job_id, source)| (i, EnqueueItemError::Publish { job_id, source }))
                    .collect()
            }
        }
    }
}

/// Serialises each item's input, derives its id, and checks that its
/// message fits `max_payload`.
fn prepare<J: Job>(items: &[(impl AsRef<str>, J::Input)], max_payload: usize) -> Vec<Prepared> {
    items
        .iter()
        .map(|(key, input)| {
            let value = serde_json::to_value(input).map_err(|source| EnqueueItemError::Input {
                job_type: J::NAME,
                source,
            })?;
            let job_id = JobId::from_key(J::NAME, key.as_ref());
            let len = serde_json::to_vec(&value).map_or(0, |v| v.len());
            match crate::queue::check_job_message(job_id, J::NAME, len, max_payload) {
                Err(QueueError::MessageTooLarge {
                    size, max_payload, ..
                }) => Err(EnqueueItemError::TooLarge {
                    job_id,
                    size,
                    max_payload,
                }),
                // An invalid job type fails the whole batch, before anything
                // is written (`enqueue_prepared`).
                Ok(()) | Err(_) => Ok((job_id, value)),
            }
        })
        .collect()
}

/// An all-or-nothing batch's results as one answer.
fn all_or_nothing_outcome(results: Vec<ItemResult>) -> Result<Vec<Enqueued>, BatchError> {
    let stored = results.iter().all(|r| {
        !matches!(
            r,
            Err(EnqueueItemError::PayloadConflict { .. }
                | EnqueueItemError::NotEnqueued
                | EnqueueItemError::TooLarge { .. }
                | EnqueueItemError::Input { .. })
        )
    });
    if !stored {
        let items = results
            .into_iter()
            .map(|r| r.err().unwrap_or(EnqueueItemError::NotEnqueued))
            .collect();
        return Err(BatchError::Rejected { items });
    }
    if results.iter().any(Result::is_err) {
        return Err(BatchError::Unpublished { items: results });
    }
    Ok(results.into_iter().flatten().collect())
}
