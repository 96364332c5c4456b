//! The dev stack's NATS server (JetStream): its start, readiness and URLs.

use std::time::Duration;

use super::process::Spec;
use super::ready::{Probe, free_ports, poll_ready};
use super::{DevStack, DevStackError, ServerProcess, secure, write_private};

impl DevStack {
    /// The NATS server URL (`nats://127.0.0.1:PORT`).
    pub fn nats_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.nats_port)
    }

    /// The NATS server, for fault injection.
    ///
    /// # Panics
    /// If NATS was not started (a test bug).
    #[allow(clippy::panic)]
    pub fn nats(&self) -> &ServerProcess {
        self.nats
            .as_ref()
            .unwrap_or_else(|| panic!("NATS was not started in this dev stack"))
    }

    pub(super) fn start_nats(&mut self) -> Result<(), DevStackError> {
        self.start_nats_on(free_ports(1)?[0])
    }

    pub(super) fn start_nats_on(&mut self, port: u16) -> Result<(), DevStackError> {
        let store = self.dir().join("nats");
        let spec = Spec {
            name: "nats".into(),
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
            log: self.dir().join("nats.log"),
        };
        let mut spec = spec;
        if self.tls.is_some() || self.auth.is_some() {
            let conf = self.dir().join("nats.conf");
            let text = secure::nats_conf(self.tls.as_ref(), self.auth.as_ref());
            write_private(&conf, text.as_bytes())?;
            spec.args.extend(["-c".into(), conf.display().to_string()]);
        }
        self.nats = Some(ServerProcess::start(spec)?);
        self.nats_port = port;
        Ok(())
    }

    /// Waits until JetStream answers; with `starting`, fails at once if the
    /// server exits.
    pub(super) async fn wait_nats(
        &self,
        timeout: Duration,
        starting: bool,
    ) -> Result<(), DevStackError> {
        let url = self.nats_url();
        let probe = Probe {
            server: "nats",
            log: self.dir().join("nats.log"),
            attempt_timeout: Duration::from_secs(2),
            timeout,
            must_run: self.nats.iter().filter(|_| starting).collect(),
        };
        poll_ready(probe, || async {
            let client = self
                .nats_admin_options()
                .connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            // A raw account-info request: typed `query_account` does not parse
            // nats-server 2.9's answer with every async-nats version.
            let reply = client
                .request("$JS.API.INFO", bytes::Bytes::new())
                .await
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&reply.payload);
            if text.contains("\"error\"") {
                return Err(format!("JetStream not ready: {text}"));
            }
            Ok(())
        })
        .await
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
