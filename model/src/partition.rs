//! Partition mode (`Config::partitions`; `framework/src/docs/protocol.md`,
//! "Partition mode"): the parts of the model that only it has.
//!
//! No job takes an etcd lock of its own. A worker's rebalancer
//! (`runtime/partitions.rs`) campaigns for a partition (the key
//! `<ns>/own/partitions/<type>/<p>`, created if absent under its session lease
//! and re-read: [`Action::Campaign`], [`Action::VerifyCampaign`]), raises the
//! partition's row in `partition_fences` strictly ([`Action::ClaimPartition`])
//! and only then grants the partition's token to the deliveries it fetches
//! from the partition's consumer (`Ownership::grant`, merged into
//! [`Action::Fetch`]). The job claim raises the row's fence to that token or
//! finds it there (`fence <= $tok`), and the steps run exactly as under a job
//! lock. Ownership ends with the session lease (fault [`Action::LeaseExpires`],
//! then [`Action::ForgetPartition`]) or by a hand-over ([`Action::HandOver`]:
//! running jobs stop at their next step boundary, released,
//! [`Action::ReleaseJob`]; then [`Action::Resign`] deletes the key).
//!
//! Every job of the partition is in partition `job % P`; with `P = 1` one owner
//! runs both jobs under one token.

use stateright::Property;

use crate::model::{
    Action, Grant, LockKey, MAX_PARTITIONS, Mode, Own, PartitionFence, Pc, State, Status, Tenure,
    Tx, Undo, idx, props, record_commit,
};

impl Tenure {
    /// Whether the model runs partition mode.
    pub(crate) fn partitioned(&self) -> bool {
        matches!(self.bound.mode, Mode::Partitions(_))
    }

    /// `P` (0 with one lock per job).
    fn partition_count(&self) -> u8 {
        match self.bound.mode {
            Mode::Locks => 0,
            Mode::Partitions(n) => n.clamp(1, MAX_PARTITIONS as u8),
        }
    }

    /// The partition of `job` (`JobId::partition(P)`).
    pub(crate) fn partition_of(&self, job: u8) -> u8 {
        job % self.partition_count().max(1)
    }

    fn partition_ids(&self) -> impl Iterator<Item = u8> + use<> {
        0..self.partition_count()
    }

    /// `Ownership::grant` (`runtime/partitions.rs`), through `acquire_partition`
    /// (`runtime/owning.rs`): the token of `job`'s partition if worker `w`
    /// owns it under its current session and is not handing it over.
    pub(crate) fn partition_grant(&self, s: &State, w: u8, job: u8) -> Option<Grant> {
        let p = self.partition_of(job);
        let Own::Owned {
            grant,
            handover: false,
        } = s.owns[idx(w)][idx(p)]
        else {
            return None;
        };
        (grant.epoch == s.etcd.leases[idx(w)].epoch).then_some(Grant { job, ..grant })
    }

    /// `Owned::handing_over`: the grant's unit had its `handover` token
    /// cancelled (a hand-over, or found lost), or is gone.
    fn handing_over(&self, s: &State, w: u8, grant: Grant) -> bool {
        let p = self.partition_of(grant.job);
        !matches!(
            s.owns[idx(w)][idx(p)],
            Own::Owned { grant: g, handover: false } if g.token == grant.token && g.epoch == grant.epoch
        )
    }

    /// What `forget_lost` forgets: a unit whose session is lost, or whose key
    /// etcd no longer shows as ours with its revision.
    fn lost(s: &State, w: u8, p: u8, g: Grant) -> bool {
        let lease = s.etcd.leases[idx(w)];
        let ours = LockKey {
            worker: w,
            epoch: g.epoch,
            create_revision: g.token,
        };
        !lease.alive || lease.epoch != g.epoch || s.etcd.partitions[idx(p)] != Some(ours)
    }

    /// Worker `w`'s partition-mode actions: its rebalancer's, and the release
    /// of a job at a step boundary when its partition is being handed over.
    pub(crate) fn partition_actions(&self, s: &State, w: u8, actions: &mut Vec<Action>) {
        let wi = idx(w);
        let alive = s.etcd.leases[wi].alive;
        for p in self.partition_ids() {
            match s.owns[wi][idx(p)] {
                Own::None if s.etcd.partitions[idx(p)].is_none() => {
                    if alive {
                        actions.push(Action::Campaign {
                            w,
                            p,
                            phantom: false,
                        });
                    } else if s.budget.phantom_grants > 0 {
                        actions.push(Action::Campaign {
                            w,
                            p,
                            phantom: true,
                        });
                    }
                }
                Own::None => {}
                Own::Created(_) => actions.push(Action::VerifyCampaign { w, p }),
                Own::Elected(_) => actions.push(Action::ClaimPartition { w, p }),
                Own::Owned { grant, handover } => {
                    if !handover && s.budget.handovers > 0 {
                        actions.push(Action::HandOver { w, p });
                    }
                    if handover {
                        actions.push(Action::Resign { w, p });
                    }
                    if Self::lost(s, w, p, grant) {
                        actions.push(Action::ForgetPartition { w, p });
                    }
                }
            }
        }
        if let Pc::Running {
            grant,
            tx: Tx::None,
            poisoned: false,
            ..
        } = s.workers[wi]
            && self.handing_over(s, w, grant)
        {
            actions.push(Action::ReleaseJob { w });
        }
    }

    /// `campaign_at` (`lease/leader.rs`): the create-if-absent Txn under the
    /// session lease. A key held already is `Campaign::Follower` (no change,
    /// so not an action here); an expired lease's create fails, unless
    /// `phantom` (etcd issue 11456).
    pub(crate) fn campaign(&self, s: &mut State, w: u8, p: u8, phantom: bool) -> Option<()> {
        let (wi, pi) = (idx(w), idx(p));
        if s.owns[wi][pi] != Own::None || s.etcd.partitions[pi].is_some() {
            return None;
        }
        let lease = s.etcd.leases[wi];
        if phantom {
            if lease.alive || s.budget.phantom_grants == 0 {
                return None;
            }
            s.budget.phantom_grants -= 1;
        } else if !lease.alive {
            return None;
        }
        s.etcd.revision += 1;
        let grant = Grant {
            job: p,
            epoch: lease.epoch,
            token: s.etcd.revision,
            real: !phantom,
        };
        if !phantom {
            s.etcd.partitions[pi] = Some(LockKey {
                worker: w,
                epoch: lease.epoch,
                create_revision: grant.token,
            });
        }
        s.owns[wi][pi] = if self.switches.verify_read {
            Own::Created(grant)
        } else {
            Own::Elected(grant)
        };
        Some(())
    }

    /// The rebalancer's steps on one partition after its campaign.
    pub(crate) fn own_step(&self, s: &mut State, w: u8, p: u8, action: Action) -> Option<()> {
        let (wi, pi) = (idx(w), idx(p));
        let next = match (action, s.owns[wi][pi]) {
            (Action::VerifyCampaign { .. }, Own::Created(g)) => {
                let ours = LockKey {
                    worker: w,
                    epoch: g.epoch,
                    create_revision: g.token,
                };
                if s.etcd.partitions[pi] == Some(ours) {
                    Own::Elected(g)
                } else {
                    Own::None // "leader key not ours on the re-read": Follower
                }
            }
            (Action::ClaimPartition { .. }, Own::Elected(g)) => self.claim_partition(s, pi, g),
            (Action::HandOver { .. }, Own::Owned { grant, handover }) => {
                if handover || s.budget.handovers == 0 {
                    return None;
                }
                s.budget.handovers -= 1;
                Own::Owned {
                    grant,
                    handover: true,
                }
            }
            (
                Action::Resign { .. },
                Own::Owned {
                    grant,
                    handover: true,
                },
            ) => {
                resign(s, pi, grant);
                Own::None
            }
            (Action::ForgetPartition { .. }, Own::Owned { grant, .. })
                if Self::lost(s, w, p, grant) =>
            {
                Own::None
            }
            _ => return None,
        };
        s.owns[wi][pi] = next;
        Some(())
    }

    /// `FenceStore::claim_partition`: `tenure_claim_partition` raises the
    /// partition's fence strictly; refused, `Rebalance::take` resigns the key.
    fn claim_partition(&self, s: &mut State, pi: usize, g: Grant) -> Own {
        let fence = s.partition_fences[pi];
        let accepted = match self.switches.partition_fence {
            PartitionFence::Strict => fence < g.token,
            PartitionFence::AcceptEqual => fence <= g.token,
            PartitionFence::Skip => true,
        };
        if !accepted {
            // PartitionFencedOut (the regression alarm if equal), then
            // resign_until_gone: the delete is modelled as done at once.
            resign(s, pi, g);
            return Own::None;
        }
        if self.switches.partition_fence != PartitionFence::Skip {
            s.partition_fences[pi] = g.token;
        }
        Own::Owned {
            grant: g,
            handover: false,
        }
    }

    /// The job claim under a partition's token (`tenure_claim(.., p_partitioned
    /// = true, p_admit = true)`, migration 0015): `fence < $tok OR fence =
    /// $tok`; a takeover counted only when `fence > 0 AND fence < $tok AND NOT
    /// released`. Refused: `claim_refusal` says `NewerOwner` under a
    /// partition's grant (`Outcome::Stale`: stop, no ack, no lock to delete).
    pub(crate) fn claim_partitioned(&self, s: &mut State, w: u8, g: Grant) -> Option<()> {
        let (wi, j) = (idx(w), idx(g.job));
        let row = s.pg[j];
        if row.locked_by.is_some() {
            return None; // the UPDATE waits for the row lock
        }
        if row.status.is_terminal() {
            s.workers[wi] = self.leaving(g, true);
            return Some(());
        }
        let equal = row.fence == g.token && self.switches.partition_claim_equal;
        if !(row.fence < g.token || equal || !self.switches.claim_fence) {
            s.workers[wi] = Pc::Idle;
            return Some(());
        }
        let undo = Undo {
            fence: row.fence,
            takeovers: row.takeovers,
            released: row.released,
        };
        let took_over = row.fence > 0 && row.fence < g.token && !row.released;
        let r = &mut s.pg[j];
        r.takeovers = (r.takeovers + u8::from(took_over)).min(9);
        r.fence = g.token;
        r.released = false;
        r.locked_by = Some(w);
        s.workers[wi] = Pc::Running {
            grant: g,
            step: r.step,
            tx: Tx::Open { undo: Some(undo) },
            poisoned: r.takeovers > self.bound.max_takeovers,
        };
        Some(())
    }

    /// `run_steps` at a step boundary with `owned.handing_over()`:
    /// `Outcome::Release` -> `FenceStore::record_release` (`tenure_release`),
    /// then the nak. A transaction the next step had open is rolled back
    /// first ([`Action::EndUnusedTx`] does that here).
    pub(crate) fn release_job(&self, s: &mut State, w: u8) -> Option<()> {
        let wi = idx(w);
        let Pc::Running {
            grant,
            tx: Tx::None,
            poisoned: false,
            ..
        } = s.workers[wi]
        else {
            return None;
        };
        let j = idx(grant.job);
        let row = s.pg[j];
        if !self.handing_over(s, w, grant) || row.locked_by.is_some() {
            return None;
        }
        if row.fence == grant.token && row.status == Status::Live && !row.released {
            s.pg[j].released = true;
            s.ghost.released[j] = true;
            record_commit(&mut s.ghost, grant.job, grant.token, false, None);
        }
        s.workers[wi] = Pc::Idle;
        Some(())
    }
}

/// The guarded delete of `resign` (`lease/leader.rs`): only while the key
/// carries the grant's `create_revision`.
fn resign(s: &mut State, pi: usize, g: Grant) {
    if s.etcd.partitions[pi].is_some_and(|k| k.create_revision == g.token) {
        s.etcd.partitions[pi] = None;
    }
}

/// The properties only partition mode adds.
pub(crate) fn properties() -> Vec<Property<Tenure>> {
    vec![
        Property::always(
            props::ONE_PARTITION_OWNER_PER_TOKEN,
            |m: &Tenure, s: &State| {
                // Per worker, the (partition, token) pairs it owns or runs a
                // job under; no pair may belong to two workers.
                let mut seen: Vec<(usize, u8, u8)> = Vec::new();
                for (w, owns) in s.owns.iter().enumerate().take(m.bound.workers) {
                    let held = owns.iter().filter_map(|o| match o {
                        Own::Owned { grant, .. } => Some((grant.job, grant.token)),
                        _ => None,
                    });
                    let running = s.workers[w]
                        .owner_of()
                        .map(|(job, token, _)| (m.partition_of(job), token));
                    for (p, t) in held.chain(running) {
                        if seen.iter().any(|&(v, q, u)| v != w && q == p && u == t) {
                            return false;
                        }
                        seen.push((w, p, t));
                    }
                }
                true
            },
        ),
        Property::sometimes(props::SOMETIMES_HANDOVER_DONE, |m: &Tenure, s: &State| {
            m.jobs()
                .any(|j| s.pg[idx(j)].status == Status::Done && s.ghost.released[idx(j)])
        }),
    ]
}
