//! Partition mode at PostgreSQL (migration 0013): the namespace's recorded way
//! of owning jobs ([`FenceStore::record_partitions`]) and each partition's
//! fence ([`FenceStore::claim_partition`]), raised once per change of owner.
//!
//! Job rows are fenced per job under the partition's token, as under a job
//! lock's, except that the owner of a partition claims each of its jobs with
//! the same token: a claim accepts `fence <= token` (see `Sql::partitioned`).
//! Two different owners never share a token: etcd issues each create a new
//! revision, and [`claim_partition`](FenceStore::claim_partition) refuses an
//! owner whose token is not above every earlier owner's of the partition.

use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::types::{FencingToken, ObservedFence};

use super::{FenceError, FenceStore};

/// The last claim of one partition, as PostgreSQL recorded it
/// (`partition_fences`): its owner unless that worker has given it up since
/// and no other has claimed it (etcd's election key is the authority; this
/// is for operators).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionOwner {
    /// The job type.
    pub job_type: String,
    /// The partition.
    pub partition: u32,
    /// The owner's worker id.
    pub worker: String,
    /// The partition's fence: the owner's token.
    pub token: i64,
    /// When it claimed the partition.
    pub since: DateTime<Utc>,
}

impl FenceStore {
    /// The last claim of every partition, by type and partition.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn partition_owners(&self) -> Result<Vec<PartitionOwner>, FenceError> {
        let sql = format!(
            "SELECT job_type, partition, worker, fence, since FROM {} \
             ORDER BY job_type, partition",
            self.table("partition_fences")
        );
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        let owner = |r: &sqlx::postgres::PgRow| -> Result<PartitionOwner, sqlx::Error> {
            let partition: i32 = r.try_get("partition")?;
            Ok(PartitionOwner {
                job_type: r.try_get("job_type")?,
                partition: u32::try_from(partition).unwrap_or_default(),
                worker: r.try_get("worker")?,
                token: r.try_get("fence")?,
                since: r.try_get("since")?,
            })
        };
        Ok(rows.iter().map(owner).collect::<Result<_, _>>()?)
    }

    /// Records `configured` (`Config::partitions`; `None`: one lock per job)
    /// as the namespace's way of owning jobs if nothing is recorded yet, and
    /// checks it against the record otherwise. The record is written once and
    /// never changed: nothing in Tenure updates or deletes it, so a match
    /// found once holds for the life of the namespace.
    ///
    /// # Errors
    /// [`FenceError::PartitionsChanged`] when the record differs;
    /// [`FenceError::Db`] (also on a schema not migrated yet: no table to
    /// record in).
    pub async fn record_partitions(&self, configured: Option<u32>) -> Result<(), FenceError> {
        let t = self.table("partitioning");
        let count = i32::try_from(configured.unwrap_or(0)).unwrap_or(i32::MAX);
        sqlx::query(&format!(
            "INSERT INTO {t} (partitions) VALUES ($1) ON CONFLICT DO NOTHING"
        ))
        .bind(count)
        .execute(&self.pool)
        .await?;
        let recorded = self.recorded_partitions().await?.unwrap_or(configured);
        if recorded == configured {
            Ok(())
        } else {
            Err(FenceError::PartitionsChanged {
                recorded,
                configured,
            })
        }
    }

    /// Checks `configured` against the namespace's record, if there is one.
    /// Returns `true` when the record matches, `false` when there is none yet
    /// (a schema not migrated yet, or migrated by [`FenceStore::migrate`]
    /// alone, which records nothing): nothing to check against, and nothing
    /// recorded here either (see [`record_partitions`](Self::record_partitions)).
    ///
    /// # Errors
    /// [`FenceError::PartitionsChanged`]; [`FenceError::Db`].
    pub async fn check_partitions(&self, configured: Option<u32>) -> Result<bool, FenceError> {
        let recorded = match self.recorded_partitions().await {
            Ok(r) => r,
            Err(FenceError::Db(sqlx::Error::Database(e)))
                if e.code().as_deref() == Some("42P01") =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        match recorded {
            Some(recorded) if recorded != configured => Err(FenceError::PartitionsChanged {
                recorded,
                configured,
            }),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    /// The namespace's recorded way of owning jobs: `None` if nothing is
    /// recorded yet, `Some(None)` for one lock per job, `Some(Some(p))` for
    /// `p` partitions per job type.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn recorded_partitions(&self) -> Result<Option<Option<u32>>, FenceError> {
        let t = self.table("partitioning");
        let row = sqlx::query(&format!("SELECT partitions FROM {t}"))
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let count: i32 = row.try_get("partitions")?;
        Ok(Some(u32::try_from(count).ok().filter(|c| *c > 0)))
    }

    /// Claims partition `partition` of `job_type` for `worker` with `token`
    /// (the partition key's `create_revision`): raises the partition's fence
    /// strictly. Once per change of owner, before any of its jobs runs.
    ///
    /// # Errors
    /// [`FenceError::PartitionFencedOut`] when the fence is at or above
    /// `token`; [`FenceError::Db`].
    pub async fn claim_partition(
        &self,
        job_type: &str,
        partition: u32,
        token: FencingToken,
        worker: &str,
    ) -> Result<(), FenceError> {
        let t = self.table("partition_fences");
        let p = i32::try_from(partition).unwrap_or(i32::MAX);
        // Raises the fence strictly (SECURITY DEFINER, migration 0015).
        let sql = format!(
            "SELECT * FROM {}($1, $2, $3, $4)",
            self.table("tenure_claim_partition")
        );
        let claimed = sqlx::query(&sql)
            .bind(job_type)
            .bind(p)
            .bind(token.get())
            .bind(worker)
            .fetch_optional(&self.pool)
            .await?;
        if claimed.is_some() {
            return Ok(());
        }
        let current: i64 = sqlx::query_scalar(&format!(
            "SELECT fence FROM {t} WHERE job_type = $1 AND partition = $2"
        ))
        .bind(job_type)
        .bind(p)
        .fetch_one(&self.pool)
        .await?;
        Err(FenceError::PartitionFencedOut {
            job_type: job_type.to_string(),
            partition,
            ours: token.observed(),
            current: ObservedFence::new(current).unwrap_or(token.observed()),
        })
    }
}
