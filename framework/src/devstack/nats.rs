//! The dev stack's NATS server (JetStream): its start, readiness and URLs.

use std::time::Duration;

use super::process::Spec;
use super::ready::{Probe, free_ports, poll_ready};
use super::{DevStack, DevStackError, ServerProcess, secure, write_private};

impl DevStack {
    /// The NATS URL (`nats://127.0.0.1:PORT`); for a cluster
    /// ([`DevStackOptions::nats_cluster`](super::DevStackOptions::nats_cluster))
    /// every node's, comma-separated, as [`Config::nats_url`](crate::Config::nats_url)
    /// takes them.
    pub fn nats_url(&self) -> String {
        self.nats_urls().join(",")
    }

    /// Each NATS node's URL, in node order ([`DevStack::nats_node`]).
    pub fn nats_urls(&self) -> Vec<String> {
        self.nats_ports
            .iter()
            .map(|port| format!("nats://127.0.0.1:{port}"))
            .collect()
    }

    /// The NATS server (the first node of a cluster), for fault injection.
    ///
    /// # Panics
    /// If NATS was not started (a test bug).
    pub fn nats(&self) -> &ServerProcess {
        self.nats_node(0)
    }

    /// NATS node `i` (0-based) of the stack, for fault injection: `kill`, then
    /// `restart` on the same ports and store directory.
    ///
    /// # Panics
    /// If there is no such node (a test bug).
    #[allow(clippy::panic)]
    pub fn nats_node(&self, i: usize) -> &ServerProcess {
        self.nats
            .get(i)
            .unwrap_or_else(|| panic!("no NATS node {i} in this dev stack"))
    }

    /// Every NATS node of the stack (one unless it is a cluster).
    pub fn nats_nodes(&self) -> &[ServerProcess] {
        &self.nats
    }

    /// The node (index for [`DevStack::nats_node`]) that is the JetStream
    /// meta leader of a cluster, from the nodes' monitoring (`/jsz`); `None`
    /// for a single server or when no node names one.
    pub async fn nats_meta_leader(&self) -> Option<usize> {
        for port in &self.nats_http_ports {
            let Ok(Ok(jsz)) =
                tokio::time::timeout(Duration::from_secs(2), http_get_json(*port, "/jsz")).await
            else {
                continue;
            };
            let leader = jsz["meta_cluster"]["leader"].as_str().unwrap_or_default();
            let found = self
                .nats_ports
                .iter()
                .position(|p| leader == format!("tenure-dev-{p}"));
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// Starts one server (`nodes` 0 or 1) or a cluster of `nodes`.
    pub(super) fn start_nats(&mut self, nodes: usize) -> Result<(), DevStackError> {
        if nodes <= 1 {
            return self.start_nats_on(free_ports(1)?[0]);
        }
        let ports = free_ports(3 * nodes)?;
        let (client, rest) = ports.split_at(nodes);
        let (cluster, http) = rest.split_at(nodes);
        for i in 0..nodes {
            let routes: Vec<String> = (0..nodes)
                .filter(|j| *j != i)
                .map(|j| format!("nats://127.0.0.1:{}", cluster[j]))
                .collect();
            let mut spec = self.nats_spec(&format!("nats-{}", i + 1), client[i]);
            spec.args.extend([
                "--cluster".into(),
                format!("nats://127.0.0.1:{}", cluster[i]),
                "--cluster_name".into(),
                "tenure-dev".into(),
                "--routes".into(),
                routes.join(","),
                // Clients use the URLs they were given, never the nodes'
                // own (a torture worker's go through its fault proxy).
                "--no_advertise=true".into(),
                // Monitoring, on 127.0.0.1 like the client port (`-a`):
                // `/jsz` names the meta leader.
                "-m".into(),
                http[i].to_string(),
            ]);
            self.nats_http_ports.push(http[i]);
            self.spawn_nats(spec, client[i])?;
        }
        Ok(())
    }

    pub(super) fn start_nats_on(&mut self, port: u16) -> Result<(), DevStackError> {
        let spec = self.nats_spec("nats", port);
        self.spawn_nats(spec, port)
    }

    /// A node `name` on client port `port`, its store `<dir>/<name>` and its
    /// log `<dir>/<name>.log`.
    fn nats_spec(&self, name: &str, port: u16) -> Spec {
        let store = self.dir().join(name);
        Spec {
            name: name.into(),
            program: "nats-server".into(),
            args: vec![
                "-js".into(),
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
                "-sd".into(),
                store.display().to_string(),
                "--server_name".into(),
                format!("tenure-dev-{port}"),
            ],
            run_as: None,
            log: self.dir().join(format!("{name}.log")),
        }
    }

    fn spawn_nats(&mut self, mut spec: Spec, port: u16) -> Result<(), DevStackError> {
        if self.tls.is_some() || self.auth.is_some() {
            let conf = self.dir().join("nats.conf");
            let text = secure::nats_conf(self.tls.as_ref(), self.auth.as_ref());
            write_private(&conf, text.as_bytes())?;
            spec.args.extend(["-c".into(), conf.display().to_string()]);
        }
        self.nats.push(ServerProcess::start(spec)?);
        self.nats_ports.push(port);
        Ok(())
    }

    /// Waits until JetStream answers on every node (a cluster: each node
    /// reaches a meta leader); with `starting`, fails at once if a server exits.
    pub(super) async fn wait_nats(
        &self,
        timeout: Duration,
        starting: bool,
    ) -> Result<(), DevStackError> {
        let urls = self.nats_urls();
        let probe = Probe {
            server: "nats",
            log: self.nats().log_path().to_path_buf(),
            attempt_timeout: Duration::from_secs(2),
            timeout,
            must_run: self.nats.iter().filter(|_| starting).collect(),
        };
        poll_ready(probe, || async {
            for url in &urls {
                self.jetstream_answers(url).await?;
            }
            Ok(())
        })
        .await
    }

    /// One JetStream account-info request through the server at `url`.
    async fn jetstream_answers(&self, url: &str) -> Result<(), String> {
        let client = self
            .nats_admin_options()
            .connect(url)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        // A raw account-info request: typed `query_account` does not parse
        // nats-server 2.9's answer with every async-nats version.
        let reply = client
            .request("$JS.API.INFO", bytes::Bytes::new())
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let text = String::from_utf8_lossy(&reply.payload);
        if text.contains("\"error\"") {
            return Err(format!("{url}: JetStream not ready: {text}"));
        }
        Ok(())
    }

    pub(super) fn nats_admin_options(&self) -> async_nats::ConnectOptions {
        let mut options = async_nats::ConnectOptions::new();
        if let Some(tls) = &self.tls {
            options = options
                .require_tls(true)
                .add_root_certificates(tls.ca_file.clone())
                .add_client_certificate(tls.client_cert.clone(), tls.client_key.clone());
        }
        if let Some(auth) = &self.auth {
            options =
                options.user_and_password("admin".into(), auth.nats_admin_password.expose().into());
        }
        options
    }
}

/// `GET path` on a loopback HTTP port, its body as JSON.
async fn http_get_json(port: u16, path: &str) -> Result<serde_json::Value, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    conn.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).map_err(|e| e.to_string())
}
