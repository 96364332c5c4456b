//! The embedded dev stack: real etcd (3 members), NATS JetStream and PostgreSQL 15
//! servers as child processes on free loopback ports, in a temp dir, with fault
//! injection. Tests, examples and benchmarks all use it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure::devstack::DevStackError> {
//! use tenure::devstack::DevStack;
//! let stack = DevStack::start().await?;
//! println!("etcd: {:?}", stack.etcd_endpoints());
//! stack.etcd_member(0).pause()?;   // SIGSTOP one member
//! stack.etcd_member(0).resume()?;  // SIGCONT
//! stack.nats().restart()?;         // same port, same file storage
//! drop(stack);                     // every process stopped by pid, dir removed
//! # Ok(()) }
//! ```
//!
//! # Lifetime and clean-up
//! Dropping a [`DevStack`] kills every process it started (by process group, which
//! the stack itself created) and removes its directory. If the process that started
//! the stack dies without dropping it (a crashed or aborted test, a `static` stack),
//! the servers still die: they are spawned with `PR_SET_PDEATHSIG = SIGKILL`. The
//! directory is removed by the next stack that starts (see [`reap_stale_dirs`]).
//!
//! # Cheap for a suite
//! [`DevStack::shared`] starts one stack per test binary; each test then takes its
//! own namespace with [`DevStack::unique_namespace`] (etcd key prefix, stream names,
//! PostgreSQL schema). Tests that inject faults start a stack of their own.

mod error;
mod etcd;
mod front;
mod mariadb;
mod membership;
mod metrics;
mod nats;
mod pg_standby;
mod postgres;
mod process;
mod ready;
mod redis;
mod restore;
mod secure;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use error::DevStackError;
pub use pg_standby::{PgFailover, Replication};
use postgres::chown_to;
pub use process::ServerProcess;
pub use secure::{DevAuth, DevNatsRoles, DevNatsUser, DevTls, ExtraNatsUser};

/// Polls `f` every 50 ms until it returns true; false if `timeout` passes
/// first. For tests and examples that wait on a server's state.
pub async fn wait_until<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Which servers to start.
#[derive(Debug, Clone)]
pub struct DevStackOptions {
    /// Start the 3-member etcd cluster.
    pub etcd: bool,
    /// Number of etcd members (3 unless a test needs otherwise).
    pub etcd_members: usize,
    /// Start NATS with JetStream.
    pub nats: bool,
    /// With `nats`: how many `nats-server` nodes. 0 or 1 is one server; 3 (or
    /// more) is a JetStream cluster on loopback (routes between every node,
    /// `server_name` and store directory of each its own), for streams at R3
    /// (`Config::stream_replicas`). [`DevStack::nats_url`] then names every
    /// node, comma-separated; [`DevStack::nats_node`] reaches each for faults.
    pub nats_cluster: usize,
    /// Start PostgreSQL.
    pub postgres: bool,
    /// PostgreSQL `fsync` (off by default: the dev stack only survives process
    /// crashes, which the OS page cache covers, not machine crashes).
    pub postgres_fsync: bool,
    /// With `postgres`: a streaming standby of the primary (made by
    /// `pg_basebackup`, our own process on loopback) replicating as given,
    /// and a TCP front as the address every client uses
    /// ([`DevStack::database_url`]), for failovers
    /// ([`DevStack::postgres_failover`]). Not with `tls` or `auth`.
    pub postgres_standby: Option<Replication>,
    /// How long to wait for each server to become ready.
    pub ready_timeout: Duration,
    /// TLS on every server, with client certificates required (mutual TLS): a
    /// throwaway CA and certificates are made in the stack's directory
    /// ([`DevStack::tls`]). etcd endpoints become `https://`; PostgreSQL takes
    /// `hostssl` connections only.
    pub tls: bool,
    /// Authentication on every server ([`DevStack::auth`]): etcd `auth enable`
    /// with `root` and a `tenure` user limited to `<namespace>/`; NATS `admin`
    /// and an operator, a producer and a worker of the namespace and of a second
    /// one ([`DevAuth::other_namespace`]), each limited to its role's subjects
    /// and JetStream API calls (`NatsPermissions`); PostgreSQL
    /// SCRAM passwords and the roles `tenure_migrator`, `tenure_worker`,
    /// `tenure_admin`.
    pub auth: bool,
    /// The namespace the limited users of `auth` may use.
    pub namespace: String,
    /// With `auth`: NATS users beyond the roles, with permissions of their
    /// own (an application's service and its callers); see
    /// [`DevAuth::extra_nats_auth`].
    pub extra_nats_users: Vec<ExtraNatsUser>,
    /// Start Redis 7 (no persistence): only the torture test's Redis-lock
    /// negative control uses it ([`DevStack::redis_url`]).
    pub redis: bool,
    /// Start MariaDB 10.11, a MySQL-protocol fenced resource
    /// ([`DevStack::mysql_url`]); needs tenure's `mysql` feature.
    pub mariadb: bool,
}

impl Default for DevStackOptions {
    fn default() -> Self {
        DevStackOptions {
            etcd: true,
            etcd_members: 3,
            nats: true,
            nats_cluster: 0,
            postgres: true,
            postgres_fsync: false,
            postgres_standby: None,
            ready_timeout: Duration::from_secs(30),
            tls: false,
            auth: false,
            namespace: "tenure".into(),
            extra_nats_users: Vec::new(),
            redis: false,
            mariadb: false,
        }
    }
}

/// A running set of servers owned by this process. See the [module docs](self).
#[derive(Debug)]
pub struct DevStack {
    // Field order matters: processes drop (and die) before the directory goes.
    etcd: Vec<ServerProcess>,
    etcd_client_ports: Vec<u16>,
    etcd_peer_ports: Vec<u16>,
    /// Each member's serial number: its name `m<serial>`, its data directory
    /// `etcd<serial>` (membership changes give new members new serials).
    etcd_serials: Vec<usize>,
    etcd_next_serial: usize,
    nats: Vec<ServerProcess>,
    nats_ports: Vec<u16>,
    nats_http_ports: Vec<u16>,
    postgres: Option<ServerProcess>,
    postgres_port: u16,
    pg_pair: Option<pg_standby::PgPair>,
    redis: Option<redis::RedisServer>,
    mariadb: Option<mariadb::MariaDbServer>,
    tls: Option<DevTls>,
    auth: Option<DevAuth>,
    dir: tempfile::TempDir,
}

const DIR_PREFIX: &str = "tenure-devstack-";
const OWNER_FILE: &str = "owner.pid";
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const DATABASE: &str = "tenure";

impl DevStack {
    /// Starts etcd (3 members), NATS and PostgreSQL with default options.
    ///
    /// # Errors
    /// A missing binary (with the hint to run `scripts/setup.sh`), a server that
    /// does not become ready, or I/O.
    pub async fn start() -> Result<Self, DevStackError> {
        Self::start_with(DevStackOptions::default()).await
    }

    /// Starts the servers selected in `opts`.
    ///
    /// # Errors
    /// As [`DevStack::start`].
    pub async fn start_with(opts: DevStackOptions) -> Result<Self, DevStackError> {
        check_binaries(&opts)?;
        reap_stale_dirs();
        const ATTEMPTS: usize = 3;
        for _ in 1..ATTEMPTS {
            match Self::start_once(&opts).await {
                Err(e) if e.is_port_clash() => continue,
                started => return started,
            }
        }
        Self::start_once(&opts).await
    }

    /// One try of [`DevStack::start_with`], in a new directory with new ports.
    async fn start_once(opts: &DevStackOptions) -> Result<Self, DevStackError> {
        let mut stack = Self::empty(opts)?;
        if opts.tls {
            stack.tls = Some(secure::make_tls(stack.dir())?);
        }
        if opts.postgres {
            stack.start_postgres(opts)?;
            if let Some(replication) = opts.postgres_standby {
                let pair = pg_standby::PgPair::new(replication, stack.postgres_port, opts)?;
                stack.pg_pair = Some(pair);
            }
        }
        if opts.etcd {
            stack.start_etcd(opts.etcd_members)?;
        }
        if opts.nats {
            stack.start_nats(opts.nats_cluster)?;
        }
        if opts.redis {
            stack.start_redis()?;
        }
        if opts.mariadb {
            stack.start_mariadb()?;
        }
        if opts.etcd {
            stack.wait_etcd(opts.ready_timeout, true).await?;
            if let Some(auth) = &stack.auth {
                let options = stack.etcd_admin_options(false)?;
                secure::etcd_enable_auth(&stack.etcd_endpoints(), options, auth).await?;
            }
        }
        if opts.nats {
            stack.wait_nats(opts.ready_timeout, true).await?;
        }
        if opts.postgres {
            // A synchronous primary commits nothing (not even the stack's
            // database) until its standby streams.
            stack.start_postgres_standby(opts.ready_timeout).await?;
            stack.wait_postgres(opts.ready_timeout, true).await?;
            stack.create_roles().await?;
        }
        stack.wait_redis(opts.ready_timeout, true).await?;
        stack.wait_mariadb(opts.ready_timeout, true).await?;
        Ok(stack)
    }

    /// A stack with its directory and credentials but no server yet.
    fn empty(opts: &DevStackOptions) -> Result<Self, DevStackError> {
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(|e| DevStackError::io("create temp dir", e))?;
        std::fs::write(dir.path().join(OWNER_FILE), std::process::id().to_string())
            .map_err(|e| DevStackError::io("write owner file", e))?;
        set_mode(dir.path(), 0o755)?;
        Ok(DevStack {
            etcd: Vec::new(),
            etcd_client_ports: Vec::new(),
            etcd_peer_ports: Vec::new(),
            etcd_serials: Vec::new(),
            etcd_next_serial: 0,
            nats: Vec::new(),
            nats_ports: Vec::new(),
            nats_http_ports: Vec::new(),
            postgres: None,
            postgres_port: 0,
            pg_pair: None,
            redis: None,
            mariadb: None,
            tls: None,
            auth: opts
                .auth
                .then(|| DevAuth::new(&opts.namespace, &opts.extra_nats_users)),
            dir,
        })
    }

    /// One stack per process (test binary), started on first use and never
    /// dropped: its servers die with the process (`PDEATHSIG`), and its directory
    /// is reaped by the next stack. Do not inject faults into it; start your own.
    ///
    /// # Errors
    /// As [`DevStack::start`]; the first error is returned to every caller.
    pub fn shared() -> Result<&'static DevStack, String> {
        Self::shared_with(DevStackOptions::default())
    }

    /// As [`DevStack::shared`], for a stack with only some servers (one per
    /// process and set of options, e.g. PostgreSQL alone for a test binary that
    /// needs nothing else).
    ///
    /// # Errors
    /// As [`DevStack::start_with`]; the first error is returned to every caller.
    pub fn shared_with(options: DevStackOptions) -> Result<&'static DevStack, String> {
        // Every option is part of the key: two callers asking for different
        // namespaces or users get two stacks, never one with the other's users.
        type Key = String;
        type Started = Result<&'static DevStack, String>;
        static SHARED: Mutex<Vec<(Key, Started)>> = Mutex::new(Vec::new());
        let key: Key = format!("{options:?}");
        // Held while a stack starts: a second caller for the same servers waits
        // for it instead of starting another.
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, started)) = shared.iter().find(|(k, _)| *k == key) {
            return started.clone();
        }
        // Start on a thread of its own with its own runtime, so the stack does
        // not depend on whichever test's runtime touched it first.
        let started: Started = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(DevStack::start_with(options))
                .map_err(|e| e.to_string())
        })
        .join()
        .unwrap_or_else(|_| Err("devstack start panicked".to_string()))
        .map(|stack| &*Box::leak(Box::new(stack)));
        shared.push((key, started.clone()));
        started
    }

    /// A name that is unique in this process and across processes sharing the
    /// servers: `<prefix>_<pid>_<n>`, made of `[a-z0-9_]` so it is valid as an etcd
    /// prefix, a NATS stream name and a PostgreSQL schema name.
    pub fn unique_namespace(prefix: &str) -> String {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let clean: String = prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("{clean}_{}_{n}", std::process::id())
    }

    /// Waits until every server of the stack answers again (after a `restart()`):
    /// an etcd write commits, JetStream answers, PostgreSQL accepts a connection.
    ///
    /// # Errors
    /// [`DevStackError::NotReady`] after `timeout` per server.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), DevStackError> {
        if !self.etcd.is_empty() {
            self.wait_etcd(timeout, false).await?;
        }
        if !self.nats.is_empty() {
            self.wait_nats(timeout, false).await?;
        }
        if self.postgres.is_some() {
            self.wait_postgres(timeout, false).await?;
        }
        self.wait_redis(timeout, false).await?;
        self.wait_mariadb(timeout, false).await?;
        Ok(())
    }

    /// The stack's directory (data dirs and logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The certificates of a stack started with `tls`.
    pub fn tls(&self) -> Option<&DevTls> {
        self.tls.as_ref()
    }

    /// The users and passwords of a stack started with `auth`.
    pub fn auth(&self) -> Option<&DevAuth> {
        self.auth.as_ref()
    }

    /// Every server process of the stack.
    pub fn processes(&self) -> impl Iterator<Item = &ServerProcess> {
        self.etcd
            .iter()
            .chain(&self.nats)
            .chain(self.postgres.as_ref())
            .chain(self.redis.as_ref().map(|r| &r.process))
            .chain(self.mariadb.as_ref().map(|m| &m.process))
    }
}

fn check_binaries(opts: &DevStackOptions) -> Result<(), DevStackError> {
    let mut needed: Vec<(PathBuf, &'static str)> = vec![("setpriv".into(), "util-linux")];
    if opts.etcd {
        needed.push(("etcd".into(), "etcd-server"));
    }
    if opts.nats {
        needed.push(("nats-server".into(), "nats-server"));
    }
    if opts.postgres {
        needed.push((Path::new(PG_BIN).join("initdb"), "postgresql-15"));
        needed.push((Path::new(PG_BIN).join("postgres"), "postgresql-15"));
    }
    if opts.redis {
        needed.push(("redis-server".into(), "redis-server"));
    }
    if opts.mariadb {
        if cfg!(not(feature = "mysql")) {
            return Err(DevStackError::MissingFeature {
                server: "mariadb",
                feature: "mysql",
            });
        }
        needed.push((mariadb::MARIADB_SERVER.into(), "mariadb-server-core"));
        needed.push((mariadb::MARIADB_INSTALL_DB.into(), "mariadb-server-core"));
    }
    for (binary, package) in needed {
        if !on_path(&binary) {
            return Err(DevStackError::MissingBinary {
                binary: binary.display().to_string(),
                package,
            });
        }
    }
    Ok(())
}

fn on_path(binary: &Path) -> bool {
    if binary.is_absolute() {
        return binary.is_file();
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file()))
        .unwrap_or(false)
}

/// Writes `bytes` to `path`, readable and writable by its owner only (0600)
/// from the moment the file exists: private keys and every file that carries
/// a password. An existing file is truncated and its mode set to 0600 too.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), DevStackError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |e| DevStackError::io(format!("write {}", path.display()), e);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(fail)?;
    file.write_all(bytes).map_err(fail)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), DevStackError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| DevStackError::io(format!("chmod {}", path.display()), e))
}

/// Removes dev-stack directories whose owning process is gone (a crashed test).
///
/// Their servers are already dead (`PDEATHSIG`); as a second line of defence any
/// process still running whose command line names the stale directory is killed.
/// Only such processes: a process is identified by its data directory, never by
/// its name.
pub fn reap_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_stack = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(DIR_PREFIX));
        if !is_stack {
            continue;
        }
        let owner = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        let Some(owner) = owner else { continue };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        kill_processes_naming(&path);
        let _ = std::fs::remove_dir_all(&path);
    }
}

fn kill_processes_naming(dir: &Path) {
    let needle = dir.display().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    /// The CI failure this guards against: a port chosen for a server is taken
    /// before the server binds it. The server exits; the stack must say so at
    /// once, with the log's reason, as a clash it can retry (it used to wait 30 s
    /// and report a timeout).
    #[tokio::test]
    async fn a_server_whose_port_is_taken_is_a_port_clash_reported_at_once() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let opts = DevStackOptions::default();
        let mut stack = DevStack::empty(&opts).unwrap();
        stack.start_nats_on(port).unwrap();
        let err = stack.wait_nats(Duration::from_secs(60), true).await;
        let err = err.expect_err("nats cannot have started on a taken port");
        assert!(err.is_port_clash(), "{err}");
    }
}
