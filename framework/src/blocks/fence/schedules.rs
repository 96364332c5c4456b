//! Cron schedules' rows (`schedules`, migration 0008): the definitions each
//! worker registers, the leader's fenced write that enqueues a schedule's
//! ticks and advances its last tick in one transaction, and the operator's
//! pause and resume (migration 0020).

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::Row;

use crate::types::{FencingToken, JobId};

use super::{FenceError, FenceStore};

/// One schedule's row.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    /// The schedule's name (unique per schema).
    pub name: String,
    /// The job type each tick enqueues.
    pub job_type: String,
    /// The cron expression.
    pub expr: String,
    /// The IANA time zone the expression is read in.
    pub time_zone: String,
    /// The missed-ticks policy: `skip` or `catch_up:<max>`.
    pub missed: String,
    /// The input of every tick's job.
    pub input: serde_json::Value,
    /// The newest tick decided (enqueued, or skipped as missed).
    pub last_tick: Option<DateTime<Utc>>,
    /// The next tick, as the leader last computed it.
    pub next_tick: Option<DateTime<Utc>>,
    /// Ticks enqueued so far.
    pub enqueued: i64,
    /// Ticks skipped as missed so far.
    pub skipped: i64,
    /// When the schedule was first registered.
    pub created_at: DateTime<Utc>,
    /// Since when it is paused (`None`: it runs). A paused schedule enqueues
    /// no tick; its due ticks are counted as skipped.
    pub paused_at: Option<DateTime<Utc>>,
    /// Who paused it: the pausing connection's `application_name`, if any.
    pub paused_by: Option<String>,
    /// When it was last resumed: no tick due at or before it is enqueued.
    pub resumed_at: Option<DateTime<Utc>>,
}

/// What the leader decided for one schedule, written by
/// [`FenceStore::enqueue_ticks`].
#[derive(Debug, Clone, PartialEq)]
pub struct TickBatch<'a> {
    /// The schedule.
    pub name: &'a str,
    /// Its job type.
    pub job_type: &'a str,
    /// Its input.
    pub input: &'a serde_json::Value,
    /// The ticks to enqueue, oldest first.
    pub ticks: &'a [DateTime<Utc>],
    /// How many missed ticks were skipped.
    pub skipped: u64,
    /// The newest tick decided: the schedule's new `last_tick`.
    pub last_tick: DateTime<Utc>,
    /// The tick after it.
    pub next_tick: Option<DateTime<Utc>>,
}

/// The idempotency key of schedule `name`'s tick at `tick`:
/// `cron:<name>:<tick, RFC 3339 UTC>`.
pub fn tick_key(name: &str, tick: DateTime<Utc>) -> String {
    format!(
        "cron:{name}:{}",
        tick.to_rfc3339_opts(SecondsFormat::Secs, true)
    )
}

/// Whether `name` can name a schedule: 1 to 64 ASCII letters, digits, `_`,
/// `.` and `-`. The rule of `Schedule::new` (`schedule.rs`, which uses no
/// other module) and of migration 0020's `tenure_check_schedule_name`.
pub(crate) fn schedule_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// The idempotency key of a trigger ("run now") of schedule `name` with the
/// caller's `trigger_id`: `trigger:<name>:<id>`. It never equals a tick's
/// [`tick_key`] (another prefix), and the same id is the same job.
pub fn trigger_key(name: &str, trigger_id: &str) -> String {
    format!("trigger:{name}:{trigger_id}")
}

impl FenceStore {
    /// Registers (or updates) a schedule's definition; its `last_tick`,
    /// counters and `created_at` are kept.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn upsert_schedule(&self, def: &ScheduleRow) -> Result<(), FenceError> {
        let sql = format!(
            "SELECT {}($1, $2, $3, $4, $5, $6)",
            self.table("tenure_define_schedule")
        );
        sqlx::query(&sql)
            .bind(&def.name)
            .bind(&def.job_type)
            .bind(&def.expr)
            .bind(&def.time_zone)
            .bind(&def.missed)
            .bind(&def.input)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every schedule, by name.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>, FenceError> {
        let sql = format!(
            "SELECT name, job_type, expr, time_zone, missed, input, last_tick, next_tick, \
                    enqueued, skipped, created_at, paused_at, paused_by, resumed_at \
               FROM {} ORDER BY name",
            self.table("schedules")
        );
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(ScheduleRow {
                    name: r.try_get("name")?,
                    job_type: r.try_get("job_type")?,
                    expr: r.try_get("expr")?,
                    time_zone: r.try_get("time_zone")?,
                    missed: r.try_get("missed")?,
                    input: r.try_get("input")?,
                    last_tick: r.try_get("last_tick")?,
                    next_tick: r.try_get("next_tick")?,
                    enqueued: r.try_get("enqueued")?,
                    skipped: r.try_get("skipped")?,
                    created_at: r.try_get("created_at")?,
                    paused_at: r.try_get("paused_at")?,
                    paused_by: r.try_get("paused_by")?,
                    resumed_at: r.try_get("resumed_at")?,
                })
            })
            .collect()
    }

    /// Pauses schedule `name` (`tenure_pause_schedule`, the operator's
    /// grant): `Some(true)` when it was not paused, `Some(false)` when it
    /// was, `None` when no schedule has that name (nothing written).
    ///
    /// # Errors
    /// [`FenceError::ArgumentRefused`] for a name no schedule can have;
    /// [`FenceError::Db`]: e.g. a role without the operator's grant.
    pub async fn pause_schedule(&self, name: &str) -> Result<Option<bool>, FenceError> {
        self.schedule_control("tenure_pause_schedule", name).await
    }

    /// Resumes schedule `name` (`tenure_resume_schedule`): `Some(true)` when
    /// it was paused, `Some(false)` when it was not, `None` when no schedule
    /// has that name. No tick due before the resume is enqueued.
    ///
    /// # Errors
    /// As [`pause_schedule`](Self::pause_schedule).
    pub async fn resume_schedule(&self, name: &str) -> Result<Option<bool>, FenceError> {
        self.schedule_control("tenure_resume_schedule", name).await
    }

    async fn schedule_control(
        &self,
        function: &str,
        name: &str,
    ) -> Result<Option<bool>, FenceError> {
        let sql = format!("SELECT {}($1)", self.table(function));
        Ok(sqlx::query_scalar(&sql)
            .bind(name)
            .fetch_one(&self.pool)
            .await?)
    }

    /// In one transaction fenced by `role`'s `token`: inserts a job row per
    /// tick of `batch` (key [`tick_key`], `run_at` = the tick, awaiting
    /// publication; an existing row is left alone), and advances the
    /// schedule's `last_tick` (never backwards). Returns the rows inserted.
    /// A batch with no tick (a paused schedule's ticks, counted as skipped)
    /// is accepted while the schedule is paused.
    ///
    /// # Errors
    /// [`FenceError::LeaderFencedOut`] (nothing written);
    /// [`FenceError::SchedulePaused`] when the schedule is paused and the
    /// batch inserted a tick (nothing written); [`FenceError::Db`].
    pub async fn enqueue_ticks(
        &self,
        role: &str,
        token: FencingToken,
        batch: &TickBatch<'_>,
    ) -> Result<u64, FenceError> {
        let insert = format!(
            "INSERT INTO {} (id, job_type, input, run_at, awaiting_publish, trace_context) \
             VALUES ($1, $2, $3, $4, true, $5) ON CONFLICT (id) DO NOTHING",
            self.table("jobs")
        );
        let mut tx = self.begin_leader(role, token).await?;
        let mut inserted = 0;
        // The scheduler's tick span: a cron job's trace begins at its tick.
        let trace = crate::telemetry::propagation::current_row_value();
        for tick in batch.ticks {
            let id = JobId::from_key(batch.job_type, &tick_key(batch.name, *tick));
            inserted += sqlx::query(&insert)
                .bind(id.as_uuid())
                .bind(batch.job_type)
                .bind(batch.input)
                .bind(tick)
                .bind(&trace)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        self.advance_schedule(&mut tx, role, token, batch, inserted)
            .await?;
        tx.commit().await?;
        Ok(inserted)
    }

    async fn advance_schedule(
        &self,
        tx: &mut sqlx::PgConnection,
        role: &str,
        token: FencingToken,
        batch: &TickBatch<'_>,
        inserted: u64,
    ) -> Result<(), FenceError> {
        // Checks the leader's fence again (SECURITY DEFINER, migration 0015)
        // and refuses the ticks of a paused schedule (0020).
        let sql = format!(
            "SELECT {}($1, $2, $3, $4, $5, $6, $7)",
            self.table("tenure_advance_schedule")
        );
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        sqlx::query(&sql)
            .bind(role)
            .bind(token.get())
            .bind(batch.name)
            .bind(batch.last_tick)
            .bind(batch.next_tick)
            .bind(int(inserted))
            .bind(int(batch.skipped))
            .execute(tx)
            .await?;
        Ok(())
    }
}
