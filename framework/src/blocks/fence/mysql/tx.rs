//! [`MySqlFencedTx`]: one step's fenced transaction on a MySQL/MariaDB database.

use sqlx::{MySql, MySqlConnection, Transaction};

use super::error::MySqlFenceError;
use super::sql;
use crate::types::{FencingToken, JobId, ObservedFence};

/// An InnoDB transaction admitted under a fencing token: its first statements
/// lock the job's fence row exclusively (`INSERT .. ON DUPLICATE KEY UPDATE`,
/// which creates it at 0 if need be), read it (a larger token:
/// [`FencedOut`](MySqlFenceError::FencedOut), rolled back before any write of
/// ours) and raise it to the token (`UPDATE .. WHERE token <= ?`). So every
/// write made through [`conn`](Self::conn) commits only if no newer owner
/// reached this database first, and another owner's admission of the job
/// waits until this transaction ends (it never deadlocks with it: the first
/// lock either takes is the exclusive one).
///
/// # Fencing
/// The check and the writes are one InnoDB transaction: the row lock is held
/// from the admission to the commit. The guard triggers of guarded tables let
/// a write through only inside such a transaction (a marker row visible to the
/// open transaction alone, whose token must be the job's fence).
#[derive(Debug)]
pub struct MySqlFencedTx {
    tx: Transaction<'static, MySql>,
    job: JobId,
    token: FencingToken,
    database: String,
}

impl MySqlFencedTx {
    /// Admits `token` for `job` on a new transaction `tx` of database `database`.
    pub(super) async fn admit(
        mut tx: Transaction<'static, MySql>,
        job: JobId,
        token: FencingToken,
        database: String,
    ) -> Result<Self, MySqlFenceError> {
        let id = job.as_uuid().to_string();
        sqlx::query(sql::LOCK_ROW)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        let current: i64 = sqlx::query_scalar(sql::READ_LOCKED)
            .bind(&id)
            .fetch_one(&mut *tx)
            .await?;
        if current > token.get() {
            let _ = tx.rollback().await;
            return Err(MySqlFenceError::FencedOut {
                job,
                ours: token,
                current: ObservedFence::try_from(current)
                    .unwrap_or_else(|_| ObservedFence::from(token)),
            });
        }
        sqlx::query(sql::RAISE)
            .bind(token.get())
            .bind(&id)
            .bind(token.get())
            .execute(&mut *tx)
            .await?;
        sqlx::query(sql::MARK)
            .bind(&id)
            .bind(token.get())
            .execute(&mut *tx)
            .await?;
        Ok(MySqlFencedTx {
            tx,
            job,
            token,
            database,
        })
    }

    /// The connection to run the step's statements on (inside the fenced
    /// transaction).
    pub fn conn(&mut self) -> &mut MySqlConnection {
        &mut self.tx
    }

    /// The job this transaction is fenced for.
    pub fn job_id(&self) -> JobId {
        self.job
    }

    /// The token it was admitted under.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The database's name (as given to [`MySqlFence`](super::MySqlFence)).
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Removes the guard's marker and commits the step's writes.
    ///
    /// # Errors
    /// [`MySqlFenceError::Db`] if the commit fails (nothing of the
    /// transaction is then known to have committed: the step is retried, and
    /// its idempotency key makes a write that did land a no-op).
    pub async fn commit(mut self) -> Result<(), MySqlFenceError> {
        sqlx::query(sql::UNMARK).execute(&mut *self.tx).await?;
        self.tx.commit().await?;
        Ok(())
    }

    /// Rolls the transaction back (the marker goes with it).
    ///
    /// # Errors
    /// [`MySqlFenceError::Db`] if the rollback cannot be sent (the server
    /// rolls back when the connection closes).
    pub async fn rollback(self) -> Result<(), MySqlFenceError> {
        self.tx.rollback().await?;
        Ok(())
    }
}
