//! `deploy/` is checked without running a container: `docker-compose config`
//! (Debian's docker-compose, installed by `scripts/setup.sh`) validates
//! `deploy/compose.yaml` against the Compose schema and resolves its
//! variables; the tests below check the shape the deployment guide
//! (`tenure::guide::deployment`) describes: three etcd members of one
//! cluster, NATS with JetStream, PostgreSQL 15 with Tenure's roles, the
//! migration as a one-shot, and a worker image that is multi-stage, runs as a
//! non-root user and is health-checked on `/readyz`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The repository's `deploy/` directory.
fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The passwords `compose.yaml` requires, with throwaway values.
const PASSWORDS: [&str; 4] = [
    "TENURE_PG_SUPERUSER_PASSWORD",
    "TENURE_MIGRATOR_PASSWORD",
    "TENURE_WORKER_PASSWORD",
    "TENURE_PRODUCER_PASSWORD",
];

/// `docker-compose -f deploy/compose.yaml ARGS` (no daemon needed), with the
/// passwords set or removed.
fn compose(args: &[&str], with_passwords: bool) -> Output {
    let mut cmd = Command::new("docker-compose");
    cmd.arg("-p")
        .arg("tenure-check")
        .arg("-f")
        .arg(deploy_dir().join("compose.yaml"));
    for name in PASSWORDS {
        if with_passwords {
            cmd.env(name, format!("check-{name}"));
        } else {
            cmd.env_remove(name);
        }
    }
    cmd.args(args).output().unwrap_or_else(|e| {
        panic!("docker-compose does not run ({e}): run scripts/setup.sh, which installs it")
    })
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy_dir().join(name))
        .unwrap_or_else(|e| panic!("deploy/{name}: {e}"))
}

#[test]
fn compose_file_is_valid_and_names_every_service() {
    let out = compose(&["--profile", "demo", "config", "-q"], true);
    assert!(
        out.status.success(),
        "docker-compose config refused deploy/compose.yaml:\n{}",
        text(&out)
    );
    let out = compose(&["--profile", "demo", "config", "--services"], true);
    let services = text(&out);
    let mut names: Vec<&str> = services.lines().collect();
    names.sort_unstable();
    let want = [
        "etcd-1",
        "etcd-2",
        "etcd-3",
        "ledger-demo",
        "migrate",
        "nats",
        "postgres",
        "worker",
    ];
    assert_eq!(names, want, "deploy/compose.yaml's services");
}

#[test]
fn compose_file_needs_every_password_and_commits_none() {
    let out = compose(&["config", "-q"], false);
    assert!(
        !out.status.success(),
        "compose.yaml resolved without the passwords"
    );
    assert!(
        text(&out).contains("set TENURE_"),
        "no hint which password is missing:\n{}",
        text(&out)
    );
}

#[test]
fn servers_are_three_etcd_members_nats_jetstream_and_postgresql_15() {
    let out = compose(&["config"], true);
    let resolved = text(&out);
    assert!(out.status.success(), "{resolved}");
    let cluster = "etcd-1=http://etcd-1:2380,etcd-2=http://etcd-2:2380,etcd-3=http://etcd-3:2380";
    assert_eq!(
        resolved.matches(cluster).count(),
        3,
        "each member names the one 3-member cluster"
    );
    for member in ["etcd-1", "etcd-2", "etcd-3"] {
        assert!(
            resolved.contains(&format!("ETCD_NAME: {member}")),
            "{member} has no name"
        );
    }
    let etcd = resolved
        .lines()
        .find(|l| l.contains("image: gcr.io/etcd-development/etcd:v"))
        .expect("an etcd image");
    let version = etcd.rsplit(":v").next().unwrap_or_default();
    let (major, minor) = version.split_once('.').expect("etcd image has a version");
    let minor: u32 = minor
        .split('.')
        .next()
        .unwrap_or_default()
        .parse()
        .expect("minor version");
    assert!(
        major == "3" && minor >= 4,
        "etcd 3.4 or newer, got {version}"
    );
    assert!(resolved.contains("- -js"), "NATS without JetStream (-js)");
    assert!(
        resolved.contains("image: postgres:15"),
        "PostgreSQL is not 15"
    );
}

#[test]
fn postgres_roles_are_the_ones_guide_production_names() {
    let roles = read("postgres/roles.sh");
    let guide = include_str!("../../framework/src/docs/production.md");
    for role in [
        "tenure_migrator",
        "tenure_worker",
        "tenure_producer",
        "tenure_admin",
    ] {
        assert!(
            guide.contains(&format!("CREATE ROLE {role}")),
            "guide::production no longer names {role}"
        );
        assert!(
            roles.contains(&format!("CREATE ROLE {role}")),
            "deploy/postgres/roles.sh does not create {role}"
        );
    }
    let compose = read("compose.yaml");
    assert!(
        compose.contains(r#"["tenure", "migrate", "--grant-worker", "tenure_worker", "--grant-producer", "tenure_producer"]"#),
        "the migrate service does not grant the worker and producer roles"
    );
    assert!(
        compose.contains("postgres://tenure_worker@"),
        "the worker does not run as tenure_worker"
    );
}

#[test]
fn worker_image_is_multi_stage_non_root_rustls_and_checked_on_readyz() {
    let docker = read("Dockerfile");
    let froms: Vec<&str> = docker.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a build stage and a run stage: {froms:?}");
    assert!(
        froms[0].contains(" AS build"),
        "the first stage is not the build"
    );
    let user = docker
        .lines()
        .rfind(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert!(
        !user.contains("root") && !user.contains(" 0"),
        "runs as root: {user}"
    );
    assert!(
        docker.contains("--example ledger") && docker.contains("-p tenure-cli"),
        "builds neither the ledger nor the CLI"
    );
    assert!(
        !docker.to_lowercase().contains("libssl"),
        "OpenSSL in the image"
    );
    let check = docker
        .lines()
        .find(|l| l.contains("CMD [\"bash\""))
        .expect("a HEALTHCHECK command");
    assert!(
        check.contains("/readyz") && check.contains(" 200 "),
        "the health check is not /readyz answering 200"
    );
}
