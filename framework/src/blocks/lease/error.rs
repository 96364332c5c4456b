//! [`LeaseError`] and [`LostReason`], and [`classify`]: the one place where the
//! text of an etcd client error is read.

use std::fmt;
use std::time::Duration;

use crate::config::ConfigError;
use crate::security::{AccessError, AccessStep, error_chain, tls_failure};
use crate::types::{JobId, LeaseId};

/// Why a session was declared [`Health::Lost`](super::Health::Lost).
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
    /// assert_eq!(tenure::blocks::lease::LostReason::StreamEnded.code(), "stream_ended");
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
    /// [`Session::establish_with_backoff`](super::Session::establish_with_backoff) was stopped.
    #[error("stopped before a session was established")]
    Cancelled,
    /// The lock batch this acquisition rode in failed; every acquisition of the
    /// batch gets the same error.
    #[error(transparent)]
    Batch(std::sync::Arc<LeaseError>),
    /// The worker's lock service stopped (shutdown) before answering.
    #[error("the lock service stopped")]
    ServiceStopped,
}

/// What an etcd client error says, as far as this module acts on it.
///
/// Read by [`classify`] only; the variants are listed in the order it checks
/// them, the first that matches wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EtcdFailure {
    /// The request provably never reached etcd (connection refused or not
    /// openable, or an HTTP/2 stream the server refused unprocessed): safe to
    /// retry within the request's bound.
    NeverSent,
    /// etcd refused us: TLS, the user or password, or a permission.
    Refused {
        /// Where it was refused.
        step: AccessStep,
        /// The reason, plainly.
        detail: String,
    },
    /// etcd does not know the lease (`etcdserver: requested lease not found`):
    /// revoked or expired already.
    LeaseNotFound,
    /// The server closed the connection. While a session is being established
    /// this is etcd refusing the TLS handshake (see `access::closed_at_connect`);
    /// later it is plain I/O.
    Closed,
    /// Anything else: its effect on etcd is unknown.
    Other,
}

/// Reads `e` once and names what it means for this module. Every match on the
/// text of an etcd client error happens here: etcd-client gives no typed way to
/// reach the source chain (hyper-util's `ConnectError`, h2's reason, rustls'
/// alerts) or etcd's own error strings.
///
/// The texts read, per question, are exactly those the checks read before they
/// were gathered here:
/// - never sent: the `Debug` form of a gRPC status or a transport error (it
///   carries the whole source chain);
/// - refused: the message (or `Display` chain) and the `Debug` form, of any error;
/// - lease not found: the `Display` form;
/// - closed: the same as refused, of a gRPC status or a transport error only.
///
/// A request that never left cannot carry a server's refusal or answer, so the
/// order only matters for texts no etcd client produces.
pub(super) fn classify(e: &etcd_client::Error) -> EtcdFailure {
    const NEVER_SENT: [&str; 3] = ["tcp connect error", "tcp open error", "REFUSED_STREAM"];
    // "connection was not ready": hyper gave up on a connection the server
    // dropped during its handshake (seen from a plaintext client at etcd's TLS
    // listener, as a cancelled status).
    // "ConnectionReset": hyper's I/O error kind in the status's `Debug` form,
    // what a plaintext client at etcd's TLS listener sometimes gets instead
    // (security test flake, issue 31).
    const CLOSED: [&str; 5] = [
        "connection closed",
        "broken pipe",
        "connection reset",
        "ConnectionReset",
        "connection was not ready",
    ];
    let debug = match e {
        etcd_client::Error::GRpcStatus(s) => Some(format!("{s:?}")),
        etcd_client::Error::TransportError(t) => Some(format!("{t:?}")),
        _ => None,
    };
    if debug
        .as_deref()
        .is_some_and(|text| NEVER_SENT.iter().any(|m| text.contains(m)))
    {
        return EtcdFailure::NeverSent;
    }
    let text = match e {
        etcd_client::Error::GRpcStatus(s) => format!("{} {s:?}", s.message()),
        etcd_client::Error::TransportError(t) => format!("{} {t:?}", error_chain(t)),
        other => format!("{} {other:?}", error_chain(other)),
    };
    if let Some((step, detail)) = refusal(&text) {
        return EtcdFailure::Refused { step, detail };
    }
    if e.to_string().contains("lease not found") {
        return EtcdFailure::LeaseNotFound;
    }
    if debug.is_some() && CLOSED.iter().any(|m| text.contains(m)) {
        return EtcdFailure::Closed;
    }
    EtcdFailure::Other
}

/// The refusal an error's text shows: TLS, credentials, permission, or a
/// plaintext client at a TLS listener. Part of [`classify`].
fn refusal(text: &str) -> Option<(AccessStep, String)> {
    if let Some(plain) = tls_failure(text) {
        return Some((AccessStep::Tls, plain.to_string()));
    }
    if text.contains("authentication failed") || text.contains("invalid auth token") {
        return Some((AccessStep::Authenticate, "invalid user or password".into()));
    }
    if text.contains("user name is empty") || text.contains("user name not found") {
        return Some((
            AccessStep::Authenticate,
            "etcd authentication is on: set a user".into(),
        ));
    }
    if text.contains("permission denied") {
        return Some((
            AccessStep::Authorize,
            "the user's role does not cover this key".into(),
        ));
    }
    // A plaintext client speaking HTTP/2 to a TLS listener: Go answers with an
    // HTTP/1 400 the client cannot parse as a frame.
    const PLAINTEXT: [&str; 3] = ["frame with invalid size", "invalid HTTP version", "HTTP/1"];
    if PLAINTEXT.iter().any(|m| text.contains(m)) {
        return Some((
            AccessStep::Tls,
            "the server speaks TLS: use https:// endpoints and TLS settings".into(),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    fn grpc(code: Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(Status::new(code, message))
    }

    #[test]
    fn requests_that_never_left_are_named() {
        for text in [
            "error trying to connect: tcp connect error: Connection refused (os error 111)",
            "tcp open error",
            "h2 protocol error: stream error received: REFUSED_STREAM",
        ] {
            assert_eq!(
                classify(&grpc(Code::Unavailable, text)),
                EtcdFailure::NeverSent
            );
        }
        // Only a status or a transport error can say so.
        assert_eq!(
            classify(&etcd_client::Error::InvalidArgs("tcp connect error".into())),
            EtcdFailure::Other
        );
        // The marker is case-sensitive, as before.
        assert_eq!(
            classify(&grpc(Code::Unavailable, "TCP CONNECT ERROR")),
            EtcdFailure::Other
        );
    }

    #[test]
    fn refusals_are_named() {
        assert_eq!(
            classify(&grpc(
                Code::Unavailable,
                "invalid peer certificate: UnknownIssuer"
            )),
            EtcdFailure::Refused {
                step: AccessStep::Tls,
                detail: "unknown CA".into()
            }
        );
        assert!(matches!(
            classify(&grpc(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password"
            )),
            EtcdFailure::Refused {
                step: AccessStep::Authenticate,
                ..
            }
        ));
        assert!(matches!(
            classify(&grpc(
                Code::InvalidArgument,
                "etcdserver: user name is empty"
            )),
            EtcdFailure::Refused {
                step: AccessStep::Authenticate,
                ..
            }
        ));
        assert!(matches!(
            classify(&grpc(
                Code::PermissionDenied,
                "etcdserver: permission denied"
            )),
            EtcdFailure::Refused {
                step: AccessStep::Authorize,
                ..
            }
        ));
        assert!(matches!(
            classify(&grpc(Code::Internal, "frame with invalid size")),
            EtcdFailure::Refused {
                step: AccessStep::Tls,
                ..
            }
        ));
        // Any error's text can show a refusal, not only a status.
        assert!(matches!(
            classify(&etcd_client::Error::InvalidArgs("permission denied".into())),
            EtcdFailure::Refused { .. }
        ));
    }

    #[test]
    fn closed_connections_are_named() {
        for text in [
            "connection closed before message completed",
            "broken pipe",
            "connection reset",
            "transport error: hyper::Error(Io, Kind(ConnectionReset))",
        ] {
            assert_eq!(classify(&grpc(Code::Unknown, text)), EtcdFailure::Closed);
        }
        // What a plaintext client at a TLS listener got once (security test flake).
        assert_eq!(
            classify(&grpc(
                Code::Cancelled,
                "operation was canceled: connection was not ready"
            )),
            EtcdFailure::Closed
        );
        // Only a status or a transport error can say so.
        assert_eq!(
            classify(&etcd_client::Error::InvalidArgs("connection closed".into())),
            EtcdFailure::Other
        );
    }

    #[test]
    fn a_missing_lease_is_named() {
        assert_eq!(
            classify(&grpc(
                Code::NotFound,
                "etcdserver: requested lease not found"
            )),
            EtcdFailure::LeaseNotFound
        );
        assert_eq!(
            classify(&etcd_client::Error::LeaseKeepAliveError(
                "lease not found".into()
            )),
            EtcdFailure::LeaseNotFound
        );
        assert_eq!(
            classify(&grpc(Code::Unavailable, "etcdserver: request timed out")),
            EtcdFailure::Other
        );
    }

    #[test]
    fn the_first_match_wins() {
        // A request that never left is retried even if its text looks like more.
        assert_eq!(
            classify(&grpc(
                Code::Unavailable,
                "tcp connect error: permission denied"
            )),
            EtcdFailure::NeverSent
        );
        assert!(matches!(
            classify(&grpc(
                Code::Unavailable,
                "permission denied; connection closed"
            )),
            EtcdFailure::Refused { .. }
        ));
        // etcd's answer about the lease is more than a closed connection.
        assert_eq!(
            classify(&grpc(Code::NotFound, "connection closed: lease not found")),
            EtcdFailure::LeaseNotFound
        );
    }
}
