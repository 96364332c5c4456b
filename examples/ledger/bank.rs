//! The ledger: accounts, holds and ledger entries in PostgreSQL tables guarded by
//! the fence, a transfer job of four steps, and a fake notification provider that
//! deduplicates on the idempotency key (it stands for an external API that
//! cannot check a fencing token).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::blocks::fence::FenceStore;
use tenure::{StepCtx, StepError};

/// The transfer job's step names, in order (for the demo's narration).
pub const STEP_NAMES: [&str; 4] = ["reserve", "debit", "credit", "notify"];

/// A transfer request: the job's input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransferReq {
    pub from: String,
    pub to: String,
    pub amount: i64,
    /// How long the core-banking call inside `debit` takes (to have a window in
    /// which the demo can freeze the worker).
    pub debit_latency_ms: u64,
}

/// Output of `reserve`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reserved {
    pub req: TransferReq,
}

/// Output of `debit`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Debited {
    pub req: TransferReq,
    pub from_balance: i64,
}

/// Output of `credit`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credited {
    pub req: TransferReq,
}

/// The bank's tables.
#[derive(Debug, Clone)]
pub struct Bank {
    store: FenceStore,
}

impl Bank {
    pub fn new(store: FenceStore) -> Self {
        Bank { store }
    }

    fn t(&self, table: &str) -> String {
        format!("{}.{table}", self.store.schema())
    }

    /// Creates the tables, guards them, and opens the accounts (an operator's
    /// write, through the guard's explicit escape hatch).
    pub async fn create(&self, accounts: &[(&str, i64)]) -> anyhow::Result<()> {
        let pool = self.store.pool();
        for ddl in [
            format!(
                "CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))",
                self.t("accounts")
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (job_id uuid PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)",
                self.t("holds")
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (job_id uuid NOT NULL, step int NOT NULL, account text NOT NULL, delta bigint NOT NULL, token bigint NOT NULL)",
                self.t("entries")
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (idempotency_key text PRIMARY KEY, body text NOT NULL)",
                self.t("notifications")
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (n bigint NOT NULL)",
                self.t("notification_requests")
            ),
        ] {
            sqlx::query(&ddl).execute(pool).await?;
        }
        for table in ["accounts", "holds", "entries"] {
            self.store.install_guard(&self.t(table)).await?;
        }
        let mut tx = pool.begin().await?;
        self.store.bypass_guard(&mut tx).await?;
        for (id, balance) in accounts {
            sqlx::query(&format!(
                "INSERT INTO {} (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                self.t("accounts")
            ))
            .bind(id)
            .bind(balance)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn balances(&self) -> anyhow::Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as(&format!(
            "SELECT id, balance FROM {} ORDER BY id",
            self.t("accounts")
        ))
        .fetch_all(self.store.pool())
        .await?)
    }

    /// (notifications delivered, duplicate requests the provider absorbed).
    pub async fn notifications(&self) -> anyhow::Result<(i64, i64)> {
        let sent: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.t("notifications")))
                .fetch_one(self.store.pool())
                .await?;
        let requests: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}",
            self.t("notification_requests")
        ))
        .fetch_one(self.store.pool())
        .await?;
        Ok((sent, requests - sent))
    }

    /// Ledger entries applied more than once for the same (job, step).
    pub async fn double_applied(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT count(*) FROM (SELECT 1 FROM {} GROUP BY job_id, step, account HAVING count(*) > 1) d",
            self.t("entries")
        ))
        .fetch_one(self.store.pool())
        .await?)
    }

    async fn apply(&self, ctx: &mut StepCtx, account: &str, delta: i64) -> Result<i64, StepError> {
        let (job, step, token) = (
            ctx.job_id().as_uuid(),
            i32::try_from(ctx.step().get()).unwrap_or(i32::MAX),
            ctx.token().get(),
        );
        let accounts = self.t("accounts");
        let entries = self.t("entries");
        let db = ctx.db().await?;
        let balance: i64 = sqlx::query_scalar(&format!(
            "UPDATE {accounts} SET balance = balance + $2 WHERE id = $1 RETURNING balance"
        ))
        .bind(account)
        .bind(delta)
        .fetch_one(&mut *db)
        .await?;
        sqlx::query(&format!(
            "INSERT INTO {entries} (job_id, step, account, delta, token) VALUES ($1, $2, $3, $4, $5)"
        ))
        .bind(job)
        .bind(step)
        .bind(account)
        .bind(delta)
        .bind(token)
        .execute(&mut *db)
        .await?;
        Ok(balance)
    }

    /// The fake provider: one request, deduplicated on the key. It is outside
    /// the fence (its own pool connection), like any external API.
    async fn notify(&self, key: &str, body: &str) -> Result<(), StepError> {
        let pool = self.store.pool();
        sqlx::query(&format!(
            "INSERT INTO {} (n) VALUES (1)",
            self.t("notification_requests")
        ))
        .execute(pool)
        .await?;
        sqlx::query(&format!(
            "INSERT INTO {} (idempotency_key, body) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            self.t("notifications")
        ))
        .bind(key)
        .bind(body)
        .execute(pool)
        .await?;
        Ok(())
    }
}

/// The transfer job.
#[derive(Debug, Clone)]
pub struct Transfer {
    bank: Bank,
}

impl Transfer {
    pub fn new(bank: Bank) -> Self {
        Transfer { bank }
    }
}

#[tenure::job(name = "ledger.transfer", max_takeovers = 5, retries = 3, on_dead = refund)]
impl Transfer {
    /// Checks the balance and places a hold.
    #[step]
    async fn reserve(&self, ctx: &mut StepCtx, req: TransferReq) -> Result<Reserved, StepError> {
        if req.amount <= 0 || req.from == req.to {
            return Err(StepError::permanent(format!("invalid transfer {req:?}")));
        }
        let (accounts, holds) = (self.bank.t("accounts"), self.bank.t("holds"));
        let job = ctx.job_id().as_uuid();
        let db = ctx.db().await?;
        let balance: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT balance FROM {accounts} WHERE id = $1 FOR UPDATE"
        ))
        .bind(&req.from)
        .fetch_optional(&mut *db)
        .await?;
        let Some(balance) = balance else {
            return Err(StepError::permanent(format!("no account {:?}", req.from)));
        };
        if balance < req.amount {
            return Err(StepError::permanent(format!(
                "insufficient funds in {}: {balance} < {}",
                req.from, req.amount
            )));
        }
        sqlx::query(&format!(
            "INSERT INTO {holds} (job_id, account, amount) VALUES ($1, $2, $3)"
        ))
        .bind(job)
        .bind(&req.from)
        .bind(req.amount)
        .execute(&mut *db)
        .await?;
        Ok(Reserved { req })
    }

    /// Calls the (slow) core-banking system, then debits the source account.
    #[step]
    async fn debit(&self, ctx: &mut StepCtx, r: Reserved) -> Result<Debited, StepError> {
        // The external call: no database transaction is open meanwhile.
        tokio::time::sleep(Duration::from_millis(r.req.debit_latency_ms)).await;
        let from_balance = self.bank.apply(ctx, &r.req.from, -r.req.amount).await?;
        Ok(Debited {
            req: r.req,
            from_balance,
        })
    }

    /// Credits the destination and releases the hold. A destination that does
    /// not exist is a permanent error: the job dies, and `refund` puts the
    /// debit back.
    #[step]
    async fn credit(&self, ctx: &mut StepCtx, d: Debited) -> Result<Credited, StepError> {
        let accounts = self.bank.t("accounts");
        let exists: Option<i64> =
            sqlx::query_scalar(&format!("SELECT balance FROM {accounts} WHERE id = $1"))
                .bind(&d.req.to)
                .fetch_optional(ctx.db().await?)
                .await?;
        if exists.is_none() {
            return Err(StepError::permanent(format!("no account {:?}", d.req.to)));
        }
        self.bank.apply(ctx, &d.req.to, d.req.amount).await?;
        let holds = self.bank.t("holds");
        let job = ctx.job_id().as_uuid();
        sqlx::query(&format!("DELETE FROM {holds} WHERE job_id = $1"))
            .bind(job)
            .execute(ctx.db().await?)
            .await?;
        Ok(Credited { req: d.req })
    }

    /// The failure hook: runs once per death, fenced like a step (its writes
    /// commit with the mark that it ran). A transfer that died after its
    /// debit gets the debit back; one that died earlier only loses its hold.
    async fn refund(&self, ctx: &mut StepCtx, dead: tenure::DeadJob) -> Result<(), StepError> {
        if dead.step.get() >= 2
            && let Some(d) = dead.checkpoint_as::<Debited>()?
        {
            self.bank.apply(ctx, &d.req.from, d.req.amount).await?;
        }
        let holds = self.bank.t("holds");
        sqlx::query(&format!("DELETE FROM {holds} WHERE job_id = $1"))
            .bind(ctx.job_id().as_uuid())
            .execute(ctx.db().await?)
            .await?;
        Ok(())
    }

    /// Tells the customer, through a provider that deduplicates on the key.
    #[step]
    async fn notify(&self, ctx: &mut StepCtx, c: Credited) -> Result<(), StepError> {
        let key = ctx.idempotency_key("notify");
        let body = format!("{} sent {} to {}", c.req.from, c.req.amount, c.req.to);
        ctx.guard(self.bank.notify(&key, &body)).await
    }
}
