//! The job types a worker fetches, each with its own limit of deliveries in
//! hand, and the order the fetcher visits them in.
//!
//! The worker's [`Slots`](super::slots::Slots) bound all its deliveries; a
//! type's limit ([`JobLimits::max_in_flight`](crate::JobLimits)) bounds that
//! type's share, so a type with a deep backlog of slow jobs cannot take every
//! slot while another type's jobs wait. A type's rate
//! ([`JobLimits::rate`](crate::JobLimits::rate), a [`Bucket`] per worker)
//! bounds its room too: a round asks a type for no more deliveries than its
//! whole tokens, and each delivery handed out ([`TypeRoutes::hold`]) takes
//! one, so a throttled type's messages stay in the stream. The fetcher starts
//! each round at the next type, so no type is always asked last.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::bucket::Bucket;

/// A job type's name, its limit of deliveries in hand (`usize::MAX`: none)
/// and its rate (`n` per period), if any.
pub(crate) type Route = (&'static str, usize, Option<(u32, Duration)>);

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
    rate: Option<Bucket>,
}

impl TypeRoute {
    /// Below the limit, and without a rate: the deliveries the type may take.
    fn below_limit(&self) -> usize {
        self.limit.saturating_sub(self.held.load(Ordering::Acquire))
    }

    /// The deliveries the type may take now: its limit's room, at most its
    /// whole tokens.
    fn room(&self, now: Instant) -> usize {
        let room = self.below_limit();
        match &self.rate {
            Some(bucket) if room > 0 => room.min(bucket.available(now)),
            _ => room,
        }
    }
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
    /// `types`: each job type's name, limit and rate ([`Route`]); a rate's
    /// bucket starts full.
    pub(crate) fn new(types: impl IntoIterator<Item = Route>) -> Arc<Self> {
        let now = Instant::now();
        let types = types
            .into_iter()
            .map(|(name, limit, rate)| TypeRoute {
                name,
                limit: limit.max(1),
                held: AtomicUsize::new(0),
                rate: rate.map(|(n, per)| Bucket::new(n, per, now)),
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

    /// This round's types that are below their limit and have a token (if
    /// rate-limited), with the deliveries each may take, starting one type
    /// further than the last round.
    pub(crate) fn round(&self) -> Vec<(usize, &'static str, usize)> {
        let n = self.types.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let now = Instant::now();
        (0..n)
            .map(|k| (start + k) % n)
            .filter_map(|i| {
                let t = &self.types[i];
                let room = t.room(now);
                (room > 0).then_some((i, t.name, room))
            })
            .collect()
    }

    /// The types below their limit that a round leaves out for their rate
    /// (no whole token), each with the time until its next token.
    pub(crate) fn throttled(&self) -> Vec<(&'static str, Duration)> {
        let now = Instant::now();
        self.types
            .iter()
            .filter(|t| t.below_limit() > 0)
            .filter_map(|t| {
                let bucket = t.rate.as_ref()?;
                (bucket.available(now) == 0).then(|| (t.name, bucket.next_token(now)))
            })
            .collect()
    }

    /// Counts a delivery of type `index` until the hold is dropped, and takes
    /// a token from its rate (the delivery is handed out).
    pub(crate) fn hold(self: &Arc<Self>, index: usize) -> TypeHold {
        let t = &self.types[index];
        t.held.fetch_add(1, Ordering::AcqRel);
        if let Some(bucket) = &t.rate {
            bucket.take(Instant::now());
        }
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
        let routes = TypeRoutes::new([("a", 2, None), ("b", usize::MAX, None), ("c", 1, None)]);
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

    #[tokio::test(start_paused = true)]
    async fn a_type_without_tokens_leaves_the_round_until_its_next_token() {
        let per = Duration::from_secs(1);
        let routes = TypeRoutes::new([("a", 3, Some((2, per))), ("b", usize::MAX, None)]);
        let room = |routes: &TypeRoutes, name| {
            let round = routes.round();
            round.iter().find(|t| t.1 == name).map(|t| t.2)
        };
        assert_eq!(room(&routes, "a"), Some(2), "the limit 3, the tokens 2");
        let held = [routes.hold(0), routes.hold(0)];
        assert_eq!(room(&routes, "a"), None, "no token left");
        assert_eq!(room(&routes, "b"), Some(usize::MAX));
        assert_eq!(routes.throttled(), [("a", Duration::from_millis(500))]);
        drop(held);
        assert_eq!(
            room(&routes, "a"),
            None,
            "a hold given back keeps its token"
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(room(&routes, "a"), Some(1));
        assert!(routes.throttled().is_empty());
        let full = [routes.hold(0), routes.hold(0), routes.hold(0)];
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(room(&routes, "a"), None, "at its limit: not throttled");
        assert!(routes.throttled().is_empty());
        drop(full);
    }
}
