//! The HTML pages, rendered with `maud`: every `(value)` in a template is
//! HTML-escaped (a unit test below checks it with a hostile job type), and no
//! page uses `PreEscaped` for data. The script (`APP_JS`) only sets
//! `textContent`.

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};
use tenure::blocks::fence::{JobEvent, LimitsSeen, PartitionOwner};

use crate::data::{
    DeadLetterView, JobDetail, JobView, JobsPage, OverviewView, PausedView, ScheduleView,
    SchedulesView, WorkerView,
};

/// The page's view of the session: whether actions are offered, and their token.
#[derive(Debug, Clone, Default)]
pub struct Viewer {
    /// The server has an operator token.
    pub operator_mode: bool,
    /// This browser holds an operator's session: its CSRF token.
    pub csrf: Option<String>,
    /// This browser holds a session (an operator's or a reader's).
    pub logged_in: bool,
    /// The server has a token to log in with (operator or read token).
    pub login: bool,
}

impl Viewer {
    /// The login page's view before logging in.
    pub fn login() -> Self {
        Viewer {
            login: true,
            ..Viewer::default()
        }
    }
}

/// The filters of the job list as given (echoed into the form).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct JobsQuery {
    #[serde(rename = "type")]
    pub job_type: Option<String>,
    pub status: Option<String>,
    pub age: Option<String>,
    pub takeovers: Option<String>,
    pub after: Option<String>,
    pub limit: Option<String>,
}

/// The style sheet, served as `/app.css` (the content policy allows no inline style).
pub const CSS: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}\
header{background:#1d2330;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.2rem;align-items:center}\
header a{color:#cfe0ff;text-decoration:none}header .who{margin-left:auto;font-size:.85rem}\
main{padding:1rem 1.2rem}table{border-collapse:collapse;background:#fff;margin:.5rem 0 1.2rem}\
td,th{border:1px solid #d8dce3;padding:.3rem .5rem;text-align:left;font-size:.9rem;vertical-align:top}\
th{background:#eef1f5}.cards{display:flex;flex-wrap:wrap;gap:.8rem}.card{background:#fff;border:1px solid #d8dce3;\
padding:.6rem 1rem;min-width:8rem}.card b{display:block;font-size:1.5rem}.s-dead,.k-stale_refused,.k-dead{color:#b3261e}\
.s-done,.k-done{color:#1e7b34}.k-taken_over{color:#9a5b00;font-weight:bold}pre{margin:0;white-space:pre-wrap;max-width:40rem}\
form.inline{display:inline}.note{color:#5a6372;font-size:.85rem}.flash{background:#fff7d6;padding:.5rem;border:1px solid #e6d48a}";

/// The progressive script: live counts over server-sent events.
pub const APP_JS: &str = r#"(function () {
  var root = document.querySelector('[data-live]');
  if (!root || !window.EventSource) return;
  var src = new EventSource(root.getAttribute('data-live'));
  src.addEventListener('overview', function (e) {
    var d = JSON.parse(e.data);
    document.querySelectorAll('[data-k]').forEach(function (el) {
      var v = d;
      el.getAttribute('data-k').split('.').forEach(function (p) { v = (v == null) ? v : v[p]; });
      if (v === undefined || v === null) return;
      el.textContent = el.hasAttribute('data-f3') ? Number(v).toFixed(3) : String(v);
    });
    var t = document.getElementById('updated');
    if (t) t.textContent = new Date().toISOString();
  });
})();"#;

fn layout(title: &str, viewer: &Viewer, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · tenure" }
                link rel="stylesheet" href="/app.css";
            }
            body {
                header {
                    strong { "tenure" }
                    a href="/" { "Overview" }
                    a href="/jobs" { "Jobs" }
                    a href="/dlq" { "DLQ" }
                    a href="/workers" { "Workers" }
                    a href="/schedules" { "Schedules" }
                    span.who {
                        @if viewer.logged_in {
                            @if viewer.csrf.is_some() { "operator · " } @else { "reader · " }
                            form.inline method="post" action="/logout" { button { "Log out" } }
                        } @else if viewer.login {
                            a href="/login" { "Log in to act" }
                        } @else {
                            "read-only"
                        }
                    }
                }
                main { h1 { (title) } (body) }
                script src="/app.js" {}
            }
        }
    }
}

pub(super) fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string()
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn card(label: &str, key: &str, value: String) -> Markup {
    html! { div.card { span { (label) } b id={ "ov-" (key.replace('.', "-")) } data-k=(key) { (value) } } }
}

/// What the overview page shows.
pub struct Overview<'a> {
    pub view: &'a OverviewView,
    /// How old the counts are (zero: counted for this request).
    pub age: std::time::Duration,
    pub paused: &'a [PausedView],
    /// What the last action did.
    pub flash: Option<&'a str>,
}

pub fn overview(o: &Overview<'_>, viewer: &Viewer) -> Markup {
    let (v, age) = (o.view, o.age);
    let r = &v.rows.recent;
    let body = html! {
        @if let Some(f) = o.flash { p.flash #flash { (f) } }
        @if !age.is_zero() {
            p.note #counted-ago { "Counts from " (age.as_secs()) " s ago: on a table this large they are counted in the background, once per refresh." }
        }
        div data-live="/events/overview" {
            div.cards {
                (card("pending", "pending", v.pending.to_string()))
                (card("running", "running", v.running.to_string()))
                (card("done", "done", v.done.to_string()))
                (card("dead", "dead", v.dead.to_string()))
                (card("cancelled", "cancelled", v.cancelled.to_string()))
                (card("total", "total", v.total.to_string()))
                (card("DLQ size", "dlq_size", v.dlq_size.to_string()))
            }
            h2 { "Last " (r.window_secs / 60) " minutes" }
            div.cards {
                (card("finished", "recent.done", r.done.to_string()))
                (card("died", "recent.dead", r.dead.to_string()))
                (card("failed attempts", "recent.failed", r.failed.to_string()))
                (card("step commits", "recent.steps", r.steps.to_string()))
                (card("takeovers", "recent.takeovers", r.takeovers.to_string()))
                (card("stale rejections", "recent.stale_refusals", r.stale_refusals.to_string()))
                div.card { span { "done / min" } b id="ov-throughput" data-k="throughput_per_min" data-f3 { (format!("{:.3}", v.throughput_per_min)) } }
                div.card { span { "failure rate" } b id="ov-failure-rate" data-k="failure_rate" data-f3 { (format!("{:.3}", v.failure_rate)) } }
                (card("stale rejections, all time", "stale_refusals_total", v.rows.stale_refusals_total.to_string()))
            }
            p.note { "Live: updated over server-sent events; last update " span #updated { "at page load" } "." }
            h2 { "Jobs per type and status" }
            table #by-type {
                tr { th { "type" } th { "status" } th { "jobs" } th { "takeovers" } }
                @for c in &v.rows.by_type_status {
                    tr {
                        td { a href={ "/jobs?type=" (urlencode(&c.job_type)) } { (c.job_type) } }
                        td class={ "s-" (c.status) } { (c.status) }
                        td { (c.count) } td { (c.takeovers) }
                    }
                }
            }
            p.note { "Worker lease health is not shown here: see Workers for what is known." }
        }
        (paused_types(o.paused, viewer))
    };
    layout("Overview", viewer, body)
}

/// The paused job types, each with its resume button, and the pause form
/// (operator mode).
fn paused_types(paused: &[PausedView], viewer: &Viewer) -> Markup {
    html! {
        h2 { "Paused job types" }
        @if paused.is_empty() { p #paused-none { "None: every type runs." } }
        @else {
            table #paused {
                tr { th { "type" } th { "paused at" } th { "by" } th {} }
                @for p in paused {
                    tr {
                        td { (p.job_type) } td { (time(&p.paused_at)) } td { (opt(p.paused_by.as_deref())) }
                        td { (type_button(viewer, "/types/resume", "resume", &p.job_type, "Resume")) }
                    }
                }
            }
        }
        @if let Some(csrf) = &viewer.csrf {
            form.inline.pause method="post" action="/types/pause" {
                input type="hidden" name="csrf" value=(csrf);
                input type="text" name="job_type" placeholder="job type" maxlength="200";
                button.pause { "Pause" }
            }
        }
        p.note { "A paused type's messages stay in the stream; its running jobs finish their current step and wait before the next; nothing is dead-lettered or counted as a delivery. Seen by every worker within about half a second." }
    }
}

fn type_button(viewer: &Viewer, action: &str, class: &str, job_type: &str, label: &str) -> Markup {
    html! {
        @if let Some(csrf) = &viewer.csrf {
            form.inline method="post" action=(action) {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="job_type" value=(job_type);
                button class=(class) data-type=(job_type) { (label) }
            }
        }
    }
}

/// Percent-encodes everything but unreserved characters (for query values).
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn job_rows(jobs: &[JobView]) -> Markup {
    html! {
        table #jobs {
            tr { th { "id" } th { "type" } th { "status" } th { "step" } th { "fence" }
                 th { "takeovers" } th { "attempts" } th { "created" } th { "last error" } }
            @for j in jobs {
                tr {
                    td { a href={ "/jobs/" (j.id) } { (j.id) } }
                    td { (j.job_type) } td class={ "s-" (j.status) } {
                        (j.status)
                        @if let Some(why) = &j.waiting { " " small.waiting { "(" (why) ")" } }
                    }
                    td { (j.step) } td { (j.fence) } td { (j.takeovers) } td { (j.attempts) }
                    td { (time(&j.created_at)) } td { (opt(j.last_error.as_deref())) }
                }
            }
        }
    }
}

pub fn jobs(page: &JobsPage, q: &JobsQuery, viewer: &Viewer) -> Markup {
    let val = |o: &Option<String>| o.clone().unwrap_or_default();
    let next_href = page.next.as_ref().map(|n| {
        let mut href = String::from("/jobs?");
        for (k, v) in [
            ("type", &q.job_type),
            ("status", &q.status),
            ("age", &q.age),
            ("takeovers", &q.takeovers),
            ("limit", &q.limit),
        ] {
            if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
                href.push_str(&format!("{k}={}&", urlencode(v)));
            }
        }
        href + "after=" + &urlencode(n)
    });
    let body = html! {
        form #filters method="get" action="/jobs" {
            label { "type " input name="type" value=(val(&q.job_type)); } " "
            label { "status " select name="status" {
                @for s in ["", "pending", "running", "done", "dead", "cancelled"] {
                    option value=(s) selected[q.status.as_deref() == Some(s)] { (if s.is_empty() { "any" } else { s }) }
                }
            } } " "
            label { "created within " input name="age" size="5" placeholder="e.g. 30m, 2h, 7d" value=(val(&q.age)); } " "
            label { input type="checkbox" name="takeovers" value="on" checked[q.takeovers.is_some()]; " has takeovers" } " "
            button { "Filter" }
        }
        (job_rows(&page.jobs))
        @if let Some(href) = next_href { a #next href=(href) { "Next page →" } }
        @else { p.note { "End of the list." } }
    };
    layout("Jobs", viewer, body)
}

fn event_row(e: &JobEvent) -> Markup {
    let detail = e.detail.as_ref().map(|d| match d {
        serde_json::Value::String(s) => s.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    });
    html! {
        tr class={ "k-" (e.kind) } {
            td { (time(&e.at)) } td { (e.kind) } td { (opt(e.step)) }
            td.worker { (opt(e.worker.as_deref())) } td.token { (opt(e.token)) } td { (opt(e.other_token)) }
            td { (opt(e.attempts)) } td { (opt(e.takeovers)) }
            td { @if let Some(d) = detail { pre { (d) } } }
        }
    }
}

pub fn job(d: &JobDetail, flash: Option<&str>, viewer: &Viewer) -> Markup {
    let j = &d.job;
    let owners: Vec<&str> = {
        let mut o: Vec<&str> = d
            .events
            .iter()
            .filter(|e| e.kind == "claimed" || e.kind == "taken_over")
            .filter_map(|e| e.worker.as_deref())
            .collect();
        o.dedup();
        o
    };
    let body = html! {
        @if let Some(f) = flash { p.flash #flash { (f) } }
        table #job {
            tr { th { "type" } td { (j.job_type) } th { "status" } td #status class={ "s-" (j.status) } { (j.status) } }
            tr { th { "fence" } td { (j.fence) } th { "step" } td { (j.step) } }
            tr { th { "takeovers" } td #takeovers { (j.takeovers) } th { "attempts" } td { (j.attempts) } }
            tr { th { "created" } td { (time(&j.created_at)) } th { "updated" } td { (time(&j.updated_at)) } }
            tr { th { "priority" } td #priority colspan="3" { (j.priority) } }
            tr { th { "owners" } td #owners colspan="3" { (owners.join(" → ")) } }
            tr { th { "last error" } td colspan="3" { (opt(j.last_error.as_deref())) } }
            tr { th { "steps" } td #step-names colspan="3" { (opt(d.step_names.as_ref().map(|n| n.join(" → ")))) } }
            @if let Some(since) = &d.incompatible_since {
                tr { th { "no fitting worker since" } td #incompatible colspan="3" { (time(since)) } }
            }
            @if j.status == "cancelled" {
                tr { th { "cancelled" } td #cancel-reason colspan="3" { (opt(j.cancel_reason.as_deref())) } }
            }
            @if let Some(at) = &j.run_at {
                tr { th { "run at" } td #run-at colspan="3" { (time(at)) @if j.awaiting_publish { " (delayed: not published yet)" } } }
            }
        }
        @if j.status == "dead" { (redrive_button(viewer, &j.id)) }
        @if matches!(j.status.as_str(), "pending" | "running" | "dead") { (cancel_form(viewer, &j.id)) }
        @if j.status == "pending" && j.awaiting_publish { (reschedule_form(viewer, &j.id)) }
        @if j.status == "pending" && !j.awaiting_publish && j.attempts > 0 { (retry_now_button(viewer, &j.id)) }
        h2 { "Owners over time" }
        p.note { "Each bar: one owner, from its claim to its release, the job's end or the next owner's claim. Marks: a green dot, a step committed; an orange dot, an attempt failed; a red cross, a write under that token refused by the fence." }
        (super::timeline::ownership(&d.events))
        h2 { "Timeline" }
        p.note { "step: the step that committed, under that token; stale_refused: a write under an older token that the fence refused (other token = the fence that won)." }
        table #timeline {
            tr { th { "at" } th { "event" } th { "step" } th { "worker" } th { "token" } th { "other token" } th { "attempts" } th { "takeovers" } th { "checkpoint / detail" } }
            @for e in &d.events { (event_row(e)) }
        }
        h2 { "Checkpoint" }
        pre #checkpoint { (opt(d.checkpoint.as_ref().map(|c| serde_json::to_string_pretty(c).unwrap_or_default()))) }
        h2 { "DLQ entries" }
        (dlq_rows(&d.dead_letters, viewer))
    };
    layout(&format!("Job {}", j.id), viewer, body)
}

fn redrive_button(viewer: &Viewer, job_id: &str) -> Markup {
    html! {
        @if let Some(csrf) = &viewer.csrf {
            form.inline method="post" action="/dlq/redrive" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="job_id" value=(job_id);
                button.redrive data-job=(job_id) { "Redrive" }
            }
        }
    }
}

/// Retry now: a job waiting in retry backoff starts at once (one more
/// message, locked and claimed as any other).
fn retry_now_button(viewer: &Viewer, job_id: &str) -> Markup {
    html! {
        @if let Some(csrf) = &viewer.csrf {
            form.inline.retry-now method="post" action="/jobs/retry-now" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="job_id" value=(job_id);
                button.retry-now data-job=(job_id) { "Retry now" }
            }
        }
    }
}

/// Reschedule a delayed job: a time (RFC 3339) or a delay from now (`90s`);
/// both empty: now.
fn reschedule_form(viewer: &Viewer, job_id: &str) -> Markup {
    html! {
        @if let Some(csrf) = &viewer.csrf {
            form.inline.reschedule method="post" action="/jobs/reschedule" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="job_id" value=(job_id);
                input type="text" name="at" placeholder="at: 2026-12-24T18:00:00Z" maxlength="64";
                input type="text" name="after" placeholder="or after: 90s, 30m" maxlength="16";
                button.reschedule data-job=(job_id) { "Reschedule" }
            }
        }
    }
}

/// Cancel (pending, running or dead: a dead job leaves the DLQ for good),
/// with an optional reason.
fn cancel_form(viewer: &Viewer, job_id: &str) -> Markup {
    html! {
        @if let Some(csrf) = &viewer.csrf {
            form.inline.cancel method="post" action="/jobs/cancel" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="job_id" value=(job_id);
                input type="text" name="reason" placeholder="reason" maxlength="1000";
                button.cancel data-job=(job_id) { "Cancel" }
            }
        }
    }
}

fn dlq_rows(entries: &[DeadLetterView], viewer: &Viewer) -> Markup {
    html! {
        table.dlq {
            tr { th { "seq" } th { "job" } th { "type" } th { "reason" } th { "deliveries" } th { "attempts" } th { "takeovers" } th { "last token" } th {} }
            @for e in entries {
                tr {
                    td { (e.dlq_sequence) }
                    td { @if let Some(id) = &e.job_id { a href={ "/jobs/" (id) } { (id) } } @else { "-" } }
                    td { (opt(e.job_type.as_deref())) } td { (e.reason) }
                    td { (opt(e.deliveries)) } td { (opt(e.attempts)) } td { (opt(e.takeovers)) } td { (opt(e.last_token)) }
                    td { @if let Some(id) = &e.job_id { (redrive_button(viewer, id)) (cancel_form(viewer, id)) } }
                }
            }
        }
    }
}

pub fn dlq(entries: &[DeadLetterView], flash: Option<&str>, viewer: &Viewer) -> Markup {
    let mut groups: Vec<(&str, usize)> = Vec::new();
    for e in entries {
        match groups.iter_mut().find(|(c, _)| *c == e.reason_code()) {
            Some((_, n)) => *n += 1,
            None => groups.push((e.reason_code(), 1)),
        }
    }
    let body = html! {
        @if let Some(f) = flash { p.flash #flash { (f) } }
        @if !viewer.operator_mode { p.note { "Read-only: start `tenure serve` with --operator-token-file (or TENURE_OPERATOR_TOKEN) to redrive or cancel." } }
        p.note { "Cancel gives a dead job up: its row becomes cancelled and its entries leave the DLQ; it is never redriven." }
        h2 { "By reason" }
        table #reasons {
            tr { th { "reason" } th { "entries" } th {} }
            @for (code, n) in &groups {
                tr {
                    td { (code) } td { (n) }
                    td { @if let Some(csrf) = &viewer.csrf {
                        form.inline method="post" action="/dlq/redrive-reason" {
                            input type="hidden" name="csrf" value=(csrf);
                            input type="hidden" name="reason" value=(code);
                            button { "Redrive all" }
                        }
                    } }
                }
            }
        }
        h2 { "Entries" }
        (dlq_rows(entries, viewer))
    };
    layout("Dead-letter queue", viewer, body)
}

pub fn workers(ws: &[WorkerView], viewer: &Viewer) -> Markup {
    let body = html! {
        p.note { "From PostgreSQL: each worker's own report (its session lease and the lease's health, on every health change and every half TTL; "
                 "silent: no report for three TTLs), the job history of the last hour and the connections open now (application_name = worker id). "
                 "The fence never depends on these: a worker's word about itself is for operators only." }
        table #workers {
            tr { th { "worker" } th { "health" } th { "lease" } th { "reported" } th { "last event" } th { "claims" } th { "step commits" } th { "stale refusals" } th { "jobs in flight" } th { "connections" } th { "partitions" } }
            @for v in ws {
                @let w = &v.seen;
                tr class=(format!("h-{}", w.health.as_deref().unwrap_or("none"))) data-worker=(w.worker) {
                    td { (w.worker) } td.health { (opt(w.health.as_deref())) }
                    td { (opt(w.lease_id.map(|l| format!("{l:x}")))) }
                    td { (opt(w.reported_at.as_ref().map(time))) }
                    td { (opt(w.last_event_at.as_ref().map(time))) }
                    td { (w.claims) } td { (w.steps) } td { (w.stale_refusals) } td { (w.jobs_in_flight) } td { (w.connections) }
                    td.partitions { (crate::render::partitions_of(&v.partitions)) }
                }
            }
        }
        (partition_owners(ws))
        (type_limits(ws))
    };
    layout("Workers", viewer, body)
}

/// Each worker's limits for each type that has some, as its last report
/// says (the fleet limit itself is kept in etcd).
fn type_limits(ws: &[WorkerView]) -> Markup {
    let mut limits: Vec<&LimitsSeen> = ws.iter().flat_map(|v| &v.limits).collect();
    limits.sort_by(|a, b| (&a.job_type, &a.worker).cmp(&(&b.job_type, &b.worker)));
    html! {
        @if !limits.is_empty() {
            h2 { "Limits per type" }
            p.note { "Each worker's own limits for the type, from its last report: max in flight (this worker), fleet max (all workers together, kept in etcd), rate (deliveries this worker takes per period)." }
            table #type-limits {
                tr { th { "type" } th { "worker" } th { "max in flight" } th { "fleet max" } th { "rate" } }
                @for l in &limits {
                    tr data-type=(l.job_type) data-worker=(l.worker) {
                        td { (l.job_type) } td { (l.worker) }
                        td.max-in-flight { (opt(l.limits.max_in_flight)) }
                        td.fleet-max { (opt(l.limits.fleet_max)) }
                        td.rate { (crate::render::rate_of(&l.limits)) }
                    }
                }
            }
        }
    }
}

/// Partition mode: which worker owns which partition of which type, since
/// when (each partition's last claim, with its token).
fn partition_owners(ws: &[WorkerView]) -> Markup {
    let mut owners: Vec<(&PartitionOwner, Option<&str>)> = ws
        .iter()
        .flat_map(|v| v.partitions.iter().map(|p| (p, v.seen.health.as_deref())))
        .collect();
    owners.sort_by(|a, b| (&a.0.job_type, a.0.partition).cmp(&(&b.0.job_type, b.0.partition)));
    html! {
        @if !owners.is_empty() {
            h2 { "Partition owners" }
            p.note { "Each partition's last claim as PostgreSQL recorded it: its owner, unless that worker gave it up since and none claimed it (etcd's election key is the authority)." }
            table #partition-owners {
                tr { th { "type" } th { "partition" } th { "owner" } th { "token" } th { "since" } th { "owner's health" } }
                @for (p, health) in &owners {
                    tr data-type=(p.job_type) data-partition=(p.partition) {
                        td { (p.job_type) } td { (p.partition) } td.owner { (p.worker) }
                        td { (p.token) } td { (time(&p.since)) } td { (opt(*health)) }
                    }
                }
            }
        }
    }
}

/// What the schedules page shows.
pub struct Schedules<'a> {
    pub view: &'a SchedulesView,
    /// What the last action did.
    pub flash: Option<&'a str>,
    /// The id every Trigger form of this rendering carries: the same form
    /// submitted twice is one job.
    pub trigger_id: &'a str,
}

pub fn schedules(s: &Schedules<'_>, viewer: &Viewer) -> Markup {
    let body = html! {
        @if let Some(f) = s.flash { p.flash #flash { (f) } }
        p #leader {
            @match &s.view.leader {
                Some(l) => { "Scheduler leader: " b { (l.worker) } " (token " (l.token) ", since " (time(&l.since)) ")" }
                None => { "Scheduler leader: none yet" }
            }
        }
        table #schedules {
            tr { th { "name" } th { "type" } th { "cron" } th { "zone" } th { "missed" } th { "last tick" } th { "next tick" } th { "enqueued" } th { "skipped" } th { "paused" } th {} }
            @for r in &s.view.schedules { (schedule_row(r, s.trigger_id, viewer)) }
        }
        p.note { "A paused schedule enqueues no tick from the moment the pause is committed (the scheduler leader's tick write is refused with it) and counts its ticks as skipped; on resume, the ticks that came while it was paused are skipped, whatever its missed-ticks policy. Trigger enqueues one job now with the schedule's type and input; the same form sent twice is one job. A paused schedule can be triggered." }
    };
    layout("Schedules", viewer, body)
}

fn schedule_row(r: &ScheduleView, trigger_id: &str, viewer: &Viewer) -> Markup {
    let paused = r
        .paused_at
        .as_ref()
        .map_or_else(|| "no".to_string(), |t| format!("since {}", time(t)));
    html! {
        tr data-schedule=(r.name) {
            td { (r.name) } td { (r.job_type) } td { code { (r.expr) } } td { (r.time_zone) } td { (r.missed) }
            td { (opt(r.last_tick.as_ref().map(time))) } td { (opt(r.next_tick.as_ref().map(time))) }
            td { (r.enqueued) } td { (r.skipped) }
            td.paused { (paused) @if let Some(by) = &r.paused_by { " by " (by) } }
            td {
                @if let Some(csrf) = &viewer.csrf {
                    @if r.paused_at.is_some() {
                        (schedule_button(csrf, "resume", &r.name, "Resume"))
                    } @else {
                        (schedule_button(csrf, "pause", &r.name, "Pause"))
                    }
                    " "
                    form.inline.trigger method="post" action="/schedules/trigger" {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="schedule" value=(r.name);
                        input type="hidden" name="trigger_id" value=(trigger_id);
                        button.trigger data-schedule=(r.name) { "Trigger" }
                    }
                }
            }
        }
    }
}

fn schedule_button(csrf: &str, action: &str, name: &str, label: &str) -> Markup {
    html! {
        form.inline method="post" action={ "/schedules/" (action) } {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="schedule" value=(name);
            button class=(action) data-schedule=(name) { (label) }
        }
    }
}

pub fn login(error: Option<&str>, viewer: &Viewer) -> Markup {
    let body = html! {
        @if let Some(e) = error { p.flash #flash { (e) } }
        @if viewer.login {
            form #login method="post" action="/login" {
                label { "token " input type="password" name="token" autocomplete="off"; }
                " " button { "Log in" }
            }
        } @else { p { "This server is read-only: it was started without an operator or read token." } }
    };
    layout("Log in", viewer, body)
}

pub fn error(status: u16, message: &str) -> Markup {
    layout(
        &format!("Error {status}"),
        &Viewer::default(),
        html! { p #error { (message) } },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::JobsPage;

    #[test]
    fn data_is_html_escaped() {
        let evil = "<script>alert('x')</script>&\"";
        let view = JobView {
            id: "i".into(),
            job_type: evil.into(),
            status: "done".into(),
            fence: 1,
            step: 1,
            takeovers: 0,
            attempts: 0,
            released: false,
            last_error: Some(evil.into()),
            cancel_reason: Some(evil.into()),
            created_at: Utc::now(),
            updated_at: Utc::now(),
            waiting: None,
            run_at: None,
            awaiting_publish: false,
            priority: tenure::Priority::Normal,
        };
        let page = JobsPage {
            jobs: vec![view],
            next: None,
        };
        let q = JobsQuery {
            job_type: Some(evil.into()),
            ..JobsQuery::default()
        };
        let html = jobs(&page, &q, &Viewer::default()).into_string();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert('x')&lt;/script&gt;&amp;&quot;"),
            "{html}"
        );
        assert_eq!(urlencode("a b&<"), "a%20b%26%3C");
    }
}
