//! The NATS permissions of a namespace's users, by role: what the dev stack
//! writes into `nats.conf` and what `guide::production` tells you to give
//! your users (one source for both).

use super::QueueNames;

/// Which Tenure party a NATS user is (see `guide::security`, the parties).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NatsRole {
    /// Provisions the namespace's streams, reads and redrives its DLQ, cancels.
    Operator,
    /// Enqueues jobs, waits for their results, may send cancel notices.
    Producer,
    /// Runs jobs: fetches, acks, dead-letters, publishes due jobs.
    Worker,
}

impl NatsRole {
    /// Every role.
    pub const ALL: [NatsRole; 3] = [NatsRole::Operator, NatsRole::Producer, NatsRole::Worker];

    /// Its name: `operator`, `producer`, `worker`.
    pub fn as_str(self) -> &'static str {
        match self {
            NatsRole::Operator => "operator",
            NatsRole::Producer => "producer",
            NatsRole::Worker => "worker",
        }
    }
}

/// What a NATS user may publish to and subscribe to.
///
/// ```
/// use tenure::blocks::queue::{NatsPermissions, NatsRole};
/// let p = NatsPermissions::for_role("payments", NatsRole::Worker);
/// assert!(p.to_conf().starts_with("{ publish: ["));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsPermissions {
    /// Subjects the user may publish to.
    pub publish: Vec<String>,
    /// Subjects the user may subscribe to.
    pub subscribe: Vec<String>,
    /// Whether the user may answer the requests it receives (publish once to
    /// each received message's reply subject, whatever it is): a request-reply
    /// service's grant, which needs no publish rule on the callers' inboxes.
    pub allow_responses: bool,
}

impl NatsPermissions {
    /// The permissions of a `role` user of `namespace`, as measured against
    /// nats-server 2.9 with async-nats (each JetStream API call Tenure makes,
    /// by verb, on the namespace's three streams, each named exactly: no
    /// wildcard stands where a stream name goes, so `TENURE_A_DLQ` never
    /// matches namespace `a_dlq`'s `TENURE_A_DLQ_DLQ`).
    ///
    /// - every role: its own inbox prefix `_INBOX_<ns>.>` only
    ///   ([`QueueNames::inbox_prefix`]), `$JS.API.INFO`, stream and
    ///   consumer info;
    /// - the worker: publish work (due jobs), dead letters and completion
    ///   notices; create, pull from and ack the consumers of the work and
    ///   advisory streams; remove the legacy consumer; read the DLQ by
    ///   subject and the work stream's messages (the oldest one's age, a
    ///   given-up message, a stalled consumer's entries);
    ///   subscribe to cancel and completion notices and to the doorbell
    ///   (`<ns>.ring.>`, the work stream's republished headers). No stream
    ///   create, update, delete or purge, no cancel notices;
    /// - the producer: publish work and cancel notices, subscribe to
    ///   completion notices;
    /// - the operator: every subject of the namespace, and every verb on
    ///   its streams and their consumers (provision, read and redrive the DLQ).
    pub fn for_role(namespace: &str, role: NatsRole) -> Self {
        let n = QueueNames::new(namespace);
        let streams = [&n.stream, &n.dlq_stream, &n.advisory_stream];
        let mut publish = vec!["$JS.API.INFO".to_string()];
        for s in streams {
            publish.extend([
                format!("$JS.API.STREAM.INFO.{s}"),
                format!("$JS.API.CONSUMER.INFO.{s}.>"),
                format!("$JS.API.CONSUMER.LIST.{s}"),
                format!("$JS.API.CONSUMER.NAMES.{s}"),
            ]);
        }
        let mut subscribe = vec![format!("{}.>", n.inbox_prefix)];
        let own = |suffix: &str| format!("{namespace}.{suffix}");
        match role {
            NatsRole::Operator => {
                publish.push(own(">"));
                streams.iter().for_each(|s| publish.extend(operator_api(s)));
                subscribe.push(own(">"));
            }
            NatsRole::Producer => {
                publish.extend([own("jobs.>"), own("cancel.>")]);
                subscribe.push(own("finished.>"));
            }
            NatsRole::Worker => {
                publish.extend([own("jobs.>"), own("dlq.>"), own("finished.>")]);
                for s in [&n.stream, &n.advisory_stream] {
                    publish.extend(consume(s));
                }
                publish.extend([
                    format!("$JS.API.CONSUMER.DELETE.{}.{}", n.stream, n.legacy_consumer),
                    format!("$JS.API.DIRECT.GET.{}", n.dlq_stream),
                    format!("$JS.API.DIRECT.GET.{}.>", n.dlq_stream),
                    format!("$JS.API.STREAM.MSG.GET.{}", n.dlq_stream),
                    // The oldest work message's age (`tenure.queue.oldest_age`).
                    format!("$JS.API.STREAM.MSG.GET.{}", n.stream),
                    // A given-up message, and whether a stalled consumer's
                    // pending entries are still stored (`stall.rs`).
                    format!("$JS.API.DIRECT.GET.{}", n.stream),
                    format!("$JS.API.DIRECT.GET.{}.>", n.stream),
                ]);
                subscribe.extend([own("cancel.*"), own("finished.>"), own("ring.>")]);
            }
        }
        NatsPermissions {
            publish,
            subscribe,
            allow_responses: false,
        }
    }

    /// A request-reply service's user: it subscribes to `subjects` and answers
    /// what it receives there; it publishes nothing else.
    ///
    /// A service learns who called from the subject a request came on, when
    /// each caller may publish to a subject of its own only (see
    /// [`NatsPermissions::with_publish`]): the server, not the request, says who
    /// the caller is.
    pub fn responder(subjects: impl IntoIterator<Item = String>) -> Self {
        NatsPermissions {
            publish: Vec::new(),
            subscribe: subjects.into_iter().collect(),
            allow_responses: true,
        }
    }

    /// These permissions and publishing to `subject` too (for example a
    /// worker's own subject of a service its steps call).
    #[must_use]
    pub fn with_publish(mut self, subject: impl Into<String>) -> Self {
        self.publish.push(subject.into());
        self
    }

    /// As a nats-server `permissions` value:
    /// `{ publish: ["a", ...], subscribe: ["b", ...] }`, with
    /// `allow_responses: true` when set.
    pub fn to_conf(&self) -> String {
        let quoted = |v: &[String]| {
            v.iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let responses = if self.allow_responses {
            ", allow_responses: true"
        } else {
            ""
        };
        format!(
            "{{ publish: [{}], subscribe: [{}]{responses} }}",
            quoted(&self.publish),
            quoted(&self.subscribe)
        )
    }
}

/// Creating, pulling from and acking the consumers of `stream`.
fn consume(stream: &str) -> [String; 5] {
    [
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"),
        format!("$JS.ACK.{stream}.>"),
    ]
}

/// Every verb on `stream` and its consumers (the operator's).
fn operator_api(stream: &str) -> Vec<String> {
    let mut api: Vec<String> = [
        "CREATE",
        "UPDATE",
        "DELETE",
        "PURGE",
        "MSG.GET",
        "MSG.DELETE",
    ]
    .iter()
    .map(|verb| format!("$JS.API.STREAM.{verb}.{stream}"))
    .collect();
    api.extend(consume(stream));
    api.extend([
        format!("$JS.API.CONSUMER.DELETE.{stream}.>"),
        format!("$JS.API.DIRECT.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}.>"),
    ]);
    api
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A responder may answer and subscribe, and publish nothing else; a
    /// caller's extra subject is added to its role's rules.
    #[test]
    fn a_responder_answers_only_and_a_caller_gets_its_own_subject() {
        let service = NatsPermissions::responder(["a.svc.*".to_string()]);
        assert_eq!(
            service.to_conf(),
            "{ publish: [], subscribe: [\"a.svc.*\"], allow_responses: true }"
        );
        let caller = NatsPermissions::for_role("a", NatsRole::Worker).with_publish("a.svc.w1");
        assert!(caller.publish.ends_with(&["a.svc.w1".to_string()]));
        assert!(!caller.allow_responses && !caller.to_conf().contains("allow_responses"));
    }

    /// No rule has a wildcard where a stream name goes: each names one of
    /// the namespace's streams exactly.
    #[test]
    fn no_rule_reaches_another_namespaces_streams() {
        for role in NatsRole::ALL {
            let p = NatsPermissions::for_role("a", role);
            for rule in p.publish.iter().filter(|r| r.starts_with("$JS.")) {
                let tokens: Vec<&str> = rule.split('.').collect();
                let named = tokens.iter().position(|t| t.starts_with("TENURE_A_"));
                let before = named.map_or(&tokens[..], |i| &tokens[..i]);
                assert!(
                    !before.contains(&"*") && !before.contains(&">"),
                    "{role:?}: {rule}"
                );
            }
            assert_eq!(p.subscribe[0], "_INBOX_a.>");
            assert!(!p.subscribe.iter().any(|s| s.starts_with("_INBOX.")));
        }
        let worker = NatsPermissions::for_role("a", NatsRole::Worker).publish;
        assert!(!worker.iter().any(|r| r.contains("DELETE.TENURE_A_DLQ")
            || r.contains("PURGE")
            || r.contains("STREAM.CREATE")
            || r.contains("STREAM.UPDATE")
            || r.starts_with("a.cancel")));
    }
}
