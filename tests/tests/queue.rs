#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The queue against the dev stack's real nats-server: de-duplication,
//! redelivery, progress, retry, dead-lettering, redrive, the max-deliveries
//! advisory, a NATS restart, and garbage messages.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;

use tenure::blocks::queue::{
    BadMessage, DeadLetterInfo, Delivery, Queue, QueueError, headers, reasons,
};
use tenure::config::BackoffConfig;
use tenure::devstack::{DevStack, DevStackOptions};
use tenure::{Config, JobId, ObservedFence};
use tokio::time::Instant;

/// One NATS-only stack for the tests that do not inject faults (each test has its
/// own namespace, so its own streams and consumer).
fn nats() -> &'static DevStack {
    DevStack::shared_with(nats_only()).expect("NATS dev stack")
}

fn nats_only() -> DevStackOptions {
    DevStackOptions {
        etcd: false,
        postgres: false,
        ..Default::default()
    }
}

/// A config for a fresh namespace; `lease_ttl` is also `AckWait`.
fn config(stack: &DevStack, prefix: &str, lease_ttl_secs: u64) -> Config {
    let mut cfg = Config::new(DevStack::unique_namespace(prefix))
        .with_nats_url(stack.nats_url())
        .with_lease_ttl(Duration::from_secs(lease_ttl_secs));
    cfg.retry_backoff = BackoffConfig {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(1),
    };
    cfg
}

fn job(n: usize) -> JobId {
    JobId::from_key("test.job", &format!("key-{n}"))
}

/// Fetches until one delivery arrives or `within` passes.
async fn fetch_one(queue: &Queue, within: Duration) -> Option<Delivery> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let left = until - Instant::now();
        let mut got = queue
            .fetch("test.job", 1, left.min(Duration::from_secs(1)))
            .await
            .expect("fetch");
        if let Some(d) = got.pop() {
            return Some(d);
        }
    }
    None
}

/// A raw JetStream client, to inject messages the queue API would never publish.
async fn raw(stack: &DevStack) -> async_nats::jetstream::Context {
    async_nats::jetstream::new(
        async_nats::connect(stack.nats_url())
            .await
            .expect("raw connect"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provision_is_idempotent_and_applies_changed_settings() {
    let stack = nats();
    let cfg = config(stack, "q_setup", 2);
    let q1 = Queue::provision(&cfg).await.expect("first connect");
    let q2 = Queue::provision(&cfg)
        .await
        .expect("second connect, same settings");
    assert_eq!(q1.names(), q2.names());
    q1.publish_job(job(1), "test.job", "x".into())
        .await
        .expect("publish");

    let mut changed = cfg.clone().with_lease_ttl(Duration::from_secs(7));
    changed.max_deliver = 9;
    changed.duplicate_window = Duration::from_secs(30);
    Queue::provision(&changed)
        .await
        .expect("connect with changed settings")
        .route(&["test.job"])
        .await
        .expect("the type's consumer, updated");

    let js = raw(stack).await;
    let mut stream = js.get_stream(&q1.names().stream).await.expect("stream");
    let info = stream.info().await.expect("stream info");
    assert_eq!(info.config.duplicate_window, Duration::from_secs(30));
    assert_eq!(
        info.config.storage,
        async_nats::jetstream::stream::StorageType::File
    );
    assert_eq!(
        info.state.messages, 1,
        "re-connecting keeps the stored message"
    );
    let consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer(&q1.names().type_consumer("test.job"))
        .await
        .expect("consumer");
    let c = consumer.cached_info();
    assert_eq!(c.config.ack_wait, Duration::from_secs(7));
    assert_eq!(c.config.max_deliver, 9);
    assert_eq!(c.config.filter_subject, q1.names().work_subject("test.job"));

    let mut bad = cfg.clone();
    bad.namespace = "Not Valid".into();
    assert!(matches!(
        Queue::provision(&bad).await,
        Err(QueueError::Config(_))
    ));
    let unreachable = cfg.clone().with_nats_url("nats://127.0.0.1:1");
    assert!(matches!(
        Queue::provision(&unreachable).await,
        Err(QueueError::Connect { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_publish_inside_the_window_is_one_message() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_dup", 5))
        .await
        .expect("connect");
    let first = queue
        .publish_job(job(1), "test.job", "payload".into())
        .await
        .expect("publish");
    let second = queue
        .publish_job(job(1), "test.job", "payload again".into())
        .await
        .expect("publish again");
    assert!(!first.duplicate);
    assert!(second.duplicate, "the broker must drop the second publish");
    assert_eq!(first.sequence, second.sequence);
    assert_eq!(queue.stats().await.expect("stats").work_messages, 1);

    let got = queue
        .fetch("test.job", 10, Duration::from_secs(2))
        .await
        .expect("fetch");
    assert_eq!(got.len(), 1, "one message for the job");
    let d = got.into_iter().next().unwrap();
    assert_eq!(d.job_id(), Ok(job(1)));
    assert_eq!(d.job_type(), Ok("test.job"));
    assert_eq!(d.payload(), b"payload");
    assert_eq!(d.delivery_count(), 1);
    assert_eq!(d.stream_sequence(), first.sequence);
    assert_eq!(
        d.subject(),
        format!("{}test.job", queue.names().subject_prefix)
    );
    d.ack().await.expect("ack");
    assert_eq!(
        queue.stats().await.expect("stats").work_messages,
        0,
        "acked messages leave"
    );

    assert!(matches!(
        queue
            .publish_job(job(2), "bad type", Default::default())
            .await,
        Err(QueueError::InvalidJobType { .. })
    ));
}

/// The broker's de-duplication is only as long as its window: afterwards the same
/// job id is stored again. This is why the job row, not the broker, decides
/// whether an enqueue is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_accepts_the_same_job_again_after_the_duplicate_window() {
    let stack = nats();
    let mut cfg = config(stack, "q_window", 5);
    cfg.duplicate_window = Duration::from_secs(1);
    let queue = Queue::provision(&cfg).await.expect("connect");
    let first = queue
        .publish_job(job(1), "test.job", "a".into())
        .await
        .expect("publish");
    let inside = queue
        .publish_job(job(1), "test.job", "a".into())
        .await
        .expect("publish");
    assert!(inside.duplicate);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = queue
        .publish_job(job(1), "test.job", "a".into())
        .await
        .expect("publish");
    assert!(
        !after.duplicate,
        "outside the window the broker cannot tell"
    );
    assert!(after.sequence > first.sequence);
    assert_eq!(queue.stats().await.expect("stats").work_messages, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_message_is_redelivered_after_ack_wait() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_ackwait", 1))
        .await
        .expect("connect");
    queue
        .publish_job(job(1), "test.job", "x".into())
        .await
        .expect("publish");
    let first = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("first delivery");
    let delivered_at = Instant::now();
    assert_eq!(first.delivery_count(), 1);
    // Not acked, not dropped either: just silent, like a stalled worker.
    let early = queue
        .fetch("test.job", 1, Duration::from_millis(300))
        .await
        .expect("fetch");
    assert!(early.is_empty(), "no redelivery before AckWait");
    let again = fetch_one(&queue, Duration::from_secs(10))
        .await
        .expect("redelivery");
    assert!(
        delivered_at.elapsed() >= Duration::from_millis(900),
        "redelivered after {:?}, before AckWait (1 s)",
        delivered_at.elapsed()
    );
    assert_eq!(again.job_id(), Ok(job(1)));
    assert_eq!(again.delivery_count(), 2);
    assert_eq!(again.stream_sequence(), first.stream_sequence());
    again.ack().await.expect("ack");
    drop(first);
    assert!(
        queue
            .fetch("test.job", 1, Duration::from_millis(1500))
            .await
            .expect("fetch")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_acks_prevent_redelivery() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_progress", 1))
        .await
        .expect("connect");
    queue
        .publish_job(job(1), "test.job", "x".into())
        .await
        .expect("publish");
    let d = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("delivery");
    // Three AckWaits long, progress every 300 ms (AckWait is 1 s).
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        d.progress().await.expect("progress");
        let other = queue
            .fetch("test.job", 1, Duration::from_millis(300))
            .await
            .expect("fetch");
        assert!(other.is_empty(), "redelivered despite progress: {other:?}");
    }
    d.ack().await.expect("ack");
    assert!(
        queue
            .fetch("test.job", 1, Duration::from_millis(1500))
            .await
            .expect("fetch")
            .is_empty()
    );
    let stats = queue.stats().await.expect("stats");
    assert_eq!((stats.work_messages, stats.ack_pending), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_redelivers_after_the_delay_with_a_higher_count() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_retry", 5))
        .await
        .expect("connect");
    queue
        .publish_job(job(1), "test.job", "x".into())
        .await
        .expect("publish");
    let d = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("delivery");
    let seq = d.stream_sequence();
    let nak_at = Instant::now();
    d.retry_after(Duration::from_millis(1500))
        .await
        .expect("nak");
    assert!(
        queue
            .fetch("test.job", 1, Duration::from_millis(500))
            .await
            .expect("fetch")
            .is_empty()
    );
    // Wait past AckWait (5 s): if the delay were ignored, the assertion below
    // says so with the time it took, instead of a bare timeout.
    let again = fetch_one(&queue, Duration::from_secs(10))
        .await
        .expect("redelivery");
    let after = nak_at.elapsed();
    assert!(
        after >= Duration::from_millis(1400),
        "redelivered after {after:?}"
    );
    assert!(
        after < Duration::from_secs(5),
        "the delay, not AckWait, decided: {after:?}"
    );
    assert_eq!(again.delivery_count(), 2);
    assert_eq!(again.stream_sequence(), seq);
    again.ack().await.expect("ack");
}

/// A nak delay that ends as a fetch's wait ends: the redelivery comes at the
/// delay, never after `AckWait`. With pull requests that wait at the server
/// (`no_wait` + `expires`), nats-server 2.9.10 lost the redelivery until
/// `AckWait` when the request expired within about a millisecond of the
/// delay's end: the request went unanswered past its expiry, and the message
/// came back 5 s later (seen in 5 of 40 trials over this sweep; the same race
/// is behind `retry_after_redelivers_after_the_delay_with_a_higher_count`'s
/// failures, 3 in 50 runs, each at 6.5 s = its delay + `AckWait`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nak_delay_ending_with_a_fetch_wait_loses_no_redelivery() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_nak_race", 5))
        .await
        .expect("connect");
    let delay = Duration::from_millis(300);
    let mut late = Vec::new();
    for trial in 0..24u64 {
        queue
            .publish_job(job(trial as usize), "test.job", "x".into())
            .await
            .expect("publish");
        let d = fetch_one(&queue, Duration::from_secs(5))
            .await
            .expect("delivery");
        // The fetch's wait ends from 1.2 ms after to 1.1 ms before the delay.
        let wait = delay + Duration::from_micros(1200) - Duration::from_micros(100 * trial);
        let nak_at = Instant::now();
        d.retry_after(delay).await.expect("nak");
        let mut back = queue.fetch("test.job", 1, wait).await.expect("fetch").pop();
        if back.is_none() {
            back = fetch_one(&queue, Duration::from_secs(10)).await;
        }
        let back = back.expect("redelivery");
        let after = nak_at.elapsed();
        if after > delay + Duration::from_secs(1) || back.delivery_count() != 2 {
            late.push((trial, after, back.delivery_count()));
        }
        back.ack().await.expect("ack");
    }
    assert!(
        late.is_empty(),
        "(trial, redelivered after, delivery count): not after the {delay:?} delay, \
         or not as the second delivery: {late:?}"
    );
}

/// An idle fetch loop (the single-type fetcher's: `fetch` with the default
/// `Tuning::fetch_wait`, again and again) picks up a new message within the
/// poll period `Tuning::fetch_wait_several` (100 ms) and some slack. Prints
/// the pickup latencies (`BENCHMARKS.md`, issue 30.10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_fetch_loop_picks_up_a_new_message_within_the_poll_period() {
    let stack = nats();
    let cfg = config(stack, "q_pickup", 5);
    let queue = Queue::provision(&cfg).await.expect("connect");
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let fetcher = queue.clone();
    let wait = cfg.tuning.fetch_wait;
    let fetch_loop = tokio::spawn(async move {
        loop {
            for d in fetcher.fetch("test.job", 8, wait).await.expect("fetch") {
                let _ = tx.send((Instant::now(), d)).await;
            }
        }
    });
    let mut latencies = Vec::new();
    for n in 0..20u64 {
        // Publish at points spread over the poll period and the fetch's wait.
        tokio::time::sleep(Duration::from_millis(150 + 37 * n)).await;
        let sent = Instant::now();
        queue
            .publish_job(job(n as usize), "test.job", "x".into())
            .await
            .expect("publish");
        let (got, d) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("picked up within 5 s")
            .expect("fetch loop");
        latencies.push(got - sent);
        d.ack().await.expect("ack");
    }
    fetch_loop.abort();
    latencies.sort();
    let (p50, max) = (
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
    );
    eprintln!(
        "idle pickup over {} messages: p50 {p50:?}, max {max:?}",
        latencies.len()
    );
    // Not the max: on a loaded machine (make test beside a torture run, load
    // average 14) one pickup of twenty took 318 ms while the others took
    // 8-91 ms. A loop that waited out its fetch instead of polling would put
    // about half of the pickups over the bound, so two of twenty may be.
    let bound = cfg.tuning.fetch_wait_several + Duration::from_millis(150);
    let over = latencies.iter().filter(|l| **l >= bound).count();
    assert!(
        over <= 2,
        "{over} pickups of {} over {bound:?}: {latencies:?}",
        latencies.len()
    );
}

/// A fetch from a NATS that takes requests but answers nothing (paused)
/// fails, as a transient error, instead of returning nothing: the pull
/// requests do not wait at the server, so silence is told apart from an
/// empty consumer by a ping (partition mode suspects NATS from such errors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_from_a_paused_nats_fails_instead_of_finding_nothing() {
    let stack = DevStack::start_with(nats_only()).await.expect("own NATS");
    let cfg = config(&stack, "q_paused", 5).with_nats_request_timeout(Duration::from_secs(1));
    let queue = Queue::provision(&cfg).await.expect("connect");
    let wait = Duration::from_millis(300);
    assert!(
        queue
            .fetch("test.job", 1, wait)
            .await
            .expect("fetch")
            .is_empty()
    );
    stack.nats().pause().expect("pause NATS");
    let paused_at = Instant::now();
    let fetched = queue.fetch("test.job", 1, wait).await;
    let took = paused_at.elapsed();
    stack.nats().resume().expect("resume NATS");
    let err = fetched.expect_err("a fetch from a paused NATS");
    assert!(err.is_transient(), "{err}");
    assert!(took < Duration::from_secs(4), "the fetch took {took:?}");
    queue
        .publish_job(job(1), "test.job", "x".into())
        .await
        .expect("publish after the pause");
    let d = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("a delivery after the pause");
    d.ack().await.expect("ack");
}

/// The max-deliveries case with pull requests that do not wait: once a
/// message went over `MaxDeliver`, the next pull finds the server holding it
/// as ready, and the server keeps that `no_wait` request with nothing to
/// deliver and no expiry (every round here). The fetch still returns nothing
/// within its wait, without an error: the request is probed and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_after_the_broker_gave_up_on_a_message_returns_within_its_wait() {
    let stack = nats();
    let wait = Duration::from_millis(300);
    for round in 0..3 {
        let mut cfg = config(stack, "q_gave_up", 5);
        cfg.max_deliver = 2;
        let queue = Queue::provision(&cfg).await.expect("connect");
        queue
            .publish_job(job(round), "test.job", "poison".into())
            .await
            .expect("publish");
        for _ in 0..2 {
            let d = fetch_one(&queue, Duration::from_secs(5))
                .await
                .expect("delivery");
            d.retry_after(Duration::ZERO).await.expect("nak");
        }
        let t = Instant::now();
        let got = queue.fetch("test.job", 1, wait).await.expect("fetch");
        let took = t.elapsed();
        assert!(got.is_empty());
        assert!(
            took < wait + Duration::from_secs(1),
            "round {round}: {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_keeps_every_header() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_headers", 5))
        .await
        .expect("connect");
    let id = job(7);
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", id.to_string().as_str());
    h.insert(headers::JOB_ID, id.to_string().as_str());
    h.insert(headers::JOB_TYPE, "test.job");
    h.insert("X-Trace", "trace-1");
    h.append("X-Multi", "one");
    h.append("X-Multi", "two");
    let js = raw(stack).await;
    let subject = queue.names().work_subject("test.job");
    js.publish_with_headers(subject.clone(), h, "body".into())
        .await
        .expect("publish")
        .await
        .expect("stored");

    let d = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("delivery");
    let seq = d.stream_sequence();
    d.dead_letter(DeadLetterInfo {
        reason: "retries_exhausted".into(),
        last_token: ObservedFence::new(42),
        takeovers: 2,
        attempts: 3,
    })
    .await
    .expect("dead letter");

    let dl = queue.dead_letters(10).await.expect("read DLQ");
    assert_eq!(dl.len(), 1);
    let e = &dl[0];
    assert_eq!(e.job_id, Some(id));
    assert_eq!(e.job_type.as_deref(), Some("test.job"));
    assert_eq!(e.reason, "retries_exhausted");
    assert_eq!(&e.payload[..], b"body");
    assert_eq!(e.original_sequence, Some(seq));
    assert_eq!(e.original_subject.as_deref(), Some(subject.as_str()));
    assert_eq!(e.deliveries, Some(1));
    assert_eq!((e.attempts, e.takeovers), (Some(3), Some(2)));
    assert_eq!(e.last_token, ObservedFence::new(42));
    let has = |k: &str, v: &str| e.headers.iter().any(|(a, b)| a == k && b == v);
    let id_text = id.to_string();
    for (k, v) in [
        (headers::JOB_ID, id_text.as_str()),
        (headers::JOB_TYPE, "test.job"),
        ("X-Trace", "trace-1"),
        ("X-Multi", "one"),
        ("X-Multi", "two"),
        ("Tenure-Original-Nats-Msg-Id", id_text.as_str()),
        (headers::REASON, "retries_exhausted"),
        (headers::LAST_TOKEN, "42"),
        (headers::TAKEOVERS, "2"),
        (headers::ATTEMPTS, "3"),
        (headers::ORIGINAL_SEQ, seq.to_string().as_str()),
        (headers::ORIGINAL_SUBJECT, subject.as_str()),
    ] {
        assert!(has(k, v), "header {k}: {v} missing in {:?}", e.headers);
    }
    let stats = queue.stats().await.expect("stats");
    assert_eq!(stats.work_messages, 0, "the original is terminated");
    assert_eq!(stats.dlq_messages, 1);
}

/// A stale worker and its replacement both dead-letter the same work message:
/// one DLQ entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettering_one_message_twice_stores_one_entry() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_dlq_once", 1))
        .await
        .expect("connect");
    queue
        .publish_job(job(1), "test.job", "x".into())
        .await
        .expect("publish");
    let stale = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("delivery");
    let fresh = fetch_one(&queue, Duration::from_secs(10))
        .await
        .expect("redelivery");
    assert_eq!(fresh.stream_sequence(), stale.stream_sequence());
    fresh
        .dead_letter(DeadLetterInfo::new("first"))
        .await
        .expect("dead letter");
    stale
        .dead_letter(DeadLetterInfo::new("second"))
        .await
        .expect("dead letter again");
    let dl = queue.dead_letters(10).await.expect("DLQ");
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].reason, "first");
    assert_eq!(queue.stats().await.expect("stats").work_messages, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_puts_the_message_back_and_it_can_be_acked() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_redrive", 5))
        .await
        .expect("connect");
    for (n, reason) in [(1, "r1"), (2, "r1"), (3, "r2")] {
        queue
            .publish_job(job(n), "test.job", format!("in-{n}").into())
            .await
            .expect("publish");
        let d = fetch_one(&queue, Duration::from_secs(5))
            .await
            .expect("delivery");
        assert_eq!(d.job_id(), Ok(job(n)));
        d.dead_letter(DeadLetterInfo::new(reason))
            .await
            .expect("dead letter");
    }
    assert_eq!(queue.dead_letters(10).await.expect("DLQ").len(), 3);

    // One job: back to the work stream, fetched, acked.
    assert_eq!(queue.redrive(job(3)).await.expect("redrive"), 1);
    let d = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("redriven delivery");
    assert_eq!(d.job_id(), Ok(job(3)));
    assert_eq!(d.job_type(), Ok("test.job"));
    assert_eq!(d.payload(), b"in-3");
    assert_eq!(d.delivery_count(), 1, "a new message, not a redelivery");
    let hs = d.headers().expect("headers");
    assert!(
        hs.get(headers::REASON).is_none(),
        "DLQ headers are stripped"
    );
    assert!(hs.get(headers::ORIGINAL_SEQ).is_none());
    d.ack().await.expect("ack");
    assert_eq!(queue.redrive(job(3)).await.expect("redrive again"), 0);

    // By reason: both r1 jobs, the r2 entry is gone already.
    let mut jobs = queue.redrive_reason("r1").await.expect("redrive by reason");
    jobs.sort();
    let mut want = vec![job(1), job(2)];
    want.sort();
    assert_eq!(jobs, want);
    assert!(queue.dead_letters(10).await.expect("DLQ").is_empty());
    let mut seen = BTreeSet::new();
    while seen.len() < 2 {
        let d = fetch_one(&queue, Duration::from_secs(5))
            .await
            .expect("redriven delivery");
        seen.insert(d.job_id().expect("job id"));
        d.ack().await.expect("ack");
    }
    assert_eq!(seen, want.into_iter().collect());
    let stats = queue.stats().await.expect("stats");
    assert_eq!((stats.work_messages, stats.dlq_messages), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_exceeding_max_deliver_lands_in_the_dlq_via_the_advisory() {
    let stack = nats();
    let mut cfg = config(stack, "q_maxdeliver", 5);
    cfg.max_deliver = 2;
    let queue = Queue::provision(&cfg).await.expect("connect");
    queue
        .publish_job(job(1), "test.job", "poison".into())
        .await
        .expect("publish");
    for n in 1..=2 {
        let d = fetch_one(&queue, Duration::from_secs(5))
            .await
            .expect("delivery");
        assert_eq!(d.delivery_count(), n);
        assert_eq!(d.is_final_delivery(), n == 2);
        d.retry_after(Duration::ZERO).await.expect("nak");
    }
    // The broker raises the advisory when it next tries to deliver; no listener
    // runs yet: the advisory stream keeps it.
    assert!(
        queue
            .fetch("test.job", 1, Duration::from_secs(1))
            .await
            .expect("fetch")
            .is_empty()
    );
    assert!(queue.dead_letters(10).await.expect("DLQ").is_empty());
    assert_eq!(queue.stats().await.expect("stats").advisories, 1);

    let listener = queue.spawn_max_deliveries_listener();
    let until = Instant::now() + Duration::from_secs(20);
    let entry = loop {
        if let Some(e) = queue
            .dead_letters(10)
            .await
            .expect("DLQ")
            .into_iter()
            .next()
        {
            break e;
        }
        assert!(
            Instant::now() < until,
            "the advisory was not turned into a dead letter"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(entry.reason, reasons::MAX_DELIVERIES);
    assert_eq!(entry.job_id, Some(job(1)));
    assert_eq!(entry.deliveries, Some(2));
    assert_eq!(&entry.payload[..], b"poison");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let s = queue.stats().await.expect("stats");
        if s.work_messages == 0 && s.advisories == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "work message or advisory left: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // With the listener running (and a second worker's listener racing it), a
    // second poison message follows the same path, and is dead-lettered once.
    let other_worker = Queue::provision(&cfg).await.expect("second worker");
    let other_listener = other_worker.spawn_max_deliveries_listener();
    queue
        .publish_job(job(2), "test.job", "poison 2".into())
        .await
        .expect("publish");
    for _ in 1..=2 {
        let d = fetch_one(&queue, Duration::from_secs(5))
            .await
            .expect("delivery");
        d.retry_after(Duration::ZERO).await.expect("nak");
    }
    let until = Instant::now() + Duration::from_secs(20);
    while queue.dead_letters(10).await.expect("DLQ").len() < 2 {
        assert!(
            Instant::now() < until,
            "second poison message not dead-lettered"
        );
        let _ = queue
            .fetch("test.job", 1, Duration::from_millis(200))
            .await
            .expect("fetch");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(queue.dead_letters(10).await.expect("DLQ").len(), 2);
    assert!(!listener.is_finished());
    drop(listener);
    drop(other_listener);

    // Redriven, it is served again (and MaxDeliver counts afresh).
    assert_eq!(queue.redrive(job(1)).await.expect("redrive"), 1);
    let d = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("redriven delivery");
    assert_eq!((d.job_id(), d.delivery_count()), (Ok(job(1)), 1));
    d.ack().await.expect("ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_a_bad_message_and_the_consumer_keeps_serving() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_garbage", 5))
        .await
        .expect("connect");
    let js = raw(stack).await;
    let subject = queue.names().work_subject("test.job");
    let publish = |h: Option<async_nats::HeaderMap>, body: &'static str| {
        let js = js.clone();
        let subject = subject.clone();
        async move {
            match h {
                Some(h) => js.publish_with_headers(subject, h, body.into()).await,
                None => js.publish(subject, body.into()).await,
            }
            .expect("publish")
            .await
            .expect("stored");
        }
    };
    publish(None, "no headers at all").await;
    let mut h = async_nats::HeaderMap::new();
    h.insert(headers::JOB_ID, "not-a-uuid");
    h.insert(headers::JOB_TYPE, "test.job");
    publish(Some(h), "bad id").await;
    let mut h = async_nats::HeaderMap::new();
    h.insert(headers::JOB_ID, job(9).to_string().as_str());
    publish(Some(h), "no type").await;
    let mut h = async_nats::HeaderMap::new();
    h.insert(headers::JOB_ID, job(10).to_string().as_str());
    h.insert(headers::JOB_TYPE, "bad type");
    // Accepted by the work stream, and would make a naive copy to the DLQ fail.
    h.insert("Nats-Expected-Stream", queue.names().stream.as_str());
    publish(Some(h), "bad type").await;
    queue
        .publish_job(job(1), "test.job", "good".into())
        .await
        .expect("publish");

    let mut reasons_seen = Vec::new();
    let mut good = 0;
    let until = Instant::now() + Duration::from_secs(15);
    while reasons_seen.len() + good < 5 {
        assert!(Instant::now() < until, "not all messages were served");
        for d in queue
            .fetch("test.job", 10, Duration::from_secs(1))
            .await
            .expect("fetch")
        {
            let checked: Result<(JobId, String), BadMessage> = d
                .job_id()
                .and_then(|id| Ok((id, d.job_type()?.to_string())));
            match checked {
                Ok((id, _)) => {
                    assert_eq!(id, job(1));
                    good += 1;
                    d.ack().await.expect("ack");
                }
                Err(bad) => {
                    reasons_seen.push(bad.reason());
                    d.dead_letter(bad.dead_letter_info())
                        .await
                        .expect("dead letter");
                }
            }
        }
    }
    assert_eq!(good, 1);
    // The uuid parser's own words follow the prefix; they are not ours to pin.
    let invalid_id = "bad_message: invalid job id \"not-a-uuid\" in header Tenure-Job-Id: ";
    let normalise = |r: &String| {
        if r.starts_with(invalid_id) && r.len() > invalid_id.len() {
            format!("{invalid_id}...")
        } else {
            r.clone()
        }
    };
    let mut want = vec![
        "bad_message: missing header Tenure-Job-Id".to_string(),
        format!("{invalid_id}..."),
        "bad_message: missing header Tenure-Job-Type".to_string(),
        "bad_message: invalid job type \"bad type\" in header Tenure-Job-Type: only ASCII letters, digits, '_', '-' and '.' are allowed".to_string(),
    ];
    want.sort();
    let mut reasons_seen: Vec<String> = reasons_seen.iter().map(normalise).collect();
    reasons_seen.sort();
    assert_eq!(reasons_seen, want);

    let dlq = queue.dead_letters(10).await.expect("DLQ");
    let mut stored: Vec<String> = dlq.iter().map(|e| normalise(&e.reason)).collect();
    stored.sort();
    assert_eq!(
        stored, want,
        "each bad message is in the DLQ with its reason"
    );
    assert_eq!(dlq.iter().filter(|e| e.job_id.is_none()).count(), 2);
    assert!(
        dlq.iter()
            .any(|e| e.header("Tenure-Original-Nats-Expected-Stream")
                == Some(queue.names().stream.as_str()))
    );
    // Entries without a job id are not redriven by reason (they would fail again).
    assert!(
        queue
            .redrive_reason("bad_message: missing header Tenure-Job-Id")
            .await
            .expect("redrive")
            .is_empty()
    );

    // And the consumer keeps serving.
    queue
        .publish_job(job(2), "test.job", "after".into())
        .await
        .expect("publish");
    let d = fetch_one(&queue, Duration::from_secs(5))
        .await
        .expect("served after garbage");
    assert_eq!(d.job_id(), Ok(job(2)));
    d.ack().await.expect("ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restart_loses_no_published_message_and_fetch_resumes() {
    let stack = DevStack::start_with(nats_only()).await.expect("own NATS");
    let cfg = config(&stack, "q_restart", 2).with_nats_request_timeout(Duration::from_secs(2));
    let queue = Queue::provision(&cfg).await.expect("connect");
    let total = 20;
    for n in 0..total {
        queue
            .publish_job(job(n), "test.job", n.to_string().into())
            .await
            .expect("publish");
    }
    let mut done = BTreeSet::new();
    for d in queue
        .fetch("test.job", 5, Duration::from_secs(2))
        .await
        .expect("fetch")
    {
        done.insert(d.job_id().expect("id"));
        d.ack().await.expect("ack");
    }
    let held = queue
        .fetch("test.job", 5, Duration::from_secs(2))
        .await
        .expect("fetch");
    assert_eq!((done.len(), held.len()), (5, 5));

    stack.nats().kill().expect("kill NATS");
    let down_at = Instant::now();
    let err = queue
        .fetch("test.job", 5, Duration::from_millis(500))
        .await
        .expect_err("fetch while NATS is down");
    assert!(err.is_transient(), "{err}");
    assert!(
        down_at.elapsed() < Duration::from_secs(10),
        "fetch must not hang"
    );
    assert!(
        queue
            .publish_job(job(100), "test.job", Default::default())
            .await
            .is_err(),
        "an unconfirmed publish is an error"
    );

    stack.nats().restart().expect("restart NATS");
    stack
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("NATS back");

    // Fetch resumes once the client has reconnected; errors until then.
    let until = Instant::now() + Duration::from_secs(30);
    let mut resumed = false;
    while Instant::now() < until && done.len() < total {
        match queue
            .fetch("test.job", 10, Duration::from_millis(500))
            .await
        {
            Ok(batch) => {
                resumed = true;
                for d in batch {
                    done.insert(d.job_id().expect("id"));
                    d.ack().await.expect("ack after restart");
                }
            }
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(resumed, "fetch never worked again");
    // The five held across the restart came back (redelivered after AckWait).
    let expected: BTreeSet<JobId> = (0..total).map(job).collect();
    assert_eq!(
        done, expected,
        "every published job is delivered after the restart"
    );
    drop(held);

    // The publish that failed during the outage may or may not have been stored;
    // publishing it again is safe and one message results either way.
    let again = queue
        .publish_job(job(100), "test.job", Default::default())
        .await
        .expect("publish");
    // A leftover acked before the kill (below) may come first: ack it and
    // look on (seen in a full `make test`: an earlier job ahead of job 100).
    let mut leftovers = Vec::new();
    let d = loop {
        // A bound on liveness, not on speed: 5 s ran out once under load.
        let d = fetch_one(&queue, Duration::from_secs(20))
            .await
            .expect("the retried job");
        if d.job_id() == Ok(job(100)) {
            break d;
        }
        assert!(
            d.job_id().is_ok_and(|id| expected.contains(&id)),
            "a message that is not this test's: {:?}",
            d.job_id()
        );
        leftovers.push((d.job_id(), d.stream_sequence(), d.delivery_count()));
        d.ack().await.expect("ack a leftover");
    };
    assert_eq!(d.stream_sequence(), again.sequence);
    d.ack().await.expect("ack");
    // A message acked shortly before NATS was killed can come back after the
    // restart: the work queue's deletion had not reached the disk (measured, about
    // one run in five under load: stream sequence 1, acked before the kill,
    // delivered again). Workers absorb such a redelivery (the row is terminal, so
    // admission acks it); what must not happen is a message that stays. Each
    // leftover is one of this test's jobs, and acking it empties the stream.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = queue.stats().await.expect("stats");
        if (stats.work_messages, stats.ack_pending) == (0, 0) {
            break;
        }
        assert!(
            Instant::now() < until,
            "a message stays in the stream: {stats:?}, leftovers {leftovers:?}"
        );
        for d in queue
            .fetch("test.job", 10, Duration::from_millis(500))
            .await
            .expect("fetch")
        {
            leftovers.push((d.job_id(), d.stream_sequence(), d.delivery_count()));
            d.ack().await.expect("ack a leftover");
        }
    }
    let ours: BTreeSet<JobId> = (0..total).chain([100]).map(job).collect();
    assert!(
        leftovers
            .iter()
            .all(|(id, ..)| id.as_ref().is_ok_and(|id| ours.contains(id))),
        "only redeliveries of published jobs: {leftovers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_fetch_returns_within_the_wait() {
    let stack = nats();
    let queue = Queue::provision(&config(stack, "q_empty", 5))
        .await
        .expect("connect");
    let t = Instant::now();
    assert!(
        queue
            .fetch("test.job", 8, Duration::from_millis(700))
            .await
            .expect("fetch")
            .is_empty()
    );
    // Bounded by the wait plus the request timeout (5 s), with slack.
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    assert!(
        queue
            .fetch("test.job", 0, Duration::from_secs(5))
            .await
            .expect("fetch 0")
            .is_empty()
    );
    // A message published during the wait ends the wait.
    let q2 = queue.clone();
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        q2.publish_job(job(1), "test.job", Default::default())
            .await
            .expect("publish");
    });
    let got = queue
        .fetch("test.job", 8, Duration::from_secs(10))
        .await
        .expect("fetch");
    publisher.await.expect("publisher");
    assert_eq!(got.len(), 1);
    for d in got {
        d.ack().await.expect("ack");
    }
}

/// The replica count reaches JetStream: one server stores one replica, and
/// asking it for three is refused at connect with an error naming the stream,
/// not silently downgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_replicas_reach_jetstream_and_a_single_server_refuses_three() {
    let stack = nats();
    let cfg = config(stack, "q_replicas", 2);
    let q = Queue::provision(&cfg).await.expect("one replica");
    let js = raw(stack).await;
    let mut stream = js.get_stream(&q.names().stream).await.expect("stream");
    assert_eq!(stream.info().await.expect("info").config.num_replicas, 1);

    let three = config(stack, "q_replicas3", 2).with_stream_replicas(3);
    let err = Queue::provision(&three)
        .await
        .expect_err("a single server cannot hold three replicas");
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    assert!(
        text.to_lowercase().contains("q_replicas3"),
        "the error names the stream: {text}"
    );
    assert!(
        text.to_lowercase().contains("replica"),
        "the error says why: {text}"
    );
}

/// Routing by job type: each type has its own consumer, a fetch of one type
/// never delivers another's message, a type nobody fetches keeps its messages
/// in the stream (counted by `stored_by_type`), and a namespace provisioned by
/// Tenure before routing loses its consumer of all types to the per-type ones
/// without losing the messages that consumer held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_type_is_fetched_from_its_own_consumer() {
    let stack = nats();
    let cfg = config(stack, "q_route", 5);
    let js = raw(stack).await;
    // What Tenure before routing set up: one consumer of every type, holding
    // a delivered, unacked message.
    let names = tenure::blocks::queue::QueueNames::new(&cfg.namespace);
    let before = Queue::connect_or_create(&cfg).await.expect("streams");
    before
        .publish_job(job(1), "route.a", "held by the old consumer".into())
        .await
        .expect("publish");
    let stream = js.get_stream(&names.stream).await.expect("stream");
    let legacy: async_nats::jetstream::consumer::PullConsumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some(names.legacy_consumer.clone()),
            filter_subject: format!("{}>", names.subject_prefix),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("the old consumer");
    let mut held = legacy
        .fetch()
        .max_messages(1)
        .messages()
        .await
        .expect("pull");
    assert!(held.next().await.is_some(), "the old consumer delivered it");

    let queue = Queue::provision(&cfg).await.expect("provision");
    assert!(
        stream.consumer_info(&names.legacy_consumer).await.is_err(),
        "provisioning removed the consumer of all types"
    );
    for (n, t) in [(2, "route.a"), (3, "route.b"), (4, "route.nobody")] {
        queue
            .publish_job(job(n), t, t.into())
            .await
            .expect("publish");
    }
    let mut a = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while a.len() < 2 && Instant::now() < until {
        for d in queue
            .fetch("route.a", 10, Duration::from_millis(500))
            .await
            .expect("fetch a")
        {
            assert_eq!(d.job_type(), Ok("route.a"));
            a.push(d.job_id().expect("id"));
            d.ack().await.expect("ack");
        }
    }
    a.sort();
    let mut want = vec![job(1), job(2)];
    want.sort();
    assert_eq!(
        a, want,
        "the old consumer's message went to the type's consumer"
    );
    let mut b = queue
        .fetch("route.b", 10, Duration::from_secs(2))
        .await
        .expect("fetch b");
    assert_eq!(b.len(), 1);
    let b = b.pop().expect("one");
    assert_eq!(b.job_id(), Ok(job(3)));
    b.ack().await.expect("ack");

    let stored = queue.stored_by_type().await.expect("stored");
    assert_eq!(stored.get("route.nobody"), Some(&1), "{stored:?}");
    assert_eq!(stored.get("route.a"), None, "{stored:?}");
    let routed = queue.routed_types().await.expect("routed");
    assert_eq!(routed.keys().collect::<Vec<_>>(), ["route.a", "route.b"]);
    let mut late = queue
        .fetch("route.nobody", 10, Duration::from_secs(2))
        .await
        .expect("fetch late");
    assert_eq!(
        late.len(),
        1,
        "the waiting message goes to the first consumer of its type"
    );
    late.pop().expect("one").ack().await.expect("ack");
}

/// A work stream created before the doorbell (`queue/ring.rs`), without its
/// `RePublish`: nats-server 2.9 refuses to add one to an existing stream
/// (error 10052), so provisioning never tries and the stream keeps working
/// at the poll period; a new namespace's stream has the doorbell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_stream_from_before_the_doorbell_is_provisioned_and_works() {
    use async_nats::jetstream::{self, stream};
    let stack = nats();
    let cfg = config(stack, "q_no_ring", 5);
    let names = tenure::blocks::queue::QueueNames::new(&cfg.namespace);
    let client = tenure::blocks::queue::nats_client(&cfg)
        .await
        .expect("nats");
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
        name: names.stream.clone(),
        subjects: vec![format!("{}>", names.subject_prefix)],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        allow_direct: true,
        duplicate_window: cfg.duplicate_window,
        ..Default::default()
    })
    .await
    .expect("the stream as an earlier Tenure created it");
    let queue = Queue::provision(&cfg)
        .await
        .expect("provisions a stream without the doorbell");
    queue
        .publish_job(job(1), "test.job", "x".into())
        .await
        .expect("publish");
    let d = fetch_one(&queue, Duration::from_secs(5)).await;
    d.expect("fetched at the poll period")
        .ack()
        .await
        .expect("ack");
    let info = js.get_stream(&names.stream).await.expect("stream");
    assert!(info.cached_info().config.republish.is_none());

    let fresh = config(stack, "q_ring", 5);
    Queue::provision(&fresh).await.expect("provision");
    let fresh_names = tenure::blocks::queue::QueueNames::new(&fresh.namespace);
    let info = js.get_stream(&fresh_names.stream).await.expect("stream");
    let ring = info.cached_info().config.republish.clone();
    assert_eq!(
        ring.map(|r| (r.destination, r.headers_only)),
        Some((format!("{}>", fresh_names.ring_subject_prefix), true))
    );
}
