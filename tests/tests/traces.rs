//! One trace per job: the producer's span is the parent of every delivery's
//! `tenure.job` span and so of every step, across a takeover between two
//! workers, and for a delayed job, whose message the due-job publisher sends
//! later from the row, for an outbox job and a batch, and for a cron job, whose
//! trace begins at its tick. Spans go through `tracing-opentelemetry` into an
//! in-memory exporter of the OpenTelemetry SDK.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use tenure::testing::{Fault, FaultPlan, FaultPoint, TestEnv};
use tenure::{Config, JobId, JobStatus, StepCtx, StepError, StepIndex, Worker, WorkerBuilder};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

const WAIT: Duration = Duration::from_secs(60);

/// Two steps that do nothing but take a moment.
#[derive(Debug, Clone)]
struct Traced;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct In {
    n: u64,
}

#[tenure::job(name = "trace.two", retries = 2)]
impl Traced {
    #[step]
    async fn first(&self, _ctx: &mut StepCtx, i: In) -> Result<In, StepError> {
        Ok(In { n: i.n + 1 })
    }

    #[step]
    async fn second(&self, _ctx: &mut StepCtx, i: In) -> Result<u64, StepError> {
        Ok(i.n + 1)
    }
}

async fn workers(cfg: Config) -> WorkerBuilder {
    Worker::builder(cfg).register(Traced)
}

/// The process's span exporter and provider (one global subscriber).
fn exporter() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static TRACES: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    TRACES.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("traces-test"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        (exporter, provider)
    })
}

/// Runs `enqueue` inside a producer span; its trace id.
async fn produce<F: std::future::Future<Output = ()>>(enqueue: F) -> TraceId {
    let span = tracing::info_span!("producer.request");
    let trace = span.context().span().span_context().trace_id();
    enqueue.instrument(span).await;
    trace
}

/// The finished spans named `name` whose `job_id` attribute is `job` (the
/// job span) or whose parent chain we do not follow: filtered by trace.
fn spans_named(name: &str) -> Vec<SpanData> {
    let (exporter, provider) = exporter();
    let _ = provider.force_flush();
    exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.name == name)
        .collect()
}

fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// Asserts that `job` ran under at least one job span, each in `trace`.
fn assert_ran_in(job: JobId, trace: TraceId) {
    let jobs = job_spans(job);
    assert!(!jobs.is_empty(), "{job} ran under a span");
    for s in &jobs {
        assert_eq!(s.span_context.trace_id(), trace, "{job}: job span {s:?}");
    }
}

/// The job spans of `job`.
fn job_spans(job: JobId) -> Vec<SpanData> {
    let id = job.to_string();
    spans_named("tenure.job")
        .into_iter()
        .filter(|s| attr(s, "job_id").as_deref() == Some(id.as_str()))
        .collect()
}

#[tenure::test(ttl_secs = 3, worker = workers)]
async fn one_trace_from_the_producer_through_every_step_across_a_takeover(env: TestEnv) {
    exporter();
    let job = JobId::from_key("trace.two", "takeover");
    // w1 runs the first step, then its etcd connection is cut as the second
    // starts: its lease runs out and w2 takes the job over.
    let cut = Fault::CutEtcd(Duration::from_secs(7));
    let plan = FaultPlan::new().at(Some(job), StepIndex::new(1), FaultPoint::StepStart, cut);
    let w1 = env.worker_with_faults("w1", plan, workers).await.unwrap();
    let trace = produce(async {
        env.client()
            .enqueue::<Traced>("takeover", &In { n: 0 })
            .await
            .unwrap();
    })
    .await;
    assert!(tenure::devstack::wait_until(WAIT, || async { !env.faults_fired().is_empty() }).await);
    let w2 = env.worker("w2", workers).await.unwrap();
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, JobStatus::Done);
    assert!(row.takeovers >= 1, "{row:?}");
    w2.shutdown().await.unwrap();
    w1.shutdown().await.unwrap();

    let jobs = job_spans(job);
    let workers: std::collections::BTreeSet<String> =
        jobs.iter().filter_map(|s| attr(s, "worker")).collect();
    assert!(
        workers.contains("w1") && workers.contains("w2"),
        "a job span on each worker: {workers:?}"
    );
    for s in &jobs {
        assert_eq!(s.span_context.trace_id(), trace, "job span {s:?}");
        assert_eq!(attr(s, "messaging.system").as_deref(), Some("nats"));
        assert_eq!(
            attr(s, "messaging.operation.type").as_deref(),
            Some("process")
        );
    }
    let job_span_ids: Vec<_> = jobs.iter().map(|s| s.span_context.span_id()).collect();
    let steps: Vec<SpanData> = spans_named("tenure.step")
        .into_iter()
        .filter(|s| job_span_ids.contains(&s.parent_span_id))
        .collect();
    let names: std::collections::BTreeSet<String> =
        steps.iter().filter_map(|s| attr(s, "name")).collect();
    assert!(
        names.contains("first") && names.contains("second"),
        "every step a child of a job span: {names:?}"
    );
    assert!(steps.iter().all(|s| s.span_context.trace_id() == trace));
}

#[tenure::test(ttl_secs = 3, worker = workers)]
async fn a_delayed_job_joins_its_producers_trace_from_the_row(env: TestEnv) {
    exporter();
    let w = env.worker("w1", workers).await.unwrap();
    let job = JobId::from_key("trace.two", "later");
    let trace = produce(async {
        env.client()
            .enqueue_after::<Traced>("later", &In { n: 0 }, Duration::from_millis(1500))
            .await
            .unwrap();
    })
    .await;
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, JobStatus::Done);
    w.shutdown().await.unwrap();
    assert_ran_in(job, trace);
}

/// A job enqueued in the caller's own transaction (the outbox) joins the
/// trace of the span it was enqueued in, though its message is published
/// later, from the row, once the transaction commits.
#[tenure::test(ttl_secs = 3, worker = workers)]
async fn an_outbox_job_joins_the_trace_it_was_enqueued_in(env: TestEnv) {
    exporter();
    let w = env.worker("w1", workers).await.unwrap();
    let job = JobId::from_key("trace.two", "outbox");
    let trace = produce(async {
        let mut tx = env.pool().begin().await.unwrap();
        env.client()
            .enqueue_in::<Traced>(&mut tx, "outbox", &In { n: 0 })
            .await
            .unwrap();
        tx.commit().await.unwrap();
    })
    .await;
    let row = env.run_until_done(job, WAIT).await.unwrap();
    assert_eq!(row.status, JobStatus::Done);
    w.shutdown().await.unwrap();
    assert_ran_in(job, trace);
}

/// Every job of one `enqueue_many` call joins the caller's trace.
#[tenure::test(ttl_secs = 3, worker = workers)]
async fn a_batchs_jobs_join_the_trace_they_were_enqueued_in(env: TestEnv) {
    exporter();
    let w = env.worker("w1", workers).await.unwrap();
    let items: Vec<(String, In)> = (0..3).map(|n| (format!("batch-{n}"), In { n })).collect();
    let trace = produce(async {
        let results = env.client().enqueue_many::<Traced>(&items).await.unwrap();
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    })
    .await;
    let jobs: Vec<JobId> = items
        .iter()
        .map(|(key, _)| JobId::from_key("trace.two", key))
        .collect();
    for job in &jobs {
        let row = env.run_until_done(*job, WAIT).await.unwrap();
        assert_eq!(row.status, JobStatus::Done);
    }
    // A job's span ends after its last commit: the shutdown waits for it
    // (under make test's load a span was once not yet finished here).
    w.shutdown().await.unwrap();
    for job in jobs {
        assert_ran_in(job, trace);
    }
}

async fn cron_worker(cfg: Config) -> WorkerBuilder {
    workers(cfg)
        .await
        .schedule::<Traced>("trace-every-second", "* * * * * *", &In { n: 0 })
}

/// A cron job's trace begins at the scheduler leader's tick: the
/// `tenure.schedule_tick` span that enqueued it is the root of the trace its
/// job and steps run in.
#[tenure::test(ttl_secs = 3, worker = cron_worker)]
async fn a_cron_jobs_trace_begins_at_its_tick(env: TestEnv) {
    exporter();
    let w = env.worker("w1", cron_worker).await.unwrap();
    let joined = || {
        let ticks: Vec<TraceId> = spans_named("tenure.schedule_tick")
            .iter()
            .filter(|s| attr(s, "schedule").as_deref() == Some("trace-every-second"))
            .map(|s| s.span_context.trace_id())
            .collect();
        spans_named("tenure.job")
            .into_iter()
            .find(|s| ticks.contains(&s.span_context.trace_id()))
    };
    let found = tenure::devstack::wait_until(WAIT, || async { joined().is_some() }).await;
    w.shutdown().await.unwrap();
    assert!(
        found,
        "no cron job ran in a tick's trace; ticks: {:?}",
        spans_named("tenure.schedule_tick").len()
    );
    let job = joined().unwrap();
    let steps = spans_named("tenure.step")
        .into_iter()
        .filter(|s| s.parent_span_id == job.span_context.span_id())
        .count();
    assert!(steps >= 1, "the cron job's steps are children of its span");
}
