//! The torture test's `--mode redis-lock`: the same transfers, protected the way
//! the seed warns against. A worker takes a job with a Redis lock
//! (`SET key value NX PX ttl`), renews it Redlock-style (a compare-and-`PEXPIRE`
//! script every TTL/3; the lock counts as held only until the send time of the
//! last successful renewal plus the TTL, less a drift allowance), and checks
//! the lock (`GET` = its value, and within that validity) before each step's
//! write. The write itself carries no token and no step predicate: PostgreSQL
//! cannot tell an old holder from a new one.
//!
//! Jobs are found by scanning the `jobs` rows that are not `done` (the NATS
//! message is not used), so a job whose lock lapses is picked up by another
//! worker at once.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::Rng;
use redis::aio::ConnectionManager;
use sqlx::PgPool;
use sqlx::types::Uuid;
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{PauseArm, Recorder, Xfer, leg, steps};

/// How many jobs one worker runs at once (as `max_in_flight` in the other modes).
const IN_FLIGHT: usize = 16;
/// Redlock's clock drift allowance: 1% of the TTL plus 2 ms.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                     return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                       return redis.call('del', KEYS[1]) else return 0 end";

/// One worker of the redis-lock mode.
pub(crate) struct LockRunner {
    pub(crate) worker: String,
    pub(crate) schema: String,
    pub(crate) pool: PgPool,
    pub(crate) redis: ConnectionManager,
    pub(crate) ttl: Duration,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) pause: PauseArm,
}

/// A lock this worker holds: its value, until when it is valid, and whether a
/// renewal found it gone.
struct Held {
    key: String,
    value: String,
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
}

impl LockRunner {
    /// Scans for unfinished jobs and runs up to [`IN_FLIGHT`] of them; never
    /// returns (the process ends when its standard input closes).
    pub(crate) async fn run(self: Arc<Self>) {
        let mut running: HashSet<Uuid> = HashSet::new();
        let mut tasks: JoinSet<Uuid> = JoinSet::new();
        loop {
            while let Some(done) = tasks.try_join_next() {
                if let Ok(id) = done {
                    running.remove(&id);
                }
            }
            if running.len() < IN_FLIGHT {
                for id in self.pending().await {
                    if running.len() >= IN_FLIGHT {
                        break;
                    }
                    if running.insert(id) {
                        let me = self.clone();
                        tasks.spawn(async move {
                            me.try_job(id).await;
                            id
                        });
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn pending(&self) -> Vec<Uuid> {
        let s = &self.schema;
        sqlx::query_scalar(&format!(
            "SELECT id FROM {s}.jobs WHERE status NOT IN ('done', 'dead') \
             ORDER BY random() LIMIT {}",
            IN_FLIGHT * 2
        ))
        .fetch_all(&self.pool)
        .await
        .unwrap_or_default()
    }

    /// Takes the job's lock if it is free, runs its remaining steps while the
    /// lock holds, then releases it.
    async fn try_job(&self, id: Uuid) {
        let Some(held) = self.acquire(id).await else {
            return;
        };
        let held = Arc::new(held);
        let renewal = tokio::spawn(renew(self.redis.clone(), held.clone(), self.ttl));
        if let Err(e) = self.steps(id, &held).await {
            tracing::debug!(error = %e, job = %id, "redis-lock job attempt ended");
        }
        renewal.abort();
        let mut conn = self.redis.clone();
        let release = redis::Script::new(RELEASE);
        let mut call = release.key(&held.key);
        call.arg(&held.value);
        let _ = self.with_timeout(call.invoke_async::<i64>(&mut conn)).await;
    }

    async fn acquire(&self, id: Uuid) -> Option<Held> {
        let key = format!("{}/lock/{id}", self.schema);
        let value = format!("{}:{}", self.worker, rand::rng().random::<u64>());
        let sent = Instant::now();
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let mut conn = self.redis.clone();
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&value).arg("NX").arg("PX").arg(ttl_ms);
        let answer = self
            .with_timeout(set.query_async::<Option<String>>(&mut conn))
            .await;
        match answer {
            Some(Some(_)) => Some(Held {
                key,
                value,
                valid_until: Mutex::new(sent + self.ttl - drift(self.ttl)),
                lost: AtomicBool::new(false),
            }),
            _ => None,
        }
    }

    /// The job's remaining steps, each: the step's work (a random delay, not
    /// interruptible), the lock check, the write.
    async fn steps(&self, id: Uuid, held: &Held) -> anyhow::Result<()> {
        let s = &self.schema;
        let (step, input): (i32, serde_json::Value) =
            sqlx::query_as(&format!("SELECT step, input FROM {s}.jobs WHERE id = $1"))
                .bind(id)
                .fetch_one(&self.pool)
                .await?;
        let x: Xfer = serde_json::from_value(input)?;
        for k in step..i32::try_from(steps())? {
            let ms = rand::rng().random_range(0..=x.delay_ms);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if !self.still_held(held).await {
                self.recorder.stale(id, k);
                anyhow::bail!("lock lost before step {k}");
            }
            // A GC pause or SIGSTOP after the check: the seed's scenario.
            let _ = self.pause.stop_here_if_armed(id, i64::from(k));
            self.write(id, k, &x).await?;
            self.recorder.committed(id, k);
        }
        Ok(())
    }

    /// The Redlock check before a write: the key still carries our value and
    /// the validity of the last acquire or renewal has not run out.
    async fn still_held(&self, held: &Held) -> bool {
        if held.lost.load(Ordering::SeqCst) || Instant::now() >= *held.valid_until.lock().await {
            return false;
        }
        let mut conn = self.redis.clone();
        let mut get = redis::cmd("GET");
        get.arg(&held.key);
        let answer = self
            .with_timeout(get.query_async::<Option<String>>(&mut conn))
            .await;
        let ours = matches!(answer, Some(Some(v)) if v == held.value);
        ours && Instant::now() < *held.valid_until.lock().await
    }

    /// Step `k`'s write: the account, the history row (token 0: there is none)
    /// and the job's progress, with no predicate on who writes. (A `done` row
    /// stays `done`: the walls on `jobs`, migration 0015, refuse a reopen even
    /// from the owner, and that refusal is not the lock's merit.)
    async fn write(&self, id: Uuid, k: i32, x: &Xfer) -> anyhow::Result<()> {
        let s = &self.schema;
        let (account, delta) = leg(i64::from(k), x);
        let mut tx = self.pool.begin().await?;
        if let Some(a) = account {
            sqlx::query(&format!(
                "UPDATE {s}.accounts SET balance = balance + $2 WHERE id = $1"
            ))
            .bind(a)
            .bind(delta)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(&format!(
            "INSERT INTO {s}.history (job_id, step, token, worker, account, delta) \
             VALUES ($1, $2, 0, $3, $4, $5)"
        ))
        .bind(id)
        .bind(k)
        .bind(&self.worker)
        .bind(account)
        .bind(delta)
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "UPDATE {s}.jobs SET step = $2, checkpoint = input, updated_at = now(), \
             status = CASE WHEN $2 >= $3 OR status = 'done' THEN 'done' ELSE 'running' END \
             WHERE id = $1"
        ))
        .bind(id)
        .bind(k + 1)
        .bind(i32::try_from(steps())?)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A Redis call bounded by TTL/3: a delayed or cut link is a failed call.
    async fn with_timeout<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Option<T> {
        tokio::time::timeout(self.ttl / 3, call).await.ok()?.ok()
    }
}

/// Renews `held` every TTL/3 until aborted; a renewal that finds the key gone
/// or someone else's marks the lock lost. The validity moves to the renewal's
/// send time plus the TTL only when it succeeds.
async fn renew(mut redis: ConnectionManager, held: Arc<Held>, ttl: Duration) {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let script = redis::Script::new(RENEW);
    loop {
        tokio::time::sleep(ttl / 3).await;
        let sent = Instant::now();
        let mut call = script.key(&held.key);
        call.arg(&held.value).arg(ttl_ms);
        match tokio::time::timeout(ttl / 3, call.invoke_async::<i64>(&mut redis)).await {
            Ok(Ok(1)) => *held.valid_until.lock().await = sent + ttl - drift(ttl),
            Ok(Ok(_)) => {
                held.lost.store(true, Ordering::SeqCst);
                return;
            }
            // Unreachable or slow: the validity runs out on its own.
            Ok(Err(_)) | Err(_) => {}
        }
    }
}
