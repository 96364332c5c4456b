//! The producer and operator side: migrate the schema, enqueue jobs, inspect
//! them, redrive dead letters. Composes [`fence`](crate::fence) (job rows) and
//! [`queue`](crate::queue) (messages); neither of those knows the other.

mod batch;
mod mode;
mod outbox;
mod schedules;

pub use batch::{BatchError, EnqueueItemError, ItemResult};
pub use schedules::MAX_TRIGGER_ID;

use crate::fence::{Cancelled, FenceError, FenceStore, Inserted, JobRow, JobStatus, WrongState};
use crate::job::Job;
use crate::queue::{Queue, QueueError};
use crate::steps::StepInfo;
use crate::{Config, JobId, Priority};

use mode::ModeCheck;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// PostgreSQL (job rows).
    #[error("postgresql: {0}")]
    Fence(#[from] FenceError),
    /// NATS.
    #[error("nats: {0}")]
    Queue(#[from] QueueError),
    /// The input does not serialise to JSON.
    #[error("input of job type {job_type} does not serialise: {source}")]
    Input {
        /// The job type.
        job_type: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// Invalid configuration.
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// A delay longer than [`Config::max_delay`] (or a `run_at` further ahead
    /// than that): nothing was enqueued.
    #[error("delay {delay:?} exceeds the configured maximum {max:?}: nothing enqueued")]
    DelayTooLong {
        /// The delay asked for.
        delay: std::time::Duration,
        /// [`Config::max_delay`].
        max: std::time::Duration,
    },
    /// Redrive of a job that is not dead.
    #[error("job {job_id} is {status:?}, not dead: nothing to redrive")]
    NotDead {
        /// The job.
        job_id: JobId,
        /// Its status.
        status: JobStatus,
    },
    /// No job has this id ([`Client::cancel`]); nothing changed.
    #[error("no job {0}")]
    UnknownJob(JobId),
    /// Cancel of a job that already finished (`done`); nothing changed.
    #[error("job {job_id} already finished ({status}): nothing to cancel")]
    JobFinished {
        /// The job.
        job_id: JobId,
        /// Its terminal status.
        status: JobStatus,
    },
    /// Cancel of a dead job whose `on_dead` compensation has not ended (it
    /// runs, or waits for a worker of its type); nothing changed. Cancel again
    /// once it has: cancelling now would leave the compensation half-done.
    #[error(
        "job {job_id} is dead and its on_dead compensation has not ended: \
         not cancelled (cancel again once `tenure job {job_id}` shows it ended)"
    )]
    CompensationPending {
        /// The job.
        job_id: JobId,
    },
    /// [`Client::result`] or [`Client::wait`] asked job `job_id` for the
    /// output of another job type than its own; nothing was decoded.
    #[error(
        "job {job_id} is of type {found:?}, not {asked:?}: its result is not that type's output"
    )]
    WrongJobType {
        /// The job.
        job_id: JobId,
        /// The job type asked for.
        asked: &'static str,
        /// The job row's type.
        found: String,
    },
    /// The job's result (its last step's checkpoint) does not decode as the
    /// job type's output.
    #[error(
        "the result of job {job_id} does not decode as the output of job type {job_type}: {source}"
    )]
    Output {
        /// The job.
        job_id: JobId,
        /// The job type whose output was asked for.
        job_type: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The job ended without a result: `dead` (given up; an operator may
    /// redrive it) or `cancelled`.
    #[error("job {job_id} ended {status} without a result{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    NoResult {
        /// The job.
        job_id: JobId,
        /// Its status, `dead` or `cancelled`.
        status: JobStatus,
        /// The reason it died, or the operator's cancel reason.
        reason: Option<String>,
    },
    /// [`Client::wait`] saw the job unfinished until its timeout.
    #[error("job {job_id} did not finish within {waited:?}")]
    WaitTimedOut {
        /// The job.
        job_id: JobId,
        /// The timeout.
        waited: std::time::Duration,
    },
    /// A cancel reason that cannot be stored ([`MAX_CANCEL_REASON`] bytes at
    /// most, no NUL character); nothing changed.
    #[error("invalid cancel reason: {0}")]
    InvalidReason(&'static str),
    /// No cron schedule has this name ([`Client::pause_schedule`],
    /// [`Client::resume_schedule`], [`Client::trigger_schedule`]); nothing
    /// changed. Schedules exist once a worker that declares them started.
    #[error("no schedule {0:?}")]
    UnknownSchedule(String),
    /// A trigger id that cannot make a key (empty, longer than
    /// [`MAX_TRIGGER_ID`] bytes, or with a control character); nothing
    /// enqueued.
    #[error("invalid trigger id: {0}")]
    InvalidTriggerId(&'static str),
    /// [`Client::retry_now`] of a job that is not waiting in retry backoff
    /// (running, finished, delayed, never failed); nothing changed.
    #[error("job {job_id} is {state}: not waiting to retry, nothing to start now")]
    CannotRetryNow {
        /// The job.
        job_id: JobId,
        /// What it is instead.
        state: WrongState,
    },
    /// [`Client::reschedule`] of a job that is not delayed any more (its
    /// message is out, it runs, it finished); nothing changed.
    #[error("job {job_id} is {state}: no run_at to move")]
    CannotReschedule {
        /// The job.
        job_id: JobId,
        /// What it is instead.
        state: WrongState,
    },
}

/// The longest cancel reason, in bytes.
pub const MAX_CANCEL_REASON: usize = 1000;

/// The result of an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id (determined by job type and idempotency key).
    pub job_id: JobId,
    /// `true` if a job with this key existed already: nothing new was created.
    pub duplicate: bool,
}

/// How to enqueue a job ([`Client::enqueue_with`],
/// [`Client::enqueue_json_with`], [`Client::enqueue_many_with`]): its
/// [`Priority`] and, for a delayed job, when it is due.
///
/// The row records the priority (`JobRow::priority`): every later message
/// of the job (the scheduler leader's publish of a delayed or handed-over
/// job, a redrive, a retry-now, the compensation of a given-up job) goes to
/// the same level. A transactional enqueue ([`Client::enqueue_in`]) is
/// `normal`.
///
/// ```
/// use tenure::{EnqueueOptions, Priority};
/// let soon = chrono::Utc::now() + chrono::Duration::minutes(5);
/// let o = EnqueueOptions::default().priority(Priority::Low).run_at(soon);
/// assert_eq!(o.get_priority(), Priority::Low);
/// assert_eq!(o.get_run_at(), Some(soon));
/// assert_eq!(EnqueueOptions::default().get_priority(), Priority::Normal);
/// assert_eq!(EnqueueOptions::default().get_run_at(), None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueueOptions {
    priority: Priority,
    run_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl EnqueueOptions {
    /// The job's priority level (default [`Priority::Normal`]).
    #[must_use]
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Due at `run_at` (default: now), with the rules of
    /// [`Client::enqueue_at`]: at most [`Config::max_delay`] ahead, and the
    /// scheduler leader publishes it once due.
    #[must_use]
    pub fn run_at(mut self, run_at: chrono::DateTime<chrono::Utc>) -> Self {
        self.run_at = Some(run_at);
        self
    }

    /// The priority set.
    pub fn get_priority(&self) -> Priority {
        self.priority
    }

    /// When the job is due, if set.
    pub fn get_run_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.run_at
    }
}

/// Producer and operator handle.
///
/// ```no_run
/// # async fn demo<J: tenure::Job>(input: J::Input) -> Result<(), tenure::ClientError> {
/// let client = tenure::Client::connect(&tenure::Config::from_env()?).await?;
/// client.migrate().await?;
/// let e = client.enqueue::<J>("order-1234", &input).await?;
/// assert!(!e.duplicate);
/// assert!(client.enqueue::<J>("order-1234", &input).await?.duplicate);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    store: FenceStore,
    queue: Queue,
    max_delay: std::time::Duration,
    mode: ModeCheck,
}

impl Client {
    /// Connects to PostgreSQL and NATS. Streams and consumers that do not exist
    /// yet are created from `cfg` (a producer may start before any worker);
    /// existing ones are left as the workers set them up.
    ///
    /// The namespace's recorded way of owning jobs ([`Config::partitions`])
    /// is checked here: another one is refused. If nothing is recorded yet
    /// (the schema is not migrated, or was migrated by
    /// [`FenceStore::migrate`] alone), connecting records nothing, so a
    /// client that only reads never decides the mode: [`Client::migrate`] or
    /// the client's first enqueue or redrive records it, or is refused with
    /// [`FenceError::PartitionsChanged`] if a worker or another client
    /// recorded another one first. Once a match is seen, publishing costs no
    /// further check (the record never changes).
    ///
    /// # Errors
    /// Invalid configuration, an unreachable server, or
    /// [`FenceError::PartitionsChanged`] (as [`ClientError::Fence`]).
    pub async fn connect(cfg: &Config) -> Result<Self, ClientError> {
        cfg.validate()?;
        let store = FenceStore::connect(cfg).await?;
        // A producer publishing to the wrong subjects would strand its jobs.
        let mode = ModeCheck::at_connect(&store, cfg.partitions).await?;
        Ok(Client {
            store,
            queue: Queue::connect_or_create(cfg).await?,
            max_delay: cfg.max_delay,
            mode,
        })
    }

    /// Applies Tenure's migrations to the configured schema (idempotent),
    /// then records the configured way of owning jobs
    /// ([`Config::partitions`]) if the namespace has none yet.
    ///
    /// # Errors
    /// A database error; [`FenceError::PartitionsChanged`] when the namespace
    /// records another way.
    pub async fn migrate(&self) -> Result<(), ClientError> {
        self.store.migrate().await?;
        Ok(self.mode.record(&self.store).await?)
    }

    /// Before a publish path writes anything: the namespace records this
    /// client's way of owning jobs (see [`Client::connect`]).
    async fn check_mode(&self) -> Result<(), ClientError> {
        Ok(self.mode.before_publish(&self.store).await?)
    }

    /// Enqueues a job of type `J` under `idempotency_key`.
    ///
    /// The job row is inserted first (its primary key deduplicates forever), then
    /// the message is published with `Nats-Msg-Id` = the job id (the broker
    /// deduplicates inside its window). Enqueuing an existing, unfinished job
    /// publishes again, so a producer that crashed between the two writes loses
    /// nothing; workers admit a job once however often it is delivered.
    ///
    /// The row records `J`'s step names ([`JobRow::step_names`]): a worker
    /// whose definition of `J` does not fit the steps the job committed never
    /// resumes it (see [`step_list`](crate::job::step_list)).
    ///
    /// Nothing is written (no row, no mode record) unless the job type can
    /// name a NATS subject and the message fits the server's `max_payload`
    /// with its headers and [`MESSAGE_HEADROOM`](crate::queue::MESSAGE_HEADROOM);
    /// every enqueue path (delayed, transactional, batch) checks the same.
    ///
    /// # Errors
    /// [`QueueError::MessageTooLarge`] and [`QueueError::InvalidJobType`]
    /// (as [`ClientError::Queue`]; nothing written);
    /// [`FenceError::PayloadConflict`] when the key exists with another input;
    /// [`FenceError::PartitionsChanged`] when the namespace records another
    /// way of owning jobs than this client's (checked before anything is
    /// written; see [`Client::connect`]); server errors.
    pub async fn enqueue<J: Job>(
        &self,
        idempotency_key: &str,
        input: &J::Input,
    ) -> Result<Enqueued, ClientError> {
        self.enqueue_with::<J>(idempotency_key, input, EnqueueOptions::default())
            .await
    }

    /// [`Client::enqueue`] with `options`: its [`Priority`] (the level's
    /// subject and consumer; every worker of the type takes higher levels
    /// first without starving lower ones, see [`Priority`]).
    ///
    /// ```no_run
    /// # async fn demo<J: tenure::Job>(client: &tenure::Client, input: J::Input) -> Result<(), tenure::ClientError> {
    /// use tenure::{EnqueueOptions, Priority};
    /// let urgent = EnqueueOptions::default().priority(Priority::High);
    /// client.enqueue_with::<J>("refund-7", &input, urgent).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Client::enqueue`].
    pub async fn enqueue_with<J: Job>(
        &self,
        idempotency_key: &str,
        input: &J::Input,
        options: EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
        let value = input_value::<J>(input)?;
        let job_id = JobId::from_key(J::NAME, idempotency_key);
        let job = (job_id, J::NAME, Some(J::STEPS));
        self.enqueue_value(job, &value, options).await
    }

    /// Every single enqueue's path: the delay and the message checked, the
    /// mode checked, the row inserted (with `steps`, a typed definition's),
    /// the message published unless the row says not to.
    async fn enqueue_value(
        &self,
        (job_id, job_type, steps): (JobId, &str, Option<&[StepInfo]>),
        value: &serde_json::Value,
        options: EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
        if let Some(run_at) = options.run_at {
            self.check_delay(run_at)?;
        }
        let payload = self.checked_payload(job_id, job_type, value)?;
        self.check_mode().await?;
        let when = (options.run_at, steps);
        let inserted = self
            .store
            .insert_row(job_id, job_type, value, when, options.priority)
            .await?;
        let delayed = options.run_at.is_some();
        let publish = (payload, options.priority);
        self.publish_unless_waiting(job_id, job_type, inserted, delayed, publish)
            .await
    }

    /// Enqueues a job by type name with a JSON input (for tools and other
    /// languages). Workers dead-letter it if the input does not fit the type.
    /// The row records no step list: the first worker that claims it records
    /// its own.
    ///
    /// # Errors
    /// [`QueueError::InvalidJobType`] for a type that cannot name a NATS
    /// subject (nothing written); as [`Client::enqueue`] otherwise.
    pub async fn enqueue_json(
        &self,
        job_type: &str,
        idempotency_key: &str,
        input: serde_json::Value,
    ) -> Result<Enqueued, ClientError> {
        let options = EnqueueOptions::default();
        self.enqueue_json_with(job_type, idempotency_key, input, options)
            .await
    }

    /// [`Client::enqueue_json`] with `options` (see [`Client::enqueue_with`]).
    ///
    /// # Errors
    /// As [`Client::enqueue_json`].
    pub async fn enqueue_json_with(
        &self,
        job_type: &str,
        idempotency_key: &str,
        input: serde_json::Value,
        options: EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
        let job_id = JobId::from_key(job_type, idempotency_key);
        let job = (job_id, job_type, None);
        self.enqueue_value(job, &input, options).await
    }

    /// Enqueues a job by type name with a JSON input, due at `run_at`: the
    /// delayed form of [`Client::enqueue_json`] (`tenure enqueue --at`), with
    /// the rules of [`Client::enqueue_at`].
    ///
    /// # Errors
    /// [`ClientError::DelayTooLong`] (nothing enqueued); as
    /// [`Client::enqueue_json`] otherwise.
    pub async fn enqueue_json_at(
        &self,
        job_type: &str,
        idempotency_key: &str,
        input: serde_json::Value,
        run_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Enqueued, ClientError> {
        let options = EnqueueOptions::default().run_at(run_at);
        self.enqueue_json_with(job_type, idempotency_key, input, options)
            .await
    }

    /// Enqueues a job of type `J` under `idempotency_key`, due `delay` from now.
    ///
    /// The row is inserted with `run_at` and no message is published: the
    /// elected scheduler leader (one worker per namespace) publishes it once
    /// due, so a waiting job costs the broker nothing. Nothing runs it before
    /// `run_at`. A zero delay runs it now, like [`Client::enqueue`]. The same
    /// idempotency rules as `enqueue` hold; an existing job keeps its own
    /// `run_at`.
    ///
    /// ```no_run
    /// # async fn demo<J: tenure::Job>(client: tenure::Client, input: J::Input) -> Result<(), tenure::ClientError> {
    /// use std::time::Duration;
    /// client.enqueue_after::<J>("reminder-42", &input, Duration::from_secs(3600)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::DelayTooLong`] beyond [`Config::max_delay`] (nothing
    /// enqueued); as [`Client::enqueue`] otherwise.
    pub async fn enqueue_after<J: Job>(
        &self,
        idempotency_key: &str,
        input: &J::Input,
        delay: std::time::Duration,
    ) -> Result<Enqueued, ClientError> {
        let delay_chrono = chrono::Duration::from_std(delay).map_err(|_| self.too_long(delay))?;
        let run_at = chrono::Utc::now()
            .checked_add_signed(delay_chrono)
            .ok_or_else(|| self.too_long(delay))?;
        self.enqueue_at::<J>(idempotency_key, input, run_at).await
    }

    /// Enqueues a job of type `J` under `idempotency_key`, due at `run_at`. A
    /// `run_at` in the past is not an error: the job runs now. See
    /// [`Client::enqueue_after`].
    ///
    /// # Errors
    /// [`ClientError::DelayTooLong`] when `run_at` is further ahead than
    /// [`Config::max_delay`] (nothing enqueued); as [`Client::enqueue`].
    pub async fn enqueue_at<J: Job>(
        &self,
        idempotency_key: &str,
        input: &J::Input,
        run_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Enqueued, ClientError> {
        let options = EnqueueOptions::default().run_at(run_at);
        self.enqueue_with::<J>(idempotency_key, input, options)
            .await
    }

    /// [`ClientError::DelayTooLong`] for a `run_at` further ahead than
    /// [`Config::max_delay`].
    fn check_delay(&self, run_at: chrono::DateTime<chrono::Utc>) -> Result<(), ClientError> {
        let ahead = (run_at - chrono::Utc::now()).to_std().unwrap_or_default();
        if ahead > self.max_delay {
            return Err(self.too_long(ahead));
        }
        Ok(())
    }

    fn too_long(&self, delay: std::time::Duration) -> ClientError {
        ClientError::DelayTooLong {
            delay,
            max: self.max_delay,
        }
    }

    /// Publishes the job's message unless its row says not to: a terminal job,
    /// or a delayed one awaiting publication by the scheduler leader (a message
    /// now would run it early). The row is read only for a duplicate or a
    /// `delayed` insert: a new immediate job needs no look.
    async fn publish_unless_waiting(
        &self,
        job_id: JobId,
        job_type: &str,
        inserted: Inserted,
        delayed: bool,
        (payload, priority): (bytes::Bytes, Priority),
    ) -> Result<Enqueued, ClientError> {
        let duplicate = match inserted {
            Inserted::New => false,
            Inserted::Existing => true,
            // Finished, and its row pruned: nothing to run, nothing to read.
            Inserted::Pruned(_) => {
                return Ok(Enqueued {
                    job_id,
                    duplicate: true,
                });
            }
        };
        let mut priority = priority;
        if (duplicate || delayed)
            && let Some(row) = self.store.job(job_id).await?
        {
            if row.status.is_terminal() || row.awaiting_publish {
                return Ok(Enqueued { job_id, duplicate });
            }
            // An existing job keeps the level it was enqueued at.
            priority = row.priority;
        }
        self.queue
            .publish_job_with_priority(job_id, job_type, payload, priority)
            .await?;
        Ok(Enqueued { job_id, duplicate })
    }

    /// Before any enqueue path writes anything (the mode record included):
    /// the job type can name a NATS subject and job `job_id`'s message with
    /// `input` fits the server's `max_payload`
    /// ([`QueueError::InvalidJobType`], [`QueueError::MessageTooLarge`]).
    /// Returns the payload to publish.
    pub(crate) fn checked_payload(
        &self,
        job_id: JobId,
        job_type: &str,
        input: &serde_json::Value,
    ) -> Result<bytes::Bytes, ClientError> {
        let payload = serde_json::to_vec(input).map_err(|source| ClientError::Input {
            job_type: "json",
            source,
        })?;
        self.queue
            .check_job_message(job_id, job_type, payload.len())?;
        Ok(payload.into())
    }

    /// The job's row.
    ///
    /// # Errors
    /// A database error.
    pub async fn job(&self, job_id: JobId) -> Result<Option<JobRow>, ClientError> {
        Ok(self.store.job(job_id).await?)
    }

    /// The job's result: its last step's output, typed as `J`'s output, once
    /// the job is `done`; `None` while it is `pending` or `running`.
    ///
    /// ```no_run
    /// # async fn demo<J: tenure::Job>(client: &tenure::Client, input: J::Input) -> Result<(), tenure::ClientError> {
    /// let job = client.enqueue::<J>("order-1234", &input).await?;
    /// if let Some(output) = client.result::<J>(job.job_id).await? {
    ///     // J::Output, as the last step returned it
    /// #   let _ = output;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::UnknownJob`]; [`ClientError::WrongJobType`] when the
    /// job is not of type `J`; [`ClientError::NoResult`] for a `dead` or
    /// `cancelled` job (with the reason); [`ClientError::Output`] when the
    /// stored output does not decode as `J::Output` (never a panic); a
    /// database error.
    pub async fn result<J: Job>(&self, job_id: JobId) -> Result<Option<J::Output>, ClientError> {
        output_of::<J>(self.row(job_id).await?)
    }

    /// Waits at most `timeout` for the job to finish, and returns its result
    /// (see [`Client::result`]).
    ///
    /// It does not poll the table: it subscribes to the job's completion
    /// notice (core NATS, `<ns>.finished.<job_id>`, which the worker publishes
    /// after the commit that ends the job) first, then reads the row (a job
    /// that finished before the subscription is seen here), then waits for a
    /// notice and reads the row again. A lost notice (a reconnect) costs at
    /// most the timeout: the row is read once more before giving up. A job
    /// that died is waited for until its `on_dead` hook (if any) committed
    /// (at most the timeout; then [`ClientError::NoResult`]).
    ///
    /// ```no_run
    /// # async fn demo<J: tenure::Job>(client: &tenure::Client, input: J::Input) -> Result<(), tenure::ClientError> {
    /// use std::time::Duration;
    /// let job = client.enqueue::<J>("order-1234", &input).await?;
    /// let output: J::Output = client.wait::<J>(job.job_id, Duration::from_secs(30)).await?;
    /// # let _ = output;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::WaitTimedOut`] if the job is still unfinished at the
    /// timeout; as [`Client::result`] otherwise (a `dead` or `cancelled` job
    /// is [`ClientError::NoResult`] as soon as it ends).
    pub async fn wait<J: Job>(
        &self,
        job_id: JobId,
        timeout: std::time::Duration,
    ) -> Result<J::Output, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut notices = self.queue.finished_notices(job_id).await?;
        loop {
            let row = self.row(job_id).await?;
            // A dead job whose `on_dead` hook has not committed is not over
            // yet: its completion notice follows the compensation.
            let compensating = row.status == JobStatus::Dead && row.compensation_pending;
            if !compensating && let Some(output) = output_of::<J>(row)? {
                return Ok(output);
            }
            match tokio::time::timeout_at(deadline, notices.next()).await {
                Ok(true) => {}
                // The subscription ended (the connection closed): no notice
                // can come; the last read decides.
                Ok(false) | Err(_) => break,
            }
        }
        let last = output_of::<J>(self.row(job_id).await?)?;
        last.ok_or(ClientError::WaitTimedOut {
            job_id,
            waited: timeout,
        })
    }

    /// The job's row, or [`ClientError::UnknownJob`].
    async fn row(&self, job_id: JobId) -> Result<JobRow, ClientError> {
        self.store
            .job(job_id)
            .await?
            .ok_or(ClientError::UnknownJob(job_id))
    }

    /// Puts a dead job back to work: resets its row (status pending, takeovers and
    /// attempts zero; a compare-and-swap on the fence, so it cannot race a claim),
    /// then moves its DLQ entries back to the work stream (or publishes it afresh
    /// if the DLQ holds none). Returns the number of messages put back.
    ///
    /// A `pending` or `running` job (one that may have lost its message, say
    /// to a crash of an older version between the DLQ publish and the row
    /// update) is published again as it is, row untouched: a second message for a
    /// live job is absorbed by admission and the job lock, and it waits behind
    /// the owner without counting toward the broker's `MaxDeliver`
    /// ([`Delivery::hand_back`](crate::blocks::queue::Delivery::hand_back)), so
    /// this is always safe: the running job's fate does not change.
    ///
    /// # Errors
    /// [`ClientError::NotDead`] for a `done` job, [`FenceError::NotFound`],
    /// [`FenceError::PartitionsChanged`] (as for [`Client::enqueue`]), server
    /// errors.
    pub async fn redrive(&self, job_id: JobId) -> Result<usize, ClientError> {
        self.check_mode().await?;
        let row = self
            .store
            .job(job_id)
            .await?
            .ok_or(FenceError::NotFound(job_id))?;
        match row.status {
            JobStatus::Dead => {}
            // A delayed job not yet due: the scheduler leader publishes it.
            JobStatus::Pending if row.awaiting_publish => return Ok(0),
            JobStatus::Pending | JobStatus::Running => {
                self.publish_row(&row).await?;
                return Ok(1);
            }
            status => return Err(ClientError::NotDead { job_id, status }),
        }
        self.store.reset_for_redrive(job_id).await?;
        let moved = self.queue.redrive(job_id).await?;
        if moved == 0 {
            self.publish_row(&row).await?;
            return Ok(1);
        }
        Ok(moved)
    }

    /// Cancels a job (an operator's decision): its row becomes `cancelled`,
    /// with `reason`; the job is never run again, retried nor dead-lettered,
    /// and its message is acked by the worker that meets it.
    ///
    /// In this order: (1) a cancel notice over NATS, which makes the owner's
    /// [`StepCtx::cancellation`](crate::StepCtx::cancellation) fire, so a
    /// running step stops and its open transaction rolls back instead of
    /// committing; (2) the row update, which waits for that transaction to end
    /// (the job row lock; at most the connection's `lock_timeout`). **The cancel
    /// takes effect at the commit of the row update**: a step commit that came
    /// before it stands; no claim, step admission or step commit after it
    /// succeeds, whether or not the notice reached the owner.
    ///
    /// A `dead` job can be cancelled too (an operator gives up on it): the row
    /// becomes `cancelled`, then its DLQ entries are deleted, so it is never
    /// redriven (a [`Client::redrive`] of it is refused as not dead). No
    /// notice: nobody runs it. If deleting the entries fails, the error says
    /// so and the row stays cancelled; cancel again to retry the deletion.
    ///
    /// Returns [`Cancelled::Now`], or [`Cancelled::Already`] when the job was
    /// cancelled before (nothing changes).
    ///
    /// ```no_run
    /// # async fn demo(client: &tenure::Client, job_id: tenure::JobId) -> Result<(), tenure::ClientError> {
    /// use tenure::Cancelled;
    /// match client.cancel(job_id, "customer withdrew the order").await? {
    ///     Cancelled::Now => println!("cancelled"),
    ///     Cancelled::Already => println!("was cancelled already"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::UnknownJob`], [`ClientError::JobFinished`] (`done`),
    /// [`ClientError::CompensationPending`] (a dead job whose `on_dead` hook
    /// has not ended), [`ClientError::InvalidReason`], each before anything changed; server
    /// errors (a failed notice publish changes nothing either).
    pub async fn cancel(&self, job_id: JobId, reason: &str) -> Result<Cancelled, ClientError> {
        check_reason(reason)?;
        let row = self.row(job_id).await?;
        match row.status {
            // Also after a dead job's cancel whose DLQ deletion failed.
            JobStatus::Cancelled => {
                self.queue.discard(job_id).await?;
                return Ok(Cancelled::Already);
            }
            JobStatus::Done => {
                let status = row.status;
                return Err(ClientError::JobFinished { job_id, status });
            }
            JobStatus::Dead => {
                let cancelled = self.cancel_row(job_id, reason).await?;
                self.queue.discard(job_id).await?;
                return Ok(cancelled);
            }
            JobStatus::Pending | JobStatus::Running => {}
        }
        // The cancel key, held until the row update committed, confirms the
        // notice to the worker that hears it (`FenceStore::cancel_confirmed`).
        let key = self.store.cancel_key(job_id).await?;
        self.queue.publish_cancel(job_id).await?;
        let cancelled = self.cancel_row(job_id, reason).await;
        if let Err(e) = key.release().await {
            tracing::debug!(%job_id, error = %e, "releasing the cancel key failed (it went with the session)");
        }
        cancelled
    }

    /// Starts now a job that waits in retry backoff (an attempt failed and
    /// its message was handed back for later): under the job's row lock it
    /// checks that the job is pending, failed and published, and records the
    /// history event `retried_now`; then it publishes one more message for
    /// the job. That message makes nobody the owner: a worker admits it,
    /// takes the job's lock and claims the fence as for any delivery, so if a
    /// worker took the job meanwhile (its backoff ended), the new message
    /// waits behind that owner's lock, and is acked once the job is done.
    /// The original message comes back when its backoff ends and is absorbed
    /// the same way (the row is done: acked; the job runs: it waits behind the
    /// lock without counting toward `MaxDeliver`). If the started attempt
    /// fails again, the job has two messages until it ends, so its next
    /// attempt may come before its backoff (each attempt counts as usual).
    ///
    /// # Errors
    /// [`ClientError::UnknownJob`], [`ClientError::CannotRetryNow`] (nothing
    /// changed), [`FenceError::PartitionsChanged`] (as for
    /// [`Client::enqueue`]), server errors (a failed publish after the check
    /// leaves the job waiting as it was; retry-now again).
    pub async fn retry_now(&self, job_id: JobId) -> Result<(), ClientError> {
        self.check_mode().await?;
        let row = self.row(job_id).await?;
        let attempts = self
            .store
            .retry_now(job_id)
            .await
            .map_err(|e| refused(e, |state| ClientError::CannotRetryNow { job_id, state }))?;
        let payload = serde_json::to_vec(&row.input).map_err(|source| ClientError::Input {
            job_type: "json",
            source,
        })?;
        let job = (job_id, row.job_type.as_str(), row.priority);
        self.queue
            .publish_retry_now(job, payload.into(), attempts)
            .await?;
        Ok(())
    }

    /// Moves a delayed job's `run_at` (a `run_at` now or past starts it at
    /// once: the scheduler leader's publisher is woken). Only while the job
    /// still awaits publication: the row update takes the job's row lock,
    /// and the publisher holds the rows it publishes locked until it marked
    /// them published, so a reschedule either comes first (the job is
    /// published at its new time) or finds the job published and changes
    /// nothing. Records the history event `rescheduled`.
    ///
    /// # Errors
    /// [`ClientError::DelayTooLong`] (further ahead than
    /// [`Config::max_delay`]), [`ClientError::UnknownJob`],
    /// [`ClientError::CannotReschedule`] (published, running, finished: nothing
    /// changed), server errors.
    pub async fn reschedule(
        &self,
        job_id: JobId,
        run_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), ClientError> {
        let ahead = (run_at - chrono::Utc::now()).to_std().unwrap_or_default();
        if ahead > self.max_delay {
            return Err(self.too_long(ahead));
        }
        self.store
            .reschedule(job_id, run_at)
            .await
            .map_err(|e| refused(e, |state| ClientError::CannotReschedule { job_id, state }))
    }

    /// The fenced part of [`Client::cancel`]: the row update.
    async fn cancel_row(&self, job_id: JobId, reason: &str) -> Result<Cancelled, ClientError> {
        match self.store.cancel_job(job_id, reason).await {
            Ok(Cancelled::Now) => {
                // Best effort: a waiter reads the row at its timeout anyway.
                let status = JobStatus::Cancelled.as_str();
                if let Err(e) = self.queue.publish_finished(job_id, status).await {
                    tracing::warn!(%job_id, error = %e, "completion notice after the cancel failed");
                }
                Ok(Cancelled::Now)
            }
            Ok(c) => Ok(c),
            Err(FenceError::NotFound(_)) => Err(ClientError::UnknownJob(job_id)),
            Err(FenceError::Terminal { status, .. }) => {
                Err(ClientError::JobFinished { job_id, status })
            }
            Err(FenceError::CompensationPending(_)) => {
                Err(ClientError::CompensationPending { job_id })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Publishes a redrive message for `row`'s job (its input, its type).
    async fn publish_row(&self, row: &JobRow) -> Result<(), ClientError> {
        let payload = serde_json::to_vec(&row.input).map_err(|source| ClientError::Input {
            job_type: "json",
            source,
        })?;
        self.queue
            .publish_redrive((row.id, &row.job_type, row.priority), payload.into())
            .await?;
        Ok(())
    }

    /// Guards one of your tables: from now on PostgreSQL refuses every write to
    /// it that does not come from a step's fenced transaction ([`StepCtx::db`])
    /// of the job's current owner. Idempotent. The whole contract is at
    /// [`FenceStore::install_guard`].
    ///
    /// # Errors
    /// [`FenceError::InvalidName`], [`FenceError::Unguardable`] (partitioned
    /// tables), database errors (e.g. no such table), as [`ClientError::Fence`].
    ///
    /// [`StepCtx::db`]: crate::StepCtx::db
    pub async fn install_guard(&self, table: &str) -> Result<(), ClientError> {
        Ok(self.store.install_guard(table).await?)
    }

    /// Removes the guard of `table` (see [`install_guard`](Self::install_guard)).
    /// Idempotent.
    ///
    /// # Errors
    /// An invalid name or a database error, as [`ClientError::Fence`].
    pub async fn remove_guard(&self, table: &str) -> Result<(), ClientError> {
        Ok(self.store.remove_guard(table).await?)
    }

    /// Whether `table` is guarded by this store's trigger.
    ///
    /// # Errors
    /// An invalid name or a database error, as [`ClientError::Fence`].
    pub async fn is_guarded(&self, table: &str) -> Result<bool, ClientError> {
        Ok(self.store.is_guarded(table).await?)
    }

    /// Switches the guard off for the transaction open on `conn` only (seeding
    /// data, migrations, an operator's repair). Audited and permission-checked in
    /// the database: see [`FenceStore::bypass_guard`].
    ///
    /// # Errors
    /// The role may not bypass, or a database error, as [`ClientError::Fence`].
    pub async fn bypass_guard(&self, conn: &mut sqlx::PgConnection) -> Result<(), ClientError> {
        Ok(self.store.bypass_guard(conn).await?)
    }

    /// Switches the job history (every job's timeline, kept by a trigger on
    /// the job rows) on or off for every worker of this schema at once. It is
    /// on after `migrate`; it costs each step commit one insert, and nothing in
    /// the protocol reads it. See [`FenceStore::set_job_history`].
    ///
    /// # Errors
    /// A role that does not own the schema, or a database error, as
    /// [`ClientError::Fence`].
    pub async fn set_job_history(&self, on: bool) -> Result<(), ClientError> {
        Ok(self.store.set_job_history(on).await?)
    }

    /// Pauses job type `job_type` for every worker of the namespace, within
    /// about [`Tuning::pause_poll`](crate::config::Tuning::pause_poll): its messages
    /// stay in the stream (none is fetched, redelivered or dead-lettered
    /// because of the pause), no held delivery of it is claimed, and a job of
    /// it that is running finishes its current step, then waits, holding its
    /// lock and message, before the next one. Durable (a row) until
    /// [`resume`](Self::resume). `true` when it was not paused already.
    /// Needs the operator's grant (`FenceStore::grant_operator`).
    ///
    /// # Errors
    /// [`QueueError::InvalidJobType`] (as [`ClientError::Queue`]) for a name
    /// no job type can have, before anything is written; server errors.
    pub async fn pause(&self, job_type: &str) -> Result<bool, ClientError> {
        crate::queue::validate_job_type(job_type)?;
        Ok(self.store.pause_type(job_type).await?)
    }

    /// Resumes a paused job type; `true` when it was paused.
    ///
    /// # Errors
    /// As [`pause`](Self::pause).
    pub async fn resume(&self, job_type: &str) -> Result<bool, ClientError> {
        crate::queue::validate_job_type(job_type)?;
        Ok(self.store.resume_type(job_type).await?)
    }

    /// The paused job types.
    ///
    /// # Errors
    /// Server errors.
    pub async fn paused(&self) -> Result<Vec<crate::fence::PausedType>, ClientError> {
        Ok(self.store.paused_types().await?)
    }

    /// The job-row store (PostgreSQL): a building block, for tools.
    pub fn store(&self) -> &FenceStore {
        &self.store
    }

    /// The queue (NATS): a building block, for tools.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }
}

/// A retry-now's or reschedule's refusal as the client's error: an unknown
/// job, or the state `wrong` makes an error of.
fn refused(e: FenceError, wrong: impl FnOnce(WrongState) -> ClientError) -> ClientError {
    match e {
        FenceError::NotFound(id) => ClientError::UnknownJob(id),
        FenceError::WrongState { state, .. } => wrong(state),
        e => e.into(),
    }
}

/// The output of `row`'s job as `J`'s, if it is done (see [`Client::result`]).
fn output_of<J: Job>(row: JobRow) -> Result<Option<J::Output>, ClientError> {
    let job_id = row.id;
    if row.job_type != J::NAME {
        return Err(ClientError::WrongJobType {
            job_id,
            asked: J::NAME,
            found: row.job_type,
        });
    }
    let reason = match row.status {
        JobStatus::Pending | JobStatus::Running => return Ok(None),
        JobStatus::Done => {
            let value = row.checkpoint.unwrap_or(serde_json::Value::Null);
            let output = serde_json::from_value(value).map_err(|source| ClientError::Output {
                job_id,
                job_type: J::NAME,
                source,
            })?;
            return Ok(Some(output));
        }
        JobStatus::Dead => row.last_error,
        JobStatus::Cancelled => row.cancel_reason,
    };
    Err(ClientError::NoResult {
        job_id,
        status: row.status,
        reason,
    })
}

/// A typed job input as the JSON its row and message carry.
pub(crate) fn input_value<J: Job>(input: &J::Input) -> Result<serde_json::Value, ClientError> {
    serde_json::to_value(input).map_err(|source| ClientError::Input {
        job_type: J::NAME,
        source,
    })
}

/// A cancel reason PostgreSQL stores as it is: not too long, no NUL.
fn check_reason(reason: &str) -> Result<(), ClientError> {
    if reason.len() > MAX_CANCEL_REASON {
        return Err(ClientError::InvalidReason("longer than 1000 bytes"));
    }
    if reason.contains('\0') {
        return Err(ClientError::InvalidReason("contains a NUL character"));
    }
    Ok(())
}
