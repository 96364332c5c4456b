//! Fleet-wide limits per job type (`JobLimits::fleet_max`): the etcd side.
//!
//! A type limited to `n` jobs at once across the fleet has `n` slot keys,
//! `<ns>/fleet/<job type>/<k>` for `k` in `0..n`. A worker takes a slot by
//! creating a free one under its session lease (a Txn on `create_revision ==
//! 0`, several at once in one Txn), and gives it back by deleting it if it is
//! still the key it created (same `create_revision`). A crashed worker's
//! slots go with its lease; a worker whose session is `Lost` has stopped its
//! jobs before the lease can lapse (the watchdog), as for its job locks. So
//! at no instant do more than `n` workers' jobs of the type hold a slot.

use std::collections::BTreeSet;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::Session;
use super::error::LeaseError;

/// Attempts at taking slots before a round gives up (each a Txn; a failed
/// one returns the slots held, so the next asks for free ones).
const ATTEMPTS: usize = 3;

/// What a [`Session::take_fleet_slots`] got, and the keys of this session
/// it saw held on the way (to compare with the slots it knows it holds: one
/// it does not know, say brought back by an etcd restore, is given back).
#[derive(Debug, Default)]
pub(crate) struct FleetTake {
    pub(crate) taken: Vec<FleetKey>,
    pub(crate) ours_seen: Vec<FleetKey>,
}

/// The slots a failed Txn found held.
#[derive(Debug, Default)]
struct Held {
    indices: BTreeSet<u32>,
    ours: Vec<FleetKey>,
}

/// One slot key a session created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FleetKey {
    /// `<ns>/fleet/<job type>/<k>`.
    pub(crate) key: String,
    /// Its `create_revision`: only this key is ever given back.
    pub(crate) revision: i64,
}

impl Session {
    fn fleet_prefix(&self, job_type: &str) -> String {
        format!("{}fleet/{job_type}/", self.namespace_prefix)
    }

    /// Takes up to `want` of the `limit` slots of `job_type` that nobody
    /// holds, under this session's lease; returns the ones taken (none when
    /// every slot is held). One Txn when the free slots are the ones this
    /// session guesses (it starts at an offset of its own lease, so workers
    /// seldom collide); a Txn that finds one taken reads which are held, and
    /// the next asks for free ones.
    ///
    /// # Errors
    /// [`LeaseError::SessionLost`], [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub(crate) async fn take_fleet_slots(
        &self,
        job_type: &str,
        limit: u32,
        want: usize,
    ) -> Result<FleetTake, LeaseError> {
        self.ensure_not_lost()?;
        let prefix = self.fleet_prefix(job_type);
        let mut held = Held::default();
        for _ in 0..ATTEMPTS {
            let keys = self.free_slots(&prefix, limit, want, &held.indices);
            if keys.is_empty() {
                break;
            }
            match self.create_slots(&prefix, keys).await? {
                Ok(taken) => {
                    let ours_seen = held.ours;
                    return Ok(FleetTake { taken, ours_seen });
                }
                Err(now_held) => held = now_held,
            }
        }
        let ours_seen = held.ours;
        Ok(FleetTake {
            taken: Vec::new(),
            ours_seen,
        })
    }

    /// Up to `want` slot keys not in `held`, from an offset of this lease.
    fn free_slots(
        &self,
        prefix: &str,
        limit: u32,
        want: usize,
        held: &BTreeSet<u32>,
    ) -> Vec<String> {
        let offset =
            u32::try_from(self.lease.get().rem_euclid(i64::from(limit.max(1)))).unwrap_or(0);
        (0..limit)
            .map(|k| (k + offset) % limit)
            .filter(|k| !held.contains(k))
            .take(want)
            .map(|k| format!("{prefix}{k}"))
            .collect()
    }

    /// Creates every key of `keys` under this lease if none exists; else
    /// returns the slots held now.
    async fn create_slots(
        &self,
        prefix: &str,
        keys: Vec<String>,
    ) -> Result<Result<Vec<FleetKey>, Held>, LeaseError> {
        let absent: Vec<Compare> = keys
            .iter()
            .map(|k| Compare::create_revision(k.as_str(), CompareOp::Equal, 0))
            .collect();
        let put = PutOptions::new().with_lease(self.lease.get());
        let puts: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::put(k.as_str(), self.worker_id.as_str(), Some(put.clone())))
            .collect();
        let held = GetOptions::new().with_prefix().with_keys_only();
        let txn = Txn::new()
            .when(absent)
            .and_then(puts)
            .or_else([TxnOp::get(prefix, Some(held))]);
        let resp = self.txn("take_fleet_slots", txn).await?;
        if resp.succeeded() {
            let revision = resp.header().map_or(0, |h| h.revision());
            let taken = keys.into_iter().map(|key| FleetKey { key, revision });
            return Ok(Ok(taken.collect()));
        }
        let kvs = resp.op_responses().into_iter().flat_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().to_vec(),
            _ => Vec::new(),
        });
        let mut held = Held::default();
        for kv in kvs {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some(index) = slot_index(&key, prefix) else {
                continue;
            };
            held.indices.insert(index);
            if kv.lease() == self.lease.get() {
                let revision = kv.create_revision();
                held.ours.push(FleetKey { key, revision });
            }
        }
        Ok(Err(held))
    }

    /// Deletes `slot` if it is still the key this session created; whether
    /// it was.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`], [`LeaseError::Timeout`] (the key then goes with
    /// the lease).
    pub(crate) async fn give_back_fleet_slot(&self, slot: &FleetKey) -> Result<bool, LeaseError> {
        let key = slot.key.as_str();
        let txn = Txn::new()
            .when([Compare::create_revision(
                key,
                CompareOp::Equal,
                slot.revision,
            )])
            .and_then([TxnOp::delete(key, None)]);
        Ok(self.txn("give_back_fleet_slot", txn).await?.succeeded())
    }
}

/// The slot number of `key` under `prefix`.
fn slot_index(key: &str, prefix: &str) -> Option<u32> {
    key.strip_prefix(prefix)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::slot_index;

    #[test]
    fn slot_keys_parse_under_their_prefix_only() {
        assert_eq!(slot_index("ns/fleet/a/3", "ns/fleet/a/"), Some(3));
        assert_eq!(slot_index("ns/fleet/ab/3", "ns/fleet/a/"), None);
        assert_eq!(slot_index("ns/fleet/a/x", "ns/fleet/a/"), None);
    }
}
