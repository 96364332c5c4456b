//! Typed values shared by every module: [`JobId`], [`StepIndex`], [`LeaseId`],
//! [`FencingToken`].

use std::fmt;

use serde::{Deserialize, Serialize};

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

/// A fencing token: the etcd `create_revision` of a job's lock key.
///
/// etcd revisions are one global, durable, strictly increasing sequence, so every
/// new owner of a job holds a larger token than every earlier owner. Resources
/// accept a write only under the largest token they have seen.
///
/// # Construction
/// Inside the crate a token is only made from a verified lock grant
/// ([`lease`](crate::lease)). Outside, a token can be read back from the wire with
/// [`FencingToken::from_wire`] (a downstream service that enforces fences), or made
/// from a raw number in tests with `FencingToken::for_tests` (feature `testing`).
///
/// ```
/// use tenure::FencingToken;
/// let t = FencingToken::from_wire(42).unwrap();
/// assert_eq!(t.get(), 42);
/// assert!(FencingToken::from_wire(0).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct FencingToken(i64);

impl FencingToken {
    /// From an etcd revision; `None` unless positive.
    pub(crate) fn from_revision(rev: i64) -> Option<Self> {
        (rev > 0).then_some(FencingToken(rev))
    }

    /// Reads a token that crossed a hop (a header, an RPC field) so a downstream
    /// resource can compare it with the largest token it has accepted. This does not
    /// make the token valid: only the comparison at the resource does.
    /// `None` unless `raw > 0`.
    pub fn from_wire(raw: i64) -> Option<Self> {
        Self::from_revision(raw)
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
}

impl TryFrom<i64> for FencingToken {
    type Error = String;
    fn try_from(raw: i64) -> Result<Self, String> {
        Self::from_revision(raw).ok_or_else(|| format!("fencing token must be positive, got {raw}"))
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
