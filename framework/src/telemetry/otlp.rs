//! OTLP export (feature `otlp`): metrics pushed over gRPC to an OpenTelemetry
//! collector (or anything that speaks OTLP/gRPC, such as Jaeger, Grafana Alloy,
//! Datadog Agent).
//!
//! ```no_run
//! # async fn demo<J: tenure::Job>(job: J) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use opentelemetry::metrics::MeterProvider as _;
//!
//! // Inside the tokio runtime (the gRPC client runs on it).
//! let provider = tenure::telemetry::otlp::meter_provider(
//!     "http://127.0.0.1:4317",
//!     Duration::from_secs(10), // push interval
//!     Duration::from_secs(5),  // export timeout
//! )?;
//! let worker = tenure::Worker::builder(tenure::Config::from_env()?)
//!     .meter(provider.meter("tenure"))
//!     .register(job)
//!     .start()
//!     .await?;
//! // ...
//! worker.shutdown().await?;
//! provider.shutdown()?; // pushes what is left
//! # Ok(()) }
//! ```
//!
//! Spans: Tenure's spans are `tracing` spans; export them with
//! `tracing-opentelemetry` and an OTLP span exporter in your application.

use std::time::Duration;

use opentelemetry_otlp::{MetricExporter, WithExportConfig as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

use super::TelemetryError;

/// A meter provider that pushes every `interval` to the OTLP/gRPC `endpoint`
/// (e.g. `http://127.0.0.1:4317`), each export bounded by `timeout`. Call it
/// inside a tokio runtime; keep the provider alive while the worker runs and
/// call `shutdown` on it at the end.
///
/// # Errors
/// [`TelemetryError::Exporter`] if the exporter cannot be built (a malformed
/// endpoint, no tokio runtime).
pub fn meter_provider(
    endpoint: &str,
    interval: Duration,
    timeout: Duration,
) -> Result<SdkMeterProvider, TelemetryError> {
    let exporter = MetricExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(timeout)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let reader = PeriodicReader::builder(exporter)
        .with_interval(interval)
        .build();
    Ok(SdkMeterProvider::builder().with_reader(reader).build())
}
