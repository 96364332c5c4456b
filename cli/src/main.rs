//! `tenure`: the operator's view of a Tenure deployment.
//!
//! ```text
//! tenure jobs [--status pending|running|done|dead|cancelled] [--limit N]   list job rows
//! tenure job <ID>                                                 one job's history
//! tenure dlq [--limit N]                                          list the DLQ
//! tenure redrive <ID>                                             put a dead job back to work
//! tenure redrive --reason <CODE>                                  ... every dead letter with that reason
//! tenure cancel <ID> [--reason TEXT]                              cancel a job (its running step stops, it never runs again; a dead one leaves the DLQ)
//! tenure overview                                                 counts per status and type, last hour's rates
//! tenure workers                                                  workers seen in the job history
//! tenure serve [--bind 127.0.0.1:8023] [--operator-token-file F]  the web view (see `web`)
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
//! streams ([`tenure::blocks::queue::Queue::connect`]) and never create or reconfigure
//! them, so the CLI's default settings cannot overwrite the workers' (replicas,
//! AckWait, MaxDeliver). A namespace no worker has started in is an error.

mod ctx;
mod data;
mod web;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand, ValueEnum};
use tenure::blocks::fence::{JobStatus, WorkerSeen};
use tenure::security::{NatsAuth, Secret, TlsFiles};
use tenure::{Config, JobId};

use ctx::Ctx;
use data::{DeadLetterView, JobView, OverviewView, RedriveView};

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
    /// Send credentials to servers off loopback without verified TLS
    /// (refused otherwise; see `Config::allow_insecure_transport`).
    #[arg(long, env = "TENURE_ALLOW_INSECURE_TRANSPORT", global = true)]
    allow_insecure_transport: bool,
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
        cfg.allow_insecure_transport = self.allow_insecure_transport;
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
    /// Cancel a pending, running or dead job: its owner's running step is
    /// stopped and rolled back, the row becomes `cancelled`, no later step
    /// runs; a dead job leaves the DLQ and is never redriven. Cancelling twice
    /// changes nothing; a done or unknown job is an error.
    Cancel {
        /// The job to cancel.
        #[arg(value_parser = parse_job_id)]
        id: JobId,
        /// Why (kept on the row and in the job's history).
        #[arg(long, default_value = "cancelled by an operator")]
        reason: String,
    },
    /// Delete finished jobs (and their history) that finished longer ago than
    /// the given ages, in batches that skip rows locked by anyone; a status
    /// without an age is kept. `--dry-run` counts them and changes nothing.
    Prune {
        /// Delete `done` jobs older than this (`90s`, `30m`, `12h`, `7d`).
        #[arg(long, value_parser = parse_age)]
        done_older_than: Option<Duration>,
        /// Delete `cancelled` jobs older than this.
        #[arg(long, value_parser = parse_age)]
        cancelled_older_than: Option<Duration>,
        /// Delete `dead` jobs older than this (they are kept otherwise).
        #[arg(long, value_parser = parse_age)]
        dead_older_than: Option<Duration>,
        /// Rows deleted per statement (at most 10000, what the prune
        /// function accepts).
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        batch: u32,
        /// Count what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Jobs per status and type, the last hour's rates, takeovers, stale refusals, DLQ size.
    Overview,
    /// Workers seen in the last hour's job history or connected to PostgreSQL now.
    Workers,
    /// Cron schedules (expression, time zone, missed-ticks policy, last and
    /// next tick, ticks enqueued and skipped) and the scheduler leader.
    Schedules,
    /// Serve the operator's web view (read-only without --operator-token-file or TENURE_OPERATOR_TOKEN).
    Serve(web::ServeArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Status {
    Pending,
    Running,
    Done,
    Dead,
    Cancelled,
}

impl From<Status> for JobStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Pending => JobStatus::Pending,
            Status::Running => JobStatus::Running,
            Status::Done => JobStatus::Done,
            Status::Dead => JobStatus::Dead,
            Status::Cancelled => JobStatus::Cancelled,
        }
    }
}

fn parse_job_id(s: &str) -> Result<JobId, String> {
    s.parse::<JobId>().map_err(|e| {
        format!("not a job id (expected a UUID such as 67e55044-10b1-426f-9247-bb680e5fe0c8): {e}")
    })
}

/// An age: a positive whole number and a unit (`s`, `m`, `h`, `d`).
fn parse_age(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not an age such as 90s, 30m, 12h or 7d");
    let unit = match s.chars().last() {
        Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86_400,
        _ => return Err(bad()),
    };
    let n: u64 = s[..s.len() - 1].parse().map_err(|_| bad())?;
    if n == 0 {
        return Err("an age must be positive".into());
    }
    n.checked_mul(unit).map(Duration::from_secs).ok_or_else(bad)
}

pub(crate) fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err("expected seconds between 0 and 3600".into()),
    }
}

fn main() -> ExitCode {
    use clap::CommandFactory;
    use clap::error::ErrorKind;
    if let Some(msg) = web::token_on_argv(std::env::args_os().skip(1)) {
        Cli::command()
            .error(ErrorKind::ArgumentConflict, msg)
            .exit();
    }
    let cli = Cli::parse();
    let serve = match &cli.command {
        Command::Serve(args) => match args.prepare() {
            Ok(p) => Some(p),
            Err(msg) => Cli::command().error(ErrorKind::ValueValidation, msg).exit(),
        },
        _ => None,
    };
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
    match runtime.block_on(run(cli, serve)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // An error may quote a server's URL: never with its credentials.
            eprintln!(
                "error: {}",
                tenure::security::redact_text(&format!("{e:#}"))
            );
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, serve: Option<web::Prepared>) -> anyhow::Result<()> {
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
        Command::Serve(_) => match serve {
            Some(p) => web::serve(ctx, p).await,
            None => Err(anyhow!("serve: settings not checked")),
        },
        command => run_command(&ctx, command).await,
    }
}

async fn run_command(ctx: &Ctx, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Jobs { status, limit } => {
            let store = ctx.store().await?;
            let views = data::jobs(ctx, &store, status.map(Into::into), limit).await?;
            ctx.print(&views, || jobs_table(&views))
        }
        Command::Job { id } => {
            let store = ctx.store().await?;
            // The DLQ entries too when NATS answers; the row alone otherwise.
            let queue = match ctx.queue().await {
                Ok(q) => Some(q),
                Err(e) => {
                    eprintln!("note: DLQ entries not read: {e:#}");
                    None
                }
            };
            let detail = data::job(ctx, &store, queue.as_ref(), id)
                .await?
                .ok_or_else(|| anyhow!("no job {id} in schema {:?}", ctx.cfg.schema))?;
            ctx.print(&detail, || job_detail(&detail.job))
        }
        Command::Dlq { limit } => {
            let queue = ctx.queue().await?;
            let views = data::dlq(ctx, &queue, limit as usize).await?;
            ctx.print(&views, || dlq_table(&views))
        }
        Command::Overview => {
            let (store, queue) = (ctx.store().await?, ctx.queue().await?);
            let view = data::overview(ctx, &store, &queue).await?;
            ctx.print(&view, || overview_table(&view))
        }
        Command::Workers => {
            let store = ctx.store().await?;
            let views = data::workers(ctx, &store).await?;
            ctx.print(&views, || workers_table(&views))
        }
        Command::Schedules => {
            let store = ctx.store().await?;
            let view = data::schedules(ctx, &store).await?;
            ctx.print(&view, || schedules_table(&view))
        }
        Command::Redrive { id, reason } => {
            let client = ctx.client().await?;
            let ids = match (id, reason) {
                (Some(id), _) => vec![id],
                (None, Some(reason)) => {
                    data::jobs_with_reason(ctx, client.queue(), &reason).await?
                }
                (None, None) => return Err(anyhow!("give a job id or --reason")),
            };
            let mut skipped = Vec::new();
            let done = data::redrive(ctx, &client, ids, &mut skipped).await?;
            for s in &skipped {
                eprintln!("skipped: {s}");
            }
            ctx.print(&done, || redrive_lines(&done))
        }
        Command::Cancel { id, reason } => {
            let client = ctx.client().await?;
            let view = data::cancel(ctx, &client, id, &reason).await?;
            ctx.print(&view, || format!("{} {}\n", view.outcome, view.job_id))
        }
        Command::Prune {
            done_older_than,
            cancelled_older_than,
            dead_older_than,
            batch,
            dry_run,
        } => {
            let ages = [
                (JobStatus::Done, done_older_than),
                (JobStatus::Cancelled, cancelled_older_than),
                (JobStatus::Dead, dead_older_than),
            ];
            let ages: Vec<(JobStatus, Duration)> = ages
                .into_iter()
                .filter_map(|(s, age)| age.map(|a| (s, a)))
                .collect();
            if ages.is_empty() {
                return Err(anyhow!(
                    "give at least one of --done-older-than, --cancelled-older-than, --dead-older-than"
                ));
            }
            let store = ctx.store().await?;
            let view = data::prune(ctx, &store, &ages, batch as usize, dry_run).await?;
            ctx.print(&view, || prune_lines(&view))
        }
        Command::Serve(_) => Err(anyhow!("serve is not a one-shot command")),
    }
}

fn prune_lines(v: &data::PruneView) -> String {
    let verb = if v.dry_run { "would delete" } else { "deleted" };
    v.statuses
        .iter()
        .map(|p| {
            format!(
                "{verb} {} {} job{} older than {}s\n",
                p.jobs,
                p.status,
                plural(p.jobs as usize),
                p.older_than_secs
            )
        })
        .collect()
}

fn redrive_lines(done: &[RedriveView]) -> String {
    let mut s = String::new();
    for r in done {
        s.push_str(&format!(
            "redriven {} ({} message{})\n",
            r.job_id,
            r.messages,
            plural(r.messages)
        ));
    }
    if done.is_empty() {
        s.push_str("nothing redriven\n");
    }
    s
}

fn overview_table(v: &OverviewView) -> String {
    let mut s = format!(
        "pending {}  running {}  done {}  dead {}  cancelled {}  total {}  dlq {}\n",
        v.pending, v.running, v.done, v.dead, v.cancelled, v.total, v.dlq_size
    );
    let r = &v.rows.recent;
    s.push_str(&format!(
        "last {}s: done {}  dead {}  failed attempts {}  takeovers {}  stale refusals {}  ({:.2}/min, failure rate {:.1}%)\n",
        r.window_secs, r.done, r.dead, r.failed, r.takeovers, r.stale_refusals,
        v.throughput_per_min, v.failure_rate * 100.0
    ));
    let rows: Vec<Vec<String>> = v
        .rows
        .by_type_status
        .iter()
        .map(|c| {
            vec![
                c.job_type.clone(),
                c.status.clone(),
                c.count.to_string(),
                c.takeovers.to_string(),
            ]
        })
        .collect();
    s.push_str(&table(&["TYPE", "STATUS", "JOBS", "TAKEOVERS"], &rows));
    s
}

fn schedules_table(v: &data::SchedulesView) -> String {
    let mut s = match &v.leader {
        Some(l) => format!(
            "scheduler leader: {} (token {}, since {})\n",
            l.worker,
            l.token,
            time(&l.since)
        ),
        None => "scheduler leader: none yet\n".to_string(),
    };
    let opt =
        |t: &Option<chrono::DateTime<chrono::Utc>>| t.as_ref().map_or_else(|| "-".into(), time);
    let rows: Vec<Vec<String>> = v
        .schedules
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.job_type.clone(),
                r.expr.clone(),
                r.time_zone.clone(),
                r.missed.clone(),
                opt(&r.last_tick),
                opt(&r.next_tick),
                r.enqueued.to_string(),
                r.skipped.to_string(),
            ]
        })
        .collect();
    s.push_str(&table(
        &[
            "NAME",
            "TYPE",
            "CRON",
            "ZONE",
            "MISSED",
            "LAST TICK",
            "NEXT TICK",
            "ENQUEUED",
            "SKIPPED",
        ],
        &rows,
    ));
    s
}

fn workers_table(views: &[WorkerSeen]) -> String {
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|w| {
            vec![
                w.worker.clone(),
                w.health.clone().unwrap_or_else(|| "-".into()),
                w.lease_id.map_or_else(|| "-".into(), |l| format!("{l:x}")),
                w.last_event_at
                    .as_ref()
                    .map(time)
                    .unwrap_or_else(|| "-".into()),
                w.claims.to_string(),
                w.steps.to_string(),
                w.stale_refusals.to_string(),
                w.jobs_in_flight.to_string(),
                w.connections.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "WORKER",
            "HEALTH",
            "LEASE",
            "LAST EVENT",
            "CLAIMS",
            "STEPS",
            "STALE",
            "IN FLIGHT",
            "CONNECTIONS",
        ],
        &rows,
    )
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
                match &v.waiting {
                    Some(why) => format!("{} ({why})", v.status),
                    None => v.status.clone(),
                },
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
        (
            "cancelled",
            v.cancel_reason.clone().unwrap_or_else(|| "-".into()),
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
    fn servers_are_named_without_credentials() {
        let ctx = Ctx {
            cfg: Config::new("t")
                .with_nats_url("nats://t0ken@h:4222")
                .with_database_url("postgres://u:secret@h:5432/db?sslpassword=k"),
            timeout: Duration::from_secs(1),
            json: false,
        };
        assert_eq!(ctx.nats(), "NATS at nats://***@h:4222");
        assert_eq!(
            ctx.postgres(),
            "PostgreSQL at postgres://u:***@h:5432/db?sslpassword=***"
        );
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
