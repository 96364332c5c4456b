//! Priority levels in the fetch round.
//!
//! Each source of a round (a job type's consumer, or one partition's) has
//! three levels ([`Priority`]), each its own subject and consumer. The rule:
//! a source's deliveries are dealt out one at a time over the levels that
//! have messages waiting, by smooth weighted round robin with the weights
//! high : normal : low = 4 : 2 : 1 ([`split`]); a level with nothing waiting
//! gets no share and gives it to the others. Over any 7 consecutive
//! deliveries of a source whose three levels all wait, high gets 4, normal
//! 2 and low 1, whatever the round sizes (the credits carry over from round
//! to round): higher first, and no level that waits is ever starved. The
//! rule applies to the room a round gives the source, so after the pause,
//! the limits, the rate and the fleet slots.
//!
//! What waits, without a round trip per fetch: `normal` is fetched as
//! before priorities (assumed waiting, until a fetch of it ends with its
//! consumer's pending count at 0; assumed again at the next look). `high`
//! and `low` are fetched only when known to wait: a fetch's last delivery
//! says how many its consumer has left (`Delivery::pending`), and a look at
//! the stream ([`Queue::waiting_levels`], two requests answered with the
//! non-empty level subjects only) every `Tuning::fetch_wait` finds the
//! messages published since. A worker whose types never use `high` or `low`
//! pays those two requests per `fetch_wait`, nothing per fetch.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::Priority;
use crate::queue::{Delivery, Queue};

/// A source: a job type, and its partition in partition mode.
type SourceKey = (String, Option<u32>);

/// Each source's levels: what waits, and the credits of the share rule.
#[derive(Debug)]
pub(super) struct Levels {
    sources: Mutex<HashMap<SourceKey, SourceLevels>>,
    /// When the next look at the stream is due.
    next_look: Mutex<Instant>,
}

/// One source's levels, indexed as [`Priority::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SourceLevels {
    waiting: [bool; 3],
    credit: [i64; 3],
}

impl Default for SourceLevels {
    fn default() -> Self {
        SourceLevels {
            waiting: [false, true, false],
            credit: [0; 3],
        }
    }
}

fn slot(priority: Priority) -> usize {
    match priority {
        Priority::High => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}

impl Levels {
    pub(super) fn new() -> Self {
        Levels {
            sources: Mutex::default(),
            next_look: Mutex::new(Instant::now()),
        }
    }

    fn with<R>(&self, key: SourceKey, f: impl FnOnce(&mut SourceLevels) -> R) -> R {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        f(sources.entry(key).or_default())
    }

    /// `room` deliveries of source (`job_type`, `partition`) shared out over
    /// its levels by the rule ([`split`]), indexed as [`Priority::ALL`].
    pub(super) fn plan(&self, job_type: &str, partition: Option<u32>, room: usize) -> [usize; 3] {
        let key = (job_type.to_string(), partition);
        self.with(key, |s| split(room, s.waiting, &mut s.credit))
    }

    /// The highest level that waits in source (`job_type`, `partition`):
    /// 0 for `high`, 1 for `normal`, 2 for `low`, 3 for none.
    pub(super) fn rank(&self, job_type: &str, partition: Option<u32>) -> usize {
        let key = (job_type.to_string(), partition);
        self.with(key, |s| s.waiting.iter().position(|w| *w).unwrap_or(3))
    }

    /// A fetch of the level ended with `deliveries`: it waits if its
    /// consumer had more than the last one left.
    pub(super) fn fetched(
        &self,
        (job_type, partition, priority): (&str, Option<u32>, Priority),
        deliveries: &[Delivery],
    ) {
        let waiting = deliveries.last().is_some_and(|d| d.pending() > 0);
        let key = (job_type.to_string(), partition);
        self.with(key, |s| s.waiting[slot(priority)] = waiting);
    }

    /// Looks at the stream if one `every` has passed since the last look:
    /// `high` and `low` wait where their subjects hold messages, `normal`
    /// is assumed waiting again. A failed look changes nothing.
    pub(super) async fn look(&self, queue: &Queue, every: Duration) {
        {
            let mut next = self.next_look.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if now < *next {
                return;
            }
            *next = now + every;
        }
        let counts = match queue.waiting_levels().await {
            Ok(counts) => counts,
            Err(e) => {
                tracing::debug!(error = %e, "looking for high and low messages failed");
                return;
            }
        };
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        for s in sources.values_mut() {
            s.waiting = [false, true, false];
        }
        for c in counts.into_iter().filter(|c| c.messages > 0) {
            let s = sources.entry((c.job_type, c.partition)).or_default();
            s.waiting[slot(c.priority)] = true;
        }
    }
}

/// The share rule: `room` deliveries dealt out one at a time over the
/// levels that wait (`waiting`, indexed as [`Priority::ALL`]) by smooth
/// weighted round robin: each waiting level adds its weight
/// ([`Priority::weight`]) to its credit, the level with the most credit
/// (the higher one on a tie) takes the delivery and pays the waiting
/// levels' total weight. The credits carry over to the next round; a level
/// that does not wait has none. Nothing waiting: `normal` takes the room
/// (it is fetched as before priorities).
pub(super) fn split(room: usize, waiting: [bool; 3], credit: &mut [i64; 3]) -> [usize; 3] {
    let mut out = [0; 3];
    for (c, w) in credit.iter_mut().zip(waiting) {
        if !w {
            *c = 0;
        }
    }
    if !waiting.contains(&true) {
        out[slot(Priority::Normal)] = room;
        return out;
    }
    let weight = |i: usize| i64::from(Priority::ALL[i].weight());
    let total: i64 = (0..3).filter(|&i| waiting[i]).map(weight).sum();
    for _ in 0..room {
        let mut best: Option<usize> = None;
        for i in (0..3).filter(|&i| waiting[i]) {
            credit[i] += weight(i);
            if best.is_none_or(|b| credit[i] > credit[b]) {
                best = Some(i);
            }
        }
        if let Some(b) = best {
            credit[b] -= total;
            out[b] += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The levels that took each of `n` deliveries dealt one per round.
    fn sequence(n: usize, waiting: [bool; 3]) -> String {
        let mut credit = [0; 3];
        (0..n)
            .map(|_| {
                let got = split(1, waiting, &mut credit);
                ['H', 'N', 'L'][got.iter().position(|&g| g == 1).unwrap_or(1)]
            })
            .collect()
    }

    #[test]
    fn all_levels_waiting_share_four_two_one_in_every_seven() {
        assert_eq!(split(7, [true; 3], &mut [0; 3]), [4, 2, 1]);
        assert_eq!(split(70, [true; 3], &mut [0; 3]), [40, 20, 10]);
        // One delivery per round: the credits carry over.
        let seq = sequence(21, [true; 3]);
        for window in seq.as_bytes().chunks(7) {
            let count = |c| window.iter().filter(|&&b| b == c).count();
            assert_eq!((count(b'H'), count(b'N'), count(b'L')), (4, 2, 1), "{seq}");
        }
        assert!(seq.starts_with('H'), "the higher level first: {seq}");
    }

    #[test]
    fn a_level_with_nothing_waiting_gives_its_share_to_the_others() {
        assert_eq!(split(5, [true, false, true], &mut [0; 3]), [4, 0, 1]);
        assert_eq!(split(6, [false, true, true], &mut [0; 3]), [0, 4, 2]);
        assert_eq!(split(3, [false, false, true], &mut [0; 3]), [0, 0, 3]);
        assert_eq!(split(3, [false; 3], &mut [0; 3]), [0, 3, 0]);
        assert_eq!(split(0, [true; 3], &mut [0; 3]), [0, 0, 0]);
    }

    #[test]
    fn a_low_level_is_never_starved_by_small_rounds() {
        // Rounds of 2 deliveries with high and low waiting: low still gets
        // one in every five.
        let mut credit = [0; 3];
        let mut low = 0;
        for _ in 0..50 {
            low += split(2, [true, false, true], &mut credit)[2];
        }
        assert_eq!(low, 20);
        // A level that stops waiting loses its credit.
        let mut credit = [0; 3];
        split(3, [true; 3], &mut credit);
        split(1, [true, true, false], &mut credit);
        assert_eq!(credit[2], 0);
    }
}
