//! Starts the newest commit's dev stack and keeps it until standard input
//! closes; prints `export` lines for the servers' URLs and their pids, so
//! every commit's bisect run meets the same servers.

use std::io::Read;

use tenure::devstack::DevStack;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let stack = DevStack::start().await?;
    let join = |v: Vec<u32>| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let etcd = (0..stack.etcd_members())
        .filter_map(|i| stack.etcd_member(i).pid())
        .collect();
    println!(
        "export TENURE_ETCD_ENDPOINTS={}",
        stack.etcd_endpoints().join(",")
    );
    println!("export TENURE_NATS_URL={}", stack.nats_url());
    println!("export TENURE_DATABASE_URL={}", stack.database_url());
    println!(
        "export BISECT_PIDS='etcd={};nats={};postgres={}'",
        join(etcd),
        join(stack.nats().pid().into_iter().collect()),
        join(stack.postgres().pid().into_iter().collect())
    );
    println!("READY");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(stack);
    Ok(())
}
