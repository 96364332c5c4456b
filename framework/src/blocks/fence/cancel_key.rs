//! The cancel key: a per-job transaction advisory lock that
//! [`Client::cancel`](crate::Client::cancel) holds from before it publishes
//! its cancel notice until after its row update committed. A worker that
//! hears a notice aborts the running step only if the cancel is confirmed
//! ([`FenceStore::cancel_confirmed`]): the key is held (a cancel is under
//! way) or the row is `cancelled`. A notice anyone else forged confirms
//! neither, and the step goes on.

use sqlx::{Postgres, Transaction};

use super::FenceStore;
use super::error::FenceError;
use crate::JobId;

/// Class of the cancel key (`pg_advisory_xact_lock(CANCEL_KEY_CLASS,
/// hashtext(schema || ':' || job_id))`); "tcnc".
const CANCEL_KEY_CLASS: i32 = 0x7463_6e63;

/// A held cancel key: dropped or [`released`](CancelKey::release), the lock goes.
#[derive(Debug)]
pub struct CancelKey {
    tx: Transaction<'static, Postgres>,
}

impl CancelKey {
    /// Releases the key (commits its transaction, which wrote nothing).
    ///
    /// # Errors
    /// [`FenceError::Db`] if the commit failed (the lock went with the session).
    pub async fn release(self) -> Result<(), FenceError> {
        self.tx.commit().await?;
        Ok(())
    }
}

impl FenceStore {
    /// Takes `job_id`'s cancel key (waiting for another cancel of the job
    /// that holds it). Hold it around the cancel notice and the row update.
    ///
    /// # Errors
    /// [`FenceError::Db`] on a database error.
    pub async fn cancel_key(&self, job_id: JobId) -> Result<CancelKey, FenceError> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(CANCEL_KEY_CLASS)
            .bind(self.key_text(job_id))
            .execute(&mut *tx)
            .await?;
        Ok(CancelKey { tx })
    }

    /// Whether a cancel of `job_id` is confirmed: its cancel key is held by
    /// a cancel under way, or its row is `cancelled`. Never waits for the
    /// key (the cancel's row update may wait for the running step's row lock).
    ///
    /// # Errors
    /// [`FenceError::Db`] on a database error.
    pub async fn cancel_confirmed(&self, job_id: JobId) -> Result<bool, FenceError> {
        // One statement is its own transaction: the shared key, if free, is
        // taken and let go with it.
        let free: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_xact_lock_shared($1, hashtext($2))")
                .bind(CANCEL_KEY_CLASS)
                .bind(self.key_text(job_id))
                .fetch_one(&self.pool)
                .await?;
        if !free {
            return Ok(true);
        }
        // Read after the key was free: a cancel that held it has committed.
        let row = self.job(job_id).await?;
        Ok(row.is_some_and(|r| r.status == super::JobStatus::Cancelled))
    }

    fn key_text(&self, job_id: JobId) -> String {
        format!("{}:{job_id}", self.schema)
    }
}
