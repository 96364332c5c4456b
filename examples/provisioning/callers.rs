//! Who may call the resource service. A gate orders callers by their tokens;
//! it does not say who they are. On the embedded dev stack every party has a
//! NATS user of its own, and the server says who calls:
//!
//! * each worker may publish to `<subject>.<worker id>` only (its worker
//!   role's rights and that one subject:
//!   [`NatsPermissions::with_publish`](tenure::blocks::queue::NatsPermissions::with_publish));
//! * the service subscribes to `<subject>.*` and may only answer
//!   ([`NatsPermissions::responder`](tenure::blocks::queue::NatsPermissions::responder)),
//!   so the subject a request came on names its caller;
//! * the demo itself acts as the namespace's operator (it provisions the
//!   streams, enqueues, and plays the zombie with worker A's own user).
//!
//! A client without a user cannot connect; worker A cannot call as worker B.
//! With servers named by `TENURE_*` the demo cannot make users: it says so and
//! skips those checks.

use std::time::Duration;

use anyhow::Context as _;
use tenure::Config;
use tenure::blocks::queue::{NatsPermissions, NatsRole, nats_client};
use tenure::devstack::{DevAuth, DevStack, DevStackOptions, ExtraNatsUser};
use tenure::security::NatsAuth;

/// The workers of the demo, by id.
pub const WORKERS: [&str; 2] = ["A", "B"];

/// How long a request that must not be answered is waited for.
const QUIET: Duration = Duration::from_millis(1500);

/// The servers of a run and the NATS users of its parties.
pub struct Parties {
    /// The embedded dev stack, when the demo started one.
    pub stack: Option<DevStack>,
    /// The run's namespace (etcd prefix, streams, schema, subjects).
    pub ns: String,
    /// The service's base subject: a caller publishes to `<subject>.<id>`.
    pub subject: String,
    /// The demo's configuration (the operator, on the dev stack).
    base: Config,
}

fn caller_user(ns: &str, id: &str) -> String {
    format!("{ns}_caller_{}", id.to_lowercase())
}

fn service_user(ns: &str) -> String {
    format!("{ns}_infra_service")
}

/// A secured dev stack (authentication on every server, no TLS: loopback)
/// with a NATS user per worker and one for the service.
fn options(ns: &str, subject: &str) -> DevStackOptions {
    let mut users: Vec<ExtraNatsUser> = WORKERS
        .iter()
        .map(|id| ExtraNatsUser {
            user: caller_user(ns, id),
            permissions: NatsPermissions::for_role(ns, NatsRole::Worker)
                .with_publish(format!("{subject}.{id}")),
        })
        .collect();
    users.push(ExtraNatsUser {
        user: service_user(ns),
        permissions: NatsPermissions::responder([format!("{subject}.*")]),
    });
    DevStackOptions {
        auth: true,
        namespace: ns.to_string(),
        extra_nats_users: users,
        ..DevStackOptions::default()
    }
}

impl Parties {
    /// The servers named by `TENURE_*`, or a secured dev stack of this run's own.
    pub async fn start(name: &str) -> anyhow::Result<Self> {
        let ns = DevStack::unique_namespace(name);
        let subject = format!("{ns}.infra.create");
        let (stack, base) = if Config::env_has_servers() {
            println!("using the servers named by TENURE_*");
            (None, Config::from_env()?)
        } else {
            println!(
                "starting the embedded dev stack (3 etcd members, NATS JetStream, PostgreSQL 15), a user per party..."
            );
            let stack = DevStack::start_with(options(&ns, &subject))
                .await
                .context("starting the dev stack")?;
            let cfg = operator_config(&stack, name)?;
            (Some(stack), cfg)
        };
        let base = base.with_namespace(ns.clone()).with_schema(ns.clone());
        println!("  etcd       {}", base.etcd_endpoints.join(","));
        println!("  nats       {}", base.nats_url);
        println!(
            "  postgresql {}",
            tenure::security::redact_url(&base.database_url)
        );
        Ok(Parties {
            stack,
            ns,
            subject,
            base,
        })
    }

    fn auth(&self) -> Option<&DevAuth> {
        self.stack.as_ref().and_then(DevStack::auth)
    }

    /// Whether callers are authenticated (the dev stack made their users).
    pub fn authenticated(&self) -> bool {
        self.auth().is_some()
    }

    /// The demo's configuration.
    pub fn demo(&self) -> Config {
        self.base.clone()
    }

    /// Worker `id`'s configuration: its own NATS user on the dev stack.
    pub fn worker(&self, id: &str) -> Config {
        self.as_user(&caller_user(&self.ns, id)).with_worker_id(id)
    }

    /// The service's NATS connection (its own user on the dev stack).
    pub async fn service_nats(&self) -> anyhow::Result<async_nats::Client> {
        let cfg = self.as_user(&service_user(&self.ns));
        nats_client(&cfg).await.context("the service's NATS user")
    }

    /// `base` as extra NATS user `user`, if the stack has it.
    fn as_user(&self, user: &str) -> Config {
        match self.auth().and_then(|a| a.extra_nats_auth(user)) {
            Some(auth) => self.base.clone().with_nats_auth(auth),
            None => self.base.clone(),
        }
    }

    /// The environment a worker process needs beyond the server addresses:
    /// its etcd and NATS credentials.
    pub fn worker_env(&self, id: &str) -> Vec<(String, String)> {
        let cfg = self.worker(id);
        let mut env = Vec::new();
        if let (Some(user), Some(pw)) = (&cfg.etcd_user, &cfg.etcd_password) {
            env.push(("TENURE_ETCD_USER".into(), user.clone()));
            env.push(("TENURE_ETCD_PASSWORD".into(), pw.expose().to_string()));
        }
        if let NatsAuth::UserPassword { user, password } = &cfg.nats_auth {
            env.push(("TENURE_NATS_USER".into(), user.clone()));
            env.push(("TENURE_NATS_PASSWORD".into(), password.expose().to_string()));
        }
        env
    }

    /// Whether a client without a NATS user is kept from the service: it
    /// cannot connect (or, connected, gets no answer).
    pub async fn anonymous_refused(&self) -> bool {
        match async_nats::connect(&self.base.nats_url).await {
            Err(_) => true,
            Ok(nats) => unanswered(&nats, format!("{}.A", self.subject)).await,
        }
    }

    /// Whether worker `by`'s NATS user, publishing on worker `as_`'s subject,
    /// is refused by the server (no answer).
    pub async fn impersonation_refused(&self, by: &str, as_: &str) -> anyhow::Result<bool> {
        let nats = nats_client(&self.worker(by)).await?;
        Ok(unanswered(&nats, format!("{}.{as_}", self.subject)).await)
    }
}

/// The demo's configuration on the secured dev stack: etcd's namespace user,
/// NATS's operator of the namespace, PostgreSQL's superuser.
fn operator_config(stack: &DevStack, name: &str) -> anyhow::Result<Config> {
    let auth = stack.auth().context("a secured stack")?;
    Ok(Config::new(name)
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_etcd_user(&auth.etcd_user, auth.etcd_password.clone())
        .with_nats_url(stack.nats_url())
        .with_nats_auth(auth.nats.operator.auth())
        .with_database_url(stack.database_url()))
}

/// Whether a request on `subject` goes unanswered (the server refused the
/// publish) within [`QUIET`].
async fn unanswered(nats: &async_nats::Client, subject: String) -> bool {
    let body = br#"{"kind":"vm","name":"intruder"}"#.to_vec();
    let request = nats.request(subject, body.into());
    !matches!(tokio::time::timeout(QUIET, request).await, Ok(Ok(_)))
}
