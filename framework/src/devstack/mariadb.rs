//! MariaDB 10.11 in the dev stack (`DevStackOptions::mariadb`): a data
//! directory made by `mariadb-install-db`, one `mariadbd` on a loopback port,
//! run as the `mysql` user when we are root (mariadbd refuses root, like
//! initdb). An init file run at every start lets `root` in from 127.0.0.1
//! without a password and creates the `tenure` database. With `tls`, it also
//! speaks TLS with the stack's server certificate (and does not require it:
//! the URL's `ssl-mode` chooses). The readiness probe (a query over sqlx's
//! MySQL driver) needs tenure's `mysql` feature.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::process::{Spec, setpriv};
use super::ready::{Probe, free_ports, poll_ready};
use super::{DATABASE, DevStack, DevStackError, ServerProcess, chown_to, set_mode};

/// The MariaDB server binary.
pub(super) const MARIADB_SERVER: &str = "/usr/sbin/mariadbd";
/// The data directory initialiser.
pub(super) const MARIADB_INSTALL_DB: &str = "/usr/bin/mariadb-install-db";

/// The MariaDB server of a stack and its port.
#[derive(Debug)]
pub(super) struct MariaDbServer {
    pub(super) process: ServerProcess,
    pub(super) port: u16,
}

impl DevStack {
    pub(super) fn start_mariadb(&mut self) -> Result<(), DevStackError> {
        let dir = self.dir().join("mariadb");
        let data = dir.join("data");
        std::fs::create_dir_all(&data).map_err(|e| DevStackError::io("create mariadb dir", e))?;
        let run_as = mysql_user()?;
        chown_to(&dir, run_as)?;
        chown_to(&data, run_as)?;
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(|e| DevStackError::io("create mariadb tmp", e))?;
        chown_to(&tmp, run_as)?;
        install_db(&data, &tmp, run_as)?;
        let init = dir.join("init.sql");
        std::fs::write(&init, init_sql())
            .map_err(|e| DevStackError::io("write mariadb init file", e))?;
        chown_to(&init, run_as)?;
        let port = free_ports(1)?[0];
        let mut spec = mariadb_spec(&dir, &data, port, run_as);
        spec.args.extend(self.mariadb_tls_args(&dir, run_as)?);
        std::fs::write(&spec.log, b"").map_err(|e| DevStackError::io("create mariadb log", e))?;
        chown_to(&spec.log, run_as)?;
        self.mariadb = Some(MariaDbServer {
            process: ServerProcess::start(spec)?,
            port,
        });
        Ok(())
    }

    /// With `tls`: the server certificate, its key and the CA copied where the
    /// server's user reads them (0600), as `--ssl-*` arguments.
    fn mariadb_tls_args(
        &self,
        dir: &Path,
        run_as: Option<(u32, u32)>,
    ) -> Result<Vec<String>, DevStackError> {
        let Some(tls) = &self.tls else {
            return Ok(Vec::new());
        };
        let mut args = Vec::new();
        for (src, name, flag) in [
            (&tls.server_cert, "server.pem", "ssl-cert"),
            (&tls.server_key, "server.key", "ssl-key"),
            (&tls.ca_file, "ca.pem", "ssl-ca"),
        ] {
            let dst = dir.join(name);
            std::fs::copy(src, &dst).map_err(|e| DevStackError::io("copy mariadb tls file", e))?;
            chown_to(&dst, run_as)?;
            set_mode(&dst, 0o600)?;
            args.push(format!("--{flag}={}", dst.display()));
        }
        Ok(args)
    }

    /// Waits until MariaDB runs a query as `root` from 127.0.0.1 (the init
    /// file has run); with `starting`, fails at once if the server exits.
    pub(super) async fn wait_mariadb(
        &self,
        timeout: Duration,
        starting: bool,
    ) -> Result<(), DevStackError> {
        let Some(server) = &self.mariadb else {
            return Ok(());
        };
        let probe = Probe {
            server: "mariadb",
            log: server.process.log_path().to_path_buf(),
            attempt_timeout: Duration::from_secs(5),
            timeout,
            must_run: if starting {
                vec![&server.process]
            } else {
                Vec::new()
            },
        };
        let url = self.mysql_url();
        poll_ready(probe, || query_one(url.clone())).await
    }

    /// The URL of the stack's `tenure` database on MariaDB
    /// (`mysql://root@127.0.0.1:PORT/tenure`).
    ///
    /// # Panics
    /// If MariaDB was not started (a test bug).
    pub fn mysql_url(&self) -> String {
        self.mysql_url_for(DATABASE)
    }

    /// The URL of database `db` on the stack's MariaDB, as `root`.
    ///
    /// # Panics
    /// If MariaDB was not started (a test bug).
    pub fn mysql_url_for(&self, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.mariadb().port)
    }

    /// The MariaDB server, for fault injection (`kill`, `restart`, `pause`,
    /// `resume`).
    ///
    /// # Panics
    /// If MariaDB was not started (a test bug).
    pub fn mariadb_server(&self) -> &ServerProcess {
        &self.mariadb().process
    }

    /// Creates a fresh database on the stack's MariaDB and returns its URL.
    ///
    /// # Errors
    /// If MariaDB does not answer.
    #[cfg(feature = "mysql")]
    pub async fn create_mysql_database(&self, name: &str) -> Result<String, DevStackError> {
        use sqlx::Connection;
        let io = |what: &'static str| move |e| DevStackError::io(what, std::io::Error::other(e));
        let mut conn = sqlx::MySqlConnection::connect(&self.mysql_url())
            .await
            .map_err(io("connect to mariadb"))?;
        let name = name.replace('`', "");
        sqlx::raw_sql(&format!("CREATE DATABASE `{name}`"))
            .execute(&mut conn)
            .await
            .map_err(io("create mariadb database"))?;
        let _ = conn.close().await;
        Ok(self.mysql_url_for(&name))
    }

    #[allow(clippy::panic)]
    fn mariadb(&self) -> &MariaDbServer {
        self.mariadb
            .as_ref()
            .unwrap_or_else(|| panic!("MariaDB was not started in this dev stack"))
    }
}

/// `root` from 127.0.0.1 without a password, and the stack's database; run at
/// every start, so it is idempotent.
fn init_sql() -> String {
    format!(
        "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';\n\
         GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n\
         CREATE DATABASE IF NOT EXISTS {DATABASE};\n"
    )
}

fn mariadb_spec(dir: &Path, data: &Path, port: u16, run_as: Option<(u32, u32)>) -> Spec {
    let path = |name: &str| dir.join(name).display().to_string();
    let mut args = vec![
        "--no-defaults".to_string(),
        format!("--datadir={}", data.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--port={port}"),
        format!("--socket={}", path("mariadbd.sock")),
        format!("--pid-file={}", path("mariadbd.pid")),
        format!("--init-file={}", path("init.sql")),
        format!("--tmpdir={}", path("tmp")),
        "--skip-name-resolve".into(),
        "--skip-log-bin".into(),
        "--innodb-buffer-pool-size=64M".into(),
        // Like PostgreSQL's fsync=off in the stack: process crashes only.
        "--innodb-flush-log-at-trx-commit=2".into(),
        "--max-connections=400".into(),
    ];
    if run_as.is_none() && nix::unistd::geteuid().is_root() {
        args.push("--user=root".into());
    }
    Spec {
        name: "mariadb".into(),
        program: PathBuf::from(MARIADB_SERVER),
        args,
        run_as,
        log: dir.join("mariadb.log"),
    }
}

/// `mariadb-install-db` into `data`, as the server's user.
/// Its own `tmpdir`: two stacks bootstrapping at once in `/tmp` collide on
/// the bootstrap's temporary tables (seen as "Unknown table
/// 'mysql.tmp_proxies_priv'").
fn install_db(data: &Path, tmp: &Path, run_as: Option<(u32, u32)>) -> Result<(), DevStackError> {
    let mut cmd = setpriv(run_as);
    cmd.arg("--")
        .arg(MARIADB_INSTALL_DB)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", tmp.display()))
        .args([
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
        ]);
    let out = cmd
        .output()
        .map_err(|e| DevStackError::io("run mariadb-install-db", e))?;
    if !out.status.success() {
        return Err(DevStackError::CommandFailed {
            command: format!("mariadb-install-db --datadir={}", data.display()),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}

/// `(uid, gid)` of the `mysql` user when we are root (mariadbd refuses to run
/// as root without `--user=root`); `None` when we are not root. Without a
/// `mysql` user, root runs it with `--user=root`.
fn mysql_user() -> Result<Option<(u32, u32)>, DevStackError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name("mysql") {
        Ok(Some(user)) => Ok(Some((user.uid.as_raw(), user.gid.as_raw()))),
        Ok(None) => Ok(None),
        Err(e) => Err(DevStackError::io(
            "look up the mysql user",
            std::io::Error::from_raw_os_error(e as i32),
        )),
    }
}

#[cfg(feature = "mysql")]
async fn query_one(url: String) -> Result<(), String> {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query("SELECT 1")
        .execute(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let _ = conn.close().await;
    Ok(())
}

#[cfg(not(feature = "mysql"))]
async fn query_one(_url: String) -> Result<(), String> {
    Err("the dev stack's MariaDB needs tenure's `mysql` feature (sqlx's MySQL driver)".into())
}
