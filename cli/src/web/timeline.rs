//! The job page's ownership picture: one bar per owner (from its claim to
//! its release, its job's end or the next owner's claim), labelled with its
//! worker and token; step commits and refused stale writes are marks on the
//! bar of the token they carried. Inline SVG, drawn from the job's history
//! alone (pure: no server is read here).

use chrono::{DateTime, Utc};
use maud::{Markup, html};
use tenure::blocks::fence::JobEvent;

/// Left column (labels) and drawing width, lane height, in SVG units.
const LABEL: f64 = 170.0;
const WIDTH: f64 = 720.0;
const LANE: f64 = 30.0;

/// One owner's time with the job.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub worker: String,
    pub token: i64,
    pub start: DateTime<Utc>,
    /// `None`: it still owns the job (as far as the history says).
    pub end: Option<DateTime<Utc>>,
}

/// Something that happened under a token.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub kind: MarkKind,
    pub token: i64,
    pub at: DateTime<Utc>,
    pub step: Option<i32>,
    pub worker: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// A step committed under the token.
    Commit,
    /// A write under the token was refused: a newer owner had claimed.
    Refused,
    /// An attempt failed under the token.
    Failed,
}

impl MarkKind {
    fn class(self) -> &'static str {
        match self {
            MarkKind::Commit => "commit",
            MarkKind::Refused => "refused",
            MarkKind::Failed => "failed",
        }
    }
}

/// The owners' spans and the marks, from the history (oldest first).
pub fn spans_and_marks(events: &[JobEvent]) -> (Vec<Span>, Vec<Mark>) {
    let (mut spans, mut marks) = (Vec::<Span>::new(), Vec::new());
    for e in events {
        let open = spans.last_mut().filter(|s| s.end.is_none());
        match (e.kind.as_str(), e.token) {
            ("claimed" | "taken_over", Some(token)) => {
                if let Some(s) = open {
                    s.end = Some(e.at);
                }
                spans.push(Span {
                    worker: e.worker.clone().unwrap_or_else(|| "?".into()),
                    token,
                    start: e.at,
                    end: None,
                });
            }
            ("released" | "done" | "dead" | "cancelled", _) => {
                if let Some(s) = open {
                    s.end = Some(e.at);
                }
            }
            (kind, Some(token)) => {
                let kind = match kind {
                    "step" => MarkKind::Commit,
                    "stale_refused" => MarkKind::Refused,
                    "failed" => MarkKind::Failed,
                    _ => continue,
                };
                marks.push(Mark {
                    kind,
                    token,
                    at: e.at,
                    step: e.step,
                    worker: e.worker.clone(),
                });
            }
            _ => {}
        }
    }
    (spans, marks)
}

/// The lane of a mark: the span of its token that covers its time, else the
/// last span of its token.
fn lane_of(spans: &[Span], m: &Mark) -> Option<usize> {
    let covers = |s: &Span| s.start <= m.at && s.end.is_none_or(|end| m.at <= end);
    spans
        .iter()
        .position(|s| s.token == m.token && covers(s))
        .or_else(|| spans.iter().rposition(|s| s.token == m.token))
}

/// The picture, or a note when the history has no claim.
pub fn ownership(events: &[JobEvent]) -> Markup {
    let (spans, marks) = spans_and_marks(events);
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return html! { p.note #ownership-none { "No history: nothing to draw." } };
    };
    if spans.is_empty() {
        return html! { p.note #ownership-none { "No owner yet: the job was never claimed." } };
    }
    let scale = Scale::new(first.at, last.at);
    let height = LANE * spans.len() as f64 + 24.0;
    html! {
        svg #ownership xmlns="http://www.w3.org/2000/svg" width=(LABEL + WIDTH + 20.0) height=(height)
            viewBox=(format!("0 0 {} {height}", LABEL + WIDTH + 20.0)) role="img"
            aria-label="the job's owners over time" {
            @for (i, s) in spans.iter().enumerate() { (bar(&scale, i, s, last.at)) }
            @for m in &marks {
                @if let Some(i) = lane_of(&spans, m) { (mark(&scale, i, m, &spans[i].worker)) }
            }
            (axis(&scale, height - 6.0))
        }
    }
}

fn bar(scale: &Scale, lane: usize, s: &Span, last: DateTime<Utc>) -> Markup {
    let y = LANE * lane as f64 + 4.0;
    let (x0, x1) = (scale.x(s.start), scale.x(s.end.unwrap_or(last)));
    let class = if s.end.is_none() {
        "owner open"
    } else {
        "owner"
    };
    html! {
        text x="4" y=(y + 15.0) font-size="12" { (s.worker) " · token " (s.token) }
        rect class=(class) data-worker=(s.worker) data-token=(s.token) x=(x0) y=(y)
            width=((x1 - x0).max(3.0)) height=(LANE - 10.0) rx="3" fill="#9cc3e6" stroke="#3b6f9e" {
            title { (s.worker) " owned the job under token " (s.token) }
        }
    }
}

fn mark(scale: &Scale, lane: usize, m: &Mark, owner: &str) -> Markup {
    let (x, y) = (scale.x(m.at), LANE * lane as f64 + 4.0);
    let step = m.step.map(|s| format!(" step {s}")).unwrap_or_default();
    let what = match m.kind {
        MarkKind::Commit => format!("{step} committed under token {}", m.token),
        MarkKind::Refused => format!("a write{step} under token {} refused", m.token),
        MarkKind::Failed => format!("an attempt{step} failed under token {}", m.token),
    };
    let (color, mid) = match m.kind {
        MarkKind::Commit => ("#1c7c3c", y + (LANE - 10.0) / 2.0),
        MarkKind::Refused => ("#c0392b", y + (LANE - 10.0) / 2.0),
        MarkKind::Failed => ("#d68910", y + (LANE - 10.0) / 2.0),
    };
    html! {
        g class=(m.kind.class()) data-worker=(owner) data-token=(m.token) {
            title { (what.trim_start()) " (" (super::pages::time(&m.at)) ")" }
            @match m.kind {
                MarkKind::Refused => {
                    line x1=(x - 6.0) y1=(mid - 6.0) x2=(x + 6.0) y2=(mid + 6.0) stroke=(color) stroke-width="3" {}
                    line x1=(x - 6.0) y1=(mid + 6.0) x2=(x + 6.0) y2=(mid - 6.0) stroke=(color) stroke-width="3" {}
                }
                _ => { circle cx=(x) cy=(mid) r="5" fill=(color) {} }
            }
        }
    }
}

fn axis(scale: &Scale, y: f64) -> Markup {
    html! {
        text x=(LABEL) y=(y) font-size="11" fill="#5a6372" { (super::pages::time(&scale.t0)) }
        text x=(LABEL + WIDTH) y=(y) font-size="11" fill="#5a6372" text-anchor="end" {
            "+" (format!("{:.3}", scale.span_ms / 1000.0)) " s"
        }
    }
}

/// Time to x.
struct Scale {
    t0: DateTime<Utc>,
    span_ms: f64,
}

impl Scale {
    fn new(t0: DateTime<Utc>, t1: DateTime<Utc>) -> Self {
        let span_ms = (t1 - t0).num_microseconds().unwrap_or(0) as f64 / 1000.0;
        Scale {
            t0,
            span_ms: span_ms.max(1.0),
        }
    }

    fn x(&self, at: DateTime<Utc>) -> f64 {
        let ms = (at - self.t0).num_microseconds().unwrap_or(0) as f64 / 1000.0;
        LABEL + (ms / self.span_ms).clamp(0.0, 1.0) * WIDTH
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ms: i64, kind: &str, token: i64, worker: &str, step: Option<i32>) -> JobEvent {
        JobEvent {
            seq: Some(ms),
            at: DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap_or_default(),
            kind: kind.into(),
            token: Some(token),
            other_token: None,
            step,
            worker: Some(worker.into()),
            attempts: None,
            takeovers: None,
            detail: None,
        }
    }

    /// A commits step 0, B takes over and finishes, A's late write is
    /// refused: two bars, the refusal on A's, the commits on each owner's.
    #[test]
    fn a_takeover_draws_two_owners_and_the_refusal_on_the_stale_one() {
        let events = [
            ev(0, "enqueued", 0, "producer", Some(0)),
            ev(10, "claimed", 5, "A", Some(0)),
            ev(20, "step", 5, "A", Some(0)),
            ev(3000, "taken_over", 9, "B", Some(1)),
            ev(3010, "step", 9, "B", Some(1)),
            ev(3020, "step", 9, "B", Some(2)),
            ev(3021, "done", 9, "B", Some(3)),
            ev(5000, "stale_refused", 5, "A", Some(1)),
        ];
        let (spans, marks) = spans_and_marks(&events);
        let owners: Vec<(&str, i64, bool)> = spans
            .iter()
            .map(|s| (s.worker.as_str(), s.token, s.end.is_some()))
            .collect();
        assert_eq!(owners, [("A", 5, true), ("B", 9, true)]);
        assert_eq!(
            spans[0].end,
            Some(events[3].at),
            "A's bar ends at B's claim"
        );
        let lanes: Vec<(MarkKind, Option<usize>)> =
            marks.iter().map(|m| (m.kind, lane_of(&spans, m))).collect();
        assert_eq!(
            lanes,
            [
                (MarkKind::Commit, Some(0)),
                (MarkKind::Commit, Some(1)),
                (MarkKind::Commit, Some(1)),
                (MarkKind::Refused, Some(0)),
            ]
        );
        let svg = ownership(&events).into_string();
        assert_eq!(svg.matches("<rect class=\"owner\"").count(), 2, "{svg}");
        assert!(svg.contains("A · token 5") && svg.contains("B · token 9"));
    }

    #[test]
    fn a_running_job_has_an_open_bar_and_an_unclaimed_one_a_note() {
        let running = [
            ev(0, "enqueued", 0, "p", Some(0)),
            ev(5, "claimed", 3, "A", Some(0)),
        ];
        let (spans, _) = spans_and_marks(&running);
        assert_eq!(spans.len(), 1);
        assert!(spans[0].end.is_none());
        assert!(ownership(&running).into_string().contains("owner open"));
        let waiting = [ev(0, "enqueued", 0, "p", Some(0))];
        assert!(ownership(&waiting).into_string().contains("never claimed"));
        assert!(ownership(&[]).into_string().contains("No history"));
    }
}
