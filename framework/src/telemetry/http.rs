//! The tiny HTTP/1.0 responder behind the Prometheus endpoint and the probe
//! server: one request per connection, at most [`MAX_CONNECTIONS`] answered
//! at once, the request head bounded by [`MAX_REQUEST`] and every read and
//! write by an I/O timeout. A handler sees the method and the path (query
//! stripped) and returns the whole answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::task::AbortOnDropHandle;

use super::TelemetryError;

/// At most this many requests are answered at once; more wait in the backlog.
const MAX_CONNECTIONS: usize = 8;
/// A request head larger than this is refused.
const MAX_REQUEST: usize = 8 * 1024;

/// The text content type of every answer but the scrape.
pub(crate) const TEXT: &str = "text/plain; charset=utf-8";

/// One answer: status line (`200 OK`), content type and body.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: &'static str,
    pub(crate) ctype: &'static str,
    pub(crate) body: String,
}

impl Response {
    /// A text answer.
    pub(crate) fn text(status: &'static str, body: impl Into<String>) -> Self {
        Response {
            status,
            ctype: TEXT,
            body: body.into(),
        }
    }
}

/// Answers a request, given its method and path.
pub(crate) type Handler = Arc<dyn Fn(&str, &str) -> BoxFuture<'static, Response> + Send + Sync>;

/// A bound listener and its address (port 0 resolved).
pub(crate) async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), TelemetryError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| TelemetryError::Bind { addr, source })?;
    Ok((listener, local))
}

/// Serves `listener` with `handler` until the returned handle is dropped
/// (the accept loop and every open connection are aborted then).
pub(crate) fn spawn(
    listener: TcpListener,
    handler: Handler,
    io_timeout: Duration,
) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(accept_loop(listener, handler, io_timeout)))
}

async fn accept_loop(listener: TcpListener, handler: Handler, io_timeout: Duration) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        // Reap finished connections so the set stays small.
        while conns.try_join_next().is_some() {}
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, peer)) => {
                let handler = handler.clone();
                conns.spawn(async move {
                    if let Err(e) = answer(stream, &handler, io_timeout).await {
                        tracing::debug!(%peer, error = %e, "HTTP request failed");
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting an HTTP connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(
    mut stream: TcpStream,
    handler: &Handler,
    io_timeout: Duration,
) -> std::io::Result<()> {
    let head = tokio::time::timeout(io_timeout, read_head(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head"))??;
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let r = handler(method, path).await;
    let response = format!(
        "HTTP/1.0 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        r.status,
        r.ctype,
        r.body.len(),
        r.body
    );
    tokio::time::timeout(io_timeout, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "response"))?
}

/// Reads until the end of the request head (`\r\n\r\n`); returns its first line.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            break;
        }
        if buf.len() > MAX_REQUEST {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "request head too large",
            ));
        }
    }
    let text = String::from_utf8_lossy(&buf);
    Ok(text.lines().next().unwrap_or("").to_string())
}
