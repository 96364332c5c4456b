//! Connecting to a namespace's streams and consumers, and provisioning them.
//!
//! Three ways to open a [`Queue`], by what they may change on the server:
//!
//! | call | missing stream or consumer | existing one with other settings |
//! |---|---|---|
//! | [`Queue::connect`] (tools, the CLI) | [`QueueError::NotProvisioned`] | left as it is |
//! | [`Queue::connect_or_create`] (the `Client`) | created with the caller's `Config` | left as it is |
//! | [`Queue::provision`] (workers, the operator's deployment) | created | updated to the caller's `Config` |
//!
//! So a read-only tool with a default `Config` pointed at a namespace whose
//! workers run 3 replicas and another TTL changes nothing on the server.
//!
//! [`Queue::provision`] sends a stream create or update only when the stream
//! is missing or a setting Tenure owns differs (subjects, retention, storage,
//! replicas, direct get, `max_age`, duplicate window): a worker whose NATS
//! user may not create or update streams (only the operator may: a stream's
//! configuration can source or capture any subject of the account, see
//! [`NatsPermissions`](super::NatsPermissions)) starts on streams its
//! operator provisioned with the same `Config`.

use std::sync::Arc;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self, consumer, stream};
use async_nats::{ConnectOptions, Event};
use tokio::sync::watch;

use super::provision::{Provisioning, ensure_consumer};
use super::{Inner, Queue, QueueError, QueueNames, Settings, boxed, setup_failed};
use crate::Config;

impl Queue {
    /// Connects to [`Config::nats_url`] and binds to the namespace's existing
    /// streams and consumers, changing nothing on the server: the call for tools
    /// and operators (the `tenure` CLI), whose `Config` need not match the
    /// workers'.
    ///
    /// # Errors
    /// [`QueueError::NotProvisioned`] when a stream or consumer does not exist
    /// (no worker has started in this namespace); [`QueueError::Config`],
    /// [`QueueError::Connect`], [`QueueError::Setup`] (a read failed).
    #[tracing::instrument(name = "tenure.queue.connect", skip_all, fields(namespace = %cfg.namespace))]
    pub async fn connect(cfg: &Config) -> Result<Queue, QueueError> {
        Self::open(cfg, Provisioning::Bind).await
    }

    /// As [`Queue::connect`], and creates the streams and consumers that do not
    /// exist yet from `cfg`; existing ones are never changed. A producer may
    /// start before any worker: its messages are kept.
    ///
    /// # Errors
    /// As [`Queue::provision`].
    #[tracing::instrument(name = "tenure.queue.connect", skip_all, fields(namespace = %cfg.namespace))]
    pub async fn connect_or_create(cfg: &Config) -> Result<Queue, QueueError> {
        Self::open(cfg, Provisioning::CreateMissing).await
    }

    /// Connects and creates or updates the streams and consumers (see the
    /// [module docs](super)) to `cfg`. Idempotent: every worker calls it at start;
    /// a changed `AckWait`, `MaxDeliver` or duplicate window is applied.
    ///
    /// # Errors
    /// [`QueueError::Config`], [`QueueError::Connect`] (NATS unreachable: the first
    /// connection is not retried), [`QueueError::Setup`] (for instance a stream of
    /// the same name with an incompatible configuration).
    #[tracing::instrument(name = "tenure.queue.provision", skip_all, fields(namespace = %cfg.namespace))]
    pub async fn provision(cfg: &Config) -> Result<Queue, QueueError> {
        Self::open(cfg, Provisioning::Apply).await
    }

    async fn open(cfg: &Config, mode: Provisioning) -> Result<Queue, QueueError> {
        cfg.validate()?;
        let names = QueueNames::new(&cfg.namespace);
        let (client, connected) = connect_nats(cfg, &names).await?;
        let js = jetstream::ContextBuilder::new()
            .timeout(cfg.nats_request_timeout)
            .ack_timeout(cfg.nats_request_timeout)
            .build(client.clone());
        let [work_cfg, dlq_cfg, advisory_cfg] = stream_configs(cfg, &names);
        let work_stream = ensure_stream(&js, work_cfg, mode).await?;
        let dlq_stream = ensure_stream(&js, dlq_cfg, mode).await?;
        let advisory_stream = ensure_stream(&js, advisory_cfg, mode).await?;
        if mode == Provisioning::Apply {
            super::routes::remove_legacy_consumer(&work_stream, &names).await?;
        }
        let advisories = ensure_consumer(
            &advisory_stream,
            advisory_consumer_config(cfg, &names),
            mode,
        )
        .await?;
        tracing::info!(stream = %names.stream, ?mode, "queue ready");
        Ok(Queue {
            gave_up: None,
            inner: Arc::new(Inner {
                client,
                js,
                names,
                routes: super::routes::Routes::new(mode),
                work_stream,
                dlq_stream,
                advisories,
                connected,
                doorbell: super::ring::Doorbell::default(),
                settings: Settings {
                    request_timeout: cfg.nats_request_timeout,
                    poll_period: cfg.tuning.fetch_wait_several,
                    ack_wait: cfg.ack_wait(),
                    max_deliver: cfg.max_deliver,
                    backoff: cfg.retry_backoff,
                    partitions: cfg.partitions,
                },
            }),
        })
    }
}

/// A NATS connection as `cfg` says (TLS, credentials, the namespace's inbox
/// prefix `_INBOX_<ns>`), for an application's own NATS traffic next to
/// Tenure's: for example a step's request to a fenced service, made as the
/// worker's own NATS user so that the service knows who calls (see
/// [`NatsPermissions::responder`](super::NatsPermissions::responder)).
///
/// # Errors
/// [`QueueError::Access`] (TLS or credentials refused), [`QueueError::Connect`].
pub async fn nats_client(cfg: &Config) -> Result<async_nats::Client, QueueError> {
    let names = QueueNames::new(&cfg.namespace);
    Ok(connect_nats(cfg, &names).await?.0)
}

/// The NATS connection, and a watch of whether it is up.
async fn connect_nats(
    cfg: &Config,
    names: &QueueNames,
) -> Result<(async_nats::Client, watch::Receiver<bool>), QueueError> {
    let (state_tx, state_rx) = watch::channel(false);
    let state_tx = Arc::new(state_tx);
    let events_tx = Arc::clone(&state_tx);
    let options = ConnectOptions::new()
        .name(format!("tenure-{}", cfg.worker_id))
        .custom_inbox_prefix(names.inbox_prefix.clone())
        .connection_timeout(cfg.nats_request_timeout)
        .request_timeout(Some(cfg.nats_request_timeout))
        .event_callback(move |event| {
            let tx = Arc::clone(&events_tx);
            async move {
                match event {
                    Event::Connected => {
                        tracing::info!("NATS connected");
                        tx.send_replace(true);
                    }
                    Event::Disconnected | Event::Closed => {
                        tracing::warn!(%event, "NATS connection lost");
                        tx.send_replace(false);
                    }
                    other => tracing::warn!(event = %other, "NATS event"),
                }
            }
        });
    let client = super::access::secure(cfg, options)
        .await?
        .connect(server_urls(&cfg.nats_url))
        .await
        .map_err(|source| match super::access::refusal(cfg, &source) {
            Some(refusal) => QueueError::Access(refusal),
            None => QueueError::Connect {
                url: crate::security::redact_url(&cfg.nats_url),
                source,
            },
        })?;
    state_tx.send_replace(client.connection_state() == async_nats::connection::State::Connected);
    Ok((client, state_rx))
}

/// The servers of a NATS URL: one, or several comma-separated (the nodes of
/// a cluster; the client connects to one and fails over to the others).
fn server_urls(nats_url: &str) -> Vec<&str> {
    nats_url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// The work, DLQ and advisory streams as `cfg` wants them.
fn stream_configs(cfg: &Config, names: &QueueNames) -> [stream::Config; 3] {
    let common = stream::Config {
        storage: stream::StorageType::File,
        num_replicas: cfg.stream_replicas,
        allow_direct: true,
        ..Default::default()
    };
    let ns = &cfg.namespace;
    [
        stream::Config {
            name: names.stream.clone(),
            description: Some(format!("Tenure work queue of namespace {ns}")),
            subjects: vec![format!("{}>", names.subject_prefix)],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: cfg.duplicate_window,
            // The doorbell (`ring.rs`): each stored message's headers, once more.
            republish: Some(stream::Republish {
                source: format!("{}>", names.subject_prefix),
                destination: format!("{}>", names.ring_subject_prefix),
                headers_only: true,
            }),
            ..common.clone()
        },
        stream::Config {
            name: names.dlq_stream.clone(),
            description: Some(format!("Tenure dead letters of namespace {ns}")),
            subjects: vec![format!("{}>", names.dlq_subject_prefix)],
            retention: stream::RetentionPolicy::Limits,
            duplicate_window: cfg.duplicate_window,
            // Zero: no limit (dead letters kept until an operator acts).
            max_age: cfg.retention.dlq_max_age.unwrap_or_default(),
            ..common.clone()
        },
        stream::Config {
            name: names.advisory_stream.clone(),
            description: Some(format!(
                "Tenure max-deliveries advisories of namespace {ns}"
            )),
            subjects: vec![names.advisory_subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            allow_direct: false,
            ..common
        },
    ]
}

/// The advisory listeners' durable consumer (the workers' are per job type:
/// `routes.rs`).
fn advisory_consumer_config(cfg: &Config, names: &QueueNames) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(names.advisory_consumer.clone()),
        description: Some("Tenure max-deliveries listeners".into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: cfg.ack_wait(),
        max_ack_pending: -1,
        ..Default::default()
    }
}

/// The stream `spec` names, bound, created or updated as `mode` says.
async fn ensure_stream(
    js: &jetstream::Context,
    spec: stream::Config,
    mode: Provisioning,
) -> Result<Stream<()>, QueueError> {
    let name = spec.name.clone();
    match mode {
        Provisioning::Bind => {
            js.get_stream(&name)
                .await
                .map_err(|e| stream_missing_or(e, &name))?;
        }
        Provisioning::CreateMissing => {
            js.get_or_create_stream(spec)
                .await
                .map_err(setup_failed(&name))?;
        }
        Provisioning::Apply => apply_stream(js, spec).await?,
    }
    js.get_stream_no_info(&name)
        .await
        .map_err(setup_failed(&name))
}

/// Creates the stream `spec` names, or updates it when a setting Tenure owns
/// ([`differing`]) is not `spec`'s; one that matches gets no create and no
/// update. So a worker whose NATS user may not create or update streams
/// (`guide::production`: only the operator may) starts on streams the
/// operator provisioned with the same settings.
async fn apply_stream(js: &jetstream::Context, spec: stream::Config) -> Result<(), QueueError> {
    let name = spec.name.clone();
    let (verb, changes) = match js.get_stream(&name).await {
        Ok(stream) => {
            let have = &stream.cached_info().config;
            if spec.republish.is_some() && have.republish.is_none() {
                tracing::warn!(
                    stream = %name,
                    "the work stream has no doorbell (it was created before Tenure rang one, \
                     and nats-server 2.9 cannot add a RePublish to a stream): idle workers \
                     find new jobs at their poll period (Tuning::fetch_wait_several)"
                );
            }
            let changes = differing(&spec, have);
            if changes.is_empty() {
                return Ok(());
            }
            ("UPDATE", changes.join(", "))
        }
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                ("CREATE", "it does not exist".to_string())
            }
            _ => return Err(setup_failed(&name)(e)),
        },
    };
    tracing::info!(stream = %name, verb, changes, "provisioning the stream");
    let what = format!(
        "{verb} stream {name} ({changes}; a NATS user without $JS.API.STREAM.{verb}.{name} \
         is not answered: provision the namespace as its operator, see guide::production)"
    );
    let done = match verb {
        "CREATE" => js.create_stream(spec).await.map(drop).map_err(boxed),
        _ => js.update_stream(spec).await.map(drop).map_err(boxed),
    };
    done.map_err(|source| QueueError::Setup { what, source })
}

/// The settings Tenure sets on a stream (`stream_configs`) in which `have`
/// is not `want`, by name. The description and the settings Tenure leaves
/// at the server's default are not compared (an operator may tune them),
/// nor is the work stream's doorbell (`republish`, `ring.rs`): nats-server
/// 2.9 refuses to change it on an existing stream (error 10052), and a
/// stream without it works, at the poll period.
fn differing(want: &stream::Config, have: &stream::Config) -> Vec<&'static str> {
    let mut subjects = (want.subjects.clone(), have.subjects.clone());
    subjects.0.sort();
    subjects.1.sort();
    let replicas = |n: usize| n.max(1);
    let checks = [
        ("subjects", subjects.0 == subjects.1),
        ("retention", want.retention == have.retention),
        ("storage", want.storage == have.storage),
        (
            "num_replicas",
            replicas(want.num_replicas) == replicas(have.num_replicas),
        ),
        ("allow_direct", want.allow_direct == have.allow_direct),
        ("max_age", want.max_age == have.max_age),
        (
            "duplicate_window",
            want.duplicate_window.is_zero() || want.duplicate_window == have.duplicate_window,
        ),
    ];
    checks
        .into_iter()
        .filter(|(_, same)| !same)
        .map(|(name, _)| name)
        .collect()
}

fn stream_missing_or(e: GetStreamError, name: &str) -> QueueError {
    match e.kind() {
        GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {
            QueueError::NotProvisioned {
                what: format!("stream {name}"),
            }
        }
        _ => setup_failed(name)(e),
    }
}
