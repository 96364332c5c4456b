//! MySQL/MariaDB as a fenced resource (feature `mysql`): a step's writes to a
//! MariaDB database (InnoDB) commit only under the job's newest token there.
//! That is less than a step's PostgreSQL transaction gives: MySQL has no step
//! CAS (its fence knows the job's token, not which step the owner is at) and
//! its commit is a second commit beside the PostgreSQL checkpoint. What holds
//! and what does not is below.
//!
//! * [`MySqlFence::migrate`] creates `tenure_fence` (one row per job: the
//!   largest token this database accepted), `tenure_fence_tx` (the marker of an
//!   open fenced transaction) and the guard's procedure.
//! * [`MySqlFence::begin`] opens a [`MySqlFencedTx`]: `INSERT .. ON
//!   DUPLICATE KEY UPDATE` takes the job's row exclusively (creating it at 0),
//!   `SELECT token .. FOR UPDATE` reads it (a larger token:
//!   [`MySqlFenceError::FencedOut`], before any write of ours), `UPDATE .. SET
//!   token = ? WHERE token <= ?`, then the step's own writes, then the commit,
//!   all one InnoDB transaction. A second admission of the job waits for it;
//!   none deadlocks, as the first lock taken is the exclusive one.
//! * [`MySqlFence::install_guard`] puts triggers on a table that refuse every
//!   write made outside such a transaction (SQLSTATE `TF001`).
//! * In a step, [`StepCtx::mysql`](crate::StepCtx::mysql) opens the
//!   transaction on first use and the runtime commits it just before the
//!   step's PostgreSQL checkpoint.
//!
//! # Supported servers
//! MariaDB 10.11, the server the tests run against. Other MariaDB releases
//! from 10.3 on have what the fence needs (`idle_transaction_timeout`, `CREATE
//! OR REPLACE PROCEDURE`/`TRIGGER`) but are not tested. MySQL 8.0 and 8.4 are
//! not supported: they have neither, and [`MySqlFence::connect`] refuses them
//! with [`MySqlFenceError::UnsupportedServer`] (MySQL's `wait_timeout` would
//! close an idle fenced transaction's connection too, but it closes every
//! connection idle that long, pooled ones included, and is untested here).
//!
//! # What holds
//! 1. **Token order per job.** Fenced transactions of one job serialize on
//!    its fence row (held from admission to commit), and each raises the row
//!    to its token or is refused: in commit order, their tokens never
//!    decrease. Once a transaction under token `t` committed, none under a
//!    smaller token commits a write here; an older owner's write that did land
//!    committed before the first write of every newer one.
//! 2. **The check and the writes are atomic**: one InnoDB transaction; a
//!    refused admission wrote nothing.
//! 3. **Guarded tables** take writes only from an open fenced transaction
//!    whose token is the job's fence.
//! 4. **A paused owner's transaction ends** after `lease_ttl` idle
//!    (`idle_transaction_timeout`), so it holds the row, and stalls a newer
//!    owner's admission (which waits at most 2 x `lease_ttl`, then fails as
//!    [`MySqlFenceError::Db`] and is retried), no longer than that.
//!
//! # What does not hold
//! * **No step CAS.** An equal token (the same owner) is admitted again, for
//!   any step: the fence does not know steps, so it does not stop a step's
//!   MySQL writes from running twice.
//! * **The two commits are not atomic.** A step that writes to MySQL and
//!   checkpoints in PostgreSQL commits MySQL first, then PostgreSQL (with the
//!   step CAS). If the owner dies or PostgreSQL fails between the two, the
//!   step runs again (by this owner after a retry, or by a newer one) against
//!   a MySQL that already has its writes. Making that re-run a no-op is **the
//!   step's job**: it writes
//!   [`StepCtx::idempotency_key`](crate::StepCtx::idempotency_key) (the same
//!   for every owner and attempt of the step) into a unique key in the same
//!   MySQL transaction and applies its change only if that insert added a
//!   row. A step without it moves money twice. `tests/tests/mysql_fence.rs`
//!   crashes between the two commits and checks that the balance moved once.
//! * Writes to tables without the guard, and transactions not opened by
//!   [`MySqlFence::begin`], are not fenced at all.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure::MySqlFenceError> {
//! use tenure::MySqlFence;
//! let url = "mysql://root@127.0.0.1:3306/bank";
//! let cfg = tenure::Config::new("payments");
//! let bank = MySqlFence::connect("bank", url, &cfg).await?;
//! bank.migrate().await?;
//! bank.install_guard("accounts").await?;
//! # Ok(()) }
//! ```

mod error;
mod session;
mod sql;
mod tx;

use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection};

pub use error::{MYSQL_GUARD_SQLSTATE, MySqlFenceError, is_mysql_guard_refusal};
pub use tx::MySqlFencedTx;

use crate::config::Config;
use crate::types::{FencingToken, JobId, ObservedFence};
use session::{Bounds, SetupError};

/// A MySQL/MariaDB database whose writes are fenced per job. Cheap to clone
/// (a pool and a name).
#[derive(Debug, Clone)]
pub struct MySqlFence {
    name: String,
    pool: MySqlPool,
    /// The version of a server the pool found without
    /// `idle_transaction_timeout` (its connections are refused).
    unsupported: Arc<OnceLock<String>>,
}

impl MySqlFence {
    /// Connects a pool to `url` (`mysql://user:password@host:port/database`);
    /// `name` names this database in errors and in
    /// [`StepCtx::mysql`](crate::StepCtx::mysql). Every connection ends an
    /// idle transaction after [`Config::lease_ttl`] (`idle_transaction_timeout`) and
    /// waits at most 2 x `lease_ttl` for a row lock
    /// (`innodb_lock_wait_timeout`), as Tenure's PostgreSQL connections do: a
    /// paused owner's open transaction must not hold the job's fence row for
    /// as long as the pause lasts.
    ///
    /// TLS (rustls) is what the URL says, as the MySQL and MariaDB clients
    /// read it: `ssl-mode` (`DISABLED`, `PREFERRED` (the default: TLS if the
    /// server offers it, any certificate accepted, else plaintext),
    /// `REQUIRED` (TLS, any certificate accepted), `VERIFY_CA` (the
    /// certificate must chain to `ssl-ca`), `VERIFY_IDENTITY` (and name this
    /// host)), `ssl-ca`, `ssl-cert` and `ssl-key` (a client certificate).
    /// `REQUIRED` with `ssl-ca` verifies as `VERIFY_CA` does, as those clients
    /// do. A password to a server that is not on loopback (127.0.0.0/8,
    /// `::1`, `localhost`, a Unix socket) without `VERIFY_CA` or
    /// `VERIFY_IDENTITY` is refused, before anything is sent, unless
    /// [`Config::allow_insecure_transport`].
    ///
    /// Supported servers: MariaDB 10.11 (the tests run on it; other MariaDB
    /// releases from 10.3 on have the setting but are not tested). MySQL 8.0
    /// and 8.4 are refused: they have no idle-transaction bound (their
    /// `wait_timeout` closes any idle connection, pooled ones included, which
    /// Tenure does not rely on), and `migrate` uses MariaDB's `CREATE OR
    /// REPLACE` for the guard.
    ///
    /// # Errors
    /// [`MySqlFenceError::InsecureTransport`] (nothing sent);
    /// [`MySqlFenceError::UnsupportedServer`] if the server answers and has
    /// no `idle_transaction_timeout` (this connect opens one connection, for
    /// at most `lease_ttl`, to ask); [`MySqlFenceError::Db`] if the URL is
    /// malformed. A server that does not answer is not an error here: the
    /// pool connects lazily and reports it at first use (as
    /// [`begin`](Self::begin) reports a server found unsupported then).
    pub async fn connect(name: &str, url: &str, cfg: &Config) -> Result<Self, MySqlFenceError> {
        use crate::security::transport;
        let options = transport::mysql_verifying(MySqlConnectOptions::from_str(url)?);
        transport::check(
            &transport::mysql_link(&options),
            cfg.allow_insecure_transport,
        )?;
        let lease_ttl = cfg.lease_ttl;
        let bounds = Bounds::for_ttl(lease_ttl);
        probe(&options, bounds, lease_ttl).await?;
        let unsupported = Arc::new(OnceLock::new());
        let seen = unsupported.clone();
        let pool = MySqlPoolOptions::new()
            .max_connections(20)
            .after_connect(move |conn, _| {
                Box::pin(session::bound_pooled(conn, bounds, seen.clone()))
            })
            .connect_lazy_with(options);
        Ok(MySqlFence {
            name: name.to_string(),
            pool,
            unsupported,
        })
    }

    /// Uses a pool the application made. Nothing is checked or set: its
    /// connections must bound an idle transaction themselves (as
    /// [`connect`](Self::connect)'s do), on a supported server.
    pub fn from_pool(name: &str, pool: MySqlPool) -> Self {
        MySqlFence {
            name: name.to_string(),
            pool,
            unsupported: Arc::default(),
        }
    }

    /// The database's name in this process.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pool (reads, and writes to tables that are not guarded).
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Creates the fence tables and the guard's procedure (idempotent).
    ///
    /// # Errors
    /// [`MySqlFenceError::Db`] (for example without the `CREATE ROUTINE`
    /// privilege).
    pub async fn migrate(&self) -> Result<(), MySqlFenceError> {
        sqlx::raw_sql(sql::MIGRATE_TABLES)
            .execute(&self.pool)
            .await?;
        sqlx::raw_sql(sql::MIGRATE_GUARD)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Guards `table`: from now on MySQL refuses every `INSERT`, `UPDATE` and
    /// `DELETE` on it that does not come from an open [`MySqlFencedTx`] whose
    /// token is the job's fence (SQLSTATE `TF001`,
    /// [`MySqlFenceError::GuardRefused`]).
    ///
    /// # Errors
    /// [`MySqlFenceError::BadTableName`] unless `table` is a plain identifier;
    /// [`MySqlFenceError::Db`] (no such table, no `TRIGGER` privilege).
    pub async fn install_guard(&self, table: &str) -> Result<(), MySqlFenceError> {
        check_table_name(table)?;
        for stmt in sql::guard_triggers(table) {
            sqlx::raw_sql(&stmt).execute(&self.pool).await?;
        }
        Ok(())
    }

    /// Removes the guard of `table` (seeding data, migrations).
    ///
    /// # Errors
    /// As [`install_guard`](Self::install_guard).
    pub async fn remove_guard(&self, table: &str) -> Result<(), MySqlFenceError> {
        check_table_name(table)?;
        for stmt in sql::drop_guard_triggers(table) {
            sqlx::raw_sql(&stmt).execute(&self.pool).await?;
        }
        Ok(())
    }

    /// Opens a fenced transaction for `job` under `token`.
    ///
    /// # Errors
    /// [`MySqlFenceError::FencedOut`] if this database has seen a larger
    /// token for the job (nothing written);
    /// [`MySqlFenceError::UnsupportedServer`] if the pool found the server
    /// without `idle_transaction_timeout`; [`MySqlFenceError::Db`].
    pub async fn begin(
        &self,
        job: JobId,
        token: FencingToken,
    ) -> Result<MySqlFencedTx, MySqlFenceError> {
        if let Some(refused) = self.refusal() {
            return Err(refused);
        }
        let tx = match self.pool.begin().await {
            Ok(tx) => tx,
            Err(e) => return Err(self.refusal().unwrap_or(e.into())),
        };
        MySqlFencedTx::admit(tx, job, token, self.name.clone()).await
    }

    /// [`MySqlFenceError::UnsupportedServer`] once the pool found the server
    /// without `idle_transaction_timeout`.
    fn refusal(&self) -> Option<MySqlFenceError> {
        let version = self.unsupported.get()?.clone();
        Some(MySqlFenceError::UnsupportedServer { version })
    }

    /// The largest token this database accepted for `job`, if any.
    ///
    /// # Errors
    /// [`MySqlFenceError::Db`].
    pub async fn fence_of(&self, job: JobId) -> Result<Option<ObservedFence>, MySqlFenceError> {
        let token: Option<i64> = sqlx::query_scalar(sql::READ_FENCE)
            .bind(job.as_uuid().to_string())
            .fetch_optional(&self.pool)
            .await?;
        Ok(token.and_then(|t| ObservedFence::try_from(t).ok()))
    }
}

/// Opens one connection (for at most `wait`) and bounds its session, to
/// refuse a server that answers without the setting. A server that does not
/// answer passes: the pool reports it at first use.
async fn probe(
    options: &MySqlConnectOptions,
    bounds: Bounds,
    wait: Duration,
) -> Result<(), MySqlFenceError> {
    let Ok(Ok(mut conn)) = tokio::time::timeout(wait, options.connect()).await else {
        return Ok(());
    };
    let checked = session::bound(&mut conn, bounds).await;
    let _ = conn.close().await;
    match checked {
        Err(SetupError::Unsupported { version }) => {
            Err(MySqlFenceError::UnsupportedServer { version })
        }
        Ok(()) | Err(SetupError::Db(_)) => Ok(()),
    }
}

/// A plain identifier that leaves room for the trigger name's affixes.
fn check_table_name(table: &str) -> Result<(), MySqlFenceError> {
    let mut chars = table.chars();
    let plain = table.len() <= 48
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        Ok(())
    } else {
        Err(MySqlFenceError::BadTableName(table.to_string()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["accounts", "_t", "a1_b2"] {
            assert!(check_table_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1a", "a-b", "a`b", "a b", &"x".repeat(49)] {
            assert!(
                matches!(check_table_name(bad), Err(MySqlFenceError::BadTableName(_))),
                "{bad}"
            );
        }
    }
}
