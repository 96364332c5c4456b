//! Partition ownership (partition mode, `Config::partitions`): the etcd side.
//!
//! Every job belongs, for its whole life, to one partition of its job type
//! (`JobId::partition`). A worker owns a partition of a type by leading it: the
//! key `<ns>/own/partitions/<job type>/<partition>` created-if-absent under the
//! worker's session lease and re-read linearizably ([`Session::own_partition`],
//! the same election as [`Session::campaign`]). Its `create_revision` is the
//! partition's fencing token: a new owner's key is created after the old one is
//! gone, so its token is larger than every earlier owner's of that partition.
//! Every job of the partition runs under that token; no etcd request per job.
//!
//! Who is alive, and which types it runs, is the member key
//! `<ns>/own/members/<lease>` under the same lease ([`Session::join_members`]),
//! so a crashed worker's membership and partitions go together when its lease
//! expires; a live worker that cannot work deletes it
//! ([`Session::leave_members`]) and puts it back once it can.
//! [`Session::ownership`] reads both in one linearizable Txn, and
//! [`Session::watch_ownership`] reports every change under `<ns>/own/`.

use etcd_client::{GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream};
use serde::{Deserialize, Serialize};

use crate::types::LeaseId;

use super::Session;
use super::error::LeaseError;
use super::leader::Campaign;
use super::request::{bounded, named};

/// A live worker as its member key says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its session's lease.
    pub lease: LeaseId,
    /// Its worker id.
    pub worker: String,
    /// The job types it registered.
    pub job_types: Vec<String>,
}

/// Who owns one partition of one job type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOwner {
    /// The job type.
    pub job_type: String,
    /// The partition, `0..Config::partitions`.
    pub partition: u32,
    /// The owner's lease.
    pub lease: LeaseId,
    /// The partition key's `create_revision` (the owner's token), as read.
    pub revision: i64,
}

/// Members and partition owners, read together.
#[derive(Debug, Clone, Default)]
pub struct OwnershipView {
    /// Every live member.
    pub members: Vec<Member>,
    /// Every owned partition.
    pub owners: Vec<PartitionOwner>,
}

/// A member key's value.
#[derive(Serialize, Deserialize)]
struct MemberValue {
    worker: String,
    job_types: Vec<String>,
}

impl Session {
    fn members_prefix(&self) -> String {
        format!("{}own/members/", self.namespace_prefix)
    }

    fn partitions_prefix(&self) -> String {
        format!("{}own/partitions/", self.namespace_prefix)
    }

    /// The key of partition `partition` of `job_type`:
    /// `<ns>/own/partitions/<job type>/<partition>`.
    pub fn partition_key(&self, job_type: &str, partition: u32) -> String {
        format!("{}{job_type}/{partition}", self.partitions_prefix())
    }

    /// The lease owning partition `partition` of `job_type`, if anyone does
    /// (a linearizable read).
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`].
    pub async fn partition_holder(
        &self,
        job_type: &str,
        partition: u32,
    ) -> Result<Option<LeaseId>, LeaseError> {
        self.holder_of("partition_holder", self.partition_key(job_type, partition))
            .await
    }

    /// Puts this session's member key (its worker id and `job_types`) under
    /// its lease: it lives exactly as long as the session.
    ///
    /// # Errors
    /// [`LeaseError::SessionLost`], [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub async fn join_members(&self, job_types: &[&str]) -> Result<(), LeaseError> {
        self.ensure_not_lost()?;
        let key = format!("{}{}", self.members_prefix(), self.lease);
        let value = MemberValue {
            worker: self.worker_id.clone(),
            job_types: job_types.iter().map(|t| (*t).to_string()).collect(),
        };
        let value = serde_json::to_string(&value).unwrap_or_default();
        let put = TxnOp::put(
            key.as_str(),
            value,
            Some(PutOptions::new().with_lease(self.lease.get())),
        );
        self.txn("join_members", Txn::new().and_then([put])).await?;
        Ok(())
    }

    /// Deletes this session's member key ([`Session::join_members`] puts it
    /// back): the worker stays alive in etcd but counts in no fair share, so
    /// the other members' shares cover every partition.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub async fn leave_members(&self) -> Result<(), LeaseError> {
        let key = format!("{}{}", self.members_prefix(), self.lease);
        let delete = TxnOp::delete(key.as_str(), None);
        self.txn("leave_members", Txn::new().and_then([delete]))
            .await?;
        Ok(())
    }

    /// Every member and every partition owner, in one linearizable read.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub async fn ownership(&self) -> Result<OwnershipView, LeaseError> {
        let (members, partitions) = (self.members_prefix(), self.partitions_prefix());
        let txn = Txn::new().and_then([
            TxnOp::get(members.as_str(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(partitions.as_str(), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self.txn("ownership", txn).await?;
        let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let mut view = OwnershipView::default();
        for kv in gets.next().iter().flat_map(|g| g.kvs()) {
            if let Ok(v) = serde_json::from_slice::<MemberValue>(kv.value()) {
                view.members.push(Member {
                    lease: LeaseId::new(kv.lease()),
                    worker: v.worker,
                    job_types: v.job_types,
                });
            }
        }
        for kv in gets.next().iter().flat_map(|g| g.kvs()) {
            let key = String::from_utf8_lossy(kv.key());
            if let Some((job_type, partition)) = parse_partition_key(&key, &partitions) {
                view.owners.push(PartitionOwner {
                    job_type,
                    partition,
                    lease: LeaseId::new(kv.lease()),
                    revision: kv.create_revision(),
                });
            }
        }
        Ok(view)
    }

    /// Runs for partition `partition` of `job_type` as [`Session::campaign`]
    /// runs for a role: created if absent under this lease, then re-read
    /// linearizably. [`Campaign::Elected`]'s token fences every job of the
    /// partition; give it up with [`Session::resign`].
    ///
    /// # Errors
    /// [`LeaseError::SessionLost`], [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub(crate) async fn own_partition(
        &self,
        job_type: &str,
        partition: u32,
    ) -> Result<Campaign, LeaseError> {
        let role = format!("partition {job_type}/{partition}");
        self.campaign_at(&role, self.partition_key(job_type, partition))
            .await
    }

    /// Deletes the key of partition `partition` of `job_type` if it carries
    /// this session's lease, whatever its token: how a key whose campaign's
    /// answer was lost (etcd created it, the request timed out) is given up.
    /// Returns whether it was deleted.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub async fn disown_partition(
        &self,
        job_type: &str,
        partition: u32,
    ) -> Result<bool, LeaseError> {
        let key = self.partition_key(job_type, partition);
        self.delete_if_ours("disown_partition", key).await
    }

    /// A watch on every key under `<ns>/own/` (members and partitions). Open
    /// it before [`Session::ownership`]: a change after the read is then
    /// never missed.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub(crate) async fn watch_ownership(&self) -> Result<OwnershipWatch, LeaseError> {
        let prefix = format!("{}own/", self.namespace_prefix);
        let client = self.client.watch_client();
        let stream = bounded("watch_ownership", self.request_timeout, || {
            let (mut c, key) = (client.clone(), prefix.clone());
            async move { c.watch(key, Some(WatchOptions::new().with_prefix())).await }
        })
        .await
        .map_err(|e| named(&self.endpoints, e))?;
        Ok(OwnershipWatch { stream })
    }
}

/// A watch on a namespace's members and partition owners.
#[derive(Debug)]
pub(crate) struct OwnershipWatch {
    stream: WatchStream,
}

impl OwnershipWatch {
    /// Waits for the next change (a key put or deleted under `<ns>/own/`).
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] if the watch failed, [`LeaseError::Unexpected`]
    /// if etcd ended or cancelled it: open a new one.
    pub(crate) async fn changed(&mut self) -> Result<(), LeaseError> {
        loop {
            let msg = self
                .stream
                .message()
                .await
                .map_err(|source| LeaseError::Etcd {
                    op: "watch_ownership",
                    source,
                })?;
            match msg {
                None => return Err(ended("the watch stream ended")),
                Some(m) if m.canceled() => return Err(ended("etcd cancelled the watch")),
                Some(m) if !m.events().is_empty() => return Ok(()),
                Some(_) => {}
            }
        }
    }
}

fn ended(detail: &str) -> LeaseError {
    LeaseError::Unexpected {
        op: "watch_ownership",
        detail: detail.into(),
    }
}

/// `(job type, partition)` of a key under `prefix` (`<type>/<partition>`).
fn parse_partition_key(key: &str, prefix: &str) -> Option<(String, u32)> {
    let (job_type, partition) = key.strip_prefix(prefix)?.rsplit_once('/')?;
    Some((job_type.to_string(), partition.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_parse_back_even_with_slashes_in_the_type() {
        let p = "ns/own/partitions/";
        assert_eq!(
            parse_partition_key("ns/own/partitions/pay/7", p),
            Some(("pay".into(), 7))
        );
        assert_eq!(
            parse_partition_key("ns/own/partitions/a/b/12", p),
            Some(("a/b".into(), 12))
        );
        assert_eq!(parse_partition_key("ns/own/partitions/pay/x", p), None);
        assert_eq!(parse_partition_key("ns/own/members/1", p), None);
    }
}
