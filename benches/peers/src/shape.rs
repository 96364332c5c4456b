//! The job shape every system runs: `n` jobs of three steps, each step one
//! `UPDATE` of the job's own row of `peer_rows`, enqueued by four producer
//! tasks while the worker drains; the clock runs from the first enqueue to the
//! last step's commit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Producer tasks per run.
pub const PRODUCERS: usize = 4;

/// The `CREATE TABLE` of the rows the steps update, in `schema`.
pub fn create_rows_sql(schema: &str) -> String {
    format!("CREATE TABLE {schema}.peer_rows (id bigint PRIMARY KEY, n int NOT NULL DEFAULT 0)")
}

/// The rows of `n` jobs, ids `0..n`, inserted before the clock starts.
pub fn insert_rows_sql(schema: &str, n: usize) -> String {
    format!("INSERT INTO {schema}.peer_rows (id) SELECT generate_series(0, {n} - 1)")
}

/// The `UPDATE` each step makes (`$1`: the job's row id).
pub fn update_sql(schema: &str) -> String {
    format!("UPDATE {schema}.peer_rows SET n = n + 1 WHERE id = $1")
}

/// The check after a run: every row was updated exactly three times.
pub fn check_sql(schema: &str) -> String {
    format!(
        "SELECT count(*) FILTER (WHERE n = 3), count(*) FILTER (WHERE n > 3) FROM {schema}.peer_rows"
    )
}

/// The check's verdict for `system`: every one of the `n` rows read
/// `n = 3` (`three` of them did, `more` read more).
pub fn verdict(system: &str, n: usize, three: i64, more: i64) -> Result<()> {
    if three != n as i64 || more != 0 {
        bail!("{system}: {three} of {n} rows updated three times, {more} more often");
    }
    Ok(())
}

/// The row ids producer `p` of [`PRODUCERS`] enqueues.
pub fn share(p: usize, n: usize) -> impl Iterator<Item = i64> {
    (p..n).step_by(PRODUCERS).map(|i| i as i64)
}

/// Counts last-step commits.
#[derive(Default)]
pub struct Done {
    n: AtomicU64,
    notify: Notify,
}

impl Done {
    /// One job's last step committed.
    pub fn add(&self) {
        self.n.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// Waits until `n` jobs are done, at most `timeout`.
    pub async fn wait_for(&self, n: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.n.load(Ordering::Relaxed) < n {
            let woke = tokio::time::timeout(Duration::from_millis(200), self.notify.notified());
            let _ = woke.await;
            if Instant::now() > deadline {
                bail!(
                    "only {} of {n} jobs done after {timeout:?}",
                    self.n.load(Ordering::Relaxed)
                );
            }
        }
        Ok(())
    }
}

/// One system's figures at one concurrency.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// Jobs per second, first enqueue to last commit.
    pub jobs_per_s: f64,
    /// Enqueues per second of the four producers (while the worker ran).
    pub enqueue_per_s: f64,
}

impl Figure {
    /// The figure of `n` jobs whose clock started at `started`, whose
    /// producers finished after `enqueued` and whose last commit came `done`.
    pub fn of(n: usize, started: Instant, enqueued: Instant, done: Instant) -> Figure {
        Figure {
            jobs_per_s: n as f64 / (done - started).as_secs_f64(),
            enqueue_per_s: n as f64 / (enqueued - started).as_secs_f64(),
        }
    }
}

/// Waits for the producer tasks; returns when the last one is done.
pub async fn joined(producers: Vec<tokio::task::JoinHandle<Result<()>>>) -> Result<Instant> {
    for p in producers {
        p.await??;
    }
    Ok(Instant::now())
}
