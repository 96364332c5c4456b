//! Reaching PostgreSQL securely: TLS through the URL (`sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey`; rustls), a password kept out of the URL, an existing
//! pool. (A refusal is named as an
//! [`AccessError`](crate::security::AccessError) by `error.rs`.)

use std::time::Duration;

use sqlx::Executor;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::Config;

/// The connect options of [`Config::database_url`] (and
/// [`Config::database_password`]), with libpq's rule that `sslmode=require`
/// with a root certificate (`sslrootcert`, or `PGSSLROOTCERT`) verifies the
/// server's certificate against it, as `verify-ca` does (sqlx alone would
/// accept any certificate).
///
/// ```
/// let cfg = tenure::Config::new("payments")
///     .with_database_url("postgres://worker@db:5432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem");
/// let options = tenure::blocks::fence::connect_options(&cfg)?;
/// assert_eq!(options.get_host(), "db");
///
/// let cfg = cfg.with_database_url("postgres://worker@db/app?sslmode=require&sslrootcert=/etc/ca.pem");
/// let options = tenure::blocks::fence::connect_options(&cfg)?;
/// assert!(matches!(options.get_ssl_mode(), sqlx::postgres::PgSslMode::VerifyCa));
/// # Ok::<(), tenure::blocks::fence::FenceError>(())
/// ```
///
/// # Errors
/// [`FenceError::Db`](super::FenceError::Db) for a URL that does not parse.
pub fn connect_options(cfg: &Config) -> Result<PgConnectOptions, super::FenceError> {
    let url = &cfg.database_url;
    Ok(crate::security::transport::pg_options(
        url,
        cfg.database_password.as_ref(),
    )?)
}

/// Pool options with Tenure's per-connection settings applied in `after_connect`:
/// `idle_in_transaction_session_timeout` = [`Config::idle_in_transaction_timeout`]
/// and `lock_timeout` = [`Config::lock_timeout`], and `max_in_flight + 4`
/// connections. Build the pool you hand to [`Config::with_database_pool`] from it.
///
/// A pooled connection is pinged as it is checked out (a round trip that
/// replaces a session the server ended), except for Tenure's idempotent
/// statements (a job row's insert, the reads by id, the probe) and a
/// transaction's `BEGIN`: they run again on a fresh connection when the
/// session was gone, so the ping would only cost them a wait.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = tenure::Config::from_env()?;
/// let pool = tenure::blocks::fence::pool_options(&cfg)
///     .connect_with(tenure::blocks::fence::connect_options(&cfg)?)
///     .await?;
/// let cfg = cfg.with_database_pool(pool);
/// # Ok(()) }
/// ```
pub fn pool_options(cfg: &Config) -> PgPoolOptions {
    let max = u32::try_from(cfg.max_in_flight.saturating_add(4)).unwrap_or(u32::MAX);
    let settings = session_settings(cfg.idle_in_transaction_timeout(), cfg.lock_timeout())
        + &application_name(&cfg.worker_id);
    PgPoolOptions::new()
        .max_connections(max)
        .after_connect(move |conn, _meta| {
            let settings = settings.clone();
            Box::pin(async move {
                conn.execute(settings.as_str()).await?;
                Ok(())
            })
        })
        .test_before_acquire(false)
        .before_acquire(|conn, _meta| {
            Box::pin(async move {
                if UNPINGED.try_with(|()| ()).is_ok() {
                    return Ok(true);
                }
                // As `test_before_acquire` does: a connection that does not
                // answer is closed, and the checkout takes another.
                Ok(sqlx::Connection::ping(conn).await.is_ok())
            })
        })
}

tokio::task_local! {
    /// Set while an idempotent statement checks out its connection.
    static UNPINGED: ();
}

/// Runs `statement` with its pool checkouts unpinged (on a pool of
/// [`pool_options`]; a pool of your own keeps its own setting). Only for a
/// statement that may run twice and that runs again on a fresh connection
/// when its session was gone ([`on_live_session`]): a write whose
/// failure is bookkept (a step's, an attempt's) needs the ping, because a
/// dead session found by the statement itself would end the attempt.
pub(super) async fn unpinged<F: std::future::Future>(statement: F) -> F::Output {
    UNPINGED.scope((), statement).await
}

/// Runs the idempotent `statement` on `pool`, and again on a fresh
/// connection each time its session was gone before it ran
/// ([`is_session_ended`](super::error::is_session_ended): a session the
/// server ended while the connection sat in the pool): at most once per
/// pooled connection, plus one. Its checkouts skip the pool's ping
/// ([`unpinged`]): this retry does the ping's job.
pub(super) async fn on_live_session<T, F, Fut>(
    pool: &sqlx::PgPool,
    statement: F,
) -> Result<T, sqlx::Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut left = pool.size() + 1;
    loop {
        match unpinged(statement()).await {
            Err(e) if left > 0 && super::error::is_session_ended(&e) => {
                tracing::debug!(error = %e, "the pooled session was gone; again on a fresh one");
                left -= 1;
            }
            done => return done,
        }
    }
}

/// `; SET application_name = '<worker id>'`: the job history (`job_events`)
/// names the worker that wrote each change by it, as does `pg_stat_activity`.
fn application_name(worker_id: &str) -> String {
    // PostgreSQL truncates application_name to 63 bytes and drops non-ASCII.
    let printable: String = worker_id
        .chars()
        .filter(|c| c.is_ascii() && !c.is_ascii_control())
        .take(63)
        .collect();
    format!(
        "; SET application_name = {}",
        super::sql::quote_literal(&printable)
    )
}

/// A paused or partitioned owner's open transaction must not hold the job row
/// (or user rows) hostage: PostgreSQL ends it once it sits idle for longer than
/// the lease could survive, and lock waits are bounded too.
fn session_settings(idle: Duration, lock: Duration) -> String {
    format!(
        "SET idle_in_transaction_session_timeout = {}; SET lock_timeout = {}",
        idle.as_millis(),
        lock.as_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_settings_bound_idle_transactions_and_lock_waits() {
        assert_eq!(
            session_settings(Duration::from_secs(5), Duration::from_secs(10)),
            "SET idle_in_transaction_session_timeout = 5000; SET lock_timeout = 10000"
        );
    }

    #[test]
    fn application_name_is_the_quoted_worker_id() {
        assert_eq!(application_name("w-1"), "; SET application_name = E'w-1'");
        assert_eq!(
            application_name("it's\\\né"),
            "; SET application_name = E'it''s\\\\'"
        );
    }
}
