//! Transactional enqueue (the outbox): a job enqueued in the caller's own
//! PostgreSQL transaction exists, and is published, if and only if that
//! transaction commits. The row itself is the outbox: it is inserted
//! `awaiting_publish` and due now, and the elected scheduler leader publishes
//! it (woken by a `NOTIFY` that PostgreSQL delivers at the commit) and marks
//! it published, fenced by its leader token. No two-phase commit: a leader
//! killed between the caller's commit and the publish is replaced, and its
//! successor finds the row still awaiting.

use sqlx::PgConnection;

use crate::job::{Job, StepInfo};
use crate::{Client, ClientError, Enqueued, JobId};

impl Client {
    /// Enqueues a job of type `J` under `idempotency_key` inside the
    /// transaction open on `conn` (yours; pass `&mut *tx` for a
    /// `sqlx::Transaction`). If the transaction commits, the job exists and
    /// is published within about a second (the scheduler leader is woken by
    /// the commit; at worst it finds the job at its next
    /// [`Tuning::due_poll`](crate::config::Tuning::due_poll)); if it rolls
    /// back, there is no job and no message.
    ///
    /// `conn` must be a connection to the database of
    /// [`Config::database_url`](crate::Config::database_url), whose role may
    /// insert into the job rows. The rows are in [`Config::schema`](crate::Config::schema):
    /// every table name is qualified with it, so the connection's
    /// `search_path` does not matter. Jobs run only while some worker of the
    /// namespace runs (one of them is the scheduler leader).
    ///
    /// The same idempotency rules as [`Client::enqueue`]: a key that exists
    /// with the same input is `duplicate: true` and changes nothing (your
    /// transaction is not aborted); a key that exists with another input is
    /// [`FenceError::PayloadConflict`](crate::blocks::fence::FenceError::PayloadConflict),
    /// and your transaction is still usable.
    ///
    /// ```no_run
    /// # async fn demo<J: tenure::Job>(client: &tenure::Client, pool: &sqlx::PgPool, input: J::Input) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES (1234)").execute(&mut *tx).await?;
    /// client.enqueue_in::<J>(&mut *tx, "order-1234", &input).await?;
    /// tx.commit().await?; // the order and its job, or neither
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ClientError::Input`] (nothing written); the job type is not valid
    /// ([`ClientError::Queue`], nothing written); as [`Client::enqueue`]
    /// otherwise. A database error aborts your transaction, as any failed
    /// statement does; the check of the namespace's way of owning jobs
    /// ([`FenceError::PartitionsChanged`](crate::blocks::fence::FenceError::PartitionsChanged))
    /// runs on the client's own pool before anything is written, so it never
    /// aborts yours.
    pub async fn enqueue_in<J: Job>(
        &self,
        conn: &mut PgConnection,
        idempotency_key: &str,
        input: &J::Input,
    ) -> Result<Enqueued, ClientError> {
        let value = super::input_value::<J>(input)?;
        self.enqueue_value_in(conn, J::NAME, idempotency_key, value, Some(J::STEPS))
            .await
    }

    /// [`Client::enqueue_in`] by type name with a JSON input.
    ///
    /// # Errors
    /// As [`Client::enqueue_in`].
    pub async fn enqueue_json_in(
        &self,
        conn: &mut PgConnection,
        job_type: &str,
        idempotency_key: &str,
        input: serde_json::Value,
    ) -> Result<Enqueued, ClientError> {
        self.enqueue_value_in(conn, job_type, idempotency_key, input, None)
            .await
    }

    /// The row of [`Client::enqueue_in`], with a typed definition's steps.
    async fn enqueue_value_in(
        &self,
        conn: &mut PgConnection,
        job_type: &str,
        idempotency_key: &str,
        input: serde_json::Value,
        steps: Option<&[StepInfo]>,
    ) -> Result<Enqueued, ClientError> {
        let job_id = JobId::from_key(job_type, idempotency_key);
        let payload = self.checked_payload(job_id, job_type, &input)?;
        // On the client's pool, not on `conn`: a failed check leaves the
        // caller's transaction usable.
        self.check_mode().await?;
        let inserted = self
            .store()
            .insert_job_in(conn, job_id, job_type, &input, steps)
            .await?;
        match inserted {
            crate::fence::Inserted::New => Ok(Enqueued {
                job_id,
                duplicate: false,
            }),
            // An unfinished duplicate may have lost its message: republished
            // as `enqueue` does. Read on `conn`: a row this very transaction
            // inserted is `awaiting_publish` there (the leader publishes it
            // after the commit), invisible on the pool.
            crate::fence::Inserted::Existing => {
                let row = self.store().job_on(conn, job_id).await?;
                let live = row.filter(|r| !r.status.is_terminal() && !r.awaiting_publish);
                if let Some(row) = live {
                    self.queue()
                        .publish_job_with_priority(job_id, job_type, payload, row.priority)
                        .await?;
                }
                Ok(Enqueued {
                    job_id,
                    duplicate: true,
                })
            }
            crate::fence::Inserted::Pruned(_) => Ok(Enqueued {
                job_id,
                duplicate: true,
            }),
        }
    }
}
