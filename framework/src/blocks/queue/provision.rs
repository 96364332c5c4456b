//! What opening a queue may do to the server ([`Provisioning`]) and the one
//! consumer step both `setup.rs` (the advisory consumer) and `routes.rs` (each
//! job type's consumer) take: [`ensure_consumer`].

use async_nats::jetstream::consumer;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::Stream;

use super::{QueueError, setup_failed};

/// What opening a queue may do to the server's streams and consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provisioning {
    /// Bind to what exists; change nothing.
    Bind,
    /// Create what is missing; change nothing that exists.
    CreateMissing,
    /// Create or update everything to the caller's configuration.
    Apply,
}

/// The durable consumer `spec` names on `stream`, bound, created or updated.
pub(super) async fn ensure_consumer(
    stream: &Stream<()>,
    spec: consumer::pull::Config,
    mode: Provisioning,
) -> Result<consumer::PullConsumer, QueueError> {
    let name = spec.durable_name.clone().unwrap_or_default();
    match mode {
        Provisioning::Bind => {
            if let Err(e) = stream.consumer_info(&name).await {
                return Err(match e.kind() {
                    ConsumerInfoErrorKind::NotFound => QueueError::NotProvisioned {
                        what: format!("consumer {name}"),
                    },
                    _ => setup_failed(&name)(e),
                });
            }
            stream
                .get_consumer(&name)
                .await
                .map_err(|source| QueueError::Setup {
                    what: name.clone(),
                    source,
                })
        }
        Provisioning::CreateMissing => stream
            .get_or_create_consumer(&name, spec)
            .await
            .map_err(setup_failed(&name)),
        Provisioning::Apply => stream
            .create_consumer(spec)
            .await
            .map_err(setup_failed(&name)),
    }
}
