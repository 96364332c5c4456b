//! Operating the job history (the trail on each job row and `job_events`,
//! migrations 0005 and 0024): switching it off and on, and pruning old events.
//!
//! The history appends each change's events to the job row in the same
//! `UPDATE` (the trigger `jobs_change`, migration 0025, after the update
//! wall's checks; the `enqueued` event is the column's default): 5.4% of a
//! three-step job's PostgreSQL instructions, where one `job_events` row per
//! event cost 22% (`BENCHMARKS.md`). Nothing in the
//! protocol reads it: with it off, the fence holds exactly as before and only
//! the operators' view loses its timelines and rates. Refused stale writes are
//! still noted (they are written by `fence`, not by the trigger).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{FenceError, FenceStore};

impl FenceStore {
    /// Switches the job history of this store's schema on or off, for every
    /// worker at once: the argument of the row trigger `jobs_change` (which
    /// also runs the update wall, so it is re-created with
    /// `'history_off'` or without, never disabled; migration 0025) and the
    /// `enqueued` event a new row's trail begins with (the column's default),
    /// in one transaction. Takes `jobs`' exclusive lock for that moment (it
    /// waits for the transactions writing `jobs` to end). Needs the owner of
    /// the schema, as migrations do. Idempotent.
    ///
    /// # Errors
    /// [`FenceError::Db`], e.g. a role that does not own `jobs`.
    pub async fn set_job_history(&self, on: bool) -> Result<(), FenceError> {
        let (jobs, event) = (self.table("jobs"), self.table("tenure_event"));
        let (argument, first) = if on {
            let enqueued = format!(
                "ARRAY[ROW(clock_timestamp(), 'enqueued', 0, NULL, 0, \
                 nullif(current_setting('application_name', true), ''), 0, 0, NULL)::{event}]"
            );
            ("", enqueued)
        } else {
            ("'history_off'", "'{}'".to_string())
        };
        let function = self.table("tenure_job_change");
        let mut tx = self.pool.begin().await?;
        sqlx::query(&format!("DROP TRIGGER jobs_change ON {jobs}"))
            .execute(&mut *tx)
            .await?;
        sqlx::query(&format!(
            "CREATE TRIGGER jobs_change BEFORE UPDATE ON {jobs} \
             FOR EACH ROW EXECUTE FUNCTION {function}({argument})"
        ))
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "ALTER TABLE {jobs} ALTER COLUMN trail SET DEFAULT {first}"
        ))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::warn!(schema = %self.schema, on, "job history switched");
        Ok(())
    }

    /// Whether the job history is on (the trigger `jobs_change` has no
    /// `'history_off'` argument).
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn job_history(&self) -> Result<bool, FenceError> {
        let arguments: i16 = sqlx::query_scalar(
            "SELECT tgnargs FROM pg_trigger \
             WHERE tgrelid = $1::regclass AND tgname = 'jobs_change'",
        )
        .bind(self.table("jobs"))
        .fetch_one(&self.pool)
        .await?;
        Ok(arguments == 0)
    }

    /// Deletes the history events older than `age`, from `job_events` and
    /// from the job rows' trails; returns how many. The job rows themselves
    /// stay. A row locked by a change in progress (a step's transaction) is
    /// skipped, not waited for: its old events go at the next prune.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn prune_job_events(&self, age: Duration) -> Result<u64, FenceError> {
        let cutoff = "clock_timestamp() - make_interval(secs => $1)";
        let rows = sqlx::query(&format!(
            "DELETE FROM {} WHERE at < {cutoff}",
            self.table("job_events")
        ))
        .bind(age.as_secs_f64())
        .execute(&self.pool)
        .await?
        .rows_affected();
        let jobs = self.table("jobs");
        let trimmed: i64 = sqlx::query_scalar(&format!(
            "WITH old AS ( \
               SELECT id, cardinality(trail) AS had FROM {jobs} \
                WHERE (trail[1]).at < {cutoff} FOR UPDATE SKIP LOCKED), \
             kept AS ( \
               UPDATE {jobs} j SET trail = ARRAY( \
                   SELECT j.trail[i] FROM generate_subscripts(j.trail, 1) AS i \
                    WHERE (j.trail[i]).at >= {cutoff} ORDER BY i) \
                 FROM old WHERE j.id = old.id \
               RETURNING old.had - cardinality(j.trail) AS gone) \
             SELECT coalesce(sum(gone), 0)::bigint FROM kept"
        ))
        .bind(age.as_secs_f64())
        .fetch_one(&self.pool)
        .await?;
        Ok(rows + u64::try_from(trimmed).unwrap_or(0))
    }
}

/// What a worker says of itself on the workers page (`worker_reports`,
/// migrations 0006 and 0009). `health` is `healthy`, `degraded`, `lost` or
/// `stopped`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerReport {
    /// The worker id (`Config::worker_id`).
    pub worker: String,
    /// Its current session lease, if it has one.
    pub lease_id: Option<i64>,
    /// The session's health, or `stopped` after a graceful shutdown.
    pub health: &'static str,
    /// Jobs running now.
    pub in_flight: usize,
    /// `Config::max_in_flight`.
    pub max_in_flight: usize,
    /// `Config::lease_ttl`.
    pub lease_ttl: Duration,
    /// When the worker started.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// The job types it registered (the only ones it receives).
    pub job_types: Vec<String>,
    /// The limits it runs its types with, by type (only types with some
    /// limit; migration 0022).
    pub type_limits: BTreeMap<String, ReportedLimits>,
}

/// The limits a worker runs one job type with, as it reports them
/// (`JobLimits`, in milliseconds where a duration): for operators only, the
/// fleet limit itself is kept in etcd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedLimits {
    /// `JobLimits::max_in_flight`: this worker's deliveries in hand at once.
    pub max_in_flight: Option<u64>,
    /// `JobLimits::fleet_max`: jobs of the type running fleet-wide at once.
    pub fleet_max: Option<u32>,
    /// `JobLimits::rate`: deliveries this worker takes per `rate_per_ms`.
    pub rate: Option<u32>,
    /// The rate's period, in milliseconds.
    pub rate_per_ms: Option<u64>,
}

/// One worker's limits for one type, from its last report
/// ([`FenceStore::type_limits`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitsSeen {
    /// The worker.
    pub worker: String,
    /// The job type.
    pub job_type: String,
    /// Its limits.
    #[serde(flatten)]
    pub limits: ReportedLimits,
}

impl FenceStore {
    /// Writes (overwrites) `report` as this worker's row, through the
    /// `SECURITY DEFINER` function the worker role may execute.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn report_worker(&self, report: &WorkerReport) -> Result<(), FenceError> {
        let int = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let ttl_ms = i32::try_from(report.lease_ttl.as_millis()).unwrap_or(i32::MAX);
        let sql = format!(
            "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            self.table("tenure_report_worker")
        );
        sqlx::query(&sql)
            .bind(&report.worker)
            .bind(report.lease_id)
            .bind(report.health)
            .bind(int(report.in_flight))
            .bind(int(report.max_in_flight))
            .bind(ttl_ms)
            .bind(report.started_at)
            .bind(&report.job_types)
            .bind(sqlx::types::Json(&report.type_limits))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The job types some live worker registered: one whose last report is
    /// `healthy` or `degraded` and not older than three of its TTLs. A pending
    /// job of any other type has no worker to receive it and waits.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn registered_job_types(
        &self,
    ) -> Result<std::collections::BTreeSet<String>, FenceError> {
        let sql = format!(
            "SELECT DISTINCT unnest(job_types) FROM {} \
              WHERE health IN ('healthy', 'degraded') \
                AND reported_at >= clock_timestamp() \
                    - 3 * make_interval(secs => lease_ttl_ms / 1000.0)",
            self.table("worker_reports")
        );
        let types: Vec<String> = sqlx::query_scalar(&sql).fetch_all(&self.pool).await?;
        Ok(types.into_iter().collect())
    }

    /// Each worker's limits for each of its types with some limit, as its
    /// last report says, by type then worker.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn type_limits(&self) -> Result<Vec<LimitsSeen>, FenceError> {
        let sql = format!(
            "SELECT r.worker, l.key, l.value FROM {} r, jsonb_each(r.type_limits) l \
              ORDER BY l.key, r.worker",
            self.table("worker_reports")
        );
        let rows: Vec<(String, String, sqlx::types::Json<ReportedLimits>)> =
            sqlx::query_as(&sql).fetch_all(&self.pool).await?;
        Ok(rows
            .into_iter()
            .map(|(worker, job_type, limits)| LimitsSeen {
                worker,
                job_type,
                limits: limits.0,
            })
            .collect())
    }
}
