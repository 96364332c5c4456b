//! The dev stack's PostgreSQL: `initdb`, its start and TLS, roles, readiness
//! and URLs.

use std::path::Path;
use std::time::Duration;

use super::process::{Spec, setpriv};
use super::ready::{Probe, free_ports, poll_ready};
use super::{
    DATABASE, DevStack, DevStackError, DevStackOptions, PG_BIN, ServerProcess, secure, set_mode,
    write_private,
};

impl DevStack {
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
        let port = self.postgres_client_port();
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

    /// `initdb` as the server's user (with `auth`: the superuser's password from
    /// a file removed afterwards).
    pub(super) fn initdb(
        &self,
        pg_dir: &Path,
        data: &Path,
        run_as: Option<(u32, u32)>,
    ) -> Result<(), DevStackError> {
        let initdb = Path::new(PG_BIN).join("initdb");
        let mut cmd = setpriv(run_as);
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

    pub(super) fn start_postgres(&mut self, opts: &DevStackOptions) -> Result<(), DevStackError> {
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
        let spec = Spec {
            name: "postgres".into(),
            program: Path::new(PG_BIN).join("postgres"),
            args: pg_args(opts, &data, port, &pg_dir)
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
    pub(super) fn secure_postgres(
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
    pub(super) async fn create_roles(&self) -> Result<(), DevStackError> {
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
    pub(super) async fn wait_postgres(
        &self,
        timeout: Duration,
        starting: bool,
    ) -> Result<(), DevStackError> {
        use sqlx::Connection;
        let admin = self.database_url_for("postgres");
        let probe = Probe {
            server: "postgres",
            log: self.postgres().log_path().to_path_buf(),
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

/// The server's arguments: data directory `data`, port `port`, sockets in
/// `socket_dir`, loopback only; with a standby
/// ([`DevStackOptions::postgres_standby`]) its replication settings.
pub(super) fn pg_args(
    opts: &DevStackOptions,
    data: &Path,
    port: u16,
    socket_dir: &Path,
) -> Vec<String> {
    let fsync = if opts.postgres_fsync { "on" } else { "off" };
    let mut args: Vec<String> = vec![
        "-D".into(),
        data.display().to_string(),
        "-p".into(),
        port.to_string(),
        "-k".into(),
        socket_dir.display().to_string(),
        "-c".into(),
        "listen_addresses=127.0.0.1".into(),
        "-c".into(),
        "max_connections=400".into(),
        "-c".into(),
        format!("fsync={fsync}"),
        "-c".into(),
        "shared_buffers=128MB".into(),
    ];
    if let Some(replication) = opts.postgres_standby {
        args.extend(replication.server_args());
    }
    args
}

/// `(uid, gid)` of the `postgres` user when we are root (initdb refuses root);
/// `None` when we are not root and can run PostgreSQL as ourselves.
pub(super) fn postgres_user() -> Result<Option<(u32, u32)>, DevStackError> {
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

pub(super) fn chown_to(path: &Path, owner: Option<(u32, u32)>) -> Result<(), DevStackError> {
    match owner {
        Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| DevStackError::io(format!("chown {}", path.display()), e)),
        None => Ok(()),
    }
}
