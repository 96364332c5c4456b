//! OpenTelemetry instruments and `tracing` span names.
//!
//! Instruments are created from a [`Meter`] the user hands to the worker (default:
//! the global meter provider, a no-op unless the application installs one), so they
//! cost nothing when unused. Attributes are bounded: job type, step, worker, reason;
//! never job ids or tokens (those are on spans and log events).
//!
//! Names follow one scheme, `tenure.<subject>.<measure>` with the subject in the
//! singular (`job`, `step`, `lease`, `lock`, `fence`, `queue`, `partition`, ...).
//!
//! | instrument | kind | attributes |
//! |---|---|---|
//! | `tenure.lease.grants` | counter | worker |
//! | `tenure.lease.keepalive.duration` | histogram (s) | worker |
//! | `tenure.lease.state` | gauge (0 healthy, 1 degraded, 2 lost) | worker |
//! | `tenure.lease.transitions` | counter | worker, from, to |
//! | `tenure.lease.losses` | counter | worker, cause (`deadline`, `revoked`, `stream_ended`, `stream_error`, `keeper_stopped`) |
//! | `tenure.lock.contention` | counter | job_type |
//! | `tenure.lock.batch.acquisitions` | histogram (job locks per etcd Txn) | worker |
//! | `tenure.fence.claims` | counter | job_type |
//! | `tenure.fence.takeovers` | counter | job_type |
//! | `tenure.fence.stale_rejections` | counter | job_type, where (`claim`, `admission`, `step_commit`, `guard`) |
//! | `tenure.fence.token_regressions` | counter | job_type (a fresh claim met its own token: etcd revisions went backwards; alert on any) |
//! | `tenure.step.duration` | histogram (s) | job_type, step |
//! | `tenure.job.queue_wait` | histogram (s) | job_type (from the job's message being stored, i.e. the enqueue or a delayed job's due-time publish, to its first claim) |
//! | `tenure.job.duration` | histogram (s) | job_type (from the job's message being stored to its last commit: queue wait, every attempt and takeover) |
//! | `tenure.job.retries` | counter | job_type |
//! | `tenure.dlq.routed` | counter | job_type, reason |
//! | `tenure.job.in_flight` | up-down counter | worker |
//! | `tenure.job.completed` | counter | job_type |
//! | `tenure.queue.backlog` | gauge (messages stored in the work stream per type: waiting, delayed ones not yet due excluded, and in flight; every worker records it with each report) | job_type |
//! | `tenure.queue.oldest_age` | gauge (s; how long the oldest message of the type has been stored in the work stream: a job waiting, or running, since its enqueue or due-time publish; 0 without one; every worker records it with each report) | job_type |
//! | `tenure.queue.unrouted` | gauge (messages waiting in the work stream of a type no live worker registers; every worker records it with each report) | job_type |
//! | `tenure.job.cancelled` | counter | job_type (deliveries ended, acked, because an operator cancelled the job) |
//! | `tenure.cancel.unconfirmed` | counter | worker (cancel notices for a job running here that no cancel confirmed: forged, or a failed check; the step went on) |
//! | `tenure.fetch.throttled` | counter | job_type (fetch rounds that left the type out because its rate limit had no token) |
//!
//! # Exporting
//!
//! Nothing is exported unless the application asks (the default global meter
//! provider is a no-op). Two ready-made wirings, each behind a cargo feature:
//!
//! * `otlp`: `telemetry::otlp::meter_provider` pushes to an OpenTelemetry collector over
//!   OTLP/gRPC.
//! * `prometheus`: `telemetry::prometheus::PrometheusEndpoint` serves `GET /metrics` in
//!   the Prometheus text format (dots become underscores, counters get `_total`:
//!   `tenure_fence_stale_rejections_total{job_type,where}`).
//!
//! Either way, hand the meter to the worker:
//! `Worker::builder(cfg).meter(meter)`. Any other `opentelemetry_sdk` reader
//! works the same way (the tests use `InMemoryMetricExporter`).
//!
//! # Traces
//!
//! One trace per job, from the producer's span through every step, across
//! takeovers: [`propagation`] (W3C `traceparent` in the message headers and
//! the job row). The `tenure.job` span also carries the OpenTelemetry
//! messaging attributes (`messaging.system` = `nats`,
//! `messaging.operation.type` = `process`, `messaging.destination.name` = the
//! subject) and the commit span `db.system.name` = `postgresql`.
//!
//! # Events
//!
//! Ownership changes are `tracing` events inside the `tenure.job` span (which
//! carries `job_id`, `job_type`, `token`, `lease_id`, `worker`): *took over the
//! job* (a previous owner did not release it), *job lock held by another
//! session* (contention, debug level), *write refused: fenced out by a newer
//! owner* (with `at` = claim/admission/step_commit/guard), *lease lost:
//! cancelling the running step*, *redelivered*, *job dead-lettered* (with
//! `code` and `reason`); the lease keeper logs every health change with its
//! reason, and *session lost* with its cause.

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, UpDownCounter};

#[cfg(any(feature = "http", feature = "prometheus"))]
pub(crate) mod http;
#[cfg(feature = "otlp")]
pub mod otlp;
#[cfg(feature = "prometheus")]
pub mod prometheus;
pub mod propagation;

#[cfg(all(test, any(feature = "prometheus", feature = "otlp")))]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod exporter_tests;

/// Errors setting up an exporter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The scrape endpoint's address could not be bound.
    #[error("cannot bind the metrics endpoint to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The exporter could not be built.
    #[error("metrics exporter: {0}")]
    Exporter(String),
    /// The metrics could not be encoded.
    #[error("encoding metrics: {0}")]
    Encode(String),
}

/// Stable span names.
pub mod spans {
    /// One delivery of a job, from admission to ack.
    pub const JOB: &str = "tenure.job";
    /// Creating the job lock in etcd.
    pub const ACQUIRE: &str = "tenure.acquire";
    /// Raising the fence at PostgreSQL.
    pub const CLAIM: &str = "tenure.claim";
    /// Running one step.
    pub const STEP: &str = "tenure.step";
    /// Committing one step's fenced transaction.
    pub const COMMIT: &str = "tenure.commit";
}

/// Where a stale owner was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StaleAt {
    /// The claim found a newer fence.
    Claim,
    /// A step's admission select found a newer fence.
    Admission,
    /// The step CAS at commit found a newer fence.
    StepCommit,
    /// A table guard refused a write.
    Guard,
}

impl StaleAt {
    /// The attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            StaleAt::Claim => "claim",
            StaleAt::Admission => "admission",
            StaleAt::StepCommit => "step_commit",
            StaleAt::Guard => "guard",
        }
    }
}

/// Every instrument Tenure records. Workers create their own from the meter given
/// to [`WorkerBuilder::meter`](crate::WorkerBuilder::meter); what each instrument
/// means is in the [production guide](crate::guide::production). Crate-private:
/// only Tenure records these.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    worker: KeyValue,
    lease_grants: Counter<u64>,
    keepalive: Histogram<f64>,
    lease_state: Gauge<i64>,
    lease_transitions: Counter<u64>,
    lease_losses: Counter<u64>,
    contention: Counter<u64>,
    lock_batch: Histogram<u64>,
    claims: Counter<u64>,
    takeovers: Counter<u64>,
    stale: Counter<u64>,
    regressions: Counter<u64>,
    step_duration: Histogram<f64>,
    queue_wait: Histogram<f64>,
    job_duration: Histogram<f64>,
    retries: Counter<u64>,
    dlq: Counter<u64>,
    in_flight: UpDownCounter<i64>,
    completed: Counter<u64>,
    unrouted: Gauge<i64>,
    backlog: Gauge<i64>,
    oldest_age: Gauge<f64>,
    cancelled: Counter<u64>,
    unconfirmed: Counter<u64>,
    partitions: Counter<u64>,
    throttled: Counter<u64>,
}

/// The builders of the instrument kinds most of [`Metrics`] uses.
struct Instruments<'a>(&'a Meter);

impl Instruments<'_> {
    fn counter(&self, name: &'static str, description: &'static str) -> Counter<u64> {
        self.0
            .u64_counter(name)
            .with_description(description)
            .build()
    }

    fn gauge(&self, name: &'static str, description: &'static str) -> Gauge<i64> {
        self.0.i64_gauge(name).with_description(description).build()
    }

    /// A duration histogram in seconds, over [`DURATION_BUCKETS_S`].
    fn seconds(&self, name: &'static str, description: &'static str) -> Histogram<f64> {
        self.0
            .f64_histogram(name)
            .with_unit("s")
            .with_description(description)
            .with_boundaries(DURATION_BUCKETS_S.to_vec())
            .build()
    }

    fn lock_batch(&self) -> Histogram<u64> {
        self.0
            .u64_histogram("tenure.lock.batch.acquisitions")
            .with_unit("{lock}")
            .with_description("job-lock acquisitions per etcd transaction")
            .with_boundaries(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0])
            .build()
    }

    fn in_flight(&self) -> UpDownCounter<i64> {
        self.0
            .i64_up_down_counter("tenure.job.in_flight")
            .with_description("deliveries being processed")
            .build()
    }

    fn oldest_age(&self) -> Gauge<f64> {
        self.0
            .f64_gauge("tenure.queue.oldest_age")
            .with_unit("s")
            .with_description("age of the oldest message stored in the work stream, per job type")
            .build()
    }
}

/// Bucket boundaries (seconds) of every duration histogram: 1 ms to 30 s, about
/// 2.5 times apart, so a keepalive round trip (milliseconds) and a step (up to
/// seconds) each land in a bucket of their own and a p99 against `TTL / 3` can be
/// read off them. The SDK's defaults (0, 5, 10, ... 10000) are meant for
/// milliseconds and put every keepalive in the first bucket.
pub const DURATION_BUCKETS_S: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Metrics {
    /// Instruments from `meter` for worker `worker`.
    pub fn new(meter: &Meter, worker: &str) -> Self {
        let m = Instruments(meter);
        Metrics {
            worker: KeyValue::new("worker", worker.to_string()),
            lease_grants: m.counter("tenure.lease.grants", "etcd session leases granted"),
            keepalive: m.seconds("tenure.lease.keepalive.duration", "keepalive round trip"),
            lease_state: m.gauge(
                "tenure.lease.state",
                "session health: 0 healthy, 1 degraded, 2 lost",
            ),
            lease_transitions: m.counter("tenure.lease.transitions", "session health transitions"),
            lease_losses: m.counter("tenure.lease.losses", "sessions lost, by cause"),
            contention: m.counter(
                "tenure.lock.contention",
                "job locks found held by another session",
            ),
            lock_batch: m.lock_batch(),
            claims: m.counter("tenure.fence.claims", "fences raised at the resource"),
            takeovers: m.counter(
                "tenure.fence.takeovers",
                "claims that replaced an owner that did not release",
            ),
            stale: m.counter(
                "tenure.fence.stale_rejections",
                "writes refused because a newer owner holds the fence",
            ),
            regressions: m.counter(
                "tenure.fence.token_regressions",
                "fresh claims whose token the row already held (etcd revisions went backwards)",
            ),
            step_duration: m.seconds("tenure.step.duration", "step run and commit time"),
            queue_wait: m.seconds(
                "tenure.job.queue_wait",
                "from the job's message being stored to its first claim",
            ),
            job_duration: m.seconds(
                "tenure.job.duration",
                "from the job's message being stored to its last commit",
            ),
            retries: m.counter("tenure.job.retries", "failed attempts scheduled for retry"),
            dlq: m.counter("tenure.dlq.routed", "jobs dead-lettered, by reason"),
            in_flight: m.in_flight(),
            completed: m.counter("tenure.job.completed", "jobs that reached done"),
            backlog: m.gauge(
                "tenure.queue.backlog",
                "messages stored in the work stream, per job type",
            ),
            oldest_age: m.oldest_age(),
            unrouted: m.gauge(
                "tenure.queue.unrouted",
                "messages waiting for a job type no live worker registers",
            ),
            cancelled: m.counter(
                "tenure.job.cancelled",
                "deliveries ended (acked) because an operator cancelled the job",
            ),
            unconfirmed: m.counter(
                "tenure.cancel.unconfirmed",
                "cancel notices for a running job that no cancel confirmed (the step went on)",
            ),
            partitions: m.counter(
                "tenure.partition.changes",
                "partition ownership changes of this worker (partition mode), by change: taken, handed_over, lost",
            ),
            throttled: m.counter(
                "tenure.fetch.throttled",
                "fetch rounds that left a job type out because its rate limit had no token",
            ),
        }
    }

    /// Instruments from the global meter provider.
    pub fn global(worker: &str) -> Self {
        Self::new(&opentelemetry::global::meter("tenure"), worker)
    }

    /// This worker took (`taken`), handed over (`handed_over`) or lost
    /// (`lost`) partitions of `job_type` (`n` of them).
    pub fn partitions(&self, job_type: &str, change: &'static str, n: u64) {
        self.partitions.add(
            n,
            &[
                self.worker.clone(),
                KeyValue::new("job_type", job_type.to_string()),
                KeyValue::new("change", change),
            ],
        );
    }

    /// A fetch round left `job_type` out: its rate limit had no token.
    pub fn throttled(&self, job_type: &str) {
        self.throttled
            .add(1, &[KeyValue::new("job_type", job_type.to_string())]);
    }

    /// `n` messages of `job_type` are stored in the work stream.
    pub fn backlog(&self, job_type: &str, n: u64) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.backlog
            .record(n, &[KeyValue::new("job_type", job_type.to_string())]);
    }
    /// The oldest stored message of `job_type` is `age` old (0: none).
    pub fn oldest_age(&self, job_type: &str, age: std::time::Duration) {
        self.oldest_age.record(
            age.as_secs_f64(),
            &[KeyValue::new("job_type", job_type.to_string())],
        );
    }
    /// `n` messages of `job_type`, which no live worker registers, wait.
    pub fn unrouted(&self, job_type: &str, n: u64) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.unrouted
            .record(n, &[KeyValue::new("job_type", job_type.to_string())]);
    }
    /// A session lease was granted.
    pub fn lease_granted(&self) {
        self.lease_grants.add(1, std::slice::from_ref(&self.worker));
    }
    /// A keepalive round trip took `secs`.
    pub fn keepalive_rtt(&self, secs: f64) {
        self.keepalive
            .record(secs, std::slice::from_ref(&self.worker));
    }
    /// The session's health level now (numbers as in the gauge), e.g. `0` when a
    /// new session is granted.
    pub fn lease_state(&self, level: i64) {
        self.lease_state
            .record(level, std::slice::from_ref(&self.worker));
    }
    /// The session moved between health states (numbers as in the gauge).
    pub fn lease_transition(&self, from: &'static str, to: &'static str, to_level: i64) {
        self.lease_state
            .record(to_level, std::slice::from_ref(&self.worker));
        self.lease_transitions.add(
            1,
            &[
                self.worker.clone(),
                KeyValue::new("from", from),
                KeyValue::new("to", to),
            ],
        );
    }
    /// The session was lost because of `cause` (a bounded code such as
    /// [`LostReason::code`](crate::lease::LostReason::code)).
    pub fn lease_lost(&self, cause: &'static str) {
        self.lease_losses
            .add(1, &[self.worker.clone(), KeyValue::new("cause", cause)]);
    }
    /// A job lock was held by another session.
    pub fn contention(&self, job_type: &str) {
        self.contention
            .add(1, &[KeyValue::new("job_type", job_type.to_string())]);
    }
    /// A fence was claimed; `takeover` if it replaced an owner that did not release.
    pub fn claimed(&self, job_type: &str, takeover: bool) {
        let attrs = [KeyValue::new("job_type", job_type.to_string())];
        self.claims.add(1, &attrs);
        if takeover {
            self.takeovers.add(1, &attrs);
        }
    }
    /// A stale owner was refused at `at`.
    pub fn stale_rejected(&self, job_type: &str, at: StaleAt) {
        self.stale.add(
            1,
            &[
                KeyValue::new("job_type", job_type.to_string()),
                KeyValue::new("where", at.as_str()),
            ],
        );
    }
    /// A fresh claim found its own token on the row: etcd issued a revision twice.
    pub fn token_regression(&self, job_type: &str) {
        self.regressions
            .add(1, &[KeyValue::new("job_type", job_type.to_string())]);
    }
    /// A step ran (and committed) in `secs`.
    pub fn step_done(&self, job_type: &str, step: &'static str, secs: f64) {
        self.step_duration.record(
            secs,
            &[
                KeyValue::new("job_type", job_type.to_string()),
                KeyValue::new("step", step),
            ],
        );
    }
    /// A failed attempt was scheduled for retry.
    pub fn retried(&self, job_type: &str) {
        self.retries
            .add(1, &[KeyValue::new("job_type", job_type.to_string())]);
    }
    /// A job was dead-lettered for `reason` (a short, bounded reason code).
    pub fn dead_lettered(&self, job_type: &str, reason: &'static str) {
        self.dlq.add(
            1,
            &[
                KeyValue::new("job_type", job_type.to_string()),
                KeyValue::new("reason", reason),
            ],
        );
    }
    /// One etcd transaction carried `acquisitions` job-lock creates.
    pub fn lock_batch(&self, acquisitions: usize) {
        self.lock_batch.record(
            u64::try_from(acquisitions).unwrap_or(u64::MAX),
            std::slice::from_ref(&self.worker),
        );
    }
    /// A delivery started (`+1`) or ended (`-1`).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight
            .add(delta, std::slice::from_ref(&self.worker));
    }
    /// A job reached `done`, its message stored `since` ago.
    pub fn completed(&self, job_type: &str, since: std::time::Duration) {
        let attrs = [KeyValue::new("job_type", job_type.to_string())];
        self.completed.add(1, &attrs);
        self.job_duration.record(since.as_secs_f64(), &attrs);
    }
    /// A job was claimed for the first time, its message stored `since` ago.
    pub fn first_claim(&self, job_type: &str, since: std::time::Duration) {
        self.queue_wait.record(
            since.as_secs_f64(),
            &[KeyValue::new("job_type", job_type.to_string())],
        );
    }
    /// A delivery ended because an operator cancelled its job.
    pub fn cancelled(&self, job_type: &str) {
        self.cancelled
            .add(1, &[KeyValue::new("job_type", job_type.to_string())]);
    }
    /// A cancel notice for a job running here that no cancel confirmed.
    pub fn cancel_unconfirmed(&self) {
        self.unconfirmed.add(1, std::slice::from_ref(&self.worker));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    /// The `(upper bound, count)` of every non-empty bucket of histogram `name`.
    fn filled_buckets(exporter: &InMemoryMetricExporter, name: &str) -> Vec<(f64, u64)> {
        let exported = exporter.get_finished_metrics().expect("metrics");
        let rm = exported.last().expect("one export");
        let metric = rm
            .scope_metrics()
            .flat_map(|s| s.metrics())
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("{name} not exported"));
        let AggregatedMetrics::F64(MetricData::Histogram(h)) = metric.data() else {
            panic!("{name} is not an f64 histogram");
        };
        let point = h.data_points().next().expect("one data point");
        let bounds: Vec<f64> = point.bounds().collect();
        point
            .bucket_counts()
            .enumerate()
            .filter(|(_, n)| *n > 0)
            .map(|(i, n)| (bounds.get(i).copied().unwrap_or(f64::INFINITY), n))
            .collect()
    }

    #[test]
    fn instruments_are_exported_under_their_documented_names() {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let metrics = Metrics::new(&provider.meter("tenure"), "worker-1");
        metrics.stale_rejected("ledger.transfer", StaleAt::StepCommit);
        provider.force_flush().unwrap();
        let names: Vec<String> = exporter
            .get_finished_metrics()
            .unwrap()
            .iter()
            .flat_map(|rm| {
                rm.scope_metrics()
                    .flat_map(|s| s.metrics().map(|m| m.name().to_string()))
            })
            .collect();
        assert!(names.contains(&"tenure.fence.stale_rejections".to_string()));
    }

    #[test]
    fn a_keepalive_and_a_step_land_in_their_own_buckets() {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let metrics = Metrics::new(&provider.meter("tenure"), "w");
        metrics.keepalive_rtt(0.040);
        metrics.keepalive_rtt(0.002);
        metrics.step_done("t", "s", 2.0);
        provider.force_flush().expect("flush");

        // 40 ms in (25 ms, 50 ms], 2 ms in (1 ms, 2.5 ms]: the SDK's default
        // boundaries (0, 5, 10, ...) would put both in the bucket (0, 5].
        assert_eq!(
            filled_buckets(&exporter, "tenure.lease.keepalive.duration"),
            [(0.0025, 1), (0.05, 1)]
        );
        // 2 s in (1 s, 2.5 s].
        assert_eq!(
            filled_buckets(&exporter, "tenure.step.duration"),
            [(2.5, 1)]
        );
    }
}
