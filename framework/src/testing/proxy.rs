//! A TCP proxy in front of each etcd member for one in-process worker, so
//! that [`Fault::CutEtcd`](super::Fault::CutEtcd) cuts that worker alone:
//! while cut, its open connections are dropped and new ones are closed at
//! once; the other workers and etcd itself notice nothing.

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxies of one worker (one per etcd endpoint) and their cut switch.
pub(super) struct EtcdProxy {
    endpoints: Vec<String>,
    cut: watch::Sender<bool>,
}

impl EtcdProxy {
    /// Listens on a loopback port per endpoint of `targets` (`http://host:port`).
    pub(super) async fn start(targets: &[String]) -> std::io::Result<Self> {
        let (cut, _) = watch::channel(false);
        let mut endpoints = Vec::with_capacity(targets.len());
        for target in targets {
            let addr = target
                .trim_start_matches("http://")
                .trim_start_matches("https://")
                .to_string();
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            endpoints.push(format!("http://{}", listener.local_addr()?));
            tokio::spawn(accept(listener, addr, cut.subscribe()));
        }
        Ok(EtcdProxy { endpoints, cut })
    }

    /// The endpoints to give the worker.
    pub(super) fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    /// The switch: `true` cuts.
    pub(super) fn cut_handle(&self) -> watch::Sender<bool> {
        self.cut.clone()
    }
}

async fn accept(listener: TcpListener, target: String, cut: watch::Receiver<bool>) {
    while let Ok((inbound, _)) = listener.accept().await {
        if *cut.borrow() {
            drop(inbound);
            continue;
        }
        tokio::spawn(forward(inbound, target.clone(), cut.clone()));
    }
}

/// Copies both ways until either side closes or the cut begins.
async fn forward(mut inbound: TcpStream, target: String, mut cut: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(&target).await else {
        return;
    };
    tokio::select! {
        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}
