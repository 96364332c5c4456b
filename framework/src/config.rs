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
}

/// Tenure's configuration. Build it in code ([`Config::new`]) or from the
/// environment ([`Config::from_env`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Namespace: etcd key prefix, NATS stream/consumer prefix. `[a-z0-9_]`.
    pub namespace: String,
    /// PostgreSQL schema holding Tenure's tables (default `tenure`).
    pub schema: String,
    /// etcd client endpoints.
    pub etcd_endpoints: Vec<String>,
    /// NATS URL.
    pub nats_url: String,
    /// PostgreSQL URL.
    pub database_url: String,
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
    /// Default number of lost owners before a job goes to the DLQ.
    pub max_takeovers: u32,
    /// Default number of failed attempts before a job goes to the DLQ.
    pub max_retries: u32,
    /// JetStream `MaxDeliver` backstop (the broker gives up after this many).
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
    /// TEST ONLY (feature `testing`), for the torture test's negative control:
    /// when true, the fence store builds its claim, admission and step-commit SQL
    /// without any fence (or step/status) predicate and the runtime skips the
    /// pre-commit lease-health check, so a stale owner's writes land. Never
    /// compiled into a build without the `testing` feature.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub unsafe_no_fencing: bool,
}

/// The largest [`Config::prefetch`].
pub const MAX_PREFETCH: usize = 1024;

impl Config {
    /// Defaults for namespace `namespace`, with local server addresses.
    pub fn new(namespace: impl Into<String>) -> Self {
        Config {
            namespace: namespace.into(),
            schema: "tenure".into(),
            etcd_endpoints: vec!["http://127.0.0.1:2379".into()],
            nats_url: "nats://127.0.0.1:4222".into(),
            database_url: "postgres://postgres@127.0.0.1:5432/tenure".into(),
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
            max_takeovers: 5,
            max_retries: 3,
            max_deliver: 1000,
            duplicate_window: Duration::from_secs(120),
            stream_replicas: 1,
            nats_request_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(10),
            #[cfg(feature = "testing")]
            unsafe_no_fencing: false,
        }
    }

    /// Reads `TENURE_ETCD_ENDPOINTS` (comma-separated), `TENURE_NATS_URL`,
    /// `TENURE_DATABASE_URL` (all required), and optionally `TENURE_NAMESPACE`
    /// (default `tenure`), `TENURE_SCHEMA`, `TENURE_WORKER_ID`, `TENURE_LEASE_TTL_MS`,
    /// `TENURE_STREAM_REPLICAS`, `TENURE_PREFETCH`.
    ///
    /// # Errors
    /// A missing required variable or an invalid value.
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let mut cfg = Config::new(var("TENURE_NAMESPACE").unwrap_or_else(|| "tenure".into()));
        cfg.etcd_endpoints = var("TENURE_ETCD_ENDPOINTS")
            .ok_or(ConfigError::Missing("TENURE_ETCD_ENDPOINTS"))?
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        cfg.nats_url = var("TENURE_NATS_URL").ok_or(ConfigError::Missing("TENURE_NATS_URL"))?;
        cfg.database_url =
            var("TENURE_DATABASE_URL").ok_or(ConfigError::Missing("TENURE_DATABASE_URL"))?;
        if let Some(s) = var("TENURE_SCHEMA") {
            cfg.schema = s;
        }
        if let Some(w) = var("TENURE_WORKER_ID") {
            cfg.worker_id = w;
        }
        // An optional number: absent (or blank) keeps the default.
        fn number<T: std::str::FromStr>(
            var: impl Fn(&str) -> Option<String>,
            name: &'static str,
        ) -> Result<Option<T>, ConfigError>
        where
            T::Err: std::fmt::Display,
        {
            var(name)
                .map(|v| {
                    v.parse().map_err(|e| ConfigError::Invalid {
                        name,
                        reason: format!("{e}"),
                    })
                })
                .transpose()
        }
        if let Some(n) = number(var, "TENURE_STREAM_REPLICAS")? {
            cfg.stream_replicas = n;
        }
        if let Some(n) = number(var, "TENURE_PREFETCH")? {
            cfg.prefetch = n;
        }
        if let Some(ms) = number(var, "TENURE_LEASE_TTL_MS")? {
            cfg.lease_ttl = Duration::from_millis(ms);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Whether all three `TENURE_*` server variables are set (examples use this to
    /// choose real servers over the embedded dev stack).
    pub fn env_has_servers() -> bool {
        [
            "TENURE_ETCD_ENDPOINTS",
            "TENURE_NATS_URL",
            "TENURE_DATABASE_URL",
        ]
        .iter()
        .all(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
    }

    /// Checks names and bounds.
    ///
    /// # Errors
    /// The first invalid setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ident = |name: &'static str, v: &str| {
            let ok = !v.is_empty()
                && v.len() <= 48
                && v.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !v.starts_with(|c: char| c.is_ascii_digit());
            if ok {
                Ok(())
            } else {
                Err(ConfigError::Invalid {
                    name,
                    reason: format!(
                        "{v:?} must be 1-48 chars of [a-z0-9_], not starting with a digit"
                    ),
                })
            }
        };
        ident("namespace", &self.namespace)?;
        ident("schema", &self.schema)?;
        if self.etcd_endpoints.is_empty() {
            return Err(ConfigError::Missing("etcd_endpoints"));
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                name: "lease_ttl",
                reason: "etcd leases have whole-second TTLs; use at least 1 s".into(),
            });
        }
        if self.lease_ttl.subsec_nanos() != 0 {
            return Err(ConfigError::Invalid {
                name: "lease_ttl",
                reason: "etcd leases have whole-second TTLs".into(),
            });
        }
        if self.nats_request_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                name: "nats_request_timeout",
                reason: "must be positive".into(),
            });
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::Invalid {
                name: "max_in_flight",
                reason: "must be at least 1".into(),
            });
        }
        if self.prefetch > MAX_PREFETCH {
            return Err(ConfigError::Invalid {
                name: "prefetch",
                reason: format!(
                    "{} is more than {MAX_PREFETCH} deliveries ahead of the running jobs",
                    self.prefetch
                ),
            });
        }
        if !(1..=5).contains(&self.stream_replicas) {
            return Err(ConfigError::Invalid {
                name: "stream_replicas",
                reason: format!(
                    "{} is not a JetStream replica count (1 to 5)",
                    self.stream_replicas
                ),
            });
        }
        Ok(())
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
    /// Builder: worker id.
    pub fn with_worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = id.into();
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
    /// Etcd key prefix of this namespace: `<ns>/`.
    pub fn etcd_prefix(&self) -> String {
        format!("{}/", self.namespace)
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "worker".into());
    format!("{host}-{}", std::process::id())
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
    }
}
