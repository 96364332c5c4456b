//! The operator action `cancel` (`--cancel F`): the parent cancels a fraction
//! of the jobs mid-run, through `Client::cancel`, while the faults go on; the
//! checker then holds every cancelled job to the cancel's promise.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use sqlx::types::Uuid;
use tenure::{Cancelled, Client, ClientError, JobId};
use tokio::task::JoinSet;

use super::resource::HistoryVerdict;

/// What one cancel call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tried {
    /// `Cancelled::Now` or `Cancelled::Already` (a retry after an answer lost).
    Cancelled,
    /// The job finished first (`ClientError::JobFinished`).
    TooLate,
    /// Gave up after the retries (a server down for two minutes).
    Failed,
}

/// The parent's cancels, in flight and finished.
#[derive(Default)]
pub(crate) struct Cancels {
    tasks: JoinSet<(JobId, Tried)>,
    pub(crate) results: HashMap<JobId, Tried>,
}

impl Cancels {
    /// Picks each of `batch` with probability `fraction` and cancels it after
    /// a random delay (while it is queued, running or finished).
    pub(crate) fn spawn(
        &mut self,
        client: &Client,
        batch: &[JobId],
        fraction: f64,
        rng: &mut StdRng,
    ) {
        for id in batch {
            if fraction <= 0.0 || !rng.random_bool(fraction) {
                continue;
            }
            let delay = Duration::from_millis(rng.random_range(0..2000));
            let (client, id) = (client.clone(), *id);
            self.tasks.spawn(async move {
                tokio::time::sleep(delay).await;
                (id, cancel(&client, id).await)
            });
        }
    }

    /// Waits for every cancel spawned.
    pub(crate) async fn finish(&mut self) {
        while let Some(done) = self.tasks.join_next().await {
            if let Ok((id, tried)) = done {
                self.results.insert(id, tried);
            }
        }
    }

    /// How many came to `what`.
    pub(crate) fn count(&self, what: Tried) -> usize {
        self.results.values().filter(|t| **t == what).count()
    }
}

/// One cancel, retried through server faults (an error after the row update
/// committed makes the retry say `Already`).
async fn cancel(client: &Client, id: JobId) -> Tried {
    let tried = super::retry("cancel", || async move {
        match client.cancel(id, "torture: operator cancel").await {
            Ok(Cancelled::Now | Cancelled::Already) => Ok(Tried::Cancelled),
            Err(ClientError::JobFinished { .. }) => Ok(Tried::TooLate),
            Err(e) => Err(e.into()),
        }
    })
    .await;
    tried.unwrap_or(Tried::Failed)
}

/// One cancelled job row, with what its history says.
struct CancelledRow {
    step: i32,
    /// Its `cancelled` job event (the trigger's clock, once the cancel held the row lock).
    has_event: bool,
    /// History rows written at or after that event (PostgreSQL target only).
    after: i64,
}

/// Checks every cancelled job: its row has its `cancelled` event; its applied
/// steps are exactly its committed ones (no step partly committed: with the
/// MariaDB target, one applied step more is the non-atomic pair of commits,
/// absorbed on a re-run); nothing was written after the cancel; and every job
/// a cancel call reported cancelled ended `cancelled`. Returns the violations.
pub(crate) async fn check(
    pool: &sqlx::PgPool,
    s: &str,
    judged: &HistoryVerdict,
    postgres_history: bool,
    results: &HashMap<JobId, Tried>,
) -> anyhow::Result<(u64, i64)> {
    let rows = cancelled_rows(pool, s, postgres_history).await?;
    let mut violations = 0;
    for (id, row) in &rows {
        let applied = judged.steps.get(id).copied().unwrap_or(0);
        let committed = i64::from(row.step);
        let steps_ok = if postgres_history {
            applied == committed
        } else {
            applied == committed || applied == committed + 1
        };
        if !row.has_event || !steps_ok || row.after != 0 {
            eprintln!(
                "torture: CANCEL VIOLATION {id}: event={} applied_steps={applied} row_step={committed} written_after={}",
                row.has_event, row.after
            );
            violations += 1;
        }
    }
    let ended: HashSet<Uuid> = rows.keys().copied().collect();
    for (id, tried) in results {
        if *tried == Tried::Cancelled && !ended.contains(&id.as_uuid()) {
            eprintln!(
                "torture: CANCEL VIOLATION {id}: the cancel returned, the row is not cancelled"
            );
            violations += 1;
        }
    }
    Ok((u64::try_from(rows.len())?, violations))
}

async fn cancelled_rows(
    pool: &sqlx::PgPool,
    s: &str,
    postgres_history: bool,
) -> anyhow::Result<HashMap<Uuid, CancelledRow>> {
    let after = if postgres_history {
        format!("(SELECT count(*) FROM {s}.history h WHERE h.job_id = j.id AND h.at >= e.at)")
    } else {
        "0::bigint".to_string()
    };
    let rows: Vec<(Uuid, i32, bool, Option<i64>)> = sqlx::query_as(&format!(
        "SELECT j.id, j.step, e.at IS NOT NULL, {after} \
           FROM {s}.jobs j \
           LEFT JOIN {s}.job_history e ON e.job_id = j.id AND e.kind = 'cancelled' \
          WHERE j.status = 'cancelled'"
    ))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, step, has_event, after)| {
            let after = after.unwrap_or(0);
            (
                id,
                CancelledRow {
                    step,
                    has_event,
                    after,
                },
            )
        })
        .collect())
}
