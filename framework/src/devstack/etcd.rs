//! The dev stack's etcd cluster: its members, their start, readiness and leader.

use std::time::Duration;

use super::process::Spec;
use super::ready::{self, Probe, free_ports, poll_ready};
use super::{DevStack, DevStackError, ServerProcess};

impl DevStack {
    /// etcd client endpoints, one per member (`http://127.0.0.1:PORT`;
    /// `https://` with `tls`).
    pub fn etcd_endpoints(&self) -> Vec<String> {
        let scheme = self.scheme();
        self.etcd_client_ports
            .iter()
            .map(|p| format!("{scheme}://127.0.0.1:{p}"))
            .collect()
    }

    /// etcd client options of the stack's administrator (`root` once auth is on).
    pub(super) fn etcd_admin_options(
        &self,
        as_root: bool,
    ) -> Result<etcd_client::ConnectOptions, DevStackError> {
        let mut cfg = crate::Config::new("devstack").with_etcd_endpoints(self.etcd_endpoints());
        if let Some(tls) = &self.tls {
            cfg = cfg.with_etcd_tls(tls.client());
        }
        if let (true, Some(auth)) = (as_root, &self.auth) {
            cfg = cfg.with_etcd_user("root", auth.etcd_root_password.clone());
        }
        crate::lease::etcd_connect_options(&cfg)
            .map_err(|e| DevStackError::io("etcd TLS files", std::io::Error::other(e)))
    }

    /// The etcd member `i` (0-based), for fault injection.
    ///
    /// # Panics
    /// If `i` is out of range or etcd was not started (a test bug).
    #[allow(clippy::panic)]
    pub fn etcd_member(&self, i: usize) -> &ServerProcess {
        self.etcd
            .get(i)
            .unwrap_or_else(|| panic!("no etcd member {i} in this dev stack"))
    }

    /// Number of etcd members.
    pub fn etcd_members(&self) -> usize {
        self.etcd.len()
    }

    /// The index of the current etcd leader, asked of the members that answer.
    ///
    /// # Errors
    /// If no member answers within 5 s.
    pub async fn etcd_leader(&self) -> Result<usize, DevStackError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut last_error = String::from("no member answered");
        while tokio::time::Instant::now() < deadline {
            let options = self.etcd_admin_options(true)?;
            for endpoint in self.etcd_endpoints() {
                match etcd_status(&endpoint, &options).await {
                    Ok((_, leader)) if leader != 0 => {
                        for (i, ep) in self.etcd_endpoints().iter().enumerate() {
                            if let Ok((id, _)) = etcd_status(ep, &options).await
                                && id == leader
                            {
                                return Ok(i);
                            }
                        }
                    }
                    Ok(_) => last_error = "no leader elected".into(),
                    Err(e) => last_error = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(DevStackError::NotReady {
            server: "etcd leader".into(),
            timeout: Duration::from_secs(5),
            last_error,
            log: self.dir().display().to_string(),
            log_tail: ready::log_tail(&self.dir().join("etcd0.log")),
        })
    }

    pub(super) fn start_etcd(&mut self, members: usize) -> Result<(), DevStackError> {
        let ports = free_ports(members * 2)?;
        let (client, peer) = ports.split_at(members);
        self.etcd_peer_ports = peer.to_vec();
        self.etcd_serials = (0..members).collect();
        self.etcd_next_serial = members;
        let cluster = self.etcd_cluster();
        for i in 0..members {
            let spec = self.etcd_spec(i, client[i], peer[i], &cluster, "new");
            self.etcd.push(ServerProcess::start(spec)?);
        }
        self.etcd_client_ports = client.to_vec();
        Ok(())
    }

    /// How to start the member with serial number `serial` (name `m<serial>`,
    /// data directory `etcd<serial>`, log `etcd<serial>.log`) on its ports, in
    /// the cluster `cluster` (`--initial-cluster`), `state` `new` or `existing`.
    pub(super) fn etcd_spec(
        &self,
        serial: usize,
        client: u16,
        peer: u16,
        cluster: &str,
        state: &str,
    ) -> Spec {
        let scheme = self.scheme();
        let data = self.dir().join(format!("etcd{serial}"));
        let mut args = vec![
            format!("--name=m{serial}"),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={scheme}://127.0.0.1:{client}"),
            format!("--advertise-client-urls={scheme}://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster={cluster}"),
            format!("--initial-cluster-state={state}"),
            format!("--initial-cluster-token={}", self.etcd_token()),
            "--logger=zap".into(),
            "--log-level=warn".into(),
        ];
        if let Some(tls) = &self.tls {
            args.extend([
                format!("--cert-file={}", tls.server_cert.display()),
                format!("--key-file={}", tls.server_key.display()),
                format!("--trusted-ca-file={}", tls.ca_file.display()),
                "--client-cert-auth".into(),
            ]);
        }
        Spec {
            name: format!("etcd-{serial}"),
            program: "etcd".into(),
            args,
            run_as: None,
            log: self.dir().join(format!("etcd{serial}.log")),
        }
    }

    /// The etcd cluster's `--initial-cluster` (members `m<serial>` on their
    /// peer ports).
    pub(super) fn etcd_cluster(&self) -> String {
        let members: Vec<String> = (self.etcd_serials.iter().zip(&self.etcd_peer_ports))
            .map(|(serial, port)| format!("m{serial}=http://127.0.0.1:{port}"))
            .collect();
        members.join(",")
    }

    /// The etcd cluster's `--initial-cluster-token` (unique per stack directory).
    pub(super) fn etcd_token(&self) -> String {
        format!("tenure-{}", self.dir().display()).replace('/', "-")
    }

    /// Waits until an etcd write commits (as `root` once started, with
    /// `auth`); with `starting`, fails at once if a member exits.
    pub(super) async fn wait_etcd(
        &self,
        timeout: Duration,
        starting: bool,
    ) -> Result<(), DevStackError> {
        let endpoints = self.etcd_endpoints();
        // Once started, a stack with `auth` has auth on: only `root` may write
        // the probe key (before, etcd refuses any login).
        let options = self.etcd_admin_options(!starting)?;
        let probe = Probe {
            server: "etcd",
            log: self.dir().join("etcd0.log"),
            attempt_timeout: Duration::from_secs(2),
            timeout,
            must_run: if starting {
                self.etcd.iter().collect()
            } else {
                Vec::new()
            },
        };
        poll_ready(probe, || async {
            let mut client = etcd_client::Client::connect(&endpoints, Some(options.clone()))
                .await
                .map_err(|e| e.to_string())?;
            client
                .put("__tenure_devstack_ready", "1", None)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
        .await
    }
}

pub(super) async fn etcd_status(
    endpoint: &str,
    options: &etcd_client::ConnectOptions,
) -> Result<(u64, u64), String> {
    let attempt = async {
        let mut client = etcd_client::Client::connect([endpoint], Some(options.clone()))
            .await
            .map_err(|e| e.to_string())?;
        let status = client.status().await.map_err(|e| e.to_string())?;
        let id = status.header().map(|h| h.member_id()).unwrap_or(0);
        Ok::<_, String>((id, status.leader()))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .map_err(|_| format!("{endpoint}: status timed out"))?
}
