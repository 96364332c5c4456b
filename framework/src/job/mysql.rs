//! [`StepCtx::mysql`]: a step's fenced transaction on a MySQL/MariaDB
//! database (feature `mysql`), committed by the runtime just before the step's
//! PostgreSQL checkpoint. See [`crate::fence::mysql`] for what is atomic with
//! what.

use sqlx::MySqlConnection;

use super::StepCtx;
use crate::fence::mysql::{MySqlFence, MySqlFenceError};

impl StepCtx {
    /// The step's fenced transaction on `fence`'s database, opened on first
    /// use: the job's fence row there is locked and raised to this owner's
    /// token before any of the step's statements. The runtime commits it right
    /// before the step's checkpoint (rolled back if the step fails or the lease
    /// is not healthy at commit). One MySQL database per step.
    ///
    /// ```no_run
    /// # use tenure::{StepCtx, StepError};
    /// # use tenure::MySqlFence;
    /// # async fn step(ctx: &mut StepCtx, bank: &MySqlFence) -> Result<(), StepError> {
    /// let key = ctx.idempotency_key("debit");
    /// let conn = ctx.mysql(bank).await?;
    /// let fresh = sqlx::query("INSERT IGNORE INTO applied (idem_key) VALUES (?)")
    ///     .bind(&key)
    ///     .execute(&mut *conn)
    ///     .await?
    ///     .rows_affected();
    /// if fresh == 1 {
    ///     sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///         .execute(&mut *conn)
    ///         .await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`MySqlFenceError::FencedOut`] if a newer owner reached this database
    /// first (the runtime then treats the attempt as stale);
    /// [`MySqlFenceError::SecondDatabase`] if the step's transaction is open on
    /// another database; [`MySqlFenceError::Db`].
    ///
    /// # Fencing
    /// The fence check and the step's writes are one InnoDB transaction. The
    /// PostgreSQL checkpoint is a second commit, after this one.
    pub async fn mysql(
        &mut self,
        fence: &MySqlFence,
    ) -> Result<&mut MySqlConnection, MySqlFenceError> {
        if self.mysql.is_none() {
            let tx = fence.begin(self.job_id, self.token).await?;
            self.mysql = Some(tx);
        }
        let tx = self.mysql.as_mut().ok_or(MySqlFenceError::Detached)?;
        if tx.database() != fence.name() {
            return Err(MySqlFenceError::SecondDatabase {
                open: tx.database().to_string(),
                asked: fence.name().to_string(),
            });
        }
        Ok(tx.conn())
    }

    /// Commits the step's MySQL transaction, if it opened one (the runtime,
    /// before the checkpoint).
    pub(crate) async fn commit_mysql(&mut self) -> Result<(), MySqlFenceError> {
        match self.mysql.take() {
            Some(tx) => tx.commit().await,
            None => Ok(()),
        }
    }
}
