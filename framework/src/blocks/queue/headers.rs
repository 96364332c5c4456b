//! Header names Tenure writes on NATS messages.
//!
//! A work message carries [`JOB_ID`] and [`JOB_TYPE`] (and `Nats-Msg-Id` = the job
//! id, for the broker's de-duplication). A dead letter keeps every header of the
//! original and adds [`REASON`], [`DELIVERIES`], [`ORIGINAL_SEQ`],
//! [`ORIGINAL_SUBJECT`] and, when known, [`LAST_TOKEN`], [`TAKEOVERS`],
//! [`ATTEMPTS`]. The original's own `Nats-*` headers are kept under
//! [`ORIGINAL_PREFIX`] (`Nats-Msg-Id` becomes `Tenure-Original-Nats-Msg-Id`), so they
//! cannot steer the DLQ publish (an `Nats-Expected-*` header would make it fail).
//!
//! [`FENCE_JOB_ID`] and [`FENCE_TOKEN`] are for a step that passes its fence to a
//! downstream service over NATS (see [`fence_headers`]).
//!
//! ```
//! use tenure::blocks::queue::headers;
//! assert_eq!(headers::JOB_ID, "Tenure-Job-Id");
//! assert_eq!(headers::FENCE_TOKEN, "Tenure-Fence");
//! ```

use std::str::FromStr;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};

use crate::{JobId, ObservedFence};

/// The job's id (a UUID). Every work message carries it.
pub const JOB_ID: &str = "Tenure-Job-Id";
/// The job's type (its registered name, e.g. `ledger.transfer`).
pub const JOB_TYPE: &str = "Tenure-Job-Type";
/// DLQ: why the message was dead-lettered (e.g. `max_deliveries`).
pub const REASON: &str = "Tenure-Reason";
/// DLQ: the fencing token of the last owner, when one claimed the job.
pub const LAST_TOKEN: &str = "Tenure-Last-Token";
/// DLQ: how many owners the job lost (from the job row), when known.
pub const TAKEOVERS: &str = "Tenure-Takeovers";
/// DLQ: how many attempts failed (from the job row), when known.
pub const ATTEMPTS: &str = "Tenure-Attempts";
/// DLQ: how many times the broker delivered the message.
pub const DELIVERIES: &str = "Tenure-Deliveries";
/// DLQ: the message's sequence in the work stream.
pub const ORIGINAL_SEQ: &str = "Tenure-Original-Seq";
/// DLQ: the message's subject in the work stream.
pub const ORIGINAL_SUBJECT: &str = "Tenure-Original-Subject";
/// DLQ: prefix under which the original's `Nats-*` headers are kept.
pub const ORIGINAL_PREFIX: &str = "Tenure-Original-";
/// A renewed work message ([`Delivery::hand_back`](super::Delivery::hand_back)):
/// not to run before this instant (milliseconds since the Unix epoch), the
/// rest of the delay its predecessor was handed back with.
pub const NOT_BEFORE: &str = "Tenure-Not-Before";
/// Fence passed downstream: the job id.
pub const FENCE_JOB_ID: &str = "Tenure-Fence-Job-Id";
/// Fence passed downstream: the fencing token (decimal).
pub const FENCE_TOKEN: &str = "Tenure-Fence";

/// The headers of a renewed copy of a message: `orig`'s, less `Nats-Msg-Id`
/// and the headers named in `drop`, with `Nats-Msg-Id` = `msg_id`.
pub(crate) fn renewed(orig: Option<&HeaderMap>, drop: &[&str], msg_id: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, values) in orig.into_iter().flat_map(HeaderMap::iter) {
        let text = name.to_string();
        if text == async_nats::header::NATS_MESSAGE_ID.as_ref() || drop.contains(&text.as_str()) {
            continue;
        }
        for v in values {
            h.append(name.clone(), v.clone());
        }
    }
    h.insert(async_nats::header::NATS_MESSAGE_ID, value(msg_id));
    h
}

/// The headers that exist only on a dead letter; [`redrive`](super::Queue::redrive)
/// removes them (and every [`ORIGINAL_PREFIX`] header) before republishing.
pub(crate) const DLQ_ONLY: [&str; 7] = [
    REASON,
    LAST_TOKEN,
    TAKEOVERS,
    ATTEMPTS,
    DELIVERIES,
    ORIGINAL_SEQ,
    ORIGINAL_SUBJECT,
];

/// Headers that carry a fence (`job_id`, `token`) to a downstream service that
/// compares tokens itself. The receiver reads them back with [`read_fence`].
///
/// # Fencing
/// The headers only transport the token. Only a resource that keeps the largest
/// token it has accepted per job and refuses smaller ones enforces the fence.
///
/// ```
/// # fn demo(lock: &tenure::blocks::lease::JobLock) {
/// use tenure::blocks::queue::headers;
/// use tenure::JobId;
/// let job = JobId::from_key("mail.send", "k1");
/// let token = lock.token();
/// let h = headers::fence_headers(job, token);
/// // The receiver sees an observation: comparable, never a token that claims.
/// assert_eq!(headers::read_fence(&h), Some((job, token.observed())));
/// # }
/// ```
pub fn fence_headers(job_id: JobId, token: impl Into<ObservedFence>) -> HeaderMap {
    let token: ObservedFence = token.into();
    let mut h = HeaderMap::new();
    h.insert(FENCE_JOB_ID, value(&job_id.to_string()));
    h.insert(FENCE_TOKEN, value(&token.get().to_string()));
    h
}

/// Reads a fence written by [`fence_headers`]; `None` when either header is
/// missing or malformed (treat that as "no fence": refuse fenced writes).
pub fn read_fence(headers: &HeaderMap) -> Option<(JobId, ObservedFence)> {
    let job = headers.get(FENCE_JOB_ID)?.as_str().parse().ok()?;
    let raw: i64 = headers.get(FENCE_TOKEN)?.as_str().parse().ok()?;
    Some((job, ObservedFence::new(raw)?))
}

/// A header value from text Tenure controls; CR/LF (which NATS headers cannot
/// carry) become spaces, so this never fails.
pub(crate) fn value(text: &str) -> HeaderValue {
    let clean: String = text
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect();
    HeaderValue::from_str(&clean).unwrap_or_default()
}

/// A header name built at run time (`Tenure-Original-<name>`); `None` if invalid.
pub(crate) fn name(text: &str) -> Option<HeaderName> {
    HeaderName::from_str(text).ok()
}

/// Whether `name` is a NATS-reserved header (`Nats-...`, any case).
pub(crate) fn is_nats_header(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
}

/// The headers of a map as sorted `(name, value)` pairs (a header with several
/// values appears once per value).
pub(crate) fn to_pairs(headers: Option<&HeaderMap>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = headers
        .into_iter()
        .flat_map(|h| h.iter())
        .flat_map(|(k, vs)| {
            vs.iter()
                .map(move |v| (k.to_string(), v.as_str().to_string()))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_never_carry_line_breaks() {
        assert_eq!(value("a\r\nb").as_str(), "a  b");
    }

    #[test]
    fn nats_headers_are_recognised_in_any_case() {
        assert!(is_nats_header("Nats-Msg-Id"));
        assert!(is_nats_header("nats-expected-stream"));
        assert!(!is_nats_header("Tenure-Job-Id"));
        assert!(!is_nats_header("Nat"));
    }

    #[test]
    fn malformed_fences_read_as_none() {
        let mut h = HeaderMap::new();
        h.insert(FENCE_JOB_ID, "not-a-uuid");
        h.insert(FENCE_TOKEN, "5");
        assert_eq!(read_fence(&h), None);
        let job = JobId::from_key("t", "k");
        let mut h = HeaderMap::new();
        h.insert(FENCE_JOB_ID, job.to_string().as_str());
        h.insert(FENCE_TOKEN, "0");
        assert_eq!(read_fence(&h), None);
    }
}
