//! The MariaDB bank: accounts, ledger entries and applied idempotency keys in
//! MariaDB tables guarded by the MySQL fence, and a three-step transfer whose
//! money moves through `ctx.mysql()`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::MySqlFence;
use tenure::{StepCtx, StepError};

/// The transfer job's step names, in order.
pub const STEP_NAMES: [&str; 3] = ["check", "debit", "credit"];

/// A transfer request: the job's input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransferReq {
    pub from: String,
    pub to: String,
    pub amount: i64,
    /// How long the core-banking call inside `debit` takes (the window in
    /// which the demo freezes the worker).
    pub debit_latency_ms: u64,
}

/// The bank's database.
#[derive(Debug, Clone)]
pub struct Bank {
    pub fence: MySqlFence,
}

impl Bank {
    /// Creates the fence tables and the bank's, opens the accounts, then
    /// guards the tables (from then on only fenced transactions write them).
    pub async fn create(&self, accounts: &[(&str, i64)]) -> anyhow::Result<()> {
        self.fence.migrate().await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS accounts (id VARCHAR(16) PRIMARY KEY, \
                 balance BIGINT NOT NULL CHECK (balance >= 0)) ENGINE=InnoDB;
             CREATE TABLE IF NOT EXISTS entries (job_id CHAR(36) NOT NULL, step INT NOT NULL, \
                 account VARCHAR(16) NOT NULL, delta BIGINT NOT NULL, token BIGINT NOT NULL) ENGINE=InnoDB;
             CREATE TABLE IF NOT EXISTS applied (idem_key VARCHAR(200) PRIMARY KEY) ENGINE=InnoDB;",
        )
        .execute(self.fence.pool())
        .await?;
        for (id, balance) in accounts {
            sqlx::query("INSERT IGNORE INTO accounts (id, balance) VALUES (?, ?)")
                .bind(id)
                .bind(balance)
                .execute(self.fence.pool())
                .await?;
        }
        for table in ["accounts", "entries", "applied"] {
            self.fence.install_guard(table).await?;
        }
        Ok(())
    }

    pub async fn balances(&self) -> anyhow::Result<Vec<(String, i64)>> {
        Ok(
            sqlx::query_as("SELECT id, balance FROM accounts ORDER BY id")
                .fetch_all(self.fence.pool())
                .await?,
        )
    }

    /// Entries applied more than once for the same (job, step).
    pub async fn double_applied(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM entries GROUP BY job_id, step \
             HAVING count(*) > 1) d",
        )
        .fetch_one(self.fence.pool())
        .await?)
    }

    /// Moves `delta` on `account` once per step (the idempotency key), in the
    /// step's fenced MariaDB transaction.
    async fn apply(&self, ctx: &mut StepCtx, account: &str, delta: i64) -> Result<(), StepError> {
        let key = ctx.idempotency_key("apply");
        let (job, step, token) = (
            ctx.job_id().as_uuid().to_string(),
            i32::try_from(ctx.step().get()).unwrap_or(i32::MAX),
            ctx.token().get(),
        );
        let conn = ctx.mysql(&self.fence).await?;
        let fresh = sqlx::query("INSERT IGNORE INTO applied (idem_key) VALUES (?)")
            .bind(&key)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if fresh == 0 {
            return Ok(()); // a re-run after the crash between the two commits
        }
        sqlx::query("UPDATE accounts SET balance = balance + ? WHERE id = ?")
            .bind(delta)
            .bind(account)
            .execute(&mut *conn)
            .await?;
        sqlx::query(
            "INSERT INTO entries (job_id, step, account, delta, token) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(job)
        .bind(step)
        .bind(account)
        .bind(delta)
        .bind(token)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

/// The transfer job.
#[derive(Debug, Clone)]
pub struct Transfer {
    pub bank: Bank,
}

#[tenure::job(name = "ledger_mariadb.transfer", max_takeovers = 5, retries = 3)]
impl Transfer {
    /// Checks the request and the source balance (a plain read).
    #[step]
    async fn check(&self, _ctx: &mut StepCtx, req: TransferReq) -> Result<TransferReq, StepError> {
        if req.amount <= 0 || req.from == req.to {
            return Err(StepError::permanent(format!("invalid transfer {req:?}")));
        }
        let balance: Option<i64> = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = ?")
            .bind(&req.from)
            .fetch_optional(self.bank.fence.pool())
            .await?;
        match balance {
            Some(b) if b >= req.amount => Ok(req),
            Some(b) => Err(StepError::permanent(format!("insufficient funds: {b}"))),
            None => Err(StepError::permanent(format!("no account {:?}", req.from))),
        }
    }

    /// Calls the (slow) core-banking system, then debits the source.
    #[step]
    async fn debit(&self, ctx: &mut StepCtx, req: TransferReq) -> Result<TransferReq, StepError> {
        tokio::time::sleep(Duration::from_millis(req.debit_latency_ms)).await;
        self.bank.apply(ctx, &req.from, -req.amount).await?;
        Ok(req)
    }

    /// Credits the destination.
    #[step]
    async fn credit(&self, ctx: &mut StepCtx, req: TransferReq) -> Result<(), StepError> {
        self.bank.apply(ctx, &req.to, req.amount).await
    }
}
