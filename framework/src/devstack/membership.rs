//! etcd membership changes of the dev stack, as an operator makes them: a
//! member added (`MemberAdd`, then a fresh process with an empty data directory
//! started with `--initial-cluster-state existing`) or removed (`MemberRemove`,
//! then its process stopped and its data directory deleted).
//!
//! etcd 3.4's rules, which these methods follow: one change at a time, and a new
//! member started and caught up before the next change (3 members and 1 added but
//! not started are 4 with a quorum of 3: one more failure loses the cluster).
//! With `--strict-reconfig-check` (on by default) etcd refuses a change while a
//! member has been connected for less than 5 s (`unhealthy cluster`) or while too
//! few members are started; such refusals are retried until the timeout.
//!
//! A new member gets new ports: clients that were given the old endpoint list do
//! not learn it (see the production guide, "High availability").

use std::time::Duration;

use etcd_client::Member;

use super::ready::{Probe, free_ports, poll_ready};
use super::{DevStack, DevStackError, ServerProcess};

/// How often a refused change is tried again.
const RETRY_EVERY: Duration = Duration::from_millis(200);

impl DevStack {
    /// Adds a fresh etcd member: `MemberAdd` with its peer URL, then a new
    /// process on new loopback ports with an empty data directory, started with
    /// `--initial-cluster-state existing` and the `--initial-cluster` the
    /// answer lists. Returns once the member serves a linearizable read (it has
    /// applied everything committed before the read), with its index (the last).
    ///
    /// # Errors
    /// [`DevStackError::Membership`] if etcd keeps refusing the change for
    /// `timeout`; [`DevStackError::NotReady`] or [`DevStackError::Exited`] if the
    /// new member does not catch up (it is then removed again).
    pub async fn etcd_add_member(&mut self, timeout: Duration) -> Result<usize, DevStackError> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match self.etcd_add_member_once(timeout).await {
                Err(e) if e.is_port_clash() && attempt < ATTEMPTS => attempt += 1,
                added => return added,
            }
        }
    }

    /// One try of [`DevStack::etcd_add_member`] on new ports; a member that
    /// does not catch up is removed again.
    async fn etcd_add_member_once(&mut self, timeout: Duration) -> Result<usize, DevStackError> {
        let ports = free_ports(2)?;
        let (client_port, peer_port) = (ports[0], ports[1]);
        let serial = self.etcd_next_serial;
        self.etcd_next_serial += 1;
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let (id, cluster) = self.member_add(&peer_url, serial, timeout).await?;
        let spec = self.etcd_spec(serial, client_port, peer_port, &cluster, "existing");
        let process = match ServerProcess::start(spec) {
            Ok(p) => p,
            Err(e) => {
                let _ = self.member_remove(id, None, timeout).await;
                return Err(e);
            }
        };
        self.etcd.push(process);
        self.etcd_client_ports.push(client_port);
        self.etcd_peer_ports.push(peer_port);
        self.etcd_serials.push(serial);
        let index = self.etcd.len() - 1;
        if let Err(e) = self.wait_etcd_member(index, timeout).await {
            let _ = self.etcd_remove_member(index, timeout).await;
            return Err(e);
        }
        Ok(index)
    }

    /// Removes etcd member `i`: `MemberRemove` (asked of the other members),
    /// then its process is killed (by pid; a removed member usually exits by
    /// itself) and its data directory deleted. The members after `i` move down
    /// one index. Removing the leader is allowed: it steps down and the others
    /// elect a new one. Returns once a write commits on the remaining members.
    ///
    /// # Errors
    /// [`DevStackError::Membership`] if `i` is the last member or etcd keeps
    /// refusing the change for `timeout`; [`DevStackError::NotReady`] if the
    /// remaining members do not commit a write within `timeout`.
    pub async fn etcd_remove_member(
        &mut self,
        i: usize,
        timeout: Duration,
    ) -> Result<(), DevStackError> {
        if i >= self.etcd.len() || self.etcd.len() < 2 {
            return Err(DevStackError::Membership {
                what: format!("remove member {i}"),
                detail: format!("the cluster has {} members", self.etcd.len()),
            });
        }
        let peer_url = format!("http://127.0.0.1:{}", self.etcd_peer_ports[i]);
        let id = self.member_id(&peer_url, i, timeout).await?;
        self.member_remove(id, Some(i), timeout).await?;
        let process = self.etcd.remove(i);
        self.etcd_client_ports.remove(i);
        self.etcd_peer_ports.remove(i);
        let serial = self.etcd_serials.remove(i);
        process.kill()?;
        drop(process);
        let data = self.dir().join(format!("etcd{serial}"));
        std::fs::remove_dir_all(&data)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .map_err(|e| DevStackError::io(format!("remove {}", data.display()), e))?;
        self.wait_etcd(timeout, false).await
    }

    /// A client of the stack's administrator on every member except `skip`.
    async fn admin_client(&self, skip: Option<usize>) -> Result<etcd_client::Client, String> {
        let endpoints: Vec<String> = (self.etcd_endpoints().into_iter().enumerate())
            .filter(|(i, _)| Some(*i) != skip)
            .map(|(_, e)| e)
            .collect();
        let options = self.etcd_admin_options(true).map_err(|e| e.to_string())?;
        etcd_client::Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| e.to_string())
    }

    /// `MemberAdd` of `peer_url`, retried while etcd refuses it; the new
    /// member's id and the `--initial-cluster` it starts with (itself as
    /// `m<serial>`).
    async fn member_add(
        &self,
        peer_url: &str,
        serial: usize,
        timeout: Duration,
    ) -> Result<(u64, String), DevStackError> {
        let (id, members) = self
            .retry_refused("member add", timeout, None, |mut c| async move {
                match c.member_add([peer_url], None).await {
                    Ok(added) => {
                        let id = added.member().map(Member::id).unwrap_or(0);
                        Ok((id, added.member_list().to_vec()))
                    }
                    // A retry after an answer that was lost: already added.
                    Err(e) if e.to_string().contains("Peer URLs already exists") => {
                        let list = c.member_list().await.map_err(|e| e.to_string())?;
                        let id = with_peer_url(list.members(), peer_url).unwrap_or(0);
                        Ok((id, list.members().to_vec()))
                    }
                    Err(e) => Err(e.to_string()),
                }
            })
            .await?;
        let mut cluster = Vec::new();
        for m in &members {
            let name = if m.id() == id {
                format!("m{serial}")
            } else if m.name().is_empty() {
                // Another member added and not started: a second change
                // before the first finished, which etcd 3.4 must not see.
                return Err(DevStackError::Membership {
                    what: "member add".into(),
                    detail: format!("member {:x} was added but never started", m.id()),
                });
            } else {
                m.name().to_string()
            };
            cluster.extend(m.peer_urls().iter().map(|u| format!("{name}={u}")));
        }
        Ok((id, cluster.join(",")))
    }

    /// `MemberRemove` of `id` (asked of the members other than `skip`),
    /// retried while etcd refuses it.
    async fn member_remove(
        &self,
        id: u64,
        skip: Option<usize>,
        timeout: Duration,
    ) -> Result<(), DevStackError> {
        self.retry_refused("member remove", timeout, skip, |mut c| async move {
            match c.member_remove(id).await {
                Ok(_) => Ok(()),
                // A retry after an answer that was lost: already done.
                Err(e) if e.to_string().contains("member not found") => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
    }

    /// The etcd id of member `i`, whose peer URL is `peer_url`, from the
    /// member list of the others.
    async fn member_id(
        &self,
        peer_url: &str,
        i: usize,
        timeout: Duration,
    ) -> Result<u64, DevStackError> {
        let list = self
            .retry_refused("member list", timeout, Some(i), |mut c| async move {
                c.member_list().await.map_err(|e| e.to_string())
            })
            .await?;
        with_peer_url(list.members(), peer_url).ok_or_else(|| DevStackError::Membership {
            what: format!("remove member {i}"),
            detail: format!("no member has the peer URL {peer_url}"),
        })
    }

    /// Runs `call` on an administrator's client (of the members but `skip`)
    /// until it succeeds; etcd's refusals (`unhealthy cluster`, `not enough
    /// started members`, a leader election) are retried every 200 ms for
    /// `timeout`.
    async fn retry_refused<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        skip: Option<usize>,
        mut call: F,
    ) -> Result<T, DevStackError>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let attempt = async {
                let client = self.admin_client(skip).await?;
                call(client).await
            };
            let error = match tokio::time::timeout(Duration::from_secs(5), attempt).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => e,
                Err(_) => "no answer within 5 s".into(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(DevStackError::Membership {
                    what: what.into(),
                    detail: format!("still refused after {timeout:?}: {error}"),
                });
            }
            tracing::debug!(what, error, "etcd membership change refused; retrying");
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }

    /// Waits until member `i` alone serves a linearizable read: it is started,
    /// connected to the leader and has applied every entry committed before the
    /// read.
    async fn wait_etcd_member(&self, i: usize, timeout: Duration) -> Result<(), DevStackError> {
        let endpoint = self.etcd_endpoints()[i].clone();
        let options = self.etcd_admin_options(true)?;
        let process = &self.etcd[i];
        let probe = Probe {
            server: "etcd (new member)",
            log: process.log_path().to_path_buf(),
            attempt_timeout: Duration::from_secs(2),
            timeout,
            must_run: vec![process],
        };
        poll_ready(probe, || async {
            let mut client = etcd_client::Client::connect([&endpoint], Some(options.clone()))
                .await
                .map_err(|e| e.to_string())?;
            client
                .get("__tenure_devstack_ready", None)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
        .await
    }
}

/// The id of the member of `members` whose peer URL is `peer_url`.
fn with_peer_url(members: &[Member], peer_url: &str) -> Option<u64> {
    members
        .iter()
        .find(|m| m.peer_urls().iter().any(|u| u == peer_url))
        .map(Member::id)
}
