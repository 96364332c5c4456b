//! The settings table: every [`Config`] field a process can set from outside
//! the code, under one `TENURE_*` variable each. [`Config::from_env`],
//! [`Config::with_vars`], the
//! `tenure` CLI and the configuration reference (`guide::configuration`,
//! generated from [`reference`]) all read this one table, so a new field
//! needs one line here to be settable everywhere.
//!
//! The naming rule: `TENURE_` and the field's path in capitals, dots as
//! underscores (`tuning.fetch_wait` is `TENURE_TUNING_FETCH_WAIT`). The TLS
//! and NATS credential variables keep the shorter names they had before the
//! table (`TENURE_ETCD_CA_FILE`, `TENURE_NATS_TOKEN`, ...).

use std::path::PathBuf;
use std::time::Duration;

use super::value::Value;
use super::{Config, ConfigError};
use crate::security::{NatsAuth, Secret, TlsFiles};

/// One setting: its variable, the [`Config`] field it sets, and how.
pub struct Setting {
    /// The environment variable (also what the CLI's flag overrides).
    pub var: &'static str,
    /// The field's path in [`Config`] (`tuning.fetch_wait`).
    pub field: &'static str,
    /// One line on what it does (the field's docs say more).
    pub doc: &'static str,
    kind: &'static str,
    apply: fn(&mut Config, &str) -> Result<(), String>,
    show: fn(&Config) -> String,
}

impl Setting {
    /// What the value's text looks like (`duration`, `number`, ...).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The setting's value in `cfg`, as text the variable would take
    /// (secrets as `***`).
    pub fn show(&self, cfg: &Config) -> String {
        (self.show)(cfg)
    }

    /// Sets the field from `text`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the variable, when `text` is not a
    /// value of the setting's kind; `cfg` is then unchanged.
    pub fn apply(&self, cfg: &mut Config, text: &str) -> Result<(), ConfigError> {
        (self.apply)(cfg, text.trim()).map_err(|reason| ConfigError::Invalid {
            name: self.var,
            reason,
        })
    }
}

impl std::fmt::Debug for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setting")
            .field("var", &self.var)
            .field("field", &self.field)
            .field("kind", &self.kind)
            .finish()
    }
}

/// A setting of a field path whose type has a text form ([`Value`]).
macro_rules! field {
    ($var:literal, $first:ident $(. $rest:ident)*: $ty:ty, $doc:literal) => {
        Setting {
            var: $var,
            field: concat!(stringify!($first) $(, ".", stringify!($rest))*),
            doc: $doc,
            kind: <$ty as Value>::KIND,
            apply: |cfg, text| {
                cfg.$first $(.$rest)* = <$ty as Value>::parse(text)?;
                Ok(())
            },
            show: |cfg| <$ty as Value>::show(&cfg.$first $(.$rest)*),
        }
    };
}

/// One file of a server's TLS: setting any of the three turns TLS on.
macro_rules! tls_file {
    ($var:literal, $tls:ident . $file:ident, $doc:literal) => {
        Setting {
            var: $var,
            field: concat!(stringify!($tls), ".", stringify!($file)),
            doc: $doc,
            kind: <Option<PathBuf> as Value>::KIND,
            apply: |cfg, text| {
                let file = <Option<PathBuf> as Value>::parse(text)?;
                cfg.$tls.get_or_insert_with(TlsFiles::default).$file = file;
                Ok(())
            },
            show: |cfg| {
                let file = cfg.$tls.as_ref().and_then(|t| t.$file.clone());
                <Option<PathBuf> as Value>::show(&file)
            },
        }
    };
}

/// One kind of NATS credential: each replaces [`Config::nats_auth`].
macro_rules! nats_auth {
    ($var:literal, $kind:literal, $doc:literal, $make:expr, $show:expr) => {
        Setting {
            var: $var,
            field: "nats_auth",
            doc: $doc,
            kind: $kind,
            apply: |cfg, text| {
                cfg.nats_auth = $make(text);
                Ok(())
            },
            show: $show,
        }
    };
}

/// The NATS credential variables: at most one of them may be set.
pub(super) const NATS_CREDENTIALS: [&str; 4] = [
    "TENURE_NATS_USER",
    "TENURE_NATS_TOKEN",
    "TENURE_NATS_CREDS_FILE",
    "TENURE_NATS_NKEY",
];

/// The two spellings of the lease TTL: at most one may be set.
pub(super) const LEASE_TTL_VARS: [&str; 2] = ["TENURE_LEASE_TTL", "TENURE_LEASE_TTL_MS"];

fn nats_password(cfg: &mut Config, text: &str) -> Result<(), String> {
    match &mut cfg.nats_auth {
        NatsAuth::UserPassword { password, .. } => {
            *password = Secret::new(text);
            Ok(())
        }
        _ => Err("a NATS password needs TENURE_NATS_USER".into()),
    }
}

fn lease_ttl_ms(cfg: &mut Config, text: &str) -> Result<(), String> {
    let ms: u64 = Value::parse(text)?;
    cfg.lease_ttl = Duration::from_millis(ms);
    Ok(())
}

/// Every setting, in the order [`Config::with_vars`] applies them.
pub static SETTINGS: &[Setting] = &[
    // Servers and names.
    field!("TENURE_NAMESPACE", namespace: String, "etcd key prefix and NATS stream prefix, `[a-z0-9_]`"),
    field!("TENURE_SCHEMA", schema: String, "PostgreSQL schema of Tenure's tables"),
    field!("TENURE_ETCD_ENDPOINTS", etcd_endpoints: Vec<String>, "etcd client endpoints (required by `from_env`)"),
    field!("TENURE_NATS_URL", nats_url: String, "NATS URL (required by `from_env`)"),
    field!("TENURE_DATABASE_URL", database_url: String, "PostgreSQL URL, TLS as libpq's `sslmode` (required by `from_env`)"),
    field!("TENURE_WORKER_ID", worker_id: String, "this worker's name in logs, metrics and lock values"),
    // TLS and credentials.
    tls_file!(
        "TENURE_ETCD_CA_FILE",
        etcd_tls.ca_file,
        "CA bundle (PEM) for etcd; any etcd TLS file turns TLS on"
    ),
    tls_file!(
        "TENURE_ETCD_CERT_FILE",
        etcd_tls.cert_file,
        "client certificate (PEM) for etcd, with its key"
    ),
    tls_file!(
        "TENURE_ETCD_KEY_FILE",
        etcd_tls.key_file,
        "the etcd client certificate's key (PEM)"
    ),
    field!("TENURE_ETCD_USER", etcd_user: Option<String>, "etcd user, with `TENURE_ETCD_PASSWORD`"),
    field!("TENURE_ETCD_PASSWORD", etcd_password: Option<Secret>, "etcd password"),
    tls_file!(
        "TENURE_NATS_CA_FILE",
        nats_tls.ca_file,
        "CA bundle (PEM) for NATS; any NATS TLS file requires TLS"
    ),
    tls_file!(
        "TENURE_NATS_CERT_FILE",
        nats_tls.cert_file,
        "client certificate (PEM) for NATS, with its key"
    ),
    tls_file!(
        "TENURE_NATS_KEY_FILE",
        nats_tls.key_file,
        "the NATS client certificate's key (PEM)"
    ),
    nats_auth!(
        "TENURE_NATS_USER",
        "text",
        "NATS user, with `TENURE_NATS_PASSWORD`",
        |user: &str| NatsAuth::UserPassword {
            user: user.into(),
            password: Secret::new("")
        },
        |cfg| match &cfg.nats_auth {
            NatsAuth::UserPassword { user, .. } => user.clone(),
            _ => String::new(),
        }
    ),
    Setting {
        var: "TENURE_NATS_PASSWORD",
        field: "nats_auth",
        doc: "NATS password of `TENURE_NATS_USER`",
        kind: "secret",
        apply: nats_password,
        show: |cfg| match &cfg.nats_auth {
            NatsAuth::UserPassword { .. } => "***".into(),
            _ => String::new(),
        },
    },
    nats_auth!(
        "TENURE_NATS_TOKEN",
        "secret",
        "NATS token",
        |t: &str| NatsAuth::Token(Secret::new(t)),
        |cfg| match &cfg.nats_auth {
            NatsAuth::Token(_) => "***".into(),
            _ => String::new(),
        }
    ),
    nats_auth!(
        "TENURE_NATS_CREDS_FILE",
        "file path",
        "NATS `.creds` file (JWT and nkey seed)",
        |p: &str| NatsAuth::CredsFile(p.into()),
        |cfg| match &cfg.nats_auth {
            NatsAuth::CredsFile(p) => p.display().to_string(),
            _ => String::new(),
        }
    ),
    nats_auth!(
        "TENURE_NATS_NKEY",
        "secret",
        "NATS nkey seed (`SU...`)",
        |k: &str| NatsAuth::NKey(Secret::new(k)),
        |cfg| match &cfg.nats_auth {
            NatsAuth::NKey(_) => "***".into(),
            _ => String::new(),
        }
    ),
    field!("TENURE_DATABASE_PASSWORD", database_password: Option<Secret>, "PostgreSQL password, kept out of the URL"),
    field!("TENURE_ALLOW_INSECURE_TRANSPORT", allow_insecure_transport: bool, "send credentials off loopback without verified TLS"),
    // The session and the fence.
    field!("TENURE_LEASE_TTL", lease_ttl: Duration, "session lease TTL, whole seconds; keepalive, `Degraded` and `Lost` follow it"),
    Setting {
        var: "TENURE_LEASE_TTL_MS",
        field: "lease_ttl",
        doc: "deprecated spelling of `TENURE_LEASE_TTL`, in milliseconds",
        kind: "number",
        apply: lease_ttl_ms,
        show: |cfg| cfg.lease_ttl.as_millis().to_string(),
    },
    field!("TENURE_WATCHDOG", watchdog: super::WatchdogPolicy, "what a `Lost` session does to running jobs"),
    field!("TENURE_SESSION_BACKOFF_BASE", session_backoff.base: Duration, "first wait before forming a new session after `Lost`"),
    field!("TENURE_SESSION_BACKOFF_CAP", session_backoff.cap: Duration, "longest wait before forming a new session"),
    field!("TENURE_CONTENTION_BACKOFF_BASE", contention_backoff.base: Duration, "first wait before re-acquiring a contended job lock"),
    field!("TENURE_CONTENTION_BACKOFF_CAP", contention_backoff.cap: Duration, "longest wait before re-acquiring a contended job lock"),
    field!("TENURE_RETRY_BACKOFF_BASE", retry_backoff.base: Duration, "first wait before retrying a failed step"),
    field!("TENURE_RETRY_BACKOFF_CAP", retry_backoff.cap: Duration, "longest wait before retrying a failed step"),
    field!("TENURE_ETCD_REQUEST_TIMEOUT", etcd_request_timeout: Duration, "timeout of one etcd request"),
    // Limits.
    field!("TENURE_MAX_IN_FLIGHT", max_in_flight: usize, "jobs a worker runs at once"),
    field!("TENURE_PREFETCH", prefetch: usize, "deliveries fetched and locked ahead of the running jobs (0: off)"),
    field!("TENURE_PARTITIONS", partitions: Option<u32>, "partition mode with this many partitions per job type (`none`: a lock per job)"),
    field!("TENURE_MAX_TAKEOVERS", max_takeovers: u32, "lost owners before a job goes to the DLQ"),
    field!("TENURE_MAX_RETRIES", max_retries: u32, "failed attempts before a job goes to the DLQ"),
    field!("TENURE_MAX_DELIVER", max_deliver: i64, "JetStream `MaxDeliver` backstop"),
    field!("TENURE_DUPLICATE_WINDOW", duplicate_window: Duration, "JetStream duplicate window for `Nats-Msg-Id`"),
    field!("TENURE_STREAM_REPLICAS", stream_replicas: usize, "replicas of Tenure's JetStream streams, 1 to 5"),
    field!("TENURE_NATS_REQUEST_TIMEOUT", nats_request_timeout: Duration, "timeout of one NATS request"),
    field!("TENURE_SHUTDOWN_GRACE", shutdown_grace: Duration, "how long graceful shutdown waits for running steps"),
    field!("TENURE_MAX_DELAY", max_delay: Duration, "longest delay `enqueue_after`/`enqueue_at` accept"),
    field!("TENURE_DEFINITION_GRACE", definition_grace: Duration, "how long a job of a changed definition waits for a compatible worker"),
    // Retention.
    field!("TENURE_RETENTION_DONE_AFTER", retention.done_after: Option<Duration>, "delete `done` rows this long after they finished"),
    field!("TENURE_RETENTION_CANCELLED_AFTER", retention.cancelled_after: Option<Duration>, "delete `cancelled` rows this long after"),
    field!("TENURE_RETENTION_DEAD_AFTER", retention.dead_after: Option<Duration>, "delete `dead` rows this long after they died"),
    field!("TENURE_RETENTION_KEYS_AFTER", retention.keys_after: Option<Duration>, "how long a pruned job's idempotency key stays used"),
    field!("TENURE_RETENTION_DLQ_MAX_AGE", retention.dlq_max_age: Option<Duration>, "the DLQ stream's `max_age`"),
    field!("TENURE_RETENTION_BATCH", retention.batch: usize, "rows deleted per prune statement"),
    field!("TENURE_RETENTION_EVERY", retention.every: Duration, "how often the leader prunes"),
    // Tuning (none affects safety; see `config::Tuning`).
    field!("TENURE_TUNING_CONTENTION_RETRY_DIVISOR", tuning.contention_retry_divisor: u32, "a contended lock is retried every TTL / this"),
    field!("TENURE_TUNING_STEP_TX_WINDOW", tuning.step_tx_window: Duration, "how long a step's opened transaction waits for `ctx.db()`"),
    field!("TENURE_TUNING_HOLD_AHEAD_BUDGET", tuning.hold_ahead_budget: Duration, "intended wait of a delivery held ahead"),
    field!("TENURE_TUNING_HOLD_AHEAD_MAX_WAIT", tuning.hold_ahead_max_wait: Duration, "longest wait of a delivery held ahead"),
    field!("TENURE_TUNING_RUN_TIME_MEAN_SHIFT", tuning.run_time_mean_shift: u32, "weight of a new run time in the mean, as a shift"),
    field!("TENURE_TUNING_FETCH_WAIT", tuning.fetch_wait: Duration, "how long one fetch waits for the broker"),
    field!("TENURE_TUNING_FETCH_WAIT_SEVERAL", tuning.fetch_wait_several: Duration, "how often a waiting fetch asks again"),
    field!("TENURE_TUNING_FETCH_WAIT_NOW", tuning.fetch_wait_now: Duration, "wait per type after a round that delivered"),
    field!("TENURE_TUNING_PARTITION_RESYNC", tuning.partition_resync: Duration, "partition mode: re-read of the owners without a watch event"),
    field!("TENURE_TUNING_STAND_DOWN_AFTER", tuning.stand_down_after: Option<Duration>, "partition mode: unreachable servers before standing down (`none`: the TTL)"),
    field!("TENURE_TUNING_COMMIT_CLAIM_FIRST", tuning.commit_claim_first: bool, "commit the claim before the first step"),
    field!("TENURE_TUNING_SERVER_PROBE", tuning.server_probe: Duration, "partition mode: probe period of a suspected server"),
    field!("TENURE_TUNING_FETCH_UNHEALTHY_RECHECK", tuning.fetch_unhealthy_recheck: Duration, "recheck period of a fetcher whose session is not `Healthy`"),
    field!("TENURE_TUNING_FETCH_ERROR_PAUSE", tuning.fetch_error_pause: Duration, "pause after a failed fetch"),
    field!("TENURE_TUNING_LOCK_ACQUIRE_LINGER", tuning.lock_acquire_linger: Duration, "wait of a lock batch for announced acquisitions"),
    field!("TENURE_TUNING_LOCK_RELEASE_LINGER", tuning.lock_release_linger: Duration, "wait of a deferred lock release for a batch"),
    field!("TENURE_TUNING_LOCK_RELEASE_FLUSH", tuning.lock_release_flush: usize, "deferred releases that send a batch at once"),
    field!("TENURE_TUNING_LOCK_RELEASE_RETRY_BASE", tuning.lock_release_retry.base: Duration, "first retry of a failed lock release"),
    field!("TENURE_TUNING_LOCK_RELEASE_RETRY_CAP", tuning.lock_release_retry.cap: Duration, "longest retry of a failed lock release"),
    field!("TENURE_TUNING_LOCK_RELEASE_GIVE_UP", tuning.lock_release_give_up: Duration, "a failed lock release is given up after this"),
    field!("TENURE_TUNING_LOCK_QUEUE", tuning.lock_queue: usize, "lock requests queued for the lock service at most"),
    field!("TENURE_TUNING_SHUTDOWN_CANCEL_WAIT", tuning.shutdown_cancel_wait: Duration, "wait for cancelled steps after the shutdown grace"),
    field!("TENURE_TUNING_PROGRESS_MIN_PERIOD", tuning.progress_min_period: Duration, "shortest period of a running step's progress acks"),
    field!("TENURE_TUNING_DUE_POLL", tuning.due_poll: Duration, "longest sleep of the due-job publisher"),
    field!("TENURE_TUNING_PAUSE_POLL", tuning.pause_poll: Duration, "how often a worker reads the paused job types"),
    field!("TENURE_TUNING_DUE_BATCH", tuning.due_batch: usize, "due jobs published per batch"),
    field!("TENURE_TUNING_DUE_ROUND_BUDGET", tuning.due_round_budget: Duration, "how long one due-job round starts batches"),
    field!("TENURE_TUNING_LEADER_RETRY", tuning.leader_retry: Duration, "how often a non-leader campaigns again"),
    field!("TENURE_TUNING_SCHEDULE_GRACE", tuning.schedule_grace: Duration, "lateness beyond a failover a cron tick may have and be on time"),
];

impl Config {
    /// Applies every setting whose variable `lookup` gives, in table order;
    /// a blank value counts as unset. Does not validate: see
    /// [`Config::with_vars`].
    ///
    /// Returns the variables it applied.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first variable whose value is not
    /// of its kind, or two that contradict each other. `self` may then be
    /// partly applied.
    pub(crate) fn apply_vars(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<&'static str>, ConfigError> {
        let given: Vec<(&'static Setting, String)> = SETTINGS
            .iter()
            .filter_map(|s| {
                lookup(s.var)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (s, v))
            })
            .collect();
        let applied: Vec<&'static str> = given.iter().map(|(s, _)| s.var).collect();
        for group in [&NATS_CREDENTIALS[..], &LEASE_TTL_VARS[..]] {
            let set: Vec<&'static str> = group
                .iter()
                .copied()
                .filter(|k| applied.contains(k))
                .collect();
            if let [first, second, ..] = set[..] {
                return Err(ConfigError::Invalid {
                    name: first,
                    reason: format!("{first} and {second} are both set; set one"),
                });
            }
        }
        for (setting, text) in &given {
            setting.apply(self, text)?;
        }
        Ok(applied)
    }
}

/// A [`Config::validate`] refusal of a field that a variable set (one of
/// `applied`), renamed to name the variable (`TENURE_PARTITIONS`, not
/// `partitions`).
pub(super) fn by_variable(err: ConfigError, applied: &[&'static str]) -> ConfigError {
    match err {
        ConfigError::Invalid { name, reason } => {
            let var = SETTINGS
                .iter()
                .find(|s| s.field == name && applied.contains(&s.var))
                .map_or(name, |s| s.var);
            ConfigError::Invalid { name: var, reason }
        }
        other => other,
    }
}

/// The configuration reference: a Markdown table of every setting, its
/// variable, the kind of value and its default (`guide::configuration` is
/// this table, checked by a test).
pub fn reference() -> String {
    let defaults = Config::new("tenure");
    let mut out = String::from(
        "| Variable | Value | Default | Sets | What it does |\n|---|---|---|---|---|\n",
    );
    for s in SETTINGS {
        let default = match s.show(&defaults) {
            _ if s.var == "TENURE_WORKER_ID" => "host name and process id".to_string(),
            text if text.is_empty() => "unset".to_string(),
            text => format!("`{text}`"),
        };
        out.push_str(&format!(
            "| `{}` | {} | {default} | `{}` | {} |\n",
            s.var, s.kind, s.field, s.doc
        ));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
