//! Paused job types (`paused_types`, migration 0018): the operator's pause
//! and resume, and the workers' read of what is paused.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{FenceError, FenceStore};

/// One paused job type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PausedType {
    /// The job type.
    pub job_type: String,
    /// Since when.
    pub paused_at: DateTime<Utc>,
    /// Who paused it: the pausing connection's `application_name`, if any.
    pub paused_by: Option<String>,
}

impl FenceStore {
    /// Pauses `job_type` for every worker of the schema (`tenure_pause`, the
    /// operator's grant); `true` when it was not paused already.
    ///
    /// # Errors
    /// [`FenceError::Db`]: e.g. a role without the operator's grant.
    pub async fn pause_type(&self, job_type: &str) -> Result<bool, FenceError> {
        let sql = format!("SELECT {}($1)", self.table("tenure_pause"));
        Ok(sqlx::query_scalar(&sql)
            .bind(job_type)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Resumes `job_type` (`tenure_resume`); `true` when it was paused.
    ///
    /// # Errors
    /// As [`pause_type`](Self::pause_type).
    pub async fn resume_type(&self, job_type: &str) -> Result<bool, FenceError> {
        let sql = format!("SELECT {}($1)", self.table("tenure_resume"));
        Ok(sqlx::query_scalar(&sql)
            .bind(job_type)
            .fetch_one(&self.pool)
            .await?)
    }

    /// The paused types, by name.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn paused_types(&self) -> Result<Vec<PausedType>, FenceError> {
        let sql = format!(
            "SELECT job_type, paused_at, paused_by FROM {} ORDER BY job_type",
            self.table("paused_types")
        );
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        let paused = |r: &sqlx::postgres::PgRow| -> Result<PausedType, sqlx::Error> {
            Ok(PausedType {
                job_type: r.try_get("job_type")?,
                paused_at: r.try_get("paused_at")?,
                paused_by: r.try_get("paused_by")?,
            })
        };
        Ok(rows.iter().map(paused).collect::<Result<_, _>>()?)
    }
}
