//! The command line: every flag, subcommand and value parser (`clap`), and
//! the settings they make. No server is contacted here.

use std::time::Duration;

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand, ValueEnum};
use tenure::blocks::fence::JobStatus;
use tenure::config::ConfigError;
use tenure::{Config, JobId, Priority};

use crate::web;

/// Operator tool for Tenure: jobs, their fencing history, the dead-letter queue.
///
/// Settings come from the same `TENURE_*` variables as a worker's
/// (`tenure::config::SETTINGS`, every one of them; see
/// `tenure::guide::configuration`); a flag overrides its variable.
#[derive(Debug, Parser)]
#[command(name = "tenure", version, about)]
pub struct Cli {
    /// etcd endpoints, comma-separated [TENURE_ETCD_ENDPOINTS]. No current
    /// command contacts etcd; the setting is read so that one set of
    /// `TENURE_*` variables serves workers and the CLI.
    #[arg(long = "etcd", global = true)]
    etcd: Option<String>,
    /// NATS server URL [TENURE_NATS_URL; default nats://127.0.0.1:4222].
    #[arg(long = "nats", global = true)]
    nats: Option<String>,
    /// PostgreSQL URL [TENURE_DATABASE_URL; default
    /// postgres://postgres@127.0.0.1:5432/tenure].
    #[arg(long = "database-url", global = true)]
    database_url: Option<String>,
    /// Namespace: etcd prefix and stream names [TENURE_NAMESPACE; default tenure].
    #[arg(long, global = true)]
    namespace: Option<String>,
    /// PostgreSQL schema of the job rows [TENURE_SCHEMA; default tenure].
    #[arg(long, global = true)]
    schema: Option<String>,
    /// The namespace's partition count, if it owns jobs by partition
    /// [TENURE_PARTITIONS] (`Config::partitions`): `enqueue`, `redrive` and
    /// `cancel` are refused in such a namespace without it.
    #[arg(long, global = true,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(tenure::config::MAX_PARTITIONS)))]
    partitions: Option<u32>,
    /// Bound on connecting and on each server call, in seconds.
    #[arg(long, global = true, default_value_t = 5.0, value_parser = parse_secs)]
    pub timeout: f64,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    security: Security,
    #[command(subcommand)]
    pub command: Command,
}

/// TLS and credentials: the same settings as a worker's, each overriding
/// its variable. PostgreSQL TLS is in the URL (`sslmode`, `sslrootcert`,
/// `sslcert`, `sslkey`). Secret values are never printed.
#[derive(Debug, clap::Args)]
struct Security {
    /// CA bundle (PEM) for etcd's certificate; any etcd TLS file turns TLS on
    /// [TENURE_ETCD_CA_FILE].
    #[arg(long, global = true)]
    etcd_ca_file: Option<String>,
    /// Client certificate (PEM) for etcd, mutual TLS [TENURE_ETCD_CERT_FILE].
    #[arg(long, global = true, requires = "etcd_key_file")]
    etcd_cert_file: Option<String>,
    /// Key of the etcd client certificate (PEM) [TENURE_ETCD_KEY_FILE].
    #[arg(long, global = true)]
    etcd_key_file: Option<String>,
    /// etcd user [TENURE_ETCD_USER].
    #[arg(long, global = true)]
    etcd_user: Option<String>,
    /// etcd password [TENURE_ETCD_PASSWORD].
    #[arg(long, global = true)]
    etcd_password: Option<String>,
    /// CA bundle (PEM) for NATS's certificate; any NATS TLS file requires TLS
    /// [TENURE_NATS_CA_FILE].
    #[arg(long, global = true)]
    nats_ca_file: Option<String>,
    /// Client certificate (PEM) for NATS, mutual TLS [TENURE_NATS_CERT_FILE].
    #[arg(long, global = true, requires = "nats_key_file")]
    nats_cert_file: Option<String>,
    /// Key of the NATS client certificate (PEM) [TENURE_NATS_KEY_FILE].
    #[arg(long, global = true)]
    nats_key_file: Option<String>,
    /// NATS user, with its password [TENURE_NATS_USER].
    #[arg(long, global = true)]
    nats_user: Option<String>,
    /// NATS password [TENURE_NATS_PASSWORD].
    #[arg(long, global = true)]
    nats_password: Option<String>,
    /// NATS token [TENURE_NATS_TOKEN].
    #[arg(long, global = true)]
    nats_token: Option<String>,
    /// NATS `.creds` file [TENURE_NATS_CREDS_FILE].
    #[arg(long, global = true)]
    nats_creds_file: Option<String>,
    /// NATS nkey seed [TENURE_NATS_NKEY].
    #[arg(long, global = true)]
    nats_nkey: Option<String>,
    /// PostgreSQL password, instead of in the URL [TENURE_DATABASE_PASSWORD].
    #[arg(long, global = true)]
    database_password: Option<String>,
    /// Send credentials to servers off loopback without verified TLS
    /// (refused otherwise; see `Config::allow_insecure_transport`)
    /// [TENURE_ALLOW_INSECURE_TRANSPORT].
    #[arg(long, global = true)]
    allow_insecure_transport: bool,
}

/// A flag given on the command line, as the variable it overrides.
struct Override {
    var: &'static str,
    flag: &'static str,
    value: String,
}

impl Cli {
    /// The settings: a worker's defaults, the `TENURE_*` variables with the
    /// flags over them ([`Config::with_vars`]: a bad value is refused naming
    /// its variable, and its flag when one gave it), then the CLI's own
    /// worker id, timeouts and a single connection.
    pub fn config(&self) -> anyhow::Result<Config> {
        let given = self.overrides();
        let lookup = |var: &str| match given.iter().find(|o| o.var == var) {
            Some(o) => Some(o.value.clone()),
            None => std::env::var(var).ok(),
        };
        let mut cfg = Config::new("tenure").with_vars(lookup).map_err(|e| {
            let named = match &e {
                ConfigError::Invalid { name, .. } => given.iter().find(|o| o.var == *name),
                _ => None,
            };
            match named {
                Some(o) => anyhow!("{e} (given as --{})", o.flag),
                None => anyhow!(e),
            }
        })?;
        let timeout = Duration::from_secs_f64(self.timeout);
        cfg.worker_id = "tenure-cli".into();
        cfg.nats_request_timeout = timeout;
        cfg.etcd_request_timeout = timeout;
        // The CLI holds one connection at a time.
        cfg.max_in_flight = 1;
        Ok(cfg)
    }

    fn overrides(&self) -> Vec<Override> {
        let s = &self.security;
        let flags = [
            ("TENURE_ETCD_ENDPOINTS", "etcd", self.etcd.clone()),
            ("TENURE_NATS_URL", "nats", self.nats.clone()),
            (
                "TENURE_DATABASE_URL",
                "database-url",
                self.database_url.clone(),
            ),
            ("TENURE_NAMESPACE", "namespace", self.namespace.clone()),
            ("TENURE_SCHEMA", "schema", self.schema.clone()),
            (
                "TENURE_PARTITIONS",
                "partitions",
                self.partitions.map(|p| p.to_string()),
            ),
            (
                "TENURE_ETCD_CA_FILE",
                "etcd-ca-file",
                s.etcd_ca_file.clone(),
            ),
            (
                "TENURE_ETCD_CERT_FILE",
                "etcd-cert-file",
                s.etcd_cert_file.clone(),
            ),
            (
                "TENURE_ETCD_KEY_FILE",
                "etcd-key-file",
                s.etcd_key_file.clone(),
            ),
            ("TENURE_ETCD_USER", "etcd-user", s.etcd_user.clone()),
            (
                "TENURE_ETCD_PASSWORD",
                "etcd-password",
                s.etcd_password.clone(),
            ),
            (
                "TENURE_NATS_CA_FILE",
                "nats-ca-file",
                s.nats_ca_file.clone(),
            ),
            (
                "TENURE_NATS_CERT_FILE",
                "nats-cert-file",
                s.nats_cert_file.clone(),
            ),
            (
                "TENURE_NATS_KEY_FILE",
                "nats-key-file",
                s.nats_key_file.clone(),
            ),
            ("TENURE_NATS_USER", "nats-user", s.nats_user.clone()),
            (
                "TENURE_NATS_PASSWORD",
                "nats-password",
                s.nats_password.clone(),
            ),
            ("TENURE_NATS_TOKEN", "nats-token", s.nats_token.clone()),
            (
                "TENURE_NATS_CREDS_FILE",
                "nats-creds-file",
                s.nats_creds_file.clone(),
            ),
            ("TENURE_NATS_NKEY", "nats-nkey", s.nats_nkey.clone()),
            (
                "TENURE_DATABASE_PASSWORD",
                "database-password",
                s.database_password.clone(),
            ),
            (
                "TENURE_ALLOW_INSECURE_TRANSPORT",
                "allow-insecure-transport",
                s.allow_insecure_transport.then(|| "true".into()),
            ),
        ];
        flags
            .into_iter()
            .filter_map(|(var, flag, value)| value.map(|value| Override { var, flag, value }))
            .collect()
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply Tenure's migrations to the schema (a run with nothing to apply
    /// changes nothing and says so), then grant the worker's and the
    /// producer's privileges to existing PostgreSQL roles. Only PostgreSQL is
    /// contacted: the namespace's way of owning jobs is recorded by its first
    /// worker or producer.
    Migrate(MigrateArgs),
    /// Enqueue a job by type name with a JSON input, through the producers'
    /// path: the idempotency key names the job, so a second identical
    /// enqueue is a duplicate and changes nothing.
    Enqueue(EnqueueArgs),
    /// List jobs, newest first.
    Jobs(JobsArgs),
    /// Show one job: status, fence, step, takeovers, attempts, last error,
    /// times, then its history (a table; `--json`: everything, DLQ entries too).
    Job(JobArgs),
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
    /// Start now a job waiting in retry backoff (an attempt failed, the next
    /// is minutes away): one more message is published for it, which a
    /// worker locks and claims as any other, so a job that runs meanwhile
    /// keeps its one owner. A running, finished, delayed or never-failed job
    /// is an error, and nothing changes.
    RetryNow {
        /// The job to start now.
        #[arg(value_parser = parse_job_id)]
        id: JobId,
    },
    /// Move a delayed job's run time, while it still waits to be published
    /// (`--at` or `--after`; a time now or past starts it at once). A job
    /// already published, running or finished is an error, and nothing
    /// changes.
    Reschedule(RescheduleArgs),
    /// Pause a job type for every worker of the namespace, within about half a
    /// second: its messages stay in the stream (nothing is redelivered,
    /// counted or dead-lettered because of it), no job of it starts, and a
    /// running one finishes its current step, then waits before the next.
    /// Durable until `tenure resume`; pausing twice changes nothing.
    Pause {
        /// The job type (e.g. `billing.charge`).
        job_type: String,
    },
    /// Resume a paused job type: its waiting jobs go on, its messages are
    /// fetched again. Resuming a type that is not paused changes nothing.
    Resume {
        /// The job type.
        job_type: String,
    },
    /// The paused job types: since when and by whom.
    Paused,
    /// Delete finished jobs (and their history) that finished longer ago than
    /// the given ages, in batches that skip rows locked by anyone; a status
    /// without an age is kept. `--dry-run` counts them and changes nothing.
    Prune(PruneArgs),
    /// Jobs per status and type, the last hour's rates, takeovers, stale refusals, DLQ size.
    Overview,
    /// Workers seen in the last hour's job history or connected to PostgreSQL now.
    Workers,
    /// Cron schedules (expression, time zone, missed-ticks policy, last and
    /// next tick, ticks enqueued and skipped, paused since) and the
    /// scheduler leader.
    Schedules,
    /// Pause, resume or trigger one cron schedule.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Serve the operator's web view (read-only without --operator-token-file or TENURE_OPERATOR_TOKEN).
    Serve(web::ServeArgs),
}

/// `tenure schedule ...`: an operator's controls of one cron schedule.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Pause a schedule: from the moment this returns the scheduler leader
    /// enqueues none of its ticks (they are counted as skipped). Durable
    /// until `tenure schedule resume`; pausing twice changes nothing.
    Pause {
        /// The schedule's name (as `tenure schedules` lists it).
        name: String,
    },
    /// Resume a paused schedule: its next tick runs as usual; the ticks that
    /// came while it was paused are skipped, whatever its missed-ticks policy.
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Run a schedule's job now (its type and input), as an enqueue under
    /// the key `trigger:<name>:<id>`: the same `--id` again is the same job.
    /// A paused schedule is triggered too.
    Trigger {
        /// The schedule's name.
        name: String,
        /// The trigger's id (default: a fresh UUID, so each run is a new
        /// job); give one to make a retried command one job.
        #[arg(long)]
        id: Option<String>,
    },
}

/// `tenure migrate` options.
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// Grant this existing role what running jobs needs (`grant_worker`).
    #[arg(long, value_name = "ROLE")]
    pub grant_worker: Option<String>,
    /// Grant this existing role what enqueueing needs (`grant_producer`).
    #[arg(long, value_name = "ROLE")]
    pub grant_producer: Option<String>,
    /// Grant this existing role an operator's reads, cancel, redrive and
    /// prune (`grant_operator`).
    #[arg(long, value_name = "ROLE")]
    pub grant_operator: Option<String>,
}

/// `tenure enqueue` options.
#[derive(Debug, clap::Args)]
pub struct EnqueueArgs {
    /// The job type (what workers register, e.g. `billing.charge`).
    pub job_type: String,
    /// The idempotency key: with the type, it names the job.
    #[arg(long)]
    pub key: String,
    /// The job's input, as JSON (`'{"order": 42}'`, `7`, `'"text"'`).
    #[arg(long, value_parser = parse_json)]
    pub input: serde_json::Value,
    /// Due at this time (RFC 3339, e.g. `2026-12-24T18:00:00Z`).
    #[arg(long, value_parser = parse_time, conflicts_with = "after")]
    pub at: Option<DateTime<Utc>>,
    /// Due this long from now (`90s`, `30m`, `12h`, `7d`).
    #[arg(long, value_parser = parse_age)]
    pub after: Option<Duration>,
    /// Its priority level: `high`, `normal` or `low` (recorded on the job:
    /// every later message of it, a redrive's or a retry-now's, goes there).
    #[arg(long, default_value = "normal", value_parser = parse_priority)]
    pub priority: Priority,
}

/// `tenure reschedule` options.
#[derive(Debug, clap::Args)]
pub struct RescheduleArgs {
    /// The delayed job.
    #[arg(value_parser = parse_job_id)]
    pub id: JobId,
    /// Due at this time (RFC 3339, e.g. `2026-12-24T18:00:00Z`).
    #[arg(long, value_parser = parse_time, conflicts_with = "after", required_unless_present = "after")]
    pub at: Option<DateTime<Utc>>,
    /// Due this long from now (`90s`, `30m`, `12h`, `7d`).
    #[arg(long, value_parser = parse_age)]
    pub after: Option<Duration>,
}

/// `tenure jobs` options: the filters combine (all must hold).
#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    /// Only jobs with this status.
    #[arg(long, value_enum)]
    pub status: Option<Status>,
    /// Only jobs of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub job_type: Option<String>,
    /// Only jobs created within this age (`90s`, `30m`, `12h`, `7d`).
    #[arg(long, value_parser = parse_age)]
    pub age: Option<Duration>,
    /// Only the job with this idempotency key (with `--type`: a job's id is
    /// made of both).
    #[arg(long, requires = "job_type")]
    pub key: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
}

/// `tenure job` options: the job by id, or by type and idempotency key.
#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// The job id (a UUID).
    #[arg(value_parser = parse_job_id, required_unless_present = "key", conflicts_with = "key")]
    pub id: Option<JobId>,
    /// The job's type and idempotency key, `TYPE:KEY` (e.g. `billing.charge:order-42`).
    #[arg(long, value_name = "TYPE:KEY", value_parser = parse_type_key)]
    pub key: Option<TypeKey>,
}

/// A job type and an idempotency key (`--key TYPE:KEY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeKey {
    /// The job type.
    pub job_type: String,
    /// The idempotency key.
    pub key: String,
}

impl TypeKey {
    /// The job's id.
    pub fn job_id(&self) -> JobId {
        JobId::from_key(&self.job_type, &self.key)
    }
}

/// `tenure prune` options.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Delete `done` jobs older than this (`90s`, `30m`, `12h`, `7d`).
    #[arg(long, value_parser = parse_age)]
    pub done_older_than: Option<Duration>,
    /// Delete `cancelled` jobs older than this.
    #[arg(long, value_parser = parse_age)]
    pub cancelled_older_than: Option<Duration>,
    /// Delete `dead` jobs older than this (they are kept otherwise).
    #[arg(long, value_parser = parse_age)]
    pub dead_older_than: Option<Duration>,
    /// Rows deleted per statement (at most 10000, what the prune
    /// function accepts).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch: u32,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Status {
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

pub fn parse_priority(s: &str) -> Result<Priority, String> {
    s.parse()
        .map_err(|e: tenure::UnknownPriority| e.to_string())
}

pub fn parse_job_id(s: &str) -> Result<JobId, String> {
    s.parse::<JobId>().map_err(|e| {
        format!("not a job id (expected a UUID such as 67e55044-10b1-426f-9247-bb680e5fe0c8): {e}")
    })
}

/// An age: a positive whole number and a unit (`s`, `m`, `h`, `d`).
pub fn parse_age(s: &str) -> Result<Duration, String> {
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

pub fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err("expected seconds between 0 and 3600".into()),
    }
}

/// A JSON value (`--input`).
pub fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

/// A time in RFC 3339 (`--at`).
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 time such as 2026-12-24T18:00:00Z: {e}"))
}

/// `TYPE:KEY`, split at the first `:` (a job type has none; a key may).
pub fn parse_type_key(s: &str) -> Result<TypeKey, String> {
    match s.split_once(':') {
        Some((t, k)) if !t.is_empty() && !k.is_empty() => Ok(TypeKey {
            job_type: t.to_string(),
            key: k.to_string(),
        }),
        _ => Err("expected TYPE:KEY, e.g. billing.charge:order-42".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn type_key_splits_at_the_first_colon() {
        let tk = parse_type_key("billing.charge:order:42");
        let want = TypeKey {
            job_type: "billing.charge".into(),
            key: "order:42".into(),
        };
        assert_eq!(tk, Ok(want.clone()));
        assert_eq!(want.job_id(), JobId::from_key("billing.charge", "order:42"));
        for bad in ["nokey", ":k", "t:"] {
            assert!(parse_type_key(bad).is_err(), "{bad}");
        }
    }
}
