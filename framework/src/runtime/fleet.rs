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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::lease::{FleetKey, Session};

/// Each limited type's fleet-wide limit, by name.
#[derive(Debug, Default)]
pub(crate) struct Fleet {
    limits: HashMap<&'static str, u32>,
}

/// A slot of a limited type, held until dropped (then given back).
#[derive(Debug)]
pub(crate) struct FleetSlot {
    session: Arc<Session>,
    key: Option<FleetKey>,
}

impl Drop for FleetSlot {
    fn drop(&mut self) {
        let (Some(key), Ok(rt)) = (self.key.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let session = self.session.clone();
        rt.spawn(async move {
            if let Err(e) = session.give_back_fleet_slot(&key).await {
                // The key goes with the session's lease.
                tracing::debug!(key = %key.key, error = %e, "giving back a fleet slot failed");
            }
        });
    }
}

/// The slots one fetch round took, by type index.
#[derive(Debug, Default)]
pub(crate) struct Taken(Mutex<HashMap<usize, Vec<FleetSlot>>>);

impl Taken {
    /// A slot for a delivery of type `index`; `None` for an unlimited type.
    pub(crate) fn pop(&self, index: usize) -> Option<FleetSlot> {
        let mut taken = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        taken.get_mut(&index).and_then(Vec::pop)
    }
}

impl Fleet {
    pub(crate) fn new(limits: HashMap<&'static str, u32>) -> Self {
        Fleet { limits }
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
            let slots = take_slots(session, name, limit, (*room).min(want)).await;
            *room = slots.len();
            taken
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(*index, slots);
        }
        types.retain(|&(_, _, room)| room > 0);
        taken
    }
}

/// Up to `want` slots of `name` (none if etcd failed: the type waits a round).
async fn take_slots(session: &Arc<Session>, name: &str, limit: u32, want: usize) -> Vec<FleetSlot> {
    match session.take_fleet_slots(name, limit, want).await {
        Ok(keys) => keys
            .into_iter()
            .map(|key| FleetSlot {
                session: session.clone(),
                key: Some(key),
            })
            .collect(),
        Err(e) => {
            tracing::warn!(job_type = name, error = %e, "taking fleet slots failed; the type waits");
            Vec::new()
        }
    }
}
