//! `tenure`: the operator's view of a Tenure deployment.
//!
//! ```text
//! tenure jobs [--status pending|running|done|dead] [--limit N]   list job rows
//! tenure job <ID>                                                 one job's history
//! tenure dlq [--limit N]                                          list the DLQ
//! tenure redrive <ID>                                             put a dead job back to work
//! tenure redrive --reason <CODE>                                  ... every dead letter with that reason
//! ```
//!
//! Servers come from `--etcd/--nats/--database-url/--namespace/--schema` or the
//! `TENURE_*` variables of [`tenure::Config::from_env`], TLS and credentials from
//! `--etcd-ca-file`, `--etcd-user`, `--nats-token`, ... or the same variables
//! (`TENURE_ETCD_CA_FILE`, `TENURE_NATS_TOKEN`, ...; see `tenure --help`). Every server call is
//! bounded by `--timeout` (seconds, default 5); an unreachable server is reported
//! by name and address, with exit code 1. Bad arguments exit with code 2.
//! Output is a table; `--json` prints JSON for scripts.
//!
//! `jobs`, `job` and `dlq` only read: they bind to the namespace's existing
//! streams ([`tenure::queue::Queue::connect`]) and never create or reconfigure
//! them, so the CLI's default settings cannot overwrite the workers' (replicas,
//! AckWait, MaxDeliver). A namespace no worker has started in is an error.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use tenure::fence::{FenceStore, JobRow, JobStatus};
use tenure::queue::{DeadLetter, Queue};
use tenure::security::{NatsAuth, Secret, TlsFiles};
use tenure::{Client, ClientError, Config, JobId};

/// Operator tool for Tenure: jobs, their fencing history, the dead-letter queue.
#[derive(Debug, Parser)]
#[command(name = "tenure", version, about)]
struct Cli {
    /// etcd endpoints, comma-separated. No current command contacts etcd; the flag
    /// is accepted so that one set of `TENURE_*` variables serves workers and the CLI.
    #[arg(
        long = "etcd",
        env = "TENURE_ETCD_ENDPOINTS",
        global = true,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    etcd: Vec<String>,
    /// NATS server URL.
    #[arg(
        long = "nats",
        env = "TENURE_NATS_URL",
        global = true,
        default_value = "nats://127.0.0.1:4222"
    )]
    nats: String,
    /// PostgreSQL URL.
    #[arg(
        long = "database-url",
        env = "TENURE_DATABASE_URL",
        global = true,
        default_value = "postgres://postgres@127.0.0.1:5432/tenure"
    )]
    database_url: String,
    /// Namespace (etcd prefix and stream names).
    #[arg(
        long,
        env = "TENURE_NAMESPACE",
        global = true,
        default_value = "tenure"
    )]
    namespace: String,
    /// PostgreSQL schema of the job rows.
    #[arg(long, env = "TENURE_SCHEMA", global = true, default_value = "tenure")]
    schema: String,
    /// Bound on connecting and on each server call, in seconds.
    #[arg(long, global = true, default_value_t = 5.0, value_parser = parse_secs)]
    timeout: f64,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    security: Security,
    #[command(subcommand)]
    command: Command,
}

/// TLS and credentials, the same settings (and variables) as
/// [`tenure::Config::from_env`]. PostgreSQL TLS is in the URL (`sslmode`,
/// `sslrootcert`, `sslcert`, `sslkey`). Secret values are never printed.
#[derive(Debug, clap::Args)]
struct Security {
    /// CA bundle (PEM) for etcd's certificate; setting any etcd TLS file turns TLS on.
    #[arg(long, env = "TENURE_ETCD_CA_FILE", global = true)]
    etcd_ca_file: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for etcd (mutual TLS).
    #[arg(
        long,
        env = "TENURE_ETCD_CERT_FILE",
        global = true,
        requires = "etcd_key_file"
    )]
    etcd_cert_file: Option<std::path::PathBuf>,
    /// Key of the etcd client certificate (PEM).
    #[arg(long, env = "TENURE_ETCD_KEY_FILE", global = true)]
    etcd_key_file: Option<std::path::PathBuf>,
    /// etcd user.
    #[arg(
        long,
        env = "TENURE_ETCD_USER",
        global = true,
        requires = "etcd_password"
    )]
    etcd_user: Option<String>,
    /// etcd password.
    #[arg(long, env = "TENURE_ETCD_PASSWORD", global = true, hide_env_values = true, value_parser = secret)]
    etcd_password: Option<Secret>,
    /// CA bundle (PEM) for NATS's certificate; setting any NATS TLS file requires TLS.
    #[arg(long, env = "TENURE_NATS_CA_FILE", global = true)]
    nats_ca_file: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for NATS (mutual TLS).
    #[arg(
        long,
        env = "TENURE_NATS_CERT_FILE",
        global = true,
        requires = "nats_key_file"
    )]
    nats_cert_file: Option<std::path::PathBuf>,
    /// Key of the NATS client certificate (PEM).
    #[arg(long, env = "TENURE_NATS_KEY_FILE", global = true)]
    nats_key_file: Option<std::path::PathBuf>,
    /// NATS user (with --nats-password).
    #[arg(long, env = "TENURE_NATS_USER", global = true)]
    nats_user: Option<String>,
    /// NATS password.
    #[arg(long, env = "TENURE_NATS_PASSWORD", global = true, hide_env_values = true, value_parser = secret)]
    nats_password: Option<Secret>,
    /// NATS token.
    #[arg(long, env = "TENURE_NATS_TOKEN", global = true, hide_env_values = true, value_parser = secret)]
    nats_token: Option<Secret>,
    /// NATS `.creds` file.
    #[arg(long, env = "TENURE_NATS_CREDS_FILE", global = true)]
    nats_creds_file: Option<std::path::PathBuf>,
    /// NATS nkey seed.
    #[arg(long, env = "TENURE_NATS_NKEY", global = true, hide_env_values = true, value_parser = secret)]
    nats_nkey: Option<Secret>,
    /// PostgreSQL password (instead of in the URL).
    #[arg(long, env = "TENURE_DATABASE_PASSWORD", global = true, hide_env_values = true, value_parser = secret)]
    database_password: Option<Secret>,
}

fn secret(value: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::new(value))
}

fn tls_files(
    ca: Option<std::path::PathBuf>,
    cert: Option<std::path::PathBuf>,
    key: Option<std::path::PathBuf>,
) -> Option<TlsFiles> {
    let tls = TlsFiles {
        ca_file: ca,
        cert_file: cert,
        key_file: key,
    };
    (tls != TlsFiles::default()).then_some(tls)
}

impl Security {
    /// `cfg` with these settings; more than one NATS credential is an error.
    fn apply(self, mut cfg: Config) -> anyhow::Result<Config> {
        cfg.etcd_tls = tls_files(self.etcd_ca_file, self.etcd_cert_file, self.etcd_key_file);
        cfg.etcd_user = self.etcd_user;
        cfg.etcd_password = self.etcd_password;
        cfg.nats_tls = tls_files(self.nats_ca_file, self.nats_cert_file, self.nats_key_file);
        cfg.database_password = self.database_password;
        let nats = [
            self.nats_user.map(|user| NatsAuth::UserPassword {
                user,
                password: self.nats_password.unwrap_or_else(|| Secret::new("")),
            }),
            self.nats_token.map(NatsAuth::Token),
            self.nats_creds_file.map(NatsAuth::CredsFile),
            self.nats_nkey.map(NatsAuth::NKey),
        ];
        let mut given = nats.into_iter().flatten();
        cfg.nats_auth = given.next().unwrap_or_default();
        if given.next().is_some() {
            return Err(anyhow!(
                "give one NATS credential: user/password, token, creds file or nkey"
            ));
        }
        Ok(cfg)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List jobs, oldest first.
    Jobs {
        /// Only jobs with this status.
        #[arg(long, value_enum)]
        status: Option<Status>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one job: status, fence, step, takeovers, attempts, last error, times.
    Job {
        /// The job id (a UUID).
        #[arg(value_parser = parse_job_id)]
        id: JobId,
    },
    /// List the dead-letter queue, oldest first.
    Dlq {
        /// At most this many entries.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Put dead jobs back to work: reset the row, move the DLQ entries back.
    Redrive {
        /// The dead job to redrive.
        #[arg(value_parser = parse_job_id, required_unless_present = "reason", conflicts_with = "reason")]
        id: Option<JobId>,
        /// Redrive every dead letter with this reason code (e.g. `max_retries`,
        /// `permanent_error`, `max_takeovers`) or this exact reason text.
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Status {
    Pending,
    Running,
    Done,
    Dead,
}

impl From<Status> for JobStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Pending => JobStatus::Pending,
            Status::Running => JobStatus::Running,
            Status::Done => JobStatus::Done,
            Status::Dead => JobStatus::Dead,
        }
    }
}

fn parse_job_id(s: &str) -> Result<JobId, String> {
    s.parse::<JobId>().map_err(|e| {
        format!("not a job id (expected a UUID such as 67e55044-10b1-426f-9247-bb680e5fe0c8): {e}")
    })
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err("expected seconds between 0 and 3600".into()),
    }
}

/// One job row as printed.
#[derive(Debug, Serialize)]
struct JobView {
    id: String,
    job_type: String,
    status: String,
    fence: i64,
    step: u32,
    takeovers: u32,
    attempts: u32,
    released: bool,
    last_error: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<&JobRow> for JobView {
    fn from(r: &JobRow) -> Self {
        JobView {
            id: r.id.to_string(),
            job_type: r.job_type.clone(),
            status: r.status.to_string(),
            fence: r.fence,
            step: r.step.get(),
            takeovers: r.takeovers,
            attempts: r.attempts,
            released: r.released,
            last_error: r.last_error.clone(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// One DLQ entry as printed.
#[derive(Debug, Serialize)]
struct DeadLetterView {
    dlq_sequence: u64,
    job_id: Option<String>,
    job_type: Option<String>,
    reason: String,
    deliveries: Option<u64>,
    attempts: Option<u32>,
    takeovers: Option<u32>,
    last_token: Option<i64>,
}

impl From<&DeadLetter> for DeadLetterView {
    fn from(d: &DeadLetter) -> Self {
        DeadLetterView {
            dlq_sequence: d.dlq_sequence,
            job_id: d.job_id.map(|j| j.to_string()),
            job_type: d.job_type.clone(),
            reason: d.reason.clone(),
            deliveries: d.deliveries,
            attempts: d.attempts,
            takeovers: d.takeovers,
            last_token: d.last_token.map(|t| t.get()),
        }
    }
}

/// What a redrive did.
#[derive(Debug, Serialize)]
struct RedriveView {
    job_id: String,
    messages: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The servers and the bound on each call.
struct Ctx {
    cfg: Config,
    timeout: Duration,
    json: bool,
}

impl Ctx {
    fn postgres(&self) -> String {
        format!("PostgreSQL at {}", redact(&self.cfg.database_url))
    }

    fn nats(&self) -> String {
        format!("NATS at {}", redact(&self.cfg.nats_url))
    }

    /// Runs `fut` against `server`, bounded by the timeout.
    async fn call<T, E: std::error::Error>(
        &self,
        server: &str,
        what: &str,
        fut: impl Future<Output = Result<T, E>>,
    ) -> anyhow::Result<T> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(anyhow!("{what}: {server}: {}", describe(&e))),
            Err(_) => Err(anyhow!(
                "{what}: {server} did not answer within {:?}",
                self.timeout
            )),
        }
    }

    async fn store(&self) -> anyhow::Result<FenceStore> {
        let connected = self
            .call(
                &self.postgres(),
                "cannot connect",
                FenceStore::connect(&self.cfg),
            )
            .await;
        match connected {
            Ok(store) => Ok(store),
            // The pool retries refused connections until its deadline; say why.
            Err(e) => match self.probe_postgres().await {
                Some(why) => Err(anyhow!("{e} ({why})")),
                None => Err(e),
            },
        }
    }

    /// Why PostgreSQL's TCP port cannot be reached, if it cannot.
    async fn probe_postgres(&self) -> Option<String> {
        let opts: sqlx::postgres::PgConnectOptions = self.cfg.database_url.parse().ok()?;
        let (host, port) = (opts.get_host().to_string(), opts.get_port());
        if host.starts_with('/') {
            return None; // a Unix socket
        }
        let attempt = tokio::net::TcpStream::connect((host.as_str(), port));
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("TCP connect to {host}:{port}: {e}")),
            Err(_) => Some(format!("TCP connect to {host}:{port}: no answer")),
        }
    }

    async fn queue(&self) -> anyhow::Result<Queue> {
        self.call(&self.nats(), "cannot connect", Queue::connect(&self.cfg))
            .await
    }

    async fn client(&self) -> anyhow::Result<Client> {
        // Each server on its own first, so an error names the one that failed.
        self.store().await?;
        self.queue().await?;
        self.call(
            "PostgreSQL and NATS",
            "cannot connect",
            Client::connect(&self.cfg),
        )
        .await
    }

    fn print<T: Serialize>(&self, value: &T, table: impl FnOnce() -> String) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value)?);
        } else {
            print!("{}", table());
        }
        Ok(())
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let timeout = Duration::from_secs_f64(cli.timeout);
    let cfg = Config::new(cli.namespace)
        .with_schema(cli.schema)
        .with_etcd_endpoints(cli.etcd)
        .with_nats_url(cli.nats)
        .with_database_url(cli.database_url)
        .with_worker_id("tenure-cli")
        .with_nats_request_timeout(timeout);
    let mut cfg = cli.security.apply(cfg)?;
    cfg.etcd_request_timeout = timeout;
    // The CLI holds one connection at a time.
    cfg.max_in_flight = 1;
    cfg.validate().context("invalid settings")?;
    let ctx = Ctx {
        cfg,
        timeout,
        json: cli.json,
    };
    match cli.command {
        Command::Jobs { status, limit } => {
            let store = ctx.store().await?;
            let rows = ctx
                .call(
                    &ctx.postgres(),
                    "listing jobs",
                    store.list_jobs(status.map(Into::into), i64::from(limit)),
                )
                .await?;
            let views: Vec<JobView> = rows.iter().map(JobView::from).collect();
            ctx.print(&views, || jobs_table(&views))
        }
        Command::Job { id } => {
            let store = ctx.store().await?;
            let row = ctx
                .call(&ctx.postgres(), "reading the job", store.job(id))
                .await?
                .ok_or_else(|| anyhow!("no job {id} in schema {:?}", ctx.cfg.schema))?;
            let view = JobView::from(&row);
            ctx.print(&view, || job_detail(&view))
        }
        Command::Dlq { limit } => {
            let queue = ctx.queue().await?;
            let entries = ctx
                .call(
                    &ctx.nats(),
                    "reading the DLQ",
                    queue.dead_letters(limit as usize),
                )
                .await?;
            let views: Vec<DeadLetterView> = entries.iter().map(DeadLetterView::from).collect();
            ctx.print(&views, || dlq_table(&views))
        }
        Command::Redrive { id, reason } => {
            let client = ctx.client().await?;
            let ids = match (id, reason) {
                (Some(id), _) => vec![id],
                (None, Some(reason)) => jobs_with_reason(&ctx, client.queue(), &reason).await?,
                (None, None) => return Err(anyhow!("give a job id or --reason")),
            };
            let mut done = Vec::new();
            for id in ids {
                let moved = tokio::time::timeout(ctx.timeout, client.redrive(id)).await;
                match moved {
                    Ok(Ok(messages)) => done.push(RedriveView {
                        job_id: id.to_string(),
                        messages,
                    }),
                    Ok(Err(e @ ClientError::NotDead { .. })) => eprintln!("skipped: {e}"),
                    Ok(Err(e)) => return Err(anyhow!("redriving {id}: {}", describe(&e))),
                    Err(_) => {
                        return Err(anyhow!(
                            "redriving {id}: no answer within {:?}",
                            ctx.timeout
                        ));
                    }
                }
            }
            ctx.print(&done, || {
                let mut s = String::new();
                for r in &done {
                    s.push_str(&format!(
                        "redriven {} ({} message{})\n",
                        r.job_id,
                        r.messages,
                        if r.messages == 1 { "" } else { "s" }
                    ));
                }
                if done.is_empty() {
                    s.push_str("nothing redriven\n");
                }
                s
            })
        }
    }
}

/// The distinct job ids of DLQ entries whose reason is `reason` or starts with
/// `reason:` (the runtime writes `<code>: <text>`).
async fn jobs_with_reason(ctx: &Ctx, queue: &Queue, reason: &str) -> anyhow::Result<Vec<JobId>> {
    const PAGE: usize = 500;
    let mut ids = Vec::new();
    let mut after = 0;
    loop {
        let page = ctx
            .call(
                &ctx.nats(),
                "reading the DLQ",
                queue.dead_letters_after(after, PAGE),
            )
            .await?;
        for d in &page {
            let matches = d.reason == reason
                || d.reason
                    .strip_prefix(reason)
                    .is_some_and(|rest| rest.starts_with(':'));
            if let (true, Some(id)) = (matches, d.job_id) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        match page.last() {
            Some(last) if page.len() == PAGE => after = last.dlq_sequence,
            _ => return Ok(ids),
        }
    }
}

/// The error and its sources, each once.
fn describe(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// `postgres://user:secret@host/db` -> `postgres://user:***@host/db`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string()
}

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        flat
    } else {
        flat.chars().take(max.saturating_sub(1)).collect::<String>() + "…"
    }
}

fn jobs_table(views: &[JobView]) -> String {
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            vec![
                v.id.clone(),
                v.job_type.clone(),
                v.status.clone(),
                v.step.to_string(),
                v.fence.to_string(),
                v.takeovers.to_string(),
                v.attempts.to_string(),
                time(&v.updated_at),
                v.last_error
                    .as_deref()
                    .map(|e| one_line(e, 60))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "ID",
            "TYPE",
            "STATUS",
            "STEP",
            "FENCE",
            "TAKEOVERS",
            "ATTEMPTS",
            "UPDATED",
            "LAST ERROR",
        ],
        &rows,
    );
    out.push_str(&format!("({} job{})\n", views.len(), plural(views.len())));
    out
}

fn job_detail(v: &JobView) -> String {
    let fields = [
        ("id", v.id.clone()),
        ("type", v.job_type.clone()),
        ("status", v.status.clone()),
        ("fence", v.fence.to_string()),
        ("step", v.step.to_string()),
        ("takeovers", v.takeovers.to_string()),
        ("attempts", v.attempts.to_string()),
        ("released", v.released.to_string()),
        (
            "last error",
            v.last_error.clone().unwrap_or_else(|| "-".into()),
        ),
        ("created", time(&v.created_at)),
        ("updated", time(&v.updated_at)),
    ];
    let mut s = String::new();
    for (k, val) in fields {
        s.push_str(&format!("{k:<10}  {val}\n"));
    }
    s
}

fn dlq_table(views: &[DeadLetterView]) -> String {
    let opt = |o: Option<String>| o.unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            vec![
                v.dlq_sequence.to_string(),
                opt(v.job_id.clone()),
                opt(v.job_type.clone()),
                opt(v.deliveries.map(|d| d.to_string())),
                opt(v.attempts.map(|d| d.to_string())),
                opt(v.takeovers.map(|d| d.to_string())),
                one_line(&v.reason, 80),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "SEQ",
            "JOB ID",
            "TYPE",
            "DELIVERIES",
            "ATTEMPTS",
            "TAKEOVERS",
            "REASON",
        ],
        &rows,
    );
    out.push_str(&format!(
        "({} dead letter{})\n",
        views.len(),
        plural(views.len())
    ));
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("nats://h:4222"), "nats://h:4222");
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "w".into()]],
        );
        assert_eq!(t, "A    BB\nxxx  y\nz    w\n");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
