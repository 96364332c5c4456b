//! `Fetcher`: pulls deliveries from JetStream only while the session is
//! `Healthy`, as many as the worker's [`Slots`] allow (at most
//! `Config::max_in_flight` running, up to `Config::prefetch` more locked and
//! waiting, fetched in groups), from the consumers of the job types the worker
//! registered, each type up to its own limit ([`TypeRoutes`]), and spawns one
//! `JobActor` per delivery under the supervisor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

use super::Shared;
use super::fleet::Taken;
use super::job_actor::{JobActor, JobArgs};
use super::levels::Levels;
use super::owning::Source;
use super::routes::TypeRoutes;
use super::slots::{HoldSlot, Slots};
use super::standing::Server;
use crate::fence::{FenceError, JobRow};
use crate::lease::Health;
use crate::queue::Delivery;
use crate::{JobId, Priority};

pub(crate) struct FetcherArgs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) slots: Arc<Slots>,
    pub(crate) routes: Arc<TypeRoutes>,
    pub(crate) supervisor: ActorCell,
}

pub(crate) enum FetcherMsg {
    Tick,
}

pub(crate) struct Fetcher;

pub(crate) struct FetcherState {
    args: FetcherArgs,
    /// The last round delivered something: look at every type at once first.
    busy: bool,
    /// Rounds so far (which partitions get the remainder of a type's room).
    turn: usize,
    /// Each source's priority levels: what waits, and their shares.
    levels: Levels,
}

impl Actor for Fetcher {
    type Msg = FetcherMsg;
    type State = FetcherState;
    type Arguments = FetcherArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: FetcherArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_message(FetcherMsg::Tick)?;
        Ok(FetcherState {
            args,
            busy: false,
            turn: 0,
            levels: Levels::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        _msg: FetcherMsg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let sh = st.args.shared.clone();
        if sh.draining.is_cancelled() {
            return Ok(());
        }
        // Fetch only while the session is Healthy.
        if sh.healthy_session().is_none() {
            let mut current = sh.session.clone();
            tokio::select! {
                () = sh.draining.cancelled() => return Ok(()),
                _ = current.changed() => {}
                () = wait_healthy(&sh) => {}
                () = tokio::time::sleep(sh.cfg.tuning.fetch_unhealthy_recheck) => {}
            }
            myself.send_message(FetcherMsg::Tick)?;
            return Ok(());
        }
        let holds = tokio::select! {
            () = sh.draining.cancelled() => return Ok(()),
            h = st.args.slots.to_fetch() => h,
        };
        // High and low messages published since the last look (`levels`).
        tokio::select! {
            () = sh.draining.cancelled() => return Ok(()),
            () = st.levels.look(&sh.queue, sh.cfg.tuning.fetch_wait) => {}
        }
        // A paused type's messages stay in the stream (`pauses`), and so do
        // those of a type out of tokens (`bucket`).
        let (mut types, idle_wait) = st.types();
        // So do those of a type whose fleet-wide slots are all held (`fleet`).
        let taken = if sh.fleet.is_empty() {
            Taken::default()
        } else {
            sh.fleet
                .take(sh.healthy_session(), &mut types, holds.len())
                .await
        };
        st.turn = st.turn.wrapping_add(1);
        let round = sh.owning.sources(types, st.turn);
        if round.is_empty() {
            // Nothing to fetch from: every type at its limit, out of tokens
            // (waited for until the next one) or of fleet slots, or
            // (partition mode) no partition led yet or any more.
            drop((holds, taken));
            tokio::select! {
                () = sh.draining.cancelled() => return Ok(()),
                () = sh.owning.wait_for_sources(&st.args.routes, idle_wait) => {}
            }
        } else {
            // Taken before the round's asks: a message stored after them rings.
            let mut rings = sh.queue.rings();
            let sources: Vec<_> = round.iter().map(|s| (s.job_type, s.partition)).collect();
            tokio::select! {
                () = sh.draining.cancelled() => return Ok(()),
                busy = st.round(round, holds, &taken) => st.busy = busy,
            }
            // Slots the round did not use go back now, not after the pause.
            drop(taken);
            if !st.busy {
                let pause = sh.cfg.tuning.fetch_wait_several;
                tokio::select! {
                    () = sh.draining.cancelled() => return Ok(()),
                    () = sh.owning.after_idle_round(pause, rings.rang(&sources)) => {}
                }
            }
        }
        myself.send_message(FetcherMsg::Tick)?;
        Ok(())
    }
}

impl FetcherState {
    /// This round's types and the room of each ([`TypeRoutes::round`]), but
    /// no paused type (its messages stay in the stream, `pauses`); and how
    /// long to wait if the round has no source: `Tuning::fetch_wait`, or less,
    /// until the next token of a type left out for its rate (counted).
    fn types(&self) -> (Vec<(usize, &'static str, usize)>, Duration) {
        let sh = &self.args.shared;
        let mut types = self.args.routes.round();
        types.retain(|&(_, name, _)| !sh.pauses.is_paused(name));
        let mut wait = sh.cfg.tuning.fetch_wait;
        for (name, next_token) in self.args.routes.throttled() {
            if !sh.pauses.is_paused(name) {
                sh.metrics.throttled(name);
                wait = wait.min(next_token);
            }
        }
        (types, wait)
    }

    /// One fetch round over the types below their limit; whether it delivered
    /// anything.
    ///
    /// One type: one fetch for all the holds, waiting up to
    /// `Tuning::fetch_wait`. Several: after a busy round, first a fetch that
    /// barely waits (`Tuning::fetch_wait_now`) from each type in turn
    /// (messages are there: take them); if that finds nothing, or after an
    /// idle round, one fetch per type at once, the holds shared out, each
    /// ending at its type's first message or after `Tuning::fetch_wait_several`,
    /// and each fetch's deliveries started as it ends. The waiting is the
    /// worker's: no pull request waits at the server (`queue/pull.rs`).
    async fn round(&self, mut round: Vec<Source>, mut holds: Vec<HoldSlot>, fleet: &Taken) -> bool {
        let t = &self.args.shared.cfg.tuning;
        // A type's partitions where a higher level waits are asked first, so
        // the type's priorities hold across its partitions.
        for sources in round.chunk_by_mut(|a, b| a.index == b.index) {
            sources.sort_by_key(|s| self.levels.rank(s.job_type, s.partition));
        }
        if round.len() > 1 && self.busy {
            let mut got = false;
            for &source in &round {
                if holds.is_empty() {
                    break;
                }
                let max = source.room.min(holds.len());
                got |= self
                    .pull(source, max, t.fetch_wait_now, &mut holds, fleet)
                    .await;
            }
            if got || holds.is_empty() {
                return got;
            }
        }
        let wait = if round.len() > 1 {
            t.fetch_wait_several
        } else {
            t.fetch_wait
        };
        let mut pulls = futures::stream::FuturesUnordered::new();
        for (source, mut share) in round.iter().copied().zip(share_out(&round, holds)) {
            if !share.is_empty() {
                pulls.push(async move {
                    let max = share.len();
                    self.pull(source, max, wait, &mut share, fleet).await
                });
            }
        }
        let mut got = false;
        while let Some(g) = futures::StreamExt::next(&mut pulls).await {
            got |= g;
        }
        got
    }

    /// Up to `max` deliveries from `source`, shared out over its priority
    /// levels ([`Levels::plan`]), each started with one of `holds`; whether
    /// it delivered anything. `high` and `low` are asked once, at once;
    /// `normal` last, for what they left, waiting up to `wait` only if
    /// nothing came yet.
    async fn pull(
        &self,
        source: Source,
        max: usize,
        wait: Duration,
        holds: &mut Vec<HoldSlot>,
        fleet: &Taken,
    ) -> bool {
        let plan = self.levels.plan(source.job_type, source.partition, max);
        let mut left = max;
        let mut got = false;
        for (priority, share) in [(Priority::High, plan[0]), (Priority::Low, plan[2])] {
            let n = share.min(left);
            if n > 0 {
                let taken = self.pull_level((source, priority), n, Duration::ZERO, holds, fleet);
                let taken = taken.await;
                left -= taken.min(left);
                got |= taken > 0;
            }
        }
        if left > 0 {
            let wait = if got { Duration::ZERO } else { wait };
            let normal = (source, Priority::Normal);
            got |= self.pull_level(normal, left, wait, holds, fleet).await > 0;
        }
        got
    }

    /// One fetch from `source`'s consumer at a level, for up to `max`
    /// deliveries, each started with one of `holds`; how many it delivered.
    async fn pull_level(
        &self,
        (source, priority): (Source, Priority),
        max: usize,
        wait: Duration,
        holds: &mut Vec<HoldSlot>,
        fleet: &Taken,
    ) -> usize {
        let sh = &self.args.shared;
        let level = (source, priority);
        let fetched = sh.owning.fetch(&sh.queue, level, max, wait).await;
        match fetched {
            Ok(deliveries) => {
                let level = (source.job_type, source.partition, priority);
                self.levels.fetched(level, &deliveries);
                let got = deliveries.len();
                self.start(source.index, deliveries, holds, fleet).await;
                got
            }
            Err(e) => {
                if e.is_transient() {
                    sh.suspect(Server::Nats);
                }
                tracing::warn!(job_type = source.job_type, %priority, error = %e, "fetch failed; retrying");
                tokio::time::sleep(sh.cfg.tuning.fetch_error_pause).await;
                0
            }
        }
    }

    /// Spawns a job actor per delivery, each with one of `holds` (and, for a
    /// type limited fleet-wide, one of the round's `fleet` slots).
    async fn start(
        &self,
        index: usize,
        deliveries: Vec<Delivery>,
        holds: &mut Vec<HoldSlot>,
        fleet: &Taken,
    ) {
        let sh = &self.args.shared;
        let mut rows = admission_rows(sh, &deliveries).await;
        for delivery in deliveries {
            let Some(hold) = holds.pop() else {
                tracing::error!(
                    "queue returned more deliveries than asked for; the extra is redelivered"
                );
                break;
            };
            // A row the group's read did not return is read by the job
            // actor itself: the job may have no row, or a second message of
            // the same job came in this group and the first took the row.
            let admitted = match (&mut rows, delivery.job_id()) {
                (Some(rows), Ok(id)) => rows.remove(&id),
                _ => None,
            };
            let args = JobArgs {
                shared: sh.clone(),
                admitted,
                delivery,
                hold: hold
                    .of_type(self.args.routes.hold(index))
                    .with_fleet(fleet.pop(index)),
            };
            if let Err(e) =
                Actor::spawn_linked(None, JobActor, args, self.args.supervisor.clone()).await
            {
                tracing::error!(error = %e, "cannot spawn a job actor; the delivery is redelivered after AckWait");
            }
        }
    }
}

/// The holds dealt out one at a time over the round's types, each type up to
/// the deliveries it may take.
fn share_out<T>(round: &[Source], mut holds: Vec<T>) -> Vec<Vec<T>> {
    let mut shares: Vec<Vec<T>> = round.iter().map(|_| Vec::new()).collect();
    while !holds.is_empty() {
        let mut dealt = false;
        for (share, source) in shares.iter_mut().zip(round) {
            if share.len() < source.room
                && let Some(h) = holds.pop()
            {
                share.push(h);
                dealt = true;
            }
        }
        if !dealt {
            break;
        }
    }
    shares
}

/// The job rows of a group of deliveries, read in one query (the admission
/// reads of the whole group). `None` if the read failed: each job actor then
/// reads its own row (and retries the delivery if that fails too).
async fn admission_rows(sh: &Shared, deliveries: &[Delivery]) -> Option<HashMap<JobId, JobRow>> {
    let ids: Vec<JobId> = deliveries.iter().filter_map(|d| d.job_id().ok()).collect();
    if ids.is_empty() {
        return None;
    }
    match sh.store.jobs(&ids).await {
        Ok(rows) => Some(rows.into_iter().map(|r| (r.id, r)).collect()),
        Err(e) => {
            if matches!(e, FenceError::Db(_)) {
                sh.suspect(Server::Postgres);
            }
            tracing::warn!(error = %e, jobs = ids.len(), "reading a group's job rows failed; each job reads its own");
            None
        }
    }
}

async fn wait_healthy(sh: &Shared) {
    let session = sh.session.borrow().clone();
    if let Some(session) = session {
        let mut h = session.watch_health();
        let _ = h.wait_for(|h| *h == Health::Healthy).await;
    } else {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_dealt_out_fairly_up_to_each_types_room() {
        let source = |index, job_type, partition, room| Source {
            index,
            job_type,
            partition,
            room,
        };
        let round = [
            source(0, "a", None, 1),
            source(1, "b", None, 10),
            source(2, "c", Some(3), 10),
        ];
        let shares = share_out(&round, (0..6).collect());
        let sizes: Vec<usize> = shares.iter().map(Vec::len).collect();
        assert_eq!(sizes, [1, 3, 2]);
        let few = share_out(&round, vec![1, 2]);
        assert_eq!(few.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 0]);
        let capped = share_out(&[source(0, "a", None, 1)], vec![1, 2, 3]);
        assert_eq!(capped[0].len(), 1, "the rest go back to the slots");
    }
}
