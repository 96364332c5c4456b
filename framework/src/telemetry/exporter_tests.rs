//! The exporter wirings: the Prometheus scrape endpoint answers with `tenure_`
//! metric lines; the OTLP exporter pushes to the configured endpoint over gRPC.
//! No servers needed: `cargo test -p tenure --features prometheus,otlp --lib exporter_tests`.
//! (Unit tests, because [`Metrics`] is crate-private: applications never bump
//! Tenure's counters.)

use std::time::Duration;

use super::Metrics;
use tokio::io::AsyncReadExt;

#[cfg(feature = "prometheus")]
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .expect("answered")
        .unwrap();
    out
}

#[cfg(feature = "prometheus")]
#[tokio::test]
async fn prometheus_endpoint_serves_tenure_metrics() {
    use super::StaleAt;
    use super::prometheus::PrometheusEndpoint;
    use tokio::net::TcpStream;

    let ep = PrometheusEndpoint::serve("127.0.0.1:0".parse().unwrap(), Duration::from_secs(5))
        .await
        .unwrap();
    let m = Metrics::new(&ep.meter(), "w1");
    m.contention("demo.job");
    m.claimed("demo.job", true);
    m.stale_rejected("demo.job", StaleAt::StepCommit);
    m.dead_lettered("demo.job", "max_retries");
    m.step_done("demo.job", "first", 0.25);
    m.keepalive_rtt(0.003);
    m.in_flight(1);

    let resp = http_get(ep.local_addr(), "/metrics").await;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let line = |prefix: &str, labels: &[&str], value: &str| {
        let found = body.lines().any(|l| {
            l.starts_with(prefix)
                && labels.iter().all(|lab| l.contains(lab))
                && l.ends_with(&format!(" {value}"))
        });
        assert!(found, "no {prefix} {labels:?} {value} in:\n{body}");
    };
    line(
        "tenure_lock_contention_total{",
        &["job_type=\"demo.job\""],
        "1",
    );
    line(
        "tenure_fence_claims_total{",
        &["job_type=\"demo.job\""],
        "1",
    );
    line(
        "tenure_fence_takeovers_total{",
        &["job_type=\"demo.job\""],
        "1",
    );
    line(
        "tenure_fence_stale_rejections_total{",
        &["job_type=\"demo.job\"", "where=\"step_commit\""],
        "1",
    );
    line(
        "tenure_dlq_routed_total{",
        &["job_type=\"demo.job\"", "reason=\"max_retries\""],
        "1",
    );
    line(
        "tenure_step_duration_seconds_count{",
        &["job_type=\"demo.job\"", "step=\"first\""],
        "1",
    );
    line(
        "tenure_lease_keepalive_duration_seconds_count{",
        &["worker=\"w1\""],
        "1",
    );
    line("tenure_job_in_flight{", &["worker=\"w1\""], "1");
    assert_eq!(body, ep.render().unwrap(), "render() is what is served");

    let resp = http_get(ep.local_addr(), "/nope").await;
    assert!(resp.starts_with("HTTP/1.0 404"), "{resp}");
    let addr = ep.local_addr();
    drop(ep);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "dropping the endpoint stops serving"
    );
}

#[cfg(feature = "otlp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_exporter_pushes_to_the_configured_endpoint() {
    // A stand-in collector that only records what arrives: an OTLP/gRPC push
    // starts with the HTTP/2 client preface.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let provider = super::otlp::meter_provider(
        &format!("http://{addr}"),
        Duration::from_secs(3600),
        Duration::from_secs(2),
    )
    .unwrap();
    use opentelemetry::metrics::MeterProvider as _;
    let m = Metrics::new(&provider.meter("tenure"), "w1");
    m.contention("demo.job");
    let flusher = {
        let p = provider.clone();
        tokio::task::spawn_blocking(move || p.force_flush())
    };
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("the exporter connected")
        .unwrap();
    let mut preface = [0u8; 24];
    tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut preface))
        .await
        .expect("the exporter sent")
        .unwrap();
    assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    drop(conn);
    // The push fails (no real collector); the flush still returns, bounded by the timeout.
    let _ = tokio::time::timeout(Duration::from_secs(30), flusher)
        .await
        .expect("flush returns");
    let _ = provider.shutdown();
}
