//! A worker's probes over HTTP (feature `http`): [`ProbeServer`] answers, on
//! one listener,
//!
//! | request | answer |
//! |---|---|
//! | `GET /livez` | `200 live` while the worker's actors run ([`WorkerProbe::is_live`]), `503 stopped` after |
//! | `GET /readyz` | `200 ready` when every check of [`Readiness`] passed, else `503` with [`Readiness::reason`] |
//! | `GET /metrics` | the Prometheus scrape ([`ProbeServer::serve_with_metrics`], feature `prometheus`) |
//! | another path | `404` |
//! | another method | `405` |
//!
//! ```no_run
//! # async fn demo<J: tenure::Job>(job: J) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tenure::probe::ProbeServer;
//!
//! let worker = tenure::Worker::builder(tenure::Config::from_env()?)
//!     .register(job)
//!     .start()
//!     .await?;
//! let addr = "0.0.0.0:8080".parse()?;
//! let _probes = ProbeServer::serve(addr, worker.probe(), Duration::from_secs(5)).await?;
//! worker.run_until_signal().await?; // SIGTERM: graceful shutdown; /livez 503 after
//! # Ok(()) }
//! ```
//!
//! The server has no authentication and says only "ready", a check's failure
//! and the metrics: bind it where only the orchestrator and the scraper reach.
//! The guide [`guide::production`](crate::guide::production) sets out the
//! probes, `SIGTERM` and the shutdown grace.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;

#[cfg(doc)]
use crate::runtime::Readiness;
use crate::runtime::WorkerProbe;
#[cfg(feature = "prometheus")]
use crate::telemetry::prometheus::PrometheusExporter;
use crate::telemetry::{
    TelemetryError,
    http::{self, Response},
};

/// Serves a worker's `/livez`, `/readyz` and optionally `/metrics` (see the
/// [module](self)). Dropping it stops serving.
pub struct ProbeServer {
    addr: SocketAddr,
    _server: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for ProbeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// What the server answers from.
#[derive(Clone)]
struct Routes {
    probe: WorkerProbe,
    #[cfg(feature = "prometheus")]
    metrics: Option<PrometheusExporter>,
}

impl ProbeServer {
    /// Binds `addr` (port 0 picks a free port: see
    /// [`local_addr`](Self::local_addr)) and serves `/livez` and `/readyz`
    /// of `probe`'s worker. Reading a request and writing its answer are
    /// each bounded by `io_timeout`.
    ///
    /// # Errors
    /// [`TelemetryError::Bind`] if the address cannot be bound.
    pub async fn serve(
        addr: SocketAddr,
        probe: WorkerProbe,
        io_timeout: Duration,
    ) -> Result<Self, TelemetryError> {
        let routes = Routes {
            probe,
            #[cfg(feature = "prometheus")]
            metrics: None,
        };
        Self::start(addr, routes, io_timeout).await
    }

    /// As [`serve`](Self::serve), and `GET /metrics` answers `metrics`'
    /// scrape (hand [`PrometheusExporter::meter`] to
    /// [`WorkerBuilder::meter`](crate::WorkerBuilder::meter) first).
    ///
    /// # Errors
    /// [`TelemetryError::Bind`] if the address cannot be bound.
    #[cfg(feature = "prometheus")]
    pub async fn serve_with_metrics(
        addr: SocketAddr,
        probe: WorkerProbe,
        metrics: PrometheusExporter,
        io_timeout: Duration,
    ) -> Result<Self, TelemetryError> {
        let routes = Routes {
            probe,
            metrics: Some(metrics),
        };
        Self::start(addr, routes, io_timeout).await
    }

    async fn start(
        addr: SocketAddr,
        routes: Routes,
        io_timeout: Duration,
    ) -> Result<Self, TelemetryError> {
        let (listener, local) = http::bind(addr).await?;
        let handler: http::Handler = Arc::new(move |method, path| {
            let (routes, method, path) = (routes.clone(), method.to_string(), path.to_string());
            Box::pin(async move { routes.answer(&method, &path).await })
        });
        let server = http::spawn(listener, handler, io_timeout);
        tracing::info!(addr = %local, "serving the worker's probes at /livez and /readyz");
        Ok(ProbeServer {
            addr: local,
            _server: server,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Routes {
    async fn answer(&self, method: &str, path: &str) -> Response {
        if method != "GET" {
            return Response::text("405 Method Not Allowed", "GET only\n");
        }
        match path {
            "/livez" if self.probe.is_live() => Response::text("200 OK", "live\n"),
            "/livez" => Response::text("503 Service Unavailable", "stopped\n"),
            "/readyz" => {
                let readiness = self.probe.readiness().await;
                let status = if readiness.is_ready() {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                Response::text(status, format!("{readiness}\n"))
            }
            #[cfg(feature = "prometheus")]
            "/metrics" if self.metrics.is_some() => self.scrape(),
            _ => Response::text("404 Not Found", "try /livez, /readyz or /metrics\n"),
        }
    }

    #[cfg(feature = "prometheus")]
    fn scrape(&self) -> Response {
        match &self.metrics {
            Some(exporter) => exporter.scrape(),
            None => Response::text("404 Not Found", "no metrics here\n"),
        }
    }
}
