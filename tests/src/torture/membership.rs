//! etcd membership changes under load (`--membership-faults`, issue 36):
//! `etcd_member_replace` (a member removed, a fresh one with an empty data
//! directory added) and `etcd_grow_shrink` (3 -> 5 -> 3: two members added one
//! at a time, then two removed, the leader among them every other time).
//!
//! A new member listens on new ports. The workers were given their proxies'
//! addresses, one per member; after each change the parent points those
//! proxies at the members there are now, as a DNS name or a load balancer in
//! front of etcd would (`Proxy::retarget`). Without that (`TORTURE_NO_FOLLOW=1`
//! in the parent's environment, a demonstration), every replacement takes one
//! address of the workers' lists away for good, and once no original member
//! is left the workers cannot reach etcd.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use super::{Run, ms};

/// How long etcd may refuse one change (`unhealthy cluster` for the 5 s after
/// a member connected) or a new member may take to catch up.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);

impl Run {
    /// `etcd_member_replace`: a member drawn by `rng` (the leader one time in
    /// three) removed, then a fresh member added in its place.
    pub(super) async fn etcd_member_replace(&mut self, rng: &mut StdRng) -> anyhow::Result<()> {
        let started = Instant::now();
        let n = self.stack.etcd_members();
        let leader = self.stack.etcd_leader().await.ok();
        let victim = match leader {
            Some(l) if rng.random_range(0..3) == 0 => l,
            _ => rng.random_range(0..n),
        };
        self.stack
            .etcd_remove_member(victim, CHANGE_TIMEOUT)
            .await?;
        self.follow_members();
        let removed = started.elapsed();
        self.stack.etcd_add_member(CHANGE_TIMEOUT).await?;
        self.follow_members();
        eprintln!(
            "torture: etcd_member_replace: member {victim} (leader: {}) removed in {:.1}s, \
             a fresh one added and caught up in {:.1}s more",
            leader.map_or("unknown".into(), |l| l.to_string()),
            removed.as_secs_f64(),
            (started.elapsed() - removed).as_secs_f64(),
        );
        self.ready().await
    }

    /// `etcd_grow_shrink`: 3 -> 5 -> 3 members. Two fresh members added one at
    /// a time (each caught up before the next), work goes on for 0.5 to 2 s on
    /// five, then two members drawn by `rng` removed one at a time; every
    /// other time the leader is one of them.
    pub(super) async fn etcd_grow_shrink(&mut self, rng: &mut StdRng) -> anyhow::Result<()> {
        let started = Instant::now();
        for _ in 0..2 {
            self.stack.etcd_add_member(CHANGE_TIMEOUT).await?;
            self.follow_members();
        }
        let grown = started.elapsed();
        let size = self.stack.etcd_members();
        tokio::time::sleep(ms(rng, Duration::from_millis(500), Duration::from_secs(2))).await;
        let leader = self.stack.etcd_leader().await.ok();
        let first = match leader {
            Some(l) if rng.random_bool(0.5) => l,
            _ => rng.random_range(0..size),
        };
        let second = (first + rng.random_range(1..size)) % size;
        // The larger index first: the smaller one still names the same member.
        for victim in [first.max(second), first.min(second)] {
            self.stack
                .etcd_remove_member(victim, CHANGE_TIMEOUT)
                .await?;
            self.follow_members();
        }
        eprintln!(
            "torture: etcd_grow_shrink: grew to {size} in {:.1}s, removed members \
             {first} and {second} (leader: {}) in {:.1}s",
            grown.as_secs_f64(),
            leader.map_or("unknown".into(), |l| l.to_string()),
            (started.elapsed() - grown).as_secs_f64(),
        );
        self.ready().await
    }

    /// Points every worker's etcd proxies at the members there are now
    /// (the `i`-th address at member `i`, wrapping around when there are fewer
    /// members than addresses). Connections already open stay on their member
    /// until it goes away. Not with `TORTURE_NO_FOLLOW` set.
    fn follow_members(&self) {
        let members = self.stack.etcd_endpoints();
        if std::env::var_os("TORTURE_NO_FOLLOW").is_some() {
            return;
        }
        for slot in &self.slots {
            slot.proxy.retarget(&members);
        }
    }
}
