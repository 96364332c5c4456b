//! The scheduler leader's side of the job rows (migration 0008): the leader
//! fence of an elected role, the due-job reads, and the fenced write that marks
//! due jobs published.
//!
//! A leader claims its role with its etcd token ([`FenceStore::claim_leader`]:
//! the role's fence only rises). Every later write of the leader opens a
//! transaction that locks the role's fence row and requires `fence = token`
//! ([`FenceStore::begin_leader`]), so once a successor has claimed, a deposed
//! leader's writes are refused ([`FenceError::LeaderFencedOut`]), and while a
//! leader's write is open, a successor's claim waits for it.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Row, Transaction};

use crate::types::{FencingToken, JobId, ObservedFence, Priority};

use super::row::priority_from;
use super::{FenceError, FenceStore};

/// A delayed job that is due and not yet published.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DueJob {
    /// The job.
    pub(crate) id: JobId,
    /// Its type.
    pub(crate) job_type: String,
    /// Its input.
    pub(crate) input: serde_json::Value,
    /// When it was due.
    pub(crate) run_at: DateTime<Utc>,
    /// The producer's trace context (`telemetry::propagation`), if it had one.
    pub(crate) trace_context: Option<serde_json::Value>,
    /// Its priority level (migration 0021).
    pub(crate) priority: Priority,
}

/// The most due jobs one [`FenceStore::lock_due`] locks (`tenure_lock_due`'s
/// bound).
const MAX_DUE_BATCH: usize = 10_000;

/// Due jobs locked for the leader's publisher (`FenceStore::lock_due`), until
/// [`mark_published`](Self::mark_published) commits (or the batch is
/// dropped, which rolls back: they stay awaiting).
pub(crate) struct DueBatch {
    store: FenceStore,
    tx: Transaction<'static, Postgres>,
    /// The locked jobs, earliest first.
    pub(crate) jobs: Vec<DueJob>,
}

impl DueBatch {
    /// Marks `ids` (of this batch) published, fenced by `role`'s `token`
    /// (`tenure_mark_published` checks the leader fence itself), and commits,
    /// releasing the batch's rows. Returns how many were still awaiting.
    ///
    /// # Errors
    /// [`FenceError::LeaderFencedOut`] (nothing marked); [`FenceError::Db`].
    pub(crate) async fn mark_published(
        mut self,
        role: &str,
        token: FencingToken,
        ids: &[JobId],
    ) -> Result<u64, FenceError> {
        let admit = format!(
            "SELECT * FROM {}($1, $2)",
            self.store.table("tenure_admit_leader")
        );
        let admitted = sqlx::query(&admit)
            .bind(role)
            .bind(token.get())
            .fetch_optional(&mut *self.tx)
            .await?;
        if admitted.is_none() {
            drop(self.tx);
            return Err(self.store.leader_refusal(role, token).await);
        }
        let uuids: Vec<uuid::Uuid> = ids.iter().map(JobId::as_uuid).collect();
        let sql = format!(
            "SELECT {}($1, $2, $3)",
            self.store.table("tenure_mark_published")
        );
        let done: i64 = sqlx::query_scalar(&sql)
            .bind(role)
            .bind(token.get())
            .bind(uuids)
            .fetch_one(&mut *self.tx)
            .await?;
        self.tx.commit().await?;
        Ok(u64::try_from(done).unwrap_or(0))
    }
}

/// A due job from a row of `tenure_lock_due` joined with its level.
fn due_job(r: &sqlx::postgres::PgRow) -> Result<DueJob, FenceError> {
    let id = JobId::from_uuid(r.try_get("id")?);
    Ok(DueJob {
        id,
        job_type: r.try_get("job_type")?,
        input: r.try_get("input")?,
        run_at: r.try_get("run_at")?,
        trace_context: r.try_get("trace_context")?,
        priority: priority_from(id, r.try_get("priority")?)?,
    })
}

/// The holder of an elected role, as PostgreSQL last accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderRow {
    /// The role.
    pub role: String,
    /// The largest token the role accepted.
    pub fence: i64,
    /// The worker that claimed it with that token.
    pub worker: String,
    /// When.
    pub since: DateTime<Utc>,
}

impl FenceStore {
    /// Claims `role` for `worker` with `token`: raises the role's fence to
    /// `token`, strictly (a fence at or above it refuses, as a job claim does).
    ///
    /// # Errors
    /// [`FenceError::LeaderFencedOut`] when the fence is at or above `token`;
    /// [`FenceError::Db`].
    pub async fn claim_leader(
        &self,
        role: &str,
        token: FencingToken,
        worker: &str,
    ) -> Result<(), FenceError> {
        // Raises the fence strictly (SECURITY DEFINER, migration 0015: no
        // role that runs jobs may write `leader_fences` itself).
        let sql = format!(
            "SELECT * FROM {}($1, $2, $3)",
            self.table("tenure_claim_leader")
        );
        let done = sqlx::query(&sql)
            .bind(role)
            .bind(token.get())
            .bind(worker)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        Err(self.leader_refusal(role, token).await)
    }

    /// Opens a leader's fenced transaction: locks `role`'s fence row and
    /// requires it to hold `token`.
    ///
    /// # Errors
    /// [`FenceError::LeaderFencedOut`]; [`FenceError::Db`].
    pub async fn begin_leader(
        &self,
        role: &str,
        token: FencingToken,
    ) -> Result<Transaction<'static, Postgres>, FenceError> {
        // Locks the fence row FOR UPDATE (in a SECURITY DEFINER function,
        // migration 0015: the worker may not lock `leader_fences` itself).
        let sql = format!(
            "SELECT * FROM {}($1, $2)",
            self.table("tenure_admit_leader")
        );
        let mut tx = self.begin().await?;
        let admitted = sqlx::query(&sql)
            .bind(role)
            .bind(token.get())
            .fetch_optional(&mut *tx)
            .await?;
        if admitted.is_none() {
            drop(tx);
            return Err(self.leader_refusal(role, token).await);
        }
        Ok(tx)
    }

    async fn leader_refusal(&self, role: &str, token: FencingToken) -> FenceError {
        let current = match self.leader(role).await {
            Ok(row) => row.and_then(|r| ObservedFence::new(r.fence)),
            Err(e) => return e,
        };
        tracing::warn!(role, ours = %token, ?current, "leader write refused by the fence");
        FenceError::LeaderFencedOut {
            role: role.to_string(),
            ours: token.observed(),
            current,
        }
    }

    /// The holder of `role` as PostgreSQL last accepted it.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn leader(&self, role: &str) -> Result<Option<LeaderRow>, FenceError> {
        let sql = format!(
            "SELECT role, fence, worker, since FROM {} WHERE role = $1",
            self.table("leader_fences")
        );
        let row = sqlx::query(&sql)
            .bind(role)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(LeaderRow {
                role: r.try_get("role")?,
                fence: r.try_get("fence")?,
                worker: r.try_get("worker")?,
                since: r.try_get("since")?,
            })
        })
        .transpose()
    }

    /// Locks up to `limit` due jobs (awaiting publication, `run_at` come by
    /// PostgreSQL's clock), earliest first, in a transaction held until
    /// [`DueBatch::mark_published`]: while the leader publishes them, a
    /// reschedule or a cancel of one waits, then finds it published. Rows
    /// another transaction holds are skipped this round (`tenure_lock_due`,
    /// migration 0019). It reads the front of the partial index
    /// `jobs_due_idx`, bounded by `now()`, not `clock_timestamp()` (a volatile
    /// bound is only a filter: with fewer than `limit` due the scan would walk
    /// every waiting row).
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub(crate) async fn lock_due(&self, limit: usize) -> Result<DueBatch, FenceError> {
        // The level from the row: `tenure_lock_due` (0019) predates it, and
        // the worker may read `jobs`.
        let sql = format!(
            "SELECT d.id, d.job_type, d.input, d.run_at, d.trace_context, j.priority \
               FROM {}($1) d JOIN {} j ON j.id = d.id \
              ORDER BY d.run_at, d.id",
            self.table("tenure_lock_due"),
            self.table("jobs")
        );
        let mut tx = self.begin().await?;
        let rows = sqlx::query(&sql)
            .bind(i32::try_from(limit.min(MAX_DUE_BATCH)).unwrap_or(1))
            .fetch_all(&mut *tx)
            .await?;
        let jobs = rows.iter().map(due_job).collect::<Result<_, _>>()?;
        Ok(DueBatch {
            store: self.clone(),
            tx,
            jobs,
        })
    }

    /// How long until the earliest job awaiting publication is due (zero if
    /// one is due now; `None` if none waits), by PostgreSQL's clock.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn next_due_in(&self) -> Result<Option<std::time::Duration>, FenceError> {
        let sql = format!(
            // NULL when none waits (not `greatest(.., 0)`: GREATEST skips a
            // NULL, so an idle namespace read as "due now"); clamped below.
            "SELECT extract(epoch FROM min(run_at) - clock_timestamp())::float8 \
             FROM {} WHERE awaiting_publish",
            self.table("jobs")
        );
        let secs: Option<f64> = sqlx::query_scalar(&sql).fetch_one(&self.pool).await?;
        Ok(secs.map(|s| std::time::Duration::from_secs_f64(s.max(0.0))))
    }

    /// Marks `ids` published, in a transaction fenced by `role`'s `token`.
    /// Returns how many were still awaiting publication.
    ///
    /// # Errors
    /// [`FenceError::LeaderFencedOut`] (nothing marked); [`FenceError::Db`].
    pub async fn mark_published(
        &self,
        role: &str,
        token: FencingToken,
        ids: &[JobId],
    ) -> Result<u64, FenceError> {
        let ids: Vec<uuid::Uuid> = ids.iter().map(JobId::as_uuid).collect();
        let sql = format!("SELECT {}($1, $2, $3)", self.table("tenure_mark_published"));
        let mut tx = self.begin_leader(role, token).await?;
        let done: i64 = sqlx::query_scalar(&sql)
            .bind(role)
            .bind(token.get())
            .bind(ids)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(u64::try_from(done).unwrap_or(0))
    }
}
