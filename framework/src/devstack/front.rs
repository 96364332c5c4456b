//! A loopback TCP front that can be re-pointed: the one address every client
//! of the dev stack's replicated PostgreSQL uses (the way a virtual IP,
//! HAProxy or PgBouncer stands in front of a primary in production), and the
//! standby's replication link to the primary, which a test can cut.
//!
//! It runs on a thread of its own with its own runtime, so it serves whatever
//! runtime (or none) the stack's owner uses, and stops when dropped.

use std::net::SocketAddr;
use std::thread::JoinHandle;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::DevStackError;

/// Where the front sends connections, and what ends the open ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    /// The backend's loopback port.
    target: u16,
    /// Bumped by every switch or cut: a connection opened under an older
    /// epoch ends.
    epoch: u64,
    /// New connections are closed at once.
    cut: bool,
    /// The front is dropped.
    stop: bool,
}

/// A re-pointable TCP relay on a free loopback port.
#[derive(Debug)]
pub(super) struct Front {
    addr: SocketAddr,
    route: watch::Sender<Route>,
    thread: Option<JoinHandle<()>>,
}

impl Front {
    /// Listens on a free loopback port and relays to `127.0.0.1:target`.
    pub(super) fn start(name: &str, target: u16) -> Result<Self, DevStackError> {
        let fail = |e| DevStackError::io(format!("start the {name} front"), e);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(fail)?;
        listener.set_nonblocking(true).map_err(fail)?;
        let addr = listener.local_addr().map_err(fail)?;
        let (route, rx) = watch::channel(Route {
            target,
            epoch: 0,
            cut: false,
            stop: false,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(fail)?;
        let thread = std::thread::Builder::new()
            .name(format!("tenure-devstack-{name}"))
            .spawn(move || {
                runtime.block_on(async move {
                    if let Ok(listener) = TcpListener::from_std(listener) {
                        accept(listener, rx).await;
                    }
                });
            })
            .map_err(fail)?;
        Ok(Front {
            addr,
            route,
            thread: Some(thread),
        })
    }

    /// The port clients connect to.
    pub(super) fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Sends new connections to `127.0.0.1:target`, drops every open one
    /// (they lead to the old backend) and lifts a cut.
    pub(super) fn point_to(&self, target: u16) {
        self.route.send_modify(|r| {
            r.target = target;
            r.epoch += 1;
            r.cut = false;
        });
    }

    /// Drops every open connection and closes new ones at once.
    pub(super) fn cut(&self) {
        self.route.send_modify(|r| {
            r.epoch += 1;
            r.cut = true;
        });
    }

    /// Relays new connections again after a [`cut`](Self::cut).
    pub(super) fn restore(&self) {
        self.route.send_modify(|r| r.cut = false);
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.route.send_modify(|r| r.stop = true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts until the front is dropped; each connection is relayed by a task
/// of the front's runtime (they all end with it).
async fn accept(listener: TcpListener, mut rx: watch::Receiver<Route>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                let route = *rx.borrow();
                if route.cut {
                    drop(inbound);
                    continue;
                }
                tokio::spawn(forward(inbound, route, rx.clone()));
            }
            changed = rx.changed() => {
                if changed.is_err() || rx.borrow().stop {
                    return;
                }
            }
        }
    }
}

/// Copies both ways until either side closes, or the route changes epoch
/// (switched or cut), or the front stops.
async fn forward(mut inbound: TcpStream, route: Route, mut rx: watch::Receiver<Route>) {
    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", route.target)).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = rx.wait_for(|r| r.epoch != route.epoch || r.stop) => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream as StdStream;
    use std::time::Duration;

    /// A loopback backend that answers every connection with `tag`, then
    /// keeps it open.
    fn backend(tag: &'static [u8]) -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            for mut conn in listener.incoming().flatten() {
                let _ = conn.write_all(tag);
                open.push(conn);
            }
        });
        port
    }

    /// Connects through `front` and reads what the backend says: `None` if
    /// the connection is closed first.
    fn hello(front: &Front) -> Option<Vec<u8>> {
        let mut conn = StdStream::connect(("127.0.0.1", front.port())).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 1];
        match conn.read(&mut buf) {
            Ok(1) => Some(buf.to_vec()),
            _ => None,
        }
    }

    #[test]
    fn relays_is_cut_and_is_pointed_elsewhere() {
        let (a, b) = (backend(b"a"), backend(b"b"));
        let front = Front::start("test", a).unwrap();
        let mut before = StdStream::connect(("127.0.0.1", front.port())).unwrap();
        before
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(before.read(&mut buf).unwrap(), 1, "relayed to a");

        front.cut();
        assert_eq!(hello(&front), None, "new connections closed while cut");
        assert_eq!(before.read(&mut buf).unwrap_or(0), 0, "open ones dropped");

        front.restore();
        assert_eq!(hello(&front), Some(b"a".to_vec()));
        front.point_to(b);
        assert_eq!(hello(&front), Some(b"b".to_vec()), "pointed at b");
    }
}
