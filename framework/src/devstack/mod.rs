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

mod mariadb;
mod metrics;
mod process;
mod ready;
mod redis;
mod restore;
mod secure;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use process::ServerProcess;
use process::Spec;
use ready::{Probe, free_ports, poll_ready};
pub use secure::{DevAuth, DevNatsRoles, DevNatsUser, DevTls, ExtraNatsUser};

/// Errors of the dev stack.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevStackError {
    /// A server binary is not installed.
    #[error("`{binary}` not found ({package}); run `scripts/setup.sh` to install it")]
    MissingBinary {
        /// The binary that was looked for.
        binary: String,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// An I/O operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A server did not become ready in time.
    #[error(
        "{server} did not become ready within {timeout:?}: {last_error} (log: {log})\n\
         last lines of its log:\n{log_tail}"
    )]
    NotReady {
        /// Which server.
        server: String,
        /// How long we waited.
        timeout: Duration,
        /// The last error seen while probing it.
        last_error: String,
        /// The server's log file.
        log: String,
        /// The last lines of that log.
        log_tail: String,
    },
    /// A server exited while the stack waited for it to become ready.
    #[error("{server} exited while starting; last lines of its log:\n{log_tail}")]
    Exited {
        /// Which server process (`etcd-0`, `nats`, `postgres`).
        server: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// A command (initdb) failed.
    #[error("`{command}` failed: {output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its combined output.
        output: String,
    },
    /// Fault injection on a process that is not running.
    #[error("{0} is not running")]
    NotRunning(String),
    /// A server was asked for whose client this build of tenure lacks.
    #[error("the dev stack's {server} needs tenure's `{feature}` feature")]
    MissingFeature {
        /// Which server.
        server: &'static str,
        /// The cargo feature of `tenure` that brings its client.
        feature: &'static str,
    },
}

impl DevStackError {
    /// Whether a server could not bind its port because another process took
    /// it after the stack chose it: starting again with new ports helps.
    pub fn is_port_clash(&self) -> bool {
        matches!(self, DevStackError::Exited { log_tail, .. }
            if log_tail.to_ascii_lowercase().contains("address already in use"))
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        DevStackError::Io {
            what: what.into(),
            source,
        }
    }
}

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
    /// Start PostgreSQL.
    pub postgres: bool,
    /// PostgreSQL `fsync` (off by default: the dev stack only survives process
    /// crashes, which the OS page cache covers, not machine crashes).
    pub postgres_fsync: bool,
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
            postgres: true,
            postgres_fsync: false,
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
    nats: Option<ServerProcess>,
    nats_port: u16,
    postgres: Option<ServerProcess>,
    postgres_port: u16,
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
        }
        if opts.etcd {
            stack.start_etcd(opts.etcd_members)?;
        }
        if opts.nats {
            stack.start_nats()?;
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
            nats: None,
            nats_port: 0,
            postgres: None,
            postgres_port: 0,
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
        if self.nats.is_some() {
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

    /// etcd client endpoints, one per member (`http://127.0.0.1:PORT`;
    /// `https://` with `tls`).
    pub fn etcd_endpoints(&self) -> Vec<String> {
        let scheme = self.scheme();
        self.etcd_client_ports
            .iter()
            .map(|p| format!("{scheme}://127.0.0.1:{p}"))
            .collect()
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

    /// etcd client options of the stack's administrator (`root` once auth is on).
    fn etcd_admin_options(
        &self,
        as_root: bool,
    ) -> Result<etcd_client::ConnectOptions, DevStackError> {
        let mut cfg = crate::Config::new("devstack").with_etcd_endpoints(self.etcd_endpoints());
        if let Some(tls) = &self.tls {
            cfg = cfg.with_etcd_tls(tls.client());
        }
        if let (true, Some(auth)) = (as_root, &self.auth) {
            cfg = cfg.with_etcd_user("root", auth.etcd_root_password.clone());
        }
        crate::lease::etcd_connect_options(&cfg)
            .map_err(|e| DevStackError::io("etcd TLS files", std::io::Error::other(e)))
    }

    /// The etcd member `i` (0-based), for fault injection.
    ///
    /// # Panics
    /// If `i` is out of range or etcd was not started (a test bug).
    #[allow(clippy::panic)]
    pub fn etcd_member(&self, i: usize) -> &ServerProcess {
        self.etcd
            .get(i)
            .unwrap_or_else(|| panic!("no etcd member {i} in this dev stack"))
    }

    /// Number of etcd members.
    pub fn etcd_members(&self) -> usize {
        self.etcd.len()
    }

    /// The index of the current etcd leader, asked of the members that answer.
    ///
    /// # Errors
    /// If no member answers within 5 s.
    pub async fn etcd_leader(&self) -> Result<usize, DevStackError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut last_error = String::from("no member answered");
        while tokio::time::Instant::now() < deadline {
            let options = self.etcd_admin_options(true)?;
            for endpoint in self.etcd_endpoints() {
                match etcd_status(&endpoint, &options).await {
                    Ok((_, leader)) if leader != 0 => {
                        for (i, ep) in self.etcd_endpoints().iter().enumerate() {
                            if let Ok((id, _)) = etcd_status(ep, &options).await {
                                if id == leader {
                                    return Ok(i);
                                }
                            }
                        }
                    }
                    Ok(_) => last_error = "no leader elected".into(),
                    Err(e) => last_error = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(DevStackError::NotReady {
            server: "etcd leader".into(),
            timeout: Duration::from_secs(5),
            last_error,
            log: self.dir().display().to_string(),
            log_tail: ready::log_tail(&self.dir().join("etcd0.log")),
        })
    }

    /// The NATS server URL (`nats://127.0.0.1:PORT`).
    pub fn nats_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.nats_port)
    }

    /// The NATS server, for fault injection.
    ///
    /// # Panics
    /// If NATS was not started (a test bug).
    #[allow(clippy::panic)]
    pub fn nats(&self) -> &ServerProcess {
        self.nats
            .as_ref()
            .unwrap_or_else(|| panic!("NATS was not started in this dev stack"))
    }

    /// The URL of the stack's `tenure` database.
    pub fn database_url(&self) -> String {
        self.database_url_for(DATABASE)
    }

    /// The URL of database `db` on the stack's PostgreSQL, as the superuser.
    pub fn database_url_for(&self, db: &str) -> String {
        let password = self.auth.as_ref().map(|a| &a.postgres_password);
        self.database_url_as("postgres", password, db)
    }

    /// The URL of database `db` as `user` (with `password`): `sslmode=disable`,
    /// or with `tls` `sslmode=verify-full` with the stack's CA and client
    /// certificate.
    pub fn database_url_as(
        &self,
        user: &str,
        password: Option<&crate::security::Secret>,
        db: &str,
    ) -> String {
        let userinfo = match password {
            Some(p) => format!("{user}:{}", p.expose()),
            None => user.to_string(),
        };
        let port = self.postgres_port;
        let ssl = match &self.tls {
            None => "sslmode=disable".to_string(),
            Some(t) => format!(
                "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
                t.ca_file.display(),
                t.client_cert.display(),
                t.client_key.display()
            ),
        };
        format!("postgres://{userinfo}@127.0.0.1:{port}/{db}?{ssl}")
    }

    /// The PostgreSQL server (postmaster and its backends), for fault injection.
    ///
    /// # Panics
    /// If PostgreSQL was not started (a test bug).
    #[allow(clippy::panic)]
    pub fn postgres(&self) -> &ServerProcess {
        self.postgres
            .as_ref()
            .unwrap_or_else(|| panic!("PostgreSQL was not started in this dev stack"))
    }

    /// Every server process of the stack.
    pub fn processes(&self) -> impl Iterator<Item = &ServerProcess> {
        self.etcd
            .iter()
            .chain(self.nats.as_ref())
            .chain(self.postgres.as_ref())
            .chain(self.redis.as_ref().map(|r| &r.process))
            .chain(self.mariadb.as_ref().map(|m| &m.process))
    }

    fn start_etcd(&mut self, members: usize) -> Result<(), DevStackError> {
        let ports = free_ports(members * 2)?;
        let (client, peer) = ports.split_at(members);
        self.etcd_peer_ports = peer.to_vec();
        let token = self.etcd_token();
        let cluster = self.etcd_cluster();
        let scheme = self.scheme();
        for i in 0..members {
            let data = self.dir().join(format!("etcd{i}"));
            let mut args = vec![
                format!("--name=m{i}"),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls={scheme}://127.0.0.1:{}", client[i]),
                format!("--advertise-client-urls={scheme}://127.0.0.1:{}", client[i]),
                format!("--listen-peer-urls=http://127.0.0.1:{}", peer[i]),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{}", peer[i]),
                format!("--initial-cluster={cluster}"),
                "--initial-cluster-state=new".into(),
                format!("--initial-cluster-token={token}"),
                "--logger=zap".into(),
                "--log-level=warn".into(),
            ];
            if let Some(tls) = &self.tls {
                args.extend([
                    format!("--cert-file={}", tls.server_cert.display()),
                    format!("--key-file={}", tls.server_key.display()),
                    format!("--trusted-ca-file={}", tls.ca_file.display()),
                    "--client-cert-auth".into(),
                ]);
            }
            let spec = Spec {
                name: format!("etcd-{i}"),
                program: "etcd".into(),
                args,
                run_as: None,
                log: self.dir().join(format!("etcd{i}.log")),
            };
            self.etcd.push(ServerProcess::start(spec)?);
        }
        self.etcd_client_ports = client.to_vec();
        Ok(())
    }

    /// The etcd cluster's `--initial-cluster` (members `m<i>` on their peer ports).
    fn etcd_cluster(&self) -> String {
        let members: Vec<String> = (self.etcd_peer_ports.iter().enumerate())
            .map(|(i, port)| format!("m{i}=http://127.0.0.1:{port}"))
            .collect();
        members.join(",")
    }

    /// The etcd cluster's `--initial-cluster-token` (unique per stack directory).
    fn etcd_token(&self) -> String {
        format!("tenure-{}", self.dir().display()).replace('/', "-")
    }

    /// Waits until an etcd write commits; with `starting`, fails at once if a
    /// member exits.
    async fn wait_etcd(&self, timeout: Duration, starting: bool) -> Result<(), DevStackError> {
        let endpoints = self.etcd_endpoints();
        let options = self.etcd_admin_options(false)?;
        let probe = Probe {
            server: "etcd",
            log: self.dir().join("etcd0.log"),
            attempt_timeout: Duration::from_secs(2),
            timeout,
            must_run: if starting {
                self.etcd.iter().collect()
            } else {
                Vec::new()
            },
        };
        poll_ready(probe, || async {
            let mut client = etcd_client::Client::connect(&endpoints, Some(options.clone()))
                .await
                .map_err(|e| e.to_string())?;
            client
                .put("__tenure_devstack_ready", "1", None)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
        .await
    }

    fn start_nats(&mut self) -> Result<(), DevStackError> {
        self.start_nats_on(free_ports(1)?[0])
    }

    fn start_nats_on(&mut self, port: u16) -> Result<(), DevStackError> {
        let store = self.dir().join("nats");
        let spec = Spec {
            name: "nats".into(),
            program: "nats-server".into(),
            args: vec![
                "-js".into(),
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
                "-sd".into(),
                store.display().to_string(),
                "--server_name".into(),
                format!("tenure-dev-{port}"),
            ],
            run_as: None,
            log: self.dir().join("nats.log"),
        };
        let mut spec = spec;
        if self.tls.is_some() || self.auth.is_some() {
            let conf = self.dir().join("nats.conf");
            let text = secure::nats_conf(self.tls.as_ref(), self.auth.as_ref());
            write_private(&conf, text.as_bytes())?;
            spec.args.extend(["-c".into(), conf.display().to_string()]);
        }
        self.nats = Some(ServerProcess::start(spec)?);
        self.nats_port = port;
        Ok(())
    }

    /// Waits until JetStream answers; with `starting`, fails at once if the
    /// server exits.
    async fn wait_nats(&self, timeout: Duration, starting: bool) -> Result<(), DevStackError> {
        let url = self.nats_url();
        let probe = Probe {
            server: "nats",
            log: self.dir().join("nats.log"),
            attempt_timeout: Duration::from_secs(2),
            timeout,
            must_run: self.nats.iter().filter(|_| starting).collect(),
        };
        poll_ready(probe, || async {
            let client = self
                .nats_admin_options()
                .connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            // A raw account-info request: typed `query_account` does not parse
            // nats-server 2.9's answer with every async-nats version.
            let reply = client
                .request("$JS.API.INFO", bytes::Bytes::new())
                .await
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&reply.payload);
            if text.contains("\"error\"") {
                return Err(format!("JetStream not ready: {text}"));
            }
            Ok(())
        })
        .await
    }

    fn nats_admin_options(&self) -> async_nats::ConnectOptions {
        let mut options = async_nats::ConnectOptions::new();
        if let Some(tls) = &self.tls {
            options = options
                .require_tls(true)
                .add_root_certificates(tls.ca_file.clone())
                .add_client_certificate(tls.client_cert.clone(), tls.client_key.clone());
        }
        if let Some(auth) = &self.auth {
            options =
                options.user_and_password("admin".into(), auth.nats_admin_password.expose().into());
        }
        options
    }

    /// `initdb` as the server's user (with `auth`: the superuser's password from
    /// a file removed afterwards).
    fn initdb(
        &self,
        pg_dir: &Path,
        data: &Path,
        run_as: Option<(u32, u32)>,
    ) -> Result<(), DevStackError> {
        let initdb = Path::new(PG_BIN).join("initdb");
        let mut cmd = std::process::Command::new("setpriv");
        if let Some((uid, gid)) = run_as {
            cmd.args([
                "--reuid",
                &uid.to_string(),
                "--regid",
                &gid.to_string(),
                "--init-groups",
            ]);
        }
        cmd.arg("--")
            .arg(&initdb)
            .arg("-D")
            .arg(data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .env("LC_ALL", "C");
        if let Some(auth) = &self.auth {
            let pwfile = pg_dir.join("pwfile");
            write_private(&pwfile, auth.postgres_password.expose().as_bytes())?;
            chown_to(&pwfile, run_as)?;
            cmd.arg(format!("--pwfile={}", pwfile.display()));
        }
        let out = cmd
            .output()
            .map_err(|e| DevStackError::io("run initdb", e))?;
        if !out.status.success() {
            return Err(DevStackError::CommandFailed {
                command: format!("initdb -D {}", data.display()),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(())
    }

    fn start_postgres(&mut self, opts: &DevStackOptions) -> Result<(), DevStackError> {
        let pg_dir = self.dir().join("pg");
        let data = pg_dir.join("data");
        std::fs::create_dir_all(&pg_dir).map_err(|e| DevStackError::io("create pg dir", e))?;
        let run_as = postgres_user()?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&pg_dir, Some(uid), Some(gid))
                .map_err(|e| DevStackError::io("chown pg dir to postgres", e))?;
        }
        self.initdb(&pg_dir, &data, run_as)?;
        let _ = std::fs::remove_file(pg_dir.join("pwfile"));
        let secured = self.secure_postgres(&pg_dir, &data, run_as)?;
        let port = free_ports(1)?[0];
        let fsync = if opts.postgres_fsync { "on" } else { "off" };
        let spec = Spec {
            name: "postgres".into(),
            program: Path::new(PG_BIN).join("postgres"),
            args: vec![
                "-D".into(),
                data.display().to_string(),
                "-p".into(),
                port.to_string(),
                "-k".into(),
                pg_dir.display().to_string(),
                "-c".into(),
                "listen_addresses=127.0.0.1".into(),
                "-c".into(),
                "max_connections=400".into(),
                "-c".into(),
                format!("fsync={fsync}"),
                "-c".into(),
                "shared_buffers=128MB".into(),
            ]
            .into_iter()
            .chain(secured)
            .collect(),
            run_as,
            log: pg_dir.join("postgres.log"),
        };
        // The log lives in a dir owned by postgres; create it for the server.
        std::fs::write(&spec.log, b"").map_err(|e| DevStackError::io("create pg log", e))?;
        self.postgres = Some(ServerProcess::start(spec)?);
        self.postgres_port = port;
        Ok(())
    }

    /// With `tls` or `auth`: writes `pg_hba.conf` (`hostssl` + client
    /// certificate, SCRAM) and copies the server's certificate where the server
    /// user can read it; returns the server's extra `-c` arguments.
    fn secure_postgres(
        &self,
        pg_dir: &Path,
        data: &Path,
        run_as: Option<(u32, u32)>,
    ) -> Result<Vec<String>, DevStackError> {
        if self.tls.is_none() && self.auth.is_none() {
            return Ok(Vec::new());
        }
        let hba = data.join("pg_hba.conf");
        std::fs::write(
            &hba,
            secure::pg_hba(self.tls.is_some(), self.auth.is_some()),
        )
        .map_err(|e| DevStackError::io("write pg_hba.conf", e))?;
        chown_to(&hba, run_as)?;
        let mut args = vec!["-c".to_string(), "password_encryption=scram-sha-256".into()];
        let Some(tls) = &self.tls else {
            return Ok(args);
        };
        for (src, name, setting) in [
            (&tls.server_cert, "server.pem", "ssl_cert_file"),
            (&tls.server_key, "server.key", "ssl_key_file"),
            (&tls.ca_file, "ca.pem", "ssl_ca_file"),
        ] {
            let dst = pg_dir.join(name);
            std::fs::copy(src, &dst).map_err(|e| DevStackError::io("copy pg tls file", e))?;
            chown_to(&dst, run_as)?;
            set_mode(&dst, 0o600)?;
            args.extend(["-c".to_string(), format!("{setting}={}", dst.display())]);
        }
        args.extend(["-c".to_string(), "ssl=on".into()]);
        Ok(args)
    }

    /// With `auth`: the least-privilege roles (`tenure_migrator`,
    /// `tenure_worker`, `tenure_admin`).
    async fn create_roles(&self) -> Result<(), DevStackError> {
        use sqlx::Connection;
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let mut conn = sqlx::PgConnection::connect(&self.database_url())
            .await
            .map_err(|e| DevStackError::io("connect to postgres", std::io::Error::other(e)))?;
        for stmt in secure::pg_roles_sql(auth, DATABASE) {
            sqlx::query(&stmt)
                .execute(&mut conn)
                .await
                .map_err(|e| DevStackError::io("create roles", std::io::Error::other(e)))?;
        }
        let _ = conn.close().await;
        Ok(())
    }

    /// Waits until PostgreSQL accepts a connection and creates the stack's
    /// database; with `starting`, fails at once if the server exits.
    async fn wait_postgres(&self, timeout: Duration, starting: bool) -> Result<(), DevStackError> {
        use sqlx::Connection;
        let admin = self.database_url_for("postgres");
        let probe = Probe {
            server: "postgres",
            log: self.dir().join("pg/postgres.log"),
            attempt_timeout: Duration::from_secs(5),
            timeout,
            must_run: self.postgres.iter().filter(|_| starting).collect(),
        };
        poll_ready(probe, || async {
            let mut conn = sqlx::PgConnection::connect(&admin)
                .await
                .map_err(|e| e.to_string())?;
            let exists: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
                    .bind(DATABASE)
                    .fetch_optional(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
            if exists.is_none() {
                sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
                    .execute(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let _ = conn.close().await;
            Ok(())
        })
        .await
    }

    /// Creates a fresh database on the stack's PostgreSQL and returns its URL.
    ///
    /// # Errors
    /// If PostgreSQL does not answer.
    pub async fn create_database(&self, name: &str) -> Result<String, DevStackError> {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&self.database_url_for("postgres"))
            .await
            .map_err(|e| DevStackError::io("connect to postgres", std::io::Error::other(e)))?;
        sqlx::query(&format!("CREATE DATABASE \"{}\"", name.replace('"', "")))
            .execute(&mut conn)
            .await
            .map_err(|e| DevStackError::io("create database", std::io::Error::other(e)))?;
        let _ = conn.close().await;
        Ok(self.database_url_for(name))
    }
}

async fn etcd_status(
    endpoint: &str,
    options: &etcd_client::ConnectOptions,
) -> Result<(u64, u64), String> {
    let attempt = async {
        let mut client = etcd_client::Client::connect([endpoint], Some(options.clone()))
            .await
            .map_err(|e| e.to_string())?;
        let status = client.status().await.map_err(|e| e.to_string())?;
        let id = status.header().map(|h| h.member_id()).unwrap_or(0);
        Ok::<_, String>((id, status.leader()))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .map_err(|_| format!("{endpoint}: status timed out"))?
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

/// `(uid, gid)` of the `postgres` user when we are root (initdb refuses root);
/// `None` when we are not root and can run PostgreSQL as ourselves.
fn postgres_user() -> Result<Option<(u32, u32)>, DevStackError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name("postgres") {
        Ok(Some(user)) => Ok(Some((user.uid.as_raw(), user.gid.as_raw()))),
        _ => Err(DevStackError::MissingBinary {
            binary: "user `postgres`".into(),
            package: "postgresql",
        }),
    }
}

fn chown_to(path: &Path, owner: Option<(u32, u32)>) -> Result<(), DevStackError> {
    match owner {
        Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| DevStackError::io(format!("chown {}", path.display()), e)),
        None => Ok(()),
    }
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
