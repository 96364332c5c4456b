//! The dev stack's PostgreSQL with a streaming standby and failovers
//! ([`DevStackOptions::postgres_standby`]).
//!
//! A primary and a standby made from it by `pg_basebackup -R`, both our own
//! processes on loopback, and two fronts (re-pointable TCP relays): the one
//! address every client uses ([`DevStack::database_url`] names it), and the
//! standby's replication link to the primary, which a test can cut
//! ([`DevStack::cut_postgres_replication`]) to hold WAL back from the standby.
//!
//! A failover ([`DevStack::postgres_failover`]) is what an HA manager does:
//! the primary dies (SIGKILL, by its pid), the standby is promoted
//! (`pg_ctl promote`), the front is pointed at it (open connections dropped),
//! and a new standby is made from the new primary so the next failover can
//! happen.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::front::Front;
use super::postgres::{chown_to, pg_args, postgres_user};
use super::process::{Spec, setpriv};
use super::ready::{Probe, free_ports, poll_ready};
use super::{DevStack, DevStackError, DevStackOptions, PG_BIN, ServerProcess};

/// How the dev stack's PostgreSQL standby replicates
/// ([`DevStackOptions::postgres_standby`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Replication {
    /// `synchronous_standby_names = '*'` with `synchronous_commit = on`: a
    /// commit returns only once the standby has flushed its WAL, so a
    /// promoted standby holds every commit a client saw succeed. With no
    /// standby connected, commits wait.
    Synchronous,
    /// `synchronous_standby_names` empty: a commit returns once the primary
    /// has it; the standby may lag, and a failover loses what it had not
    /// received.
    Asynchronous,
}

impl Replication {
    /// The servers' `-c` settings (the standby's too: once promoted it is
    /// the primary), with commit timestamps on (`pg_xact_commit_timestamp`)
    /// and `wal_retrieve_retry_interval` at 1 s: a standby waiting that long
    /// between tries to reach its dead primary may only see a promotion at
    /// the end of the wait (5 s by default: one promotion in four took 5 s).
    pub(super) fn server_args(self) -> Vec<String> {
        let names = match self {
            Replication::Synchronous => "*",
            Replication::Asynchronous => "",
        };
        vec![
            "-c".into(),
            format!("synchronous_standby_names={names}"),
            "-c".into(),
            "synchronous_commit=on".into(),
            // What a failover costs is read from the commits' own times.
            "-c".into(),
            "track_commit_timestamp=on".into(),
            "-c".into(),
            "wal_retrieve_retry_interval=1s".into(),
        ]
    }
}

/// What one [`DevStack::postgres_failover`] took, from the kill of the
/// primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgFailover {
    /// `pg_ctl promote -w` alone.
    pub promote: Duration,
    /// Until the promoted standby answered behind the front.
    pub promoted_after: Duration,
    /// Until a new standby streamed from the new primary (with
    /// [`Replication::Synchronous`], commits wait until then).
    pub standby_after: Duration,
}

/// The standby side of a replicated stack.
#[derive(Debug)]
pub(super) struct PgPair {
    replication: Replication,
    opts: DevStackOptions,
    /// The address clients use.
    pub(super) front: Front,
    /// The standby's replication connection to the primary.
    wal_link: Front,
    standby: Option<ServerProcess>,
    standby_port: u16,
    standby_data: PathBuf,
    /// Standbys made so far (each in `<dir>/pg-standby-<n>`).
    built: u32,
}

impl PgPair {
    /// The fronts, pointing at the primary on `primary_port`; no standby yet.
    pub(super) fn new(
        replication: Replication,
        primary_port: u16,
        opts: &DevStackOptions,
    ) -> Result<Self, DevStackError> {
        if opts.tls || opts.auth {
            return Err(DevStackError::Unsupported(
                "a PostgreSQL standby with tls or auth".into(),
            ));
        }
        Ok(PgPair {
            replication,
            opts: opts.clone(),
            front: Front::start("pg-front", primary_port)?,
            wal_link: Front::start("pg-wal-link", primary_port)?,
            standby: None,
            standby_port: 0,
            standby_data: PathBuf::new(),
            built: 0,
        })
    }
}

impl PgPair {
    /// The standby's log (empty between a promotion and the next standby).
    fn standby_log(&self) -> PathBuf {
        self.standby
            .as_ref()
            .map(|s| s.log_path().to_path_buf())
            .unwrap_or_default()
    }
}

impl DevStack {
    /// The port clients use: the front's with a standby, else the server's.
    pub(super) fn postgres_client_port(&self) -> u16 {
        self.pg_pair
            .as_ref()
            .map_or(self.postgres_port, |p| p.front.port())
    }

    /// How the standby replicates; `None` without one.
    pub fn postgres_replication(&self) -> Option<Replication> {
        self.pg_pair.as_ref().map(|p| p.replication)
    }

    /// The standby, when one runs (not between a promotion and the next
    /// [`rebuild_postgres_standby`](Self::rebuild_postgres_standby)).
    pub fn postgres_standby(&self) -> Option<&ServerProcess> {
        self.pg_pair.as_ref().and_then(|p| p.standby.as_ref())
    }

    /// The primary's own port (not the front's): for a test that must reach
    /// this very server.
    pub fn postgres_primary_port(&self) -> u16 {
        self.postgres_port
    }

    fn pair(&self) -> Result<&PgPair, DevStackError> {
        self.pg_pair
            .as_ref()
            .ok_or_else(|| DevStackError::NotRunning("postgres standby".into()))
    }

    fn pair_mut(&mut self) -> Result<&mut PgPair, DevStackError> {
        self.pg_pair
            .as_mut()
            .ok_or_else(|| DevStackError::NotRunning("postgres standby".into()))
    }

    /// Cuts the standby's replication link and waits until the primary
    /// has no standby connected: from then on its commits stay on the
    /// primary alone (with [`Replication::Synchronous`] they wait).
    ///
    /// # Errors
    /// [`DevStackError::NotRunning`] without a standby; not cut within
    /// `timeout`.
    pub async fn cut_postgres_replication(&self, timeout: Duration) -> Result<(), DevStackError> {
        self.pair()?.wal_link.cut();
        let url = direct_url(self.postgres_port);
        let probe = Probe {
            server: "postgres",
            log: self.postgres().log_path().to_path_buf(),
            attempt_timeout: Duration::from_secs(5),
            timeout,
            must_run: Vec::new(),
        };
        poll_ready(probe, || async {
            let n: i64 = scalar(&url, "SELECT count(*) FROM pg_stat_replication").await?;
            if n == 0 {
                Ok(())
            } else {
                Err(format!("{n} standby connections left"))
            }
        })
        .await
    }

    /// Lets the standby reconnect after a
    /// [`cut_postgres_replication`](Self::cut_postgres_replication).
    ///
    /// # Errors
    /// [`DevStackError::NotRunning`] without a standby.
    pub fn restore_postgres_replication(&self) -> Result<(), DevStackError> {
        self.pair()?.wal_link.restore();
        Ok(())
    }

    /// With [`DevStackOptions::postgres_standby`]: waits until the new
    /// primary accepts connections, then makes its first standby.
    pub(super) async fn start_postgres_standby(
        &mut self,
        timeout: Duration,
    ) -> Result<(), DevStackError> {
        if self.pg_pair.is_none() {
            return Ok(());
        }
        let url = direct_url(self.postgres_port);
        let probe = Probe {
            server: "postgres",
            log: self.postgres().log_path().to_path_buf(),
            attempt_timeout: Duration::from_secs(5),
            timeout,
            must_run: self.postgres.iter().collect(),
        };
        poll_ready(probe, || async {
            scalar::<bool>(&url, "SELECT true").await.map(|_| ())
        })
        .await?;
        self.rebuild_postgres_standby(timeout).await
    }

    /// Kills the primary (SIGKILL, by its pid), promotes the standby, points
    /// the front at it and makes a new standby from it. Returns what each
    /// part took.
    ///
    /// # Errors
    /// No standby, a failed promotion, or a new standby that does not stream
    /// within `timeout`.
    pub async fn postgres_failover(
        &mut self,
        timeout: Duration,
    ) -> Result<PgFailover, DevStackError> {
        let killed = Instant::now();
        self.postgres().kill()?;
        let promoting = Instant::now();
        self.promote_postgres_standby()?;
        let promote = promoting.elapsed();
        self.wait_postgres(timeout, false).await?;
        let promoted_after = killed.elapsed();
        self.rebuild_postgres_standby(timeout).await?;
        Ok(PgFailover {
            promote,
            promoted_after,
            standby_after: killed.elapsed(),
        })
    }

    /// Promotes the standby (`pg_ctl promote -w`): it becomes the primary,
    /// the front and the replication link point at it (open connections
    /// drop), and the old primary is killed if it still ran. Until
    /// [`rebuild_postgres_standby`](Self::rebuild_postgres_standby) there is
    /// no standby.
    ///
    /// # Errors
    /// No standby, or `pg_ctl promote` failed.
    pub fn promote_postgres_standby(&mut self) -> Result<(), DevStackError> {
        let run_as = postgres_user()?;
        let pair = self.pair_mut()?;
        let standby = pair
            .standby
            .take()
            .ok_or_else(|| DevStackError::NotRunning("postgres standby".into()))?;
        let data = pair.standby_data.clone();
        let port = pair.standby_port;
        let promoted = run_pg(
            run_as,
            "pg_ctl",
            &[
                "promote",
                "-w",
                "-t",
                "60",
                "-D",
                &data.display().to_string(),
            ],
        );
        if let Err(e) = promoted {
            self.pair_mut()?.standby = Some(standby);
            return Err(e);
        }
        pair.wal_link.point_to(port);
        pair.front.point_to(port);
        if let Some(old) = self.postgres.replace(standby) {
            old.kill()?;
        }
        self.postgres_port = port;
        Ok(())
    }

    /// Makes a new standby from the primary (`pg_basebackup -R` through the
    /// replication link, in `<dir>/pg-standby-<n>`), replacing any standby
    /// still running, and waits until it streams (with
    /// [`Replication::Synchronous`]: as the synchronous standby).
    ///
    /// # Errors
    /// No standby was configured, `pg_basebackup` failed, or the standby does
    /// not stream within `timeout`.
    pub async fn rebuild_postgres_standby(
        &mut self,
        timeout: Duration,
    ) -> Result<(), DevStackError> {
        let run_as = postgres_user()?;
        let base = self.dir().to_path_buf();
        let pair = self.pair_mut()?;
        if let Some(old) = pair.standby.take() {
            old.kill()?;
        }
        pair.built += 1;
        let dir = base.join(format!("pg-standby-{}", pair.built));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).map_err(|e| DevStackError::io("create standby dir", e))?;
        chown_to(&dir, run_as)?;
        base_backup(run_as, &data, pair.wal_link.port(), pair.built)?;
        let port = free_ports(1)?[0];
        let spec = Spec {
            name: format!("postgres-standby-{}", pair.built),
            program: Path::new(PG_BIN).join("postgres"),
            args: pg_args(&pair.opts, &data, port, &dir),
            run_as,
            log: dir.join("postgres.log"),
        };
        std::fs::write(&spec.log, b"").map_err(|e| DevStackError::io("create pg log", e))?;
        pair.standby = Some(ServerProcess::start(spec)?);
        pair.standby_port = port;
        pair.standby_data = data;
        self.wait_standby_streaming(timeout).await
    }

    /// Waits until the primary reports a standby streaming (as `sync` with
    /// [`Replication::Synchronous`]).
    async fn wait_standby_streaming(&self, timeout: Duration) -> Result<(), DevStackError> {
        let pair = self.pair()?;
        let sync = pair.replication == Replication::Synchronous;
        let sql = format!(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE state = 'streaming' AND (sync_state = 'sync' OR NOT {sync})"
        );
        let url = direct_url(self.postgres_port);
        let probe = Probe {
            server: "postgres standby",
            log: pair.standby_log(),
            attempt_timeout: Duration::from_secs(5),
            timeout,
            must_run: pair.standby.iter().collect(),
        };
        poll_ready(probe, || async {
            let n: i64 = scalar(&url, &sql).await?;
            if n > 0 {
                Ok(())
            } else {
                Err("no standby streams yet".into())
            }
        })
        .await
    }

    /// Waits until the standby has replayed everything the primary had
    /// written when called (a test's "replication has caught up").
    ///
    /// # Errors
    /// No standby, or it does not catch up within `timeout`.
    pub async fn wait_postgres_standby_caught_up(
        &self,
        timeout: Duration,
    ) -> Result<(), DevStackError> {
        let pair = self.pair()?;
        let primary = direct_url(self.postgres_port);
        let standby = direct_url(pair.standby_port);
        let target: String = scalar(&primary, "SELECT pg_current_wal_lsn()::text")
            .await
            .map_err(|e| DevStackError::io("read the primary's WAL position", other(e)))?;
        let probe = Probe {
            server: "postgres standby",
            log: pair.standby_log(),
            attempt_timeout: Duration::from_secs(5),
            timeout,
            must_run: Vec::new(),
        };
        // The position was read from the primary itself.
        let sql = format!("SELECT coalesce(pg_last_wal_replay_lsn() >= '{target}', false)");
        poll_ready(probe, || async {
            let caught_up: bool = scalar(&standby, &sql).await?;
            if caught_up {
                Ok(())
            } else {
                Err(format!("the standby has not replayed up to {target}"))
            }
        })
        .await
    }
}

/// `pg_basebackup -R` of the primary behind the replication link on
/// `port` into `data`, as the server's user.
fn base_backup(
    run_as: Option<(u32, u32)>,
    data: &Path,
    port: u16,
    n: u32,
) -> Result<(), DevStackError> {
    let conninfo =
        format!("host=127.0.0.1 port={port} user=postgres application_name=tenure_standby_{n}");
    run_pg(
        run_as,
        "pg_basebackup",
        &[
            "-d",
            &conninfo,
            "-D",
            &data.display().to_string(),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ],
    )
}

/// Runs PostgreSQL tool `tool` with `args` as the server's user.
fn run_pg(run_as: Option<(u32, u32)>, tool: &str, args: &[&str]) -> Result<(), DevStackError> {
    let out = setpriv(run_as)
        .arg("--")
        .arg(Path::new(PG_BIN).join(tool))
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| DevStackError::io(format!("run {tool}"), e))?;
    if !out.status.success() {
        return Err(DevStackError::CommandFailed {
            command: format!("{tool} {}", args.join(" ")),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}

/// A superuser URL of the server on `port` itself (a replicated stack has
/// neither TLS nor passwords).
fn direct_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable")
}

fn other(e: String) -> std::io::Error {
    std::io::Error::other(e)
}

/// One scalar of `sql` on the server at `url`.
async fn scalar<T>(url: &str, sql: &str) -> Result<T, String>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let v = sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string());
    let _ = conn.close().await;
    v
}
