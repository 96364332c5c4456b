//! A cron schedule through every torture run (Tenure's modes): every worker
//! declares `torture-cron`, every second, catching up missed ticks; each tick
//! runs `torture.tick`, one step that appends `(job, token, worker)` to the
//! guarded `ticks` table in its fenced transaction. The check: from the first
//! tick to the schedule's last decided one, every second has its job, done,
//! with exactly one `ticks` row; none skipped.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sqlx::types::Uuid;
use tenure::blocks::fence::tick_key;
use tenure::{Client, JobId, MissedTicks, Schedule, StepCtx, StepError};

/// The schedule's name.
pub const NAME: &str = "torture-cron";
/// The tick job's type.
pub const JOB_TYPE: &str = "torture.tick";

/// The schedule every worker declares: every second, missed ticks caught up
/// (a torture run's faults may keep every leader away for seconds; those
/// ticks must still run once each).
pub fn schedule() -> Schedule {
    Schedule::new(NAME, "* * * * * *").missed(MissedTicks::CatchUp { max: 100_000 })
}

/// A tick's job: one fenced write.
#[derive(Debug, Clone)]
pub struct Tick {
    /// This worker's id.
    pub worker: String,
    /// The schema of `ticks`.
    pub schema: String,
}

#[tenure::job(name = "torture.tick", max_takeovers = 50, retries = 50)]
impl Tick {
    #[step]
    async fn record(&self, ctx: &mut StepCtx, _input: ()) -> Result<(), StepError> {
        let sql = format!(
            "INSERT INTO {}.ticks (job_id, token, worker) VALUES ($1, $2, $3)",
            self.schema
        );
        tenure_tests::insert_in_step(ctx, &sql, None, Some(&self.worker)).await
    }
}

/// Creates `ticks` (guarded when `guard`).
pub async fn setup(client: &Client, s: &str, guard: bool) -> anyhow::Result<()> {
    sqlx::query(&format!(
        "CREATE TABLE {s}.ticks (job_id uuid NOT NULL, token bigint NOT NULL, worker text NOT NULL)"
    ))
    .execute(client.store().pool())
    .await?;
    if guard {
        client.store().install_guard(&format!("{s}.ticks")).await?;
    }
    Ok(())
}

/// What the check found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Seconds from the first tick to the last decided one.
    pub ticks: u64,
    /// Ticks the leader recorded as skipped.
    pub skipped: i64,
    /// Seconds in that range with no job (a tick lost).
    pub missing: u64,
    /// Tick jobs not done after the wait.
    pub unfinished: u64,
    /// Tick jobs whose step committed more than once.
    pub twice: u64,
}

impl Verdict {
    /// No tick skipped, lost, unfinished or committed twice.
    pub fn clean(&self) -> bool {
        self.skipped == 0 && self.missing == 0 && self.unfinished == 0 && self.twice == 0
    }

    /// The line the parent prints.
    pub fn line(&self) -> String {
        format!(
            "torture: cron ticks={} skipped={} missing={} unfinished={} twice={}",
            self.ticks, self.skipped, self.missing, self.unfinished, self.twice
        )
    }
}

/// Checks the schedule's ticks up to its last decided one, waiting up to
/// `wait` for the newest to finish.
pub async fn check(client: &Client, s: &str, wait: Duration) -> anyhow::Result<Verdict> {
    let rows = client.store().schedules().await?;
    let Some(row) = rows.into_iter().find(|r| r.name == NAME) else {
        return Ok(Verdict::default());
    };
    let Some(last) = row.last_tick else {
        return Ok(Verdict::default());
    };
    let first = row.created_at.duration_trunc(TimeDelta::seconds(1))?;
    let seconds = second_range(first, last);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let v = judge(client, s, &seconds, row.skipped).await?;
        if v.unfinished == 0 || tokio::time::Instant::now() >= deadline {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every whole second in `[first, last]`.
fn second_range(first: DateTime<Utc>, last: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut t = first;
    while t <= last {
        out.push(t);
        t += TimeDelta::seconds(1);
    }
    out
}

async fn judge(
    client: &Client,
    s: &str,
    seconds: &[DateTime<Utc>],
    skipped: i64,
) -> anyhow::Result<Verdict> {
    let pool = client.store().pool();
    let status: HashMap<Uuid, String> = sqlx::query_as::<_, (Uuid, String)>(&format!(
        "SELECT id, status FROM {s}.jobs WHERE job_type = $1"
    ))
    .bind(JOB_TYPE)
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let commits: HashMap<Uuid, i64> = sqlx::query_as::<_, (Uuid, i64)>(&format!(
        "SELECT job_id, count(*) FROM {s}.ticks GROUP BY job_id"
    ))
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let ids: Vec<Uuid> = seconds
        .iter()
        .map(|t| JobId::from_key(JOB_TYPE, &tick_key(NAME, *t)).as_uuid())
        .collect();
    // Ticks before the first leader's first round are neither enqueued nor
    // skipped: the range starts at the first tick that has a job.
    let start = ids
        .iter()
        .position(|id| status.contains_key(id))
        .unwrap_or(ids.len());
    let mut v = Verdict {
        skipped,
        ..Verdict::default()
    };
    for id in &ids[start..] {
        v.ticks += 1;
        match status.get(id).map(String::as_str) {
            None => v.missing += 1,
            Some("done") => {}
            Some(_) => v.unfinished += 1,
        }
        if commits.get(id).copied().unwrap_or(0) > 1 {
            v.twice += 1;
        }
    }
    Ok(v)
}
