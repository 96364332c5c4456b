//! What the commands print without `--json`: tables with left-aligned
//! columns and short lines. Each renderer takes a view of `crate::data` and
//! returns the text; none reads a server.

use chrono::{DateTime, Utc};
use tenure::blocks::fence::{JobEvent, LimitsSeen, PartitionOwner, ReportedLimits};

use crate::data::{
    DeadLetterView, EnqueueView, JobDetail, JobView, MigrateView, OverviewView, PausedView,
    PruneView, RedriveView, ScheduleControlView, SchedulesView, WorkerView,
};

/// `tenure job`: the row's fields, then its history as a table.
pub fn job_text(d: &JobDetail) -> String {
    let mut s = job_detail(&d.job);
    s.push('\n');
    s.push_str(&history_table(&d.events));
    if !d.dead_letters.is_empty() {
        s.push_str(&format!(
            "({} DLQ entr{}; --json shows them)\n",
            d.dead_letters.len(),
            if d.dead_letters.len() == 1 {
                "y"
            } else {
                "ies"
            }
        ));
    }
    s
}

/// A job's history, oldest first: one row per event.
pub fn history_table(events: &[JobEvent]) -> String {
    let opt = |o: Option<String>| o.unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            vec![
                (i + 1).to_string(),
                time(&e.at),
                e.kind.clone(),
                opt(e.token.map(|t| t.to_string())),
                opt(e.other_token.map(|t| t.to_string())),
                opt(e.step.map(|t| t.to_string())),
                opt(e.worker.clone()),
                opt(e.attempts.map(|t| t.to_string())),
                opt(e.takeovers.map(|t| t.to_string())),
                e.detail
                    .as_ref()
                    .map_or_else(String::new, |d| one_line(&d.to_string(), 60)),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "#",
            "AT",
            "EVENT",
            "TOKEN",
            "OTHER",
            "STEP",
            "WORKER",
            "ATTEMPTS",
            "TAKEOVERS",
            "DETAIL",
        ],
        &rows,
    );
    out.push_str(&format!(
        "({} event{})\n",
        events.len(),
        plural(events.len())
    ));
    out
}

/// `tenure migrate`: what was applied and granted.
pub fn migrate_lines(v: &MigrateView) -> String {
    let mut s = match (v.applied.first(), v.applied.last()) {
        (Some(first), Some(last)) => format!(
            "applied {} migration{} ({first:04} to {last:04}) to schema {}; {} were applied before\n",
            v.applied.len(),
            plural(v.applied.len()),
            v.schema,
            v.up_to_date
        ),
        _ => format!(
            "schema {} is up to date ({} migrations): nothing applied\n",
            v.schema, v.up_to_date
        ),
    };
    for g in &v.grants {
        s.push_str(&format!(
            "granted the {} privileges to {}\n",
            g.privileges, g.role
        ));
    }
    s
}

/// `tenure enqueue`: the job, and whether it was new.
pub fn enqueue_line(v: &EnqueueView) -> String {
    let due = v
        .run_at
        .as_ref()
        .map(|t| format!(", due {}", time(t)))
        .unwrap_or_default();
    let level = match v.priority {
        tenure::Priority::Normal => String::new(),
        p => format!(", priority {p}"),
    };
    if v.duplicate {
        format!(
            "duplicate: job {} ({} key {:?}) exists already; nothing new enqueued\n",
            v.job_id, v.job_type, v.key
        )
    } else {
        format!(
            "enqueued {} ({} key {:?}{due}{level})\n",
            v.job_id, v.job_type, v.key
        )
    }
}

pub fn prune_lines(v: &PruneView) -> String {
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

pub fn redrive_lines(done: &[RedriveView]) -> String {
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

pub fn overview_table(v: &OverviewView) -> String {
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

pub fn schedules_table(v: &SchedulesView) -> String {
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
                r.paused_at
                    .as_ref()
                    .map_or_else(|| "-".into(), |t| format!("since {}", time(t))),
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
            "PAUSED",
        ],
        &rows,
    ));
    s
}

/// `tenure schedule ...`: what was done, on one line.
pub fn schedule_control_line(v: &ScheduleControlView) -> String {
    format!("{}\n", v.line())
}

pub fn workers_table(views: &[WorkerView]) -> String {
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            let w = &v.seen;
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
                partitions_of(&v.partitions),
            ]
        })
        .collect();
    let mut out = table(
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
            "PARTITIONS",
        ],
        &rows,
    );
    out.push_str(&owners_table(views));
    out.push_str(&limits_table(views));
    out
}

/// Each worker's limits for each type that has some (its last report).
fn limits_table(views: &[WorkerView]) -> String {
    let mut limits: Vec<&LimitsSeen> = views.iter().flat_map(|v| &v.limits).collect();
    if limits.is_empty() {
        return String::new();
    }
    limits.sort_by(|a, b| (&a.job_type, &a.worker).cmp(&(&b.job_type, &b.worker)));
    let count = |n: Option<u64>| n.map_or_else(|| "-".into(), |n| n.to_string());
    let rows: Vec<Vec<String>> = limits
        .iter()
        .map(|l| {
            vec![
                l.job_type.clone(),
                l.worker.clone(),
                count(l.limits.max_in_flight),
                count(l.limits.fleet_max.map(u64::from)),
                rate_of(&l.limits),
            ]
        })
        .collect();
    let header = ["TYPE", "WORKER", "MAX IN FLIGHT", "FLEET MAX", "RATE"];
    format!(
        "\nlimits per type (each worker's last report):\n{}",
        table(&header, &rows)
    )
}

/// `5/1s`, `300/60s`, `2/500ms`; `-` without a rate.
pub fn rate_of(l: &ReportedLimits) -> String {
    match (l.rate, l.rate_per_ms) {
        (Some(n), Some(ms)) if ms % 1000 == 0 => format!("{n}/{}s", ms / 1000),
        (Some(n), Some(ms)) => format!("{n}/{ms}ms"),
        _ => "-".into(),
    }
}

/// `type:0,2 other:1`: a worker's partitions, by type.
pub fn partitions_of(owned: &[PartitionOwner]) -> String {
    let mut by_type: Vec<(&str, Vec<String>)> = Vec::new();
    for p in owned {
        match by_type.iter_mut().find(|(t, _)| *t == p.job_type) {
            Some((_, ps)) => ps.push(p.partition.to_string()),
            None => by_type.push((&p.job_type, vec![p.partition.to_string()])),
        }
    }
    if by_type.is_empty() {
        return "-".into();
    }
    let each: Vec<String> = by_type
        .iter()
        .map(|(t, ps)| format!("{t}:{}", ps.join(",")))
        .collect();
    each.join(" ")
}

/// Partition mode: each partition's owner (its last claim), since when.
fn owners_table(views: &[WorkerView]) -> String {
    let mut owners: Vec<(&PartitionOwner, &str)> = views
        .iter()
        .flat_map(|v| {
            let health = v.seen.health.as_deref().unwrap_or("-");
            v.partitions.iter().map(move |p| (p, health))
        })
        .collect();
    if owners.is_empty() {
        return String::new();
    }
    owners.sort_by(|a, b| (&a.0.job_type, a.0.partition).cmp(&(&b.0.job_type, b.0.partition)));
    let rows: Vec<Vec<String>> = owners
        .iter()
        .map(|(p, health)| {
            vec![
                p.job_type.clone(),
                p.partition.to_string(),
                p.worker.clone(),
                p.token.to_string(),
                time(&p.since),
                (*health).to_string(),
            ]
        })
        .collect();
    let header = ["TYPE", "PARTITION", "OWNER", "TOKEN", "SINCE", "HEALTH"];
    format!(
        "\npartition owners (each partition's last claim):\n{}",
        table(&header, &rows)
    )
}

pub fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string()
}

/// Left-aligned columns, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
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

pub fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        flat
    } else {
        flat.chars().take(max.saturating_sub(1)).collect::<String>() + "…"
    }
}

pub fn jobs_table(views: &[JobView]) -> String {
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

pub fn job_detail(v: &JobView) -> String {
    let fields = [
        ("id", v.id.clone()),
        ("type", v.job_type.clone()),
        ("status", v.status.clone()),
        ("fence", v.fence.to_string()),
        ("step", v.step.to_string()),
        ("takeovers", v.takeovers.to_string()),
        ("attempts", v.attempts.to_string()),
        ("priority", v.priority.to_string()),
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

/// `tenure paused`: the paused job types.
pub fn paused_table(views: &[PausedView]) -> String {
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            vec![
                v.job_type.clone(),
                time(&v.paused_at),
                v.paused_by.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let mut out = table(&["TYPE", "PAUSED AT", "BY"], &rows);
    out.push_str(&format!("({} paused)\n", views.len()));
    out
}

pub fn dlq_table(views: &[DeadLetterView]) -> String {
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

pub fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "w".into()]],
        );
        assert_eq!(t, "A    BB\nxxx  y\nz    w\n");
    }
}
