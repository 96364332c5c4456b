//! The lease module against a real 3-member etcd: races, fencing tokens across
//! expiry and leader loss, quorum loss, outside revocation, batches, releases,
//! and the watchdog.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::Duration;

use tenure::blocks::lease::{Acquire, Health, JobLock, LeaseError, LostReason, Session};
use tenure::config::WatchdogPolicy;
use tenure::devstack::{DevStack, DevStackOptions};
use tenure::{Config, FencingToken, JobId};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Tests that start their own stack and inject faults run one at a time.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The framework's log at `info` (or what `RUST_LOG` asks for) in the
/// test's output.
fn init_tracing() {
    tenure_tests::init_logs_at("tenure=info");
}

fn config(ns: &str, endpoints: Vec<String>, ttl_secs: u64, worker: &str) -> Config {
    Config::new(ns)
        .with_etcd_endpoints(endpoints)
        .with_lease_ttl(Duration::from_secs(ttl_secs))
        .with_worker_id(worker)
}

fn shared_config(prefix: &str, ttl_secs: u64, worker: &str) -> Config {
    let stack = DevStack::shared().expect("shared dev stack");
    config(
        &DevStack::unique_namespace(prefix),
        stack.etcd_endpoints(),
        ttl_secs,
        worker,
    )
}

fn job(name: &str) -> JobId {
    JobId::from_key("lease.test", name)
}

async fn raw_client(endpoints: &[String]) -> etcd_client::Client {
    etcd_client::Client::connect(endpoints, None)
        .await
        .expect("raw etcd client")
}

/// (lease, create_revision, value) of a key, read with a plain client.
async fn read_key(endpoints: &[String], key: &str) -> Option<(i64, i64, String)> {
    let mut c = raw_client(endpoints).await;
    let resp = c.get(key, None).await.expect("get");
    resp.kvs().first().map(|kv| {
        (
            kv.lease(),
            kv.create_revision(),
            kv.value_str().unwrap_or_default().to_string(),
        )
    })
}

fn acquired(a: Acquire) -> JobLock {
    match a {
        Acquire::Acquired(l) => l,
        Acquire::Contended { holder } => panic!("expected the lock, contended by {holder:?}"),
    }
}

/// Polls `acquire` until the lock is ours (or `within` passes).
async fn acquire_eventually(s: &Session, job_id: JobId, within: Duration) -> (JobLock, Duration) {
    let t0 = Instant::now();
    loop {
        match s.acquire(job_id).await {
            Ok(Acquire::Acquired(l)) => return (l, t0.elapsed()),
            Ok(Acquire::Contended { .. }) | Err(_) if t0.elapsed() < within => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("not acquired within {within:?}: {other:?}"),
        }
    }
}

/// Records every health change of a session with its instant.
fn record_health(s: &Session) -> tokio::task::JoinHandle<Vec<(Health, Instant)>> {
    let mut rx = s.watch_health();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while rx.changed().await.is_ok() {
            let h = *rx.borrow_and_update();
            seen.push((h, Instant::now()));
            if h == Health::Lost {
                break;
            }
        }
        seen
    })
}

// ---------------------------------------------------------------------------
// Races and expiry
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_race_exactly_one_wins_and_expiry_hands_over_a_larger_token() {
    init_tracing();
    let cfg_a = shared_config("race", 3, "worker-a");
    let mut cfg_b = cfg_a.clone();
    cfg_b.worker_id = "worker-b".into();
    let mut a = Session::establish(&cfg_a).await.expect("session a");
    let mut b = Session::establish(&cfg_b).await.expect("session b");
    assert_ne!(a.lease_id(), b.lease_id());

    // Many simultaneous races: exactly one winner each, the loser names the winner.
    let mut last = None;
    for i in 0..20 {
        let j = job(&format!("race-{i}"));
        let (ra, rb) = tokio::join!(a.acquire(j), b.acquire(j));
        let (ra, rb) = (ra.expect("a"), rb.expect("b"));
        let (winner, holder, winner_lease) = match (ra, rb) {
            (Acquire::Acquired(l), Acquire::Contended { holder }) => (l, holder, a.lease_id()),
            (Acquire::Contended { holder }, Acquire::Acquired(l)) => (l, holder, b.lease_id()),
            (x, y) => panic!("race {i}: exactly one must win, got {x:?} and {y:?}"),
        };
        assert_eq!(
            holder,
            Some(winner_lease),
            "the loser sees the winner's lease"
        );
        last = Some((winner, winner_lease == a.lease_id()));
    }

    // The winner of the last race freezes (keepalive stopped, lease not revoked).
    let (stale, a_won) = last.unwrap();
    let (winner, loser) = if a_won { (&mut a, &b) } else { (&mut b, &a) };
    let key = stale.key().to_string();
    let value = read_key(&cfg_a.etcd_endpoints, &key)
        .await
        .expect("key exists")
        .2;
    let v: serde_json::Value = serde_json::from_str(&value).expect("json value");
    assert_eq!(
        v["lease"],
        winner.lease_id().to_string(),
        "value names the lease: {value}"
    );
    assert!(
        v["worker"].as_str().unwrap().starts_with("worker-"),
        "value names the worker: {value}"
    );

    winner.halt_keepalive_for_tests();
    let halted = Instant::now();
    assert!(
        matches!(
            loser.acquire(stale.job_id()).await.unwrap(),
            Acquire::Contended { .. }
        ),
        "still held right after the keepalive stopped"
    );
    let (fresh, waited) = acquire_eventually(loser, stale.job_id(), Duration::from_secs(15)).await;
    println!("takeover after the holder froze: {waited:?} (TTL 3 s)");
    assert!(
        halted.elapsed() >= Duration::from_millis(1500),
        "the lease cannot expire much before its TTL; took over after {:?}",
        halted.elapsed()
    );
    assert!(
        fresh.token() > stale.token(),
        "{} must exceed {}",
        fresh.token(),
        stale.token()
    );

    // The frozen owner wakes up and releases: nothing of the new owner's is deleted.
    let stale_token = stale.token();
    assert!(!stale.release(winner).await.expect("stale release answers"));
    let (lease, rev, _) = read_key(&cfg_a.etcd_endpoints, &key)
        .await
        .expect("still held");
    assert_eq!((lease, rev), (loser.lease_id().get(), fresh.token().get()));
    assert!(stale_token < fresh.token());

    assert!(fresh.release(loser).await.unwrap());
    a.close().await.expect("close a");
    b.close().await.expect("close b");
}

/// What a child process does, chosen by `TENURE_LEASE_CHILD`. The parent tests
/// spawn this binary with it; in an ordinary run (no variable) it returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process_entry() {
    let Ok(mode) = std::env::var("TENURE_LEASE_CHILD") else {
        return;
    };
    let endpoints: Vec<String> = std::env::var("TENURE_LEASE_ENDPOINTS")
        .unwrap()
        .split(',')
        .map(String::from)
        .collect();
    let ns = std::env::var("TENURE_LEASE_NS").unwrap();
    let mut cfg = config(&ns, endpoints, 3, "child");
    if mode == "abort" {
        cfg.watchdog = WatchdogPolicy::AbortProcess;
    }
    let session = Session::establish(&cfg).await.expect("child session");
    match mode.as_str() {
        "hold" => {
            let j: JobId = std::env::var("TENURE_LEASE_JOB").unwrap().parse().unwrap();
            let lock = acquired(session.acquire(j).await.expect("child acquire"));
            println!(
                "CHILD token={} lease={}",
                lock.token(),
                session.lease_id().get()
            );
            // Frozen here by the parent (SIGSTOP), then resumed (SIGCONT).
            let cancel = session.cancellation();
            tokio::time::timeout(Duration::from_secs(60), cancel.cancelled())
                .await
                .expect("the session must be declared lost after the freeze");
            println!("CHILD lost reason={:?}", session.lost_reason());
            let released = lock.release(&session).await;
            println!("CHILD release={released:?}");
        }
        "abort" => {
            println!("CHILD lease={}", session.lease_id().get());
            tokio::time::sleep(Duration::from_secs(60)).await;
            println!("CHILD still alive");
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn spawn_child(
    mode: &str,
    endpoints: &[String],
    ns: &str,
    job: Option<JobId>,
) -> tokio::process::Child {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_process_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("TENURE_LEASE_CHILD", mode)
    .env("TENURE_LEASE_ENDPOINTS", endpoints.join(","))
    .env("TENURE_LEASE_NS", ns)
    .env_remove("RUST_LOG")
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .kill_on_drop(true);
    if let Some(j) = job {
        cmd.env("TENURE_LEASE_JOB", j.to_string());
    }
    cmd.spawn().expect("spawn child test process")
}

async fn next_child_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    within: Duration,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .expect("child line in time")
            .expect("read child stdout")
            .expect("child stdout open");
        // The harness prints `test child_process_entry ... ` without a newline.
        if let Some(at) = line.find("CHILD ") {
            return line[at + "CHILD ".len()..].to_string();
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_worker_process_loses_its_job_to_a_strictly_larger_token() {
    init_tracing();
    let cfg = shared_config("sigstop", 3, "parent");
    let j = job("sigstop");
    let mut child = spawn_child("hold", &cfg.etcd_endpoints, &cfg.namespace, Some(j));
    let pid = child.id().expect("child pid");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = next_child_line(&mut lines, Duration::from_secs(60)).await;
    let child_token: i64 = first
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("token="))
        .unwrap()
        .parse()
        .unwrap();

    let parent = Session::establish(&cfg).await.expect("parent session");
    assert!(matches!(
        parent.acquire(j).await.unwrap(),
        Acquire::Contended { .. }
    ));
    signal(pid, "-STOP");
    let stopped = Instant::now();
    let (lock, _) = acquire_eventually(&parent, j, Duration::from_secs(20)).await;
    let took = stopped.elapsed();
    println!("SIGSTOPped holder: job taken over after {took:?} (TTL 3 s)");
    assert!(
        took >= Duration::from_millis(1500),
        "took over too early: {took:?}"
    );
    assert!(lock.token() > tenure::ObservedFence::new(child_token).unwrap());

    // The stale worker resumes: it must see Lost and its release must not delete
    // the new owner's key.
    signal(pid, "-CONT");
    let lost = next_child_line(&mut lines, Duration::from_secs(20)).await;
    assert!(lost.starts_with("lost reason=Some("), "{lost}");
    let release = next_child_line(&mut lines, Duration::from_secs(20)).await;
    assert_eq!(release, "release=Ok(false)");
    let (lease, rev, _) = read_key(&cfg.etcd_endpoints, lock.key()).await.unwrap();
    assert_eq!((lease, rev), (parent.lease_id().get(), lock.token().get()));
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "child: {status:?}");
    parent.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_abort_process_aborts_a_worker_whose_lease_is_revoked() {
    use std::os::unix::process::ExitStatusExt;
    init_tracing();
    let cfg = shared_config("abort", 3, "parent");
    let mut child = spawn_child("abort", &cfg.etcd_endpoints, &cfg.namespace, None);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = next_child_line(&mut lines, Duration::from_secs(60)).await;
    let lease: i64 = first.strip_prefix("lease=").unwrap().parse().unwrap();
    let mut etcd = raw_client(&cfg.etcd_endpoints).await;
    etcd.lease_revoke(lease)
        .await
        .expect("revoke the child's lease");
    let revoked = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the child must die soon after its lease is revoked")
        .unwrap();
    println!(
        "AbortProcess: child died {:?} after the revoke",
        revoked.elapsed()
    );
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}");
}

// ---------------------------------------------------------------------------
// Revocation, batches, releases
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_revoked_from_outside_is_lost_and_cancels_the_token() {
    init_tracing();
    let cfg = shared_config("revoke", 3, "w");
    let s = Session::establish(&cfg).await.unwrap();
    let lock = acquired(s.acquire(job("revoke")).await.unwrap());
    let rec = record_health(&s);
    let cancel = s.cancellation();

    let mut etcd = raw_client(&cfg.etcd_endpoints).await;
    etcd.lease_revoke(s.lease_id().get()).await.unwrap();
    let revoked = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), cancel.cancelled())
        .await
        .expect("token cancelled after the revoke");
    let took = revoked.elapsed();
    println!("revoked from outside: Lost after {took:?} (keepalive every 500 ms)");
    assert!(
        took < Duration::from_millis(2100) + Duration::from_secs(1),
        "{took:?}"
    );
    assert_eq!(s.health(), Health::Lost);
    assert_eq!(s.lost_reason(), Some(LostReason::Revoked { ttl: 0 }));
    let seen: Vec<Health> = rec.await.unwrap().into_iter().map(|(h, _)| h).collect();
    assert_eq!(seen.last(), Some(&Health::Lost));
    assert!(
        read_key(&cfg.etcd_endpoints, lock.key()).await.is_none(),
        "keys go with the lease"
    );
    assert!(matches!(
        s.acquire(job("after-revoke")).await,
        Err(LeaseError::SessionLost { .. })
    ));
    // Closing a lost session whose lease is gone is fine.
    s.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_many_gives_per_job_results_and_one_larger_token_per_batch() {
    init_tracing();
    let cfg = shared_config("batch", 5, "a");
    let a = Session::establish(&cfg).await.unwrap();
    let b = Session::establish(&cfg.clone().with_worker_id("b"))
        .await
        .unwrap();
    let (j1, j2, j3, j4) = (job("b1"), job("b2"), job("b3"), job("b4"));

    let held = a.acquire_many(&[j1, j2]).await.unwrap();
    let held: Vec<JobLock> = held.into_iter().map(acquired).collect();
    assert_eq!(held[0].token(), held[1].token(), "one batch, one revision");
    let a_token = held[0].token();

    let got = b.acquire_many(&[j1, j3, j2, j4]).await.unwrap();
    assert_eq!(got.len(), 4);
    let mut locks = Vec::new();
    for (i, (r, j)) in got.into_iter().zip([j1, j3, j2, j4]).enumerate() {
        match (i, r) {
            (0 | 2, Acquire::Contended { holder }) => assert_eq!(holder, Some(a.lease_id())),
            (1 | 3, Acquire::Acquired(l)) => {
                assert_eq!(l.job_id(), j);
                locks.push(l);
            }
            (i, r) => panic!("entry {i}: unexpected {r:?}"),
        }
    }
    assert_eq!(locks[0].token(), locks[1].token());
    assert!(locks[0].token() > a_token);
    for l in &locks {
        let (lease, rev, _) = read_key(&cfg.etcd_endpoints, l.key()).await.unwrap();
        assert_eq!((lease, rev), (b.lease_id().get(), l.token().get()));
    }

    // a releases j1 (and j2) in one txn; b takes j1 with a strictly larger token.
    a.release_many(held).await.unwrap();
    let again = acquired(b.acquire_many(&[j1]).await.unwrap().pop().unwrap());
    assert!(again.token() > locks[0].token() && again.token() > a_token);

    // Guards: duplicates are refused; an empty batch is empty; a big batch splits.
    assert!(matches!(b.acquire_many(&[j4, j4]).await, Err(LeaseError::DuplicateJob(j)) if j == j4));
    assert!(b.acquire_many(&[]).await.unwrap().is_empty());
    let many: Vec<JobId> = (0..300).map(|i| job(&format!("many-{i}"))).collect();
    let big: Vec<JobLock> = b
        .acquire_many(&many)
        .await
        .unwrap()
        .into_iter()
        .map(acquired)
        .collect();
    assert_eq!(big.len(), 300);
    assert!(big.windows(2).all(|w| w[0].token() <= w[1].token()));
    assert!(big[0].token() > again.token());
    let distinct: std::collections::BTreeSet<_> = big.iter().map(JobLock::token).collect();
    assert_eq!(
        distinct.len(),
        3,
        "300 jobs = 3 transactions of at most 128"
    );
    b.release_many(big).await.unwrap();
    for j in &many[..5] {
        assert!(
            read_key(&cfg.etcd_endpoints, &b.lock_key(*j))
                .await
                .is_none()
        );
    }
    b.release_many(locks).await.unwrap();
    assert!(again.release(&b).await.unwrap());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_deletes_only_our_own_key() {
    init_tracing();
    let cfg = shared_config("release", 5, "a");
    let a = Session::establish(&cfg).await.unwrap();
    let b = Session::establish(&cfg.clone().with_worker_id("b"))
        .await
        .unwrap();
    let (j, k) = (job("r1"), job("r2"));

    // A plain release deletes the key.
    let l = acquired(a.acquire(j).await.unwrap());
    assert!(l.release(&a).await.unwrap());
    assert!(
        read_key(&cfg.etcd_endpoints, &a.lock_key(j))
            .await
            .is_none()
    );

    // a's lock on j is deleted from outside and b takes j with a larger token.
    let stale = acquired(a.acquire(j).await.unwrap());
    let valid_k = acquired(a.acquire(k).await.unwrap());
    raw_client(&cfg.etcd_endpoints)
        .await
        .delete(a.lock_key(j), None)
        .await
        .unwrap();
    let fresh = acquired(b.acquire(j).await.unwrap());
    assert!(fresh.token() > stale.token());

    // One txn releasing a stale lock and a valid one deletes only the valid one.
    a.release_many(vec![stale, valid_k]).await.unwrap();
    let (lease, rev, _) = read_key(&cfg.etcd_endpoints, fresh.key()).await.unwrap();
    assert_eq!(
        (lease, rev),
        (b.lease_id().get(), fresh.token().get()),
        "b's key untouched"
    );
    assert!(
        read_key(&cfg.etcd_endpoints, &a.lock_key(k))
            .await
            .is_none(),
        "a's own key deleted"
    );

    // Same for a single release: b's lock goes stale, a takes j, b's release is a no-op.
    raw_client(&cfg.etcd_endpoints)
        .await
        .delete(b.lock_key(j), None)
        .await
        .unwrap();
    let newest = acquired(a.acquire(j).await.unwrap());
    assert!(newest.token() > fresh.token());
    assert!(!fresh.release(&b).await.unwrap(), "not ours any more");
    let (lease, rev, _) = read_key(&cfg.etcd_endpoints, newest.key()).await.unwrap();
    assert_eq!((lease, rev), (a.lease_id().get(), newest.token().get()));
    assert!(newest.release(&a).await.unwrap());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

// ---------------------------------------------------------------------------
// Faults injected into etcd itself (own stacks, one at a time)
// ---------------------------------------------------------------------------

async fn etcd_only_stack() -> DevStack {
    DevStack::start_with(DevStackOptions {
        nats: false,
        postgres: false,
        ..Default::default()
    })
    .await
    .expect("etcd-only dev stack")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_degrades_then_loses_and_a_new_session_forms_after_backoff() {
    init_tracing();
    let _heavy = HEAVY.lock().await;
    let stack = etcd_only_stack().await;
    let cfg = config(
        &DevStack::unique_namespace("quorum"),
        stack.etcd_endpoints(),
        3,
        "w",
    );
    let s = Session::establish(&cfg).await.expect("session");
    let lock = acquired(s.acquire(job("quorum")).await.unwrap());
    // Let a few keepalives go round.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(s.health(), Health::Healthy);
    let rec = record_health(&s);
    let cancel = s.cancellation();

    // Pause the two followers: the leader keeps answering until it notices it has
    // no quorum (about one election timeout), then nothing answers.
    let leader = stack.etcd_leader().await.unwrap();
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    for f in &followers {
        stack.etcd_member(*f).pause().unwrap();
    }
    let paused = Instant::now();
    tokio::time::timeout(Duration::from_secs(15), cancel.cancelled())
        .await
        .expect("the token must be cancelled after quorum loss");
    let seen = rec.await.unwrap();
    let states: Vec<Health> = seen.iter().map(|(h, _)| *h).collect();
    assert_eq!(
        states,
        [Health::Degraded, Health::Lost],
        "Healthy -> Degraded -> Lost"
    );
    let degraded = seen[0].1 - paused;
    let lost = seen[1].1 - paused;
    println!(
        "quorum loss at TTL 3 s: Degraded after {degraded:?}, Lost after {lost:?} \
         (Lost - Degraded = {:?}), reason {:?}",
        lost - degraded,
        s.lost_reason()
    );
    // Bounds: the last ack was at most one period (500 ms) before the pause, the
    // leader may ack for ~1 election timeout more; Degraded at last ack + 1 s, Lost
    // at last ack + 2.1 s. Slack for a loaded machine.
    let leader_grace = Duration::from_millis(1500);
    let slack = Duration::from_millis(1500);
    assert!(
        degraded <= leader_grace + Duration::from_secs(1) + slack,
        "{degraded:?}"
    );
    assert!(
        lost <= leader_grace + Duration::from_millis(2100) + slack,
        "{lost:?}"
    );
    assert!(
        lost - degraded >= Duration::from_millis(1000),
        "Lost follows Degraded by ~1.1 s"
    );
    assert!(
        seen[1].1 >= s.lost_deadline(),
        "never Lost before the lost deadline"
    );
    assert!(
        matches!(s.lost_reason(), Some(LostReason::Deadline { .. })),
        "{:?}",
        s.lost_reason()
    );
    drop(lock);

    // A new session cannot form without quorum: establish_with_backoff keeps
    // retrying; once the members resume it succeeds.
    let stop = CancellationToken::new();
    let retry = {
        let (cfg, stop) = (cfg.clone(), stop.clone());
        tokio::spawn(async move { Session::establish_with_backoff(&cfg, &stop).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!retry.is_finished(), "no session without quorum");
    for f in &followers {
        stack.etcd_member(*f).resume().unwrap();
    }
    let resumed = Instant::now();
    let fresh = tokio::time::timeout(Duration::from_secs(30), retry)
        .await
        .expect("a new session within 30 s of the resume")
        .unwrap()
        .expect("new session");
    println!("new session {:?} after the resume", resumed.elapsed());
    assert_eq!(fresh.health(), Health::Healthy);
    assert_ne!(fresh.lease_id(), s.lease_id());
    let (l, _) = acquire_eventually(&fresh, job("quorum-after"), Duration::from_secs(10)).await;
    assert!(l.release(&fresh).await.unwrap());
    fresh.close().await.unwrap();
    drop(s);

    // And a stopped establish_with_backoff returns Cancelled promptly.
    let mut dead = cfg.clone();
    dead.etcd_endpoints = vec!["http://127.0.0.1:1".into()];
    let stop = CancellationToken::new();
    let canceller = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        canceller.cancel();
    });
    let t0 = Instant::now();
    let r = Session::establish_with_backoff(&dead, &stop).await;
    assert!(matches!(r, Err(LeaseError::Cancelled)), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

/// One step of the sequence: a single acquisition or a batch.
enum Step {
    Single,
    Batch(usize),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sequential_acquisitions_strictly_increase_across_a_leader_kill() {
    init_tracing();
    let _heavy = HEAVY.lock().await;
    let stack = etcd_only_stack().await;
    let ns = DevStack::unique_namespace("thousand");
    let cfgs: Vec<Config> = (0..3)
        .map(|i| config(&ns, stack.etcd_endpoints(), 5, &format!("w{i}")))
        .collect();
    let mut sessions = Vec::new();
    for c in &cfgs {
        sessions.push(Session::establish(c).await.expect("session"));
    }
    let t0 = Instant::now();
    // The "hot" job is handed from session to session; the others are fresh.
    let mut hot = job("hot-0");
    let mut hot_generation = 0;
    let mut hot_tokens: Vec<FencingToken> = Vec::new();
    let mut last: Option<FencingToken> = None;
    let mut count = 0usize;
    let mut step_no = 0usize;
    let mut killed: Option<(usize, usize, Instant)> = None; // (member, count at kill, when)
    let (mut errors, mut new_sessions) = (0usize, 0usize);
    let mut first_after_kill: Option<Duration> = None;

    while count < 1000 {
        if killed.is_none() && count >= 500 {
            let leader = stack.etcd_leader().await.unwrap();
            stack.etcd_member(leader).kill().unwrap();
            killed = Some((leader, count, Instant::now()));
        }
        let step = if step_no % 25 == 24 {
            Step::Batch(25)
        } else {
            Step::Single
        };
        let idx = step_no % sessions.len();
        let s = &sessions[idx];
        let result: Result<Vec<JobLock>, LeaseError> = match step {
            Step::Single => {
                let j = if step_no.is_multiple_of(2) {
                    hot
                } else {
                    job(&format!("fresh-{step_no}"))
                };
                match s.acquire(j).await {
                    Ok(Acquire::Acquired(l)) => Ok(vec![l]),
                    Ok(Acquire::Contended { holder }) => {
                        panic!(
                            "step {step_no}: job {j} contended by {holder:?}; every lock is released"
                        )
                    }
                    Err(e) => Err(e),
                }
            }
            Step::Batch(n) => {
                let jobs: Vec<JobId> = (0..n)
                    .map(|i| job(&format!("batch-{step_no}-{i}")))
                    .collect();
                s.acquire_many(&jobs)
                    .await
                    .map(|v| v.into_iter().map(acquired).collect())
            }
        };
        match result {
            Ok(locks) => {
                let t = locks[0].token();
                assert!(locks.iter().all(|l| l.token() == t), "one batch, one token");
                if let Some(prev) = last {
                    assert!(t > prev, "step {step_no}: token {t} not above {prev}");
                }
                if locks[0].job_id() == hot {
                    hot_tokens.push(t);
                }
                if let (Some((_, _, at)), None) = (killed, first_after_kill) {
                    first_after_kill = Some(at.elapsed());
                }
                last = Some(t);
                count += locks.len();
                step_no += 1;
                // Release: single locks one by one, batches in one txn. A failed
                // release only leaves a key that goes with its lease.
                let released = if locks.len() == 1 {
                    let l = locks.into_iter().next().unwrap();
                    l.release(s).await.map(|_| ())
                } else {
                    s.release_many(locks).await
                };
                if released.is_err() {
                    errors += 1;
                    // The hot job may still be held: move on to a new hot job.
                    hot_generation += 1;
                    hot = job(&format!("hot-{hot_generation}"));
                }
            }
            Err(e) => {
                errors += 1;
                assert!(
                    killed.is_some(),
                    "step {step_no}: error before any fault: {e}"
                );
                assert!(errors < 200, "too many errors after the kill; last: {e}");
                tracing::info!(step = step_no, error = %e, "acquisition failed; retrying");
                // The outcome is unknown: never reuse that hot job.
                hot_generation += 1;
                hot = job(&format!("hot-{hot_generation}"));
                if s.health() == Health::Lost {
                    let stop = CancellationToken::new();
                    let fresh = tokio::time::timeout(
                        Duration::from_secs(20),
                        Session::establish_with_backoff(&cfgs[idx], &stop),
                    )
                    .await
                    .expect("a new session in time")
                    .expect("new session");
                    sessions[idx] = fresh;
                    new_sessions += 1;
                } else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // Next step, same kind, a different session.
                step_no += 1;
            }
        }
    }
    let (member, at, _) = killed.expect("the leader was killed");
    println!(
        "{count} acquisitions in {:?}: leader m{member} killed after {at}; first success {:?} \
         after the kill; {errors} failed attempts, {new_sessions} new sessions; hot job \
         handed over {} times",
        t0.elapsed(),
        first_after_kill,
        hot_tokens.len()
    );
    assert!(count - at >= 400, "enough acquisitions after the kill");
    assert!(hot_tokens.windows(2).all(|w| w[0] < w[1]));
    for s in sessions {
        let _ = s.close().await;
    }
}

// ---------------------------------------------------------------------------
// etcd membership changes (issue 36)
// ---------------------------------------------------------------------------

/// What the grant probe saw: every token it was granted, in order, the
/// longest time between two grants, and how many of its sessions were lost.
#[derive(Debug, Default)]
struct Grants {
    tokens: Vec<FencingToken>,
    longest_gap: Duration,
    lost_sessions: usize,
}

/// Acquires (and releases) a fresh lock every 20 ms until `stop`, through a
/// session of `cfg` (a new one when it is lost).
fn probe_grants(cfg: Config, stop: CancellationToken) -> tokio::task::JoinHandle<Grants> {
    tokio::spawn(async move {
        let mut grants = Grants::default();
        let mut s = Session::establish(&cfg).await.expect("probe session");
        let mut last = Instant::now();
        let mut n = 0;
        while !stop.is_cancelled() {
            n += 1;
            let attempt = s.acquire(job(&format!("probe-{n}")));
            if let Ok(Ok(Acquire::Acquired(l))) =
                tokio::time::timeout(Duration::from_secs(10), attempt).await
            {
                grants.longest_gap = grants.longest_gap.max(last.elapsed());
                last = Instant::now();
                grants.tokens.push(l.token());
                let _ = l.release(&s).await;
            }
            if s.health() == Health::Lost {
                grants.lost_sessions += 1;
                match Session::establish_with_backoff(&cfg, &stop).await {
                    Ok(fresh) => s = fresh,
                    Err(_) => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        grants
    })
}

/// The index of the member whose client endpoint is `endpoint`.
fn member_at(stack: &DevStack, endpoint: &str) -> usize {
    stack
        .etcd_endpoints()
        .iter()
        .position(|e| e == endpoint)
        .expect("a current member")
}

/// 3 -> 5 -> 3: two members added, then `remove` and one more removed that is
/// neither `keep` nor `remove` (the leader if it is neither, else the first
/// added member). Returns how long it took.
async fn grow_and_shrink(stack: &mut DevStack, keep: &str, remove: &str) -> Duration {
    let t = Instant::now();
    let change = Duration::from_secs(60);
    let grown_from = stack.etcd_members();
    stack.etcd_add_member(change).await.expect("add a fourth");
    stack.etcd_add_member(change).await.expect("add a fifth");
    let leader = stack.etcd_leader().await.expect("a leader");
    let leader_ep = stack.etcd_endpoints()[leader].clone();
    let second = if leader_ep != keep && leader_ep != remove {
        leader_ep
    } else {
        stack.etcd_endpoints()[grown_from].clone()
    };
    for victim in [remove.to_string(), second] {
        let i = member_at(stack, &victim);
        stack.etcd_remove_member(i, change).await.expect("remove");
    }
    assert_eq!(stack.etcd_members(), 3);
    t.elapsed()
}

/// A lock held across etcd membership changes (the leader replaced by a fresh
/// member, then 3 -> 5 -> 3 with the leader removed when it can be) keeps its
/// key, lease and token; every grant during and after the changes is larger
/// than the ones before. The holder talks to a member that stays; a probe
/// that acquires fresh locks every 20 ms through the original endpoint list,
/// of which one member is left at the end, measures the longest time without
/// a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_across_etcd_membership_changes_keeps_its_token_and_grants_rise() {
    init_tracing();
    let _heavy = HEAVY.lock().await;
    let mut stack = etcd_only_stack().await;
    let ns = DevStack::unique_namespace("membership");
    let original = stack.etcd_endpoints();
    let leader = stack.etcd_leader().await.expect("a leader");
    let (keep, other) = (
        original[(leader + 1) % 3].clone(),
        original[(leader + 2) % 3].clone(),
    );
    let holder = Session::establish(&config(&ns, vec![keep.clone()], 5, "holder"))
        .await
        .expect("holder session");
    let held = acquired(holder.acquire(job("held")).await.expect("acquire"));
    let stop = CancellationToken::new();
    let probe = probe_grants(config(&ns, original.clone(), 5, "probe"), stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let t = Instant::now();
    let change = Duration::from_secs(60);
    stack
        .etcd_remove_member(leader, change)
        .await
        .expect("remove the leader");
    stack
        .etcd_add_member(change)
        .await
        .expect("add a fresh member");
    let replaced = t.elapsed();
    let resized = grow_and_shrink(&mut stack, &keep, &other).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let grants = probe.await.expect("probe");

    assert_ne!(
        holder.health(),
        Health::Lost,
        "the holder's session survived"
    );
    let (lease, rev, _) = read_key(std::slice::from_ref(&keep), held.key())
        .await
        .expect("still held");
    assert_eq!((lease, rev), (holder.lease_id().get(), held.token().get()));
    assert!(grants.tokens.windows(2).all(|w| w[0] < w[1]), "{grants:?}");
    let fresh = Session::establish(&config(&ns, stack.etcd_endpoints(), 5, "fresh"))
        .await
        .expect("a session on the new members");
    let after = acquired(fresh.acquire(job("after")).await.expect("acquire"));
    let highest = grants.tokens.last().copied().unwrap_or(held.token());
    assert!(after.token() > highest && after.token() > held.token());
    println!(
        "membership: leader replaced in {replaced:?}, 3 -> 5 -> 3 in {resized:?}; {} grants, \
         longest without one {:?}, {} probe sessions lost; held token {} kept, next {}",
        grants.tokens.len(),
        grants.longest_gap,
        grants.lost_sessions,
        held.token(),
        after.token()
    );
    let _ = holder.close().await;
    let _ = fresh.close().await;
}

#[test]
fn public_types_can_be_shared_across_tasks() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Session>();
    send_sync::<JobLock>();
    send_sync::<Acquire>();
    send_sync::<LeaseError>();
}
