//! Job rows written for the outbox and in batches: a row inserted in the
//! caller's own transaction (the row itself is the outbox: `awaiting_publish`
//! with `run_at = now()`, published by the scheduler leader once the caller
//! commits), the channel that wakes the leader at that commit, and many rows in
//! one statement.
//!
//! The outbox's notification is `pg_notify(<channel>, '')` in the caller's
//! transaction: PostgreSQL delivers it only if that transaction commits, and
//! then after the commit. A lost notification (the leader's listening
//! connection dropped) costs latency, not the job: the leader looks for due
//! rows at least every `Tuning::due_poll`.

use sqlx::postgres::PgListener;
use sqlx::{PgConnection, Row};

use crate::steps::{self as step_list, StepInfo};
use crate::types::{JobId, Priority};

use super::claims::CLAIM_RETRIES;
use super::{FenceError, FenceStore, Inserted};

/// One job of a batch insert ([`FenceStore::insert_jobs`]).
#[derive(Debug, Clone, Copy)]
pub struct NewJob<'a> {
    /// The job's id (from its type and idempotency key).
    pub id: JobId,
    /// Its type.
    pub job_type: &'a str,
    /// Its input.
    pub input: &'a serde_json::Value,
}

/// What a batch insert found for one item, in the order of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchInserted {
    /// A new row: its message is still to be published.
    New,
    /// The same job existed before the batch (or earlier in it); nothing
    /// changed. `publish` is true when the row is unfinished and not awaiting
    /// the scheduler leader, so a message may have been lost: publish again
    /// (what [`Client::enqueue`](crate::Client::enqueue) does for a duplicate).
    Existing {
        /// Publish the job's message again.
        publish: bool,
    },
    /// The id exists with another job type or input (never overwritten).
    Conflict,
}

/// The leader's end of the outbox channel: a dedicated connection that
/// `LISTEN`s to this schema's channel.
#[derive(Debug)]
pub struct OutboxListener {
    inner: PgListener,
}

impl OutboxListener {
    /// Waits for the next outbox notification (one per committed
    /// transaction that enqueued with [`FenceStore::insert_job_in`]; PostgreSQL
    /// folds duplicates of one transaction). Reconnects transparently after a
    /// lost connection; notifications sent meanwhile are lost (the leader's
    /// poll covers them). Not cancel-safe: run it in a task of its own.
    ///
    /// # Errors
    /// [`FenceError::Db`] when reconnecting fails.
    pub async fn next(&mut self) -> Result<(), FenceError> {
        self.inner.recv().await?;
        while self.inner.next_buffered().is_some() {}
        Ok(())
    }
}

impl FenceStore {
    /// The `NOTIFY` channel of this schema's outbox: `tenure_outbox_<schema>`
    /// (at most 62 bytes: a schema name is at most 48).
    pub fn outbox_channel(&self) -> String {
        format!("tenure_outbox_{}", self.schema)
    }

    /// Opens a connection of its own that listens to [`outbox_channel`](Self::outbox_channel).
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn listen_outbox(&self) -> Result<OutboxListener, FenceError> {
        let mut inner = PgListener::connect_with(&self.pool).await?;
        inner.listen(&self.outbox_channel()).await?;
        Ok(OutboxListener { inner })
    }

    /// Inserts a `pending` job row in the transaction open on `conn` (the
    /// caller's), awaiting publication by the scheduler leader, and notifies
    /// the leader's channel; both take effect only if that transaction
    /// commits. Table names are qualified with this store's schema, so the
    /// connection's `search_path` does not matter; it must be a connection to
    /// the same database, whose role may insert into `jobs`. `steps` (a typed
    /// definition's) are recorded as the row's step list
    /// ([`JobRow::step_names`](super::JobRow::step_names)).
    ///
    /// A duplicate (same id, type and input) is [`Inserted::Existing`] and
    /// changes nothing; it does not abort the caller's transaction (`ON
    /// CONFLICT DO NOTHING`). A row inserted by another open transaction is
    /// waited for.
    ///
    /// # Errors
    /// [`FenceError::PayloadConflict`] (the caller's transaction stays
    /// usable); [`FenceError::Db`] (which aborts it, as any failed statement).
    pub async fn insert_job_in(
        &self,
        conn: &mut PgConnection,
        id: JobId,
        job_type: &str,
        input: &serde_json::Value,
        steps: Option<&[StepInfo]>,
    ) -> Result<Inserted, FenceError> {
        let insert = format!(
            "INSERT INTO {} (id, job_type, input, run_at, awaiting_publish, step_names, \
                             steps_fingerprint, trace_context) \
             SELECT $1, $2, $3, now(), true, $4, $5, $6 \
              WHERE NOT EXISTS (SELECT 1 FROM {} WHERE id = $1) \
             ON CONFLICT (id) DO NOTHING",
            self.table("jobs"),
            self.table("job_tombstones")
        );
        let names = steps.map(step_list::names);
        let fingerprint = names.as_deref().map(step_list::fingerprint);
        let trace = crate::telemetry::propagation::current_row_value();
        for _ in 0..CLAIM_RETRIES {
            let done = sqlx::query(&insert)
                .bind(id.as_uuid())
                .bind(job_type)
                .bind(input)
                .bind(&names)
                .bind(&fingerprint)
                .bind(&trace)
                .execute(&mut *conn)
                .await?;
            if done.rows_affected() == 1 {
                self.notify_outbox(conn).await?;
                return Ok(Inserted::New);
            }
            if let Some(found) = self.existing(&mut *conn, id, job_type, input).await? {
                return found;
            }
        }
        Err(FenceError::NotFound(id))
    }

    /// Inserts `jobs` as `pending` rows in one statement (one round trip),
    /// and reports each item in order. An id repeated inside the batch is
    /// inserted once; its later items are `Existing` (same type and input) or
    /// `Conflict`. With `all_or_nothing`, a `Conflict` anywhere rolls the whole
    /// batch back: every item is then reported, and nothing was inserted.
    /// `steps` (the batch's one typed definition) are recorded as each new
    /// row's step list, `priority` as each new row's level.
    ///
    /// # Errors
    /// [`FenceError::Db`] (nothing inserted).
    pub async fn insert_jobs(
        &self,
        jobs: &[NewJob<'_>],
        steps: Option<&[StepInfo]>,
        priority: Priority,
        all_or_nothing: bool,
    ) -> Result<Vec<BatchInserted>, FenceError> {
        let steps = (steps, priority);
        let mut tx = self.begin().await?;
        let mut found = self.insert_batch(&mut tx, jobs, steps).await?;
        // A row that conflicted but was not in the statement's snapshot was
        // committed by another inserter meanwhile: look again (rare).
        if found.iter().any(Option::is_none) {
            let again = self.insert_batch(&mut tx, jobs, steps).await?;
            for (f, a) in found.iter_mut().zip(again) {
                if f.is_none() {
                    *f = Some(a.unwrap_or(BatchInserted::Conflict));
                }
            }
        }
        let found: Vec<BatchInserted> = found
            .into_iter()
            .map(|f| f.unwrap_or(BatchInserted::Conflict))
            .collect();
        let found = mark_repeats(jobs, found);
        if all_or_nothing && found.contains(&BatchInserted::Conflict) {
            tx.rollback().await?;
            return Ok(found);
        }
        tx.commit().await?;
        Ok(found)
    }

    /// The batch statement: `None` for an item whose id conflicted with a
    /// row this statement could not see.
    async fn insert_batch(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob<'_>],
        (steps, priority): (Option<&[StepInfo]>, Priority),
    ) -> Result<Vec<Option<BatchInserted>>, FenceError> {
        let t = self.table("jobs");
        let k = self.table("job_tombstones");
        let sql = format!(
            "WITH b AS (SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[]) \
                        WITH ORDINALITY AS b(id, job_type, input, ord)), \
             ins AS (INSERT INTO {t} (id, job_type, input, step_names, steps_fingerprint, \
                                      trace_context, priority) \
                     SELECT DISTINCT ON (id) id, job_type, input, $4::text[], $5::text, $6::jsonb, \
                            $7::text \
                       FROM b WHERE NOT EXISTS (SELECT 1 FROM {k} k WHERE k.id = b.id) \
                      ORDER BY id, ord \
                     ON CONFLICT (id) DO NOTHING RETURNING id) \
             SELECT b.ord, (ins.id IS NOT NULL) AS new, \
                    coalesce(j.job_type = b.job_type AND j.input = b.input, \
                             k.job_type = b.job_type AND k.input_md5 = md5(b.input::text)) AS same, \
                    (j.status IN ('pending', 'running') AND NOT j.awaiting_publish) AS live \
               FROM b LEFT JOIN ins ON ins.id = b.id LEFT JOIN {t} j ON j.id = b.id \
                    LEFT JOIN {k} k ON k.id = b.id \
              ORDER BY b.ord"
        );
        let ids: Vec<uuid::Uuid> = jobs.iter().map(|j| j.id.as_uuid()).collect();
        let types: Vec<&str> = jobs.iter().map(|j| j.job_type).collect();
        let inputs: Vec<&serde_json::Value> = jobs.iter().map(|j| j.input).collect();
        let names = steps.map(step_list::names);
        let fingerprint = names.as_deref().map(step_list::fingerprint);
        let rows = sqlx::query(&sql)
            .bind(ids)
            .bind(types)
            .bind(inputs)
            .bind(&names)
            .bind(&fingerprint)
            .bind(crate::telemetry::propagation::current_row_value())
            .bind(priority.as_str())
            .fetch_all(&mut *conn)
            .await?;
        rows.iter()
            .map(|r| {
                let new: bool = r.try_get("new")?;
                let same: Option<bool> = r.try_get("same")?;
                let live: Option<bool> = r.try_get("live")?;
                Ok(match (new, same) {
                    (true, _) => Some(BatchInserted::New),
                    (false, Some(true)) => Some(BatchInserted::Existing {
                        publish: live.unwrap_or(false),
                    }),
                    (false, Some(false)) => Some(BatchInserted::Conflict),
                    (false, None) => None,
                })
            })
            .collect()
    }

    /// Hands jobs whose message could not be published to the scheduler
    /// leader: rows still `pending` and never claimed become
    /// `awaiting_publish`, due now. Returns the ids handed (a running or
    /// claimed row is not: its publish stays the caller's to report). Safe if the message
    /// was in fact stored: the leader's publish has the same `Nats-Msg-Id`,
    /// and a job is admitted once however often it is delivered.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn hand_to_publisher(&self, ids: &[JobId]) -> Result<Vec<JobId>, FenceError> {
        let sql = format!(
            "SELECT * FROM {}($1)",
            self.table("tenure_hand_to_publisher")
        );
        let ids: Vec<uuid::Uuid> = ids.iter().map(JobId::as_uuid).collect();
        let mut conn = self.pool.acquire().await?;
        let handed: Vec<uuid::Uuid> = sqlx::query_scalar(&sql)
            .bind(ids)
            .fetch_all(&mut *conn)
            .await?;
        if !handed.is_empty() {
            self.notify_outbox(&mut conn).await?;
        }
        Ok(handed.into_iter().map(JobId::from_uuid).collect())
    }

    /// `pg_notify` on the outbox channel, in the transaction open on `conn`
    /// (delivered at its commit), or at once outside one.
    async fn notify_outbox(&self, conn: &mut PgConnection) -> Result<(), FenceError> {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(self.outbox_channel())
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// Later items of an id repeated in the batch. When the first item made a
/// new row, the statement reported every item of the id as `New`: a later
/// one is `Existing` (no publish: the first publishes) when it matches the
/// first item, `Conflict` otherwise. When the row existed before, the
/// statement compared each item with it already; only the publish is left to
/// the first.
fn mark_repeats(jobs: &[NewJob<'_>], mut found: Vec<BatchInserted>) -> Vec<BatchInserted> {
    let mut first: std::collections::HashMap<JobId, usize> = std::collections::HashMap::new();
    for (i, job) in jobs.iter().enumerate() {
        let Some(&at) = first.get(&job.id) else {
            first.insert(job.id, i);
            continue;
        };
        found[i] = match found[at] {
            BatchInserted::New => {
                let same = jobs[at].job_type == job.job_type && jobs[at].input == job.input;
                if same {
                    BatchInserted::Existing { publish: false }
                } else {
                    BatchInserted::Conflict
                }
            }
            _ => match found[i] {
                BatchInserted::Existing { .. } => BatchInserted::Existing { publish: false },
                other => other,
            },
        };
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_in_a_batch_are_existing_or_conflicts() {
        let (a, b) = (serde_json::json!({"n": 1}), serde_json::json!({"n": 2}));
        let id = JobId::from_key("t", "k");
        let other = JobId::from_key("t", "other");
        let jobs = [
            NewJob {
                id,
                job_type: "t",
                input: &a,
            },
            NewJob {
                id: other,
                job_type: "t",
                input: &a,
            },
            NewJob {
                id,
                job_type: "t",
                input: &a,
            },
            NewJob {
                id,
                job_type: "t",
                input: &b,
            },
        ];
        let found = mark_repeats(&jobs, vec![BatchInserted::New; 4]);
        assert_eq!(
            found,
            [
                BatchInserted::New,
                BatchInserted::New,
                BatchInserted::Existing { publish: false },
                BatchInserted::Conflict
            ]
        );
        // The row existed before: each item keeps the statement's own
        // comparison; the publish is the first item's.
        let conflict_first = vec![
            BatchInserted::Conflict,
            BatchInserted::New,
            BatchInserted::Existing { publish: true },
            BatchInserted::Conflict,
        ];
        assert_eq!(
            mark_repeats(&jobs, conflict_first),
            [
                BatchInserted::Conflict,
                BatchInserted::New,
                BatchInserted::Existing { publish: false },
                BatchInserted::Conflict
            ]
        );
    }
}
