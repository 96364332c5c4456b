//! Round trips to PostgreSQL, counted on the wire (`PEERS_STATEMENTS=1`): a
//! loopback proxy in front of the dev stack's PostgreSQL reads what clients
//! send and counts each `Query` (a simple query, which may carry several
//! statements) and each `Sync` (the end of an extended-protocol exchange):
//! the messages after which a client waits for the server's `ReadyForQuery`.
//!
//! Also compiled into `benches/peers` (by path: that package is outside the
//! workspace), so it uses nothing but tokio and anyhow.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `SSLRequest` and `GSSENCRequest`: untyped messages before the startup.
const PRE_STARTUP: [u32; 2] = [80_877_103, 80_877_104];

/// A running proxy: its address and its counter.
#[derive(Debug)]
pub struct Proxy {
    /// `host:port` to connect to instead of PostgreSQL.
    pub addr: String,
    trips: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`) on 127.0.0.1.
    pub async fn start(upstream: String) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let trips = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let (counter, opened) = (trips.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                opened.fetch_add(1, Ordering::Relaxed);
                let (upstream, counter) = (upstream.clone(), counter.clone());
                tokio::spawn(async move {
                    let _ = relay(client, &upstream, &counter).await;
                });
            }
        });
        Ok(Proxy {
            addr,
            trips,
            connections,
        })
    }

    /// A proxy in front of the server of `url` (`postgres://user@host:port/db?..`),
    /// and `url` with its address.
    ///
    /// # Errors
    /// A URL without a user or a database; a failed bind.
    pub async fn in_front_of(url: &str) -> Result<(Proxy, String)> {
        // The host and port sit between '@' and '/'.
        let at = url.find('@').context("the URL has no user")? + 1;
        let end = at + url[at..].find('/').context("the URL has no database")?;
        let proxy = Proxy::start(url[at..end].to_string()).await?;
        let through = format!("{}{}{}", &url[..at], proxy.addr, &url[end..]);
        Ok((proxy, through))
    }

    /// The round trips since the last call.
    pub fn take(&self) -> u64 {
        self.trips.swap(0, Ordering::Relaxed)
    }

    /// The connections opened through the proxy since the last call.
    pub fn take_connections(&self) -> u64 {
        self.connections.swap(0, Ordering::Relaxed)
    }
}

/// Copies both ways; counts what the client sends.
async fn relay(client: TcpStream, upstream: &str, trips: &AtomicU64) -> Result<()> {
    let server = TcpStream::connect(upstream)
        .await
        .context("proxy: upstream")?;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let back = tokio::spawn(async move { tokio::io::copy(&mut sr, &mut cw).await });
    let mut frontend = Frontend::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = cr.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        frontend.observe(&buf[..n], trips);
        sw.write_all(&buf[..n]).await?;
    }
    let _ = sw.shutdown().await;
    back.abort();
    Ok(())
}

/// Where the client's stream is: the message header being read, and how many
/// bytes of the current message's body are still to pass.
#[derive(Default)]
struct Frontend {
    typed: bool,
    head: Vec<u8>,
    skip: usize,
}

impl Frontend {
    fn observe(&mut self, mut chunk: &[u8], trips: &AtomicU64) {
        while !chunk.is_empty() {
            if self.skip > 0 {
                let k = self.skip.min(chunk.len());
                self.skip -= k;
                chunk = &chunk[k..];
                continue;
            }
            let want = if self.typed { 5 } else { 8 };
            let k = (want - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..k]);
            chunk = &chunk[k..];
            if self.head.len() == want {
                self.header(trips);
                self.head.clear();
            }
        }
    }

    /// A complete header: untyped (length, code) before the startup, typed
    /// (type, length) after it.
    fn header(&mut self, trips: &AtomicU64) {
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if self.typed {
            self.skip = be(&self.head[1..5]).saturating_sub(4);
            if matches!(self.head[0], b'Q' | b'S') {
                trips.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            self.skip = be(&self.head[0..4]).saturating_sub(8);
            let code = be(&self.head[4..8]) as u32;
            self.typed = !PRE_STARTUP.contains(&code);
        }
    }
}
