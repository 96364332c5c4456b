//! The least-privilege roles of a schema ([`FenceStore::grant_worker`],
//! [`FenceStore::grant_producer`], [`FenceStore::grant_operator`]).
//!
//! No role that runs or enqueues jobs may `UPDATE` a Tenure table: every
//! change of a job's `status` or `fence`, and every write of `schedules`,
//! `leader_fences` and `partition_fences`, is a `SECURITY DEFINER` function
//! (migration 0015) that enforces the protocol. Inserting a job is a column
//! grant: `status`, `fence`, `step` and the rest take their defaults (a new
//! job is `pending` with fence 0; the insert wall of 0015 refuses anything
//! else). The lists below are the whole grant; `guide::production` prints
//! them.

use sqlx::Executor;

use super::guard;
use super::{FenceError, FenceStore};

/// The columns an enqueue writes; every other column takes its default.
pub(crate) const INSERT_COLUMNS: &str = "id, job_type, input, run_at, awaiting_publish, step_names, steps_fingerprint, trace_context, \
     priority";

/// What every role of the schema may read and call to enqueue.
const PRODUCER_FUNCTIONS: &[&str] = &["tenure_hand_to_publisher(uuid[])"];

/// What running jobs calls, besides enqueueing.
const WORKER_FUNCTIONS: &[&str] = &[
    "tenure_claim(uuid, bigint, boolean, boolean)",
    "tenure_admit(uuid, bigint, integer)",
    "tenure_step_cas(uuid, bigint, integer, jsonb, boolean)",
    "tenure_fail(uuid, bigint, text)",
    "tenure_release(uuid, bigint)",
    "tenure_record_steps(uuid, bigint, text[], text)",
    "tenure_mark_incompatible(uuid, bigint)",
    "tenure_mark_dead(uuid, bigint, text, boolean)",
    "tenure_mark_dead_unfenced(uuid, text, boolean)",
    "tenure_claim_compensation(uuid, bigint)",
    "tenure_admit_compensation(uuid, bigint)",
    "tenure_finish_compensation(uuid, bigint)",
    "tenure_claim_leader(text, bigint, text)",
    "tenure_admit_leader(text, bigint)",
    "tenure_mark_published(text, bigint, uuid[])",
    "tenure_lock_due(integer)",
    "tenure_define_schedule(text, text, text, text, text, jsonb)",
    "tenure_advance_schedule(text, bigint, text, timestamptz, timestamptz, bigint, bigint)",
    "tenure_claim_partition(text, integer, bigint, text)",
    "tenure_record_refusal(uuid, bigint, bigint, integer, text)",
    "tenure_report_worker(text, bigint, text, integer, integer, integer, timestamptz, text[], jsonb)",
    "tenure_prune_jobs(text, double precision, integer)",
    "tenure_prune_tombstones(double precision, integer)",
];

/// An operator's own calls: cancel, pause and resume (job types and
/// schedules), redrive, retry-now and reschedule, retention, the guard's
/// escape hatch.
const OPERATOR_FUNCTIONS: &[&str] = &[
    "tenure_cancel(uuid, text)",
    "tenure_retry_now(uuid)",
    "tenure_reschedule(uuid, timestamptz)",
    "tenure_pause(text)",
    "tenure_resume(text)",
    "tenure_pause_schedule(text)",
    "tenure_resume_schedule(text)",
    "tenure_redrive(uuid, bigint)",
    "tenure_prune_jobs(text, double precision, integer)",
    "tenure_prune_tombstones(double precision, integer)",
    "tenure_bypass_guard()",
];

impl FenceStore {
    /// Grants `role` what running jobs needs on this store's schema, and nothing
    /// more: what [`grant_producer`](Self::grant_producer) grants (a worker
    /// enqueues too), `SELECT` on `schedules`, `leader_fences`,
    /// `partition_fences`, and `EXECUTE` on
    /// the definer functions a worker calls (claims, admissions, the step CAS,
    /// hand-backs, dead-marking, compensation, leader and partition fences,
    /// schedules, refusal notes, reports, retention). No `UPDATE` or `DELETE` on
    /// any Tenure table, no DDL, no cancel, redrive or guard bypass (see
    /// `guide::production`, least-privilege roles). Run it as the migrator
    /// (the schema's owner) after [`migrate`](Self::migrate). Idempotent.
    ///
    /// ```no_run
    /// # async fn demo(store: tenure::blocks::fence::FenceStore) -> Result<(), tenure::blocks::fence::FenceError> {
    /// store.migrate().await?;
    /// store.grant_worker("tenure_worker").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FenceError::InvalidName`] for a role that is not a plain identifier;
    /// [`FenceError::Access`] when the caller may not grant.
    pub async fn grant_worker(&self, role: &str) -> Result<(), FenceError> {
        let mut stmts = self.producer_grants(role)?;
        let (s, role) = (&self.schema, guard::quote_table(role)?);
        stmts.push(format!(
            "GRANT SELECT ON \"{s}\".schedules, \"{s}\".leader_fences, \"{s}\".partition_fences, \
             \"{s}\".paused_types TO {role}"
        ));
        stmts.extend(self.execute_grants(WORKER_FUNCTIONS, &role));
        self.run_grants(&stmts).await
    }

    /// Grants `role` what enqueueing needs ([`Client::enqueue`](crate::Client::enqueue),
    /// [`Client::enqueue_in`](crate::Client::enqueue_in) on the application's
    /// connection): `USAGE` on the schema, `SELECT` on `jobs` and
    /// `job_tombstones` (a key's dedup), `INSERT` on `jobs` limited to
    /// the columns an enqueue writes (`INSERT_COLUMNS`; so a new row is
    /// `pending` with fence 0), `SELECT, INSERT` on `partitioning` (the
    /// namespace's way of owning jobs, checked at connect, recorded once by
    /// whoever comes first), and
    /// `EXECUTE` on `tenure_hand_to_publisher` (a failed publish's hand-over).
    /// Idempotent; run it as the migrator.
    ///
    /// # Errors
    /// As [`grant_worker`](Self::grant_worker).
    pub async fn grant_producer(&self, role: &str) -> Result<(), FenceError> {
        let stmts = self.producer_grants(role)?;
        self.run_grants(&stmts).await
    }

    /// Grants `role` an operator's reads and calls: `USAGE` on the schema,
    /// `SELECT` on every Tenure table (jobs, history, reports, schedules,
    /// fences), and `EXECUTE` on `tenure_cancel`, `tenure_pause` and
    /// `tenure_resume`, `tenure_pause_schedule` and `tenure_resume_schedule`,
    /// `tenure_redrive`, retention and `tenure_bypass_guard` (the guard's
    /// escape hatch). No direct write to
    /// any Tenure table. Idempotent; run it as the migrator.
    ///
    /// # Errors
    /// As [`grant_worker`](Self::grant_worker).
    pub async fn grant_operator(&self, role: &str) -> Result<(), FenceError> {
        let (s, quoted) = (&self.schema, guard::quote_table(role)?);
        let mut stmts = vec![
            format!("GRANT USAGE ON SCHEMA \"{s}\" TO {quoted}"),
            format!(
                "GRANT SELECT ON \"{s}\".jobs, \"{s}\".job_events, \"{s}\".job_history, \
                 \"{s}\".job_tombstones, \
                 \"{s}\".worker_reports, \"{s}\".schedules, \"{s}\".leader_fences, \
                 \"{s}\".partition_fences, \"{s}\".partitioning, \"{s}\".paused_types TO {quoted}"
            ),
        ];
        stmts.extend(self.execute_grants(OPERATOR_FUNCTIONS, &quoted));
        self.run_grants(&stmts).await
    }

    /// Whether the PostgreSQL role `role` exists. Only reads (`pg_roles`):
    /// `tenure migrate` checks the roles it is to grant to before it changes
    /// anything.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn role_exists(&self, role: &str) -> Result<bool, FenceError> {
        let sql = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)";
        Ok(sqlx::query_scalar(sql)
            .bind(role)
            .fetch_one(&self.pool)
            .await?)
    }

    fn producer_grants(&self, role: &str) -> Result<Vec<String>, FenceError> {
        let (s, role) = (&self.schema, guard::quote_table(role)?);
        let mut stmts = vec![
            format!("GRANT USAGE ON SCHEMA \"{s}\" TO {role}"),
            format!("GRANT SELECT ON \"{s}\".jobs, \"{s}\".job_tombstones TO {role}"),
            format!("GRANT INSERT ({INSERT_COLUMNS}) ON \"{s}\".jobs TO {role}"),
            // `Client::connect` checks the namespace's way of owning jobs; the
            // first enqueue records it if nothing did.
            format!("GRANT SELECT, INSERT ON \"{s}\".partitioning TO {role}"),
        ];
        stmts.extend(self.execute_grants(PRODUCER_FUNCTIONS, &role));
        Ok(stmts)
    }

    fn execute_grants(&self, functions: &[&str], role: &str) -> Vec<String> {
        let s = &self.schema;
        functions
            .iter()
            .map(|f| format!("GRANT EXECUTE ON FUNCTION \"{s}\".{f} TO {role}"))
            .collect()
    }

    async fn run_grants(&self, stmts: &[String]) -> Result<(), FenceError> {
        let mut tx = self.begin().await?;
        for stmt in stmts {
            tx.execute(stmt.as_str()).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
