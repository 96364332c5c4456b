//! [`TokenGate`]: fencing for a resource that enforces fences on its own writes.
//!
//! PostgreSQL job rows fence the writes a step makes through
//! [`StepCtx::db`](crate::StepCtx::db). A downstream service that a step calls (a
//! VM allocator, a DNS registry, an inventory service) can enforce the same rule on
//! its own state: the step sends its fence along
//! ([`StepCtx::fence_headers`](crate::StepCtx::fence_headers),
//! [`queue::headers::fence_headers`](crate::queue::headers::fence_headers)), and the
//! service keeps the largest token it has accepted per job and refuses smaller
//! ones. `TokenGate` is that bookkeeping, in memory, for one service process.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

use crate::types::{JobId, ObservedFence};

/// A write presented a token smaller than one the gate already accepted for its
/// key: a newer owner of the job has been here. Never retry such a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {ours}: this resource already accepted token {current}")]
#[non_exhaustive]
pub struct StaleToken {
    /// The token the write carried.
    pub ours: ObservedFence,
    /// The largest token accepted for the key.
    pub current: ObservedFence,
}

impl StaleToken {
    /// The same verdict in the fence's terms, for job `job_id`. A step that learns
    /// from a downstream service that its token is stale returns this error (with
    /// `?`): the runtime then counts a stale rejection and stops without acking,
    /// exactly as when PostgreSQL refuses the step's own write.
    ///
    /// ```
    /// use tenure::fence::StaleToken;
    /// use tenure::{JobId, ObservedFence, StepError};
    /// let stale = StaleToken::new(ObservedFence::new(41).unwrap(), ObservedFence::new(42).unwrap());
    /// let err = stale.fenced_out(JobId::from_key("t", "k"));
    /// assert!(err.is_fenced_out());
    /// let step_err: StepError = err.into();
    /// assert!(step_err.downcast_ref::<tenure::fence::FenceError>().is_some());
    /// ```
    pub fn fenced_out(self, job_id: JobId) -> super::FenceError {
        super::FenceError::FencedOut {
            job_id,
            ours: self.ours,
            current: Some(self.current),
        }
    }

    /// A refusal of `ours` because `current` was accepted (for a service that
    /// keeps its own record of accepted tokens, or a client that decodes one from
    /// a reply).
    pub fn new(ours: ObservedFence, current: ObservedFence) -> Self {
        StaleToken { ours, current }
    }
}

/// What [`TokenGate::admit`] did with an accepted token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admitted {
    /// The first token seen for the key.
    First,
    /// The same token as the largest accepted: the same owner writes again.
    Same,
    /// A larger token than before: a new owner took the job over from `previous`.
    Raised {
        /// The largest token accepted before this one.
        previous: ObservedFence,
    },
}

/// The largest fencing token accepted per key (by default per job), for a service
/// that enforces fences on its own writes.
///
/// [`admit`](TokenGate::admit) accepts a token equal to or larger than every
/// token accepted before for the same key (raising the gate) and refuses a smaller
/// one with [`StaleToken`]. [`admit_then`](TokenGate::admit_then) also runs the
/// write while holding the gate, so that admission and mutation are one atomic
/// step: no larger token can be admitted between the check and the write.
///
/// ```
/// use tenure::fence::{Admitted, TokenGate};
/// use tenure::{JobId, ObservedFence};
///
/// let gate = TokenGate::new();
/// let job = JobId::from_key("infra.provision", "web-1");
/// let t41 = ObservedFence::new(41).unwrap();
/// let t42 = ObservedFence::new(42).unwrap();
///
/// assert_eq!(gate.admit(job, t41), Ok(Admitted::First));
/// assert_eq!(gate.admit(job, t42), Ok(Admitted::Raised { previous: t41 }));
/// // The old owner wakes up: refused.
/// let stale = gate.admit(job, t41).unwrap_err();
/// assert_eq!((stale.ours, stale.current), (t41, t42));
/// // The write runs under the gate, or not at all.
/// let vm = gate.admit_then(job, t42, || "vm-1").unwrap();
/// assert_eq!(vm, "vm-1");
/// assert!(gate.admit_then(job, t41, || unreachable!()).is_err());
/// ```
///
/// # Fencing
/// The gate is only as durable as its memory: a service that restarts forgets the
/// tokens it accepted, and a stale owner could then write once more. A service
/// whose state outlives the process must store the largest token next to the data
/// it protects (in the same transaction as each write, as Tenure's job rows do)
/// and may use the gate only as its in-memory cache. Keys are never dropped on
/// their own: call [`forget`](TokenGate::forget) when a job is finished.
#[derive(Debug)]
pub struct TokenGate<K = JobId> {
    highest: Mutex<HashMap<K, ObservedFence>>,
}

impl<K: Eq + Hash> Default for TokenGate<K> {
    fn default() -> Self {
        TokenGate {
            highest: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash> TokenGate<K> {
    /// An empty gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts `token` for `key` if it is at least the largest token accepted for
    /// `key` so far, and records it as the new largest.
    ///
    /// # Errors
    /// [`StaleToken`] when a larger token was accepted before: a newer owner of the
    /// job has written here, and this write must be refused.
    pub fn admit(&self, key: K, token: ObservedFence) -> Result<Admitted, StaleToken> {
        self.enter(key, token, |admitted| admitted)
    }

    /// Admits `token` for `key` as [`admit`](TokenGate::admit) does, then runs
    /// `write` while still holding the gate and returns its result. A refused
    /// token never runs `write`.
    ///
    /// `write` runs under the gate's lock (which every key shares): keep it short
    /// and synchronous (an in-memory update, a channel send).
    ///
    /// # Errors
    /// [`StaleToken`] when a larger token was accepted before for `key`.
    pub fn admit_then<R>(
        &self,
        key: K,
        token: ObservedFence,
        write: impl FnOnce() -> R,
    ) -> Result<R, StaleToken> {
        self.enter(key, token, |_| write())
    }

    /// The largest token accepted for `key`, if any.
    pub fn current(&self, key: &K) -> Option<ObservedFence> {
        self.lock().get(key).copied()
    }

    /// Forgets `key` (when its job is finished), so the gate does not grow without
    /// bound. A token for a forgotten key is accepted again as [`Admitted::First`].
    pub fn forget(&self, key: &K) {
        self.lock().remove(key);
    }

    /// How many keys the gate remembers.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the gate remembers no key.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn enter<R>(
        &self,
        key: K,
        token: ObservedFence,
        then: impl FnOnce(Admitted) -> R,
    ) -> Result<R, StaleToken> {
        let mut highest = self.lock();
        let admitted = match highest.entry(key) {
            Entry::Vacant(v) => {
                v.insert(token);
                Admitted::First
            }
            Entry::Occupied(mut o) => {
                let current = *o.get();
                if token < current {
                    return Err(StaleToken {
                        ours: token,
                        current,
                    });
                }
                if token == current {
                    Admitted::Same
                } else {
                    o.insert(token);
                    Admitted::Raised { previous: current }
                }
            }
        };
        Ok(then(admitted))
    }

    /// The map; a panic in another thread's `write` cannot corrupt it (it holds
    /// only tokens, each updated by one assignment), so a poisoned lock is used as is.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, ObservedFence>> {
        self.highest.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(raw: i64) -> ObservedFence {
        ObservedFence::new(raw).unwrap()
    }

    #[test]
    fn tokens_only_go_up_per_key() {
        let gate = TokenGate::new();
        let (a, b) = (JobId::from_key("t", "a"), JobId::from_key("t", "b"));
        assert_eq!(gate.admit(a, t(10)), Ok(Admitted::First));
        assert_eq!(gate.admit(a, t(10)), Ok(Admitted::Same));
        assert_eq!(
            gate.admit(a, t(12)),
            Ok(Admitted::Raised { previous: t(10) })
        );
        assert_eq!(
            gate.admit(a, t(11)),
            Err(StaleToken {
                ours: t(11),
                current: t(12)
            })
        );
        // Another job is independent.
        assert_eq!(gate.admit(b, t(3)), Ok(Admitted::First));
        assert_eq!(gate.current(&a), Some(t(12)));
        assert_eq!(gate.current(&b), Some(t(3)));
        assert_eq!(gate.len(), 2);
    }

    #[test]
    fn a_refused_token_never_runs_the_write() {
        let gate = TokenGate::new();
        let job = JobId::from_key("t", "a");
        let mut writes = 0;
        assert!(gate.admit_then(job, t(5), || writes += 1).is_ok());
        assert!(gate.admit_then(job, t(4), || writes += 1).is_err());
        assert!(gate.admit_then(job, t(5), || writes += 1).is_ok());
        assert_eq!(writes, 2);
        assert_eq!(gate.current(&job), Some(t(5)));
    }

    #[test]
    fn forget_drops_the_key() {
        let gate: TokenGate<&str> = TokenGate::new();
        gate.admit("vm", t(9)).ok();
        gate.forget(&"vm");
        assert!(gate.is_empty());
        assert_eq!(gate.admit("vm", t(1)), Ok(Admitted::First));
    }

    #[test]
    fn concurrent_admissions_keep_the_maximum() {
        let gate = std::sync::Arc::new(TokenGate::new());
        let job = JobId::from_key("t", "a");
        let threads: Vec<_> = (1..=8)
            .map(|i| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    for k in 0..100 {
                        let _ = gate.admit(job, t(i * 1000 + k));
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().ok();
        }
        assert_eq!(gate.current(&job), Some(t(8099)));
    }
}
