//! TLS and credentials for the three servers, and the one error every module
//! returns when a server refuses us ([`AccessError`]).
//!
//! This module talks to nothing: [`Config`](crate::Config) carries these values,
//! and `lease` (etcd), `queue` (NATS) and `fence` (PostgreSQL) apply them. A
//! [`Secret`] never prints: `Debug` and `Display` show `***`.
//!
//! ```
//! use tenure::security::{NatsAuth, Secret, TlsFiles};
//! let cfg = tenure::Config::new("payments")
//!     .with_etcd_endpoints(["https://etcd-1:2379"])
//!     .with_etcd_tls(TlsFiles::new("/etc/tenure/ca.pem").with_client_cert("/etc/tenure/w.pem", "/etc/tenure/w.key"))
//!     .with_etcd_user("tenure_worker", Secret::new("s3cret"))
//!     .with_nats_auth(NatsAuth::Token(Secret::new("t0ken")));
//! assert!(!format!("{cfg:?}").contains("s3cret"));
//! assert!(!format!("{cfg:?}").contains("t0ken"));
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

pub(crate) mod transport;

/// A password, token or key seed. `Debug` and `Display` print `***`; read it
/// with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    ///
    /// ```
    /// let s = tenure::security::Secret::new("hunter2");
    /// assert_eq!(format!("{s:?} {s}"), "*** ***");
    /// assert_eq!(s.expose(), "hunter2");
    /// ```
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, to hand to a client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// TLS to one server: the CA bundle that signs the server's certificate (PEM;
/// `None`: the system's roots) and, for mutual TLS, a client certificate and key
/// (PEM). Paths only: the files are read when connecting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA bundle (PEM) trusted for the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM), for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM), for mutual TLS.
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// TLS trusting the CA bundle at `ca_file`.
    ///
    /// ```
    /// let tls = tenure::security::TlsFiles::new("/etc/tenure/ca.pem");
    /// assert!(tls.cert_file.is_none());
    /// ```
    pub fn new(ca_file: impl Into<PathBuf>) -> Self {
        TlsFiles {
            ca_file: Some(ca_file.into()),
            ..TlsFiles::default()
        }
    }

    /// TLS trusting the system's root certificates.
    pub fn system_roots() -> Self {
        TlsFiles::default()
    }

    /// Adds a client certificate and its key (mutual TLS).
    pub fn with_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert_file = Some(cert.into());
        self.key_file = Some(key.into());
        self
    }

    /// Reads `path` for `server` (an [`AccessError`] naming the file, never its
    /// content, when it cannot).
    pub(crate) fn read(server: Server, address: &str, path: &Path) -> Result<Vec<u8>, AccessError> {
        std::fs::read(path).map_err(|e| AccessError {
            server,
            address: address.to_string(),
            step: AccessStep::ReadCredentials,
            detail: format!("{}: {e}", path.display()),
        })
    }
}

/// How Tenure authenticates to NATS (besides a client certificate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NatsAuth {
    /// Nothing (or what the URL carries).
    #[default]
    None,
    /// A user and password.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
    /// A token.
    Token(Secret),
    /// A `.creds` file (JWT and nkey seed), as `nsc` writes it.
    CredsFile(PathBuf),
    /// An nkey seed (`SU...`).
    NKey(Secret),
}

/// The server a failure is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Server {
    /// etcd (leases and locks).
    Etcd,
    /// NATS JetStream (delivery).
    Nats,
    /// PostgreSQL (job rows).
    Postgres,
    /// A MySQL/MariaDB database a step writes to (`fence::mysql`).
    MySql,
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Server::Etcd => "etcd",
            Server::Nats => "nats",
            Server::Postgres => "postgresql",
            Server::MySql => "mysql",
        })
    }
}

/// Which step of reaching a server failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccessStep {
    /// A CA, certificate, key or credentials file could not be read or parsed.
    ReadCredentials,
    /// TLS: the server's certificate is not trusted, ours was refused or is
    /// missing, or one side does not speak TLS.
    Tls,
    /// The user, password, token or key was refused.
    Authenticate,
    /// Authenticated, but the operation is not permitted to this user or role.
    Authorize,
}

impl fmt::Display for AccessStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessStep::ReadCredentials => "reading credentials failed",
            AccessStep::Tls => "TLS handshake failed",
            AccessStep::Authenticate => "authentication failed",
            AccessStep::Authorize => "permission denied",
        })
    }
}

/// A server refused us: TLS, authentication or permission. Names the server,
/// its address and the step, never a secret:
/// `etcd 127.0.0.1:2379: TLS handshake failed: unknown CA`.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{server}{}: {step}: {detail}", at(address))]
pub struct AccessError {
    /// The server.
    pub server: Server,
    /// Its address (`host:port`, without credentials); empty when the error
    /// came from a pooled connection whose address the error does not carry.
    pub address: String,
    /// What failed.
    pub step: AccessStep,
    /// Why, as far as the client library tells.
    pub detail: String,
}

/// A credential would travel without verified TLS to a server that is not on
/// this machine's loopback, and the configuration did not opt in with
/// `allow_insecure_transport`. Nothing was sent. Names the server, its
/// address, what would have travelled, why the connection is not verified
/// TLS, and the setting that makes it so; never the credential itself.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "{server} {address}: {credential} would be sent without verified TLS ({how}); {fix}, or opt in to sending it \
     anyway with allow_insecure_transport (TENURE_ALLOW_INSECURE_TRANSPORT=true)"
)]
pub struct InsecureTransport {
    /// The server.
    pub server: Server,
    /// Its address (`host:port`, or a Unix socket's path).
    pub address: String,
    /// What would have travelled, e.g. `a password`.
    pub credential: &'static str,
    /// Why the connection is not verified TLS, e.g. `sslmode=require without
    /// sslrootcert verifies no certificate`.
    pub how: &'static str,
    /// The setting that gives verified TLS to this server.
    pub fix: &'static str,
}

fn at(address: &str) -> String {
    if address.is_empty() {
        String::new()
    } else {
        format!(" {address}")
    }
}

/// Every message of an error and its sources, joined by `": "`.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = s.source();
    }
    parts.join(": ")
}

/// A TLS failure named plainly, from the text (Display or Debug, with sources)
/// of a client library's error; `None` when the text shows no TLS failure.
pub(crate) fn tls_failure(text: &str) -> Option<&'static str> {
    const MARKERS: [(&str, &str); 12] = [
        ("UnknownIssuer", "unknown CA"),
        ("Expired", "certificate expired"),
        ("NotValidForName", "certificate not valid for this host"),
        (
            "CertificateRequired",
            "the server requires a client certificate",
        ),
        (
            "certificate required",
            "the server requires a client certificate",
        ),
        (
            "UnknownCA",
            "the server does not trust the client certificate",
        ),
        (
            "BadCertificate",
            "the server refused the client certificate",
        ),
        (
            "bad certificate",
            "the server refused the client certificate",
        ),
        ("invalid peer certificate", "invalid server certificate"),
        ("InvalidContentType", "the server does not speak TLS"),
        ("CorruptMessage", "the server does not speak TLS"),
        ("HandshakeFailure", "handshake failure"),
    ];
    MARKERS
        .iter()
        .find(|(marker, _)| text.contains(marker))
        .map(|(_, plain)| *plain)
}

/// `host:port` of a URL, without scheme, credentials, path or query.
pub(crate) fn address_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split(['/', '?']).next().unwrap_or(rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    rest.to_string()
}

/// URL schemes whose lone user part (`postgres://alice@db`) is a user name;
/// in any other scheme it may be a token (`nats://t0ken@host`) and is redacted.
const USER_NAMING_SCHEMES: [&str; 4] = ["postgres", "postgresql", "mysql", "mariadb"];

/// Query keys whose values are secrets: any key containing one of these
/// (ASCII case-insensitive): `password`, `sslpassword`, `passwd`, `token`,
/// `auth_token`, `secret`, `nkey`, `jwt`, ...
const SECRET_QUERY_KEYS: [&str; 8] = [
    "pass", "pwd", "token", "secret", "nkey", "seed", "jwt", "key",
];

/// Query keys containing `key` that name a file, not a secret (kept).
const FILE_QUERY_KEYS: [&str; 2] = ["sslkey", "tls_key"];

/// `url` with every credential replaced by `***`: the password of
/// `user:password@`, a lone user part (a token: `nats://t0ken@host`) unless
/// the scheme names users that way (`postgres`, `mysql`, `mariadb`), and the
/// value of every secret query parameter (`?password=`, `?sslpassword=`,
/// `?token=`, ...), with or without a user part.
///
/// ```
/// use tenure::security::redact_url;
/// assert_eq!(redact_url("postgres://w:pw@db/app"), "postgres://w:***@db/app");
/// assert_eq!(redact_url("postgres://db/app?password=pw&sslmode=require"), "postgres://db/app?password=***&sslmode=require");
/// assert_eq!(redact_url("nats://t0ken@h:4222"), "nats://***@h:4222");
/// assert_eq!(redact_url("postgres://alice@db/app"), "postgres://alice@db/app");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let tail = redact_query(tail);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return format!("{scheme}://{authority}{tail}");
    };
    let names_users = USER_NAMING_SCHEMES
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme));
    let userinfo = match userinfo.split_once(':') {
        Some((user, _)) if names_users => format!("{user}:***"),
        None if names_users => userinfo.to_string(),
        _ => "***".to_string(),
    };
    format!("{scheme}://{userinfo}@{host}{tail}")
}

/// `text` with every URL in it (`scheme://...` up to a space or a quote)
/// passed through [`redact_url`]: for error messages and log lines that
/// may quote a URL.
///
/// ```
/// use tenure::security::redact_text;
/// assert_eq!(
///     redact_text("cannot connect to \"nats://t0ken@h:4222\": refused"),
///     "cannot connect to \"nats://***@h:4222\": refused"
/// );
/// ```
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+.-".contains(c)))
            .map_or(0, |i| i + 1);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || "\"'<>`".contains(c))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Whether query key `k` names a secret.
fn secret_query_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    !FILE_QUERY_KEYS.contains(&k.as_str()) && SECRET_QUERY_KEYS.iter().any(|s| k.contains(s))
}

/// A URL tail with the values of secret query keys replaced by `***`.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if secret_query_key(k) => format!("{k}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{path}?{}", pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(
            redact_url("postgres://w:pw@db:5432/app?sslmode=verify-full"),
            "postgres://w:***@db:5432/app?sslmode=verify-full"
        );
        assert_eq!(
            redact_url("postgres://w@db/app?password=pw&sslmode=require"),
            "postgres://w@db/app?password=***&sslmode=require"
        );
        assert_eq!(redact_url("nats://t0ken@h:4222"), "nats://***@h:4222");
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    }

    #[test]
    fn secrets_in_the_query_and_token_user_parts_are_redacted() {
        for (url, want) in [
            (
                "postgres://db/app?password=pw",
                "postgres://db/app?password=***",
            ),
            (
                "postgres://db/app?sslpassword=pw&sslmode=require",
                "postgres://db/app?sslpassword=***&sslmode=require",
            ),
            ("nats://h:4222?token=t0ken", "nats://h:4222?token=***"),
            (
                "postgres://db/app?sslkey=/k.pem",
                "postgres://db/app?sslkey=/k.pem",
            ),
        ] {
            assert_eq!(redact_url(url), want);
        }
        assert_eq!(redact_url("nats://t0ken@h:4222"), "nats://***@h:4222");
    }

    #[test]
    fn addresses_are_host_and_port() {
        assert_eq!(address_of("postgres://w:pw@db:5432/app?x=1"), "db:5432");
        assert_eq!(address_of("https://127.0.0.1:2379"), "127.0.0.1:2379");
        assert_eq!(address_of("127.0.0.1:2379"), "127.0.0.1:2379");
    }

    #[test]
    fn access_errors_name_server_and_step() {
        let e = AccessError {
            server: Server::Etcd,
            address: "127.0.0.1:2379".into(),
            step: AccessStep::Tls,
            detail: "unknown CA".into(),
        };
        assert_eq!(
            e.to_string(),
            "etcd 127.0.0.1:2379: TLS handshake failed: unknown CA"
        );
        assert_eq!(
            tls_failure("invalid peer certificate: UnknownIssuer"),
            Some("unknown CA")
        );
        assert_eq!(tls_failure("connection refused"), None);
    }
}
