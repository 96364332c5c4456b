//! `scripts/setup.sh` and `scripts/check-fresh.sh` on this machine: the package
//! list is complete, and the completeness check fails when a package the build
//! needs is dropped from it (the step whose absence once broke `make demo` on a
//! fresh machine while CI, which had the package, stayed green).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts")
}

fn run(script: &str, args: &[&Path]) -> Output {
    Command::new("bash")
        .arg(scripts().join(script))
        .args(args)
        .output()
        .expect("run bash")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn setup_lists_every_package_the_build_and_tests_use() {
    let out = run("check-fresh.sh", &[]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn the_completeness_check_fails_when_a_needed_package_is_dropped() {
    let setup = std::fs::read_to_string(scripts().join("setup.sh")).unwrap();
    for dropped in [
        "libprotobuf-dev",
        "protobuf-compiler",
        "nats-server",
        "postgresql-15",
        "mariadb-server-core",
        "redis-server",
    ] {
        let without: String = setup
            .lines()
            .filter(|l| l.split_whitespace().next() != Some(dropped))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_ne!(without, setup, "{dropped} is listed in setup.sh");
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("setup.sh");
        std::fs::write(&copy, without).unwrap();
        let out = run("check-fresh.sh", &[&copy]);
        let said = text(&out);
        assert!(!out.status.success(), "passed without {dropped}: {said}");
        assert!(
            said.contains(&format!("the Debian package {dropped}, which")),
            "the failure names {dropped}: {said}"
        );
    }
}

#[test]
fn setup_verifies_a_ready_machine_and_prints_its_list() {
    let out = run("setup.sh", &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = run("setup.sh", &[Path::new("--packages")]);
    let list = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(list.lines().any(|l| l == "libprotobuf-dev"), "{list}");
}
