//! Configuration: every timeout, limit and name lives here.
//!
//! ```
//! use std::time::Duration;
//! let cfg = tenure::Config::new("payments")
//!     .with_etcd_endpoints(["http://127.0.0.1:2379"])
//!     .with_lease_ttl(Duration::from_secs(6));
//! assert_eq!(cfg.keepalive_interval(), Duration::from_secs(1));
//! assert_eq!(cfg.lost_after(), Duration::from_millis(4200));
//! cfg.validate().unwrap();
//! ```

use std::time::Duration;

use crate::security::{InsecureTransport, NatsAuth, Secret, TlsFiles};

mod retention;
mod settings;
mod tuning;
mod value;

pub use retention::{MAX_PRUNE_BATCH, Retention};
pub use settings::{SETTINGS, Setting, reference};
pub use tuning::Tuning;
pub use value::{format_duration, parse_duration};

/// The server variables [`Config::from_env`] requires.
const SERVER_VARS: [&str; 3] = [
    "TENURE_ETCD_ENDPOINTS",
    "TENURE_NATS_URL",
    "TENURE_DATABASE_URL",
];

/// What the watchdog does when the session is `Lost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WatchdogPolicy {
    /// Cancel every running job's cancellation token (default). Enough when all
    /// of a step's I/O is bound to the token (async code).
    #[default]
    CancelJobs,
    /// Exit the process at once (`std::process::abort`). Choose it when steps may
    /// sit in blocking code that ignores cancellation; the fence still protects the
    /// resource, this only bounds how long a stale worker keeps running.
    AbortProcess,
}

/// Exponential backoff with jitter: `sleep = min(cap, base * 2^attempt) * rand(0.5, 1.5)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// The first interval.
    pub base: Duration,
    /// The largest interval before jitter.
    pub cap: Duration,
}

/// Errors in configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required setting is missing.
    #[error("missing setting: {0}")]
    Missing(&'static str),
    /// A setting has an invalid value.
    #[error("invalid {name}: {reason}")]
    Invalid {
        /// Which setting.
        name: &'static str,
        /// Why it is invalid.
        reason: String,
    },
    /// A credential would be sent without verified TLS to a server that is
    /// not on loopback, and [`Config::allow_insecure_transport`] is not set
    /// (see `guide::production`, TLS and credentials).
    #[error(transparent)]
    InsecureTransport(#[from] InsecureTransport),
}

/// Tenure's configuration. Build it in code ([`Config::new`]) or from the
/// environment ([`Config::from_env`]; every field but the pool has a
/// `TENURE_*` variable, listed in `guide::configuration`).
///
/// `Debug` never prints a secret: passwords in URLs, tokens and keys show as `***`.
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// Namespace: etcd key prefix, NATS stream/consumer prefix. `[a-z0-9_]`.
    pub namespace: String,
    /// PostgreSQL schema holding Tenure's tables (default `tenure`).
    pub schema: String,
    /// etcd client endpoints.
    pub etcd_endpoints: Vec<String>,
    /// NATS URL; for a cluster, several comma-separated
    /// (`nats://a:4222,nats://b:4222,nats://c:4222`): the client connects to
    /// one and fails over to the others.
    pub nats_url: String,
    /// PostgreSQL URL. Its TLS settings have libpq's meaning (rustls, no
    /// OpenSSL): `sslmode` (`disable`, `allow`, `prefer` (the default),
    /// `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert`,
    /// `sslkey`; `require` with `sslrootcert` verifies the certificate as
    /// `verify-ca` does. A password off loopback needs `verify-ca`,
    /// `verify-full` or `require` with `sslrootcert` (see
    /// [`allow_insecure_transport`](Self::allow_insecure_transport)).
    pub database_url: String,
    /// PostgreSQL password, when it is not in [`database_url`](Self::database_url).
    pub database_password: Option<Secret>,
    /// An existing pool the worker and the [`Client`](crate::Client) use instead of
    /// connecting to [`database_url`](Self::database_url). Build it from
    /// [`fence::pool_options`](crate::fence::pool_options), which applies Tenure's
    /// per-connection settings (see `guide::production`).
    pub database_pool: Option<sqlx::PgPool>,
    /// TLS to etcd (endpoints must then be `https://`).
    pub etcd_tls: Option<TlsFiles>,
    /// etcd user (etcd authentication), with [`etcd_password`](Self::etcd_password).
    pub etcd_user: Option<String>,
    /// etcd password.
    pub etcd_password: Option<Secret>,
    /// TLS to NATS (required when set).
    pub nats_tls: Option<TlsFiles>,
    /// NATS authentication besides a client certificate.
    pub nats_auth: NatsAuth,
    /// Send credentials to servers that are not on loopback without verified
    /// TLS (default `false`). Unset, [`validate`](Config::validate) refuses,
    /// as [`ConfigError::InsecureTransport`], an etcd user over an endpoint
    /// that is not `https://`, NATS credentials (user, token, `.creds`, nkey
    /// or the URL's user part) without [`nats_tls`](Self::nats_tls) or a
    /// `tls://` URL, and a PostgreSQL password unless `sslmode` is
    /// `verify-ca`, `verify-full`, or `require` with `sslrootcert` (which
    /// verifies as `verify-ca` does, as in libpq). The same setting governs
    /// `MySqlFence::connect` (feature `mysql`).
    /// Servers on 127.0.0.0/8, `::1`, `localhost` or a Unix socket are never
    /// refused. Set it only where the network itself is trusted.
    pub allow_insecure_transport: bool,
    /// This worker's name (logs, metrics, lock values).
    pub worker_id: String,
    /// Session lease TTL (default 5 s). Keepalive every TTL/6, `Degraded` after
    /// TTL/3 without an ack, `Lost` at 70% of TTL.
    pub lease_ttl: Duration,
    /// What to do when the session is lost.
    pub watchdog: WatchdogPolicy,
    /// Backoff between attempts to form a new session after `Lost`.
    pub session_backoff: BackoffConfig,
    /// Backoff between re-acquire attempts of a contended job lock.
    pub contention_backoff: BackoffConfig,
    /// Backoff between retries of a failed step.
    pub retry_backoff: BackoffConfig,
    /// Timeout of a single etcd request (lock create, re-read, release).
    pub etcd_request_timeout: Duration,
    /// Jobs a worker runs at once.
    pub max_in_flight: usize,
    /// Deliveries a worker may fetch and lock ahead of its running jobs, so that
    /// it fetches and locks in groups (one etcd Txn for several jobs) instead of
    /// one job at a time as slots free (default 32; 0 turns it off). Bounded by
    /// time too: the room ahead is sized so that a delivery waits about 50 ms
    /// for a run slot, from the mean job time, so a worker whose jobs take long
    /// holds none ahead (see `ARCHITECTURE.md`, fetching in groups).
    pub prefetch: usize,
    /// Partition mode (`Some(p)`): every job type's jobs are split into `p`
    /// partitions by job id ([`JobId::partition`](crate::JobId::partition)),
    /// workers own partitions through etcd and run their jobs under the
    /// partition's token, with no etcd request per job. `None` (default):
    /// one etcd lock per job. The namespace records the choice once, at the
    /// first worker start, [`Client::migrate`](crate::Client::migrate) or
    /// client publish (enqueue or redrive), and never changes it; a different
    /// one is refused from then on with
    /// [`FenceError::PartitionsChanged`](crate::fence::FenceError::PartitionsChanged):
    /// by a worker's start, by [`Client::connect`](crate::Client::connect),
    /// and by every publish of a client that connected before the record
    /// (checked before anything is written, so no job waits on a subject no
    /// worker consumes).
    /// 1 to [`MAX_PARTITIONS`]; sizing in `guide::production`.
    pub partitions: Option<u32>,
    /// Default number of lost owners before a job goes to the DLQ.
    pub max_takeovers: u32,
    /// Default number of failed attempts before a job goes to the DLQ.
    pub max_retries: u32,
    /// JetStream `MaxDeliver` backstop (the broker gives up after this many).
    /// Only deliveries nobody settled count toward it in practice: a
    /// delivery handed back (contention, a retry, a hand-over) is a nak below
    /// half of it and a renewed message from there
    /// ([`Delivery::hand_back`](crate::blocks::queue::Delivery::hand_back)),
    /// and a job a live owner holds is never ended by it.
    pub max_deliver: i64,
    /// JetStream duplicate window for `Nats-Msg-Id`.
    pub duplicate_window: Duration,
    /// Replicas of Tenure's JetStream streams (work, DLQ, advisories), 1 to 5
    /// (default 1). Set 3 on a clustered NATS so that a published job survives
    /// the loss of a server; a single server refuses more than 1.
    pub stream_replicas: usize,
    /// Timeout of a single NATS request (a JetStream API call, a publish
    /// confirmation, a confirmed ack); also the slack a fetch allows past its wait
    /// for the server's answer (default 5 s).
    pub nats_request_timeout: Duration,
    /// How long graceful shutdown waits for running steps.
    pub shutdown_grace: Duration,
    /// The longest delay [`Client::enqueue_after`](crate::Client::enqueue_after)
    /// and [`Client::enqueue_at`](crate::Client::enqueue_at) accept (default 366
    /// days); a longer one is refused with
    /// [`ClientError::DelayTooLong`](crate::ClientError::DelayTooLong) and
    /// nothing is enqueued.
    pub max_delay: Duration,
    /// How long a job whose committed steps do not fit the definitions of the
    /// workers that find it waits for a worker with a compatible definition
    /// (a rolling deploy) before it is dead-lettered as `definition_changed`
    /// (default 10 minutes; see [`step_list`](crate::job::step_list)). Such a
    /// worker hands the job back to be redelivered after `definition_grace` /
    /// 100 (at least 100 ms), so waiting costs about 100 deliveries of the
    /// broker's [`max_deliver`](Config::max_deliver).
    pub definition_grace: Duration,
    /// The runtime's delays, windows and sizes (batching, fetching, hand-overs),
    /// each with the reason for its default. None affects safety.
    pub tuning: Tuning,
    /// How long finished job rows and dead letters are kept, and how they are
    /// pruned (default [`Retention::PRODUCTION`]: `done` and `cancelled` rows
    /// go after 30 days; `dead` rows, dead letters and keys stay).
    pub retention: Retention,
    /// TEST ONLY (feature `testing`), for the torture test's negative control:
    /// when true, the fence store builds its claim, admission and step-commit SQL
    /// without any fence (or step/status) predicate and the runtime skips the
    /// pre-commit lease-health check, so a stale owner's writes land. Never
    /// compiled into a build without the `testing` feature.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub unsafe_no_fencing: bool,
    /// TEST ONLY (feature `testing`): faults the runtime injects at named
    /// points of jobs ([`crate::testing::FaultPlan`]); `None` in every real run.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fault_plan: Option<crate::faults::FaultPlan>,
}

/// The largest [`Config::prefetch`].
pub const MAX_PREFETCH: usize = 1024;

/// The largest [`Config::partitions`].
pub const MAX_PARTITIONS: u32 = 1024;

impl Config {
    /// Defaults for namespace `namespace`, with local server addresses.
    pub fn new(namespace: impl Into<String>) -> Self {
        Config {
            namespace: namespace.into(),
            schema: "tenure".into(),
            etcd_endpoints: vec!["http://127.0.0.1:2379".into()],
            nats_url: "nats://127.0.0.1:4222".into(),
            database_url: "postgres://postgres@127.0.0.1:5432/tenure".into(),
            database_password: None,
            database_pool: None,
            etcd_tls: None,
            etcd_user: None,
            etcd_password: None,
            nats_tls: None,
            nats_auth: NatsAuth::None,
            allow_insecure_transport: false,
            worker_id: default_worker_id(),
            lease_ttl: Duration::from_secs(5),
            watchdog: WatchdogPolicy::CancelJobs,
            session_backoff: BackoffConfig {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(5),
            },
            contention_backoff: BackoffConfig {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(10),
            },
            retry_backoff: BackoffConfig {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(30),
            },
            etcd_request_timeout: Duration::from_secs(1),
            max_in_flight: 64,
            prefetch: 32,
            partitions: None,
            max_takeovers: 5,
            max_retries: 3,
            max_deliver: 1000,
            duplicate_window: Duration::from_secs(120),
            stream_replicas: 1,
            nats_request_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(10),
            max_delay: Duration::from_secs(366 * 24 * 3600),
            definition_grace: Duration::from_secs(600),
            tuning: Tuning::default(),
            retention: Retention::default(),
            #[cfg(feature = "testing")]
            unsafe_no_fencing: false,
            #[cfg(feature = "testing")]
            fault_plan: None,
        }
    }

    /// Reads the configuration from the environment: `TENURE_ETCD_ENDPOINTS`
    /// (comma-separated), `TENURE_NATS_URL` and `TENURE_DATABASE_URL` are
    /// required; every other setting has a variable too ([`SETTINGS`], the
    /// table in `guide::configuration`), durations in human form (`5s`,
    /// `250ms`). [`from_vars`](Self::from_vars) with [`std::env::var`].
    ///
    /// # Errors
    /// A missing required variable, or an invalid value, naming its variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) with the variables `lookup` gives: the
    /// defaults of namespace `tenure`, then [`with_vars`](Self::with_vars).
    ///
    /// # Errors
    /// A missing server variable; a value that is not of its kind or out of
    /// bounds, as [`ConfigError::Invalid`] naming its variable.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let blank = |k: &str| lookup(k).is_none_or(|v| v.trim().is_empty());
        if let Some(missing) = SERVER_VARS.iter().find(|k| blank(k)) {
            return Err(ConfigError::Missing(missing));
        }
        Config::new("tenure").with_vars(lookup)
    }

    /// This configuration with every setting `lookup` gives applied over
    /// it ([`SETTINGS`], in table order; a blank value counts as unset),
    /// then [validated](Self::validate). What the code set stays unless a
    /// variable sets it again; any NATS credential variable replaces
    /// [`nats_auth`](Self::nats_auth). The `tenure` CLI builds its settings
    /// so, its flags over the environment.
    ///
    /// ```
    /// use std::time::Duration;
    /// let env = |k: &str| (k == "TENURE_TUNING_FETCH_WAIT").then(|| "250ms".to_string());
    /// let cfg = tenure::Config::new("payments").with_vars(env).unwrap();
    /// assert_eq!(cfg.tuning.fetch_wait, Duration::from_millis(250));
    /// assert_eq!(cfg.namespace, "payments");
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the variable: a value not of its
    /// kind, one out of bounds, or two that contradict each other (two NATS
    /// credentials, both spellings of the lease TTL).
    pub fn with_vars(
        mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let applied = self.apply_vars(lookup)?;
        self.validate()
            .map_err(|e| settings::by_variable(e, &applied))?;
        Ok(self)
    }

    /// Whether all three `TENURE_*` server variables are set (examples use this to
    /// choose real servers over the embedded dev stack).
    pub fn env_has_servers() -> bool {
        SERVER_VARS
            .iter()
            .all(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
    }

    /// Checks names and bounds.
    ///
    /// # Errors
    /// The first invalid setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_ident("namespace", &self.namespace)?;
        check_ident("schema", &self.schema)?;
        if self.etcd_endpoints.is_empty() {
            return Err(ConfigError::Missing("etcd_endpoints"));
        }
        self.validate_security()?;
        self.validate_lease()?;
        self.validate_limits()?;
        self.tuning.validate()?;
        self.retention.validate()?;
        self.validate_retention_windows()
    }

    /// The lease TTL (whole seconds, at least one) and the NATS request timeout.
    fn validate_lease(&self) -> Result<(), ConfigError> {
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(invalid(
                "lease_ttl",
                "etcd leases have whole-second TTLs; use at least 1 s",
            ));
        }
        if self.lease_ttl.subsec_nanos() != 0 {
            return Err(invalid("lease_ttl", "etcd leases have whole-second TTLs"));
        }
        if self.nats_request_timeout.is_zero() {
            return Err(invalid("nats_request_timeout", "must be positive"));
        }
        Ok(())
    }

    /// In-flight, partition, prefetch and replica counts.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.max_in_flight == 0 {
            return Err(invalid("max_in_flight", "must be at least 1"));
        }
        if let Some(p) = self
            .partitions
            .filter(|p| !(1..=MAX_PARTITIONS).contains(p))
        {
            return Err(invalid(
                "partitions",
                format!("{p} is not between 1 and {MAX_PARTITIONS}"),
            ));
        }
        if self.prefetch > MAX_PREFETCH {
            return Err(invalid(
                "prefetch",
                format!(
                    "{} is more than {MAX_PREFETCH} deliveries ahead of the running jobs",
                    self.prefetch
                ),
            ));
        }
        if !(1..=5).contains(&self.stream_replicas) {
            return Err(invalid(
                "stream_replicas",
                format!(
                    "{} is not a JetStream replica count (1 to 5)",
                    self.stream_replicas
                ),
            ));
        }
        Ok(())
    }

    /// Retention ages the broker's duplicate window bounds from below.
    fn validate_retention_windows(&self) -> Result<(), ConfigError> {
        let shorter = |age: Option<Duration>| age.is_some_and(|a| a < self.duplicate_window);
        if shorter(self.retention.dlq_max_age) {
            return Err(invalid(
                "retention.dlq_max_age",
                "must be at least duplicate_window (the broker refuses a shorter one)",
            ));
        }
        if shorter(self.retention.keys_after) {
            return Err(invalid(
                "retention.keys_after",
                "must be at least duplicate_window (a key reopened inside the window \
                 would have its new message dropped by the broker as a duplicate)",
            ));
        }
        Ok(())
    }

    /// TLS and credential settings that contradict each other or the URLs.
    fn validate_security(&self) -> Result<(), ConfigError> {
        let invalid = |name, reason: &str| {
            Err(ConfigError::Invalid {
                name,
                reason: reason.into(),
            })
        };
        let plain = self
            .etcd_endpoints
            .iter()
            .any(|e| !e.starts_with("https://"));
        if self.etcd_tls.is_some() && plain {
            return invalid(
                "etcd_endpoints",
                "etcd TLS is set: every endpoint must be https://",
            );
        }
        if self.etcd_user.is_some() != self.etcd_password.is_some() {
            return invalid("etcd_user", "set both the etcd user and its password");
        }
        for (name, tls) in [("etcd_tls", &self.etcd_tls), ("nats_tls", &self.nats_tls)] {
            if let Some(t) = tls
                && t.cert_file.is_some() != t.key_file.is_some()
            {
                return invalid(
                    name,
                    "a client certificate needs its key, and the other way round",
                );
            }
        }
        self.validate_transport()
    }

    /// No credential goes without verified TLS to a server off loopback,
    /// unless [`allow_insecure_transport`](Self::allow_insecure_transport).
    fn validate_transport(&self) -> Result<(), ConfigError> {
        use crate::security::transport;
        let mut links = transport::etcd_links(&self.etcd_endpoints, self.etcd_user.is_some());
        links.extend(transport::nats_links(
            &self.nats_url,
            &self.nats_auth,
            self.nats_tls.is_some(),
        ));
        links.push(transport::pg_link(&self.database_options()?));
        for link in &links {
            transport::check(link, self.allow_insecure_transport)?;
        }
        Ok(())
    }

    /// The PostgreSQL connect options Tenure will use: the given pool's, or
    /// those of [`database_url`](Self::database_url) and
    /// [`database_password`](Self::database_password).
    fn database_options(&self) -> Result<sqlx::postgres::PgConnectOptions, ConfigError> {
        if let Some(pool) = &self.database_pool {
            return Ok((*pool.connect_options()).clone());
        }
        crate::security::transport::pg_options(&self.database_url, self.database_password.as_ref())
            .map_err(|e| ConfigError::Invalid {
                name: "database_url",
                reason: crate::security::redact_text(&e.to_string()),
            })
    }

    /// Builder: namespace.
    pub fn with_namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }
    /// Builder: PostgreSQL schema.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
    /// Builder: etcd endpoints.
    pub fn with_etcd_endpoints<I, S>(mut self, eps: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.etcd_endpoints = eps.into_iter().map(Into::into).collect();
        self
    }
    /// Builder: NATS URL.
    pub fn with_nats_url(mut self, url: impl Into<String>) -> Self {
        self.nats_url = url.into();
        self
    }
    /// Builder: PostgreSQL URL.
    pub fn with_database_url(mut self, url: impl Into<String>) -> Self {
        self.database_url = url.into();
        self
    }
    /// Builder: PostgreSQL password (kept out of the URL).
    pub fn with_database_password(mut self, password: Secret) -> Self {
        self.database_password = Some(password);
        self
    }
    /// Builder: an existing PostgreSQL pool for the worker and the client (build
    /// it with [`fence::pool_options`](crate::fence::pool_options)).
    pub fn with_database_pool(mut self, pool: sqlx::PgPool) -> Self {
        self.database_pool = Some(pool);
        self
    }
    /// Builder: TLS to etcd (`https://` endpoints).
    pub fn with_etcd_tls(mut self, tls: TlsFiles) -> Self {
        self.etcd_tls = Some(tls);
        self
    }
    /// Builder: etcd user and password (etcd authentication).
    pub fn with_etcd_user(mut self, user: impl Into<String>, password: Secret) -> Self {
        self.etcd_user = Some(user.into());
        self.etcd_password = Some(password);
        self
    }
    /// Builder: TLS to NATS (required once set).
    pub fn with_nats_tls(mut self, tls: TlsFiles) -> Self {
        self.nats_tls = Some(tls);
        self
    }
    /// Builder: NATS authentication.
    pub fn with_nats_auth(mut self, auth: NatsAuth) -> Self {
        self.nats_auth = auth;
        self
    }
    /// Builder: send credentials without verified TLS to servers off
    /// loopback ([`Config::allow_insecure_transport`]).
    pub fn allow_insecure_transport(mut self) -> Self {
        self.allow_insecure_transport = true;
        self
    }
    /// Builder: worker id.
    pub fn with_worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = id.into();
        self
    }
    /// Builder: partition mode with `partitions` partitions per job type
    /// ([`Config::partitions`]).
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }
    /// Builder: lease TTL (whole seconds).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }
    /// Builder: timeout of a single NATS request.
    pub fn with_nats_request_timeout(mut self, timeout: Duration) -> Self {
        self.nats_request_timeout = timeout;
        self
    }
    /// Builder: replicas of Tenure's JetStream streams (1 to 5).
    pub fn with_stream_replicas(mut self, replicas: usize) -> Self {
        self.stream_replicas = replicas;
        self
    }
    /// Builder: deliveries fetched and locked ahead of the running jobs (0: off).
    pub fn with_prefetch(mut self, prefetch: usize) -> Self {
        self.prefetch = prefetch;
        self
    }
    /// Builder: watchdog policy.
    pub fn with_watchdog(mut self, policy: WatchdogPolicy) -> Self {
        self.watchdog = policy;
        self
    }

    /// Keepalive period: TTL/6, twice per `Degraded` window (TTL/3), so that one
    /// round trip of latency never turns a healthy session `Degraded`. (The design
    /// card says TTL/3; sending exactly every TTL/3 makes every ack arrive just
    /// after the TTL/3 threshold.)
    pub fn keepalive_interval(&self) -> Duration {
        self.degraded_after() / 2
    }
    /// `Healthy` -> `Degraded` when no ack arrived within this of the previous one (TTL/3).
    pub fn degraded_after(&self) -> Duration {
        self.lease_ttl / 3
    }
    /// `Degraded` -> `Lost` when no ack arrived by this (70% of TTL).
    pub fn lost_after(&self) -> Duration {
        self.lease_ttl.mul_f64(0.7)
    }
    /// Partition mode: how long a worker may fail to reach PostgreSQL or NATS
    /// before it hands its partitions back: [`Tuning::stand_down_after`], or
    /// the lease TTL when that is `None` (the default).
    pub fn stand_down_after(&self) -> Duration {
        self.tuning.stand_down_after.unwrap_or(self.lease_ttl)
    }
    /// JetStream `AckWait`, derived from the TTL so the broker and the coordinator
    /// agree on when a worker is gone.
    pub fn ack_wait(&self) -> Duration {
        self.lease_ttl
    }
    /// PostgreSQL `idle_in_transaction_session_timeout` of Tenure's connections
    /// (the lease TTL): a transaction left idle by a paused or partitioned owner is
    /// ended by the server, releasing the job row for the next owner. A step must
    /// not keep its database transaction idle for that long (do slow external work
    /// before its first [`StepCtx::db`](crate::StepCtx::db) call).
    pub fn idle_in_transaction_timeout(&self) -> Duration {
        self.lease_ttl
    }
    /// PostgreSQL `lock_timeout` of Tenure's connections (twice the lease TTL,
    /// longer than a stale owner's idle transaction can live).
    pub fn lock_timeout(&self) -> Duration {
        self.lease_ttl * 2
    }
    /// How late a cron tick may be when the scheduler leader first sees it
    /// and still be on time (enqueued whatever the schedule's
    /// [`MissedTicks`](crate::MissedTicks) policy): a leader failover
    /// (`lease_ttl`, how long a killed leader's key outlives it, plus
    /// `tuning.leader_retry`, how soon its successor campaigns) plus
    /// `tuning.schedule_grace`. 7.5 s with the defaults.
    ///
    /// ```
    /// use std::time::Duration;
    /// let cfg = tenure::Config::new("ns");
    /// assert_eq!(cfg.missed_tick_after(), Duration::from_millis(7500));
    /// ```
    pub fn missed_tick_after(&self) -> Duration {
        self.lease_ttl + self.tuning.leader_retry + self.tuning.schedule_grace
    }
    /// Etcd key prefix of this namespace: `<ns>/`.
    pub fn etcd_prefix(&self) -> String {
        format!("{}/", self.namespace)
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Config");
        d.field("namespace", &self.namespace)
            .field("schema", &self.schema)
            .field("etcd_endpoints", &self.etcd_endpoints)
            .field("nats_url", &crate::security::redact_url(&self.nats_url))
            .field(
                "database_url",
                &crate::security::redact_url(&self.database_url),
            )
            .field("database_password", &self.database_password)
            .field(
                "database_pool",
                &self.database_pool.as_ref().map(|_| "PgPool"),
            )
            .field("etcd_tls", &self.etcd_tls)
            .field("etcd_user", &self.etcd_user)
            .field("etcd_password", &self.etcd_password)
            .field("nats_tls", &self.nats_tls)
            .field("nats_auth", &self.nats_auth)
            .field("allow_insecure_transport", &self.allow_insecure_transport)
            .field("worker_id", &self.worker_id)
            .field("lease_ttl", &self.lease_ttl)
            .field("watchdog", &self.watchdog)
            .field("session_backoff", &self.session_backoff)
            .field("contention_backoff", &self.contention_backoff)
            .field("retry_backoff", &self.retry_backoff)
            .field("etcd_request_timeout", &self.etcd_request_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("prefetch", &self.prefetch)
            .field("partitions", &self.partitions)
            .field("max_takeovers", &self.max_takeovers)
            .field("max_retries", &self.max_retries)
            .field("max_deliver", &self.max_deliver)
            .field("duplicate_window", &self.duplicate_window)
            .field("stream_replicas", &self.stream_replicas)
            .field("nats_request_timeout", &self.nats_request_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("max_delay", &self.max_delay)
            .field("definition_grace", &self.definition_grace)
            .field("tuning", &self.tuning)
            .field("retention", &self.retention);
        #[cfg(feature = "testing")]
        d.field("unsafe_no_fencing", &self.unsafe_no_fencing);
        #[cfg(feature = "testing")]
        d.field("fault_plan", &self.fault_plan);
        d.finish()
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "worker".into());
    format!("{host}-{}", std::process::id())
}

/// A setting `name` refused for `reason`.
fn invalid(name: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name,
        reason: reason.into(),
    }
}

/// A namespace or schema name: 1-48 chars of `[a-z0-9_]`, not starting with a
/// digit (it becomes part of SQL, NATS and etcd names).
fn check_ident(name: &'static str, v: &str) -> Result<(), ConfigError> {
    let ok = !v.is_empty()
        && v.len() <= 48
        && v.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !v.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(invalid(
            name,
            format!("{v:?} must be 1-48 chars of [a-z0-9_], not starting with a digit"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_timings_follow_the_ttl() {
        let cfg = Config::new("t").with_lease_ttl(Duration::from_secs(6));
        assert_eq!(cfg.keepalive_interval(), Duration::from_secs(1));
        assert_eq!(cfg.degraded_after(), Duration::from_secs(2));
        assert_eq!(cfg.lost_after(), Duration::from_millis(4200));
    }

    #[test]
    fn bad_values_are_typed_errors() {
        assert!(matches!(
            Config::new("Bad-NS").validate(),
            Err(ConfigError::Invalid {
                name: "namespace",
                ..
            })
        ));
        assert!(matches!(
            Config::new("ok")
                .with_lease_ttl(Duration::from_millis(1500))
                .validate(),
            Err(ConfigError::Invalid {
                name: "lease_ttl",
                ..
            })
        ));
        assert!(Config::new("ok").validate().is_ok());
        for bad in [0, 6] {
            assert!(matches!(
                Config::new("ok").with_stream_replicas(bad).validate(),
                Err(ConfigError::Invalid {
                    name: "stream_replicas",
                    ..
                })
            ));
        }
        assert!(Config::new("ok").with_stream_replicas(3).validate().is_ok());
        assert!(matches!(
            Config::new("ok").with_prefetch(MAX_PREFETCH + 1).validate(),
            Err(ConfigError::Invalid {
                name: "prefetch",
                ..
            })
        ));
        assert!(Config::new("ok").with_prefetch(0).validate().is_ok());
        assert!(matches!(
            Config::new("ok")
                .with_etcd_tls(TlsFiles::new("/ca.pem"))
                .validate(),
            Err(ConfigError::Invalid {
                name: "etcd_endpoints",
                ..
            })
        ));
    }

    #[test]
    fn security_variables_are_read() {
        let env = |k: &str| {
            let v = match k {
                "TENURE_ETCD_CA_FILE" => "/etc/ca.pem",
                "TENURE_ETCD_USER" => "w",
                "TENURE_ETCD_PASSWORD" => "etcd-pw",
                "TENURE_NATS_CERT_FILE" => "/etc/n.pem",
                "TENURE_NATS_KEY_FILE" => "/etc/n.key",
                "TENURE_NATS_TOKEN" => "tok",
                "TENURE_DATABASE_PASSWORD" => "pg-pw",
                _ => return None,
            };
            Some(v.to_string())
        };
        let mut cfg = Config::new("ok");
        assert!(cfg.apply_vars(env).is_ok());
        assert_eq!(cfg.etcd_tls, Some(TlsFiles::new("/etc/ca.pem")));
        assert_eq!(cfg.etcd_password, Some(Secret::new("etcd-pw")));
        let nats = cfg.nats_tls.clone().unwrap_or_default();
        assert_eq!(
            nats.key_file.as_deref(),
            Some(std::path::Path::new("/etc/n.key"))
        );
        assert_eq!(cfg.nats_auth, NatsAuth::Token(Secret::new("tok")));
        assert_eq!(cfg.database_password, Some(Secret::new("pg-pw")));
        let two = |k: &str| env(k).or_else(|| (k == "TENURE_NATS_NKEY").then(|| "SU".into()));
        assert!(matches!(
            Config::new("ok").apply_vars(two),
            Err(ConfigError::Invalid {
                name: "TENURE_NATS_TOKEN",
                ..
            })
        ));
    }

    #[test]
    fn validate_refuses_a_credential_in_clear_by_server() {
        use crate::security::Server;
        let remote = Config::new("ok").with_database_url("postgres://w:pw@db/app");
        let refused = remote.validate();
        assert!(
            matches!(&refused, Err(ConfigError::InsecureTransport(e)) if e.server == Server::Postgres),
            "{refused:?}"
        );
        assert!(remote.clone().allow_insecure_transport().validate().is_ok());
        let env = |k: &str| (k == "TENURE_ALLOW_INSECURE_TRANSPORT").then(|| "true".to_string());
        let mut cfg = remote;
        assert!(cfg.apply_vars(env).is_ok());
        assert!(cfg.allow_insecure_transport && cfg.validate().is_ok());
        let bad = |k: &str| (k == "TENURE_ALLOW_INSECURE_TRANSPORT").then(|| "yes".to_string());
        assert!(matches!(
            Config::new("ok").apply_vars(bad),
            Err(ConfigError::Invalid {
                name: "TENURE_ALLOW_INSECURE_TRANSPORT",
                ..
            })
        ));
        let url = Config::new("ok").with_database_url("not a url");
        assert!(matches!(
            url.validate(),
            Err(ConfigError::Invalid {
                name: "database_url",
                ..
            })
        ));
    }

    #[test]
    fn debug_redacts_every_secret() {
        let cfg = Config::new("ok")
            .with_database_url("postgres://w:pg-pw@db/app?sslmode=verify-full")
            .with_database_password(Secret::new("pg-pw2"))
            .with_nats_url("nats://n-user:n-pw@nats:4222")
            .with_nats_auth(NatsAuth::NKey(Secret::new("SUnkey")))
            .with_etcd_user("w", Secret::new("etcd-pw"));
        let text = format!("{cfg:?}");
        for secret in ["pg-pw", "n-pw", "n-user", "SUnkey", "etcd-pw"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        assert!(text.contains("verify-full"), "{text}");
    }
}
