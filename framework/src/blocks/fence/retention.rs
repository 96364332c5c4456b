//! Retention of finished job rows (migration 0010): deleting `done`,
//! `cancelled` or `dead` rows older than an age, with their history events, a
//! batch at a time (`tenure_prune_jobs`, `SECURITY DEFINER`, `FOR UPDATE SKIP
//! LOCKED`), either fenced by the scheduler leader's token or as an
//! operator; and counting what a prune would delete (a dry run).

use std::time::Duration;

use crate::types::FencingToken;

use super::status::FINISHED_SQL;
use super::{FenceError, FenceStore, JobStatus};

impl FenceStore {
    /// How many `status` rows finished longer than `age` ago (what
    /// [`prune_jobs`](Self::prune_jobs) would delete, at this moment).
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn prunable(&self, status: JobStatus, age: Duration) -> Result<u64, FenceError> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE {FINISHED_SQL} AND status = $1 \
               AND created_at < clock_timestamp() - make_interval(secs => $2) \
               AND updated_at < clock_timestamp() - make_interval(secs => $2)",
            self.table("jobs")
        );
        let n: i64 = sqlx::query_scalar(&sql)
            .bind(status.as_str())
            .bind(age.as_secs_f64())
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Deletes up to `batch` `status` rows that finished longer than `age` ago,
    /// with their history events, as an operator (no token: `tenure prune`).
    /// Returns how many. Rows locked by anyone are skipped.
    ///
    /// # Errors
    /// [`FenceError::NotFinished`] for `pending` or `running`; [`FenceError::Db`].
    pub async fn prune_jobs(
        &self,
        status: JobStatus,
        age: Duration,
        batch: usize,
    ) -> Result<u64, FenceError> {
        let mut conn = self.pool.acquire().await?;
        self.prune_on(&mut conn, status, age, batch).await
    }

    /// [`prune_jobs`](Self::prune_jobs) in a transaction fenced by `role`'s
    /// `token` (the scheduler leader's).
    ///
    /// # Errors
    /// [`FenceError::LeaderFencedOut`] (nothing deleted); as `prune_jobs`.
    pub async fn prune_jobs_as_leader(
        &self,
        role: &str,
        token: FencingToken,
        status: JobStatus,
        age: Duration,
        batch: usize,
    ) -> Result<u64, FenceError> {
        let mut tx = self.begin_leader(role, token).await?;
        let n = self.prune_on(&mut tx, status, age, batch).await?;
        tx.commit().await?;
        Ok(n)
    }

    /// Deletes up to `batch` tombstones of rows pruned longer than `age` ago
    /// (the key-retention horizon, `Retention::keys_after`), fenced by `role`'s
    /// `token`; their keys may then run again. Returns how many.
    ///
    /// # Errors
    /// [`FenceError::LeaderFencedOut`] (nothing deleted); [`FenceError::Db`].
    pub async fn prune_tombstones_as_leader(
        &self,
        role: &str,
        token: FencingToken,
        age: Duration,
        batch: usize,
    ) -> Result<u64, FenceError> {
        let mut tx = self.begin_leader(role, token).await?;
        let sql = format!("SELECT \"{}\".tenure_prune_tombstones($1, $2)", self.schema);
        let n: i64 = sqlx::query_scalar(&sql)
            .bind(age.as_secs_f64())
            .bind(i32::try_from(batch).unwrap_or(i32::MAX))
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn prune_on(
        &self,
        conn: &mut sqlx::PgConnection,
        status: JobStatus,
        age: Duration,
        batch: usize,
    ) -> Result<u64, FenceError> {
        if !status.is_terminal() {
            return Err(FenceError::NotFinished(status));
        }
        let sql = format!("SELECT \"{}\".tenure_prune_jobs($1, $2, $3)", self.schema);
        let n: i64 = sqlx::query_scalar(&sql)
            .bind(status.as_str())
            .bind(age.as_secs_f64())
            .bind(i32::try_from(batch).unwrap_or(i32::MAX))
            .fetch_one(&mut *conn)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
