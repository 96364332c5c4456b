//! [`TokenGate`]: fencing for a resource that enforces fences on its own writes,
//! atomic with those writes.
//!
//! PostgreSQL job rows fence the writes a step makes through
//! [`StepCtx::db`](crate::StepCtx::db). A downstream service that a step calls (a
//! VM allocator, a DNS registry, an inventory service) can enforce the same rule on
//! its own state: the step sends its fence along
//! ([`StepCtx::fence_headers`](crate::StepCtx::fence_headers),
//! [`queue::headers::fence_headers`](crate::queue::headers::fence_headers)), and the
//! service keeps the largest token it has accepted per job (its *mark*) and
//! refuses smaller ones.
//!
//! Two rules make that a fence and not a hint:
//! * **The check is atomic with the write it protects.** The gate raises the mark
//!   inside the service's own transaction ([`FenceMarks::Tx`]): with
//!   [`PgFenceMarks`] it is `UPDATE fence_marks SET token = $t WHERE job_id = $k
//!   AND token <= $t` (insert-if-absent on first sight) in the same PostgreSQL
//!   transaction as the service's write, so the mark's row lock keeps a newer
//!   owner's admission waiting until that write commits or rolls back.
//! * **Only a token Tenure issued is admitted** ([`PgFenceMarks::verified`]).
//!   A gate orders callers; it does not authenticate them. A plain gate admits
//!   any token above its mark, so anyone who can reach the service could send
//!   `Tenure-Fence: 9223372036854775807` and raise the mark past every real
//!   owner (job ids are predictable: UUIDv5 of type and key, so a mark can even
//!   be planted before the job exists). A service that can read the job rows
//!   (same database, `SELECT` on `jobs`) uses the verifying store: a token is
//!   admitted only if it is at most the job row's fence and that fence may
//!   write (the job is `running`, or `dead` with its compensation pending).
//!   Fences only rise, so a token at or below the row's fence was issued; one
//!   above it never was. Authenticate callers as well (the provisioning
//!   example gives each worker its own NATS user with publish rights on the
//!   service's subject only).
//! * **A mark is never forgotten while the job can still run.** A paused owner can
//!   wake up after its job finished; a gate that dropped the mark would admit it
//!   as a first sight. [`PgFenceMarks::prune`] drops a mark only once the job row
//!   is terminal (`done`, `dead`) *and* older than a retention age.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgConnection;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::error::FenceError;
use super::guard::check_schema;
use crate::types::{JobId, ObservedFence};

/// How often a first sight retries when a concurrent first sight of the same job
/// committed between its read and its insert.
const FIRST_SIGHT_RETRIES: usize = 3;

/// A write presented a token smaller than one the gate already accepted for its
/// job: a newer owner of the job has been here. Never retry such a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {ours}: this resource already accepted token {current}")]
#[non_exhaustive]
pub struct StaleToken {
    /// The token the write carried.
    pub ours: ObservedFence,
    /// The largest token accepted for the job.
    pub current: ObservedFence,
}

impl StaleToken {
    /// The same verdict in the fence's terms, for job `job_id`. A step that learns
    /// from a downstream service that its token is stale returns this error (with
    /// `?`): the runtime then counts a stale rejection and stops without acking,
    /// exactly as when PostgreSQL refuses the step's own write.
    ///
    /// ```
    /// use tenure::blocks::fence::StaleToken;
    /// use tenure::{JobId, ObservedFence, StepError};
    /// let stale = StaleToken::new(ObservedFence::new(41).unwrap(), ObservedFence::new(42).unwrap());
    /// let err = stale.fenced_out(JobId::from_key("t", "k"));
    /// assert!(err.is_fenced_out());
    /// let step_err: StepError = err.into();
    /// assert!(step_err.downcast_ref::<tenure::blocks::fence::FenceError>().is_some());
    /// ```
    pub fn fenced_out(self, job_id: JobId) -> FenceError {
        FenceError::FencedOut {
            job_id,
            ours: self.ours,
            current: Some(self.current),
        }
    }

    /// A refusal of `ours` because `current` was accepted (for a client that
    /// decodes one from a reply).
    pub fn new(ours: ObservedFence, current: ObservedFence) -> Self {
        StaleToken { ours, current }
    }
}

/// What [`TokenGate::admit`] did with an accepted token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admitted {
    /// The first token seen for the job.
    First,
    /// The same token as the mark: the same owner writes again.
    Same,
    /// A larger token than the mark: a new owner took the job over from `previous`.
    Raised {
        /// The mark before this token.
        previous: ObservedFence,
    },
}

/// Why [`TokenGate::admit`] refused. Either way the service must not write (and,
/// with [`PgFenceMarks`], roll its transaction back).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// A newer owner of the job has written here.
    #[error(transparent)]
    Stale(#[from] StaleToken),
    /// The token is not one Tenure issued for a job that may write now (a
    /// verifying store, [`PgFenceMarks::verified`]): above the job row's
    /// fence, or the job is not running (or does not exist). Nothing was
    /// raised; refuse the write.
    #[error("job {job_id}: token {token} refused: {reason}")]
    Unverified {
        /// The job the token claims.
        job_id: JobId,
        /// The token presented.
        token: ObservedFence,
        /// Why (the row's fence and status, or that there is no row).
        reason: String,
    },
    /// The mark store failed (I/O, a lock timeout); the verdict is unknown.
    #[error("fence marks: {0}")]
    Store(#[from] sqlx::Error),
}

impl GateError {
    /// The stale verdict, if that is what this is.
    pub fn stale(&self) -> Option<&StaleToken> {
        match self {
            GateError::Stale(s) => Some(s),
            GateError::Unverified { .. } | GateError::Store(_) => None,
        }
    }
}

/// The rule on a mark, given its current value: accept a token at least as large
/// and say how; refuse a smaller one.
fn decide(current: Option<ObservedFence>, token: ObservedFence) -> Result<Admitted, StaleToken> {
    match current {
        None => Ok(Admitted::First),
        Some(current) if token < current => Err(StaleToken {
            ours: token,
            current,
        }),
        Some(current) if token == current => Ok(Admitted::Same),
        Some(previous) => Ok(Admitted::Raised { previous }),
    }
}

/// Where a [`TokenGate`] keeps its marks. The admission runs inside `Tx`, the
/// scope the service's own write shares, so the two are one atomic step.
pub trait FenceMarks: Send + Sync {
    /// The transaction an admission runs in and the protected write shares: a
    /// PostgreSQL connection inside `BEGIN` for [`PgFenceMarks`], a held lock for
    /// [`MemoryFenceMarks`].
    type Tx: Send;

    /// Raises `job`'s mark to `token` inside `tx`, or refuses a token below it.
    /// The mark stays locked until `tx` ends.
    ///
    /// # Errors
    /// [`GateError::Stale`], [`GateError::Store`].
    fn raise(
        &self,
        tx: &mut Self::Tx,
        job: JobId,
        token: ObservedFence,
    ) -> impl Future<Output = Result<Admitted, GateError>> + Send;
}

/// The largest fencing token accepted per job, for a service that enforces fences
/// on its own writes; the marks live in a [`FenceMarks`] store.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, job: tenure::JobId, token: tenure::ObservedFence)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// use tenure::blocks::fence::{PgFenceMarks, TokenGate};
/// let marks = PgFenceMarks::new("infra")?;
/// marks.install(&mut *pool.acquire().await?).await?;
/// let gate = TokenGate::new(marks);
///
/// // Per request: the admission and the write in one transaction.
/// let mut tx = pool.begin().await?;
/// gate.admit(&mut tx, job, token).await?; // stale: nothing written, tx rolls back on drop
/// sqlx::query("INSERT INTO infra.vms (job, name) VALUES ($1, 'web-1')")
///     .bind(job.as_uuid())
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Fencing
/// A write is fenced only if it commits in the same transaction as its admission
/// (and rolls back with it). Never drop a mark of a job that can still run: see
/// [`PgFenceMarks::prune`].
#[derive(Debug, Clone, Default)]
pub struct TokenGate<M> {
    marks: M,
}

impl<M: FenceMarks> TokenGate<M> {
    /// A gate over `marks`.
    pub fn new(marks: M) -> Self {
        TokenGate { marks }
    }

    /// The mark store.
    pub fn marks(&self) -> &M {
        &self.marks
    }

    /// Admits `token` for `job` inside `tx` if it is at least `job`'s mark, and
    /// raises the mark to it. Do the protected write in the same `tx`.
    ///
    /// # Errors
    /// [`GateError::Stale`] when a larger token was accepted before: a newer owner
    /// of the job has written here, and this write must be refused.
    /// [`GateError::Store`] when the mark store fails.
    pub async fn admit(
        &self,
        tx: &mut M::Tx,
        job: JobId,
        token: ObservedFence,
    ) -> Result<Admitted, GateError> {
        let verdict = self.marks.raise(tx, job, token).await;
        if let Err(GateError::Stale(s)) = &verdict {
            tracing::warn!(job_id = %job, ours = %s.ours, current = %s.current, "gate refused a stale token");
        }
        verdict
    }
}

/// Marks in a PostgreSQL table, `"<schema>".fence_marks`, raised inside the
/// service's own transaction (pass `&mut *tx` of a `sqlx::Transaction`; READ
/// COMMITTED, PostgreSQL's default).
#[derive(Debug, Clone)]
pub struct PgFenceMarks {
    schema: Arc<str>,
    table: Arc<str>,
    /// The job rows tokens are checked against ([`PgFenceMarks::verified`]).
    jobs: Option<Arc<str>>,
}

impl PgFenceMarks {
    /// Marks in schema `schema` (`[a-z0-9_]`, as for [`FenceStore`](super::FenceStore)).
    ///
    /// # Errors
    /// [`FenceError::InvalidName`].
    pub fn new(schema: &str) -> Result<Self, FenceError> {
        check_schema(schema)?;
        Ok(PgFenceMarks {
            schema: Arc::from(schema),
            table: Arc::from(format!("\"{schema}\".fence_marks")),
            jobs: None,
        })
    }

    /// Marks in schema `schema` that admit only tokens Tenure issued: at most
    /// the fence of the job's row in `jobs_schema` (same database; the
    /// service's role needs `SELECT` on `"<jobs_schema>".jobs`), while that
    /// fence may write (the job is `running`, or `dead` with its compensation
    /// pending). Anything else is [`GateError::Unverified`], and no mark moves.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool, job: tenure::JobId, token: tenure::ObservedFence)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use tenure::blocks::fence::{PgFenceMarks, TokenGate};
    /// let gate = TokenGate::new(PgFenceMarks::verified("infra", "tenure")?);
    /// let mut tx = pool.begin().await?;
    /// gate.admit(&mut tx, job, token).await?; // a forged token: Unverified
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FenceError::InvalidName`].
    pub fn verified(schema: &str, jobs_schema: &str) -> Result<Self, FenceError> {
        check_schema(jobs_schema)?;
        let mut marks = Self::new(schema)?;
        marks.jobs = Some(Arc::from(format!("\"{jobs_schema}\".jobs")));
        Ok(marks)
    }

    /// A verifying store's check of `token` against `job`'s row (a plain
    /// read: fences only rise, so a token at or below the fence stays so).
    async fn verify(
        &self,
        tx: &mut PgConnection,
        job: JobId,
        token: ObservedFence,
    ) -> Result<(), GateError> {
        let Some(jobs) = &self.jobs else {
            return Ok(());
        };
        let row: Option<(i64, String, String)> = sqlx::query_as(&format!(
            "SELECT fence, status, compensation FROM {jobs} WHERE id = $1"
        ))
        .bind(job.as_uuid())
        .fetch_optional(&mut *tx)
        .await?;
        let reason = match row {
            None => "no such job".to_string(),
            Some((fence, _, _)) if token.get() > fence => {
                format!(
                    "above the job's committed fence {fence}: never issued (a real owner's \
                     first step sees its claim only once committed: Tuning::commit_claim_first)"
                )
            }
            Some((_, status, comp))
                if status == "running" || (status == "dead" && comp == "pending") =>
            {
                return Ok(());
            }
            Some((_, status, _)) => format!("the job is {status}"),
        };
        tracing::warn!(job_id = %job, token = %token, %reason, "gate refused an unverified token");
        Err(GateError::Unverified {
            job_id: job,
            token,
            reason,
        })
    }

    /// Creates the schema and the table if absent (idempotent).
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn install(&self, conn: &mut PgConnection) -> Result<(), FenceError> {
        let schema = &self.schema;
        let table = &self.table;
        sqlx::raw_sql(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; \
             CREATE TABLE IF NOT EXISTS {table} ( \
                 job_id uuid PRIMARY KEY, \
                 token bigint NOT NULL CHECK (token > 0), \
                 updated_at timestamptz NOT NULL DEFAULT now())"
        ))
        .execute(conn)
        .await?;
        Ok(())
    }

    /// `job`'s mark now, if any.
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn current(
        &self,
        conn: &mut PgConnection,
        job: JobId,
    ) -> Result<Option<ObservedFence>, FenceError> {
        let raw: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT token FROM {} WHERE job_id = $1",
            self.table
        ))
        .bind(job.as_uuid())
        .fetch_optional(conn)
        .await?;
        raw.map(|t| observed(job, t)).transpose()
    }

    /// Drops the marks of jobs that can no longer run: the job row (in
    /// `jobs_schema`, same database) is `done` or `dead` *and* was last changed
    /// longer than `retention` ago. A redriven dead job runs again; keep
    /// `retention` well above the longest pause an owner can survive (and above
    /// the redrive window). Returns how many marks were dropped.
    ///
    /// # Errors
    /// [`FenceError::InvalidName`], [`FenceError::Db`].
    pub async fn prune(
        &self,
        conn: &mut PgConnection,
        jobs_schema: &str,
        retention: Duration,
    ) -> Result<u64, FenceError> {
        check_schema(jobs_schema)?;
        let done = sqlx::query(&format!(
            "DELETE FROM {} m USING \"{jobs_schema}\".jobs j \
             WHERE j.id = m.job_id AND j.status IN ('done', 'dead') \
               AND j.updated_at < now() - make_interval(secs => $1)",
            self.table
        ))
        .bind(retention.as_secs_f64())
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn locked(&self, tx: &mut PgConnection, job: JobId) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(&format!(
            "SELECT token FROM {} WHERE job_id = $1 FOR UPDATE",
            self.table
        ))
        .bind(job.as_uuid())
        .fetch_optional(tx)
        .await
    }
}

fn observed(job: JobId, raw: i64) -> Result<ObservedFence, FenceError> {
    ObservedFence::new(raw).ok_or_else(|| FenceError::Corrupt {
        job_id: job,
        reason: format!("fence mark {raw} is not positive"),
    })
}

impl FenceMarks for PgFenceMarks {
    type Tx = PgConnection;

    async fn raise(
        &self,
        tx: &mut PgConnection,
        job: JobId,
        token: ObservedFence,
    ) -> Result<Admitted, GateError> {
        for _ in 0..FIRST_SIGHT_RETRIES {
            // The mark's row lock is held until the service's transaction ends.
            let current = self.locked(tx, job).await?;
            // Below the mark is stale whatever the job row says (the more
            // telling verdict: a newer owner has written here); the row is
            // checked after, and before anything is written.
            let seen = current
                .map(|raw| decide(ObservedFence::new(raw), token))
                .transpose()?;
            self.verify(tx, job, token).await?;
            let Some(admitted) = seen else {
                let inserted = sqlx::query(&format!(
                    "INSERT INTO {} (job_id, token) VALUES ($1, $2) ON CONFLICT (job_id) DO NOTHING",
                    self.table
                ))
                .bind(job.as_uuid())
                .bind(token.get())
                .execute(&mut *tx)
                .await?;
                if inserted.rows_affected() == 1 {
                    return Ok(Admitted::First);
                }
                // A concurrent first sight committed: read its mark under the lock.
                continue;
            };
            if let Admitted::Raised { .. } = admitted {
                sqlx::query(&format!(
                    "UPDATE {} SET token = $2, updated_at = now() WHERE job_id = $1 AND token <= $2",
                    self.table
                ))
                .bind(job.as_uuid())
                .bind(token.get())
                .execute(&mut *tx)
                .await?;
            }
            return Ok(admitted);
        }
        Err(GateError::Store(sqlx::Error::Protocol(format!(
            "job {job}: the fence mark kept changing under a first sight"
        ))))
    }
}

/// Marks in memory, for tests and for a single-process service whose own state
/// is in memory too (it forgets everything on restart, and so does its state).
/// An admission holds the whole store's lock until its [`MemoryTx`] is dropped:
/// do the write before dropping it.
#[derive(Debug, Clone, Default)]
pub struct MemoryFenceMarks {
    marks: Arc<Mutex<HashMap<JobId, ObservedFence>>>,
}

/// The scope of one admission and its write in [`MemoryFenceMarks`] (the store's
/// lock, held until dropped).
#[derive(Debug)]
pub struct MemoryTx {
    marks: OwnedMutexGuard<HashMap<JobId, ObservedFence>>,
}

impl MemoryFenceMarks {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens an admission's scope: waits for the store's lock.
    pub async fn begin(&self) -> MemoryTx {
        MemoryTx {
            marks: self.marks.clone().lock_owned().await,
        }
    }

    /// `job`'s mark now, if any.
    pub async fn current(&self, job: JobId) -> Option<ObservedFence> {
        self.marks.lock().await.get(&job).copied()
    }
}

impl FenceMarks for MemoryFenceMarks {
    type Tx = MemoryTx;

    async fn raise(
        &self,
        tx: &mut MemoryTx,
        job: JobId,
        token: ObservedFence,
    ) -> Result<Admitted, GateError> {
        let admitted = decide(tx.marks.get(&job).copied(), token)?;
        if admitted != Admitted::Same {
            tx.marks.insert(job, token);
        }
        Ok(admitted)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn t(raw: i64) -> ObservedFence {
        ObservedFence::new(raw).unwrap()
    }

    #[test]
    fn the_rule_accepts_equal_or_larger_and_refuses_smaller() {
        assert_eq!(decide(None, t(10)), Ok(Admitted::First));
        assert_eq!(decide(Some(t(10)), t(10)), Ok(Admitted::Same));
        assert_eq!(
            decide(Some(t(10)), t(12)),
            Ok(Admitted::Raised { previous: t(10) })
        );
        assert_eq!(
            decide(Some(t(12)), t(11)),
            Err(StaleToken {
                ours: t(11),
                current: t(12)
            })
        );
    }

    #[tokio::test]
    async fn memory_marks_only_go_up_and_hold_the_write_scope() {
        let gate = TokenGate::new(MemoryFenceMarks::new());
        let (a, b) = (JobId::from_key("t", "a"), JobId::from_key("t", "b"));
        let mut tx = gate.marks().begin().await;
        assert_eq!(
            gate.admit(&mut tx, a, t(10)).await.unwrap(),
            Admitted::First
        );
        assert_eq!(
            gate.admit(&mut tx, a, t(12)).await.unwrap(),
            Admitted::Raised { previous: t(10) }
        );
        let stale = gate.admit(&mut tx, a, t(11)).await.unwrap_err();
        assert_eq!(stale.stale(), Some(&StaleToken::new(t(11), t(12))));
        assert_eq!(gate.admit(&mut tx, b, t(3)).await.unwrap(), Admitted::First);
        // While this scope is open, no other admission (or read) gets in.
        let marks = gate.marks().clone();
        let other = tokio::spawn(async move { marks.current(a).await });
        tokio::task::yield_now().await;
        assert!(!other.is_finished());
        drop(tx);
        assert_eq!(other.await.unwrap(), Some(t(12)));
    }
}
