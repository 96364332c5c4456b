//! Guarding the user's own tables: installing, removing and checking the
//! guard trigger, and the audited escape hatch past it.

use sqlx::{Executor, PgConnection};
use tracing::Instrument;

use super::FenceStore;
use super::error::FenceError;
use super::guard;

#[cfg(doc)]
use super::{FencedTx, GUARD_SQLSTATE};

impl FenceStore {
    /// Guards one of your tables: a statement-level trigger (`BEFORE INSERT OR
    /// UPDATE OR DELETE OR TRUNCATE`) that lets a statement through only when
    ///
    /// * it runs inside a fenced transaction ([`FencedTx::conn`]) that a
    ///   definer function admitted (its row in `guard_admissions`, migration
    ///   0015; settings any code can set open nothing), for a `running`,
    ///   unreleased job row of this store whose fence equals the admitted one
    ///   right now (read `FOR SHARE`, so a takeover cannot slip in while the
    ///   statement runs), or
    /// * the transaction switched the guard off for itself with
    ///   [`bypass_guard`](Self::bypass_guard) (migrations, operators).
    ///
    /// Everything else (plain SQL on a pool connection, a step that grabbed its own
    /// connection, a stale generation) fails with SQLSTATE [`GUARD_SQLSTATE`], which
    /// maps to [`FenceError::GuardRefused`] ([`FenceError::is_fenced_out`]).
    /// Idempotent. `table` is `table` or `schema.table`, plain identifiers, as the
    /// catalog spells them (case-sensitive); unqualified names resolve through the
    /// pool's `search_path`.
    ///
    /// The check is per statement (a statement-level trigger: one job-row read per
    /// statement, not per row), so even a statement that matches no row is refused
    /// outside a fenced transaction. The guard stops accidents and stale
    /// generations; it is not authorization: `tenure.*` settings are not secrets,
    /// and code that forges the current generation's settings by hand gets in (use
    /// roles and grants to keep untrusted code out).
    ///
    /// ```no_run
    /// # async fn demo(store: tenure::blocks::fence::FenceStore) -> Result<(), tenure::blocks::fence::FenceError> {
    /// store.install_guard("public.ledger").await?;
    /// // Now this fails with FenceError::GuardRefused:
    /// let err = sqlx::query("DELETE FROM public.ledger").execute(store.pool()).await.unwrap_err();
    /// assert!(tenure::blocks::fence::FenceError::from(err).is_fenced_out());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FenceError::InvalidName`], [`FenceError::Unguardable`] (a partitioned
    /// table or a partition: the trigger is statement-level, and PostgreSQL does
    /// not fire it for writes that reach the table through another name),
    /// [`FenceError::Db`] (e.g. no such table).
    ///
    /// # Fencing
    /// The database refuses the write, whatever code path issued it.
    pub async fn install_guard(&self, table: &str) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.install_guard", table);
        async {
            let quoted = guard::quote_table(table)?;
            let mut tx = self.begin().await?;
            let (kind, partition): (String, bool) = sqlx::query_as(
                "SELECT relkind::text, relispartition FROM pg_class WHERE oid = $1::regclass",
            )
            .bind(&quoted)
            .fetch_one(&mut *tx)
            .await?;
            if let Some(reason) = guard::unguardable(&kind, partition) {
                return Err(FenceError::Unguardable {
                    table: table.to_string(),
                    reason,
                });
            }
            for stmt in guard::install_sql(&self.schema, &quoted, &self.sql.guard_function) {
                tx.execute(stmt.as_str()).await?;
            }
            tx.commit().await?;
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// Removes this store's guard from `table` (idempotent).
    ///
    /// # Errors
    /// [`FenceError::InvalidName`], [`FenceError::Db`].
    pub async fn remove_guard(&self, table: &str) -> Result<(), FenceError> {
        let quoted = guard::quote_table(table)?;
        self.pool
            .execute(guard::remove_sql(&self.schema, &quoted).as_str())
            .await?;
        Ok(())
    }

    /// Whether this store's guard is installed on `table`.
    ///
    /// # Errors
    /// [`FenceError::InvalidName`], [`FenceError::Db`] (e.g. no such table).
    pub async fn is_guarded(&self, table: &str) -> Result<bool, FenceError> {
        let quoted = guard::quote_table(table)?;
        let name = format!("tenure_guard_{}", self.schema);
        let yes: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2)",
        )
        .bind(quoted)
        .bind(name)
        .fetch_one(&self.pool)
        .await?;
        Ok(yes)
    }

    /// The escape hatch: switches this store's guards off for the rest of the
    /// current transaction on `conn` (a migration, an operator's fix), by calling
    /// `<schema>.tenure_bypass_guard()`, which records the current transaction id.
    ///
    /// It is a privilege: the function is `SECURITY DEFINER`, and only its owner
    /// (the role that ran the migrations), superusers and roles granted
    /// `EXECUTE` on it may call it; the worker role gets
    /// [`FenceError::Access`] (permission denied), so application code cannot
    /// forge its way past a guard. It cannot be hit by accident: the guard compares
    /// with the id of the transaction it runs in, so nothing stays open for any
    /// later transaction. Call it inside an explicit transaction. The same in
    /// plain SQL, e.g. in a migration script:
    /// `SELECT tenure.tenure_bypass_guard();`
    ///
    /// ```no_run
    /// # async fn demo(store: tenure::blocks::fence::FenceStore) -> Result<(), tenure::blocks::fence::FenceError> {
    /// let mut tx = store.pool().begin().await?;
    /// store.bypass_guard(&mut tx).await?;
    /// sqlx::query("UPDATE ledger SET note = 'fixed by ops' WHERE id = 7").execute(&mut *tx).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FenceError::Access`] for a role without the grant; [`FenceError::Db`].
    pub async fn bypass_guard(&self, conn: &mut PgConnection) -> Result<(), FenceError> {
        tracing::warn!(schema = %self.schema, "tenure guard bypassed for this transaction");
        conn.execute(format!("SELECT \"{}\".tenure_bypass_guard()", self.schema).as_str())
            .await?;
        Ok(())
    }
}
