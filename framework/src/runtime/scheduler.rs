//! The scheduler: every worker runs for the namespace's one scheduler leader
//! (through `lease`: the key `<ns>/leaders/scheduler` under its session
//! lease). The leader claims the role's fence in PostgreSQL with the key's
//! token, then runs two loops side by side until its session is not
//! `Healthy`, the fence refuses it, or the worker drains:
//!
//! - the ticker enqueues the cron ticks as they come (one fenced transaction
//!   per schedule: tick rows awaiting publication + the schedule's last
//!   tick), looking again at the next tick or after `Tuning::due_poll`. It
//!   needs PostgreSQL only, so a slow or paused NATS, or a backlog of due
//!   jobs, never makes a tick late. A tick is missed only when it is older
//!   than [`Config::missed_tick_after`] (a leader failover plus
//!   `Tuning::schedule_grace`) when the leader first sees it;
//! - the publisher, in rounds: publishes the due jobs (delayed jobs and
//!   enqueued ticks) in batches (through `queue`, `Nats-Msg-Id` = job id)
//!   and marks them published (fenced), starting batches for at most
//!   `Tuning::due_round_budget`; with a `Config::retention`, deletes
//!   finished rows past their age, in batches, fenced, a round at most every
//!   `Retention::every`; then sleeps until the earliest `run_at`, a wake or
//!   `Tuning::due_poll`. A tick the ticker enqueued and a committed
//!   transactional enqueue (`Client::enqueue_in`, the outbox, through a
//!   PostgreSQL `NOTIFY` it listens to while it leads) wake it at once.
//!
//! A worker that is not leader tries again every `Tuning::leader_retry`.
//!
//! A deposed leader's writes are refused by the fence; a publish it makes
//! after its successor's is dropped by the broker's duplicate window or
//! admitted once by the job lock and the job row, so a job never runs twice.
//!
//! [`Config::missed_tick_after`]: crate::Config::missed_tick_after

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::fence::{DueJob, FenceError, JobStatus, ScheduleRow, TickBatch};
use crate::lease::{Campaign, Health, Leadership, Session};
use crate::schedule::Parsed;

use super::Shared;

/// The elected role's name, in etcd and in `leader_fences`.
pub(crate) const ROLE: &str = "scheduler";

/// Publishes in flight at once within a batch.
const PUBLISH_CONCURRENCY: usize = 32;

/// Retention batches per status in one round: a backlog is worked off over
/// rounds, between which due jobs are published.
const PRUNE_BATCHES: usize = 20;

/// Why a leader's round failed.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("postgresql: {0}")]
    Fence(#[from] FenceError),
}

/// What one look at the schedules did.
#[derive(Debug, Default)]
struct Ticked {
    /// Tick rows inserted.
    inserted: u64,
    /// The earliest next tick of any schedule.
    next: Option<chrono::DateTime<chrono::Utc>>,
}

/// One batch of due jobs: how many were due, how many the broker confirmed.
#[derive(Debug, Default)]
struct Batch {
    due: usize,
    published: usize,
}

/// How a publisher round's publishing ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backlog {
    /// The last batch came back short: nothing more is due.
    Cleared,
    /// `Tuning::due_round_budget` passed with full batches: more is due.
    More,
    /// The broker confirmed not every publish: retry after `Tuning::due_poll`.
    Unpublished,
}

/// How long from now until `t`: zero once it has passed, `None` without a `t`.
fn until(t: Option<chrono::DateTime<chrono::Utc>>) -> Option<Duration> {
    t.map(|t| (t - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO))
}

pub(crate) struct Scheduler {
    pub(crate) shared: Arc<Shared>,
    pub(crate) schedules: Vec<Parsed>,
}

impl Scheduler {
    /// Runs for leader until `stop` (or the worker's draining) is cancelled.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let retry = self.shared.cfg.tuning.leader_retry;
        while !self.stopped(&stop) {
            if let Some(session) = self.shared.healthy_session() {
                match session.campaign(ROLE).await {
                    Ok(Campaign::Elected(lead)) => self.lead(&session, lead, &stop).await,
                    Ok(Campaign::Follower) => {}
                    Err(e) => tracing::debug!(error = %e, "scheduler election failed; retrying"),
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.shared.draining.cancelled() => break,
                _ = tokio::time::sleep(retry) => {}
            }
        }
    }

    fn stopped(&self, stop: &CancellationToken) -> bool {
        stop.is_cancelled() || self.shared.draining.is_cancelled()
    }

    /// Leads while the session is healthy and the fence accepts us; resigns
    /// after. Leading is four things at once, ended together through
    /// `leading`: [`Self::end_when_unhealthy`], the ticker
    /// ([`Self::tick_loop`], PostgreSQL only), the publisher
    /// ([`Self::publish_loop`], PostgreSQL and NATS), so a slow broker never
    /// delays a tick, and the watch on stalled consumers (`unstick`, NATS
    /// only).
    async fn lead(&self, session: &Arc<Session>, lead: Leadership, stop: &CancellationToken) {
        let worker = &self.shared.cfg.worker_id;
        if let Err(e) = self
            .shared
            .store
            .claim_leader(ROLE, lead.token(), worker)
            .await
        {
            tracing::warn!(error = %e, token = %lead.token(), "scheduler leader claim refused");
            let _ = session.resign(lead).await;
            return;
        }
        tracing::info!(token = %lead.token(), "elected scheduler leader");
        let leading = stop.child_token();
        let wake = Arc::new(Notify::new());
        let listener = self.listen_outbox(wake.clone());
        tokio::join!(
            self.end_when_unhealthy(session, &leading),
            self.tick_loop(&lead, &leading, &wake),
            self.publish_loop(&lead, &leading, &wake),
            super::unstick::watch_consumers(&self.shared, &leading),
        );
        listener.abort();
        tracing::info!(token = %lead.token(), "scheduler leader steps down");
        if session.health() != Health::Lost {
            let _ = session.resign(lead).await;
        }
    }

    /// Cancels `leading` once the session is not `Healthy` or the worker
    /// drains; returns when `leading` is cancelled, by it or by a loop.
    async fn end_when_unhealthy(&self, session: &Session, leading: &CancellationToken) {
        let mut health = session.watch_health();
        while *health.borrow_and_update() == Health::Healthy {
            tokio::select! {
                _ = leading.cancelled() => return,
                _ = self.shared.draining.cancelled() => break,
                changed = health.changed() => if changed.is_err() { break },
            }
        }
        leading.cancel();
    }

    /// The ticker: enqueues the cron ticks as they come (one fenced
    /// transaction per schedule), waking the publisher when it inserted
    /// some, and looks again at the next tick or after `Tuning::due_poll`,
    /// whichever is first. It needs PostgreSQL only.
    async fn tick_loop(&self, lead: &Leadership, leading: &CancellationToken, wake: &Notify) {
        if self.schedules.is_empty() {
            return;
        }
        let poll = self.shared.cfg.tuning.due_poll;
        while !leading.is_cancelled() {
            let wait = match self.tick_schedules(lead).await {
                Ok(ticked) => {
                    if ticked.inserted > 0 {
                        wake.notify_one();
                    }
                    until(ticked.next).unwrap_or(poll).min(poll)
                }
                Err(e) => match self.round_failed(e, leading) {
                    Some(pause) => pause,
                    None => return,
                },
            };
            tokio::select! {
                _ = leading.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The publisher: publishes due jobs (at most `Tuning::due_round_budget`
    /// of batches per round), prunes, and sleeps until the earliest `run_at`,
    /// a wake (a tick enqueued, a committed transactional enqueue) or
    /// `Tuning::due_poll`. A round cut short by `leading` leaves its
    /// unmarked jobs awaiting: the next leader publishes them again, and the
    /// broker's duplicate window drops the copy.
    async fn publish_loop(&self, lead: &Leadership, leading: &CancellationToken, wake: &Notify) {
        let mut next_prune = Instant::now();
        while !leading.is_cancelled() {
            let round = tokio::select! {
                _ = leading.cancelled() => return,
                round = self.publish_round(lead, &mut next_prune) => round,
            };
            let wait = match round {
                Ok(wait) => wait,
                Err(e) => match self.round_failed(e, leading) {
                    Some(pause) => pause,
                    None => return,
                },
            };
            tokio::select! {
                _ = leading.cancelled() => return,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// A loop's failed round: a deposed leader ends `leading` (`None`);
    /// another error is retried after `Tuning::due_poll`.
    fn round_failed(&self, e: RoundError, leading: &CancellationToken) -> Option<Duration> {
        match e {
            RoundError::Fence(e @ FenceError::LeaderFencedOut { .. }) => {
                tracing::warn!(error = %e, "scheduler leader deposed");
                leading.cancel();
                None
            }
            e => {
                tracing::warn!(error = %e, "scheduler round failed; retrying");
                Some(self.shared.cfg.tuning.due_poll)
            }
        }
    }

    /// The leader's outbox listener: a task that wakes the leader's sleep at
    /// each committed transactional enqueue (`Client::enqueue_in`). A lost
    /// notification costs at most `Tuning::due_poll`; a failed connection is
    /// opened again after that long.
    fn listen_outbox(&self, wake: Arc<Notify>) -> tokio::task::JoinHandle<()> {
        let store = self.shared.store.clone();
        let pause = self.shared.cfg.tuning.due_poll;
        tokio::spawn(async move {
            loop {
                match store.listen_outbox().await {
                    Ok(mut listener) => {
                        while listener.next().await.is_ok() {
                            wake.notify_one();
                        }
                        tracing::warn!("outbox listener lost its connection; listening again");
                    }
                    Err(e) => tracing::warn!(error = %e, "outbox listener failed; retrying"),
                }
                tokio::time::sleep(pause).await;
            }
        })
    }

    /// One publisher round: due jobs for at most `Tuning::due_round_budget`,
    /// then retention if its time came; returns how long to sleep.
    async fn publish_round(
        &self,
        lead: &Leadership,
        next_prune: &mut Instant,
    ) -> Result<Duration, RoundError> {
        let backlog = self.publish_for_a_while(lead).await?;
        let retention = &self.shared.cfg.retention;
        if retention.prunes_rows() && Instant::now() >= *next_prune {
            let more = self.prune(lead).await?;
            *next_prune = if more {
                Instant::now()
            } else {
                Instant::now() + retention.every
            };
        }
        let poll = self.shared.cfg.tuning.due_poll;
        match backlog {
            Backlog::More => Ok(Duration::ZERO),
            Backlog::Unpublished => Ok(poll),
            Backlog::Cleared => {
                let due_in = self.shared.store.next_due_in().await?.unwrap_or(poll);
                Ok(poll.min(due_in))
            }
        }
    }

    /// Publishes batches of due jobs until one comes back short, one fails
    /// to publish, or `Tuning::due_round_budget` has passed (a batch started
    /// before then is finished).
    async fn publish_for_a_while(&self, lead: &Leadership) -> Result<Backlog, RoundError> {
        let tuning = &self.shared.cfg.tuning;
        let until = Instant::now() + tuning.due_round_budget;
        loop {
            let batch = self.publish_due(lead, tuning.due_batch).await?;
            if batch.published < batch.due {
                return Ok(Backlog::Unpublished);
            }
            if batch.due < tuning.due_batch {
                return Ok(Backlog::Cleared);
            }
            if Instant::now() >= until {
                return Ok(Backlog::More);
            }
        }
    }

    /// Deletes finished rows past their retention ([`Config::retention`]),
    /// fenced, up to [`PRUNE_BATCHES`] batches per status; returns whether
    /// more may remain (the next round goes on at once).
    ///
    /// [`Config::retention`]: crate::Config::retention
    async fn prune(&self, lead: &Leadership) -> Result<bool, RoundError> {
        let r = self.shared.cfg.retention;
        let ages = [
            (JobStatus::Done, r.done_after),
            (JobStatus::Cancelled, r.cancelled_after),
            (JobStatus::Dead, r.dead_after),
        ];
        let mut more = false;
        for (status, age) in ages {
            let Some(age) = age else { continue };
            let mut pruned = 0;
            let mut full = true;
            for _ in 0..PRUNE_BATCHES {
                let n = self
                    .shared
                    .store
                    .prune_jobs_as_leader(ROLE, lead.token(), status, age, r.batch)
                    .await?;
                pruned += n;
                full = n >= r.batch as u64;
                if !full {
                    break;
                }
            }
            more |= full;
            if pruned > 0 {
                tracing::info!(%status, pruned, "finished jobs past retention deleted");
            }
        }
        if let Some(age) = r.keys_after {
            let store = &self.shared.store;
            let n = store
                .prune_tombstones_as_leader(ROLE, lead.token(), age, r.batch)
                .await?;
            more |= n >= r.batch as u64;
        }
        Ok(more)
    }

    /// Decides and writes every schedule's ticks.
    async fn tick_schedules(&self, lead: &Leadership) -> Result<Ticked, RoundError> {
        let rows = self.shared.store.schedules().await?;
        // One `now` per look: schedules with the same expression decide alike.
        let now = chrono::Utc::now();
        let mut ticked = Ticked::default();
        for p in &self.schedules {
            let Some(row) = rows.iter().find(|r| r.name == p.def.name()) else {
                continue;
            };
            let one = self.tick_one(lead, p, row, now).await?;
            ticked.inserted += one.inserted;
            ticked.next = match (ticked.next, one.next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(ticked)
    }

    async fn tick_one(
        &self,
        lead: &Leadership,
        p: &Parsed,
        row: &ScheduleRow,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Ticked, RoundError> {
        let after = row.last_tick.unwrap_or(row.created_at);
        let plan = p
            .plan(after, now, self.shared.cfg.missed_tick_after())
            .held(row.paused_at.is_some(), row.resumed_at);
        if plan.last.is_none() && row.next_tick.is_some() {
            return Ok(Ticked {
                inserted: 0,
                next: plan.next,
            });
        }
        let batch = TickBatch {
            name: &row.name,
            job_type: &row.job_type,
            input: &row.input,
            ticks: &plan.enqueue,
            skipped: plan.skipped,
            last_tick: plan.last.unwrap_or(after),
            next_tick: plan.next,
        };
        // A cron job's trace begins here: the rows keep this span's context.
        let span = tracing::info_span!("tenure.schedule_tick", schedule = %row.name);
        let written = self
            .shared
            .store
            .enqueue_ticks(ROLE, lead.token(), &batch)
            .instrument(span)
            .await;
        let inserted = match written {
            Ok(n) => n,
            // Paused since this look: nothing was written; the next look
            // (within `Tuning::due_poll`) reads the pause and skips.
            Err(e @ FenceError::SchedulePaused { .. }) => {
                tracing::info!(schedule = %row.name, error = %e, "schedule paused; its ticks refused");
                0
            }
            Err(e) => return Err(e.into()),
        };
        if row.paused_at.is_some() {
            tracing::debug!(schedule = %row.name, skipped = plan.skipped, "paused schedule's ticks skipped");
        } else if plan.skipped > 0 {
            tracing::warn!(schedule = %row.name, skipped = plan.skipped, "missed cron ticks skipped");
        }
        tracing::debug!(schedule = %row.name, inserted, "cron ticks enqueued");
        Ok(Ticked {
            inserted,
            next: plan.next,
        })
    }

    /// Publishes up to `batch` due jobs and marks the published ones (fenced).
    /// Unpublished ones stay awaiting: a later round retries them.
    async fn publish_due(&self, lead: &Leadership, batch: usize) -> Result<Batch, RoundError> {
        // Locked until marked: a reschedule waits for the mark, then finds
        // the job published (migration 0019).
        let locked = self.shared.store.lock_due(batch).await?;
        let due = locked.jobs.len();
        if due == 0 {
            return Ok(Batch::default());
        }
        let mut published = Vec::with_capacity(due);
        for chunk in locked.jobs.chunks(PUBLISH_CONCURRENCY) {
            let sent = futures::future::join_all(chunk.iter().map(|job| self.publish(job))).await;
            published.extend(sent.into_iter().flatten());
        }
        let marked = locked
            .mark_published(ROLE, lead.token(), &published)
            .await?;
        tracing::debug!(
            due,
            published = published.len(),
            marked,
            "due jobs published"
        );
        Ok(Batch {
            due,
            published: published.len(),
        })
    }

    /// Publishes `job` inside a span whose parent is the producer's trace
    /// context from the row, so its message carries that trace on.
    async fn publish(&self, job: &DueJob) -> Option<crate::JobId> {
        let payload = serde_json::to_vec(&job.input).ok()?;
        let late = chrono::Utc::now() - job.run_at;
        let span = tracing::info_span!("tenure.publish_due", job_id = %job.id);
        let parent = crate::telemetry::propagation::from_row_value(job.trace_context.as_ref());
        crate::telemetry::propagation::set_parent(&span, parent);
        let sent = self
            .shared
            .queue
            .publish_job_with_priority(job.id, &job.job_type, payload.into(), job.priority)
            .instrument(span)
            .await;
        match sent {
            Ok(_) => {
                tracing::debug!(job_id = %job.id, late_ms = late.num_milliseconds(), "due job published");
                Some(job.id)
            }
            Err(e) => {
                tracing::warn!(job_id = %job.id, error = %e, "publishing a due job failed; retrying next round");
                None
            }
        }
    }
}
