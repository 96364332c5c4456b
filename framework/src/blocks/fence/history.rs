//! Operators' reads of job rows and of their history (the view `job_history`,
//! migration 0024: the trail on each job row and the rows of `job_events`):
//! the overview counts, a filtered job list paged by keyset, one job's
//! timeline, the workers seen writing. Read-only, except
//! [`FenceStore::record_refusal`] (the fence's own note of a refused stale write).
//! The CLI (`tenure`) and its web view (`tenure serve`) read through these and
//! write no SQL of their own.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, QueryBuilder, Row};

use crate::types::{FencingToken, JobId, StepIndex};

use super::row::job_row;
use super::{FenceError, FenceStore, JobRow, JobStatus};

/// Bound on recording a refused stale write: it must never hold up the worker.
const RECORD_REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Events read for one job's timeline at most.
pub const MAX_JOB_EVENTS: i64 = 1000;

/// How much older than an event its job row's `updated_at` may be, for the
/// reads of recent events (`job_history.row_updated_at`, migration 0024):
/// the age of the transaction that wrote it (`updated_at = now()`, its
/// start). A fenced step's transaction ends long before this (the watchdog
/// stops work within a lease TTL); an event written by a transaction open
/// longer is left out of the window counts and the workers page, nothing
/// else. The reads unnest the trails of rows changed within the window and
/// this much before it.
const TRAIL_SLACK_SECS: f64 = 600.0;

/// How many job rows have one job type and status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TypeStatusCount {
    /// The job type.
    pub job_type: String,
    /// The status (`pending|running|done|dead|cancelled`).
    pub status: String,
    /// Rows with this type and status.
    pub count: i64,
    /// The sum of their `takeovers`.
    pub takeovers: i64,
}

/// Counts of history events of one kind within a window.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct WindowCounts {
    /// The window, in seconds, ending now.
    pub window_secs: u64,
    /// Jobs whose last step committed (`done` events).
    pub done: i64,
    /// Jobs given up (`dead` events).
    pub dead: i64,
    /// Failed attempts (`failed` events).
    pub failed: i64,
    /// Claims that took over from a lost owner (`taken_over` events).
    pub takeovers: i64,
    /// Stale writes the fence refused (`stale_refused` events).
    pub stale_refusals: i64,
    /// Step commits (`step` events).
    pub steps: i64,
}

/// The namespace's job rows at a glance: what the web view's overview shows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Overview {
    /// Rows per type and status.
    pub by_type_status: Vec<TypeStatusCount>,
    /// Events in the last window.
    pub recent: WindowCounts,
    /// Stale writes refused since the history began.
    pub stale_refusals_total: i64,
}

impl Overview {
    /// Rows with `status`, all types.
    ///
    /// ```
    /// # use tenure::blocks::fence::{Overview, TypeStatusCount, WindowCounts, JobStatus};
    /// let o = Overview { by_type_status: vec![TypeStatusCount {
    ///     job_type: "a".into(), status: "done".into(), count: 3, takeovers: 1 }],
    ///     recent: WindowCounts::default(), stale_refusals_total: 0 };
    /// assert_eq!(o.count(JobStatus::Done), 3);
    /// assert_eq!(o.total(), 3);
    /// ```
    pub fn count(&self, status: JobStatus) -> i64 {
        self.by_type_status
            .iter()
            .filter(|c| c.status == status.as_str())
            .map(|c| c.count)
            .sum()
    }

    /// All rows.
    pub fn total(&self) -> i64 {
        self.by_type_status.iter().map(|c| c.count).sum()
    }
}

/// Which job rows a [`FenceStore::list_jobs_page`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only this job type.
    pub job_type: Option<String>,
    /// Only this status.
    pub status: Option<JobStatus>,
    /// Only rows created at or after this time (the "age" filter).
    pub created_since: Option<DateTime<Utc>>,
    /// Only rows with at least one takeover.
    pub with_takeovers: bool,
}

/// A position in the job list (newest first): the last row of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobCursor {
    /// That row's `created_at`.
    pub created_at: DateTime<Utc>,
    /// That row's id (ties on `created_at`).
    pub id: JobId,
}

impl JobCursor {
    /// The cursor just after `row`.
    pub fn after(row: &JobRow) -> Self {
        JobCursor {
            created_at: row.created_at,
            id: row.id,
        }
    }
}

/// One entry of a job's history.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobEvent {
    /// The event's number in `job_events` (global, increasing), for the
    /// events kept there: refusals, retry-nows, reschedules, and everything
    /// written before migration 0024. `None` for an event on the job row's
    /// trail (claims, steps, failures, releases, ends, redrives).
    pub seq: Option<i64>,
    /// When it was written.
    pub at: DateTime<Utc>,
    /// `enqueued`, `claimed`, `taken_over`, `step`, `failed`, `released`, `done`,
    /// `dead`, `cancelled` (detail: the reason), `redriven` or `stale_refused`.
    pub kind: String,
    /// The fence it happened under (`stale_refused`: the refused token).
    pub token: Option<i64>,
    /// `claimed`/`taken_over`: the fence before; `stale_refused`: the fence that won.
    pub other_token: Option<i64>,
    /// The step (`step`: the step that committed).
    pub step: Option<i32>,
    /// The writer's `application_name` (the worker id of Tenure's pools).
    pub worker: Option<String>,
    /// The row's `attempts` after the event.
    pub attempts: Option<i32>,
    /// The row's `takeovers` after the event.
    pub takeovers: Option<i32>,
    /// `failed`/`dead`: the error; `cancelled`: the reason; `stale_refused`:
    /// where; `step` events written before migration 0024: the checkpoint
    /// (the trail keeps no step's output: the row has the last one).
    pub detail: Option<serde_json::Value>,
}

/// A worker as its own reports, the job history and PostgreSQL's connections
/// show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkerSeen {
    /// The worker id (`application_name` of its connections).
    pub worker: String,
    /// Its last recorded event within the window, if any.
    pub last_event_at: Option<DateTime<Utc>>,
    /// Claims (including takeovers) in the window.
    pub claims: i64,
    /// Step commits in the window.
    pub steps: i64,
    /// Its stale writes refused in the window.
    pub stale_refusals: i64,
    /// Running jobs whose latest claim is this worker's.
    pub jobs_in_flight: i64,
    /// Its open PostgreSQL connections now.
    pub connections: i64,
    /// Its session lease, as it last reported (`None`: no report, or no session).
    pub lease_id: Option<i64>,
    /// Its last reported health: `healthy`, `degraded`, `lost`, `stopped`, or
    /// `silent` when no report came for three lease TTLs (a worker that died
    /// or cannot reach PostgreSQL); `None`: it never reported in the window.
    pub health: Option<String>,
    /// Jobs running at its last report.
    pub reported_in_flight: Option<i32>,
    /// Its `max_in_flight`.
    pub max_in_flight: Option<i32>,
    /// When it last reported.
    pub reported_at: Option<DateTime<Utc>>,
}

impl FenceStore {
    pub(super) fn table(&self, name: &str) -> String {
        format!("\"{}\".{name}", self.schema)
    }

    /// The history events at or after parameter `$since`, with parameter
    /// `$since + 1` the slack of [`TRAIL_SLACK_SECS`]: a scan of `jobs` that
    /// unnests only the trails of rows changed since then.
    fn history_since(&self, since: usize) -> String {
        let slack = since + 1;
        format!(
            "SELECT kind, at, worker FROM {} WHERE at >= ${since} AND (row_updated_at IS NULL \
               OR row_updated_at >= ${since} - make_interval(secs => ${slack}))",
            self.table("job_history")
        )
    }

    /// Rows per type and status, and history counts over the last `window`.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn overview(&self, window: Duration) -> Result<Overview, FenceError> {
        let rows = sqlx::query(&format!(
            "SELECT job_type, status, count(*) AS n, coalesce(sum(takeovers), 0)::bigint AS t \
             FROM {} GROUP BY job_type, status ORDER BY job_type, status",
            self.table("jobs")
        ))
        .fetch_all(&self.pool)
        .await?;
        let by_type_status = rows
            .iter()
            .map(|r| {
                Ok(TypeStatusCount {
                    job_type: r.try_get("job_type")?,
                    status: r.try_get("status")?,
                    count: r.try_get("n")?,
                    takeovers: r.try_get("t")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        let recent = self.window_counts(window).await?;
        let stale_refusals_total = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE kind = 'stale_refused'",
            self.table("job_events")
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(Overview {
            by_type_status,
            recent,
            stale_refusals_total,
        })
    }

    async fn window_counts(&self, window: Duration) -> Result<WindowCounts, FenceError> {
        let since = Utc::now() - chrono::Duration::from_std(window).unwrap_or_default();
        // The trail itself, not `job_history`: no writer is needed, so no
        // event pays for carrying one forward.
        let rows = sqlx::query(&format!(
            "SELECT kind, count(*) AS n FROM ( \
               SELECT kind FROM {} WHERE at >= $2 \
               UNION ALL \
               SELECT e.kind FROM {} j, unnest(j.trail) e \
                WHERE j.updated_at >= $2 - make_interval(secs => $3) AND e.at >= $2) h \
             WHERE kind = ANY($1) GROUP BY kind",
            self.table("job_events"),
            self.table("jobs")
        ))
        .bind(
            [
                "done",
                "dead",
                "failed",
                "taken_over",
                "stale_refused",
                "step",
            ]
            .as_slice(),
        )
        .bind(since)
        .bind(TRAIL_SLACK_SECS)
        .fetch_all(&self.pool)
        .await?;
        let mut c = WindowCounts {
            window_secs: window.as_secs(),
            ..WindowCounts::default()
        };
        for r in &rows {
            let n: i64 = r.try_get("n")?;
            match r.try_get::<String, _>("kind")?.as_str() {
                "done" => c.done = n,
                "dead" => c.dead = n,
                "failed" => c.failed = n,
                "taken_over" => c.takeovers = n,
                "stale_refused" => c.stale_refusals = n,
                "step" => c.steps = n,
                _ => {}
            }
        }
        Ok(c)
    }

    /// Up to `limit` rows matching `filter`, newest first (`created_at`, then id,
    /// descending), after `cursor`. Keyset pagination: each condition is
    /// added only when set, so PostgreSQL walks one index backwards
    /// (`jobs_finished_created_idx` for a finished status, `jobs_type_created_idx`,
    /// `jobs_takeovers_created_idx` or `jobs_created_idx`) and stops after
    /// `limit` rows, however many rows the table holds.
    ///
    /// # Errors
    /// [`FenceError::Db`], [`FenceError::Corrupt`].
    pub async fn list_jobs_page(
        &self,
        filter: &JobFilter,
        cursor: Option<JobCursor>,
        limit: i64,
    ) -> Result<Vec<JobRow>, FenceError> {
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(format!(
            "SELECT {} FROM {} WHERE true",
            super::sql::ROW_COLUMNS,
            self.table("jobs")
        ));
        if let Some(t) = &filter.job_type {
            q.push(" AND job_type = ").push_bind(t.clone());
        }
        if let Some(s) = filter.status {
            if s.is_terminal() {
                q.push(" AND ").push(super::status::FINISHED_SQL);
            }
            q.push(" AND status = ").push_bind(s.as_str());
        }
        if let Some(since) = filter.created_since {
            q.push(" AND created_at >= ").push_bind(since);
        }
        if filter.with_takeovers {
            // Literal, so that the partial index's predicate matches.
            q.push(" AND takeovers > 0");
        }
        if let Some(c) = cursor {
            q.push(" AND (created_at, id) < (")
                .push_bind(c.created_at)
                .push(", ")
                .push_bind(c.id.as_uuid())
                .push(")");
        }
        q.push(" ORDER BY created_at DESC, id DESC LIMIT ")
            .push_bind(limit);
        let rows = q.build().fetch_all(&self.pool).await?;
        rows.iter().map(job_row).collect()
    }

    /// The job's history, oldest first (at most [`MAX_JOB_EVENTS`]).
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn job_events(&self, id: JobId) -> Result<Vec<JobEvent>, FenceError> {
        let rows = sqlx::query(&format!(
            "SELECT seq, at, kind, token, other_token, step, worker, attempts, takeovers, detail \
             FROM {} WHERE job_id = $1 ORDER BY at, pos, seq LIMIT $2",
            self.table("job_history")
        ))
        .bind(id.as_uuid())
        .bind(MAX_JOB_EVENTS)
        .fetch_all(&self.pool)
        .await?;
        let event = |r: &sqlx::postgres::PgRow| -> Result<JobEvent, sqlx::Error> {
            Ok(JobEvent {
                seq: r.try_get("seq")?,
                at: r.try_get("at")?,
                kind: r.try_get("kind")?,
                token: r.try_get("token")?,
                other_token: r.try_get("other_token")?,
                step: r.try_get("step")?,
                worker: r.try_get("worker")?,
                attempts: r.try_get("attempts")?,
                takeovers: r.try_get("takeovers")?,
                detail: r.try_get("detail")?,
            })
        };
        Ok(rows.iter().map(event).collect::<Result<_, _>>()?)
    }

    /// Workers that reported within `window`, seen in the history within it,
    /// or connected now, with their reported lease and health and the running
    /// jobs whose latest claim is theirs.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    pub async fn workers_seen(&self, window: Duration) -> Result<Vec<WorkerSeen>, FenceError> {
        let since = Utc::now() - chrono::Duration::from_std(window).unwrap_or_default();
        let (jobs, history) = (self.table("jobs"), self.table("job_history"));
        let (recent, reports) = (self.history_since(1), self.table("worker_reports"));
        let rows = sqlx::query(&format!(
            "WITH seen AS ( \
               SELECT worker, max(at) AS last_at, \
                      count(*) FILTER (WHERE kind IN ('claimed', 'taken_over')) AS claims, \
                      count(*) FILTER (WHERE kind = 'step') AS steps, \
                      count(*) FILTER (WHERE kind = 'stale_refused') AS stale \
                 FROM ({recent}) h WHERE worker IS NOT NULL GROUP BY worker), \
             flight AS ( \
               SELECT e.worker, count(*) AS n FROM {jobs} j \
                 CROSS JOIN LATERAL (SELECT worker FROM {history} \
                   WHERE job_id = j.id AND kind IN ('claimed', 'taken_over') \
                   ORDER BY at DESC, pos DESC, seq DESC LIMIT 1) e \
                WHERE j.status = 'running' GROUP BY e.worker), \
             conns AS ( \
               SELECT application_name AS worker, count(*) AS n FROM pg_stat_activity \
                WHERE datname = current_database() AND application_name <> '' \
                GROUP BY application_name), \
             rep AS ( \
               SELECT worker, lease_id, in_flight, max_in_flight, reported_at, \
                      CASE WHEN health <> 'stopped' AND reported_at < clock_timestamp() \
                                - 3 * make_interval(secs => lease_ttl_ms / 1000.0) \
                           THEN 'silent' ELSE health END AS health \
                 FROM {reports} WHERE reported_at >= $1) \
             SELECT w.worker, s.last_at, coalesce(s.claims, 0) AS claims, \
                    coalesce(s.steps, 0) AS steps, coalesce(s.stale, 0) AS stale, \
                    coalesce(f.n, 0) AS flight, coalesce(c.n, 0) AS conns, \
                    r.lease_id, r.health, r.in_flight AS rep_flight, r.max_in_flight, \
                    r.reported_at \
               FROM (SELECT worker FROM seen UNION SELECT worker FROM flight \
                     UNION SELECT worker FROM conns UNION SELECT worker FROM rep) w \
               LEFT JOIN seen s USING (worker) LEFT JOIN flight f USING (worker) \
               LEFT JOIN conns c USING (worker) LEFT JOIN rep r USING (worker) \
              WHERE w.worker IS NOT NULL ORDER BY w.worker"
        ))
        .bind(since)
        .bind(TRAIL_SLACK_SECS)
        .fetch_all(&self.pool)
        .await?;
        let worker = |r: &sqlx::postgres::PgRow| -> Result<WorkerSeen, sqlx::Error> {
            Ok(WorkerSeen {
                worker: r.try_get("worker")?,
                last_event_at: r.try_get("last_at")?,
                claims: r.try_get("claims")?,
                steps: r.try_get("steps")?,
                stale_refusals: r.try_get("stale")?,
                jobs_in_flight: r.try_get("flight")?,
                connections: r.try_get("conns")?,
                lease_id: r.try_get("lease_id")?,
                health: r.try_get("health")?,
                reported_in_flight: r.try_get("rep_flight")?,
                max_in_flight: r.try_get("max_in_flight")?,
                reported_at: r.try_get("reported_at")?,
            })
        };
        Ok(rows.iter().map(worker).collect::<Result<_, _>>()?)
    }

    /// Notes a refused stale write in the job's history (`stale_refused`), on a
    /// connection of its own (the refused transaction rolls back). Best effort:
    /// bounded by one second, a failure is logged, never returned.
    pub(crate) async fn record_refusal(
        &self,
        err: &FenceError,
        token: FencingToken,
        step: Option<StepIndex>,
        at: &str,
    ) {
        let FenceError::FencedOut {
            job_id, current, ..
        } = err
        else {
            return;
        };
        let step = step.map(|s| i32::try_from(s.get()).unwrap_or(i32::MAX));
        let sql = format!(
            "SELECT {}($1, $2, $3, $4, $5)",
            self.table("tenure_record_refusal")
        );
        let insert = sqlx::query(&sql)
            .bind(job_id.as_uuid())
            .bind(token.get())
            .bind(current.map(|c| c.get()))
            .bind(step)
            .bind(at)
            .execute(&self.pool);
        match tokio::time::timeout(RECORD_REFUSAL_TIMEOUT, insert).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not record a stale refusal"),
            Err(_) => tracing::warn!("recording a stale refusal timed out"),
        }
    }

    /// Inserts `n` synthetic `done` rows of type `job_type` in one statement
    /// (`INSERT .. SELECT generate_series`), with creation times spread over the
    /// last `n` seconds (each finished a second after it was created), every
    /// 10th `dead` and a takeover on every 100th, each
    /// with the history a finished three-step job leaves on its row (enqueued,
    /// claimed, three steps, the end), then `ANALYZE`s the table: for
    /// benchmarks of the operator's reads on large tables. Returns the rows
    /// inserted.
    ///
    /// # Errors
    /// [`FenceError::Db`].
    #[cfg(feature = "testing")]
    pub async fn insert_synthetic_jobs(&self, job_type: &str, n: i64) -> Result<u64, FenceError> {
        let ev = self.table("tenure_event");
        let event = |kind: &str, step: &str| {
            format!(
                "ROW(at, {kind}, i, NULL, {step}, 'synthetic', 0, (i % 100 = 0)::int, NULL)::{ev}"
            )
        };
        let trail = [
            event("'enqueued'", "0"),
            event("'claimed'", "0"),
            event("'step'", "0"),
            event("'step'", "1"),
            event("'step'", "2"),
            event("status", "3"),
        ]
        .join(", ");
        let done = sqlx::query(&format!(
            "INSERT INTO {} (id, job_type, input, fence, step, status, takeovers, created_at, \
                             updated_at, trail) \
             SELECT gen_random_uuid(), $1, '{{}}'::jsonb, i, 3, status, (i % 100 = 0)::int, at, \
                    at + interval '1 second', ARRAY[{trail}] \
               FROM generate_series(1, $2::bigint) AS i, \
                    LATERAL (SELECT now() - make_interval(secs => i) AS at, \
                       CASE WHEN i % 10 = 0 THEN 'dead' ELSE 'done' END AS status) v",
            self.table("jobs")
        ))
        .bind(job_type)
        .bind(n)
        .execute(&self.pool)
        .await?;
        // Fresh statistics, so that plans are those of a table this size.
        sqlx::query(&format!("ANALYZE {}", self.table("jobs")))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
