//! Typed values shared by every module: [`JobId`], [`StepIndex`], [`LeaseId`],
//! [`FencingToken`] (granted), [`ObservedFence`] (seen).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Any error, boxed: the source of a [`StepError`](crate::StepError) and of a
/// [`QueueError`](crate::blocks::queue::QueueError) (public as
/// `tenure::job::BoxError`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A job's stable identity, determined by its job type and the enqueuer's
/// idempotency key: the same key always names the same job.
///
/// ```
/// use tenure::JobId;
/// let a = JobId::from_key("ledger.transfer", "transfer-42");
/// let b = JobId::from_key("ledger.transfer", "transfer-42");
/// assert_eq!(a, b);
/// assert_ne!(a, JobId::from_key("ledger.transfer", "transfer-43"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(uuid::Uuid);

/// UUID v5 namespace for job ids (a fixed random UUID, never change it).
const JOB_ID_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6d1f_2b9e_4c0a_4f3b_9a51_7e2c_d8b4_1a07);

impl JobId {
    /// The job id for `idempotency_key` under `job_type` (UUID v5).
    pub fn from_key(job_type: &str, idempotency_key: &str) -> Self {
        let mut name = Vec::with_capacity(job_type.len() + 1 + idempotency_key.len());
        name.extend_from_slice(job_type.as_bytes());
        name.push(0);
        name.extend_from_slice(idempotency_key.as_bytes());
        JobId(uuid::Uuid::new_v5(&JOB_ID_NAMESPACE, &name))
    }

    /// Wraps an existing UUID (as read back from a job row or a header).
    pub fn from_uuid(id: uuid::Uuid) -> Self {
        JobId(id)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// The partition this job belongs to for its whole life when the
    /// namespace has `partitions` of them (`Config::partitions`): the UUID
    /// read as a big-endian 128-bit number, modulo `partitions` (stable, so
    /// any producer can compute it). `partitions` must be positive.
    ///
    /// ```
    /// let id = tenure::JobId::from_key("pay", "order-1");
    /// assert!(id.partition(16) < 16);
    /// assert_eq!(id.partition(16), id.partition(16));
    /// assert_eq!(id.partition(1), 0);
    /// ```
    pub fn partition(&self, partitions: u32) -> u32 {
        let p = self.0.as_u128() % u128::from(partitions.max(1));
        u32::try_from(p).unwrap_or(0)
    }
}

impl std::str::FromStr for JobId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s).map(JobId)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({})", self.0)
    }
}

/// The index of a step within its job type (0-based).
///
/// ```
/// use tenure::StepIndex;
/// assert_eq!(StepIndex::new(0).next(), StepIndex::new(1));
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct StepIndex(u32);

impl StepIndex {
    /// Step `i`.
    pub const fn new(i: u32) -> Self {
        StepIndex(i)
    }
    /// The index as a number.
    pub const fn get(self) -> u32 {
        self.0
    }
    /// The step after this one.
    pub const fn next(self) -> Self {
        StepIndex(self.0 + 1)
    }
}

impl fmt::Display for StepIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// An etcd lease id (one per worker session).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(i64);

impl LeaseId {
    pub(crate) const fn new(id: i64) -> Self {
        LeaseId(id)
    }
    /// The raw id, as etcd knows it.
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// A fencing token: the etcd `create_revision` of a job's lock key, as granted to
/// us. The only type [`FenceStore::claim`](crate::fence::FenceStore::claim) and
/// [`FenceStore::begin_step`](crate::fence::FenceStore::begin_step) take.
///
/// etcd revisions are one global, durable, strictly increasing sequence, so every
/// new owner of a job holds a larger token than every earlier owner. Resources
/// accept a write only under the largest token they have seen.
///
/// # Construction
/// Only a verified lock grant ([`JobLock::token`](crate::lease::JobLock::token))
/// makes one: there is no constructor from a number, no `TryFrom<i64>` and no
/// `Deserialize`, so `claim(id, <i64::MAX>)` cannot be written. A value read off
/// the wire or a row is an [`ObservedFence`]: it compares with tokens, and that
/// is all it does. (Tests build tokens from numbers with `FencingToken::for_tests`,
/// behind the `testing` feature, which production builds never enable.)
///
/// ```
/// # fn demo(lock: &tenure::blocks::lease::JobLock) {
/// use tenure::ObservedFence;
/// let token = lock.token();
/// let seen = ObservedFence::new(token.get()).unwrap();
/// assert_eq!(token, seen);
/// assert_eq!(token.observed(), seen);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "i64")]
pub struct FencingToken(i64);

impl FencingToken {
    /// From a verified grant's etcd revision; `None` unless positive.
    pub(crate) fn from_revision(rev: i64) -> Option<Self> {
        (rev > 0).then_some(FencingToken(rev))
    }

    /// A token from a raw number, for tests. Panics on a non-positive number.
    #[cfg(any(test, feature = "testing"))]
    #[allow(clippy::panic)]
    pub fn for_tests(raw: i64) -> Self {
        Self::from_revision(raw).unwrap_or_else(|| panic!("fencing tokens are positive, got {raw}"))
    }

    /// The token's value (the revision).
    pub const fn get(self) -> i64 {
        self.0
    }

    /// The same value as an observation (for a header, a report, a comparison).
    pub const fn observed(self) -> ObservedFence {
        ObservedFence(self.0)
    }
}

impl From<FencingToken> for i64 {
    fn from(t: FencingToken) -> i64 {
        t.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A fence value seen somewhere else: a header, an RPC field, a job row, a DLQ
/// entry, an error report. It compares with other observations and with
/// [`FencingToken`]s, and it can never claim or admit anything: there is no way
/// to turn it into a `FencingToken`.
///
/// ```
/// use tenure::ObservedFence;
/// let a = ObservedFence::new(41).unwrap();
/// let b: ObservedFence = serde_json::from_str("42").unwrap();
/// assert!(a < b);
/// assert_eq!(b.get(), 42);
/// assert!(ObservedFence::new(0).is_none());
/// assert!(ObservedFence::try_from(-1).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct ObservedFence(i64);

impl ObservedFence {
    /// A fence value read from somewhere; `None` unless `raw > 0` (fences are
    /// etcd revisions).
    pub const fn new(raw: i64) -> Option<Self> {
        if raw > 0 {
            Some(ObservedFence(raw))
        } else {
            None
        }
    }

    /// The value.
    pub const fn get(self) -> i64 {
        self.0
    }
}

/// A number that cannot be a fence (zero or negative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a fence is a positive etcd revision, got {0}")]
pub struct InvalidFence(pub i64);

impl TryFrom<i64> for ObservedFence {
    type Error = InvalidFence;
    fn try_from(raw: i64) -> Result<Self, InvalidFence> {
        Self::new(raw).ok_or(InvalidFence(raw))
    }
}

impl From<ObservedFence> for i64 {
    fn from(t: ObservedFence) -> i64 {
        t.0
    }
}

impl From<FencingToken> for ObservedFence {
    fn from(t: FencingToken) -> Self {
        t.observed()
    }
}

impl fmt::Display for ObservedFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl PartialEq<ObservedFence> for FencingToken {
    fn eq(&self, other: &ObservedFence) -> bool {
        self.0 == other.0
    }
}

impl PartialEq<FencingToken> for ObservedFence {
    fn eq(&self, other: &FencingToken) -> bool {
        self.0 == other.0
    }
}

impl PartialOrd<ObservedFence> for FencingToken {
    fn partial_cmp(&self, other: &ObservedFence) -> Option<std::cmp::Ordering> {
        Some(self.0.cmp(&other.0))
    }
}

impl PartialOrd<FencingToken> for ObservedFence {
    fn partial_cmp(&self, other: &FencingToken) -> Option<std::cmp::Ordering> {
        Some(self.0.cmp(&other.0))
    }
}

/// How soon a job is taken from the queue relative to the other jobs of its
/// type: an enqueue option ([`EnqueueOptions`](crate::EnqueueOptions)).
///
/// Each level has its own subject and consumer per job type (and
/// partition); every worker of the type takes deliveries from the levels in
/// a weighted share of each fetch round, high : normal : low = 4 : 2 : 1
/// among the levels that have messages waiting (a level with none gives its
/// share to the others), so a lower level is slowed under load, never
/// starved. See the production guide, "Priorities".
///
/// ```
/// use tenure::Priority;
/// assert_eq!(Priority::default(), Priority::Normal);
/// assert_eq!("high".parse::<Priority>(), Ok(Priority::High));
/// assert_eq!(Priority::Low.to_string(), "low");
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Taken first: 4 of every 7 deliveries while all three levels wait.
    High,
    /// The default; today's subjects and consumers.
    #[default]
    Normal,
    /// Taken last: 1 of every 7 deliveries while all three levels wait.
    Low,
}

impl Priority {
    /// Every level, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The level's name: `high`, `normal` or `low`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// Its share of a round while all three levels have messages waiting
    /// (high : normal : low = 4 : 2 : 1).
    pub fn weight(self) -> u32 {
        match self {
            Priority::High => 4,
            Priority::Normal => 2,
            Priority::Low => 1,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A priority name that is not `high`, `normal` or `low`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown priority {0:?}: expected high, normal or low")]
pub struct UnknownPriority(pub String);

impl std::str::FromStr for Priority {
    type Err = UnknownPriority;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPriority(s.to_string()))
    }
}
