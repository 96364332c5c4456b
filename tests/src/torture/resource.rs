//! Where the torture transfers write (`--target`): the accounts and the
//! history in PostgreSQL (next to the job rows, in the step's fenced
//! transaction) or in MariaDB (through `StepCtx::mysql`, a second commit
//! before the checkpoint). The checks read the history into memory and
//! compute the verdict the same way for both.

use std::collections::{HashMap, HashSet};

use sqlx::types::Uuid;
use tenure::MySqlFence;
use tenure::testing::{StepRecord, Violation, judge_commits};
use tenure::{JobId, StepIndex};
use tenure::{StepCtx, StepError};

use super::{ACCOUNTS, INITIAL, steps};

/// One accepted write, in commit order per job (`seq`).
#[derive(Debug, Clone)]
pub(crate) struct HistoryRow {
    pub(crate) seq: i64,
    pub(crate) job: Uuid,
    pub(crate) step: i32,
    pub(crate) token: i64,
    pub(crate) account: Option<i32>,
    pub(crate) delta: i64,
    /// A re-run whose idempotency key was already applied (MariaDB: the crash
    /// between the MySQL commit and the checkpoint): accepted by the fence,
    /// moved no money.
    pub(crate) replay: bool,
}

/// The MariaDB tables: created, seeded, guarded (when fenced).
pub(crate) async fn setup_mariadb(fence: &MySqlFence, guard: bool) -> anyhow::Result<()> {
    fence.migrate().await?;
    sqlx::raw_sql(
        "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB;
         CREATE TABLE applied (idem_key VARCHAR(200) PRIMARY KEY) ENGINE=InnoDB;
         CREATE TABLE history (
             seq BIGINT AUTO_INCREMENT PRIMARY KEY,
             job_id CHAR(36) NOT NULL,
             step INT NOT NULL,
             token BIGINT NOT NULL,
             worker VARCHAR(64) NOT NULL,
             account INT NULL,
             delta BIGINT NOT NULL,
             replay BOOLEAN NOT NULL,
             KEY history_job (job_id, seq)) ENGINE=InnoDB;",
    )
    .execute(fence.pool())
    .await?;
    for a in 0..ACCOUNTS {
        sqlx::query("INSERT INTO accounts VALUES (?, ?)")
            .bind(a)
            .bind(INITIAL)
            .execute(fence.pool())
            .await?;
    }
    if guard {
        for table in ["accounts", "applied", "history"] {
            fence.install_guard(table).await?;
        }
    }
    Ok(())
}

/// A step's write on MariaDB, in its fenced MySQL transaction: the account
/// moves only if the step's idempotency key is new; the history row records
/// every accepted attempt.
pub(crate) async fn apply_mariadb(
    ctx: &mut StepCtx,
    bank: &MySqlFence,
    worker: &str,
    account: Option<i32>,
    delta: i64,
) -> Result<(), StepError> {
    let key = ctx.idempotency_key("apply");
    let (job, step, token) = (
        ctx.job_id().as_uuid().to_string(),
        i32::try_from(ctx.step().get()).unwrap_or(i32::MAX),
        ctx.token().get(),
    );
    let conn = ctx.mysql(bank).await?;
    let fresh = sqlx::query("INSERT IGNORE INTO applied (idem_key) VALUES (?)")
        .bind(&key)
        .execute(&mut *conn)
        .await?
        .rows_affected()
        == 1;
    if let (true, Some(a)) = (fresh, account) {
        sqlx::query("UPDATE accounts SET balance = balance + ? WHERE id = ?")
            .bind(delta)
            .bind(a)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query(
        "INSERT INTO history (job_id, step, token, worker, account, delta, replay) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(job)
    .bind(step)
    .bind(token)
    .bind(worker)
    .bind(account)
    .bind(delta)
    .bind(!fresh)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The history and the balances, from PostgreSQL (`schema`) or MariaDB.
pub(crate) async fn load(
    pg: &sqlx::PgPool,
    schema: &str,
    mariadb: Option<&MySqlFence>,
) -> anyhow::Result<(Vec<HistoryRow>, HashMap<i32, i64>)> {
    type Row = (i64, String, i32, i64, Option<i32>, i64, bool);
    let (rows, balances): (Vec<Row>, Vec<(i32, i64)>) = match mariadb {
        Some(m) => (
            sqlx::query_as("SELECT seq, job_id, step, token, account, delta, replay FROM history")
                .fetch_all(m.pool())
                .await?,
            sqlx::query_as("SELECT id, balance FROM accounts")
                .fetch_all(m.pool())
                .await?,
        ),
        None => (
            sqlx::query_as(&format!(
                "SELECT seq, job_id::text, step, token, account, delta, false FROM {schema}.history"
            ))
            .fetch_all(pg)
            .await?,
            sqlx::query_as(&format!("SELECT id, balance FROM {schema}.accounts"))
                .fetch_all(pg)
                .await?,
        ),
    };
    let mut history = Vec::with_capacity(rows.len());
    for (seq, job, step, token, account, delta, replay) in rows {
        let job = Uuid::parse_str(&job)?;
        history.push(HistoryRow {
            seq,
            job,
            step,
            token,
            account,
            delta,
            replay,
        });
    }
    Ok((history, balances.into_iter().collect()))
}

/// What the history says, given which jobs are done.
#[derive(Debug, Default)]
pub(crate) struct HistoryVerdict {
    pub(crate) double_commits: i64,
    pub(crate) token_regressions: i64,
    pub(crate) ledger_violations: i64,
    pub(crate) replays: i64,
    /// Distinct applied steps per job.
    pub(crate) steps: HashMap<Uuid, i64>,
}

/// Double commits (applied rows beyond the first per job and step), token
/// regressions (a token below the previous accepted one of the job, in commit
/// order, replays included), and the ledger: balances = initial + applied
/// deltas, each done transfer moved its amount exactly once, money conserved
/// modulo transfers of jobs not done.
pub(crate) fn judge(
    history: &[HistoryRow],
    balances: &HashMap<i32, i64>,
    done: &HashSet<Uuid>,
) -> HistoryVerdict {
    let mut v = HistoryVerdict::default();
    let applied: Vec<&HistoryRow> = history.iter().filter(|h| !h.replay).collect();
    v.replays = i64::try_from(history.len() - applied.len()).unwrap_or(i64::MAX);
    let mut per_step: HashMap<(Uuid, i32), i64> = HashMap::new();
    for h in &applied {
        *per_step.entry((h.job, h.step)).or_default() += 1;
    }
    for (job, _) in per_step.keys() {
        *v.steps.entry(*job).or_default() += 1;
    }
    // Double commits and token regressions: the testing kit's checker, on
    // the history in commit order (`seq`).
    let mut in_order: Vec<&HistoryRow> = history.iter().collect();
    in_order.sort_by_key(|h| h.seq);
    let record = |h: &&HistoryRow| StepRecord {
        job: JobId::from_uuid(h.job),
        step: StepIndex::new(u32::try_from(h.step).unwrap_or(u32::MAX)),
        token: h.token,
    };
    let applied_in_order: Vec<StepRecord> =
        in_order.iter().filter(|h| !h.replay).map(record).collect();
    let all_in_order: Vec<StepRecord> = in_order.iter().map(record).collect();
    v.double_commits = judge_commits("history", &applied_in_order)
        .iter()
        .map(|x| match x {
            Violation::DoubleCommit { tokens, .. } => {
                i64::try_from(tokens.len()).unwrap_or(i64::MAX) - 1
            }
            _ => 0,
        })
        .sum();
    v.token_regressions = judge_commits("history", &all_in_order)
        .iter()
        .filter(|x| matches!(x, Violation::TokenRegression { .. }))
        .count() as i64;
    v.ledger_violations = ledger_violations(&applied, balances, done);
    v
}

fn ledger_violations(
    applied: &[&HistoryRow],
    balances: &HashMap<i32, i64>,
    done: &HashSet<Uuid>,
) -> i64 {
    let mut moved: HashMap<i32, i64> = HashMap::new();
    let mut per_job: HashMap<Uuid, (i64, i64, i64)> = HashMap::new();
    let mut in_flight = 0;
    for h in applied {
        if let Some(a) = h.account {
            *moved.entry(a).or_default() += h.delta;
        }
        let e = per_job.entry(h.job).or_default();
        e.0 += h.delta;
        e.1 += i64::from(h.delta < 0);
        e.2 += i64::from(h.delta > 0);
        if !done.contains(&h.job) {
            in_flight += h.delta;
        }
    }
    let bad_accounts = (0..ACCOUNTS)
        .filter(|a| balances.get(a).copied() != Some(INITIAL + moved.get(a).copied().unwrap_or(0)))
        .count() as i64;
    let bad_transfers = done
        .iter()
        .filter(|j| per_job.get(j).copied().unwrap_or_default() != (0, 1, 1))
        .count() as i64;
    let total: i64 = balances.values().sum();
    let conserved = total == INITIAL * i64::from(ACCOUNTS) + in_flight;
    bad_accounts + bad_transfers + i64::from(!conserved)
}

/// Every step of a done job applied once: `steps()` distinct applied steps.
pub(crate) fn complete(v: &HistoryVerdict, job: &Uuid) -> bool {
    v.steps.get(job).copied().unwrap_or(0) == steps()
}
