//! Sessions, job locks and fencing tokens: the only code that talks to etcd.
//!
//! A [`Session`] is one etcd lease per worker process, kept alive in the
//! background, with a watchable [`Health`]. A [`JobLock`] is the key
//! `<namespace>/jobs/<job_id>`, created under the session's lease only if absent;
//! its `create_revision` is the job's [`FencingToken`].
//!
//! ```no_run
//! # async fn demo(cfg: tenure::Config, job: tenure::JobId) -> Result<(), tenure::lease::LeaseError> {
//! use tenure::lease::{Acquire, Health, Session};
//!
//! let session = Session::establish(&cfg).await?;
//! assert_eq!(session.health(), Health::Healthy);
//! match session.acquire(job).await? {
//!     Acquire::Acquired(lock) => {
//!         // Claim the fence at the resource with `lock.token()` before any work,
//!         // bind all I/O to `session.cancellation()`, then:
//!         lock.release(&session).await?;
//!     }
//!     Acquire::Contended { holder } => println!("held by {holder:?}; retry later"),
//! }
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! # Health
//! Keepalive requests go out on etcd's bidi keepalive stream. Each acknowledgement
//! is stamped with the instant its request was sent (monotonic clock), so the
//! lease is known to live at least until `stamp + TTL`:
//! - `Healthy` -> `Degraded` when no keepalive was acknowledged within TTL/3;
//! - `Degraded` -> `Healthy` when an acknowledgement arrives within TTL/3 of its
//!   request's stamp;
//! - any -> `Lost` when no acknowledgement by 70% of the TTL, when etcd answers a
//!   keepalive with `ttl <= 0` (the lease was revoked or expired), or when the
//!   keepalive stream ends or fails. `Lost` is terminal: make a new session with
//!   [`Session::establish_with_backoff`].
//!
//! Requests are sent every TTL/6, twice per `Degraded` window: sending exactly
//! every TTL/3 would turn `Degraded` for one round trip in every period.
//!
//! On `Lost` the session's [`CancellationToken`] is cancelled, or, with
//! [`WatchdogPolicy::AbortProcess`], the process aborts at once. The keeper then
//! tries once to revoke the lease so the worker's job locks go at once rather
//! than at TTL expiry.
//!
//! [`WatchdogPolicy::AbortProcess`]: crate::config::WatchdogPolicy::AbortProcess
//!
//! # Fencing
//! The token is the lock key's `create_revision`: etcd's one global, durable,
//! strictly increasing revision, so every new owner of a job holds a larger token
//! than every earlier owner, across leader changes. After every create the key is
//! re-read linearizably and must still carry this session's lease (etcd issue
//! 11456: a put on a lease being revoked); otherwise the acquisition fails with
//! [`LeaseError::LockLostBeforeVerify`]. The lock alone proves nothing at the
//! resource: the resource must compare the token.

mod access;
mod health;

pub use access::connect_options as etcd_connect_options;
mod keeper;

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::config::{Config, ConfigError};
use crate::retry::Backoff;
use crate::security::AccessError;
use crate::types::{FencingToken, JobId, LeaseId};

use health::HealthClock;
use keeper::{KeeperParams, Published};

/// The health of a session, as the keeper sees it on the monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// A keepalive was acknowledged within the last TTL/3.
    Healthy,
    /// No keepalive acknowledged for TTL/3 (but less than 70% of the TTL): stop
    /// taking new jobs; running ones continue, and a commit must not start.
    Degraded,
    /// The lease must be presumed gone. Terminal. The session's cancellation token
    /// is cancelled.
    Lost,
}

/// Why a session was declared [`Health::Lost`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// No keepalive was acknowledged by 70% of the TTL.
    Deadline {
        /// Age of the newest acknowledged keepalive (its send instant) when
        /// the session was declared lost.
        since_last_ack: Duration,
    },
    /// etcd answered a keepalive with `ttl <= 0`: the lease does not exist any
    /// more (revoked, or expired).
    Revoked {
        /// The TTL etcd answered.
        ttl: i64,
    },
    /// The keepalive stream ended.
    StreamEnded,
    /// The keepalive stream failed.
    StreamError(String),
}

impl LostReason {
    /// A short, bounded code for metrics (`tenure.lease.losses{cause}`):
    /// `deadline`, `revoked`, `stream_ended` or `stream_error`.
    ///
    /// ```
    /// assert_eq!(tenure::lease::LostReason::StreamEnded.code(), "stream_ended");
    /// ```
    pub fn code(&self) -> &'static str {
        match self {
            LostReason::Deadline { .. } => "deadline",
            LostReason::Revoked { .. } => "revoked",
            LostReason::StreamEnded => "stream_ended",
            LostReason::StreamError(_) => "stream_error",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Deadline { since_last_ack } => {
                write!(f, "no keepalive acknowledged for {since_last_ack:?}")
            }
            LostReason::Revoked { ttl } => write!(f, "keepalive answered ttl {ttl}: lease gone"),
            LostReason::StreamEnded => write!(f, "keepalive stream ended"),
            LostReason::StreamError(e) => write!(f, "keepalive stream failed: {e}"),
        }
    }
}

/// Errors of the lease module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The etcd client could not be created.
    #[error("cannot connect to etcd at {endpoints}: {source}")]
    Connect {
        /// The endpoints tried.
        endpoints: String,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// etcd refused us: TLS, the user or password, or a key outside the user's
    /// role (`etcd 127.0.0.1:2379: TLS handshake failed: unknown CA`).
    #[error(transparent)]
    Access(#[from] AccessError),
    /// etcd did not grant a lease.
    #[error("etcd did not grant a lease of {ttl:?}: {source}")]
    Grant {
        /// The TTL asked for.
        ttl: Duration,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The keepalive stream of a fresh lease could not be opened.
    #[error("cannot keep lease {lease_id} alive: {source}")]
    KeepAlive {
        /// The granted lease.
        lease_id: LeaseId,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// An etcd request failed.
    #[error("etcd {op} failed: {source}")]
    Etcd {
        /// What was being done (`acquire`, `verify`, `release`, ...).
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// An etcd request did not answer within `Config::etcd_request_timeout`. Its
    /// effect is unknown; a lock create is undone best-effort.
    #[error("etcd {op} did not answer within {after:?}")]
    Timeout {
        /// What was being done.
        op: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The session is `Lost`; make a new one.
    #[error("session {lease_id} is lost ({})", reason.as_ref().map_or_else(|| "closed".to_string(), ToString::to_string))]
    SessionLost {
        /// The session's lease.
        lease_id: LeaseId,
        /// Why, if known.
        reason: Option<LostReason>,
    },
    /// The lock key was created but the linearizable re-read did not find it under
    /// this session's lease (etcd issue 11456, or the lease died in between). No
    /// lock is held.
    #[error(
        "lock {key} was not ours when verified (found lease {found:?}, revision {found_revision:?})"
    )]
    LockLostBeforeVerify {
        /// The job.
        job_id: JobId,
        /// The lock key.
        key: String,
        /// The lease the key carried, if the key existed.
        found: Option<LeaseId>,
        /// The key's create revision, if it existed.
        found_revision: Option<i64>,
    },
    /// A job appears twice in one `acquire_many` batch.
    #[error("job {0} appears twice in one batch")]
    DuplicateJob(JobId),
    /// etcd answered something this module does not expect.
    #[error("unexpected etcd answer to {op}: {detail}")]
    Unexpected {
        /// What was being done.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// [`Session::establish_with_backoff`] was stopped.
    #[error("stopped before a session was established")]
    Cancelled,
}

/// The result of an acquisition attempt.
#[derive(Debug)]
pub enum Acquire {
    /// The lock is ours; its token is the job's new fencing token.
    Acquired(JobLock),
    /// Another session holds the job (or this one does: acquisition is not
    /// re-entrant). Not an error: `nak` the message and retry after
    /// `Config::contention_backoff`.
    Contended {
        /// The lease the key carries (`None` if the key has no lease).
        holder: Option<LeaseId>,
    },
}

impl Acquire {
    /// The lock, if acquired.
    pub fn into_lock(self) -> Option<JobLock> {
        match self {
            Acquire::Acquired(l) => Some(l),
            Acquire::Contended { .. } => None,
        }
    }

    /// Whether the lock was acquired.
    pub fn is_acquired(&self) -> bool {
        matches!(self, Acquire::Acquired(_))
    }
}

/// A held job lock: the key `<namespace>/jobs/<job_id>` under a session's lease.
///
/// It lives as long as the session's lease; dropping it does not delete the key
/// (use [`JobLock::release`] or [`Session::release_many`]).
///
/// # Fencing
/// [`JobLock::token`] is the key's `create_revision`. Holding the lock does not
/// make writes safe by itself: a paused holder may have lost it long ago. Every
/// write must be checked against the token at the resource.
#[derive(Debug)]
pub struct JobLock {
    job_id: JobId,
    key: String,
    token: FencingToken,
    lease: LeaseId,
}

impl JobLock {
    /// The fencing token: the lock key's `create_revision`.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The job.
    pub fn job_id(&self) -> JobId {
        self.job_id
    }

    /// The etcd key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease the key was created under.
    pub fn lease_id(&self) -> LeaseId {
        self.lease
    }

    /// Deletes the key only if its `create_revision` still equals our token.
    /// Returns `Ok(false)` when the key is gone or belongs to a newer owner (then
    /// nothing is deleted).
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`]; the key then stays until
    /// the lease ends.
    pub async fn release(self, session: &Session) -> Result<bool, LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.release",
            job_id = %self.job_id, token = %self.token, lease_id = %self.lease,
            worker = %session.worker_id, deleted = tracing::field::Empty,
        );
        async move {
            let resp = session.txn("release", guarded_delete_txn(&self)).await?;
            let deleted = resp.succeeded();
            tracing::Span::current().record("deleted", deleted);
            if !deleted {
                tracing::warn!(key = %self.key, "release: the key is not ours any more; nothing deleted");
            }
            Ok(deleted)
        }
        .instrument(span)
        .await
    }
}

/// One etcd lease held by this worker, kept alive by a background task the
/// session owns (aborted when the session is closed or dropped).
///
/// Dropping a session stops its keepalive and cancels its token without revoking
/// the lease (it expires after the TTL); [`Session::close`] revokes it.
pub struct Session {
    client: etcd_client::Client,
    endpoints: Arc<[String]>,
    lease: LeaseId,
    ttl: Duration,
    jobs_prefix: String,
    worker_id: String,
    request_timeout: Duration,
    health: watch::Receiver<Health>,
    lost_deadline: watch::Receiver<Instant>,
    lost_reason: Arc<OnceLock<LostReason>>,
    cancel: CancellationToken,
    keepalive_rtt: watch::Receiver<Option<Duration>>,
    keeper: Option<AbortOnDropHandle<()>>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("worker_id", &self.worker_id)
            .field("health", &*self.health.borrow())
            .finish_non_exhaustive()
    }
}

/// Locks one batch Txn created whose linearizable re-read is still to come
/// (runtime batching: it rides in the next batch's Txn, see
/// `Session::acquire_folding`). Holding one proves nothing: no token is handed
/// out before the check.
#[derive(Debug)]
pub(crate) struct Unverified {
    entries: Vec<(JobId, String, String)>,
    revision: i64,
    /// Per job: `Some(holder)` if contended, `None` if created.
    outcomes: Vec<Option<Option<LeaseId>>>,
}

impl Unverified {
    /// How many keys the check reads (the created ones).
    pub(crate) fn reads(&self) -> usize {
        self.outcomes.iter().filter(|o| o.is_none()).count()
    }

    fn read_ops(&self) -> Vec<TxnOp> {
        self.entries
            .iter()
            .zip(&self.outcomes)
            .filter(|(_, o)| o.is_none())
            .map(|((_, key, _), _)| TxnOp::get(key.as_str(), None))
            .collect()
    }
}

/// A batch's outcome in [`Session::acquire_folding`].
#[derive(Debug)]
pub(crate) enum Batch {
    /// Verified: per job, in request order.
    Done(Vec<Acquire>),
    /// Written, not verified yet.
    Unverified(Unverified),
}

/// At most this many jobs go into one etcd transaction (etcd's default
/// `--max-txn-ops` is 128, and etcd 3.4 refuses 128 nested txns but accepts
/// 127); larger batches are split.
pub const MAX_BATCH: usize = 100;

impl Session {
    /// Connects to etcd, grants a lease of `cfg.lease_ttl`, opens its keepalive
    /// stream and starts the keeper. The session starts `Healthy`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tenure::lease::LeaseError> {
    /// let cfg = tenure::Config::new("payments").with_etcd_endpoints(["http://127.0.0.1:2379"]);
    /// let session = tenure::lease::Session::establish(&cfg).await?;
    /// println!("lease {}", session.lease_id());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// An invalid config, or etcd not connecting, granting or acknowledging
    /// within `cfg.etcd_request_timeout` per request.
    pub async fn establish(cfg: &Config) -> Result<Session, LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.establish",
            worker = %cfg.worker_id, ttl_ms = cfg.lease_ttl.as_millis() as u64,
            lease_id = tracing::field::Empty,
        );
        Self::establish_inner(cfg).instrument(span).await
    }

    async fn establish_inner(cfg: &Config) -> Result<Session, LeaseError> {
        cfg.validate()?;
        let timeout = cfg.etcd_request_timeout;
        let endpoints: Arc<[String]> = cfg.etcd_endpoints.clone().into();
        let options = access::connect_options(cfg)?;
        let client = bounded("connect", timeout, || {
            etcd_client::Client::connect(&cfg.etcd_endpoints, Some(options.clone()))
        })
        .await
        .map_err(|e| match named_at_connect(cfg, e) {
            LeaseError::Etcd { source, .. } => LeaseError::Connect {
                endpoints: cfg.etcd_endpoints.join(","),
                source,
            },
            other => other,
        })?;

        let ttl_secs = i64::try_from(cfg.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        let lease_client = client.lease_client();
        let grant = bounded("grant", timeout, || {
            let mut c = lease_client.clone();
            async move { c.grant(ttl_secs, None).await }
        })
        .await
        .map_err(|e| match named_at_connect(cfg, e) {
            LeaseError::Etcd { source, .. } => LeaseError::Grant {
                ttl: cfg.lease_ttl,
                source,
            },
            other => other,
        })?;
        if grant.ttl() <= 0 || !grant.error().is_empty() {
            return Err(LeaseError::Unexpected {
                op: "grant",
                detail: format!("ttl {} error {:?}", grant.ttl(), grant.error()),
            });
        }
        let lease = LeaseId::new(grant.id());
        tracing::Span::current().record("lease_id", tracing::field::display(lease));

        // etcd-client's keep_alive opens the stream, sends one request and waits for
        // its answer (an error if ttl <= 0): that answer is our first ack.
        let first_sent = Instant::now();
        let opened = bounded("keepalive", timeout, || {
            let mut c = lease_client.clone();
            async move { c.keep_alive(lease.get()).await }
        })
        .await;
        let (keeper_tx, keeper_rx) = match opened {
            Ok(pair) => pair,
            Err(e) => {
                let _ = revoke(&lease_client, lease, timeout).await;
                return Err(match named(&endpoints, e) {
                    LeaseError::Etcd { source, .. } => LeaseError::KeepAlive {
                        lease_id: lease,
                        source,
                    },
                    other => other,
                });
            }
        };

        let clock = HealthClock::new(first_sent, cfg.degraded_after(), cfg.lost_after());
        let (health_tx, health) = watch::channel(Health::Healthy);
        let (deadline_tx, lost_deadline) = watch::channel(clock.lost_deadline());
        let lost_reason = Arc::new(OnceLock::new());
        let cancel = CancellationToken::new();
        let (rtt_tx, keepalive_rtt) = watch::channel(None);
        let published = Published {
            health: health_tx,
            lost_deadline: deadline_tx,
            lost_reason: lost_reason.clone(),
            cancel: cancel.clone(),
            keepalive_rtt: rtt_tx,
        };
        let params = KeeperParams {
            lease_id: lease,
            period: keepalive_period(cfg),
            watchdog: cfg.watchdog,
        };
        let keeper_span = tracing::info_span!(
            parent: None,
            "tenure.lease.keepalive",
            lease_id = %lease, worker = %cfg.worker_id,
        );
        let task = async move {
            let reason = keeper::run(keeper_tx, keeper_rx, clock, params, published).await;
            if !matches!(reason, LostReason::Revoked { .. }) {
                // Free our job locks now rather than at TTL expiry, if etcd answers.
                match revoke(&lease_client, lease, timeout).await {
                    Ok(_) => tracing::info!("revoked the lost lease"),
                    Err(e) => tracing::debug!(error = %e, "could not revoke the lost lease"),
                }
            }
        };
        let keeper = AbortOnDropHandle::new(tokio::spawn(task.instrument(keeper_span)));
        tracing::info!(lease_id = %lease, "session established");

        Ok(Session {
            client,
            endpoints,
            lease,
            ttl: cfg.lease_ttl,
            jobs_prefix: format!("{}jobs/", cfg.etcd_prefix()),
            worker_id: cfg.worker_id.clone(),
            request_timeout: timeout,
            health,
            lost_deadline,
            lost_reason,
            cancel,
            keepalive_rtt,
            keeper: Some(keeper),
        })
    }

    /// [`Session::establish`], retried with [`Backoff`] over `cfg.session_backoff`
    /// (`sleep = min(cap, base * 2^attempt) * rand(0.5, 1.5)`) until it succeeds or
    /// `stop` is cancelled. An invalid configuration is returned at once.
    ///
    /// # Errors
    /// [`LeaseError::Cancelled`] when `stop` is cancelled; [`LeaseError::Config`].
    pub async fn establish_with_backoff(
        cfg: &Config,
        stop: &CancellationToken,
    ) -> Result<Session, LeaseError> {
        let mut backoff = Backoff::new(cfg.session_backoff);
        loop {
            let attempt = tokio::select! {
                _ = stop.cancelled() => return Err(LeaseError::Cancelled),
                r = Self::establish(cfg) => r,
            };
            match attempt {
                Ok(s) => return Ok(s),
                Err(e @ LeaseError::Config(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(
                        attempt = backoff.attempt(), error = %e,
                        "could not establish an etcd session; backing off"
                    );
                    if !backoff.sleep_unless(stop).await {
                        return Err(LeaseError::Cancelled);
                    }
                }
            }
        }
    }

    /// The session's etcd lease.
    pub fn lease_id(&self) -> LeaseId {
        self.lease
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The worker id written into lock values.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The current health.
    pub fn health(&self) -> Health {
        *self.health.borrow()
    }

    /// A receiver of every health change (the last state is kept: a receiver
    /// that is slow sees the newest state, which is enough since `Lost` is
    /// terminal). The channel closes when the keeper stops (close, drop, or after
    /// `Lost`).
    pub fn watch_health(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }

    /// Why the session was lost, once it is.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lost_reason.get().cloned()
    }

    /// A receiver of keepalive round trips: each acknowledged keepalive publishes
    /// the time from its send to its answer (monotonic clock). `None` until the
    /// first periodic keepalive is answered. A slow receiver sees the newest value
    /// only; the channel closes when the keeper stops. Costs one `watch` store per
    /// keepalive when nobody listens (the runtime records it as
    /// `tenure.lease.keepalive.duration`).
    ///
    /// ```no_run
    /// # async fn demo(session: &tenure::lease::Session) {
    /// let mut rtt = session.watch_keepalive_rtt();
    /// while rtt.changed().await.is_ok() {
    ///     if let Some(d) = *rtt.borrow_and_update() {
    ///         println!("keepalive answered in {d:?}");
    ///     }
    /// }
    /// # }
    /// ```
    pub fn watch_keepalive_rtt(&self) -> watch::Receiver<Option<Duration>> {
        self.keepalive_rtt.clone()
    }

    /// A token cancelled when the session is `Lost`, closed or dropped. Bind
    /// every job's I/O to it (or to a child of it).
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// When the session will be declared `Lost` unless a keepalive is
    /// acknowledged before: the send instant of the newest acknowledged keepalive
    /// plus 70% of the TTL. The lease itself lives at least until that instant
    /// plus 30% of the TTL, so a step whose deadline is at most this instant
    /// finishes while the lease is still valid.
    pub fn lost_deadline(&self) -> Instant {
        *self.lost_deadline.borrow()
    }

    /// The lock key of `job_id`: `<namespace>/jobs/<job_id>`.
    pub fn lock_key(&self, job_id: JobId) -> String {
        format!("{}{}", self.jobs_prefix, job_id)
    }

    /// Deletes job `job_id`'s lock if it carries this session's own lease: a lock
    /// this worker stranded itself (a create whose answer was lost, a release that
    /// gave up), which acquisition would otherwise find held by its own lease until
    /// that lease ends. Returns whether a key was deleted; a key of another lease
    /// is never touched.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`].
    pub async fn release_stranded(&self, job_id: JobId) -> Result<bool, LeaseError> {
        let key = self.lock_key(job_id);
        let txn = Txn::new()
            .when([Compare::lease(
                key.as_str(),
                CompareOp::Equal,
                self.lease.get(),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let deleted = self.txn("release_stranded", txn).await?.succeeded();
        if deleted {
            tracing::warn!(%job_id, "deleted a job lock stranded under this session's own lease");
        }
        Ok(deleted)
    }

    fn lock_value(&self, job_id: JobId, nonce: u64) -> String {
        serde_json::json!({
            "worker": self.worker_id,
            "lease": self.lease.to_string(),
            "job": job_id.to_string(),
            "nonce": format!("{nonce:016x}"),
        })
        .to_string()
    }

    fn ensure_not_lost(&self) -> Result<(), LeaseError> {
        if self.health() == Health::Lost || self.cancel.is_cancelled() {
            return Err(LeaseError::SessionLost {
                lease_id: self.lease,
                reason: self.lost_reason(),
            });
        }
        Ok(())
    }

    async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse, LeaseError> {
        let kv = self.client.kv_client();
        bounded(op, self.request_timeout, || {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(|e| named(&self.endpoints, e))
    }

    /// Creates the lock of `job_id` under this session's lease if nobody holds it
    /// (a Txn on `create_revision == 0`), then re-reads it linearizably and checks
    /// it carries our lease and the created revision.
    ///
    /// # Fencing
    /// On success, [`JobLock::token`] is the key's `create_revision`: larger than
    /// every token any earlier owner of this job held. Claim it at the resource
    /// before doing any work.
    ///
    /// # Errors
    /// [`LeaseError::SessionLost`] on a lost session; [`LeaseError::Etcd`] /
    /// [`LeaseError::Timeout`] (bounded by `etcd_request_timeout` per request; a
    /// create whose outcome is unknown is undone best-effort);
    /// [`LeaseError::LockLostBeforeVerify`] if the re-read does not show our key.
    pub async fn acquire(&self, job_id: JobId) -> Result<Acquire, LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.acquire",
            job_id = %job_id, lease_id = %self.lease, worker = %self.worker_id,
            token = tracing::field::Empty, outcome = tracing::field::Empty,
        );
        async move {
            let mut out = self.acquire_batch(&[job_id], &[]).await?;
            match out.pop() {
                Some(a) => Ok(a),
                None => Err(LeaseError::Unexpected {
                    op: "acquire",
                    detail: "no result for the job".into(),
                }),
            }
        }
        .instrument(span)
        .await
    }

    /// Acquires many jobs at once: ONE etcd Txn whose success branch holds one
    /// nested create-if-absent Txn per job (so the batch costs one Raft entry),
    /// then ONE linearizable read-only Txn re-reading every created key. Results
    /// are in the order of `job_ids`. Every lock created by one Txn has the same
    /// token (the Txn's revision), larger than any earlier token of those jobs.
    /// Batches larger than [`MAX_BATCH`] are split into several Txns.
    ///
    /// # Fencing
    /// As [`Session::acquire`], per job.
    ///
    /// # Errors
    /// As [`Session::acquire`]; [`LeaseError::DuplicateJob`] if a job appears
    /// twice. On an error no lock of the failed chunk is held (created keys are
    /// deleted best-effort); locks of earlier chunks are released best-effort.
    pub async fn acquire_many(&self, job_ids: &[JobId]) -> Result<Vec<Acquire>, LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.acquire_many",
            jobs = job_ids.len(), lease_id = %self.lease, worker = %self.worker_id,
            acquired = tracing::field::Empty, contended = tracing::field::Empty,
        );
        async move {
            let mut seen = std::collections::HashSet::with_capacity(job_ids.len());
            for j in job_ids {
                if !seen.insert(*j) {
                    return Err(LeaseError::DuplicateJob(*j));
                }
            }
            let mut all = Vec::with_capacity(job_ids.len());
            for chunk in job_ids.chunks(MAX_BATCH) {
                match self.acquire_batch(chunk, &[]).await {
                    Ok(part) => all.extend(part),
                    Err(e) => {
                        let held: Vec<JobLock> =
                            all.into_iter().filter_map(Acquire::into_lock).collect();
                        if !held.is_empty() {
                            let _ = self.release_many(held).await;
                        }
                        return Err(e);
                    }
                }
            }
            let acquired = all.iter().filter(|a| a.is_acquired()).count();
            let span = tracing::Span::current();
            span.record("acquired", acquired);
            span.record("contended", all.len() - acquired);
            Ok(all)
        }
        .instrument(span)
        .await
    }

    /// Acquires `job_ids` (as [`Session::acquire_many`]) and releases `locks` (as
    /// [`Session::release_many`]) in ONE etcd Txn: one Raft entry for the
    /// creates and the guarded deletes together, then the one verification read
    /// of the created keys. When the two sets overlap or exceed [`MAX_BATCH`]
    /// together, they are sent as two Txns instead. Releases are best-effort as
    /// in [`Session::release_many`] (a failed Txn leaves them to the lease).
    ///
    /// # Fencing
    /// As [`Session::acquire`], per job; a release deletes a key only while its
    /// `create_revision` equals the lock's token.
    ///
    /// # Errors
    /// As [`Session::acquire_many`].
    pub async fn acquire_and_release_many(
        &self,
        job_ids: &[JobId],
        locks: &[JobLock],
    ) -> Result<Vec<Acquire>, LeaseError> {
        if locks.is_empty() {
            return self.acquire_many(job_ids).await;
        }
        if job_ids.is_empty() {
            self.release_slice(locks).await?;
            return Ok(Vec::new());
        }
        if !fits_one_txn(job_ids, locks, 0) {
            let (acquired, released) =
                tokio::join!(self.acquire_many(job_ids), self.release_slice(locks));
            if let Err(e) = released {
                tracing::warn!(error = %e, "releasing job locks failed; they expire with the session lease");
            }
            return acquired;
        }
        let span = tracing::info_span!(
            "tenure.lease.acquire_and_release_many",
            jobs = job_ids.len(), locks = locks.len(), lease_id = %self.lease,
            worker = %self.worker_id,
        );
        self.acquire_batch(job_ids, locks).instrument(span).await
    }

    /// One Txn of creates (plain for one job, nested for several) and guarded
    /// deletes of `releases`, then one verification read of the created keys.
    async fn acquire_batch(
        &self,
        job_ids: &[JobId],
        releases: &[JobLock],
    ) -> Result<Vec<Acquire>, LeaseError> {
        let (created, _) = self.write_batch(job_ids, releases, None).await?;
        let answers = self.verify_alone(&created).await;
        self.finish(created, answers).await
    }

    /// Acquires `job_ids` and releases `releases` in ONE Txn that also carries
    /// the verification reads of `previous` (the locks the previous batch
    /// created): one Raft entry serves this batch's creates and deletes and the
    /// previous batch's re-read. A read inside a write Txn is ordered after every
    /// earlier Txn, so it sees what a linearizable read issued after the previous
    /// batch's Txn would: the same check as [`Session::acquire`] makes.
    ///
    /// Returns the previous batch's results (if there was one) and this batch,
    /// written but [`Batch::Unverified`]: its check is left to the next call or
    /// to [`Session::verify_pending`], whichever the caller makes first. Batches
    /// that cannot share one Txn (overlap, duplicates, more than [`MAX_BATCH`]
    /// operations) verify `previous` alone first and are then acquired and
    /// verified alone ([`Batch::Done`]).
    pub(crate) async fn acquire_folding(
        &self,
        job_ids: &[JobId],
        releases: &[JobLock],
        previous: Option<Unverified>,
    ) -> (
        Option<Result<Vec<Acquire>, LeaseError>>,
        Result<Batch, LeaseError>,
    ) {
        let reads = previous.as_ref().map_or(0, Unverified::reads);
        if !fits_one_txn(job_ids, releases, reads) || (job_ids.is_empty() && releases.is_empty()) {
            let before = match previous {
                Some(p) => Some(self.verify_pending(p).await),
                None => None,
            };
            let now = self.acquire_and_release_many(job_ids, releases).await;
            return (before, now.map(Batch::Done));
        }
        let Some(previous) = previous else {
            let written = self.write_batch(job_ids, releases, None).await;
            return (None, written.map(|(created, _)| Batch::Unverified(created)));
        };
        let span = tracing::info_span!(
            "tenure.lease.acquire_folding",
            jobs = job_ids.len(), locks = releases.len(), verifies = previous.reads(),
            lease_id = %self.lease, worker = %self.worker_id,
        );
        let written = self
            .write_batch(job_ids, releases, Some(&previous))
            .instrument(span)
            .await;
        match written {
            Ok((created, answers)) => {
                let answers = answers.ok_or_else(|| LeaseError::Unexpected {
                    op: "acquire",
                    detail: "no verification answers in the batch".into(),
                });
                let before = self.finish(previous, answers).await;
                (Some(before), Ok(Batch::Unverified(created)))
            }
            Err(e) => {
                // This batch's creates were undone; the previous batch's check
                // did not happen: make it on its own.
                let before = self.verify_pending(previous).await;
                (Some(before), Err(e))
            }
        }
    }

    /// Verifies a batch whose check was left pending ([`Batch::Unverified`]) with
    /// its own linearizable read.
    ///
    /// # Errors
    /// As [`Session::acquire_many`].
    pub(crate) async fn verify_pending(
        &self,
        pending: Unverified,
    ) -> Result<Vec<Acquire>, LeaseError> {
        let answers = self.verify_alone(&pending).await;
        self.finish(pending, answers).await
    }

    /// The batch Txn: creates of `job_ids` (a plain create-if-absent Txn for a
    /// lone job, nested ones otherwise), guarded deletes of `releases`, and the
    /// reads that verify `verify`'s created keys. Returns this batch's created
    /// (not yet verified) locks and the answers of the reads. On an error, what
    /// this very Txn may have created is undone best-effort.
    async fn write_batch(
        &self,
        job_ids: &[JobId],
        releases: &[JobLock],
        verify: Option<&Unverified>,
    ) -> Result<(Unverified, Option<Vec<TxnOpResponse>>), LeaseError> {
        self.ensure_not_lost()?;
        let nonce: u64 = rand::random();
        let lease = self.lease.get();
        let entries: Vec<(JobId, String, String)> = job_ids
            .iter()
            .map(|j| (*j, self.lock_key(*j), self.lock_value(*j, nonce)))
            .collect();
        let create = |key: &str, value: &str| {
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(key, None)])
        };
        let reads = verify.map(Unverified::read_ops).unwrap_or_default();
        let n_reads = reads.len();
        let single = entries.len() == 1 && releases.is_empty() && reads.is_empty();
        let txn = match entries.as_slice() {
            [(_, key, value)] if single => create(key, value),
            many => Txn::new().and_then(
                many.iter()
                    .map(|(_, key, value)| TxnOp::txn(create(key, value)))
                    .chain(releases.iter().map(guarded_delete))
                    .chain(reads)
                    .collect::<Vec<_>>(),
            ),
        };
        let resp = match self.txn("acquire", txn).await {
            Ok(r) => r,
            Err(e) => {
                // The outcome is unknown: delete whatever this very attempt created.
                self.undo(&entries).await;
                return Err(e);
            }
        };
        let revision = header_revision(&resp, "acquire")?;

        // Per job: Some(holder) if contended, None if created.
        let (outcomes, answers) = if single {
            (vec![contended_holder(&resp)], None)
        } else {
            let mut nested = resp.op_responses();
            if nested.len() != entries.len() + releases.len() + n_reads {
                self.undo(&entries).await;
                return Err(LeaseError::Unexpected {
                    op: "acquire",
                    detail: format!(
                        "{} answers for {} jobs, {} releases and {} reads",
                        nested.len(),
                        entries.len(),
                        releases.len(),
                        n_reads
                    ),
                });
            }
            let answers = nested.split_off(entries.len() + releases.len());
            count_released(releases, nested.split_off(entries.len()));
            let mut v = Vec::with_capacity(nested.len());
            for r in nested {
                match r {
                    TxnOpResponse::Txn(inner) => v.push(contended_holder(&inner)),
                    other => {
                        self.undo(&entries).await;
                        return Err(LeaseError::Unexpected {
                            op: "acquire",
                            detail: format!("expected a nested txn answer, got {other:?}"),
                        });
                    }
                }
            }
            (v, verify.map(|_| answers))
        };
        Ok((
            Unverified {
                entries,
                revision,
                outcomes,
            },
            answers,
        ))
    }

    /// The linearizable re-read of a batch's created keys, on its own (a
    /// read-only Txn is served through the leader's read index, like a default
    /// range read). No created key: no request.
    async fn verify_alone(&self, pending: &Unverified) -> Result<Vec<TxnOpResponse>, LeaseError> {
        let reads = pending.read_ops();
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let check = self.txn("verify", Txn::new().and_then(reads)).await?;
        Ok(check.op_responses())
    }

    /// Checks the re-read of every key `pending` created (it must still carry
    /// this session's lease and the batch's revision) and turns the batch into
    /// results. On any failure every key of the batch is undone and the batch
    /// fails: [`LeaseError::LockLostBeforeVerify`] (etcd issue 11456 guard), the
    /// read's error, or [`LeaseError::SessionLost`].
    async fn finish(
        &self,
        pending: Unverified,
        answers: Result<Vec<TxnOpResponse>, LeaseError>,
    ) -> Result<Vec<Acquire>, LeaseError> {
        let Unverified {
            entries,
            revision,
            outcomes,
        } = pending;
        let lease = self.lease.get();
        let created: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.is_none().then_some(i))
            .collect();
        let single = entries.len() == 1;
        let mut tokens: Vec<Option<FencingToken>> = vec![None; entries.len()];
        if !created.is_empty() {
            let answers = match answers {
                Ok(a) => a,
                Err(e) => {
                    self.undo(&entries).await;
                    return Err(e);
                }
            };
            for (n, &i) in created.iter().enumerate() {
                let (job_id, key, _) = &entries[i];
                let kv = match answers.get(n) {
                    Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
                    _ => None,
                };
                let ok = kv
                    .as_ref()
                    .is_some_and(|kv| kv.lease() == lease && kv.create_revision() == revision);
                let token = if ok {
                    FencingToken::from_revision(revision)
                } else {
                    None
                };
                match token {
                    Some(t) => tokens[i] = Some(t),
                    None => {
                        tracing::error!(
                            job_id = %job_id, key = %key, expected_revision = revision,
                            found_lease = ?kv.as_ref().map(|kv| kv.lease()),
                            found_revision = ?kv.as_ref().map(|kv| kv.create_revision()),
                            "lock not ours on the linearizable re-read (etcd issue 11456 guard)"
                        );
                        self.undo(&entries).await;
                        return Err(LeaseError::LockLostBeforeVerify {
                            job_id: *job_id,
                            key: key.clone(),
                            found: kv
                                .as_ref()
                                .map(|kv| LeaseId::new(kv.lease()))
                                .filter(|l| l.get() != 0),
                            found_revision: kv.as_ref().map(|kv| kv.create_revision()),
                        });
                    }
                }
            }
            if self.health() == Health::Lost {
                self.undo(&entries).await;
                return Err(LeaseError::SessionLost {
                    lease_id: self.lease,
                    reason: self.lost_reason(),
                });
            }
        }

        let span = tracing::Span::current();
        let mut out = Vec::with_capacity(entries.len());
        for ((job_id, key, _), (outcome, token)) in
            entries.into_iter().zip(outcomes.into_iter().zip(tokens))
        {
            match (outcome, token) {
                (None, Some(token)) => {
                    if single {
                        span.record("token", token.get());
                        span.record("outcome", "acquired");
                    }
                    tracing::debug!(job_id = %job_id, token = %token, "job lock acquired");
                    out.push(Acquire::Acquired(JobLock {
                        job_id,
                        key,
                        token,
                        lease: self.lease,
                    }));
                }
                (Some(holder), _) => {
                    if single {
                        span.record("outcome", "contended");
                    }
                    tracing::debug!(
                        job_id = %job_id, holder = ?holder.map(|l| l.to_string()),
                        "job lock contended"
                    );
                    out.push(Acquire::Contended { holder });
                }
                (None, None) => {
                    return Err(LeaseError::Unexpected {
                        op: "acquire",
                        detail: format!("created {job_id} without a verified token"),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Best-effort deletion of the keys one acquisition attempt may have created:
    /// only keys still carrying exactly this attempt's value (its nonce) and lease.
    async fn undo(&self, entries: &[(JobId, String, String)]) {
        let lease = self.lease.get();
        let guarded = |key: &str, value: &str| {
            Txn::new()
                .when([
                    Compare::value(key, CompareOp::Equal, value),
                    Compare::lease(key, CompareOp::Equal, lease),
                ])
                .and_then([TxnOp::delete(key, None)])
        };
        let txn = Txn::new().and_then(
            entries
                .iter()
                .map(|(_, k, v)| TxnOp::txn(guarded(k, v)))
                .collect::<Vec<_>>(),
        );
        match self.txn("undo", txn).await {
            Ok(_) => tracing::debug!(jobs = entries.len(), "undid an acquisition attempt"),
            Err(e) => {
                tracing::warn!(error = %e, "could not undo an acquisition attempt; keys go with the lease")
            }
        }
    }

    /// Releases many locks in ONE Txn of nested guarded deletes (each deletes its
    /// key only if the `create_revision` still equals the lock's token). Locks
    /// that are not ours any more are left alone. Batches larger than
    /// [`MAX_BATCH`] are split.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`]; keys not deleted stay
    /// until the lease ends.
    pub async fn release_many(&self, locks: Vec<JobLock>) -> Result<(), LeaseError> {
        self.release_slice(&locks).await
    }

    /// [`release_many`](Self::release_many) on borrowed locks, so that a caller can
    /// retry after an error (the deletes are guarded by the token: idempotent).
    pub(crate) async fn release_slice(&self, locks: &[JobLock]) -> Result<(), LeaseError> {
        let span = tracing::info_span!(
            "tenure.lease.release_many",
            locks = locks.len(), lease_id = %self.lease, worker = %self.worker_id,
            deleted = tracing::field::Empty,
        );
        async move {
            let mut deleted = 0usize;
            for chunk in locks.chunks(MAX_BATCH) {
                let ops: Vec<TxnOp> = chunk.iter().map(guarded_delete).collect();
                let resp = self.txn("release", Txn::new().and_then(ops)).await?;
                deleted += count_released(chunk, resp.op_responses());
            }
            tracing::Span::current().record("deleted", deleted);
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// Stops the keepalive, cancels the session's token and revokes the lease
    /// (deleting every job lock of this session). A lease that is already gone
    /// is not an error.
    ///
    /// # Errors
    /// [`LeaseError::Etcd`] or [`LeaseError::Timeout`] from the revoke; the lease
    /// then expires after its TTL.
    pub async fn close(mut self) -> Result<(), LeaseError> {
        let span = tracing::info_span!("tenure.lease.close", lease_id = %self.lease, worker = %self.worker_id);
        async move {
            if let Some(keeper) = self.keeper.take() {
                keeper.abort();
                let _ = keeper.await;
            }
            self.cancel.cancel();
            let lease_client = self.client.lease_client();
            match revoke(&lease_client, self.lease, self.request_timeout).await {
                Ok(_) => Ok(()),
                Err(LeaseError::Etcd { source, .. })
                    if source.to_string().contains("lease not found") =>
                {
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
        .instrument(span)
        .await
    }

    /// Test hook: stops the keepalive task without revoking the lease or touching
    /// the health state, as if this worker's process froze. The lease then expires
    /// after its TTL while the session can still issue requests (for example a
    /// stale release, which must not delete a newer owner's key).
    #[cfg(feature = "testing")]
    pub fn halt_keepalive_for_tests(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The keeper is aborted by its AbortOnDropHandle; jobs must stop too.
        self.cancel.cancel();
    }
}

/// Keepalive requests go out every TTL/6: twice per `Degraded` window, so one
/// round trip of latency never turns the session `Degraded`.
fn keepalive_period(cfg: &Config) -> Duration {
    cfg.keepalive_interval()
}

/// A Txn deleting `l`'s key only while its `create_revision` is `l`'s token.
fn guarded_delete_txn(l: &JobLock) -> Txn {
    Txn::new()
        .when([Compare::create_revision(
            l.key.as_str(),
            CompareOp::Equal,
            l.token.get(),
        )])
        .and_then([TxnOp::delete(l.key.as_str(), None)])
}

/// [`guarded_delete_txn`] nested in a batch Txn.
fn guarded_delete(l: &JobLock) -> TxnOp {
    TxnOp::txn(guarded_delete_txn(l))
}

/// Counts the guarded deletes of `locks` that deleted their key (answers in the
/// same order) and warns for each that found the key no longer ours.
fn count_released(locks: &[JobLock], answers: Vec<TxnOpResponse>) -> usize {
    let mut deleted = 0;
    for (l, r) in locks.iter().zip(answers) {
        match r {
            TxnOpResponse::Txn(t) if t.succeeded() => deleted += 1,
            _ => tracing::warn!(
                job_id = %l.job_id, token = %l.token,
                "release: the key is not ours any more; nothing deleted"
            ),
        }
    }
    deleted
}

/// Whether creating `job_ids`, deleting `locks` and `reads` re-reads can share
/// one Txn: no job twice, no job both created and deleted, at most
/// [`MAX_BATCH`] operations.
fn fits_one_txn(job_ids: &[JobId], locks: &[JobLock], reads: usize) -> bool {
    let overlap = locks.iter().any(|l| job_ids.contains(&l.job_id));
    let mut seen = std::collections::HashSet::with_capacity(job_ids.len());
    let duplicate = job_ids.iter().any(|j| !seen.insert(*j));
    !overlap && !duplicate && job_ids.len() + locks.len() + reads <= MAX_BATCH
}

/// `None` if the (single-job) create succeeded; `Some(holder)` otherwise.
fn contended_holder(resp: &TxnResponse) -> Option<Option<LeaseId>> {
    if resp.succeeded() {
        return None;
    }
    let holder = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
        _ => None,
    });
    Some(holder.filter(|l| *l != 0).map(LeaseId::new))
}

fn header_revision(resp: &TxnResponse, op: &'static str) -> Result<i64, LeaseError> {
    resp.header()
        .map(|h| h.revision())
        .filter(|r| *r > 0)
        .ok_or_else(|| LeaseError::Unexpected {
            op,
            detail: "no header revision".into(),
        })
}

/// Pause between retries of a request that never reached etcd.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Runs one etcd request, bounded by `after` in total.
///
/// A request that provably never reached etcd (the connection to the endpoint
/// the client picked could not be made: a dead member) is retried within the
/// same bound, so one dead member does not fail a share of all requests. Any
/// other failure is returned: its effect is unknown, and retrying a create
/// could report our own key as contended.
async fn bounded<T, F, Fut>(
    op: &'static str,
    after: Duration,
    mut request: F,
) -> Result<T, LeaseError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + after;
    let mut retries = 0u32;
    loop {
        match tokio::time::timeout_at(deadline, request()).await {
            Ok(Ok(v)) => {
                if retries > 0 {
                    tracing::debug!(op, retries, "etcd request succeeded after retries");
                }
                return Ok(v);
            }
            Ok(Err(e)) if never_sent(&e) && Instant::now() + RETRY_PAUSE < deadline => {
                retries += 1;
                tracing::trace!(op, error = %e, "etcd request not sent; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Ok(Err(source)) => return Err(LeaseError::Etcd { op, source }),
            Err(_) => return Err(LeaseError::Timeout { op, after }),
        }
    }
}

/// `e` as [`LeaseError::Access`] when etcd refused us (TLS, credentials,
/// permission); unchanged otherwise.
fn named(endpoints: &[String], e: LeaseError) -> LeaseError {
    match e {
        LeaseError::Etcd { op, source } => match access::refusal(endpoints, &source) {
            Some(refusal) => LeaseError::Access(refusal),
            None => LeaseError::Etcd { op, source },
        },
        other => other,
    }
}

/// As [`named`], and a connection closed while the session is being
/// established is a TLS refusal (see `access::closed_at_connect`).
fn named_at_connect(cfg: &Config, e: LeaseError) -> LeaseError {
    match named(&cfg.etcd_endpoints, e) {
        LeaseError::Etcd { op, source } => match access::closed_at_connect(cfg, &source) {
            Some(refusal) => LeaseError::Access(refusal),
            None => LeaseError::Etcd { op, source },
        },
        other => other,
    }
}

/// Whether an etcd request failed before anything was sent (connection refused
/// or not openable, or an HTTP/2 stream the server refused unprocessed).
fn never_sent(e: &etcd_client::Error) -> bool {
    const MARKERS: [&str; 3] = ["tcp connect error", "tcp open error", "REFUSED_STREAM"];
    // The Debug forms carry the whole source chain (hyper-util's ConnectError,
    // h2's reason); there is no typed way to reach them through etcd-client.
    let text = match e {
        etcd_client::Error::GRpcStatus(s) => format!("{s:?}"),
        etcd_client::Error::TransportError(t) => format!("{t:?}"),
        _ => return false,
    };
    MARKERS.iter().any(|m| text.contains(m))
}

/// Revokes `lease`, bounded by `after`.
async fn revoke(
    client: &etcd_client::LeaseClient,
    lease: LeaseId,
    after: Duration,
) -> Result<(), LeaseError> {
    bounded("revoke", after, || {
        let mut c = client.clone();
        async move { c.revoke(lease.get()).await }
    })
    .await
    .map(|_| ())
}
