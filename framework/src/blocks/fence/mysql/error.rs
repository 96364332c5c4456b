//! [`MySqlFenceError`]: what the MySQL fence refuses, kept apart by cause.

use crate::types::{FencingToken, JobId, ObservedFence};

/// The SQLSTATE the MySQL guard raises (the same as PostgreSQL's guard,
/// [`GUARD_SQLSTATE`](crate::fence::GUARD_SQLSTATE)).
pub const MYSQL_GUARD_SQLSTATE: &str = "TF001";

/// Errors of [`MySqlFence`](super::MySqlFence) and its transactions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MySqlFenceError {
    /// A newer owner's token reached this database first: nothing of ours was
    /// written.
    #[error("job {job}: token {ours} fenced out by {current} at MySQL")]
    FencedOut {
        /// The job.
        job: JobId,
        /// Our token.
        ours: FencingToken,
        /// The fence the database holds.
        current: ObservedFence,
    },
    /// The guard trigger refused a write made outside a fenced transaction.
    #[error("MySQL guard refused a write: {message}")]
    GuardRefused {
        /// The trigger's message (it names the table).
        message: String,
    },
    /// A table name that is not a plain identifier (`[A-Za-z_][A-Za-z0-9_]*`,
    /// at most 48 characters, so the trigger names fit MySQL's 64).
    #[error("not a plain MySQL table name: {0:?}")]
    BadTableName(String),
    /// A step asked for a second MySQL database: one step writes to one.
    #[error("this step's fenced MySQL transaction is on {open}, not {asked}")]
    SecondDatabase {
        /// The database the step's transaction is open on.
        open: String,
        /// The one asked for.
        asked: String,
    },
    /// The server has no `idle_transaction_timeout` (error 1193 to `SET
    /// SESSION`: MySQL 8.0 and 8.4, MariaDB before 10.3), so a paused owner's
    /// open transaction would hold the job's fence row, and stall every newer
    /// owner's admission, for as long as the pause lasts. The MySQL fence
    /// supports MariaDB (tested: 10.11), not MySQL.
    #[error(
        "{version} has no idle_transaction_timeout: the MySQL fence supports MariaDB \
         (tested: 10.11), not MySQL"
    )]
    UnsupportedServer {
        /// What the server reports as `VERSION()`.
        version: String,
    },
    /// A password would be sent without verified TLS to a server that is not
    /// on loopback (see [`MySqlFence::connect`](super::MySqlFence::connect)):
    /// nothing was sent.
    #[error(transparent)]
    InsecureTransport(#[from] crate::security::InsecureTransport),
    /// A step context without a fencing owner (detached for tests).
    #[error("no fencing owner in this context")]
    Detached,
    /// Any other database error (I/O, timeout, deadlock, constraint).
    #[error("MySQL: {0}")]
    Db(#[source] sqlx::Error),
}

impl MySqlFenceError {
    /// Whether a newer owner holds the job (the write was refused as stale).
    pub fn is_fenced_out(&self) -> bool {
        matches!(self, MySqlFenceError::FencedOut { .. })
    }
}

impl From<sqlx::Error> for MySqlFenceError {
    fn from(e: sqlx::Error) -> Self {
        match e.as_database_error() {
            Some(d) if d.code().as_deref() == Some(MYSQL_GUARD_SQLSTATE) => {
                MySqlFenceError::GuardRefused {
                    message: d.message().to_string(),
                }
            }
            _ => MySqlFenceError::Db(e),
        }
    }
}

/// Whether `err` is the MySQL guard refusing a write (SQLSTATE `TF001`).
///
/// ```
/// assert!(!tenure::blocks::fence::mysql::is_mysql_guard_refusal(&sqlx::Error::RowNotFound));
/// ```
pub fn is_mysql_guard_refusal(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .is_some_and(|d| d.code().as_deref() == Some(MYSQL_GUARD_SQLSTATE))
}
