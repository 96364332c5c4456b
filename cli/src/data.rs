//! What the CLI prints with `--json` and what the web view shows: one set of
//! views and one set of reads, all through `tenure::blocks::fence` (job rows and their
//! history), `tenure::blocks::queue` (the DLQ) and `tenure::Client` (redrive). No SQL
//! here.

use std::time::Duration;

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tenure::blocks::fence::{
    FenceStore, JobCursor, JobEvent, JobFilter, JobRow, JobStatus, LeaderRow, LimitsSeen, Overview,
    PartitionOwner, ScheduleRow, WorkerSeen,
};
use tenure::blocks::queue::{DeadLetter, Queue};
use tenure::{Client, ClientError, EnqueueOptions, JobId, Priority};

use crate::ctx::{Ctx, describe};

/// The window of the overview's rates and of the workers page.
pub const WINDOW: Duration = Duration::from_secs(3600);

/// DLQ entries scanned per page.
const DLQ_PAGE: usize = 500;

/// DLQ entries scanned at most when looking for a reason.
const DLQ_SCAN_MAX: usize = 10_000;

/// DLQ entries of one job shown at most (read by the job's subject).
const DLQ_OF_JOB_MAX: usize = 100;

/// One job row as printed.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: String,
    pub job_type: String,
    pub status: String,
    pub fence: i64,
    pub step: u32,
    pub takeovers: u32,
    pub attempts: u32,
    pub released: bool,
    pub last_error: Option<String>,
    pub cancel_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Why a pending job is not running: `no worker registered` when no live
    /// worker registers its type (it waits in the stream until one does).
    pub waiting: Option<String>,
    /// When a delayed job is due.
    pub run_at: Option<DateTime<Utc>>,
    /// Whether it still waits to be published (delayed: no message yet).
    pub awaiting_publish: bool,
    /// Its priority level (`high`, `normal`, `low`).
    pub priority: Priority,
}

/// What a pending job of a type no live worker registers shows.
pub const NO_WORKER: &str = "no worker registered";

/// Marks the pending jobs of `views` whose type no live worker registers.
async fn mark_waiting(ctx: &Ctx, store: &FenceStore, views: &mut [JobView]) -> anyhow::Result<()> {
    if !views.iter().any(|v| v.status == "pending") {
        return Ok(());
    }
    let routed = ctx
        .call(
            &ctx.postgres(),
            "reading the workers' job types",
            store.registered_job_types(),
        )
        .await?;
    for v in views.iter_mut() {
        if v.status == "pending" && !routed.contains(&v.job_type) {
            v.waiting = Some(NO_WORKER.to_string());
        }
    }
    Ok(())
}

impl From<&JobRow> for JobView {
    fn from(r: &JobRow) -> Self {
        JobView {
            id: r.id.to_string(),
            job_type: r.job_type.clone(),
            status: r.status.to_string(),
            fence: r.fence,
            step: r.step.get(),
            takeovers: r.takeovers,
            attempts: r.attempts,
            released: r.released,
            last_error: r.last_error.clone(),
            cancel_reason: r.cancel_reason.clone(),
            created_at: r.created_at,
            updated_at: r.updated_at,
            waiting: None,
            run_at: r.run_at,
            awaiting_publish: r.awaiting_publish,
            priority: r.priority,
        }
    }
}

/// One job with its history and its DLQ entries (`tenure job --json`, the job page).
#[derive(Debug, Clone, Serialize)]
pub struct JobDetail {
    #[serde(flatten)]
    pub job: JobView,
    /// The checkpoint (output of the last committed step).
    pub checkpoint: Option<serde_json::Value>,
    /// The step names the row recorded (its definition's), if any.
    pub step_names: Option<Vec<String>>,
    /// Their fingerprint.
    pub steps_fingerprint: Option<String>,
    /// Since when workers whose definitions do not fit have been handing it back.
    pub incompatible_since: Option<DateTime<Utc>>,
    /// The job's history, oldest first.
    pub events: Vec<JobEvent>,
    /// Its entries in the DLQ.
    pub dead_letters: Vec<DeadLetterView>,
}

/// One DLQ entry as printed.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterView {
    pub dlq_sequence: u64,
    pub job_id: Option<String>,
    pub job_type: Option<String>,
    pub reason: String,
    pub deliveries: Option<u64>,
    pub attempts: Option<u32>,
    pub takeovers: Option<u32>,
    pub last_token: Option<i64>,
}

impl DeadLetterView {
    /// The reason's code: the text before the first `:` (`max_retries`, ...).
    pub fn reason_code(&self) -> &str {
        self.reason
            .split_once(':')
            .map_or(self.reason.as_str(), |(code, _)| code)
            .trim()
    }
}

impl From<&DeadLetter> for DeadLetterView {
    fn from(d: &DeadLetter) -> Self {
        DeadLetterView {
            dlq_sequence: d.dlq_sequence,
            job_id: d.job_id.map(|j| j.to_string()),
            job_type: d.job_type.clone(),
            reason: d.reason.clone(),
            deliveries: d.deliveries,
            attempts: d.attempts,
            takeovers: d.takeovers,
            last_token: d.last_token.map(|t| t.get()),
        }
    }
}

/// What a redrive did.
#[derive(Debug, Clone, Serialize)]
pub struct RedriveView {
    pub job_id: String,
    pub messages: usize,
}

/// What a cancel did (`tenure cancel`).
#[derive(Debug, Clone, Serialize)]
pub struct CancelView {
    pub job_id: String,
    /// `cancelled` (now) or `already cancelled`.
    pub outcome: &'static str,
}

/// A worker (`tenure workers`): what PostgreSQL saw of it, and the
/// partitions (partition mode) whose last claim is its.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerView {
    #[serde(flatten)]
    pub seen: WorkerSeen,
    /// By type and partition; empty with one lock per job.
    pub partitions: Vec<PartitionOwner>,
    /// The limits it runs its types with (its last report), by type.
    pub limits: Vec<LimitsSeen>,
}

/// What a retry-now or a reschedule did (`tenure retry-now`, `tenure
/// reschedule`).
#[derive(Debug, Clone, Serialize)]
pub struct MoveView {
    pub job_id: String,
    /// `started` (retry-now) or `rescheduled to <time>`.
    pub outcome: String,
}

/// What a pause or resume did (`tenure pause`, `tenure resume`).
#[derive(Debug, Clone, Serialize)]
pub struct PauseView {
    pub job_type: String,
    /// `paused`, `already paused`, `resumed` or `not paused`.
    pub outcome: &'static str,
}

/// A paused job type (`tenure paused`).
#[derive(Debug, Clone, Serialize)]
pub struct PausedView {
    pub job_type: String,
    pub paused_at: DateTime<Utc>,
    pub paused_by: Option<String>,
}

/// What a prune did or would do (`tenure prune`).
#[derive(Debug, Clone, Serialize)]
pub struct PruneView {
    /// Nothing was deleted: the counts are what would be.
    pub dry_run: bool,
    /// One entry per status asked for.
    pub statuses: Vec<PruneCount>,
}

/// Jobs of one status deleted (or that would be).
#[derive(Debug, Clone, Serialize)]
pub struct PruneCount {
    pub status: String,
    pub older_than_secs: u64,
    pub jobs: u64,
}

/// The overview (`tenure overview --json`, the overview page).
#[derive(Debug, Clone, Serialize)]
pub struct OverviewView {
    #[serde(flatten)]
    pub rows: Overview,
    pub pending: i64,
    pub running: i64,
    pub done: i64,
    pub dead: i64,
    pub cancelled: i64,
    pub total: i64,
    /// Jobs finished per minute over the window.
    pub throughput_per_min: f64,
    /// (dead + failed attempts) / (done + dead + failed attempts) over the window.
    pub failure_rate: f64,
    /// Entries in the DLQ stream.
    pub dlq_size: u64,
}

/// A page of the job list (the web view's `/api/jobs`).
#[derive(Debug, Clone, Serialize)]
pub struct JobsPage {
    pub jobs: Vec<JobView>,
    /// The cursor of the next page (`after=`), when there may be one.
    pub next: Option<String>,
}

/// The cursor as text: `<created_at RFC 3339>_<job id>`.
pub fn cursor_text(c: &JobCursor) -> String {
    format!(
        "{}_{}",
        c.created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        c.id
    )
}

/// Parses [`cursor_text`]'s output.
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_cursor(s: &str) -> Result<JobCursor, String> {
    let (at, id) = s
        .rsplit_once('_')
        .ok_or_else(|| format!("bad cursor {s:?}: expected <time>_<job id>"))?;
    let created_at = DateTime::parse_from_rfc3339(at)
        .map_err(|e| format!("bad cursor time {at:?}: {e}"))?
        .with_timezone(&Utc);
    let id = id
        .parse::<JobId>()
        .map_err(|e| format!("bad cursor job id {id:?}: {e}"))?;
    Ok(JobCursor { created_at, id })
}

/// `tenure jobs`: up to `limit` rows that pass `filter`, newest first (the
/// web view's order and read). With `key`, the one job of `filter`'s type
/// with that idempotency key, if it passes the rest of `filter`.
pub async fn jobs(
    ctx: &Ctx,
    store: &FenceStore,
    filter: &JobFilter,
    key: Option<&str>,
    limit: u32,
) -> anyhow::Result<Vec<JobView>> {
    let rows = match (key, &filter.job_type) {
        (Some(key), Some(job_type)) => {
            let id = JobId::from_key(job_type, key);
            let row = ctx
                .call(&ctx.postgres(), "reading the job", store.job(id))
                .await?;
            row.into_iter().filter(|r| passes(filter, r)).collect()
        }
        (Some(_), None) => return Err(anyhow!("a key names a job only with its type")),
        (None, _) => {
            ctx.call(
                &ctx.postgres(),
                "listing jobs",
                store.list_jobs_page(filter, None, i64::from(limit)),
            )
            .await?
        }
    };
    let mut views: Vec<JobView> = rows.iter().map(JobView::from).collect();
    mark_waiting(ctx, store, &mut views).await?;
    Ok(views)
}

/// Whether `row` passes `filter` (what `list_jobs_page` asks PostgreSQL).
fn passes(filter: &JobFilter, row: &JobRow) -> bool {
    filter.job_type.as_ref().is_none_or(|t| *t == row.job_type)
        && filter.status.is_none_or(|s| s == row.status)
        && filter.created_since.is_none_or(|t| row.created_at >= t)
        && (!filter.with_takeovers || row.takeovers > 0)
}

pub async fn jobs_page(
    ctx: &Ctx,
    store: &FenceStore,
    filter: &JobFilter,
    after: Option<JobCursor>,
    limit: u32,
) -> anyhow::Result<JobsPage> {
    let rows = ctx
        .call(
            &ctx.postgres(),
            "listing jobs",
            store.list_jobs_page(filter, after, i64::from(limit)),
        )
        .await?;
    let next = match rows.last() {
        Some(last) if rows.len() == limit as usize => Some(cursor_text(&JobCursor::after(last))),
        _ => None,
    };
    let mut jobs: Vec<JobView> = rows.iter().map(JobView::from).collect();
    mark_waiting(ctx, store, &mut jobs).await?;
    Ok(JobsPage { jobs, next })
}

pub async fn job(
    ctx: &Ctx,
    store: &FenceStore,
    queue: Option<&Queue>,
    id: JobId,
) -> anyhow::Result<Option<JobDetail>> {
    let Some(row) = ctx
        .call(&ctx.postgres(), "reading the job", store.job(id))
        .await?
    else {
        return Ok(None);
    };
    let events = ctx
        .call(
            &ctx.postgres(),
            "reading the job's history",
            store.job_events(id),
        )
        .await?;
    let dead_letters = match queue {
        Some(q) => dead_letters_of(ctx, q, id).await?,
        None => Vec::new(),
    };
    Ok(Some(JobDetail {
        job: JobView::from(&row),
        checkpoint: row.checkpoint.clone(),
        step_names: row.step_names.clone(),
        steps_fingerprint: row.steps_fingerprint.clone(),
        incompatible_since: row.incompatible_since,
        events,
        dead_letters,
    }))
}

/// Every DLQ entry (scanning at most [`DLQ_SCAN_MAX`]) with `pred`.
async fn scan_dlq(
    ctx: &Ctx,
    queue: &Queue,
    mut pred: impl FnMut(&DeadLetter) -> bool,
) -> anyhow::Result<Vec<DeadLetter>> {
    let (mut out, mut after, mut seen) = (Vec::new(), 0, 0);
    loop {
        let page = ctx
            .call(
                &ctx.nats(),
                "reading the DLQ",
                queue.dead_letters_after(after, DLQ_PAGE),
            )
            .await?;
        seen += page.len();
        out.extend(page.iter().filter(|d| pred(d)).cloned());
        match page.last() {
            Some(last) if page.len() == DLQ_PAGE && seen < DLQ_SCAN_MAX => {
                after = last.dlq_sequence;
            }
            _ => return Ok(out),
        }
    }
}

async fn dead_letters_of(
    ctx: &Ctx,
    queue: &Queue,
    id: JobId,
) -> anyhow::Result<Vec<DeadLetterView>> {
    let found = ctx
        .call(
            &ctx.nats(),
            "reading the job's DLQ entries",
            queue.dead_letters_of(id, DLQ_OF_JOB_MAX),
        )
        .await?;
    Ok(found.iter().map(DeadLetterView::from).collect())
}

pub async fn dlq(ctx: &Ctx, queue: &Queue, limit: usize) -> anyhow::Result<Vec<DeadLetterView>> {
    let entries = ctx
        .call(&ctx.nats(), "reading the DLQ", queue.dead_letters(limit))
        .await?;
    Ok(entries.iter().map(DeadLetterView::from).collect())
}

pub async fn overview(
    ctx: &Ctx,
    store: &FenceStore,
    queue: &Queue,
) -> anyhow::Result<OverviewView> {
    let rows = ctx
        .call(
            &ctx.postgres(),
            "reading the overview",
            store.overview(WINDOW),
        )
        .await?;
    let stats = ctx
        .call(&ctx.nats(), "reading the queue's counts", queue.stats())
        .await?;
    let r = &rows.recent;
    let finished = r.done + r.dead + r.failed;
    let minutes = (WINDOW.as_secs_f64() / 60.0).max(1.0);
    Ok(OverviewView {
        pending: rows.count(JobStatus::Pending),
        running: rows.count(JobStatus::Running),
        done: rows.count(JobStatus::Done),
        dead: rows.count(JobStatus::Dead),
        cancelled: rows.count(JobStatus::Cancelled),
        total: rows.total(),
        throughput_per_min: r.done as f64 / minutes,
        failure_rate: if finished == 0 {
            0.0
        } else {
            (r.dead + r.failed) as f64 / finished as f64
        },
        dlq_size: stats.dlq_messages,
        rows,
    })
}

pub async fn workers(ctx: &Ctx, store: &FenceStore) -> anyhow::Result<Vec<WorkerView>> {
    let pg = ctx.postgres();
    let seen = ctx.call(&pg, "reading the workers", store.workers_seen(WINDOW));
    let owners = ctx.call(
        &pg,
        "reading the partition owners",
        store.partition_owners(),
    );
    let limits = ctx.call(&pg, "reading the workers' limits", store.type_limits());
    let (seen, owners, limits) = tokio::try_join!(seen, owners, limits)?;
    let mut views = with_partitions(seen, owners);
    for v in &mut views {
        let own = limits.iter().filter(|l| l.worker == v.seen.worker);
        v.limits = own.cloned().collect();
    }
    Ok(views)
}

/// Each worker with the partitions whose last claim is its; a partition
/// owner the window did not see gets a row of its own (no report, no event).
fn with_partitions(seen: Vec<WorkerSeen>, owners: Vec<PartitionOwner>) -> Vec<WorkerView> {
    let mut views: Vec<WorkerView> = seen
        .into_iter()
        .map(|seen| WorkerView {
            seen,
            partitions: Vec::new(),
            limits: Vec::new(),
        })
        .collect();
    for owner in owners {
        let at = match views.iter().position(|v| v.seen.worker == owner.worker) {
            Some(at) => at,
            None => {
                views.push(WorkerView {
                    seen: unseen(&owner.worker),
                    partitions: Vec::new(),
                    limits: Vec::new(),
                });
                views.len() - 1
            }
        };
        views[at].partitions.push(owner);
    }
    views
}

/// A worker of which the window holds nothing.
fn unseen(worker: &str) -> WorkerSeen {
    WorkerSeen {
        worker: worker.to_string(),
        last_event_at: None,
        claims: 0,
        steps: 0,
        stale_refusals: 0,
        jobs_in_flight: 0,
        connections: 0,
        lease_id: None,
        health: None,
        reported_in_flight: None,
        max_in_flight: None,
        reported_at: None,
    }
}

/// The cron schedules and the scheduler leader PostgreSQL last accepted.
#[derive(Debug, Clone, Serialize)]
pub struct SchedulesView {
    /// The scheduler leader: worker, token (the role's fence), since when.
    pub leader: Option<LeaderView>,
    pub schedules: Vec<ScheduleView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaderView {
    pub worker: String,
    pub token: i64,
    pub since: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScheduleView {
    pub name: String,
    pub job_type: String,
    pub expr: String,
    pub time_zone: String,
    pub missed: String,
    pub last_tick: Option<DateTime<Utc>>,
    pub next_tick: Option<DateTime<Utc>>,
    pub enqueued: i64,
    pub skipped: i64,
    /// Since when it is paused (`None`: it runs).
    pub paused_at: Option<DateTime<Utc>>,
    /// Who paused it (the pausing tool's `application_name`).
    pub paused_by: Option<String>,
}

impl From<&ScheduleRow> for ScheduleView {
    fn from(r: &ScheduleRow) -> Self {
        ScheduleView {
            name: r.name.clone(),
            job_type: r.job_type.clone(),
            expr: r.expr.clone(),
            time_zone: r.time_zone.clone(),
            missed: r.missed.clone(),
            last_tick: r.last_tick,
            next_tick: r.next_tick,
            enqueued: r.enqueued,
            skipped: r.skipped,
            paused_at: r.paused_at,
            paused_by: r.paused_by.clone(),
        }
    }
}

impl From<LeaderRow> for LeaderView {
    fn from(r: LeaderRow) -> Self {
        LeaderView {
            worker: r.worker,
            token: r.fence,
            since: r.since,
        }
    }
}

pub async fn schedules(ctx: &Ctx, store: &FenceStore) -> anyhow::Result<SchedulesView> {
    let rows = ctx
        .call(&ctx.postgres(), "reading the schedules", store.schedules())
        .await?;
    let leader = ctx
        .call(
            &ctx.postgres(),
            "reading the scheduler leader",
            store.leader("scheduler"),
        )
        .await?;
    Ok(SchedulesView {
        leader: leader.map(Into::into),
        schedules: rows.iter().map(ScheduleView::from).collect(),
    })
}

/// What a schedule's pause, resume or trigger did (`tenure schedule ...`,
/// the web view's buttons).
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleControlView {
    pub schedule: String,
    /// `paused`, `already paused`, `resumed`, `not paused`, `triggered` or
    /// `already triggered`.
    pub outcome: &'static str,
    /// The triggered job.
    pub job_id: Option<JobId>,
}

impl ScheduleControlView {
    /// One line: `paused nightly`, `triggered nightly: job <id>`.
    pub fn line(&self) -> String {
        match self.job_id {
            Some(id) => format!("{} {}: job {id}", self.outcome, self.schedule),
            None => format!("{} {}", self.outcome, self.schedule),
        }
    }
}

/// Within the context's timeout, or the error says what was being done.
async fn bounded<T>(
    ctx: &Ctx,
    doing: String,
    call: impl std::future::Future<Output = Result<T, tenure::ClientError>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(ctx.timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(anyhow!("{doing}: {}", describe(&e))),
        Err(_) => Err(anyhow!("{doing}: no answer within {:?}", ctx.timeout)),
    }
}

/// Pauses (`pause`) or resumes schedule `name` through
/// [`Client::pause_schedule`] or [`Client::resume_schedule`]; an unknown
/// schedule is the client's typed error, said as it is.
pub async fn control_schedule(
    ctx: &Ctx,
    client: &Client,
    name: &str,
    pause: bool,
) -> anyhow::Result<ScheduleControlView> {
    let changed = if pause {
        let doing = format!("pausing schedule {name}");
        bounded(ctx, doing, client.pause_schedule(name)).await?
    } else {
        let doing = format!("resuming schedule {name}");
        bounded(ctx, doing, client.resume_schedule(name)).await?
    };
    let outcome = match (pause, changed) {
        (true, true) => "paused",
        (true, false) => "already paused",
        (false, true) => "resumed",
        (false, false) => "not paused",
    };
    Ok(ScheduleControlView {
        schedule: name.to_string(),
        outcome,
        job_id: None,
    })
}

/// Runs schedule `name`'s job now under trigger id `id`
/// ([`Client::trigger_schedule`]); the same id again is the same job.
pub async fn trigger_schedule(
    ctx: &Ctx,
    client: &Client,
    name: &str,
    id: &str,
) -> anyhow::Result<ScheduleControlView> {
    let doing = format!("triggering schedule {name}");
    let e = bounded(ctx, doing, client.trigger_schedule(name, id)).await?;
    Ok(ScheduleControlView {
        schedule: name.to_string(),
        outcome: if e.duplicate {
            "already triggered"
        } else {
            "triggered"
        },
        job_id: Some(e.job_id),
    })
}

/// The distinct job ids of DLQ entries whose reason is `reason` or starts with
/// `reason:` (the runtime writes `<code>: <text>`).
pub async fn jobs_with_reason(
    ctx: &Ctx,
    queue: &Queue,
    reason: &str,
) -> anyhow::Result<Vec<JobId>> {
    let found = scan_dlq(ctx, queue, |d| {
        d.reason == reason
            || d.reason
                .strip_prefix(reason)
                .is_some_and(|rest| rest.starts_with(':'))
    })
    .await?;
    let mut ids = Vec::new();
    for id in found.iter().filter_map(|d| d.job_id) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Redrives `ids`; a job that is not dead is skipped with a note in `skipped`.
pub async fn redrive(
    ctx: &Ctx,
    client: &Client,
    ids: Vec<JobId>,
    skipped: &mut Vec<String>,
) -> anyhow::Result<Vec<RedriveView>> {
    let mut done = Vec::new();
    for id in ids {
        let moved = tokio::time::timeout(ctx.timeout, client.redrive(id)).await;
        match moved {
            Ok(Ok(messages)) => done.push(RedriveView {
                job_id: id.to_string(),
                messages,
            }),
            Ok(Err(e @ ClientError::NotDead { .. })) => skipped.push(e.to_string()),
            Ok(Err(e)) => return Err(anyhow!("redriving {id}: {}", describe(&e))),
            Err(_) => {
                return Err(anyhow!(
                    "redriving {id}: no answer within {:?}",
                    ctx.timeout
                ));
            }
        }
    }
    Ok(done)
}

/// Cancels `id` through [`Client::cancel`]; an unknown or finished job is
/// the client's typed error, said as it is.
pub async fn cancel(
    ctx: &Ctx,
    client: &Client,
    id: JobId,
    reason: &str,
) -> anyhow::Result<CancelView> {
    let outcome = match tokio::time::timeout(ctx.timeout, client.cancel(id, reason)).await {
        Ok(Ok(tenure::Cancelled::Now)) => "cancelled",
        Ok(Ok(tenure::Cancelled::Already)) => "already cancelled",
        Ok(Err(e)) => return Err(anyhow!("cancelling {id}: {}", describe(&e))),
        Err(_) => {
            return Err(anyhow!(
                "cancelling {id}: no answer within {:?}",
                ctx.timeout
            ));
        }
    };
    Ok(CancelView {
        job_id: id.to_string(),
        outcome,
    })
}

/// Runs an operator's retry-now or reschedule: `Ok(Err(why))` when the
/// client refused it (an unknown job, a job in another state, a time too far
/// ahead: said as it is, nothing changed), `Err` when the servers failed.
async fn operator_move(
    ctx: &Ctx,
    what: &str,
    moved: impl std::future::Future<Output = Result<(), ClientError>>,
) -> anyhow::Result<Result<(), String>> {
    match tokio::time::timeout(ctx.timeout, moved).await {
        Ok(Ok(())) => Ok(Ok(())),
        Ok(Err(
            e @ (ClientError::UnknownJob(_)
            | ClientError::CannotRetryNow { .. }
            | ClientError::CannotReschedule { .. }
            | ClientError::DelayTooLong { .. }),
        )) => Ok(Err(format!("{what}: {e}"))),
        Ok(Err(e)) => Err(anyhow!("{what}: {}", describe(&e))),
        Err(_) => Err(anyhow!("{what}: no answer within {:?}", ctx.timeout)),
    }
}

/// Starts `id` now through [`Client::retry_now`] (see `operator_move`).
pub async fn retry_now(
    ctx: &Ctx,
    client: &Client,
    id: JobId,
) -> anyhow::Result<Result<MoveView, String>> {
    let done = operator_move(ctx, &format!("retrying {id} now"), client.retry_now(id)).await?;
    Ok(done.map(|()| MoveView {
        job_id: id.to_string(),
        outcome: "started".into(),
    }))
}

/// Moves `id`'s `run_at` through [`Client::reschedule`] (see `operator_move`).
pub async fn reschedule(
    ctx: &Ctx,
    client: &Client,
    id: JobId,
    run_at: DateTime<Utc>,
) -> anyhow::Result<Result<MoveView, String>> {
    let what = format!("rescheduling {id}");
    let done = operator_move(ctx, &what, client.reschedule(id, run_at)).await?;
    let at = run_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    Ok(done.map(|()| MoveView {
        job_id: id.to_string(),
        outcome: format!("rescheduled to {at}"),
    }))
}

/// Pauses (`pause`) or resumes `job_type` through [`Client::pause`] or
/// [`Client::resume`]; a name no job type can have is the client's typed
/// error, said as it is.
pub async fn pause(
    ctx: &Ctx,
    client: &Client,
    job_type: &str,
    pause: bool,
) -> anyhow::Result<PauseView> {
    let verb = if pause { "pausing" } else { "resuming" };
    let changed = async {
        match pause {
            true => client.pause(job_type).await,
            false => client.resume(job_type).await,
        }
    };
    let changed = match tokio::time::timeout(ctx.timeout, changed).await {
        Ok(Ok(changed)) => changed,
        Ok(Err(e)) => return Err(anyhow!("{verb} {job_type}: {}", describe(&e))),
        Err(_) => {
            return Err(anyhow!(
                "{verb} {job_type}: no answer within {:?}",
                ctx.timeout
            ));
        }
    };
    let outcome = match (pause, changed) {
        (true, true) => "paused",
        (true, false) => "already paused",
        (false, true) => "resumed",
        (false, false) => "not paused",
    };
    Ok(PauseView {
        job_type: job_type.to_string(),
        outcome,
    })
}

/// The paused job types (what [`Client::paused`] reads).
pub async fn paused(ctx: &Ctx, store: &FenceStore) -> anyhow::Result<Vec<PausedView>> {
    let rows = match tokio::time::timeout(ctx.timeout, store.paused_types()).await {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return Err(anyhow!("reading the paused types: {}", describe(&e))),
        Err(_) => {
            return Err(anyhow!(
                "reading the paused types: no answer within {:?}",
                ctx.timeout
            ));
        }
    };
    Ok(rows
        .into_iter()
        .map(|p| PausedView {
            job_type: p.job_type,
            paused_at: p.paused_at,
            paused_by: p.paused_by,
        })
        .collect())
}

/// Deletes (or with `dry_run`, counts) the finished jobs of each status
/// older than its age, `batch` rows per statement, until none is left.
pub async fn prune(
    ctx: &Ctx,
    store: &FenceStore,
    ages: &[(JobStatus, Duration)],
    batch: usize,
    dry_run: bool,
) -> anyhow::Result<PruneView> {
    let mut statuses = Vec::new();
    for &(status, age) in ages {
        let jobs = if dry_run {
            within(ctx, store.prunable(status, age)).await?
        } else {
            let mut total = 0;
            loop {
                let n = within(ctx, store.prune_jobs(status, age, batch)).await?;
                total += n;
                if n < batch as u64 {
                    break total;
                }
            }
        };
        statuses.push(PruneCount {
            status: status.to_string(),
            older_than_secs: age.as_secs(),
            jobs,
        });
    }
    Ok(PruneView { dry_run, statuses })
}

/// What `tenure migrate` refuses before it changes anything.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A role to grant to does not exist in the server.
    #[error(
        "PostgreSQL role {role:?} does not exist: create it first (CREATE ROLE ... LOGIN), \
         then run migrate again; nothing was migrated or granted"
    )]
    UnknownRole {
        /// The role given.
        role: String,
    },
}

/// Which privileges a role was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Privileges {
    /// What running jobs needs (`FenceStore::grant_worker`).
    Worker,
    /// What enqueueing needs (`FenceStore::grant_producer`).
    Producer,
    /// An operator's reads and calls (`FenceStore::grant_operator`).
    Operator,
}

impl std::fmt::Display for Privileges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Privileges::Worker => "worker",
            Privileges::Producer => "producer",
            Privileges::Operator => "operator",
        })
    }
}

/// One grant `tenure migrate` made (granting again changes nothing).
#[derive(Debug, Clone, Serialize)]
pub struct GrantView {
    pub role: String,
    pub privileges: Privileges,
}

/// What `tenure migrate` did.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateView {
    pub schema: String,
    /// The versions this run applied (empty: the schema was up to date).
    pub applied: Vec<i64>,
    /// How many were applied before this run.
    pub up_to_date: usize,
    pub grants: Vec<GrantView>,
}

/// Checks that every role of `grants` exists, applies the migrations, then
/// grants; a missing role is [`MigrateError::UnknownRole`] before anything
/// is changed.
pub async fn migrate(
    ctx: &Ctx,
    store: &FenceStore,
    grants: &[(Privileges, String)],
) -> anyhow::Result<MigrateView> {
    let pg = ctx.postgres();
    for (_, role) in grants {
        if !ctx
            .call(&pg, "reading the roles", store.role_exists(role))
            .await?
        {
            return Err(MigrateError::UnknownRole { role: role.clone() }.into());
        }
    }
    let reading = "reading the applied migrations";
    let before = ctx.call(&pg, reading, store.applied_migrations()).await?;
    // Migrating may wait for another migrator's lock: not bounded by --timeout.
    store.migrate().await.map_err(|e| {
        anyhow!(
            "migrating schema {:?}: {pg}: {}",
            store.schema(),
            describe(&e)
        )
    })?;
    let after = ctx.call(&pg, reading, store.applied_migrations()).await?;
    let mut done = Vec::new();
    for (privileges, role) in grants {
        let grant = match privileges {
            Privileges::Worker => store.grant_worker(role).await,
            Privileges::Producer => store.grant_producer(role).await,
            Privileges::Operator => store.grant_operator(role).await,
        };
        grant.map_err(|e| {
            anyhow!(
                "granting {privileges} privileges to {role}: {}",
                describe(&e)
            )
        })?;
        done.push(GrantView {
            role: role.clone(),
            privileges: *privileges,
        });
    }
    Ok(MigrateView {
        schema: store.schema().to_string(),
        applied: after.into_iter().filter(|v| !before.contains(v)).collect(),
        up_to_date: before.len(),
        grants: done,
    })
}

/// What `tenure enqueue` did.
#[derive(Debug, Clone, Serialize)]
pub struct EnqueueView {
    pub job_id: String,
    pub job_type: String,
    pub key: String,
    /// The job existed already: nothing new was enqueued.
    pub duplicate: bool,
    /// When it is due, if asked for (`--at`, `--after`).
    pub run_at: Option<DateTime<Utc>>,
    /// The level asked for (`--priority`; a duplicate keeps its own).
    pub priority: Priority,
}

/// Enqueues through [`Client::enqueue_json_with`]: the producers' path,
/// idempotency key, delay and priority and all.
pub async fn enqueue(
    ctx: &Ctx,
    client: &Client,
    (job_type, key): (&str, &str),
    input: serde_json::Value,
    options: EnqueueOptions,
) -> anyhow::Result<EnqueueView> {
    let enqueue = client.enqueue_json_with(job_type, key, input, options);
    let done = match tokio::time::timeout(ctx.timeout, enqueue).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return Err(anyhow!("enqueuing {job_type} {key:?}: {}", describe(&e))),
        Err(_) => {
            return Err(anyhow!(
                "enqueuing {job_type} {key:?}: no answer within {:?}; the job may or may \
                 not exist: enqueue again (same key) to be sure",
                ctx.timeout
            ));
        }
    };
    Ok(EnqueueView {
        job_id: done.job_id.to_string(),
        job_type: job_type.to_string(),
        key: key.to_string(),
        duplicate: done.duplicate,
        run_at: options.get_run_at(),
        priority: options.get_priority(),
    })
}

/// `f` within the CLI's timeout, its error said as it is.
async fn within<T>(
    ctx: &Ctx,
    f: impl std::future::Future<Output = Result<T, tenure::blocks::fence::FenceError>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(ctx.timeout, f).await {
        Ok(r) => r.map_err(|e| anyhow!("pruning: {e}")),
        Err(_) => Err(anyhow!("pruning: no answer within {:?}", ctx.timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_bad_cursors_say_why() {
        let c = JobCursor {
            created_at: DateTime::parse_from_rfc3339("2026-01-02T03:04:05.123456Z")
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or_default(),
            id: JobId::from_key("t", "k"),
        };
        assert_eq!(parse_cursor(&cursor_text(&c)), Ok(c));
        assert!(parse_cursor("nope").is_err_and(|e| e.contains("expected")));
        assert!(parse_cursor("2026_x").is_err_and(|e| e.contains("time")));
    }
}
