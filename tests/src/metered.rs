//! A meter whose readings a test can read back, and the cancel tests' worker
//! that reports through one.

use std::sync::Arc;

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, GaugeDataPoint, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tenure::{Config, Worker};

use crate::{CancelProbe, Cancellable};

/// An in-memory meter provider and its exporter.
#[derive(Debug)]
pub struct Metered {
    exporter: InMemoryMetricExporter,
    provider: SdkMeterProvider,
}

impl Default for Metered {
    fn default() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Metered { exporter, provider }
    }
}

impl Metered {
    /// The meter to hand to `WorkerBuilder::meter`.
    pub fn meter(&self) -> Meter {
        self.provider.meter("tenure")
    }

    /// The total of counter `name` in a fresh reading (0 if never counted).
    pub fn counted(&self, name: &str) -> u64 {
        self.provider.force_flush().unwrap();
        let exported = self.exporter.get_finished_metrics().unwrap();
        let Some(rm) = exported.last() else { return 0 };
        rm.scope_metrics()
            .flat_map(|s| s.metrics())
            .filter(|m| m.name() == name)
            .map(|m| match m.data() {
                AggregatedMetrics::U64(MetricData::Sum(s)) => {
                    s.data_points().map(|p| p.value()).sum()
                }
                _ => 0,
            })
            .sum()
    }

    /// The value of gauge `name` (i64 or f64) with attribute `job_type` =
    /// `job_type` in a fresh reading (the exporter's earlier readings
    /// dropped); `None` if it has no such point.
    pub fn gauge(&self, name: &str, job_type: &str) -> Option<f64> {
        self.exporter.reset();
        self.provider.force_flush().expect("flush");
        let exported = self.exporter.get_finished_metrics().expect("metrics");
        let rm = exported.last()?;
        for scope in rm.scope_metrics() {
            for metric in scope.metrics().filter(|m| m.name() == name) {
                let value = match metric.data() {
                    AggregatedMetrics::I64(MetricData::Gauge(g)) => {
                        of_type(g.data_points(), job_type).map(|v| v as f64)
                    }
                    AggregatedMetrics::F64(MetricData::Gauge(g)) => {
                        of_type(g.data_points(), job_type)
                    }
                    _ => None,
                };
                if value.is_some() {
                    return value;
                }
            }
        }
        None
    }
}

/// The value of the point with `job_type` = `t`.
fn of_type<'a, T: Copy + 'a>(
    mut points: impl Iterator<Item = &'a GaugeDataPoint<T>>,
    t: &str,
) -> Option<T> {
    points
        .find(|p| {
            p.attributes()
                .any(|kv| kv.key.as_str() == "job_type" && kv.value.as_str() == t)
        })
        .map(|p| p.value())
}

/// A worker of `cfg` that runs [`Cancellable`] jobs on `schema`, its steps
/// reporting to `probe`, its metrics read through the returned [`Metered`].
///
/// # Panics
/// If the worker does not start.
pub async fn cancellable_worker(
    cfg: Config,
    schema: &str,
    probe: &Arc<CancelProbe>,
) -> (Worker, Metered) {
    let metered = Metered::default();
    let worker = Worker::builder(cfg)
        .meter(metered.meter())
        .register(Cancellable {
            schema: schema.to_string(),
            probe: probe.clone(),
        })
        .start()
        .await
        .expect("the cancellable worker starts");
    (worker, metered)
}
