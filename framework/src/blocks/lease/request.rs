//! One etcd request: bounded in time, retried only when it provably never left,
//! and its failure named ([`LeaseError::Access`] for a refusal).

use std::time::Duration;

use tokio::time::Instant;

use crate::config::Config;
use crate::types::LeaseId;

use super::access;
use super::error::{EtcdFailure, LeaseError, classify};

/// Pause between retries of a request that never reached etcd.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Runs one etcd request, bounded by `after` in total.
///
/// A request that provably never reached etcd (the connection to the endpoint
/// the client picked could not be made: a dead member) is retried within the
/// same bound, so one dead member does not fail a share of all requests. Any
/// other failure is returned: its effect is unknown, and retrying a create
/// could report our own key as contended.
pub(super) async fn bounded<T, F, Fut>(
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
            Ok(Err(e))
                if classify(&e) == EtcdFailure::NeverSent
                    && Instant::now() + RETRY_PAUSE < deadline =>
            {
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
pub(super) fn named(endpoints: &[String], e: LeaseError) -> LeaseError {
    match e {
        LeaseError::Etcd { op, source } => match classify(&source) {
            EtcdFailure::Refused { step, detail } => {
                LeaseError::Access(access::refusal(endpoints, step, detail))
            }
            _ => LeaseError::Etcd { op, source },
        },
        other => other,
    }
}

/// As [`named`], and a connection closed while the session is being
/// established is a TLS refusal (see `access::closed_at_connect`).
pub(super) fn named_at_connect(cfg: &Config, e: LeaseError) -> LeaseError {
    match named(&cfg.etcd_endpoints, e) {
        LeaseError::Etcd { op, source } => match classify(&source) {
            EtcdFailure::Closed => LeaseError::Access(access::closed_at_connect(cfg)),
            _ => LeaseError::Etcd { op, source },
        },
        other => other,
    }
}

/// Revokes `lease`, bounded by `after`.
pub(super) async fn revoke(
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
