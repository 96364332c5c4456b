//! The job types a worker fetches, each with its own limit of deliveries in
//! hand, and the order the fetcher visits them in.
//!
//! The worker's [`Slots`](super::slots::Slots) bound all its deliveries; a
//! type's limit ([`JobLimits::max_in_flight`](crate::JobLimits)) bounds that
//! type's share, so a type with a deep backlog of slow jobs cannot take every
//! slot while another type's jobs wait. The fetcher starts each round at the
//! next type, so no type is always asked last.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The types a worker fetches.
#[derive(Debug)]
pub(crate) struct TypeRoutes {
    types: Vec<TypeRoute>,
    next: AtomicUsize,
    /// A delivery of a type at its limit ended.
    freed: Notify,
}

#[derive(Debug)]
struct TypeRoute {
    name: &'static str,
    limit: usize,
    held: AtomicUsize,
}

/// A delivery's place in its type's limit, until its job actor ends.
#[derive(Debug)]
pub(crate) struct TypeHold {
    routes: Arc<TypeRoutes>,
    index: usize,
}

impl Drop for TypeHold {
    fn drop(&mut self) {
        self.routes.types[self.index]
            .held
            .fetch_sub(1, Ordering::AcqRel);
        self.routes.freed.notify_one();
    }
}

impl TypeRoutes {
    /// `types`: each job type's name and limit (`usize::MAX`: none).
    pub(crate) fn new(types: impl IntoIterator<Item = (&'static str, usize)>) -> Arc<Self> {
        let types = types
            .into_iter()
            .map(|(name, limit)| TypeRoute {
                name,
                limit: limit.max(1),
                held: AtomicUsize::new(0),
            })
            .collect();
        Arc::new(TypeRoutes {
            types,
            next: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    /// Every type's name.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.types.iter().map(|t| t.name).collect()
    }

    /// This round's types that are below their limit, with the deliveries each
    /// may take, starting one type further than the last round.
    pub(crate) fn round(&self) -> Vec<(usize, &'static str, usize)> {
        let n = self.types.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n.max(1);
        (0..n)
            .map(|k| (start + k) % n)
            .filter_map(|i| {
                let t = &self.types[i];
                let room = t.limit.saturating_sub(t.held.load(Ordering::Acquire));
                (room > 0).then_some((i, t.name, room))
            })
            .collect()
    }

    /// Counts a delivery of type `index` until the hold is dropped.
    pub(crate) fn hold(self: &Arc<Self>, index: usize) -> TypeHold {
        self.types[index].held.fetch_add(1, Ordering::AcqRel);
        TypeHold {
            routes: self.clone(),
            index,
        }
    }

    /// Waits until a delivery of some type ends (at most `bound`).
    pub(crate) async fn freed(&self, bound: std::time::Duration) {
        let _ = tokio::time::timeout(bound, self.freed.notified()).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rounds_rotate_and_skip_types_at_their_limit() {
        let routes = TypeRoutes::new([("a", 2), ("b", usize::MAX), ("c", 1)]);
        let names =
            |r: Vec<(usize, &'static str, usize)>| r.into_iter().map(|t| t.1).collect::<Vec<_>>();
        assert_eq!(names(routes.round()), ["a", "b", "c"]);
        assert_eq!(names(routes.round()), ["b", "c", "a"]);
        let c = routes.hold(2);
        let a1 = routes.hold(0);
        let round = routes.round();
        assert_eq!(names(round.clone()), ["a", "b"], "c is at its limit");
        assert_eq!(round[0].2, 1, "a has one place left");
        let a2 = routes.hold(0);
        assert_eq!(names(routes.round()), ["b"]);
        drop((a1, a2, c));
        assert_eq!(routes.round().len(), 3);
    }
}
