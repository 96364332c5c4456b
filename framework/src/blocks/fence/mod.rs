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
//! # async fn demo() -> Result<(), tenure::blocks::fence::FenceError> {
//! use tenure::blocks::fence::{FenceStore, Inserted};
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
mod bookkeeping;
mod cancel_key;
mod claims;
mod compensation;
mod error;
mod gate;
mod grants;
mod guard;
mod guard_admin;
mod history;
mod history_admin;
mod leader;
#[cfg(feature = "mysql")]
pub mod mysql;
mod outbox;
mod partitions;
mod pauses;
mod reads;
mod retention;
mod retry_now;
mod row;
mod schedules;
mod sql;
mod status;
mod store;
mod tx;

pub use access::{connect_options, pool_options};
pub use cancel_key::CancelKey;
pub(crate) use compensation::DeadRow;
pub use error::{ARGUMENT_REFUSED_SQLSTATE, FenceError, GUARD_SQLSTATE, is_guard_refusal};
pub use gate::{
    Admitted, FenceMarks, GateError, MemoryFenceMarks, MemoryTx, PgFenceMarks, StaleToken,
    TokenGate,
};
pub use history::{
    JobCursor, JobEvent, JobFilter, MAX_JOB_EVENTS, Overview, TypeStatusCount, WindowCounts,
    WorkerSeen,
};
pub use history_admin::{LimitsSeen, ReportedLimits, WorkerReport};
pub(crate) use leader::DueJob;
pub use leader::LeaderRow;
pub use outbox::{BatchInserted, NewJob, OutboxListener};
pub use partitions::PartitionOwner;
pub use pauses::PausedType;
pub use row::{Cancelled, Claim, Inserted, JobRow};
pub(crate) use schedules::schedule_name_ok;
pub use schedules::{ScheduleRow, TickBatch, tick_key, trigger_key};
pub use status::{JobStatus, UnknownStatus, WrongState};
pub use store::FenceStore;
pub use tx::FencedTx;
