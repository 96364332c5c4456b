//! The bounds every connection of a [`MySqlFence`](super::MySqlFence) sets on
//! its session, and what a server that lacks them is told.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::MySqlConnection;
use sqlx::mysql::MySqlDatabaseError;

/// MySQL's and MariaDB's error number for an unknown system variable
/// (`ER_UNKNOWN_SYSTEM_VARIABLE`): what MySQL 8 answers to
/// `SET SESSION idle_transaction_timeout`.
pub(super) const ER_UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;

/// The per-session bounds derived from the lease TTL: an idle transaction
/// ends after a TTL, a row-lock wait after two.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    idle_secs: u64,
    lock_wait_secs: u64,
}

impl Bounds {
    /// The bounds for `lease_ttl` (at least one second each).
    pub(super) fn for_ttl(lease_ttl: Duration) -> Self {
        Bounds {
            idle_secs: lease_ttl.as_secs().max(1),
            lock_wait_secs: (2 * lease_ttl.as_secs()).max(1),
        }
    }

    fn sql(self) -> String {
        format!(
            "SET SESSION idle_transaction_timeout = {}, innodb_lock_wait_timeout = {}",
            self.idle_secs, self.lock_wait_secs
        )
    }
}

/// Why a session could not be bounded.
#[derive(Debug)]
pub(super) enum SetupError {
    /// The server has no `idle_transaction_timeout` (it reports `version`).
    Unsupported { version: String },
    /// Any other failure.
    Db(sqlx::Error),
}

/// Sets `bounds` on `conn`'s session.
pub(super) async fn bound(conn: &mut MySqlConnection, bounds: Bounds) -> Result<(), SetupError> {
    let Err(e) = sqlx::query(&bounds.sql()).execute(&mut *conn).await else {
        return Ok(());
    };
    if !lacks_setting(server_error_number(&e)) {
        return Err(SetupError::Db(e));
    }
    let version: Result<String, _> = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut *conn)
        .await;
    Err(SetupError::Unsupported {
        version: version.unwrap_or_else(|_| "a server of unknown version".into()),
    })
}

/// The pool's `after_connect`: bounds every new connection; a server without
/// the setting is remembered in `unsupported` (so that
/// [`MySqlFence::begin`](super::MySqlFence::begin) can say so) and the
/// connection refused.
pub(super) async fn bound_pooled(
    conn: &mut MySqlConnection,
    bounds: Bounds,
    unsupported: Arc<OnceLock<String>>,
) -> Result<(), sqlx::Error> {
    match bound(conn, bounds).await {
        Ok(()) => Ok(()),
        Err(SetupError::Db(e)) => Err(e),
        Err(SetupError::Unsupported { version }) => {
            let message = format!("{version} has no idle_transaction_timeout");
            let _ = unsupported.set(version);
            Err(sqlx::Error::Configuration(message.into()))
        }
    }
}

/// The server's error number, if `e` is an error the server sent.
fn server_error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(MySqlDatabaseError::number)
}

/// Whether a failed `SET SESSION` with server error `number` means the server
/// lacks one of the settings (rather than refusing a value, or failing).
fn lacks_setting(number: Option<u16>) -> bool {
    number == Some(ER_UNKNOWN_SYSTEM_VARIABLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unknown_variable_means_an_unsupported_server() {
        assert!(lacks_setting(Some(1193)));
        // 1231 (a wrong value), 1227 (no privilege), 2013 (lost connection),
        // and errors that are not the server's.
        for other in [Some(1231), Some(1227), Some(2013), None] {
            assert!(!lacks_setting(other), "{other:?}");
        }
        assert!(server_error_number(&sqlx::Error::RowNotFound).is_none());
    }

    #[test]
    fn the_bounds_follow_the_lease_ttl() {
        let b = Bounds::for_ttl(Duration::from_secs(5));
        assert_eq!(
            b.sql(),
            "SET SESSION idle_transaction_timeout = 5, innodb_lock_wait_timeout = 10"
        );
        let sub_second = Bounds::for_ttl(Duration::from_millis(300));
        assert_eq!((sub_second.idle_secs, sub_second.lock_wait_secs), (1, 1));
    }
}
