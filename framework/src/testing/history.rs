//! The history checker: what workers committed and refused (recorded as a
//! [`WorkerObserver`]), what the job rows and their events say, and rows of
//! the user's own tables, checked against the protocol's promises.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::{Client, FencingToken, JobId, StepIndex, WorkerObserver};

/// Sorts a `job_history` row kept on the trail (no `seq`) after every row of
/// `job_events`: a job's events in written order are `(coalesce(seq, LAST), pos)`.
const LAST: i64 = i64::MAX;

/// One step of one job under one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepRecord {
    /// The job.
    pub job: JobId,
    /// The step.
    pub step: StepIndex,
    /// The owner's fencing token.
    pub token: i64,
}

/// A table of the user's whose rows say which job, step and token wrote them
/// (each row should be written once, by the owner that committed the step).
#[derive(Debug, Clone)]
struct Watched {
    table: String,
    job: String,
    step: String,
    token: Option<String>,
}

/// Records every committed and refused step of the workers it observes, and
/// checks them, the job rows and the watched tables ([`History::check`]).
///
/// Install it on a worker with [`WorkerBuilder::observer`](crate::WorkerBuilder::observer)
/// (`TestEnv` does it for the workers it starts, worker
/// processes included).
#[derive(Debug, Default)]
pub struct History {
    committed: Mutex<Vec<StepRecord>>,
    refused: Mutex<Vec<StepRecord>>,
    watched: Mutex<Vec<Watched>>,
}

impl WorkerObserver for History {
    fn step_committed(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        self.record_commit(job_id, step, token.get());
    }
    fn stale_rejected(&self, job_id: JobId, step: StepIndex, token: FencingToken) {
        self.record_refusal(job_id, step, token.get());
    }
}

/// Locks a mutex, whether or not a panicking thread poisoned it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl History {
    /// An empty history.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Records that `step` of `job` committed under `token`.
    pub fn record_commit(&self, job: JobId, step: StepIndex, token: i64) {
        lock(&self.committed).push(StepRecord { job, step, token });
    }

    /// Records that a write of `step` of `job` under `token` was refused.
    pub fn record_refusal(&self, job: JobId, step: StepIndex, token: i64) {
        lock(&self.refused).push(StepRecord { job, step, token });
    }

    /// Every commit recorded so far.
    pub fn committed(&self) -> Vec<StepRecord> {
        lock(&self.committed).clone()
    }

    /// Every refusal recorded so far.
    pub fn refused(&self) -> Vec<StepRecord> {
        lock(&self.refused).clone()
    }

    /// Checks `table` too: column `job` (a uuid) and `step` (an integer) say
    /// which job's step wrote each row, `token` (optional, a bigint) under
    /// which fencing token. Each (job, step) must appear at most once, and
    /// with the token that committed the step. Names are SQL (schema-qualified
    /// table, column expressions), written by the test, never user input.
    pub fn watch_table(&self, table: &str, job: &str, step: &str, token: Option<&str>) {
        lock(&self.watched).push(Watched {
            table: table.into(),
            job: job.into(),
            step: step.into(),
            token: token.map(Into::into),
        });
    }

    /// Checks everything recorded against the job rows and events of
    /// `client`'s schema, its DLQ and the watched tables.
    ///
    /// # Errors
    /// A database or NATS error while reading.
    pub async fn check(&self, client: &Client) -> Result<Report, CheckError> {
        let facts = Facts::load(client).await?;
        let mut report = Report {
            commits: lock(&self.committed).len(),
            refusals: lock(&self.refused).len(),
            jobs: facts.status.len(),
            violations: Vec::new(),
        };
        report.violations.extend(self.observed_doubles());
        report.violations.extend(self.unconfirmed(&facts));
        report.violations.extend(facts.event_violations());
        report.violations.extend(facts.unfinished());
        let watched = lock(&self.watched).clone();
        for w in &watched {
            let rows = load_rows(client, w).await?;
            report
                .violations
                .extend(judge_rows(&w.table, &rows, &facts));
        }
        Ok(report)
    }

    /// Steps the observers saw commit twice.
    fn observed_doubles(&self) -> Vec<Violation> {
        // Observers of several workers see commits in no common order: only
        // their double commits count.
        judge_commits("worker observers", &lock(&self.committed))
            .into_iter()
            .filter(|v| matches!(v, Violation::DoubleCommit { .. }))
            .collect()
    }

    /// Commits a worker reported that the job's events do not show.
    fn unconfirmed(&self, facts: &Facts) -> Vec<Violation> {
        lock(&self.committed)
            .iter()
            .filter(|c| {
                !facts
                    .step_tokens
                    .get(&(c.job, i64::from(c.step.get())))
                    .is_some_and(|t| t.contains(&c.token))
            })
            .map(|c| Violation::UnconfirmedCommit { record: *c })
            .collect()
    }
}

/// Judges commits given in commit order (per job): a (job, step) committed
/// more than once is a [`Violation::DoubleCommit`]; a commit under a lower
/// token than the job's commit before it is a [`Violation::TokenRegression`].
/// `source` names where the commits come from. The core of
/// [`History::check`], public for checkers that read commits elsewhere (the
/// torture test's ledger history).
///
/// ```
/// use tenure::testing::{StepRecord, Violation, judge_commits};
/// use tenure::{JobId, StepIndex};
///
/// let job = JobId::from_key("t", "a");
/// let at = |step, token| StepRecord { job, step: StepIndex::new(step), token };
/// assert!(judge_commits("ok", &[at(0, 5), at(1, 5), at(2, 9)]).is_empty());
/// let v = judge_commits("bad", &[at(0, 9), at(0, 5)]);
/// assert_eq!(v.len(), 2); // step 0 twice, and token 5 after 9
/// ```
pub fn judge_commits(source: &str, commits: &[StepRecord]) -> Vec<Violation> {
    let mut by_step: HashMap<(JobId, StepIndex), Vec<i64>> = HashMap::new();
    let mut last: HashMap<JobId, i64> = HashMap::new();
    let mut v = Vec::new();
    for c in commits {
        by_step.entry((c.job, c.step)).or_default().push(c.token);
        if let Some(earlier) = last.insert(c.job, c.token).filter(|e| c.token < *e) {
            v.push(Violation::TokenRegression {
                source: source.into(),
                job: c.job,
                step: i64::from(c.step.get()),
                token: c.token,
                earlier,
            });
        }
    }
    let mut doubles: Vec<Violation> = by_step
        .into_iter()
        .filter(|(_, tokens)| tokens.len() > 1)
        .map(|((job, step), tokens)| Violation::DoubleCommit {
            source: source.into(),
            job,
            step: i64::from(step.get()),
            tokens,
        })
        .collect();
    doubles.append(&mut v);
    doubles
}

/// What the database and the DLQ say about the schema's jobs.
struct Facts {
    /// Each job's status.
    status: HashMap<JobId, String>,
    /// Jobs in the DLQ with a reason.
    dead_lettered: HashSet<JobId>,
    /// The tokens each (job, step) committed under (its `step` events).
    step_tokens: HashMap<(JobId, i64), Vec<i64>>,
    /// Commits after a newer owner's claim: (job, step, token, claim token).
    after_claim: Vec<(JobId, i64, i64, i64)>,
    /// Double commits and token regressions in the job events.
    judged: Vec<Violation>,
}

impl Facts {
    async fn load(client: &Client) -> Result<Self, CheckError> {
        let s = client.store().schema().to_string();
        let pool = client.store().pool();
        let rows: Vec<(uuid::Uuid, String)> =
            sqlx::query_as(&format!("SELECT id, status FROM {s}.jobs"))
                .fetch_all(pool)
                .await?;
        let status = rows
            .into_iter()
            .map(|(id, st)| (JobId::from_uuid(id), st))
            .collect();
        let steps: Vec<(uuid::Uuid, i32, i64)> = sqlx::query_as(&format!(
            "SELECT job_id, step, token FROM {s}.job_history WHERE kind = 'step' \
              ORDER BY job_id, seq, pos"
        ))
        .fetch_all(pool)
        .await?;
        let mut step_tokens: HashMap<(JobId, i64), Vec<i64>> = HashMap::new();
        let mut commits = Vec::with_capacity(steps.len());
        for (id, step, token) in steps {
            let job = JobId::from_uuid(id);
            step_tokens
                .entry((job, i64::from(step)))
                .or_default()
                .push(token);
            let step = StepIndex::new(u32::try_from(step).unwrap_or(u32::MAX));
            commits.push(StepRecord { job, step, token });
        }
        let judged = judge_commits("job_history", &commits);
        let after: Vec<(uuid::Uuid, i32, i64, i64)> = sqlx::query_as(&format!(
            "WITH h AS (SELECT job_id, kind, step, token, \
                      (coalesce(seq, {LAST}), pos) AS o FROM {s}.job_history)
             SELECT s.job_id, s.step, s.token, max(c.token) FROM h s
               JOIN h c ON c.job_id = s.job_id AND c.o < s.o
                AND c.kind IN ('claimed', 'taken_over') AND c.token > s.token
              WHERE s.kind = 'step' GROUP BY s.o, s.job_id, s.step, s.token"
        ))
        .fetch_all(pool)
        .await?;
        let after_claim = after
            .into_iter()
            .map(|(id, step, token, claim)| (JobId::from_uuid(id), i64::from(step), token, claim))
            .collect();
        let dead_lettered = dead_lettered(client).await?;
        Ok(Facts {
            status,
            dead_lettered,
            step_tokens,
            after_claim,
            judged,
        })
    }

    /// Double commits, token regressions and commits after a newer claim, in
    /// the job events.
    fn event_violations(&self) -> Vec<Violation> {
        let mut v = self.judged.clone();
        v.extend(self.after_claim.iter().map(|&(job, step, token, claim)| {
            Violation::CommittedAfterNewerClaim {
                job,
                step,
                token,
                claim,
            }
        }));
        v
    }

    /// Jobs neither done, cancelled, nor dead and in the DLQ.
    fn unfinished(&self) -> Vec<Violation> {
        self.status
            .iter()
            .filter_map(|(job, st)| match st.as_str() {
                "done" | "cancelled" => None,
                "dead" if self.dead_lettered.contains(job) => None,
                "dead" => Some(Violation::DeadNotInDlq { job: *job }),
                _ => Some(Violation::Unfinished {
                    job: *job,
                    status: st.clone(),
                }),
            })
            .collect()
    }
}

/// The jobs in the DLQ with a reason, every page.
async fn dead_lettered(client: &Client) -> Result<HashSet<JobId>, CheckError> {
    let mut in_dlq = HashSet::new();
    let mut after = 0;
    loop {
        let page = client
            .queue()
            .dead_letters_after(after, 500)
            .await
            .map_err(|e| CheckError::Queue(e.to_string()))?;
        let Some(last) = page.last() else { break };
        after = last.dlq_sequence;
        in_dlq.extend(
            page.iter()
                .filter(|d| !d.reason.is_empty())
                .filter_map(|d| d.job_id),
        );
    }
    Ok(in_dlq)
}

/// A watched table's rows: (job, step, token, the row as text).
type Row = (uuid::Uuid, i64, Option<i64>, String);

async fn load_rows(client: &Client, w: &Watched) -> Result<Vec<Row>, CheckError> {
    let token = w.token.as_deref().unwrap_or("NULL");
    let sql = format!(
        "SELECT ({})::uuid, ({})::bigint, ({token})::bigint, t::text FROM {} t",
        w.job, w.step, w.table
    );
    Ok(sqlx::query_as(&sql)
        .fetch_all(client.store().pool())
        .await?)
}

/// A watched table's violations: a (job, step) written twice; a row written
/// under another token than the one that committed the step, or for a step
/// that never committed.
fn judge_rows(table: &str, rows: &[Row], facts: &Facts) -> Vec<Violation> {
    let mut by_step: HashMap<(JobId, i64), Vec<&Row>> = HashMap::new();
    for r in rows {
        by_step
            .entry((JobId::from_uuid(r.0), r.1))
            .or_default()
            .push(r);
    }
    let mut v = Vec::new();
    for ((job, step), rows) in by_step {
        let committed = facts.step_tokens.get(&(job, step));
        let stale = |r: &&&Row| match (r.2, committed) {
            (_, None) => true,
            (Some(t), Some(tokens)) => !tokens.contains(&t),
            (None, Some(_)) => false,
        };
        let texts = |rs: &[&Row]| rs.iter().map(|r| r.3.clone()).collect::<Vec<_>>();
        if rows.len() > 1 {
            let tokens = rows.iter().filter_map(|r| r.2).collect();
            v.push(Violation::DoubleWrite {
                table: table.into(),
                job,
                step,
                tokens,
                rows: texts(&rows),
            });
        }
        let stale_rows: Vec<&Row> = rows.iter().filter(stale).copied().collect();
        if !stale_rows.is_empty() {
            v.push(Violation::StaleWrite {
                table: table.into(),
                job,
                step,
                committed: committed.cloned().unwrap_or_default(),
                rows: texts(&stale_rows),
            });
        }
    }
    v
}

/// What [`History::check`] found wrong, with the offending rows.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A step committed more than once (by different owners).
    DoubleCommit {
        /// Who saw it: `job_history` or the worker observers.
        source: String,
        /// The job.
        job: JobId,
        /// The step.
        step: i64,
        /// The tokens it committed under.
        tokens: Vec<i64>,
    },
    /// A step committed under a lower token than an earlier step of the job.
    TokenRegression {
        /// Who saw it.
        source: String,
        /// The job.
        job: JobId,
        /// The later step.
        step: i64,
        /// Its token.
        token: i64,
        /// The higher token of an earlier step.
        earlier: i64,
    },
    /// A step committed under a token lower than a claim made before it.
    CommittedAfterNewerClaim {
        /// The job.
        job: JobId,
        /// The step.
        step: i64,
        /// The commit's token.
        token: i64,
        /// The newer claim's token.
        claim: i64,
    },
    /// A worker reported a commit that the job's events do not show.
    UnconfirmedCommit {
        /// The reported commit.
        record: StepRecord,
    },
    /// A job neither done, cancelled nor dead.
    Unfinished {
        /// The job.
        job: JobId,
        /// Its status.
        status: String,
    },
    /// A dead job that is not in the DLQ.
    DeadNotInDlq {
        /// The job.
        job: JobId,
    },
    /// A watched table holds more than one row for one (job, step).
    DoubleWrite {
        /// The table.
        table: String,
        /// The job.
        job: JobId,
        /// The step.
        step: i64,
        /// The rows' tokens.
        tokens: Vec<i64>,
        /// The rows, as PostgreSQL prints them.
        rows: Vec<String>,
    },
    /// A watched table holds a row of a step that its token did not commit
    /// (another owner did, or nobody).
    StaleWrite {
        /// The table.
        table: String,
        /// The job.
        job: JobId,
        /// The step.
        step: i64,
        /// The tokens the step committed under (empty: never committed).
        committed: Vec<i64>,
        /// The rows, as PostgreSQL prints them.
        rows: Vec<String>,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::DoubleCommit {
                source,
                job,
                step,
                tokens,
            } => {
                write!(
                    f,
                    "double commit ({source}): job {job} step {step} under tokens {tokens:?}"
                )
            }
            Violation::TokenRegression {
                source,
                job,
                step,
                token,
                earlier,
            } => write!(
                f,
                "token regression ({source}): job {job} step {step} under {token} after an earlier step under {earlier}"
            ),
            Violation::CommittedAfterNewerClaim {
                job,
                step,
                token,
                claim,
            } => write!(
                f,
                "job {job} step {step} committed under {token} after a newer owner's claim {claim}"
            ),
            Violation::UnconfirmedCommit { record } => write!(
                f,
                "a worker reported job {} step {} committed under {} but no event shows it",
                record.job, record.step, record.token
            ),
            Violation::Unfinished { job, status } => {
                write!(f, "job {job} is {status}: neither done nor in the DLQ")
            }
            Violation::DeadNotInDlq { job } => write!(f, "job {job} is dead but not in the DLQ"),
            Violation::DoubleWrite {
                table,
                job,
                step,
                tokens,
                rows,
            } => write!(
                f,
                "{table}: job {job} step {step} written {} times (tokens {tokens:?}): {rows:?}",
                rows.len()
            ),
            Violation::StaleWrite {
                table,
                job,
                step,
                committed,
                rows,
            } => write!(
                f,
                "{table}: job {job} step {step} written by an owner that did not commit it (committed under {committed:?}): {rows:?}"
            ),
        }
    }
}

/// What [`History::check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Commits the observers recorded.
    pub commits: usize,
    /// Refusals the observers recorded.
    pub refusals: usize,
    /// Jobs in the schema.
    pub jobs: usize,
    /// Everything wrong.
    pub violations: Vec<Violation>,
}

impl Report {
    /// Whether nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Panics with the report unless it is clean (for tests).
    #[allow(clippy::panic)] // A test's assertion.
    #[track_caller]
    pub fn assert_clean(&self) {
        if !self.is_clean() {
            panic!("the history checker found violations:\n{self}");
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} jobs, {} commits, {} refusals, {} violations",
            self.jobs,
            self.commits,
            self.refusals,
            self.violations.len()
        )?;
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        Ok(())
    }
}

/// Why [`History::check`] could not check.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Reading the tables failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Reading the DLQ failed.
    #[error("dead-letter queue: {0}")]
    Queue(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(steps: &[(JobId, i64, i64)]) -> Facts {
        let mut step_tokens: HashMap<(JobId, i64), Vec<i64>> = HashMap::new();
        for &(job, step, token) in steps {
            step_tokens.entry((job, step)).or_default().push(token);
        }
        Facts {
            status: HashMap::new(),
            dead_lettered: HashSet::new(),
            step_tokens,
            after_claim: Vec::new(),
            judged: Vec::new(),
        }
    }

    fn row(job: JobId, step: i64, token: i64) -> Row {
        (
            job.as_uuid(),
            step,
            Some(token),
            format!("({step},{token})"),
        )
    }

    #[test]
    fn a_table_written_once_by_the_committing_owner_is_clean() {
        let job = JobId::from_key("t", "a");
        let f = facts(&[(job, 0, 5), (job, 1, 7)]);
        assert!(judge_rows("t", &[row(job, 0, 5), row(job, 1, 7)], &f).is_empty());
    }

    #[test]
    fn a_second_row_and_a_stale_token_are_reported() {
        let job = JobId::from_key("t", "a");
        let f = facts(&[(job, 0, 7)]);
        let v = judge_rows("t", &[row(job, 0, 5), row(job, 0, 7)], &f);
        assert!(
            matches!(&v[..], [Violation::DoubleWrite { tokens, .. }, Violation::StaleWrite { committed, rows, .. }]
            if tokens.len() == 2 && committed == &vec![7] && rows.len() == 1),
            "{v:?}"
        );
        // A row of a step that never committed.
        let v = judge_rows("t", &[row(job, 1, 7)], &f);
        assert!(
            matches!(&v[..], [Violation::StaleWrite { committed, .. }] if committed.is_empty()),
            "{v:?}"
        );
    }

    #[test]
    fn observers_that_saw_a_step_commit_twice_are_reported() {
        let h = History::default();
        let job = JobId::from_key("t", "a");
        h.record_commit(job, StepIndex::new(0), 5);
        h.record_commit(job, StepIndex::new(1), 5);
        assert!(h.observed_doubles().is_empty());
        h.record_commit(job, StepIndex::new(0), 9);
        assert!(
            matches!(&h.observed_doubles()[..], [Violation::DoubleCommit { tokens, .. }] if tokens == &vec![5, 9])
        );
    }
}
