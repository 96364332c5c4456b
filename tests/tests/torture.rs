//! The split-brain torture test, short run: the `torture` binary with every fault
//! kind (sixteen with one lock per job; nineteen in partition mode, with the
//! three that move partitions), once fenced (no violation may appear) and once with the test-only
//! `--unsafe-no-fencing` negative control (violations must appear, proving the
//! checkers have teeth); then (issue 22) fenced with the accounts in MariaDB,
//! and the Redis-lock negative control (a TTL lock checked before each write,
//! no token at the resource: violations must appear); and (issue 36) runs on
//! a NATS cluster and through etcd membership changes. The long runs are
//! recorded in `tests/TORTURE.md`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::sync::{Condvar, Mutex, PoisonError};

const JOBS: &str = "300";
/// One fault of each of the sixteen kinds; a run that adds kinds passes its own
/// count. Two or three of each (42 faults, 116 s) cost a minute of `make test`
/// for no kind the short run misses; the long runs in `tests/TORTURE.md` repeat
/// every kind many times.
const FAULTS: &str = "16";
const SEED: &str = "7";

struct Summary {
    line: String,
    fields: std::collections::HashMap<String, i64>,
}

/// At most two runs at a time, whatever `RUST_TEST_THREADS` says
/// (`make test` sets at least 4, for the suites that mostly wait): each run
/// is a cluster of its own (three etcd members, NATS, PostgreSQL, three
/// workers) that keeps a core busy.
const MAX_RUNS: usize = 2;
static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// One of the `MAX_RUNS` places, held until dropped.
struct RunSlot;

impl RunSlot {
    fn take() -> Self {
        let (count, freed) = &RUNNING;
        let mut n = count.lock().unwrap_or_else(PoisonError::into_inner);
        while *n >= MAX_RUNS {
            n = freed.wait(n).unwrap_or_else(PoisonError::into_inner);
        }
        *n += 1;
        RunSlot
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING;
        *count.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        freed.notify_one();
    }
}

fn run(extra: &[&str]) -> (bool, Summary, String) {
    let slot = RunSlot::take();
    let out = Command::new(env!("CARGO_BIN_EXE_torture"))
        .args([
            "--jobs",
            JOBS,
            "--workers",
            "3",
            "--faults",
            FAULTS,
            "--seed",
            SEED,
        ])
        .args(extra)
        .output()
        .expect("run the torture binary");
    drop(slot);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let all = format!(
        "--- stdout\n{stdout}\n--- stderr (tail)\n{}",
        tail(&stderr, 40)
    );
    let line = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no output\n{all}"))
        .to_string();
    assert!(
        line.starts_with("torture: jobs="),
        "the last line is not the summary\n{all}"
    );
    let mode = stdout.lines().rev().nth(1).unwrap_or_default();
    assert!(
        mode.starts_with("torture: mode=") && mode.contains(" target="),
        "the line before the summary does not name the mode and target\n{all}"
    );
    let fields = line
        .trim_start_matches("torture: ")
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().expect("a number")))
        .collect();
    eprintln!("{all}");
    (out.status.success(), Summary { line, fields }, all)
}

impl Summary {
    fn get(&self, k: &str) -> i64 {
        *self
            .fields
            .get(k)
            .unwrap_or_else(|| panic!("{k} missing in {:?}", self.line))
    }
}

/// Every kind of fault was injected at least once (from the per-kind line).
fn every_kind_injected(all: &str) {
    let kinds = all
        .lines()
        .find(|l| l.starts_with("torture: faults by kind:"))
        .expect("per-kind fault counts");
    for kv in kinds
        .trim_start_matches("torture: faults by kind:")
        .split_whitespace()
    {
        let (k, v) = kv.split_once('=').expect("k=v");
        // An armed crash-after-commit that saw no commit in time is counted
        // as a plain kill; every other kind always happens as scheduled.
        if k != "worker_kill_after_commit" {
            assert!(
                v.parse::<u32>().unwrap() > 0,
                "no {k} fault injected\n{all}"
            );
        }
    }
}

/// The main fenced run, with the operators' controls active (issue 35): both
/// transfer types limited fleet-wide to eight jobs, and the seventeenth kind
/// `operator_pause_type` pausing and resuming them mid-run: one fault of each
/// of the seventeen kinds.
#[test]
fn fenced_run_has_no_violation() {
    let (ok, s, all) = run(&["--fleet-max", "8", "--faults", "17"]);
    assert!(all.contains(" fleet_max=8"), "{all}");
    assert!(ok, "the fenced run failed\n{all}");
    no_violation(&s, &all, 300, 17);
}

/// A fenced run's verdict: all `jobs` ended, none lost, no double commit, no
/// token regression, `faults` injected, every kind among them.
fn no_violation(s: &Summary, all: &str, jobs: i64, faults: i64) {
    assert_eq!(s.get("jobs"), jobs, "{all}");
    assert_eq!(s.get("lost"), 0, "{all}");
    assert_eq!(s.get("double_commits"), 0, "{all}");
    assert_eq!(s.get("token_regressions"), 0, "{all}");
    assert_eq!(s.get("done") + s.get("dead"), jobs, "{all}");
    // Regression alarms only where an etcd restore without a bump handed
    // revisions out again (none from stalled workers, none after a bumped one).
    assert_eq!(history_field(all, "unexplained_alarms"), 0, "{all}");
    assert_eq!(s.get("faults"), faults, "{all}");
    every_kind_injected(all);
    // The cron schedule ran through the faults: no tick skipped, lost or
    // committed twice.
    for k in ["skipped", "missing", "unfinished", "twice"] {
        assert_eq!(cron_field(all, k), 0, "cron {k}\n{all}");
    }
    assert!(cron_field(all, "ticks") > 0, "no cron tick ran\n{all}");
}

/// A numeric field of the `torture: cron ...` line.
fn cron_field(all: &str, k: &str) -> i64 {
    line_field(all, "torture: cron ", k)
}

/// A numeric field `k` of the first line of `all` that starts with `prefix`.
fn line_field(all: &str, prefix: &str, k: &str) -> i64 {
    let line = all
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .find(|(key, _)| *key == k)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("{k} missing in {line}"))
}

/// The negative control, one fault of each kind: a 300-job run with sixteen
/// faults (seed 7) shows 19 double commits in 51 s.
#[test]
fn unfenced_run_is_caught() {
    let (ok, s, all) = run(&["--unsafe-no-fencing"]);
    assert!(
        ok,
        "the negative control found no violation: the checkers have no teeth\n{all}"
    );
    assert!(
        s.get("double_commits") > 0 || s.get("token_regressions") > 0,
        "{all}"
    );
    assert_eq!(s.get("faults"), 16, "{all}");
    every_kind_injected(&all);
}

/// Fewer jobs and one fault of each kind: the two runs of issue 22 stay
/// well under a minute each.
const SHORT: [&str; 4] = ["--jobs", "120", "--faults", "16"];

/// Partition mode: one of each of the nineteen kinds (the sixteen, plus
/// `worker_join`, `worker_leave_graceful` and `etcd_pause_during_handover`).
const PARTITIONED: [&str; 6] = ["--jobs", "300", "--faults", "19", "--partitions", "8"];

#[test]
fn partition_mode_fenced_run_has_no_violation() {
    let (ok, s, all) = run(&PARTITIONED);
    assert!(ok, "the fenced partition-mode run failed\n{all}");
    assert!(
        all.contains("torture: mode=fenced target=postgres partitions=8"),
        "{all}"
    );
    no_violation(&s, &all, 300, 19);
    assert!(
        all.contains("worker_join=1") && all.contains("worker_leave_graceful=1"),
        "{all}"
    );
}

#[test]
fn partition_mode_unfenced_run_is_caught() {
    // One fault of each of the nineteen kinds (seed 7: 7 double commits, 57 s).
    let (ok, s, all) = run(&[&PARTITIONED[..], &["--unsafe-no-fencing"]].concat());
    assert!(
        ok,
        "the partition-mode negative control found no violation\n{all}"
    );
    assert!(
        s.get("double_commits") > 0 || s.get("token_regressions") > 0,
        "{all}"
    );
    assert_eq!(s.get("faults"), 19, "{all}");
    every_kind_injected(&all);
}

/// On a three-node NATS JetStream cluster, streams at R3 (`--nats-cluster 3`,
/// issue 36): one fault of each of the eighteen kinds (the sixteen, with
/// `nats_restart` and `nats_pause` acting on every node, plus
/// `nats_node_kill` and `nats_meta_leader_kill`), 120 jobs (seed 11: 69 s).
#[test]
fn nats_cluster_fenced_run_has_no_violation() {
    let (ok, s, all) = run(&[
        "--jobs",
        "120",
        "--faults",
        "18",
        "--seed",
        "11",
        "--nats-cluster",
        "3",
    ]);
    assert!(ok, "the fenced run on a NATS cluster failed\n{all}");
    assert!(all.contains(" nats_nodes=3"), "{all}");
    no_violation(&s, &all, 120, 18);
    assert!(
        all.contains("nats_node_kill=1") && all.contains("nats_meta_leader_kill=1"),
        "{all}"
    );
}

/// PostgreSQL with a synchronous standby behind a front
/// (`--postgres-standby sync`, issue 36): one fault of each of the
/// seventeen kinds (the sixteen, plus `postgres_failover`: the primary
/// killed, the standby promoted, the front pointed at it, a new standby
/// made), 120 jobs (seed 11: 71 s).
#[test]
fn postgres_standby_fenced_run_has_no_violation() {
    let (ok, s, all) = run(&[
        "--jobs",
        "120",
        "--faults",
        "17",
        "--seed",
        "11",
        "--postgres-standby",
        "sync",
    ]);
    assert!(ok, "the fenced run with a PostgreSQL standby failed\n{all}");
    assert!(all.contains(" postgres_standby=sync"), "{all}");
    no_violation(&s, &all, 120, 17);
    assert!(all.contains("postgres_failover=1"), "{all}");
}

/// MariaDB as the fenced resource, with the five-step transfer (`--steps 5`,
/// the long run's shape): the transfers' accounts and history in
/// MariaDB (`StepCtx::mysql`), the job rows in PostgreSQL, the same faults
/// (`postgres_restart` restarts MariaDB too). No violation; every re-run
/// after a crash between the two commits absorbed by the idempotency key.
#[test]
fn mariadb_target_fenced_run_has_no_violation() {
    let (ok, s, all) = run(&[&SHORT[..], &["--target", "mariadb", "--steps", "5"]].concat());
    assert!(ok, "the fenced MariaDB run failed\n{all}");
    assert!(
        all.contains("torture: mode=fenced target=mariadb partitions=0 steps=5"),
        "{all}"
    );
    assert_eq!(s.get("jobs"), 120, "{all}");
    assert_eq!(s.get("lost"), 0, "{all}");
    assert_eq!(s.get("double_commits"), 0, "{all}");
    assert_eq!(s.get("token_regressions"), 0, "{all}");
    assert_eq!(history_field(&all, "ledger_violations"), 0, "{all}");
    assert_eq!(s.get("done") + s.get("dead"), 120, "{all}");
    assert_eq!(s.get("faults"), 16, "{all}");
}

/// The seed's warning, shown: the same jobs and faults, protected by a Redis
/// lock (`SET NX PX`, Redlock-style renewal and validity, checked before each
/// write) instead of a token the resource checks. It must commit twice or
/// lose updates.
#[test]
fn redis_lock_run_is_caught() {
    let (ok, s, all) = run(&[&SHORT[..], &["--mode", "redis-lock", "--steps", "5"]].concat());
    assert!(
        ok,
        "the Redis-lock run found no violation: the negative control has no teeth\n{all}"
    );
    assert!(
        all.contains("torture: mode=redis-lock target=postgres"),
        "{all}"
    );
    assert!(
        s.get("double_commits") > 0 || history_field(&all, "ledger_violations") > 0,
        "{all}"
    );
    assert_eq!(s.get("faults"), 16, "{all}");
}

/// A numeric field of the `torture: history_rows=...` line.
/// The operator action `cancel` (issue 18): a quarter of the jobs cancelled
/// mid-run, through the faults. Every job ends done, dead or cancelled; a
/// cancelled job is never partly committed, never written to after its
/// cancel, and a cancel that returned always ends `cancelled`.
#[test]
fn operator_cancels_mid_run_end_cancelled_never_partial_lost_or_doubled() {
    let (ok, s, all) = run(&[&SHORT[..], &["--cancel", "0.25"]].concat());
    assert!(ok, "the run with operator cancels failed\n{all}");
    assert_eq!(s.get("jobs"), 120, "{all}");
    assert_eq!(s.get("lost"), 0, "{all}");
    assert_eq!(s.get("double_commits"), 0, "{all}");
    assert_eq!(s.get("token_regressions"), 0, "{all}");
    assert_eq!(s.get("cancel_violations"), 0, "{all}");
    assert!(s.get("cancelled") > 0, "no job was cancelled\n{all}");
    assert_eq!(
        s.get("done") + s.get("dead") + s.get("cancelled"),
        120,
        "{all}"
    );
    assert_eq!(history_field(&all, "ledger_violations"), 0, "{all}");
    assert!(
        all.contains("torture: operator cancels: cancelled="),
        "{all}"
    );
}

fn history_field(all: &str, k: &str) -> i64 {
    line_field(all, "torture: history_rows=", k)
}

/// etcd snapshot restores on their own (two of each kind): without a bump the
/// revisions go back, fresh locks carry tokens already issued, and the claim
/// raises its alarm (every alarm on a reused revision); with the revision
/// bumped past every issued one, no alarm. Either way no violation, nothing
/// lost.
#[test]
fn etcd_restores_keep_the_fence_and_alarm_only_without_a_bump() {
    for kind in ["etcd_restore", "etcd_restore_bumped"] {
        let (ok, s, all) = run(&["--faults", "2", "--only", kind]);
        assert!(ok, "the {kind} run failed\n{all}");
        assert_eq!(s.get("lost"), 0, "{all}");
        assert_eq!(s.get("double_commits"), 0, "{all}");
        assert_eq!(s.get("token_regressions"), 0, "{all}");
        assert_eq!(s.get("done") + s.get("dead"), 300, "{all}");
        assert_eq!(s.get("faults"), 2, "{all}");
        assert_eq!(history_field(&all, "unexplained_alarms"), 0, "{all}");
        let alarms = history_field(&all, "regression_alarms");
        if kind == "etcd_restore_bumped" {
            assert_eq!(alarms, 0, "an alarm after a bumped restore\n{all}");
        } else {
            assert!(alarms > 0, "no alarm after a rewind\n{all}");
        }
    }
}

/// etcd membership changes under load (issue 36, `--membership-faults`): three
/// member replacements (a member removed, a fresh one with an empty data
/// directory added) and two 3 -> 5 -> 3 grow-and-shrinks, the leader among the
/// removed ones at times, while 100 jobs run on three workers. The workers
/// reach the members through addresses that follow the changes (as a DNS name
/// would). Tokens keep rising: no double commit, no regression, nothing lost
/// (seed 7: 46 s). With `TORTURE_NO_FOLLOW=1` the addresses stay on the
/// original members; by the fifth change none is left, and the last batch of
/// 20 jobs is lost (the workers are stranded): the limit the production
/// guide's "High availability" section states.
#[test]
fn etcd_membership_changes_keep_the_fence() {
    let (ok, s, all) = run(&[
        "--jobs",
        "100",
        "--faults",
        "5",
        "--membership-faults",
        "--only",
        "etcd_member_replace,etcd_grow_shrink",
    ]);
    assert!(ok, "the run with etcd membership changes failed\n{all}");
    assert_eq!(s.get("jobs"), 100, "{all}");
    assert_eq!(s.get("lost"), 0, "{all}");
    assert_eq!(s.get("double_commits"), 0, "{all}");
    assert_eq!(s.get("token_regressions"), 0, "{all}");
    assert_eq!(s.get("done") + s.get("dead"), 100, "{all}");
    assert_eq!(s.get("faults"), 5, "{all}");
    assert_eq!(history_field(&all, "regression_alarms"), 0, "{all}");
    assert!(
        all.contains("etcd_member_replace=3") && all.contains("etcd_grow_shrink=2"),
        "{all}"
    );
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
