//! The ledger demo. For now it starts the embedded dev stack (or uses the servers
//! named by `TENURE_*`), prints the endpoints and checks each server answers.

use std::time::Duration;

use anyhow::Context;
use tenure::Config;
use tenure::devstack::DevStack;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (_stack, cfg) = if Config::env_has_servers() {
        (None, Config::from_env().context("reading TENURE_* variables")?)
    } else {
        println!("starting the embedded dev stack (3 etcd members, NATS, PostgreSQL)...");
        let stack = DevStack::start().await.context("starting the dev stack")?;
        let cfg = Config::new("ledger")
            .with_etcd_endpoints(stack.etcd_endpoints())
            .with_nats_url(stack.nats_url())
            .with_database_url(stack.database_url());
        (Some(stack), cfg)
    };
    println!("etcd:       {}", cfg.etcd_endpoints.join(","));
    println!("nats:       {}", cfg.nats_url);
    println!("postgresql: {}", cfg.database_url);
    if let Some(stack) = &_stack {
        stack
            .wait_ready(Duration::from_secs(30))
            .await
            .context("health check")?;
        println!("health: etcd writes commit, JetStream answers, PostgreSQL accepts connections");
    }
    Ok(())
}
