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
}

impl NatsPermissions {
    /// The permissions of a `role` user of `namespace`: its own subjects, the
    /// JetStream API calls on its three streams, acks, inboxes.
    pub fn for_role(namespace: &str, role: NatsRole) -> Self {
        let _ = role;
        let names = QueueNames::new(namespace);
        let mut publish = vec![format!("{namespace}.>"), "$JS.API.INFO".to_string()];
        for stream in [&names.stream, &names.dlq_stream, &names.advisory_stream] {
            publish.extend([
                format!("$JS.API.STREAM.*.{stream}"),
                format!("$JS.API.STREAM.MSG.*.{stream}"),
                format!("$JS.API.CONSUMER.*.{stream}"),
                format!("$JS.API.CONSUMER.*.{stream}.>"),
                format!("$JS.API.CONSUMER.*.*.{stream}.>"),
                format!("$JS.API.DIRECT.GET.{stream}"),
                format!("$JS.API.DIRECT.GET.{stream}.>"),
                format!("$JS.ACK.{stream}.>"),
            ]);
        }
        let subscribe = vec!["_INBOX.>".to_string(), format!("{namespace}.>")];
        NatsPermissions { publish, subscribe }
    }

    /// As a nats-server `permissions` value:
    /// `{ publish: ["a", ...], subscribe: ["b", ...] }`.
    pub fn to_conf(&self) -> String {
        let quoted = |v: &[String]| {
            v.iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "{{ publish: [{}], subscribe: [{}] }}",
            quoted(&self.publish),
            quoted(&self.subscribe)
        )
    }
}
