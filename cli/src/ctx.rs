//! The servers, the bound on each call, and naming a failed call.

use std::future::Future;
use std::time::Duration;

use anyhow::anyhow;
use serde::Serialize;
use tenure::blocks::fence::FenceStore;
use tenure::blocks::queue::Queue;
use tenure::security::redact_url as redact;
use tenure::{Client, Config};

/// The servers and the bound on each call.
pub struct Ctx {
    pub cfg: Config,
    pub timeout: Duration,
    pub json: bool,
}

impl Ctx {
    pub fn postgres(&self) -> String {
        format!("PostgreSQL at {}", redact(&self.cfg.database_url))
    }

    pub fn nats(&self) -> String {
        format!("NATS at {}", redact(&self.cfg.nats_url))
    }

    /// Runs `fut` against `server`, bounded by the timeout.
    pub async fn call<T, E: std::error::Error>(
        &self,
        server: &str,
        what: &str,
        fut: impl Future<Output = Result<T, E>>,
    ) -> anyhow::Result<T> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(anyhow!("{what}: {server}: {}", describe(&e))),
            Err(_) => Err(anyhow!(
                "{what}: {server} did not answer within {:?}",
                self.timeout
            )),
        }
    }

    pub async fn store(&self) -> anyhow::Result<FenceStore> {
        let connected = self
            .call(
                &self.postgres(),
                "cannot connect",
                FenceStore::connect(&self.cfg),
            )
            .await;
        match connected {
            Ok(store) => Ok(store),
            // The pool retries refused connections until its deadline; say why.
            Err(e) => match self.probe_postgres().await {
                Some(why) => Err(anyhow!("{e} ({why})")),
                None => Err(e),
            },
        }
    }

    /// Why PostgreSQL's TCP port cannot be reached, if it cannot.
    async fn probe_postgres(&self) -> Option<String> {
        let opts: sqlx::postgres::PgConnectOptions = self.cfg.database_url.parse().ok()?;
        let (host, port) = (opts.get_host().to_string(), opts.get_port());
        if host.starts_with('/') {
            return None; // a Unix socket
        }
        let attempt = tokio::net::TcpStream::connect((host.as_str(), port));
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("TCP connect to {host}:{port}: {e}")),
            Err(_) => Some(format!("TCP connect to {host}:{port}: no answer")),
        }
    }

    pub async fn queue(&self) -> anyhow::Result<Queue> {
        self.call(&self.nats(), "cannot connect", Queue::connect(&self.cfg))
            .await
    }

    pub async fn client(&self) -> anyhow::Result<Client> {
        // Each server on its own first, so an error names the one that failed.
        self.store().await?;
        self.queue().await?;
        self.call(
            "PostgreSQL and NATS",
            "cannot connect",
            Client::connect(&self.cfg),
        )
        .await
    }

    pub fn print<T: Serialize>(
        &self,
        value: &T,
        table: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value)?);
        } else {
            print!("{}", table());
        }
        Ok(())
    }
}

/// The error and its sources, each once.
pub fn describe(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}
