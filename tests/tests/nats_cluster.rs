//! Tenure on a three-node NATS JetStream cluster (issue 36, item 1): the dev
//! stack's `nats_cluster: 3`, streams at R3, workers and clients given every
//! node's URL. The work stream's leader node is killed while jobs run and
//! restarted on its ports and store: every job ends `done` once, nothing is
//! dead-lettered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use tenure::Client;
use tenure::blocks::fence::JobStatus;
use tenure::devstack::{DevStack, DevStackOptions};
use tenure_tests::{
    ThreeStep, config_for, count_status, done_within, double_commits, prepare_schema, slow_on,
    three_step_worker, wait_until, work,
};

/// The `cluster` part of `$JS.API.STREAM.INFO.<stream>` asked through
/// `url`, retried for 30 s (a node just restarted answers once it rejoined).
async fn stream_cluster(url: &str, stream: &str) -> serde_json::Value {
    let started = Instant::now();
    loop {
        match try_stream_info(url, stream).await {
            Ok(info) => {
                assert_eq!(info["config"]["num_replicas"], 3, "{info}");
                return info["cluster"].clone();
            }
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                eprintln!("stream info through {url}: {e}; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("stream info through {url}: {e}"),
        }
    }
}

async fn try_stream_info(url: &str, stream: &str) -> Result<serde_json::Value, String> {
    let nats = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(2)))
        .connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let reply = nats
        .request(format!("$JS.API.STREAM.INFO.{stream}"), Vec::new().into())
        .await
        .map_err(|e| e.to_string())?;
    let info: serde_json::Value =
        serde_json::from_slice(&reply.payload).map_err(|e| e.to_string())?;
    match info.get("error") {
        Some(e) => Err(e.to_string()),
        None => Ok(info),
    }
}

/// The index of the node (in `stack.nats_urls()` order) leading `stream`:
/// the dev stack names each node `tenure-dev-<client port>`.
async fn leader_node(stack: &DevStack, stream: &str) -> usize {
    let urls = stack.nats_urls();
    let cluster = stream_cluster(&urls[0], stream).await;
    let leader = cluster["leader"].as_str().expect("a leader").to_string();
    let replicas = cluster["replicas"].as_array().map_or(0, Vec::len);
    assert_eq!(replicas, 2, "two followers besides the leader: {cluster}");
    urls.iter()
        .position(|u| leader.ends_with(u.rsplit(':').next().unwrap()))
        .unwrap_or_else(|| panic!("leader {leader} is none of {urls:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_jobs_survive_the_stream_leader_node_killed_and_restarted() {
    tenure_tests::init_logs();
    let stack = DevStack::start_with(DevStackOptions {
        nats_cluster: 3,
        ..DevStackOptions::default()
    })
    .await
    .expect("dev stack with a NATS cluster");
    assert_eq!(stack.nats_nodes().len(), 3);
    assert_eq!(stack.nats_url().split(',').count(), 3);
    let meta = wait_until(Duration::from_secs(10), || async {
        stack.nats_meta_leader().await.is_some()
    })
    .await;
    assert!(meta, "no node names a JetStream meta leader");
    let ns = DevStack::unique_namespace("natsha");
    let cfg = config_for(&stack, &ns, Duration::from_secs(5)).with_stream_replicas(3);
    let client = Client::connect(&cfg).await.expect("client on the cluster");
    prepare_schema(&client).await;
    let stream = client.queue().names().stream.clone();
    let victim = leader_node(&stack, &stream).await;

    let workers = [
        three_step_worker(&cfg, &ns, "w1").await,
        three_step_worker(&cfg, &ns, "w2").await,
    ];
    // One job on the idle cluster, every node up: the baseline.
    let before = one_job_latency(&client, "before").await;
    const N: u64 = 52; // the probe before, 50, the probe during the outage
    for n in 0..50 {
        // Every fifth job's second step is slow on w1: jobs are still running
        // when the node dies.
        let input = if n % 5 == 0 {
            slow_on("w1", 2, 400)
        } else {
            work(n)
        };
        client
            .enqueue::<ThreeStep>(&format!("job-{n}"), &input)
            .await
            .expect("enqueue");
    }
    let killed = Instant::now();
    stack
        .nats_node(victim)
        .kill()
        .expect("kill the leader node");
    // A job enqueued while the leader is dead: its publish waits for the
    // stream's new leader (and then behind the 50 in the queue).
    let during = one_job_latency(&client, "during").await;
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(killed.elapsed())).await;
    stack.nats_node(victim).restart().expect("restart it");
    stack
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("the cluster answers again");
    let all_done = wait_until(Duration::from_secs(90), || async {
        count_status(&client, JobStatus::Done).await == N as i64
    })
    .await;
    let done = count_status(&client, JobStatus::Done).await;
    eprintln!(
        "node {victim} (the stream leader) killed; {done}/{N} done {:?} after the kill; \
         a probe job's (enqueue, failed tries, done) latency: {before:?} idle before, {during:?} \
         enqueued with the leader dead",
        killed.elapsed()
    );
    assert!(all_done, "{done} of {N} jobs done");
    assert_eq!(double_commits(client.store().pool(), &ns).await, 0);
    let dlq = client.queue().dead_letters(100).await.expect("DLQ");
    assert!(dlq.is_empty(), "dead letters: {dlq:?}");
    let cluster = stream_cluster(&stack.nats_urls()[victim], &stream).await;
    eprintln!("stream cluster after the restart: {cluster}");
    for w in workers {
        w.shutdown().await.expect("shutdown");
    }
}

/// How long one [`ThreeStep`] job's enqueue takes (its publish acknowledged
/// by the stream's leader; retried with the same key, as a caller must,
/// while it fails), how many tries failed, and how long until it is done.
async fn one_job_latency(client: &Client, name: &str) -> (Duration, u32, Duration) {
    let started = Instant::now();
    let mut failed = 0;
    let id = loop {
        match client
            .enqueue::<ThreeStep>(&format!("probe-{name}"), &work(0))
            .await
        {
            Ok(e) => break e.job_id,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                eprintln!(
                    "probe {name}: enqueue failed after {:?}: {e}",
                    started.elapsed()
                );
                failed += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("probe {name}: enqueue failed for 30 s: {e}"),
        }
    };
    let enqueued = started.elapsed();
    assert!(
        done_within(client, id, Duration::from_secs(60)).await,
        "probe job {name} not done"
    );
    (enqueued, failed, started.elapsed())
}
