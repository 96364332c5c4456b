//! The fenced resource: job rows in PostgreSQL and fenced transactions. This is the
//! only code that writes job rows.
//!
//! # Overview
//! * [`FenceStore::migrate`] applies the embedded migrations in the schema of your
//!   choice ([`Config::schema`](crate::Config::schema), default `tenure`), including
//!   sqlx's `_sqlx_migrations` bookkeeping table, so several schemas in one database
//!   migrate independently.
//! * [`FenceStore::insert_job`] creates a job row once (same id, same row).
//! * [`FenceStore::claim`] raises the row's fence to the caller's token and says
//!   where to resume; [`FenceStore::claim_and_begin`] does that and opens the first
//!   step's transaction in one go.
//! * [`FencedTx`] is one step's transaction, admitted under the token, committed with
//!   the step CAS ([`FencedTx::commit_step`]).
//! * [`FenceStore::install_guard`] makes PostgreSQL itself refuse writes to one of
//!   your tables unless they come from the job's current generation.
//! * [`TokenGate`] is the same rule for a service a step calls: it keeps the
//!   largest token accepted per job (in [`PgFenceMarks`], inside the service's
//!   own transaction) and refuses smaller ones.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure::fence::FenceError> {
//! use tenure::fence::{FenceStore, Inserted};
//! use tenure::{Config, FencingToken, JobId};
//! let cfg = Config::new("payments").with_database_url("postgres://postgres@127.0.0.1/app");
//! let store = FenceStore::connect(&cfg).await?;
//! store.migrate().await?;
//! store.install_guard("ledger").await?;
//!
//! let id = JobId::from_key("ledger.transfer", "transfer-42");
//! store.insert_job(id, "ledger.transfer", &serde_json::json!({"amount": 10})).await?;
//! # let token: FencingToken = todo!("from a verified etcd lock grant");
//! let (claim, mut tx) = store.claim_and_begin(id, token).await?;
//! sqlx::query("INSERT INTO ledger (job, amount) VALUES ($1, 10)")
//!     .bind(id.as_uuid())
//!     .execute(tx.conn())
//!     .await?;
//! tx.commit_step(&serde_json::json!({"reserved": true}), false).await?;
//! # let _ = claim; Ok(()) }
//! ```
//!
//! # Why the fence holds under READ COMMITTED
//! Every fenced statement carries the fence in its `WHERE` clause and is a
//! row-locking statement: the claim (`UPDATE .. WHERE fence < $token`), the
//! admission (`SELECT .. WHERE fence = $token AND step = $k .. FOR UPDATE`), the step
//! CAS and the other fenced updates, and the guard's `SELECT .. FOR SHARE`.
//!
//! 1. **The predicate is checked on the newest row version, under the lock.** In
//!    READ COMMITTED each statement takes a fresh snapshot. When the row version it
//!    found is being changed by another transaction, the statement waits for that
//!    transaction to end; if it committed, PostgreSQL does not use the version from
//!    its snapshot: it fetches the newest committed version, locks it and evaluates
//!    the `WHERE` clause again on it (EvalPlanQual). So `fence < $token` and
//!    `fence = $token` are decided against the fence as it is when we hold the row
//!    lock, never against a stale read. Two claims therefore serialize, and the
//!    smaller token finds zero rows once the larger one is in.
//! 2. **Admission and mutation are one atomic boundary.** A [`FencedTx`] takes the
//!    row lock with its first statement and keeps it until it commits or rolls back.
//!    A claim by a newer token needs that same lock, so it waits: it cannot commit
//!    between admission and the step's commit. Conversely, a claim that committed
//!    before admission makes admission see `fence > $token` (in its snapshot, or in
//!    the re-check after waiting): zero rows, [`FenceError::FencedOut`] before any
//!    user write. Either the step's writes are ordered entirely before the takeover
//!    (and the new owner resumes from their checkpoint), or none of them happen.
//! 3. **The guard uses the same rule.** It reads the job row `FOR SHARE`, which
//!    conflicts with the claim's lock, so plain SQL that carries a generation's
//!    settings cannot race a takeover either; inside a [`FencedTx`] the row is
//!    already locked by the same transaction and the check is free of waits.
//!
//! Nothing relies on a snapshot being fresh, which is why READ COMMITTED (the
//! default) suffices. Under REPEATABLE READ or SERIALIZABLE the fence still holds,
//! but a concurrent claim surfaces as a serialization failure (SQLSTATE 40001, a
//! retryable [`FenceError::Db`]) instead of [`FenceError::FencedOut`].
//!
//! # The guard and its escape hatch
//! See [`FenceStore::install_guard`] and [`FenceStore::bypass_guard`].

mod access;
mod error;
mod gate;
mod guard;
mod history;
mod row;
mod sql;
mod tx;

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::migrate::{Migrate, MigrateError};
use sqlx::postgres::PgPool;
use sqlx::{Connection, Executor, PgConnection, Postgres};
use tracing::Instrument;

use crate::config::Config;
use crate::types::{FencingToken, JobId, ObservedFence, StepIndex};

pub use access::{connect_options, pool_options};
pub use error::{FenceError, GUARD_SQLSTATE, is_guard_refusal};
pub use gate::{
    Admitted, FenceMarks, GateError, MemoryFenceMarks, MemoryTx, PgFenceMarks, StaleToken,
    TokenGate,
};
pub use history::{
    JobCursor, JobEvent, JobFilter, MAX_JOB_EVENTS, Overview, TypeStatusCount, WindowCounts,
    WorkerSeen,
};
pub use row::{Claim, Inserted, JobRow, JobStatus, UnknownStatus};
pub use tx::FencedTx;

use row::{Diag, claim_from, diag_from, job_row, step_to_sql};
use sql::Sql;

/// Class of the session advisory lock that serializes [`FenceStore::migrate`] per
/// schema (`pg_advisory_lock(MIGRATE_LOCK_CLASS, hashtext(schema))`); "tenu".
const MIGRATE_LOCK_CLASS: i32 = 0x7465_6e75;

/// How often a claim re-reads and retries when the row changed between its update
/// and its diagnosis (a concurrent redrive); each retry is a fresh, fenced attempt.
const CLAIM_RETRIES: usize = 3;

/// Job rows and fenced transactions in one PostgreSQL schema. Cheap to clone (a
/// pool handle and the prepared SQL text).
#[derive(Debug, Clone)]
pub struct FenceStore {
    pool: PgPool,
    schema: Arc<str>,
    sql: Arc<Sql>,
}

impl FenceStore {
    /// Connects a pool to [`Config::database_url`] (`max_in_flight + 4` connections:
    /// each running step holds one; see [`pool_options`]) for the schema
    /// [`Config::schema`], or uses [`Config::database_pool`] when set. Does not
    /// migrate: call [`migrate`](FenceStore::migrate).
    ///
    /// # Errors
    /// [`FenceError::InvalidName`] for a bad schema name, [`FenceError::Access`]
    /// when PostgreSQL refuses the TLS handshake or the credentials,
    /// [`FenceError::Db`] if it cannot be reached.
    pub async fn connect(cfg: &Config) -> Result<Self, FenceError> {
        guard::check_schema(&cfg.schema)?;
        let pool = match &cfg.database_pool {
            Some(pool) => pool.clone(),
            None => pool_options(cfg)
                .connect_with(connect_options(cfg)?)
                .await
                .map_err(|e| with_address(cfg, e))?,
        };
        let store = Self::new(pool, &cfg.schema)?;
        #[cfg(feature = "testing")]
        let store = if cfg.unsafe_no_fencing {
            tracing::error!("UNSAFE: fencing is OFF (test-only negative control)");
            FenceStore {
                sql: Arc::new(Sql::new(&cfg.schema).without_fencing(&cfg.schema)),
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
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), tenure::fence::FenceError> {
    /// let store = tenure::fence::FenceStore::new(pool, "tenure")?;
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

    /// Grants `role` what running jobs needs on this store's schema, and nothing
    /// more: `USAGE` on the schema, `SELECT, INSERT, UPDATE` on `jobs`,
    /// `EXECUTE` on `tenure_step_cas`. No DDL, no `DELETE`, no guard bypass (see
    /// `guide::production`, least-privilege roles). Run it as the migrator
    /// (the schema's owner) after [`migrate`](Self::migrate). Idempotent.
    ///
    /// ```no_run
    /// # async fn demo(store: tenure::fence::FenceStore) -> Result<(), tenure::fence::FenceError> {
    /// store.migrate().await?;
    /// store.grant_worker("tenure_worker").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FenceError::InvalidName`] for a role that is not a plain identifier;
    /// [`FenceError::Access`] when the caller may not grant.
    pub async fn grant_worker(&self, role: &str) -> Result<(), FenceError> {
        let role = guard::quote_table(role)?;
        let s = &self.schema;
        let mut tx = self.pool.begin().await?;
        for stmt in [
            format!("GRANT USAGE ON SCHEMA \"{s}\" TO {role}"),
            format!("GRANT SELECT, INSERT, UPDATE ON \"{s}\".jobs TO {role}"),
            format!(
                "GRANT EXECUTE ON FUNCTION \"{s}\".tenure_step_cas(uuid, bigint, integer, jsonb, boolean) TO {role}"
            ),
            format!(
                "GRANT EXECUTE ON FUNCTION \"{s}\".tenure_record_refusal(uuid, bigint, bigint, integer, text) TO {role}"
            ),
        ] {
            tx.execute(stmt.as_str()).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Inserts a `pending` job row. Idempotent: the same id with the same job type and
    /// input (compared as `jsonb`, so key order does not matter) is
    /// [`Inserted::Existing`] and changes nothing.
    ///
    /// # Errors
    /// [`FenceError::PayloadConflict`] when the id exists with another job type or
    /// input (never overwritten); [`FenceError::Db`].
    pub async fn insert_job(
        &self,
        id: JobId,
        job_type: &str,
        input: &serde_json::Value,
    ) -> Result<Inserted, FenceError> {
        let span = tracing::info_span!("tenure.fence.insert_job", job_id = %id, job_type);
        async {
            for _ in 0..CLAIM_RETRIES {
                let done = sqlx::query(&self.sql.insert)
                    .bind(id.as_uuid())
                    .bind(job_type)
                    .bind(input)
                    .execute(&self.pool)
                    .await?;
                if done.rows_affected() == 1 {
                    return Ok(Inserted::New);
                }
                // ON CONFLICT DO NOTHING waited for a concurrent inserter to finish,
                // so the row is visible now (unless it was deleted meanwhile: retry).
                let same: Option<bool> = sqlx::query_scalar(&self.sql.same_payload)
                    .bind(id.as_uuid())
                    .bind(job_type)
                    .bind(input)
                    .fetch_optional(&self.pool)
                    .await?;
                match same {
                    Some(true) => return Ok(Inserted::Existing),
                    Some(false) => return Err(FenceError::PayloadConflict { job_id: id }),
                    None => continue,
                }
            }
            Err(FenceError::NotFound(id))
        }
        .instrument(span)
        .await
    }

    /// Reads one job row.
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn job(&self, id: JobId) -> Result<Option<JobRow>, FenceError> {
        let row = sqlx::query(&self.sql.job)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(job_row).transpose()
    }

    /// Reads the job rows of `ids` in one query (ids without a row are simply
    /// missing from the answer; the order is unspecified).
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn jobs(&self, ids: &[JobId]) -> Result<Vec<JobRow>, FenceError> {
        let ids: Vec<uuid::Uuid> = ids.iter().map(JobId::as_uuid).collect();
        let rows = sqlx::query(&self.sql.jobs)
            .bind(ids)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(job_row).collect()
    }

    /// Lists up to `limit` job rows, oldest first, optionally of one status.
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn list_jobs(
        &self,
        status: Option<JobStatus>,
        limit: i64,
    ) -> Result<Vec<JobRow>, FenceError> {
        let rows = sqlx::query(&self.sql.list)
            .bind(status.map(JobStatus::as_str))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(job_row).collect()
    }

    /// Claims the job for `token`, before any useful work:
    /// `UPDATE jobs SET fence = $token, takeovers = takeovers + (fence > 0 AND NOT
    /// released)::int, released = false, status = 'running' WHERE id = $id AND
    /// fence < $token AND status IN ('pending', 'running') RETURNING ..`.
    ///
    /// Returns where to resume: the row's step and the checkpoint of the last
    /// committed step. `token` must come from a fresh lock acquisition, and a
    /// claim strictly raises the fence: a token equal to the row's fence was
    /// issued by etcd before (see [`FenceError::TokenRegression`]), so a second
    /// claim with the same token is refused, never taken as "ours".
    ///
    /// # Errors
    /// * [`FenceError::FencedOut`]: a newer token holds the fence; we are stale.
    /// * [`FenceError::TokenRegression`]: the fence equals `token` (etcd's
    ///   revisions went backwards): raise the alarm, hand the job back.
    /// * [`FenceError::Terminal`]: the job is `done` or `dead` (not a fence verdict:
    ///   ack and stop).
    /// * [`FenceError::NotFound`], [`FenceError::Db`].
    ///
    /// # Fencing
    /// After this returns, every statement under a smaller token finds zero rows,
    /// and no other claim can succeed with this token.
    pub async fn claim(&self, id: JobId, token: FencingToken) -> Result<Claim, FenceError> {
        let span = tracing::info_span!("tenure.fence.claim", job_id = %id, token = %token);
        async {
            for _ in 0..CLAIM_RETRIES {
                let row = sqlx::query(&self.sql.claim)
                    .bind(id.as_uuid())
                    .bind(token.get())
                    .fetch_optional(&self.pool)
                    .await?;
                if let Some(row) = row {
                    let claim = claim_from(id, &row)?;
                    log_claim(&claim, token);
                    return Ok(claim);
                }
                match self.claim_refused(&self.pool, id, token).await? {
                    ClaimVerdict::Retry => continue,
                    ClaimVerdict::Refused(err) => return Err(err),
                }
            }
            Err(FenceError::Db(sqlx::Error::Protocol(format!(
                "job {id}: claim under {token} kept racing concurrent changes"
            ))))
        }
        .instrument(span)
        .await
    }

    /// Claims the job for `token` and, in the same transaction, opens the fenced
    /// transaction of step `claim.step`: the claim's `UPDATE` already holds the row
    /// lock, so this saves the admission statement and a commit.
    ///
    /// The claim commits with the step ([`FencedTx::commit_step`]). On
    /// [`FencedTx::rollback`] the claim is re-applied on its own so the generation
    /// keeps the fence; if the [`FencedTx`] is merely dropped, the claim is lost
    /// and later fenced calls under this token fail with [`FenceError::NotClaimed`].
    /// Until the transaction ends, a smaller token's [`begin_step`](Self::begin_step)
    /// waits for the row lock (then fails with [`FenceError::FencedOut`]).
    ///
    /// # Errors
    /// As [`claim`](Self::claim).
    ///
    /// # Fencing
    /// As [`claim`](Self::claim) and [`FencedTx`].
    pub async fn claim_and_begin(
        &self,
        id: JobId,
        token: FencingToken,
    ) -> Result<(Claim, FencedTx), FenceError> {
        let span =
            tracing::info_span!("tenure.fence.claim_and_begin", job_id = %id, token = %token);
        async {
            let mut tx = self.pool.begin().await?;
            let row = sqlx::query(&self.sql.claim_and_begin)
                .bind(id.as_uuid())
                .bind(token.get())
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(row) = row {
                let claim = claim_from(id, &row)?;
                log_claim(&claim, token);
                let step = claim.step;
                return Ok((
                    claim,
                    FencedTx::new(tx, self.clone(), id, token, step, true),
                ));
            }
            let _ = tx.rollback().await;
            // Refused (the plain claim says why), or the row changed between the
            // update and now (the plain claim retries; then admit as usual).
            let claim = self.claim(id, token).await?;
            let ftx = self.begin_step(id, token, claim.step).await?;
            Ok((claim, ftx))
        }
        .instrument(span)
        .await
    }

    /// Opens step `step`'s fenced transaction under `token`: `BEGIN`, then
    /// `SELECT .. FROM jobs WHERE id = $id AND fence = $token AND step = $step AND
    /// status = 'running' AND NOT released FOR UPDATE` and `SET LOCAL tenure.job_id /
    /// tenure.fence` (via `set_config(.., true)` with bound parameters).
    ///
    /// # Errors
    /// Zero rows, before any user write: [`FenceError::FencedOut`] (a newer token
    /// claimed), [`FenceError::StepMismatch`], [`FenceError::Released`],
    /// [`FenceError::NotClaimed`], [`FenceError::Terminal`], [`FenceError::NotFound`].
    /// [`FenceError::Db`] on I/O.
    ///
    /// # Fencing
    /// See [`FencedTx`] and the [module docs](self#why-the-fence-holds-under-read-committed).
    pub async fn begin_step(
        &self,
        id: JobId,
        token: FencingToken,
        step: StepIndex,
    ) -> Result<FencedTx, FenceError> {
        let span = tracing::info_span!(
            "tenure.fence.begin_step",
            job_id = %id,
            token = %token,
            step = %step
        );
        async {
            let step_sql = step_to_sql(id, step)?;
            let mut tx = self.pool.begin().await?;
            let admitted = sqlx::query(&self.sql.admit)
                .bind(id.as_uuid())
                .bind(token.get())
                .bind(step_sql)
                .fetch_optional(&mut *tx)
                .await?;
            if admitted.is_none() {
                let err = self.refusal(&mut *tx, id, token, Some(step)).await;
                let _ = tx.rollback().await;
                log_refusal(&err);
                return Err(err);
            }
            Ok(FencedTx::new(tx, self.clone(), id, token, step, false))
        }
        .instrument(span)
        .await
    }

    /// Records a failed attempt of generation `token`: `attempts + 1`, `last_error`,
    /// and marks the generation released (a voluntary retry: the next claim counts
    /// no takeover) with status `pending`. Returns the attempts now.
    ///
    /// # Errors
    /// [`FenceError::FencedOut`] and the other zero-row verdicts (see
    /// [`begin_step`](Self::begin_step)); [`FenceError::Db`].
    ///
    /// # Fencing
    /// `WHERE fence = $token AND status = 'running' AND NOT released`.
    pub async fn record_failure(
        &self,
        id: JobId,
        token: FencingToken,
        error: &str,
    ) -> Result<u32, FenceError> {
        let span = tracing::info_span!("tenure.fence.record_failure", job_id = %id, token = %token);
        async {
            let attempts: Option<i32> = sqlx::query_scalar(&self.sql.fail)
                .bind(id.as_uuid())
                .bind(token.get())
                .bind(error)
                .fetch_optional(&self.pool)
                .await?;
            match attempts {
                Some(n) => u32::try_from(n).map_err(|_| FenceError::Corrupt {
                    job_id: id,
                    reason: format!("negative attempts {n}"),
                }),
                None => {
                    let err = self.refusal(&self.pool, id, token, None).await;
                    log_refusal(&err);
                    Err(err)
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Graceful release by generation `token` (shutdown, voluntary give-back): the
    /// next claim counts no takeover; this generation writes no more. Idempotent.
    ///
    /// # Errors
    /// As [`record_failure`](Self::record_failure).
    ///
    /// # Fencing
    /// `WHERE fence = $token AND status = 'running' AND NOT released`.
    pub async fn record_release(&self, id: JobId, token: FencingToken) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.record_release", job_id = %id, token = %token);
        async {
            let done = sqlx::query(&self.sql.release)
                .bind(id.as_uuid())
                .bind(token.get())
                .execute(&self.pool)
                .await?;
            if done.rows_affected() == 1 {
                return Ok(());
            }
            let diag = self.diag(&self.pool, id).await?;
            if let Some(d) = diag {
                if d.fence == token.get() && d.released && !d.status.is_terminal() {
                    return Ok(());
                }
            }
            let err = verdict(id, token, diag, None);
            log_refusal(&err);
            Err(err)
        }
        .instrument(span)
        .await
    }

    /// Marks the job `dead` under generation `token` (poison, retries exhausted),
    /// recording `reason` as the last error. Works after this generation's own
    /// [`record_failure`](Self::record_failure). Idempotent.
    ///
    /// # Errors
    /// As [`record_failure`](Self::record_failure); [`FenceError::Terminal`] if the
    /// job is `done`.
    ///
    /// # Fencing
    /// `WHERE fence = $token AND status IN ('pending', 'running')`.
    pub async fn mark_dead(
        &self,
        id: JobId,
        token: FencingToken,
        reason: &str,
    ) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.mark_dead", job_id = %id, token = %token);
        async {
            let done = sqlx::query(&self.sql.dead)
                .bind(id.as_uuid())
                .bind(token.get())
                .bind(reason)
                .execute(&self.pool)
                .await?;
            if done.rows_affected() == 1 {
                tracing::info!(reason, "job marked dead");
                return Ok(());
            }
            let diag = self.diag(&self.pool, id).await?;
            if let Some(d) = diag {
                if d.fence == token.get() && d.status == JobStatus::Dead {
                    return Ok(());
                }
            }
            let err = match diag {
                // Our own released generation may still mark dead: only a newer
                // fence or a terminal status stops it.
                Some(d) if d.fence == token.get() => FenceError::Terminal {
                    job_id: id,
                    status: d.status,
                },
                _ => verdict(id, token, diag, None),
            };
            log_refusal(&err);
            Err(err)
        }
        .instrument(span)
        .await
    }

    /// Marks the job `dead` without a token, for paths where no generation exists
    /// (payload that does not deserialize, unknown job type, the broker giving up).
    /// Only a non-terminal row changes; a `done` or `dead` row is left as it is and
    /// this returns `Ok`. It waits for a running step's transaction (row lock), and
    /// a live owner's next fenced write then fails with [`FenceError::Terminal`].
    ///
    /// # Errors
    /// [`FenceError::NotFound`], [`FenceError::Db`].
    pub async fn mark_dead_unfenced(&self, id: JobId, reason: &str) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.mark_dead_unfenced", job_id = %id);
        async {
            let done = sqlx::query(&self.sql.dead_unfenced)
                .bind(id.as_uuid())
                .bind(reason)
                .execute(&self.pool)
                .await?;
            if done.rows_affected() == 1 {
                tracing::info!(reason, "job marked dead (unfenced)");
                return Ok(());
            }
            match self.diag(&self.pool, id).await? {
                Some(_) => Ok(()),
                None => Err(FenceError::NotFound(id)),
            }
        }
        .instrument(span)
        .await
    }

    /// Operator redrive: `dead` -> `pending` with `takeovers = 0`, `attempts = 0`,
    /// keeping the step, checkpoint, fence and last error, so the job resumes where
    /// it stopped. A compare-and-set on the fence value read (and on `dead`), so it
    /// cannot race a claim.
    ///
    /// # Errors
    /// [`FenceError::NotDead`], [`FenceError::NotFound`], [`FenceError::Db`].
    pub async fn reset_for_redrive(&self, id: JobId) -> Result<(), FenceError> {
        let span = tracing::info_span!("tenure.fence.reset_for_redrive", job_id = %id);
        async {
            for _ in 0..CLAIM_RETRIES {
                let Some(d) = self.diag(&self.pool, id).await? else {
                    return Err(FenceError::NotFound(id));
                };
                if d.status != JobStatus::Dead {
                    return Err(FenceError::NotDead {
                        job_id: id,
                        status: d.status,
                    });
                }
                let done = sqlx::query(&self.sql.redrive)
                    .bind(id.as_uuid())
                    .bind(d.fence)
                    .execute(&self.pool)
                    .await?;
                if done.rows_affected() == 1 {
                    tracing::info!("job reset for redrive");
                    return Ok(());
                }
            }
            Err(FenceError::Db(sqlx::Error::Protocol(format!(
                "job {id}: redrive kept racing concurrent changes"
            ))))
        }
        .instrument(span)
        .await
    }

    /// Guards one of your tables: a statement-level trigger (`BEFORE INSERT OR
    /// UPDATE OR DELETE OR TRUNCATE`) that lets a statement through only when
    ///
    /// * it runs inside a fenced transaction ([`FencedTx::conn`]) whose
    ///   `tenure.job_id` / `tenure.fence` name a `running`, unreleased job row of this
    ///   store whose fence equals `tenure.fence` right now (read `FOR SHARE`, so a
    ///   takeover cannot slip in while the statement runs), or
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
    /// # async fn demo(store: tenure::fence::FenceStore) -> Result<(), tenure::fence::FenceError> {
    /// store.install_guard("public.ledger").await?;
    /// // Now this fails with FenceError::GuardRefused:
    /// let err = sqlx::query("DELETE FROM public.ledger").execute(store.pool()).await.unwrap_err();
    /// assert!(tenure::fence::FenceError::from(err).is_fenced_out());
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
            let mut tx = self.pool.begin().await?;
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
    /// # async fn demo(store: tenure::fence::FenceStore) -> Result<(), tenure::fence::FenceError> {
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

    async fn diag<'e, E>(&self, exec: E, id: JobId) -> Result<Option<Diag>, FenceError>
    where
        E: Executor<'e, Database = Postgres>,
    {
        let row = sqlx::query(&self.sql.diag)
            .bind(id.as_uuid())
            .fetch_optional(exec)
            .await?;
        row.as_ref().map(|r| diag_from(id, r)).transpose()
    }

    /// Why a fenced statement matched zero rows (reads the row on `exec`).
    pub(crate) async fn refusal<'e, E>(
        &self,
        exec: E,
        id: JobId,
        token: FencingToken,
        step: Option<StepIndex>,
    ) -> FenceError
    where
        E: Executor<'e, Database = Postgres>,
    {
        let err = match self.diag(exec, id).await {
            Ok(diag) => verdict(id, token, diag, step),
            Err(e) => return e,
        };
        self.record_refusal(&err, token, step, "step").await;
        err
    }

    async fn claim_refused<'e, E>(
        &self,
        exec: E,
        id: JobId,
        token: FencingToken,
    ) -> Result<ClaimVerdict, FenceError>
    where
        E: Executor<'e, Database = Postgres>,
    {
        let diag = self.diag(exec, id).await?;
        let verdict = match diag {
            None => ClaimVerdict::Refused(FenceError::NotFound(id)),
            Some(d) if d.status.is_terminal() => ClaimVerdict::Refused(FenceError::Terminal {
                job_id: id,
                status: d.status,
            }),
            Some(d) if d.fence > token.get() => {
                let err = FenceError::FencedOut {
                    job_id: id,
                    ours: token.observed(),
                    current: ObservedFence::new(d.fence),
                };
                log_refusal(&err);
                self.record_refusal(&err, token, None, "claim").await;
                ClaimVerdict::Refused(err)
            }
            Some(d) if d.fence == token.get() => {
                let err = FenceError::TokenRegression {
                    job_id: id,
                    token: token.observed(),
                };
                tracing::error!(
                    error = %err,
                    released = d.released,
                    "ALERT: fencing token regression: a fresh claim found its own token on the row"
                );
                ClaimVerdict::Refused(err)
            }
            // fence < token on a live row: it changed after our update; try again.
            Some(_) => ClaimVerdict::Retry,
        };
        Ok(verdict)
    }
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

enum ClaimVerdict {
    Retry,
    Refused(FenceError),
}

/// The verdict on a fenced write that matched zero rows, from the row as it is now.
fn verdict(
    id: JobId,
    ours: FencingToken,
    diag: Option<Diag>,
    step: Option<StepIndex>,
) -> FenceError {
    let Some(d) = diag else {
        return FenceError::NotFound(id);
    };
    let current = ObservedFence::new(d.fence);
    let seen = ours.observed();
    if d.fence > ours.get() {
        FenceError::FencedOut {
            job_id: id,
            ours: seen,
            current,
        }
    } else if d.fence < ours.get() {
        FenceError::NotClaimed {
            job_id: id,
            ours: seen,
            current,
        }
    } else if d.status.is_terminal() {
        FenceError::Terminal {
            job_id: id,
            status: d.status,
        }
    } else if d.released || d.status != JobStatus::Running {
        FenceError::Released {
            job_id: id,
            token: seen,
        }
    } else if let Some(expected) = step.filter(|k| *k != d.step) {
        FenceError::StepMismatch {
            job_id: id,
            token: seen,
            expected,
            actual: d.step,
        }
    } else {
        FenceError::Corrupt {
            job_id: id,
            reason: format!(
                "a fenced statement under {ours} matched no row, yet the row matches it now"
            ),
        }
    }
}

fn log_claim(claim: &Claim, token: FencingToken) {
    if claim.takeover {
        tracing::warn!(
            token = %token,
            previous = ?claim.previous.map(ObservedFence::get),
            takeovers = claim.takeovers,
            step = %claim.step,
            "fence claimed: takeover from a generation that did not release"
        );
    } else {
        tracing::info!(
            token = %token,
            previous = ?claim.previous.map(ObservedFence::get),
            step = %claim.step,
            "fence claimed"
        );
    }
}

fn log_refusal(err: &FenceError) {
    if err.is_fenced_out() {
        tracing::warn!(error = %err, "stale rejection");
    } else {
        tracing::info!(error = %err, "fenced statement refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(n: i64) -> FencingToken {
        FencingToken::for_tests(n)
    }

    fn diag(fence: i64, step: u32, status: JobStatus, released: bool) -> Option<Diag> {
        Some(Diag {
            fence,
            step: StepIndex::new(step),
            status,
            released,
        })
    }

    #[test]
    fn verdicts_keep_causes_apart() {
        let id = JobId::from_key("t", "k");
        let k = Some(StepIndex::new(2));
        assert!(matches!(
            verdict(id, tok(41), None, k),
            FenceError::NotFound(_)
        ));
        let e = verdict(id, tok(41), diag(42, 2, JobStatus::Running, false), k);
        assert!(e.is_fenced_out());
        assert!(matches!(e, FenceError::FencedOut { current: Some(c), .. } if c == tok(42)));
        // A newer owner that finished is still "fenced out" for a stale writer.
        assert!(verdict(id, tok(41), diag(42, 3, JobStatus::Done, false), k).is_fenced_out());
        assert!(matches!(
            verdict(id, tok(43), diag(42, 2, JobStatus::Running, false), k),
            FenceError::NotClaimed { .. }
        ));
        assert!(matches!(
            verdict(id, tok(42), diag(42, 2, JobStatus::Dead, true), k),
            FenceError::Terminal {
                status: JobStatus::Dead,
                ..
            }
        ));
        assert!(matches!(
            verdict(id, tok(42), diag(42, 2, JobStatus::Pending, true), k),
            FenceError::Released { .. }
        ));
        let e = verdict(id, tok(42), diag(42, 3, JobStatus::Running, false), k);
        assert!(
            matches!(e, FenceError::StepMismatch { actual, .. } if actual == StepIndex::new(3))
        );
        assert!(!e.is_fenced_out());
    }
}
