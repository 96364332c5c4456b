//! A Prometheus scrape endpoint (feature `prometheus`).
//!
//! [`PrometheusExporter`] is a meter provider whose reader is
//! `opentelemetry-prometheus`'s exporter; [`PrometheusEndpoint::serve`] builds
//! one and answers `GET /metrics` on the given address with the text
//! exposition format (a tiny HTTP/1.0 responder on tokio; one request per
//! connection). Hand [`PrometheusEndpoint::meter`] to
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
//! endpoint has no authentication. To serve the scrape on the same listener
//! as the worker's `/livez` and `/readyz`, build a [`PrometheusExporter`] and
//! hand it to `probe::ProbeServer::serve_with_metrics` (feature `http`); to
//! serve the text from an HTTP server you already run, call
//! [`PrometheusExporter::render`] from its handler.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use prometheus::{Encoder as _, Registry, TextEncoder};
use tokio_util::task::AbortOnDropHandle;

use super::TelemetryError;
use super::http::{self, Response};

/// The content type of the scrape (the text exposition format 0.0.4).
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A meter provider whose metrics are read as a Prometheus scrape, with no
/// listener of its own. Clones share the provider and the registry.
#[derive(Clone)]
pub struct PrometheusExporter {
    provider: SdkMeterProvider,
    registry: Registry,
}

impl std::fmt::Debug for PrometheusExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusExporter").finish_non_exhaustive()
    }
}

impl PrometheusExporter {
    /// A meter provider with a Prometheus registry as its reader.
    ///
    /// # Errors
    /// [`TelemetryError::Exporter`] if the exporter cannot be built.
    pub fn new() -> Result<Self, TelemetryError> {
        let registry = Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_target_info()
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let provider = SdkMeterProvider::builder().with_reader(exporter).build();
        Ok(PrometheusExporter { provider, registry })
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
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .map_err(|e| TelemetryError::Encode(e.to_string()))?;
        String::from_utf8(buf).map_err(|e| TelemetryError::Encode(e.to_string()))
    }

    /// The answer to `GET /metrics`.
    pub(crate) fn scrape(&self) -> Response {
        match self.render() {
            Ok(text) => Response {
                status: "200 OK",
                ctype: CONTENT_TYPE,
                body: text,
            },
            Err(e) => Response::text("500 Internal Server Error", format!("{e}\n")),
        }
    }
}

/// A meter provider with a Prometheus scrape endpoint. Dropping it stops serving
/// (the accept loop and every open connection are aborted).
pub struct PrometheusEndpoint {
    exporter: PrometheusExporter,
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
        let exporter = PrometheusExporter::new()?;
        let (listener, local) = http::bind(addr).await?;
        let scraped = exporter.clone();
        let handler: http::Handler = Arc::new(move |method, path| {
            let answer = match (method, path) {
                ("GET", "/metrics") => scraped.scrape(),
                ("GET", _) => Response::text("404 Not Found", "try /metrics\n"),
                _ => Response::text("405 Method Not Allowed", "GET only\n"),
            };
            Box::pin(std::future::ready(answer))
        });
        let server = http::spawn(listener, handler, io_timeout);
        tracing::info!(addr = %local, "serving Prometheus metrics at /metrics");
        Ok(PrometheusEndpoint {
            exporter,
            addr: local,
            _server: server,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A meter named `tenure` of this provider, for
    /// [`WorkerBuilder::meter`](crate::runtime::WorkerBuilder::meter).
    pub fn meter(&self) -> Meter {
        self.exporter.meter()
    }

    /// The meter provider (for your own instruments, or to install it globally).
    pub fn meter_provider(&self) -> &SdkMeterProvider {
        self.exporter.meter_provider()
    }

    /// The current metrics in the Prometheus text exposition format.
    ///
    /// # Errors
    /// [`TelemetryError::Encode`].
    pub fn render(&self) -> Result<String, TelemetryError> {
        self.exporter.render()
    }
}
