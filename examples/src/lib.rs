//! Helpers shared by the runnable examples under `examples/` (`cargo run --example
//! ledger`, `cargo run --example provisioning`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use opentelemetry_sdk::metrics::InMemoryMetricExporter;

/// Sums of every `u64` counter the exporter collected, by instrument name.
pub fn read_metrics(exporter: &InMemoryMetricExporter) -> HashMap<String, u64> {
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    let mut out = HashMap::new();
    for rm in exporter.get_finished_metrics().unwrap_or_default() {
        for scope in rm.scope_metrics() {
            for metric in scope.metrics() {
                if let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() {
                    let total: u64 = sum.data_points().map(|p| p.value()).sum();
                    out.insert(metric.name().to_string(), total);
                }
            }
        }
    }
    out
}

/// Waits until a line starting with `prefix` appears in `lines` (a child
/// worker's collected stdout).
///
/// # Errors
/// If no such line appears within `timeout`.
pub async fn wait_for(
    lines: &Arc<Mutex<Vec<String>>>,
    prefix: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let ok = wait_until(timeout, || async {
        lines
            .lock()
            .map(|l| l.iter().any(|l| l.starts_with(prefix)))
            .unwrap_or(false)
    })
    .await;
    if ok {
        Ok(())
    } else {
        bail!("worker A did not print {prefix:?} within {timeout:?}")
    }
}

pub use tenure::devstack::wait_until;
