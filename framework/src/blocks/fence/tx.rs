//! [`FencedTx`]: one step's database transaction, admitted under a fencing token.

use std::fmt;

use sqlx::{Postgres, Transaction};
use tracing::Instrument;

use crate::types::{FencingToken, JobId, StepIndex};

use super::FenceStore;
use super::error::{FenceError, PgFailure, classify};
use super::row::step_to_sql;

/// A step's fenced transaction.
///
/// Created by [`FenceStore::begin_step`] or [`FenceStore::claim_and_begin`]. It
/// starts with the admission `SELECT .. FROM jobs WHERE id = $id AND fence = $token
/// AND step = $k .. FOR UPDATE` (zero rows: an error before any user write), so it
/// holds the job row's lock from its first statement to its end: no claim by a newer
/// token can commit in between. It sets `tenure.job_id` and `tenure.fence` for this
/// transaction only (`set_config(.., true)`, i.e. `SET LOCAL`), which is what the
/// [guard](FenceStore::install_guard) on the user's tables checks.
///
/// Do the step's own writes through [`conn`](FencedTx::conn), then
/// [`commit_step`](FencedTx::commit_step). Dropping it rolls back.
///
/// # Fencing
/// Every write made through [`conn`](FencedTx::conn) commits if and only if the step
/// CAS in [`commit_step`](FencedTx::commit_step) does, and both happen only while
/// `fence = token` (see [the module docs](super#why-the-fence-holds-under-read-committed)).
/// Never `COMMIT`/`ROLLBACK` through [`conn`](FencedTx::conn) with raw SQL: that would
/// end the transaction (and release the row lock) behind the fence's back.
///
/// ```no_run
/// # async fn demo(store: tenure::blocks::fence::FenceStore, id: tenure::JobId, token: tenure::FencingToken)
/// # -> Result<(), tenure::blocks::fence::FenceError> {
/// use tenure::StepIndex;
/// let mut tx = store.begin_step(id, token, StepIndex::new(1)).await?;
/// sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 7")
///     .execute(tx.conn())
///     .await?; // a guard refusal maps to FenceError::GuardRefused
/// tx.commit_step(&serde_json::json!({"debited": 10}), false).await?;
/// # Ok(()) }
/// ```
pub struct FencedTx {
    tx: Transaction<'static, Postgres>,
    store: FenceStore,
    job_id: JobId,
    token: FencingToken,
    step: StepIndex,
    /// The claim that raised the fence is part of this transaction
    /// ([`FenceStore::claim_and_begin`]): a rollback must re-apply it.
    carries_claim: bool,
}

impl fmt::Debug for FencedTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedTx")
            .field("job_id", &self.job_id)
            .field("token", &self.token)
            .field("step", &self.step)
            .field("carries_claim", &self.carries_claim)
            .finish_non_exhaustive()
    }
}

impl FencedTx {
    pub(crate) fn new(
        tx: Transaction<'static, Postgres>,
        store: FenceStore,
        job_id: JobId,
        token: FencingToken,
        step: StepIndex,
        carries_claim: bool,
    ) -> Self {
        FencedTx {
            tx,
            store,
            job_id,
            token,
            step,
            carries_claim,
        }
    }

    /// The connection for the step's own writes, inside this transaction.
    ///
    /// Errors of those writes are plain [`sqlx::Error`]s; turn them into
    /// [`FenceError`] with `?`/[`FenceError::from_sqlx`] so a guard refusal becomes
    /// [`FenceError::GuardRefused`].
    pub fn conn(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }

    /// The store this transaction belongs to.
    pub(super) fn store(&self) -> &FenceStore {
        &self.store
    }

    /// The open transaction itself (for a commit that is not a step's).
    pub(super) fn into_inner(self) -> Transaction<'static, Postgres> {
        self.tx
    }

    /// The job.
    pub fn job_id(&self) -> JobId {
        self.job_id
    }

    /// The token this transaction was admitted under.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The step this transaction commits.
    pub fn step(&self) -> StepIndex {
        self.step
    }

    /// Whether this transaction also carries the (not yet committed) claim
    /// ([`FenceStore::claim_and_begin`]).
    pub fn carries_claim(&self) -> bool {
        self.carries_claim
    }

    /// The step CAS, then commit: `UPDATE jobs SET step = k + 1, checkpoint = output
    /// [, status = 'done' when last] WHERE id AND fence = token AND step = k`.
    ///
    /// One round trip: `SELECT tenure_step_cas(..); COMMIT; BEGIN` as one simple
    /// query (see [`commit_step_and_begin`](Self::commit_step_and_begin)); the
    /// empty transaction that `BEGIN` opens is rolled back when the connection
    /// goes back to the pool, in the round trip of the pool's own check.
    ///
    /// # Errors
    /// Zero rows (only possible if the step's own SQL touched the job row, since the
    /// row lock is held): [`FenceError::FencedOut`] or another state error, after a
    /// rollback; nothing of the step commits. [`FenceError::Db`] on I/O; if the
    /// `COMMIT` itself fails the outcome is unknown: read the row (or claim again)
    /// to find out.
    ///
    /// # Fencing
    /// The user's writes and the step's checkpoint commit atomically, under the row
    /// lock taken at admission.
    pub async fn commit_step(
        mut self,
        output: &serde_json::Value,
        last: bool,
    ) -> Result<(), FenceError> {
        let span = tracing::info_span!(
            "tenure.fence.commit_step",
            job_id = %self.job_id,
            token = %self.token,
            step = %self.step,
            last
        );
        async move {
            let cas = self.cas_literal(output, last)?;
            // The trailing BEGIN keeps sqlx's view (one open transaction) true:
            // dropping `tx` queues its ROLLBACK, which the pool's check on
            // release sends.
            let chained = format!("{cas}; COMMIT; BEGIN");
            let conn: &mut sqlx::PgConnection = &mut self.tx;
            match sqlx::Executor::execute(conn, chained.as_str()).await {
                Ok(_) => Ok(()),
                Err(e) if classify(&e) == PgFailure::CasRefused => Err(self.refused().await),
                Err(e) => Err(FenceError::Db(e)),
            }
        }
        .instrument(span)
        .await
    }

    /// [`commit_step`](Self::commit_step), and in the same round trip opens the
    /// fenced transaction of step `next` under the same token: the step CAS,
    /// `COMMIT`, `BEGIN` and the next step's admission go as one simple-query
    /// string on this connection. Saves a round trip for the CAS, and the next
    /// step a pool checkout, its `BEGIN` and its admission round trip.
    ///
    /// The CAS in that string is the function `tenure_step_cas` (migration
    /// `0003_step_cas.sql`), which raises when it matches no row: PostgreSQL then
    /// skips the rest of the string, so nothing commits. Its values are written
    /// as literals (a UUID, integers, and the output's JSON text in an
    /// `E'..'` literal).
    ///
    /// Returns `Ok(None)` when this step committed but the next one is not
    /// admitted here (zero rows, or an error after the `COMMIT`): the next step
    /// then opens its transaction the usual way, which reports why. When the
    /// combined statement fails otherwise, the job row tells whether the
    /// `COMMIT` went through.
    ///
    /// # Errors
    /// As [`commit_step`](Self::commit_step).
    ///
    /// # Fencing
    /// As [`commit_step`](Self::commit_step): the CAS runs under the row lock
    /// taken at admission, and the `COMMIT` runs only if it matched.
    pub async fn commit_step_and_begin(
        mut self,
        output: &serde_json::Value,
        next: StepIndex,
    ) -> Result<Option<FencedTx>, FenceError> {
        let span = tracing::info_span!(
            "tenure.fence.commit_step",
            job_id = %self.job_id,
            token = %self.token,
            step = %self.step,
            next = %next,
        );
        async move {
            let next_sql = step_to_sql(self.job_id, next)?;
            let cas = self.cas_literal(output, false)?;
            let admit =
                self.store
                    .sql
                    .admit_literal(self.job_id.as_uuid(), self.token.get(), next_sql);
            let chained = format!("{cas}; COMMIT; BEGIN; {admit}");
            // sqlx's transaction depth stays 1 throughout: the connection is in a
            // transaction again afterwards (or, on an error, dropping `tx` sends
            // the ROLLBACK that cleans up whatever state it is in).
            // A `&str` without arguments goes out as one simple query, which may
            // hold several statements.
            let conn: &mut sqlx::PgConnection = &mut self.tx;
            let answered = sqlx::Executor::fetch_all(conn, chained.as_str()).await;
            match answered {
                // One row from the CAS, one from the admission when it admitted.
                Ok(rows) if rows.len() == 2 => {
                    tracing::debug!(next = %next, "the next step's transaction opened with this commit");
                    Ok(Some(FencedTx {
                        step: next,
                        carries_claim: false,
                        ..self
                    }))
                }
                Ok(_) => {
                    // Committed; the next step is not admitted (it will say why).
                    tracing::debug!(next = %next, "committed; the next step was not admitted with the commit");
                    let _ = self.tx.rollback().await;
                    Ok(None)
                }
                Err(e) if classify(&e) == PgFailure::CasRefused => Err(self.refused().await),
                Err(e) => {
                    let (store, job_id, token) = (self.store.clone(), self.job_id, self.token);
                    drop(self.tx);
                    match store.job(job_id).await {
                        Ok(Some(row)) if row.fence == token.get() && row.step == next => {
                            tracing::debug!(error = %e, "step committed; opening the next step's transaction failed");
                            Ok(None)
                        }
                        _ => Err(FenceError::Db(e)),
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    /// After `tenure_step_cas` refused (the error aborted the string before its
    /// `COMMIT`, so nothing committed): rolls back and tells why.
    async fn refused(self) -> FenceError {
        let (store, job_id, token, step) = (self.store.clone(), self.job_id, self.token, self.step);
        let _ = self.tx.rollback().await;
        let err = match store.refusal(store.pool(), job_id, token, Some(step)).await {
            // The row is as admitted again after the rollback: only the step's
            // own SQL can have changed it in between.
            FenceError::Corrupt { job_id, .. } => FenceError::Corrupt {
                job_id,
                reason: format!(
                    "step {step}'s own SQL changed its job row, so the step commit under \
                     {token} matched no row; nothing was committed"
                ),
            },
            other => other,
        };
        store.record_refusal(&err, token, Some(step), "step").await;
        tracing::warn!(error = %err, "step commit refused");
        err
    }

    /// This step's CAS, values as literals, to head a simple-query string.
    fn cas_literal(&self, output: &serde_json::Value, last: bool) -> Result<String, FenceError> {
        let step = step_to_sql(self.job_id, self.step)?;
        Ok(self.store.sql.step_cas_literal(
            self.job_id.as_uuid(),
            self.token.get(),
            step,
            output,
            last,
        ))
    }

    /// Records `names` as the row's step list (a claimer whose definition fits
    /// the committed steps, see [`step_list`](crate::job::step_list)) and clears
    /// the incompatibility mark, in this transaction: it commits with the step.
    ///
    /// # Errors
    /// Zero rows: the refusal (e.g. [`FenceError::FencedOut`]); [`FenceError::Db`].
    pub(crate) async fn record_steps(&mut self, names: &[String]) -> Result<(), FenceError> {
        let fingerprint = crate::steps::fingerprint(names);
        let done = sqlx::query(&self.store.sql.record_steps)
            .bind(self.job_id.as_uuid())
            .bind(self.token.get())
            .bind(names)
            .bind(fingerprint)
            .execute(&mut *self.tx)
            .await?;
        self.one_row(done.rows_affected()).await
    }

    /// Marks since when no compatible worker took the job (kept if already
    /// set), in this transaction.
    ///
    /// # Errors
    /// As [`record_steps`](Self::record_steps).
    pub(crate) async fn mark_incompatible(&mut self) -> Result<(), FenceError> {
        let done = sqlx::query(&self.store.sql.mark_incompatible)
            .bind(self.job_id.as_uuid())
            .bind(self.token.get())
            .execute(&mut *self.tx)
            .await?;
        self.one_row(done.rows_affected()).await
    }

    /// `Ok` if a fenced bookkeeping statement matched the row, else why not.
    async fn one_row(&mut self, rows: u64) -> Result<(), FenceError> {
        if rows == 1 {
            return Ok(());
        }
        let (id, token) = (self.job_id, self.token);
        Err(self.store.refusal(&mut *self.tx, id, token, None).await)
    }

    /// Commits without step work: the claim this transaction carries (if it
    /// does) becomes durable alone, with any bookkeeping written in it
    /// ([`mark_incompatible`](Self::mark_incompatible)). Used when the step did
    /// not take the transaction within the claim window, and before a phase
    /// that ends the delivery with fenced writes on their own connection (the
    /// poison check, the step-list check). A transaction that carries no claim
    /// (the claim committed on its own: `claim_and_begin` raced a concurrent
    /// change) holds only its admission, so committing it changes nothing.
    ///
    /// # Errors
    /// [`FenceError::Db`]; the claim's outcome is then unknown (the next fenced
    /// call under this token tells).
    pub(crate) async fn commit_claim(self) -> Result<(), FenceError> {
        self.tx.commit().await?;
        Ok(())
    }

    /// Rolls the step back. If this transaction carries its claim
    /// ([`FenceStore::claim_and_begin`]), the claim is re-applied on its own
    /// (same token: the rollback left the fence below it, so the claim raises it
    /// again) so the generation keeps the fence and can
    /// [`record_failure`](FenceStore::record_failure) or
    /// [`record_release`](FenceStore::record_release).
    ///
    /// # Errors
    /// [`FenceError::Db`] on I/O; when re-applying the claim, the errors of
    /// [`FenceStore::claim`] (e.g. [`FenceError::FencedOut`] if a newer token got in).
    pub async fn rollback(self) -> Result<(), FenceError> {
        let FencedTx {
            tx,
            store,
            job_id,
            token,
            carries_claim,
            ..
        } = self;
        // The claim is re-applied even when the rollback fails (a dropped
        // connection rolls back on its own): losing it would leave this owner
        // unable to record the attempt.
        let rolled_back = tx.rollback().await;
        if carries_claim {
            store.claim(job_id, token).await?;
        }
        rolled_back?;
        Ok(())
    }
}
