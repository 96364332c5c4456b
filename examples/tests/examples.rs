//! Runs each example binary end to end and checks its exit code (and the line of
//! its output that states the verdict): the demos users run work. The
//! examples' jobs themselves are tested on the testing kit (`#[tenure::test]`,
//! fault plans, the history checker) in `ledger_kit.rs` and
//! `provisioning_kit.rs`.
//!
//! `cargo test -p tenure-examples` (and `cargo test --workspace`) builds the
//! examples before running tests. Selecting only this test target
//! (`--test examples`) does not: then run `cargo build -p tenure-examples
//! --examples` first. Each example starts its own dev stack and works in a
//! namespace of its own, so they do not disturb other tests; this file runs them
//! one at a time to spare the machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One example at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Generous: each example takes well under 30 s on an idle machine.
const TIMEOUT: Duration = Duration::from_secs(240);

/// `target/<profile>/examples/<name>`, next to this test's `target/<profile>/deps/`.
fn example_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "example binary {} is missing: build it with `cargo build -p tenure-examples --example {name}` \
         (or run `cargo test -p tenure-examples`, which builds the examples first)",
        path.display()
    );
    path
}

/// Runs example `name`; returns (success, combined output, elapsed).
fn run_example(name: &str) -> (bool, String, Duration) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = example_path(name);
    let started = Instant::now();
    let mut child = Command::new(&path)
        .env_remove("TENURE_LEDGER_WORKER")
        .env_remove("TENURE_PROVISIONING_WORKER")
        .env_remove("TENURE_LEDGER_MARIADB_WORKER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", path.display()));
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let elapsed = started.elapsed();
    let output = format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        out_reader.join().unwrap_or_default(),
        err_reader.join().unwrap_or_default()
    );
    match status {
        Some(s) => (s.success(), format!("exit status: {s}\n{output}"), elapsed),
        None => (
            false,
            format!("killed after {TIMEOUT:?} without exiting\n{output}"),
            elapsed,
        ),
    }
}

#[test]
fn ledger_demo_exits_0_and_shows_a_refused_stale_write() {
    let (ok, output, elapsed) = run_example("ledger");
    eprintln!("ledger example took {elapsed:?}");
    assert!(ok, "the ledger example failed\n{output}");
    assert!(
        output.contains("ledger consistent: yes   stale write refused: yes"),
        "the ledger example exited 0 without its verdict line\n{output}"
    );
    assert!(
        output.contains("REFUSED"),
        "the ledger example's timeline shows no refused write\n{output}"
    );
    assert!(
        output.contains("T5 ended dead: step 2 (credit): no account \"dave\"")
            && output.contains("its on_dead hook refunded the debit"),
        "the ledger example shows no compensated transfer\n{output}"
    );
}

#[test]
fn provisioning_demo_exits_0_with_one_vm_and_a_refused_stale_token() {
    let (ok, output, elapsed) = run_example("provisioning");
    eprintln!("provisioning example took {elapsed:?}");
    assert!(ok, "the provisioning example failed\n{output}");
    assert!(
        output.contains("all checks hold")
            && output.contains("[ok] exactly one of each resource (one VM)")
            && output.contains("[ok] A's stale token was refused by the service")
            && output.contains("[ok] a client without a NATS user could not reach the service")
            && output.contains("[ok] worker A's NATS user could not call as worker B")
            && output.contains("[ok] every answered request came from a worker's own subject"),
        "the provisioning example exited 0 without its verdict lines\n{output}"
    );
}

#[test]
fn ledger_mariadb_demo_exits_0_only_with_the_stale_write_refused_by_mariadb() {
    let (ok, output, elapsed) = run_example("ledger_mariadb");
    eprintln!("ledger_mariadb example took {elapsed:?}");
    assert!(ok, "the MariaDB ledger example failed\n{output}");
    assert!(
        output.contains("ledger consistent: yes   stale write refused by MariaDB: yes"),
        "the MariaDB ledger example exited 0 without its verdict line\n{output}"
    );
    assert!(
        output.contains("REFUSED by MariaDB"),
        "the MariaDB ledger example shows no refused write\n{output}"
    );
}

#[test]
fn minimal_example_prints_its_jobs_result() {
    let (ok, output, elapsed) = run_example("minimal");
    eprintln!("minimal example took {elapsed:?}");
    assert!(
        ok,
        "the minimal example (README.md's first program) failed\n{output}"
    );
    assert!(
        output.contains("done: charged 1250 cents as ") && output.contains(", recorded"),
        "the minimal example exited 0 without its two steps' result\n{output}"
    );
}
