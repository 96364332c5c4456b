//! W3C trace context from the producer to every step: one trace per job.
//!
//! At enqueue, the producer's current span (a `tracing` span bridged by
//! `tracing-opentelemetry`, else OpenTelemetry's current context) is written
//! into the job message's `traceparent` / `tracestate` headers and into the
//! job row (`jobs.trace_context`, the same two keys as JSON), so a job
//! published later (delayed, outbox, batch, cron: the due-job publisher
//! restores the row's context around its publish) keeps it. A worker makes
//! the message's context the parent of its `tenure.job` span; every step is a
//! child span of that; a takeover's delivery carries the same headers, so
//! the next owner continues the same trace.
//!
//! Nothing is recorded unless the application installs a
//! `tracing_opentelemetry` layer (of the version Tenure depends on, 0.34,
//! built on opentelemetry 0.33): without one there is no valid span context,
//! and no header or row value is written.

use async_nats::HeaderMap;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C `traceparent` header.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C `tracestate` header.
pub const TRACESTATE: &str = "tracestate";

/// The caller's trace context: the current `tracing` span's, else
/// OpenTelemetry's current context; `None` when neither has a valid span.
fn current() -> Option<Context> {
    let from_span = tracing::Span::current().context();
    if from_span.span().span_context().is_valid() {
        return Some(from_span);
    }
    let otel = Context::current();
    otel.span().span_context().is_valid().then_some(otel)
}

struct Headers<'a>(&'a mut HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct ReadHeaders<'a>(&'a HeaderMap);

impl Extractor for ReadHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

struct Json<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Injector for Json<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_string(), value.into());
    }
}

struct ReadJson<'a>(&'a serde_json::Value);

impl Extractor for ReadJson<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(serde_json::Value::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// Adds the caller's trace context to `headers` (nothing without one).
pub(crate) fn inject_current(headers: &mut HeaderMap) {
    if let Some(cx) = current() {
        TraceContextPropagator::new().inject_context(&cx, &mut Headers(headers));
    }
}

/// The caller's trace context as the job row keeps it (`None` without one).
pub(crate) fn current_row_value() -> Option<serde_json::Value> {
    let cx = current()?;
    let mut map = serde_json::Map::new();
    TraceContextPropagator::new().inject_context(&cx, &mut Json(&mut map));
    Some(serde_json::Value::Object(map))
}

/// The trace context a message carries, if a valid one.
pub(crate) fn from_headers(headers: Option<&HeaderMap>) -> Option<Context> {
    let cx = TraceContextPropagator::new().extract(&ReadHeaders(headers?));
    cx.span().span_context().is_valid().then_some(cx)
}

/// The trace context a job row keeps, if a valid one.
pub(crate) fn from_row_value(value: Option<&serde_json::Value>) -> Option<Context> {
    let cx = TraceContextPropagator::new().extract(&ReadJson(value?));
    cx.span().span_context().is_valid().then_some(cx)
}

/// Makes `cx` the parent of `span` (a span not entered yet); a no-op without
/// a `tracing_opentelemetry` layer.
pub(crate) fn set_parent(span: &tracing::Span, cx: Option<Context>) {
    if let Some(cx) = cx {
        let _ = span.set_parent(cx);
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    /// Headers and the row value round-trip a context; garbage is no context.
    #[test]
    fn contexts_round_trip_and_garbage_is_none() {
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, PARENT);
        let cx = from_headers(Some(&h)).expect("a valid traceparent");
        let mut map = serde_json::Map::new();
        TraceContextPropagator::new().inject_context(&cx, &mut Json(&mut map));
        assert_eq!(map[TRACEPARENT], PARENT);
        let value = serde_json::Value::Object(map);
        let again = from_row_value(Some(&value)).expect("row value");
        assert_eq!(
            again.span().span_context().trace_id(),
            cx.span().span_context().trace_id()
        );
        let mut bad = HeaderMap::new();
        bad.insert(TRACEPARENT, "00-nonsense");
        assert!(from_headers(Some(&bad)).is_none());
        assert!(from_headers(None).is_none());
        assert!(from_row_value(Some(&serde_json::json!({"x": 1}))).is_none());
        assert!(current().is_none(), "no span, no context");
    }
}
