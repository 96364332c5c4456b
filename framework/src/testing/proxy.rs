//! TCP relays for one in-process worker, so that a fault cuts that worker
//! alone: while a relay is cut, its open connections are dropped and new ones
//! are closed at once; the other workers and the server notice nothing.
//!
//! [`Relay`] stands in front of one server (the worker's `database_url` or
//! `nats_url` then names the relay); [`EtcdProxy`] is a relay per etcd
//! member with one switch, which [`Fault::CutEtcd`](super::Fault::CutEtcd)
//! throws.

use std::net::SocketAddr;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// A loopback TCP relay to one server, with a switch that cuts it: what a
/// test gives one worker so that it alone loses PostgreSQL or NATS
/// ([`Relay::url`] rewrites the server's URL to the relay's address).
/// Dropping it cuts it for good.
///
/// ```no_run
/// # async fn demo(stack: &tenure::devstack::DevStack, cfg: tenure::Config) -> std::io::Result<()> {
/// use tenure::testing::Relay;
///
/// let relay = Relay::for_url(&stack.database_url()).await?;
/// let cfg = cfg.with_database_url(relay.url(&stack.database_url()));
/// // ... start a worker with `cfg`, then:
/// relay.cut(); // that worker's PostgreSQL connections drop, new ones fail
/// relay.restore();
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Relay {
    listen: SocketAddr,
    switch: watch::Sender<bool>,
    _accept: AbortOnDropHandle<()>,
}

impl Relay {
    /// A relay on a free loopback port to the host and port of `url`
    /// (`scheme://[user[:password]@]host:port[/...]`).
    ///
    /// # Errors
    /// A URL without a host and port ([`std::io::ErrorKind::InvalidInput`]),
    /// or no loopback port to listen on.
    pub async fn for_url(url: &str) -> std::io::Result<Self> {
        let target = authority(url)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, url.to_string()))?
            .to_string();
        let (switch, _) = watch::channel(false);
        Self::start(target, switch).await
    }

    /// A relay to `target` (`host:port`) thrown by `switch`.
    async fn start(target: String, switch: watch::Sender<bool>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let listen = listener.local_addr()?;
        let accept = tokio::spawn(accept(listener, target, switch.subscribe()));
        Ok(Relay {
            listen,
            switch,
            _accept: AbortOnDropHandle::new(accept),
        })
    }

    /// The address the relay listens on.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// `url` with its host and port replaced by the relay's address.
    pub fn url(&self, url: &str) -> String {
        match authority(url) {
            Some(hostport) => url.replacen(hostport, &self.listen.to_string(), 1),
            None => url.to_string(),
        }
    }

    /// Cuts the relay: open connections drop, new ones close at once.
    pub fn cut(&self) {
        self.switch.send_replace(true);
    }

    /// Relays again (the client reconnects on its own).
    pub fn restore(&self) {
        self.switch.send_replace(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

/// The `host:port` of `scheme://[userinfo@]host:port[/...]`.
fn authority(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let hostport = &rest[..end];
    let hostport = hostport.rsplit_once('@').map_or(hostport, |(_, h)| h);
    hostport.contains(':').then_some(hostport)
}

/// The relays of one worker to every etcd endpoint, thrown by one switch.
pub(super) struct EtcdProxy {
    relays: Vec<Relay>,
    switch: watch::Sender<bool>,
}

impl EtcdProxy {
    /// Listens on a loopback port per endpoint of `targets` (`http://host:port`).
    pub(super) async fn start(targets: &[String]) -> std::io::Result<Self> {
        let (switch, _) = watch::channel(false);
        let mut relays = Vec::with_capacity(targets.len());
        for target in targets {
            let hostport = authority(target).unwrap_or(target).to_string();
            relays.push(Relay::start(hostport, switch.clone()).await?);
        }
        Ok(EtcdProxy { relays, switch })
    }

    /// The endpoints to give the worker.
    pub(super) fn endpoints(&self) -> Vec<String> {
        self.relays
            .iter()
            .map(|r| format!("http://{}", r.addr()))
            .collect()
    }

    /// The switch: `true` cuts.
    pub(super) fn cut_handle(&self) -> watch::Sender<bool> {
        self.switch.clone()
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

/// Copies both ways until either side closes or the cut begins (or the
/// relay is dropped, which cuts it).
async fn forward(mut inbound: TcpStream, target: String, mut cut: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(&target).await else {
        return;
    };
    tokio::select! {
        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_found_behind_users_and_before_paths() {
        assert_eq!(
            authority("postgres://postgres@127.0.0.1:5432/tenure"),
            Some("127.0.0.1:5432")
        );
        assert_eq!(authority("postgres://u:p@h:1/db?x=1"), Some("h:1"));
        assert_eq!(authority("nats://127.0.0.1:4222"), Some("127.0.0.1:4222"));
        assert_eq!(authority("http://127.0.0.1:2379"), Some("127.0.0.1:2379"));
        assert_eq!(authority("postgres://localhost/db"), None);
    }
}
