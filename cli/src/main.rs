//! `tenure`: the operator's view of a Tenure deployment.
//!
//! ```text
//! tenure migrate [--grant-worker R] [--grant-producer R] [--grant-operator R]   apply the migrations, grant roles
//! tenure enqueue TYPE --key K --input JSON [--at RFC3339 | --after 5m] [--priority high|normal|low]
//!                                                        enqueue a job (a duplicate says so)
//! tenure jobs [--status S] [--type T] [--age 10m] [--key K] [--limit N]   list job rows, newest first
//! tenure job <ID> | --key TYPE:KEY                                 one job and its history
//! tenure dlq [--limit N]                                          list the DLQ
//! tenure redrive <ID>                                             put a dead job back to work
//! tenure redrive --reason <CODE>                                  ... every dead letter with that reason
//! tenure cancel <ID> [--reason TEXT]                              cancel a job (its running step stops, it never runs again; a dead one leaves the DLQ)
//! tenure prune --done-older-than 30d [--dry-run] ...              delete old finished jobs
//! tenure overview                                                 counts per status and type, last hour's rates
//! tenure workers                                                  workers seen in the job history
//! tenure schedules                                                cron schedules and the scheduler leader
//! tenure schedule pause|resume NAME                               stop or restart a schedule's ticks
//! tenure schedule trigger NAME [--id ID]                          run a schedule's job now (same id: same job)
//! tenure serve [--bind 127.0.0.1:8023] [--operator-token-file F]  the web view (see `web`)
//! ```
//!
//! Settings come from the `TENURE_*` variables a worker reads (all of them,
//! through the same table, `tenure::config::SETTINGS`; the list is
//! `tenure::guide::configuration`): a value a worker would refuse is refused
//! here too, naming its variable. Flags override their variables:
//! `--etcd/--nats/--database-url/--namespace/--schema`, TLS and credentials
//! `--etcd-ca-file`, `--etcd-user`, `--nats-token`, ... (see `tenure --help`). A
//! namespace that owns jobs by partition needs its count (`--partitions` or
//! `TENURE_PARTITIONS`) for `enqueue`, `redrive` and `cancel`. Every server call is
//! bounded by `--timeout` (seconds, default 5); an unreachable server is reported
//! by name and address, with exit code 1. Bad arguments exit with code 2.
//! Output is a table; `--json` prints JSON for scripts.
//!
//! `jobs`, `job` and `dlq` only read: they bind to the namespace's existing
//! streams ([`tenure::blocks::queue::Queue::connect`]) and never create or reconfigure
//! them, so the CLI's default settings cannot overwrite the workers' (replicas,
//! AckWait, MaxDeliver). A namespace no worker has started in is an error.
//!
//! `migrate` talks to PostgreSQL only: it applies Tenure's migrations to the
//! schema ([`tenure::blocks::fence::FenceStore::migrate`]; a second run applies
//! nothing and says so) and grants the worker's, the producer's and the
//! operator's privileges (`grant_worker`, `grant_producer`, `grant_operator`) to roles that must exist already (a
//! missing one is an error before anything changes). Run it as the schema's
//! owner, e.g. as a deployment's migrations job. It records no way of owning
//! jobs: the first worker or producer does ([`tenure::Client::migrate`]).
//!
//! `enqueue` goes through [`tenure::Client::enqueue_json`] (with `--at`/`--after`,
//! [`tenure::Client::enqueue_json_at`]), the path producers use: the type and
//! the idempotency key name the job, so enqueuing it again is a duplicate that
//! changes nothing (and says so), and the same key with another input is an
//! error. Invalid JSON, `--at` with `--after` or a bad duration is a usage
//! error (exit 2); nothing is enqueued. Like `redrive` and `cancel`, it needs
//! the namespace's streams to exist.
//!
//! The code: [`args`] (the command line), [`data`] (the reads and actions,
//! and the views `--json` prints), [`render`] (the tables), [`web`]; this
//! file only dispatches.

mod args;
mod ctx;
mod data;
mod render;
mod web;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use chrono::Utc;
use clap::Parser;
use tenure::blocks::fence::{JobFilter, JobStatus};

use args::{
    Cli, Command, EnqueueArgs, JobArgs, JobsArgs, MigrateArgs, PruneArgs, RescheduleArgs,
    ScheduleCommand,
};
use ctx::Ctx;
use data::Privileges;

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
    let cfg = cli.config()?;
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
        Command::Migrate(a) => migrate(ctx, a).await,
        Command::Enqueue(a) => enqueue(ctx, a).await,
        Command::Jobs(a) => jobs(ctx, a).await,
        Command::Job(a) => job(ctx, a).await,
        Command::Dlq { limit } => {
            let queue = ctx.queue().await?;
            let views = data::dlq(ctx, &queue, limit as usize).await?;
            ctx.print(&views, || render::dlq_table(&views))
        }
        Command::Overview => {
            let (store, queue) = (ctx.store().await?, ctx.queue().await?);
            let view = data::overview(ctx, &store, &queue).await?;
            ctx.print(&view, || render::overview_table(&view))
        }
        Command::Workers => {
            let store = ctx.store().await?;
            let views = data::workers(ctx, &store).await?;
            ctx.print(&views, || render::workers_table(&views))
        }
        Command::Schedules => {
            let store = ctx.store().await?;
            let view = data::schedules(ctx, &store).await?;
            ctx.print(&view, || render::schedules_table(&view))
        }
        Command::Schedule(c) => schedule(ctx, c).await,
        Command::Redrive { id, reason } => redrive(ctx, id, reason).await,
        Command::Cancel { id, reason } => {
            let client = ctx.client().await?;
            let view = data::cancel(ctx, &client, id, &reason).await?;
            ctx.print(&view, || format!("{} {}\n", view.outcome, view.job_id))
        }
        Command::RetryNow { id } => {
            let client = ctx.client().await?;
            let view = data::retry_now(ctx, &client, id)
                .await?
                .map_err(|e| anyhow!(e))?;
            ctx.print(&view, || format!("{} {}\n", view.outcome, view.job_id))
        }
        Command::Reschedule(a) => reschedule(ctx, a).await,
        Command::Pause { job_type } => pause(ctx, &job_type, true).await,
        Command::Resume { job_type } => pause(ctx, &job_type, false).await,
        Command::Paused => {
            let store = ctx.store().await?;
            let views = data::paused(ctx, &store).await?;
            ctx.print(&views, || render::paused_table(&views))
        }
        Command::Prune(a) => prune(ctx, a).await,
        Command::Serve(_) => Err(anyhow!("serve is not a one-shot command")),
    }
}

async fn reschedule(ctx: &Ctx, a: RescheduleArgs) -> anyhow::Result<()> {
    let run_at = match (a.at, a.after) {
        (Some(at), _) => at,
        (None, Some(after)) => chrono::Duration::from_std(after)
            .ok()
            .and_then(|d| Utc::now().checked_add_signed(d))
            .ok_or_else(|| anyhow!("--after {after:?} is too long: nothing changed"))?,
        (None, None) => return Err(anyhow!("give --at or --after: nothing changed")),
    };
    let client = ctx.client().await?;
    let view = data::reschedule(ctx, &client, a.id, run_at)
        .await?
        .map_err(|e| anyhow!(e))?;
    ctx.print(&view, || format!("{} {}\n", view.outcome, view.job_id))
}

async fn pause(ctx: &Ctx, job_type: &str, pause: bool) -> anyhow::Result<()> {
    let client = ctx.client().await?;
    let view = data::pause(ctx, &client, job_type, pause).await?;
    ctx.print(&view, || format!("{} {}\n", view.outcome, view.job_type))
}

async fn schedule(ctx: &Ctx, command: ScheduleCommand) -> anyhow::Result<()> {
    let client = ctx.client().await?;
    let view = match command {
        ScheduleCommand::Pause { name } => {
            data::control_schedule(ctx, &client, &name, true).await?
        }
        ScheduleCommand::Resume { name } => {
            data::control_schedule(ctx, &client, &name, false).await?
        }
        ScheduleCommand::Trigger { name, id } => {
            let id = id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            data::trigger_schedule(ctx, &client, &name, &id).await?
        }
    };
    ctx.print(&view, || render::schedule_control_line(&view))
}

async fn migrate(ctx: &Ctx, a: MigrateArgs) -> anyhow::Result<()> {
    let grants: Vec<(Privileges, String)> = [
        a.grant_worker.map(|r| (Privileges::Worker, r)),
        a.grant_producer.map(|r| (Privileges::Producer, r)),
        a.grant_operator.map(|r| (Privileges::Operator, r)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let store = ctx.store().await?;
    let view = data::migrate(ctx, &store, &grants).await?;
    ctx.print(&view, || render::migrate_lines(&view))
}

async fn enqueue(ctx: &Ctx, a: EnqueueArgs) -> anyhow::Result<()> {
    let run_at = match (a.at, a.after) {
        (Some(at), _) => Some(at),
        (None, Some(after)) => Some(
            chrono::Duration::from_std(after)
                .ok()
                .and_then(|d| Utc::now().checked_add_signed(d))
                .ok_or_else(|| anyhow!("--after {after:?} is too long: nothing enqueued"))?,
        ),
        (None, None) => None,
    };
    let mut options = tenure::EnqueueOptions::default().priority(a.priority);
    if let Some(at) = run_at {
        options = options.run_at(at);
    }
    let client = ctx.client().await?;
    let job = (a.job_type.as_str(), a.key.as_str());
    let view = data::enqueue(ctx, &client, job, a.input, options).await?;
    ctx.print(&view, || render::enqueue_line(&view))
}

async fn jobs(ctx: &Ctx, a: JobsArgs) -> anyhow::Result<()> {
    let created_since = match a.age {
        Some(age) => Some(
            chrono::Duration::from_std(age)
                .ok()
                .and_then(|d| Utc::now().checked_sub_signed(d))
                .ok_or_else(|| anyhow!("--age {age:?} is too long"))?,
        ),
        None => None,
    };
    let filter = JobFilter {
        job_type: a.job_type,
        status: a.status.map(Into::into),
        created_since,
        with_takeovers: false,
    };
    let store = ctx.store().await?;
    let views = data::jobs(ctx, &store, &filter, a.key.as_deref(), a.limit).await?;
    ctx.print(&views, || render::jobs_table(&views))
}

async fn job(ctx: &Ctx, a: JobArgs) -> anyhow::Result<()> {
    let (id, by_key) = match (a.id, a.key) {
        (Some(id), _) => (id, None),
        (None, Some(tk)) => (tk.job_id(), Some(tk)),
        (None, None) => return Err(anyhow!("give a job id or --key TYPE:KEY")),
    };
    let store = ctx.store().await?;
    // The DLQ entries too when NATS answers; the row alone otherwise.
    let queue = match ctx.queue().await {
        Ok(q) => Some(q),
        Err(e) => {
            eprintln!("note: DLQ entries not read: {e:#}");
            None
        }
    };
    let schema = &ctx.cfg.schema;
    let detail = data::job(ctx, &store, queue.as_ref(), id)
        .await?
        .ok_or_else(|| match by_key {
            Some(tk) => anyhow!(
                "no job with key {:?} of type {} (id {id}) in schema {schema:?}",
                tk.key,
                tk.job_type
            ),
            None => anyhow!("no job {id} in schema {schema:?}"),
        })?;
    ctx.print(&detail, || render::job_text(&detail))
}

async fn redrive(
    ctx: &Ctx,
    id: Option<tenure::JobId>,
    reason: Option<String>,
) -> anyhow::Result<()> {
    let client = ctx.client().await?;
    let ids = match (id, reason) {
        (Some(id), _) => vec![id],
        (None, Some(reason)) => data::jobs_with_reason(ctx, client.queue(), &reason).await?,
        (None, None) => return Err(anyhow!("give a job id or --reason")),
    };
    let mut skipped = Vec::new();
    let done = data::redrive(ctx, &client, ids, &mut skipped).await?;
    for s in &skipped {
        eprintln!("skipped: {s}");
    }
    ctx.print(&done, || render::redrive_lines(&done))
}

async fn prune(ctx: &Ctx, a: PruneArgs) -> anyhow::Result<()> {
    let ages = [
        (JobStatus::Done, a.done_older_than),
        (JobStatus::Cancelled, a.cancelled_older_than),
        (JobStatus::Dead, a.dead_older_than),
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
    let view = data::prune(ctx, &store, &ages, a.batch as usize, a.dry_run).await?;
    ctx.print(&view, || render::prune_lines(&view))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_named_without_credentials() {
        let ctx = Ctx {
            cfg: tenure::Config::new("t")
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
}
