//! A Prometheus scrape endpoint (feature `prometheus`).
//!
//! [`PrometheusEndpoint::serve`] builds a meter provider whose reader is
//! `opentelemetry-prometheus`'s exporter, and answers `GET /metrics` on the given
//! address with the text exposition format (a tiny HTTP/1.0 responder on tokio;
//! one request per connection). Hand [`PrometheusEndpoint::meter`] to
//! [`WorkerBuilder::meter`](crate::runtime::WorkerBuilder::meter). Instrument
//! names become Prometheus names: `tenure.lock.contention` is scraped as
//! `tenure_lock_contention_total`, `tenure.step.duration` as
//! `tenure_step_duration_seconds_bucket/_sum/_count`.
//!
//! ```no_run
//! # async fn demo<J: tenure::Job>(job: J) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tenure::telemetry::prometheus::PrometheusEndpoint;
//!
//! let metrics = PrometheusEndpoint::serve("127.0.0.1:9464".parse()?, Duration::from_secs(5)).await?;
//! let worker = tenure::Worker::builder(tenure::Config::from_env()?)
//!     .meter(metrics.meter())
//!     .register(job)
//!     .start()
//!     .await?;
//! // curl http://127.0.0.1:9464/metrics
//! # worker.shutdown().await?; Ok(()) }
//! ```
//!
//! Bind a loopback address unless the network in front of it is trusted: the
//! endpoint has no authentication. To serve the text from an HTTP server you
//! already run, call [`PrometheusEndpoint::render`] from its handler instead.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use prometheus::{Encoder as _, Registry, TextEncoder};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::task::AbortOnDropHandle;

use super::TelemetryError;

/// At most this many scrapes are answered at once; more wait in the backlog.
const MAX_CONNECTIONS: usize = 8;
/// A request head larger than this is refused.
const MAX_REQUEST: usize = 8 * 1024;

/// A meter provider with a Prometheus scrape endpoint. Dropping it stops serving
/// (the accept loop and every open connection are aborted).
pub struct PrometheusEndpoint {
    provider: SdkMeterProvider,
    registry: Registry,
    addr: SocketAddr,
    _server: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for PrometheusEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusEndpoint")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl PrometheusEndpoint {
    /// Binds `addr` (port 0 picks a free port: see
    /// [`local_addr`](Self::local_addr)) and serves `GET /metrics`. Reading a
    /// request and writing its answer are each bounded by `io_timeout`.
    ///
    /// # Errors
    /// [`TelemetryError::Bind`] if the address cannot be bound;
    /// [`TelemetryError::Exporter`] if the exporter cannot be built.
    pub async fn serve(addr: SocketAddr, io_timeout: Duration) -> Result<Self, TelemetryError> {
        let registry = Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_target_info()
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let provider = SdkMeterProvider::builder().with_reader(exporter).build();
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| TelemetryError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| TelemetryError::Bind { addr, source })?;
        let server = tokio::spawn(accept_loop(listener, registry.clone(), io_timeout));
        tracing::info!(addr = %local, "serving Prometheus metrics at /metrics");
        Ok(PrometheusEndpoint {
            provider,
            registry,
            addr: local,
            _server: AbortOnDropHandle::new(server),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A meter named `tenure` of this provider, for
    /// [`WorkerBuilder::meter`](crate::runtime::WorkerBuilder::meter).
    pub fn meter(&self) -> Meter {
        self.provider.meter("tenure")
    }

    /// The meter provider (for your own instruments, or to install it globally).
    pub fn meter_provider(&self) -> &SdkMeterProvider {
        &self.provider
    }

    /// The current metrics in the Prometheus text exposition format.
    ///
    /// # Errors
    /// [`TelemetryError::Encode`].
    pub fn render(&self) -> Result<String, TelemetryError> {
        render(&self.registry)
    }
}

fn render(registry: &Registry) -> Result<String, TelemetryError> {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .map_err(|e| TelemetryError::Encode(e.to_string()))?;
    String::from_utf8(buf).map_err(|e| TelemetryError::Encode(e.to_string()))
}

async fn accept_loop(listener: TcpListener, registry: Registry, io_timeout: Duration) {
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
                let registry = registry.clone();
                conns.spawn(async move {
                    if let Err(e) = answer(stream, &registry, io_timeout).await {
                        tracing::debug!(%peer, error = %e, "metrics scrape failed");
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics scrape failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(
    mut stream: TcpStream,
    registry: &Registry,
    io_timeout: Duration,
) -> std::io::Result<()> {
    let head = tokio::time::timeout(io_timeout, read_head(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head"))??;
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => match render(registry) {
            Ok(text) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text),
            Err(e) => (
                "500 Internal Server Error",
                "text/plain; charset=utf-8",
                format!("{e}\n"),
            ),
        },
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "try /metrics\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "GET only\n".into(),
        ),
    };
    let response = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
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
