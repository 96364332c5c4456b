//! [`FenceStore`]: opening the store on a pool, migrating its schema, and the
//! grants a worker role needs.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::migrate::{Migrate, MigrateError};
use sqlx::postgres::PgPool;
use sqlx::{Connection, Executor, PgConnection};
use sqlx::{Postgres, Transaction};
use tracing::Instrument;

use crate::config::Config;

use super::access::{connect_options, pool_options};
use super::error::FenceError;
use super::guard;
use super::sql::Sql;

/// Class of the session advisory lock that serializes [`FenceStore::migrate`] per
/// schema (`pg_advisory_lock(MIGRATE_LOCK_CLASS, hashtext(schema))`); "tenu".
const MIGRATE_LOCK_CLASS: i32 = 0x7465_6e75;

/// Job rows and fenced transactions in one PostgreSQL schema. Cheap to clone (a
/// pool handle and the prepared SQL text).
#[derive(Debug, Clone)]
pub struct FenceStore {
    pub(super) pool: PgPool,
    pub(super) schema: Arc<str>,
    pub(super) sql: Arc<Sql>,
}

impl FenceStore {
    /// Connects a pool to [`Config::database_url`] (`max_in_flight + 4` connections:
    /// each running step holds one; see [`pool_options`]) for the schema
    /// [`Config::schema`], or uses [`Config::database_pool`] when set. Does not
    /// migrate: call [`migrate`](FenceStore::migrate).
    ///
    /// # Errors
    /// [`FenceError::InvalidName`] for a bad schema name,
    /// [`FenceError::InsecureTransport`] for a password that would be sent
    /// without verified TLS to a server off loopback (nothing sent; see
    /// [`Config::allow_insecure_transport`]), [`FenceError::Access`]
    /// when PostgreSQL refuses the TLS handshake or the credentials,
    /// [`FenceError::Db`] if it cannot be reached.
    pub async fn connect(cfg: &Config) -> Result<Self, FenceError> {
        use crate::security::transport;
        guard::check_schema(&cfg.schema)?;
        let pool = match &cfg.database_pool {
            Some(pool) => pool.clone(),
            None => {
                let options = connect_options(cfg)?;
                let link = transport::pg_link(&options);
                transport::check(&link, cfg.allow_insecure_transport)?;
                pool_options(cfg)
                    .connect_with(options)
                    .await
                    .map_err(|e| with_address(cfg, e))?
            }
        };
        let mut store = Self::new(pool, &cfg.schema)?;
        if cfg.partitions.is_some() {
            let sql = Sql::new(&cfg.schema).partitioned(&cfg.schema);
            store.sql = Arc::new(sql);
        }
        #[cfg(feature = "testing")]
        let store = if cfg.unsafe_no_fencing {
            tracing::error!("UNSAFE: fencing is OFF (test-only negative control)");
            FenceStore {
                sql: Arc::new(unfenced(cfg)),
                ..store
            }
        } else {
            store
        };
        Ok(store)
    }

    /// A store on an existing pool, for schema `schema` (`[a-z0-9_]`, 1-48 chars,
    /// not starting with a digit).
    ///
    /// The pool must apply Tenure's per-connection settings: build it with
    /// [`pool_options`] (its `after_connect` sets `idle_in_transaction_session_timeout`
    /// and `lock_timeout` from the lease TTL), as [`FenceStore::connect`] does.
    /// Without them a paused owner's open step transaction holds the job row
    /// until its pause ends, and the next owner's claim waits that long (the
    /// fence still refuses the old owner; only liveness suffers).
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), tenure::blocks::fence::FenceError> {
    /// let store = tenure::blocks::fence::FenceStore::new(pool, "tenure")?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FenceError::InvalidName`].
    pub fn new(pool: PgPool, schema: &str) -> Result<Self, FenceError> {
        guard::check_schema(schema)?;
        Ok(FenceStore {
            pool,
            schema: Arc::from(schema),
            sql: Arc::new(Sql::new(schema)),
        })
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema holding the job rows.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// A transaction on a pooled connection, begun to the end even when the
    /// caller's future is dropped half way.
    ///
    /// sqlx 0.8.6 counts a transaction only once the server has answered its
    /// `BEGIN`: a `pool.begin()` dropped in between (a step cancelled at
    /// shutdown, a leader stepping down) puts its connection back in the pool
    /// inside a transaction sqlx does not know of, and every autocommit
    /// statement on that connection afterwards (a release, a failure record)
    /// is held there, then lost when the pool closes it. Begun in a task of
    /// its own, the `BEGIN` always completes; if the caller went away, the
    /// transaction is dropped there and sqlx sends its rollback.
    ///
    /// The checkout skips the pool's ping: the `BEGIN` is the transaction's
    /// first statement, so a session the server ended fails it before
    /// anything ran, and it runs again on a fresh connection
    /// ([`on_live_session`](super::access::on_live_session)), as the ping would
    /// have made it, one wait sooner.
    pub(super) async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let pool = self.pool.clone();
        let begun = async move { super::access::on_live_session(&pool, || pool.begin()).await };
        match tokio::spawn(begun).await {
            Ok(begun) => begun,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down.
            Err(_) => Err(sqlx::Error::PoolClosed),
        }
    }

    /// Applies the embedded migrations (`framework/migrations/`) to this store's
    /// schema, creating it if needed. Idempotent. Safe when several processes call it
    /// at once: a session advisory lock per schema serializes them, and the
    /// `_sqlx_migrations` table lives in the schema, so schemas are independent.
    ///
    /// Runs on a connection of its own (not from the pool) with
    /// `search_path = "<schema>", pg_temp`.
    ///
    /// # Errors
    /// [`FenceError::Db`] (connection, lock, schema creation), [`FenceError::Migrate`]
    /// (a migration failed, or the schema holds migrations this build does not know).
    pub async fn migrate(&self) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.migrate", schema = %self.schema);
        async {
            let opts = self.pool.connect_options();
            let mut conn = PgConnection::connect_with(&opts).await?;
            let result = self.migrate_on(&mut conn).await;
            // Closing ends the session, which also drops the advisory lock if the
            // explicit unlock did not run.
            let _ = conn.close().await;
            result
        }
        .instrument(span)
        .await
    }

    /// The versions of the migrations applied to this store's schema, oldest
    /// first; empty while the schema (or its `_sqlx_migrations` table) does
    /// not exist. Only reads: `tenure migrate` compares it before and after
    /// [`migrate`](Self::migrate) to say what a run applied.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn applied_migrations(&self) -> Result<Vec<i64>, FenceError> {
        let table = format!("\"{}\"._sqlx_migrations", self.schema);
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&table)
            .fetch_one(&self.pool)
            .await?;
        if !exists {
            return Ok(Vec::new());
        }
        let sql = format!("SELECT version FROM {table} WHERE success ORDER BY version");
        Ok(sqlx::query_scalar(&sql).fetch_all(&self.pool).await?)
    }

    async fn migrate_on(&self, conn: &mut PgConnection) -> Result<(), FenceError> {
        let schema: &str = &self.schema;
        sqlx::query("SELECT pg_advisory_lock($1, hashtext($2))")
            .bind(MIGRATE_LOCK_CLASS)
            .bind(schema)
            .execute(&mut *conn)
            .await?;
        conn.execute(format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"").as_str())
            .await?;
        conn.execute(format!("SET search_path TO \"{schema}\", pg_temp").as_str())
            .await?;
        apply_migrations(conn).await?;
        sqlx::query("SELECT pg_advisory_unlock($1, hashtext($2))")
            .bind(MIGRATE_LOCK_CLASS)
            .bind(schema)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// The negative control's SQL (in partition mode too).
#[cfg(feature = "testing")]
fn unfenced(cfg: &Config) -> Sql {
    let sql = Sql::new(&cfg.schema);
    let sql = if cfg.partitions.is_some() {
        sql.partitioned(&cfg.schema)
    } else {
        sql
    };
    sql.without_fencing(&cfg.schema)
}

/// A connect error, with the server's address when it is a refusal.
fn with_address(cfg: &Config, err: sqlx::Error) -> FenceError {
    match FenceError::from(err) {
        FenceError::Access(mut refusal) => {
            refusal.address = crate::security::address_of(&cfg.database_url);
            FenceError::Access(refusal)
        }
        other => other,
    }
}

/// sqlx's `Migrator::run` loop, without its per-database lock (ours is per schema)
/// and without the `Acquire` bound that makes the future non-`Send`.
async fn apply_migrations(conn: &mut PgConnection) -> Result<(), MigrateError> {
    let migrator = sqlx::migrate!("./migrations");
    conn.ensure_migrations_table().await?;
    if let Some(version) = conn.dirty_version().await? {
        return Err(MigrateError::Dirty(version));
    }
    let applied: HashMap<i64, _> = conn
        .list_applied_migrations()
        .await?
        .into_iter()
        .map(|m| (m.version, m))
        .collect();
    for version in applied.keys() {
        if !migrator.version_exists(*version) {
            return Err(MigrateError::VersionMissing(*version));
        }
    }
    for migration in migrator.iter() {
        if migration.migration_type.is_down_migration() {
            continue;
        }
        match applied.get(&migration.version) {
            Some(done) if done.checksum != migration.checksum => {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            Some(_) => {}
            None => {
                conn.apply(migration).await?;
            }
        }
    }
    Ok(())
}
