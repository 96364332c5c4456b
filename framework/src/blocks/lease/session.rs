//! [`Session`]: one etcd lease per worker, established with its keepalive
//! stream and keeper, its health and cancellation, and closed with a revoke.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use etcd_client::{Txn, TxnResponse};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::config::Config;
use crate::retry::Backoff;
use crate::types::{JobId, LeaseId};

use super::access;
use super::error::{EtcdFailure, LeaseError, LostReason, classify};
use super::health::{Health, HealthClock};
use super::keepalive::{self, KeeperParams, Published};
use super::request::{bounded, named, named_at_connect, revoke};

/// One etcd lease held by this worker, kept alive by a background task the
/// session owns (aborted when the session is closed or dropped).
///
/// Dropping a session stops its keepalive and cancels its token without revoking
/// the lease (it expires after the TTL); [`Session::close`] revokes it.
pub struct Session {
    pub(super) client: etcd_client::Client,
    pub(super) endpoints: Arc<[String]>,
    pub(super) lease: LeaseId,
    ttl: Duration,
    jobs_prefix: String,
    pub(super) namespace_prefix: String,
    pub(super) worker_id: String,
    pub(super) request_timeout: Duration,
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

impl Session {
    /// Connects to etcd, grants a lease of `cfg.lease_ttl`, opens its keepalive
    /// stream and starts the keeper. The session starts `Healthy`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tenure::blocks::lease::LeaseError> {
    /// let cfg = tenure::Config::new("payments").with_etcd_endpoints(["http://127.0.0.1:2379"]);
    /// let session = tenure::blocks::lease::Session::establish(&cfg).await?;
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
        let client = connect(cfg).await?;
        let lease_client = client.lease_client();
        let lease = grant(cfg, &lease_client).await?;
        tracing::Span::current().record("lease_id", tracing::field::display(lease));

        // etcd-client's keep_alive opens the stream, sends one request and waits for
        // its answer (an error if ttl <= 0): that answer is our first ack.
        let first_sent = Instant::now();
        let stream = open_keepalive(&endpoints, &lease_client, lease, timeout).await?;
        let clock = HealthClock::new(first_sent, cfg.degraded_after(), cfg.lost_after());
        let kept = spawn_keeper(cfg, lease, lease_client, stream, clock);
        tracing::info!(lease_id = %lease, "session established");

        Ok(Session {
            client,
            endpoints,
            lease,
            ttl: cfg.lease_ttl,
            jobs_prefix: format!("{}jobs/", cfg.etcd_prefix()),
            namespace_prefix: cfg.etcd_prefix(),
            worker_id: cfg.worker_id.clone(),
            request_timeout: timeout,
            health: kept.health,
            lost_deadline: kept.lost_deadline,
            lost_reason: kept.lost_reason,
            cancel: kept.cancel,
            keepalive_rtt: kept.keepalive_rtt,
            keeper: Some(kept.task),
        })
    }

    /// [`Session::establish`], retried with exponential backoff and jitter over `cfg.session_backoff`
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
    pub(crate) fn watch_keepalive_rtt(&self) -> watch::Receiver<Option<Duration>> {
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

    pub(super) fn lock_value(&self, job_id: JobId, nonce: u64) -> String {
        serde_json::json!({
            "worker": self.worker_id,
            "lease": self.lease.to_string(),
            "job": job_id.to_string(),
            "nonce": format!("{nonce:016x}"),
        })
        .to_string()
    }

    pub(super) fn ensure_not_lost(&self) -> Result<(), LeaseError> {
        if self.health() == Health::Lost || self.cancel.is_cancelled() {
            return Err(LeaseError::SessionLost {
                lease_id: self.lease,
                reason: self.lost_reason(),
            });
        }
        Ok(())
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
                    if classify(&source) == EtcdFailure::LeaseNotFound =>
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

/// The etcd client for `cfg`'s endpoints, bounded by `etcd_request_timeout`; a
/// refusal is [`LeaseError::Access`], any other failure [`LeaseError::Connect`].
async fn connect(cfg: &Config) -> Result<etcd_client::Client, LeaseError> {
    let options = access::connect_options(cfg)?;
    bounded("connect", cfg.etcd_request_timeout, || {
        etcd_client::Client::connect(&cfg.etcd_endpoints, Some(options.clone()))
    })
    .await
    .map_err(|e| match named_at_connect(cfg, e) {
        LeaseError::Etcd { source, .. } => LeaseError::Connect {
            endpoints: cfg.etcd_endpoints.join(","),
            source,
        },
        other => other,
    })
}

/// A lease of `cfg.lease_ttl`; a refusal is [`LeaseError::Access`], any other
/// failure [`LeaseError::Grant`], an answer without a positive TTL
/// [`LeaseError::Unexpected`].
async fn grant(
    cfg: &Config,
    lease_client: &etcd_client::LeaseClient,
) -> Result<LeaseId, LeaseError> {
    let ttl_secs = i64::try_from(cfg.lease_ttl.as_secs()).unwrap_or(i64::MAX);
    let grant = bounded("grant", cfg.etcd_request_timeout, || {
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
    Ok(LeaseId::new(grant.id()))
}

/// The keepalive stream of the fresh `lease`. On a failure the lease is revoked
/// best-effort and the error is [`LeaseError::Access`] or
/// [`LeaseError::KeepAlive`].
async fn open_keepalive(
    endpoints: &[String],
    lease_client: &etcd_client::LeaseClient,
    lease: LeaseId,
    timeout: Duration,
) -> Result<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream), LeaseError> {
    let opened = bounded("keepalive", timeout, || {
        let mut c = lease_client.clone();
        async move { c.keep_alive(lease.get()).await }
    })
    .await;
    match opened {
        Ok(pair) => Ok(pair),
        Err(e) => {
            let _ = revoke(lease_client, lease, timeout).await;
            Err(match named(endpoints, e) {
                LeaseError::Etcd { source, .. } => LeaseError::KeepAlive {
                    lease_id: lease,
                    source,
                },
                other => other,
            })
        }
    }
}

/// The receiving ends of what the keeper publishes, and the keeper's task.
#[derive(Debug)]
struct Kept {
    health: watch::Receiver<Health>,
    lost_deadline: watch::Receiver<Instant>,
    lost_reason: Arc<OnceLock<LostReason>>,
    cancel: CancellationToken,
    keepalive_rtt: watch::Receiver<Option<Duration>>,
    task: AbortOnDropHandle<()>,
}

/// Spawns the keeper of `lease` on its keepalive `stream`. When the keeper
/// declares the session lost (other than by a revoke), the task revokes the
/// lease so the job locks go at once rather than at TTL expiry.
fn spawn_keeper(
    cfg: &Config,
    lease: LeaseId,
    lease_client: etcd_client::LeaseClient,
    stream: (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream),
    clock: HealthClock,
) -> Kept {
    let timeout = cfg.etcd_request_timeout;
    let (keeper_tx, keeper_rx) = stream;
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
        let reason = keepalive::run(keeper_tx, keeper_rx, clock, params, published).await;
        if !matches!(reason, LostReason::Revoked { .. }) {
            // Free our job locks now rather than at TTL expiry, if etcd answers.
            match revoke(&lease_client, lease, timeout).await {
                Ok(_) => tracing::info!("revoked the lost lease"),
                Err(e) => tracing::debug!(error = %e, "could not revoke the lost lease"),
            }
        }
    };
    let task = AbortOnDropHandle::new(tokio::spawn(task.instrument(keeper_span)));
    Kept {
        health,
        lost_deadline,
        lost_reason,
        cancel,
        keepalive_rtt,
        task,
    }
}

// One Txn (`request.rs` runs it: bounded, retried only if never sent, named).
impl Session {
    /// One Txn, bounded by `etcd_request_timeout`, its failure named.
    pub(super) async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse, LeaseError> {
        let kv = self.client.kv_client();
        bounded(op, self.request_timeout, || {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(|e| named(&self.endpoints, e))
    }
}
