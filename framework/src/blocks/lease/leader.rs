//! [`Leadership`]: one elected role per namespace (today the scheduler, which
//! publishes due delayed jobs and enqueues cron ticks), held as the key
//! `<namespace>/leaders/<role>` created-if-absent under the worker's session
//! lease. Its `create_revision` is the leader's token, fenced in PostgreSQL like
//! a job owner's: a new leader's key is created after the old one is gone, so
//! its token is larger than every earlier leader's.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::types::FencingToken;

use super::Session;
use super::error::LeaseError;

/// The result of [`Session::campaign`].
#[derive(Debug)]
pub(crate) enum Campaign {
    /// This session leads; fence every write with [`Leadership::token`].
    Elected(Leadership),
    /// Another session leads (or leadership could not be verified).
    Follower,
}

/// A verified leader key of this session.
#[derive(Debug, Clone)]
pub(crate) struct Leadership {
    role: String,
    key: String,
    token: FencingToken,
}

impl Leadership {
    /// The role.
    pub(crate) fn role(&self) -> &str {
        &self.role
    }

    /// The leader's token: the key's `create_revision`.
    pub(crate) fn token(&self) -> FencingToken {
        self.token
    }
}

impl Session {
    /// The key of `role`'s leader: `<namespace>/leaders/<role>`.
    pub fn leader_key(&self, role: &str) -> String {
        format!("{}leaders/{role}", self.namespace_prefix)
    }

    /// Runs for `role`: creates its leader key under this session's lease if
    /// nobody holds it, then re-reads it linearizably and checks it carries our
    /// lease and the created revision (as a job lock is verified). A key that
    /// already carries our own lease (an earlier campaign of this session) is
    /// leadership too, with the key's `create_revision` as token.
    ///
    /// # Errors
    /// [`LeaseError::SessionLost`], [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub(crate) async fn campaign(&self, role: &str) -> Result<Campaign, LeaseError> {
        self.campaign_at(role, self.leader_key(role)).await
    }

    /// [`campaign`](Self::campaign) for the key `key`, the role named `role`
    /// (also how a partition is owned: `partition.rs`).
    pub(super) async fn campaign_at(
        &self,
        role: &str,
        key: String,
    ) -> Result<Campaign, LeaseError> {
        self.ensure_not_lost()?;
        let value = serde_json::json!({"worker": self.worker_id, "lease": self.lease.to_string()})
            .to_string();
        let create = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_lease(self.lease.get())),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = self.txn("campaign", create).await?;
        let revision = match (resp.succeeded(), resp.header()) {
            (true, Some(h)) => h.revision(),
            (false, _) => match held_by(&resp.op_responses()) {
                Some((lease, rev)) if lease == self.lease.get() => rev,
                _ => return Ok(Campaign::Follower),
            },
            (true, None) => {
                return Err(LeaseError::Unexpected {
                    op: "campaign",
                    detail: "no header revision".into(),
                });
            }
        };
        self.verify_leader(role, key, revision).await
    }

    /// The linearizable re-read of a leader key created (or found) at `revision`.
    async fn verify_leader(
        &self,
        role: &str,
        key: String,
        revision: i64,
    ) -> Result<Campaign, LeaseError> {
        let read = self
            .txn(
                "campaign_verify",
                Txn::new().and_then([TxnOp::get(key.as_str(), None)]),
            )
            .await?;
        let ours = held_by(&read.op_responses())
            .is_some_and(|(lease, rev)| lease == self.lease.get() && rev == revision);
        match FencingToken::from_revision(revision).filter(|_| ours) {
            Some(token) => Ok(Campaign::Elected(Leadership {
                role: role.to_string(),
                key,
                token,
            })),
            None => {
                tracing::warn!(%key, revision, "leader key not ours on the re-read");
                Ok(Campaign::Follower)
            }
        }
    }

    /// Gives leadership up: deletes the key only while it carries `lead`'s
    /// token. Returns whether it was deleted.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`], [`LeaseError::Timeout`].
    pub(crate) async fn resign(&self, lead: Leadership) -> Result<bool, LeaseError> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                lead.key.as_str(),
                CompareOp::Equal,
                lead.token.get(),
            )])
            .and_then([TxnOp::delete(lead.key.as_str(), None)]);
        Ok(self.txn("resign", txn).await?.succeeded())
    }
}

/// The lease and `create_revision` of the first key a Get answer holds.
pub(super) fn held_by(answers: &[TxnOpResponse]) -> Option<(i64, i64)> {
    answers.iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| (kv.lease(), kv.create_revision())),
        _ => None,
    })
}
