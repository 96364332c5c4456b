//! Fleet-wide limits per job type ([`JobLimits::fleet_max`](crate::JobLimits::fleet_max)).
//!
//! Before a fetch round, the fetcher takes slots of each limited type in
//! etcd (through `lease`: `Session::take_fleet_slots`), as many as the type
//! may fetch this round, and bounds the type's room by what it got: a type
//! with no free slot is not fetched, its messages stay in the stream (nothing
//! is nak'ed or counted as a delivery). Each delivery of the type carries one
//! slot in its [`HoldSlot`](super::slots::HoldSlot) until its job actor ends;
//! slots the round did not use are given back when the round ends. Both
//! ownership modes take slots the same way: the limit is per type, across
//! partitions.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::lease::{FleetKey, FleetTake, Session};

/// First and longest pause between attempts at giving a slot back.
const GIVE_BACK_RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Each limited type's fleet-wide limit, by name, and the slot keys this
/// worker holds.
#[derive(Debug, Default)]
pub(crate) struct Fleet {
    limits: HashMap<&'static str, u32>,
    live: Live,
}

/// The slot keys of the live [`FleetSlot`]s.
type Live = Arc<Mutex<HashSet<String>>>;

/// A slot of a limited type, held until dropped (then given back).
#[derive(Debug)]
pub(crate) struct FleetSlot {
    session: Arc<Session>,
    key: Option<FleetKey>,
    live: Live,
}

impl FleetSlot {
    fn new(session: &Arc<Session>, key: FleetKey, live: &Live) -> Self {
        lock(live).insert(key.key.clone());
        FleetSlot {
            session: session.clone(),
            key: Some(key),
            live: live.clone(),
        }
    }
}

impl Drop for FleetSlot {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        lock(&self.live).remove(&key.key);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(give_back(self.session.clone(), key));
        }
    }
}

/// Deletes `key`, retrying until it is gone or the session ends (its keys
/// then go with its lease): a slot left behind would lower the limit for
/// as long as this worker lives.
async fn give_back(session: Arc<Session>, key: FleetKey) {
    let mut pause = GIVE_BACK_RETRY.0;
    loop {
        match session.give_back_fleet_slot(&key).await {
            Ok(_) => return,
            Err(_) if session.cancellation().is_cancelled() => return,
            Err(e) => {
                tracing::debug!(key = %key.key, error = %e, "giving back a fleet slot failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(GIVE_BACK_RETRY.1);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The slots one fetch round took, by type index.
#[derive(Debug, Default)]
pub(crate) struct Taken(Mutex<HashMap<usize, Vec<FleetSlot>>>);

impl Taken {
    /// A slot for a delivery of type `index`; `None` for an unlimited type.
    pub(crate) fn pop(&self, index: usize) -> Option<FleetSlot> {
        lock(&self.0).get_mut(&index).and_then(Vec::pop)
    }
}

impl Fleet {
    pub(crate) fn new(limits: HashMap<&'static str, u32>) -> Self {
        Fleet {
            limits,
            live: Live::default(),
        }
    }

    /// Whether no type is limited fleet-wide (the fetcher then skips
    /// [`Fleet::take`]: nothing on the hot path).
    pub(crate) fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// Takes slots for this round's limited types (index, name, room), each
    /// up to its room and `want`, and bounds each one's room by the slots it
    /// got; a limited type that got none (or any, without a healthy
    /// `session`) leaves the round.
    pub(crate) async fn take(
        &self,
        session: Option<Arc<Session>>,
        types: &mut Vec<(usize, &'static str, usize)>,
        want: usize,
    ) -> Taken {
        let taken = Taken::default();
        for (index, name, room) in types.iter_mut() {
            let Some(&limit) = self.limits.get(name) else {
                continue;
            };
            let Some(session) = &session else {
                *room = 0;
                continue;
            };
            let slots = self
                .take_slots(session, name, limit, (*room).min(want))
                .await;
            *room = slots.len();
            lock(&taken.0).insert(*index, slots);
        }
        types.retain(|&(_, _, room)| room > 0);
        taken
    }

    /// Up to `want` slots of `name` (none if etcd failed: the type waits a
    /// round). A key of this session that no live slot knows is given back.
    async fn take_slots(
        &self,
        session: &Arc<Session>,
        name: &str,
        limit: u32,
        want: usize,
    ) -> Vec<FleetSlot> {
        let FleetTake { taken, ours_seen } = match session.take_fleet_slots(name, limit, want).await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(job_type = name, error = %e, "taking fleet slots failed; the type waits");
                return Vec::new();
            }
        };
        let slots: Vec<FleetSlot> = taken
            .into_iter()
            .map(|k| FleetSlot::new(session, k, &self.live))
            .collect();
        let orphans: Vec<FleetKey> = {
            let live = lock(&self.live);
            ours_seen
                .into_iter()
                .filter(|k| !live.contains(&k.key))
                .collect()
        };
        for key in orphans {
            tracing::info!(key = %key.key, "a fleet slot of this session that no job holds; giving it back");
            tokio::spawn(give_back(session.clone(), key));
        }
        slots
    }
}
