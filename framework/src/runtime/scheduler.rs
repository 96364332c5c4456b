//! The scheduler: every worker runs for the namespace's one scheduler leader
//! (through `lease`: the key `<ns>/leaders/scheduler` under its session
//! lease). The leader claims the role's fence in PostgreSQL with the key's
//! token, then, in rounds: enqueues the cron ticks that came (one fenced
//! transaction per schedule: tick rows + the schedule's last tick), publishes
//! the due delayed jobs in batches (through `queue`, `Nats-Msg-Id` = job id)
//! and marks them published (fenced), and sleeps until the earliest `run_at`,
//! the next tick, or `Tuning::due_poll`, whichever comes first; a committed
//! transactional enqueue (`Client::enqueue_in`, the outbox) wakes it at once
//! through a PostgreSQL `NOTIFY` it listens to while it leads. With a
//! `Config::retention`, it also deletes finished rows past their age, in
//! batches, fenced, a round at most every `Retention::every`. A worker that
//! is not leader tries again every `Tuning::leader_retry`.
//!
//! A deposed leader's writes are refused by the fence; a publish it makes
//! after its successor's is dropped by the broker's duplicate window or
//! admitted once by the job lock and the job row, so a job never runs twice.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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

    /// Leads while the session is healthy and the fence accepts us; resigns after.
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
        let wake = Arc::new(Notify::new());
        let listener = self.listen_outbox(wake.clone());
        let poll = self.shared.cfg.tuning.due_poll;
        let mut next_prune = Instant::now();
        while !self.stopped(stop) && session.health() == Health::Healthy {
            let wait = match self.round(&lead, &mut next_prune).await {
                Ok(wait) => wait,
                Err(RoundError::Fence(e @ FenceError::LeaderFencedOut { .. })) => {
                    tracing::warn!(error = %e, "scheduler leader deposed");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "scheduler round failed; retrying");
                    poll
                }
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.shared.draining.cancelled() => break,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        listener.abort();
        tracing::info!(token = %lead.token(), "scheduler leader steps down");
        if session.health() != Health::Lost {
            let _ = session.resign(lead).await;
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

    /// One round: ticks, then due jobs until a batch comes back short; returns
    /// how long to sleep.
    async fn round(
        &self,
        lead: &Leadership,
        next_prune: &mut Instant,
    ) -> Result<Duration, RoundError> {
        let next_tick = self.tick_schedules(lead).await?;
        let batch = self.shared.cfg.tuning.due_batch;
        while self.publish_due(lead, batch).await? >= batch {}
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
        let due_in = self.shared.store.next_due_in().await?.unwrap_or(poll);
        let tick_in = next_tick
            .and_then(|t| (t - chrono::Utc::now()).to_std().ok())
            .unwrap_or(poll);
        Ok(poll.min(due_in).min(tick_in))
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

    /// Decides and writes every schedule's ticks; returns the earliest next tick.
    async fn tick_schedules(
        &self,
        lead: &Leadership,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, RoundError> {
        if self.schedules.is_empty() {
            return Ok(None);
        }
        let rows = self.shared.store.schedules().await?;
        // One `now` per round: schedules with the same expression decide alike.
        let now = chrono::Utc::now();
        let mut earliest: Option<chrono::DateTime<chrono::Utc>> = None;
        for p in &self.schedules {
            let Some(row) = rows.iter().find(|r| r.name == p.def.name()) else {
                continue;
            };
            let next = self.tick_one(lead, p, row, now).await?;
            earliest = match (earliest, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(earliest)
    }

    async fn tick_one(
        &self,
        lead: &Leadership,
        p: &Parsed,
        row: &ScheduleRow,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, RoundError> {
        let after = row.last_tick.unwrap_or(row.created_at);
        let plan = p.plan(after, now, self.shared.cfg.tuning.schedule_grace);
        if plan.last.is_none() && row.next_tick.is_some() {
            return Ok(plan.next);
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
        let inserted = self
            .shared
            .store
            .enqueue_ticks(ROLE, lead.token(), &batch)
            .await?;
        if plan.skipped > 0 {
            tracing::warn!(schedule = %row.name, skipped = plan.skipped, "missed cron ticks skipped");
        }
        tracing::debug!(schedule = %row.name, inserted, "cron ticks enqueued");
        Ok(plan.next)
    }

    /// Publishes up to `batch` due jobs and marks the published ones (fenced);
    /// returns how many were due.
    async fn publish_due(&self, lead: &Leadership, batch: usize) -> Result<usize, RoundError> {
        let due = self.shared.store.due_jobs(batch).await?;
        if due.is_empty() {
            return Ok(0);
        }
        let mut published = Vec::with_capacity(due.len());
        for chunk in due.chunks(PUBLISH_CONCURRENCY) {
            let sent = futures::future::join_all(chunk.iter().map(|job| self.publish(job))).await;
            published.extend(sent.into_iter().flatten());
        }
        let marked = self
            .shared
            .store
            .mark_published(ROLE, lead.token(), &published)
            .await?;
        tracing::debug!(
            due = due.len(),
            published = published.len(),
            marked,
            "due jobs published"
        );
        if published.len() < due.len() {
            // Unpublished ones stay awaiting: the next round retries them.
            return Ok(0);
        }
        Ok(due.len())
    }

    async fn publish(&self, job: &DueJob) -> Option<crate::JobId> {
        let payload = serde_json::to_vec(&job.input).ok()?;
        let late = chrono::Utc::now() - job.run_at;
        match self
            .shared
            .queue
            .publish_job(job.id, &job.job_type, payload.into())
            .await
        {
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
