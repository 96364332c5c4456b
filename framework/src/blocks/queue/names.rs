//! The names of a namespace's streams, subjects and consumers, and the rule a
//! job type follows to be a subject's tail.

use super::QueueError;
use crate::{JobId, Priority};

/// The names of a namespace's streams, subjects and consumers.
///
/// ```
/// use tenure::blocks::queue::QueueNames;
/// let n = QueueNames::new("payments");
/// assert_eq!(n.stream, "TENURE_PAYMENTS_JOBS");
/// assert_eq!(n.subject_prefix, "payments.jobs.");
/// assert_eq!(n.type_consumer("ledger.transfer"), "payments_workers_ledger_dtransfer");
/// assert_eq!(n.dlq_stream, "TENURE_PAYMENTS_DLQ");
/// assert_eq!(n.dlq_subject_prefix, "payments.dlq.");
/// assert_eq!(n.finished_subject_prefix, "payments.finished.");
/// assert_eq!(n.ring_subject_prefix, "payments.ring.");
/// assert_eq!(
///     n.advisory_subject,
///     "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.TENURE_PAYMENTS_JOBS.*"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueNames {
    /// The work stream, `TENURE_<NS>_JOBS`.
    pub stream: String,
    /// Work subjects are `<ns>.jobs.<job_type>`.
    pub subject_prefix: String,
    /// The work stream's durable pull consumers are one per job type,
    /// `<ns>_workers_<job type>` ([`QueueNames::type_consumer`]).
    pub consumer_prefix: String,
    /// The one consumer of all job types that Tenure before job-type routing
    /// used, `<ns>_workers`: a worker that provisions removes it (on a work-queue
    /// stream it would overlap the per-type consumers).
    pub legacy_consumer: String,
    /// The DLQ stream, `TENURE_<NS>_DLQ`.
    pub dlq_stream: String,
    /// DLQ subjects are `<ns>.dlq.<job_id>` (or `<ns>.dlq._invalid`).
    pub dlq_subject_prefix: String,
    /// The stream capturing the consumer's max-deliveries advisories,
    /// `TENURE_<NS>_ADVISORIES`.
    pub advisory_stream: String,
    /// `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.*` (every consumer
    /// of the work stream; the listener handles those of [`Self::consumer_prefix`]).
    pub advisory_subject: String,
    /// The durable consumer of the advisory stream, `<ns>_advisories`.
    pub advisory_consumer: String,
    /// Operator cancel notices (core NATS, no stream) are `<ns>.cancel.<job_id>`.
    pub cancel_subject_prefix: String,
    /// Completion notices (core NATS, no stream) are `<ns>.finished.<job_id>`.
    pub finished_subject_prefix: String,
    /// The doorbell: the work stream republishes the headers of each message
    /// it stores from `<ns>.jobs.<tail>` to `<ns>.ring.<tail>`, and idle
    /// workers listening there ask for it at once (`queue/ring.rs`).
    pub ring_subject_prefix: String,
    /// The inbox prefix of every NATS connection Tenure makes for the
    /// namespace, `_INBOX_<ns>`: replies and pull deliveries come to
    /// `_INBOX_<ns>.<id>`, and a namespace's users may subscribe to their own
    /// prefix only ([`NatsPermissions`](super::NatsPermissions)), not to another namespace's.
    pub inbox_prefix: String,
}

/// The first character of a priority level's token in a work subject
/// (`~high`, `~low`): never a job type's.
const LEVEL_MARK: char = '~';

/// A partition number: one or more ASCII digits.
fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The last token of DLQ subjects of messages without a valid job id.
const INVALID_JOB_TOKEN: &str = "_invalid";

impl QueueNames {
    /// The names for `namespace` (already validated by [`Config::validate`](crate::Config::validate)).
    pub fn new(namespace: &str) -> Self {
        let upper = namespace.to_ascii_uppercase();
        let stream = format!("TENURE_{upper}_JOBS");
        QueueNames {
            advisory_subject: format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*"),
            stream,
            subject_prefix: format!("{namespace}.jobs."),
            consumer_prefix: format!("{namespace}_workers_"),
            legacy_consumer: format!("{namespace}_workers"),
            dlq_stream: format!("TENURE_{upper}_DLQ"),
            dlq_subject_prefix: format!("{namespace}.dlq."),
            advisory_stream: format!("TENURE_{upper}_ADVISORIES"),
            advisory_consumer: format!("{namespace}_advisories"),
            cancel_subject_prefix: format!("{namespace}.cancel."),
            finished_subject_prefix: format!("{namespace}.finished."),
            ring_subject_prefix: format!("{namespace}.ring."),
            inbox_prefix: format!("_INBOX_{namespace}"),
        }
    }

    /// The work subject of `job_type`.
    pub fn work_subject(&self, job_type: &str) -> String {
        format!("{}{job_type}", self.subject_prefix)
    }

    /// The work subject of partition `partition` of `job_type` (partition
    /// mode): `<ns>.jobs.<job_type>.<partition>`.
    pub fn partition_subject(&self, job_type: &str, partition: u32) -> String {
        format!("{}{job_type}.{partition}", self.subject_prefix)
    }

    /// The durable consumer of partition `partition` of `job_type`: the type's
    /// consumer name ([`QueueNames::type_consumer`]) and `_p<partition>`.
    pub fn partition_consumer(&self, job_type: &str, partition: u32) -> String {
        format!("{}_p{partition}", self.type_consumer(job_type))
    }

    /// The durable consumer of `job_type`'s work subject: the prefix, then the
    /// type with `_` written `__` and `.` written `_d` (consumer names cannot
    /// hold a dot; the spelling is one-to-one).
    pub fn type_consumer(&self, job_type: &str) -> String {
        let mut name = self.consumer_prefix.clone();
        for c in job_type.chars() {
            match c {
                '_' => name.push_str("__"),
                '.' => name.push_str("_d"),
                c => name.push(c),
            }
        }
        name
    }

    /// The job type whose consumer is `consumer` (`None`: not one of ours).
    /// A partition's consumer and a priority level's name their job type too.
    pub fn consumer_job_type(&self, consumer: &str) -> Option<String> {
        let mut rest = consumer.strip_prefix(&self.consumer_prefix)?.chars();
        let mut job_type = String::new();
        while let Some(c) = rest.next() {
            match c {
                '_' => match rest.next()? {
                    '_' => job_type.push('_'),
                    'd' => job_type.push('.'),
                    'h' | 'l' => {
                        let tail = rest.as_str();
                        let fits = tail.is_empty() || tail.strip_prefix("_p").is_some_and(digits);
                        return (fits && !job_type.is_empty()).then_some(job_type);
                    }
                    'p' => {
                        let fits = digits(rest.as_str());
                        return (fits && !job_type.is_empty()).then_some(job_type);
                    }
                    _ => return None,
                },
                c => job_type.push(c),
            }
        }
        (!job_type.is_empty()).then_some(job_type)
    }

    /// The work subject of `job_type`'s jobs at `priority` (of partition
    /// `partition` in partition mode): `normal` is today's subject
    /// ([`QueueNames::work_subject`], [`QueueNames::partition_subject`]);
    /// `high` and `low` put the token `~high` or `~low` before the type,
    /// `<ns>.jobs.~high.<job_type>[.<partition>]`. A job type cannot start
    /// with `~` ([`validate_job_type`]), so no level subject is a type's.
    pub fn priority_subject(
        &self,
        job_type: &str,
        partition: Option<u32>,
        priority: Priority,
    ) -> String {
        let level = match priority {
            Priority::Normal => String::new(),
            other => format!("{LEVEL_MARK}{other}."),
        };
        match partition {
            Some(p) => format!("{}{level}{job_type}.{p}", self.subject_prefix),
            None => format!("{}{level}{job_type}", self.subject_prefix),
        }
    }

    /// The durable consumer of [`QueueNames::priority_subject`]: `normal`'s
    /// is today's ([`QueueNames::type_consumer`],
    /// [`QueueNames::partition_consumer`]); `high` and `low` add `_h` or
    /// `_l` after the type, before a partition's `_p<partition>`.
    pub fn priority_consumer(
        &self,
        job_type: &str,
        partition: Option<u32>,
        priority: Priority,
    ) -> String {
        let mut name = self.type_consumer(job_type);
        match priority {
            Priority::High => name.push_str("_h"),
            Priority::Low => name.push_str("_l"),
            Priority::Normal => {}
        }
        if let Some(p) = partition {
            name.push_str(&format!("_p{p}"));
        }
        name
    }

    /// The job type, partition and priority of a work subject's tail (after
    /// [`QueueNames::subject_prefix`]); `partitioned`: the namespace is in
    /// partition mode. `None` for a tail that is no job's subject.
    pub fn subject_source(
        &self,
        tail: &str,
        partitioned: bool,
    ) -> Option<(String, Option<u32>, Priority)> {
        let (priority, rest) = match tail.strip_prefix(LEVEL_MARK) {
            Some(level) => {
                let (name, rest) = level.split_once('.')?;
                (name.parse().ok().filter(|p| *p != Priority::Normal)?, rest)
            }
            None => (Priority::Normal, tail),
        };
        if !partitioned {
            return Some((rest.to_string(), None, priority));
        }
        let (job_type, partition) = rest.rsplit_once('.')?;
        Some((
            job_type.to_string(),
            Some(partition.parse().ok()?),
            priority,
        ))
    }

    /// The cancel notice subject of a job, `<ns>.cancel.<job_id>`.
    pub fn cancel_subject(&self, job_id: JobId) -> String {
        format!("{}{job_id}", self.cancel_subject_prefix)
    }

    /// The completion notice subject of a job, `<ns>.finished.<job_id>`.
    pub fn finished_subject(&self, job_id: JobId) -> String {
        format!("{}{job_id}", self.finished_subject_prefix)
    }

    /// The DLQ subject of a job (`None`: a message without a valid job id).
    pub fn dlq_subject(&self, job_id: Option<JobId>) -> String {
        match job_id {
            Some(id) => format!("{}{id}", self.dlq_subject_prefix),
            None => format!("{}{INVALID_JOB_TOKEN}", self.dlq_subject_prefix),
        }
    }
}

/// Checks that a job type can be the tail of a NATS subject: 1-128 characters of
/// `[A-Za-z0-9_-.]`, dot-separated non-empty tokens.
///
/// # Errors
/// [`QueueError::InvalidJobType`] with the reason.
pub(crate) fn validate_job_type(job_type: &str) -> Result<(), QueueError> {
    let fail = |reason| {
        Err(QueueError::InvalidJobType {
            job_type: job_type.to_string(),
            reason,
        })
    };
    if job_type.is_empty() || job_type.len() > 128 {
        return fail("must be 1-128 characters");
    }
    if !job_type
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return fail("only ASCII letters, digits, '_', '-' and '.' are allowed");
    }
    if job_type.split('.').any(str::is_empty) {
        return fail("dot-separated parts must not be empty");
    }
    Ok(())
}
