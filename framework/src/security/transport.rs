//! Whether a credential would travel without verified TLS: the one decision
//! [`Config::validate`](crate::Config::validate) (etcd, NATS, PostgreSQL) and
//! `MySqlFence::connect` (MariaDB, feature `mysql`)
//! apply before they connect.
//!
//! A credential (a password, token, `.creds` file or nkey) may go to a server
//! only over TLS that verifies the server's certificate, unless the server is
//! on this machine's loopback (127.0.0.0/8, `::1`, `localhost`, a Unix
//! socket) or the configuration opts in by name with
//! `allow_insecure_transport`. Everything here is pure: it reads settings and
//! parsed connect options, it connects to nothing.

use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::{InsecureTransport, Server};

/// How a connection to one server is protected, as Tenure will open it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protection {
    /// TLS that verifies the server's certificate against a CA.
    Verified,
    /// Not verified TLS: plaintext, or TLS that accepts any certificate (an
    /// active attacker in between reads everything). Says how, e.g.
    /// `"sslmode=require verifies no certificate"`.
    Unverified(&'static str),
}

/// One connection Tenure would open: to whom, how protected, with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) server: Server,
    /// `host:port` (no credentials), for the error.
    pub(crate) address: String,
    /// The host alone (name or IP literal, brackets removed); empty for a
    /// Unix socket.
    pub(crate) host: String,
    pub(crate) protection: Protection,
    /// The credential sent, if any (`"a password"`, `"a token"`, ...).
    pub(crate) credential: Option<&'static str>,
    /// The setting that gives verified TLS to this server.
    pub(crate) fix: &'static str,
}

/// The decision: a credential over unverified TLS to a host that is not
/// loopback is refused unless `allow_insecure_transport`.
pub(crate) fn check(link: &Link, allow_insecure_transport: bool) -> Result<(), InsecureTransport> {
    let Protection::Unverified(how) = link.protection else {
        return Ok(());
    };
    let Some(credential) = link.credential else {
        return Ok(());
    };
    if allow_insecure_transport || is_loopback(&link.host) {
        return Ok(());
    }
    Err(InsecureTransport {
        server: link.server,
        address: link.address.clone(),
        credential,
        how,
        fix: link.fix,
    })
}

/// Whether `host` is this machine: `localhost` (and its subdomains, which
/// resolve to loopback by RFC 6761), an IPv4 address in 127.0.0.0/8, `::1`,
/// or empty (a Unix socket).
pub(crate) fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() || name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// The host of a `host:port` address (an IPv6 literal keeps no brackets).
fn host_of(address: &str) -> String {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest).to_string();
    }
    match address.rsplit_once(':') {
        // A bare IPv6 literal has several colons and no port.
        Some((host, _)) if !host.contains(':') => host.to_string(),
        Some(_) => address.to_string(),
        None => address.to_string(),
    }
}

/// A URL's scheme (lowercase), if it has one.
fn scheme_of(url: &str) -> Option<String> {
    url.split_once("://").map(|(s, _)| s.to_ascii_lowercase())
}

/// Whether a URL carries credentials: a user part (`user:password@`, a
/// NATS token as `token@`) or a `password=` query parameter.
pub(crate) fn url_has_credentials(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let query = tail.split_once('?').map_or("", |(_, q)| q);
    authority.contains('@')
        || query.split('&').any(|pair| {
            pair.split_once('=')
                .is_some_and(|(k, _)| k.eq_ignore_ascii_case("password"))
        })
}

/// Every etcd endpoint, with the etcd user (if `has_user`) as its credential.
/// (`Config::validate` passes its fields: `security` sits below `config`.)
pub(crate) fn etcd_links(endpoints: &[String], has_user: bool) -> Vec<Link> {
    let credential = has_user.then_some("a user and password");
    endpoints
        .iter()
        .map(|endpoint| {
            let address = super::address_of(endpoint);
            // etcd-client speaks TLS to an https:// endpoint (verifying the
            // certificate, against etcd_tls's CA or its default roots) and
            // plaintext to any other.
            let protection = match scheme_of(endpoint).as_deref() {
                Some("https") => Protection::Verified,
                _ => Protection::Unverified("an endpoint that is not https:// is plaintext"),
            };
            Link {
                server: Server::Etcd,
                host: host_of(&address),
                address,
                protection,
                credential,
                fix: "use https:// endpoints with etcd_tls (TENURE_ETCD_CA_FILE)",
            }
        })
        .collect()
}

/// Every NATS server of [`Config::nats_url`](crate::Config::nats_url) (a comma-separated list), with
/// [`Config::nats_auth`](crate::Config::nats_auth) or the URL's user part as its credential.
pub(crate) fn nats_links(nats_url: &str, auth: &super::NatsAuth, has_tls: bool) -> Vec<Link> {
    use super::NatsAuth;
    let configured = match auth {
        NatsAuth::None => None,
        NatsAuth::UserPassword { .. } => Some("a user and password"),
        NatsAuth::Token(_) => Some("a token"),
        NatsAuth::CredsFile(_) => Some("a .creds file's JWT"),
        NatsAuth::NKey(_) => Some("an nkey signature"),
    };
    nats_url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|url| {
            let address = super::address_of(url);
            let tls_scheme = matches!(scheme_of(url).as_deref(), Some("tls" | "wss"));
            let protection = if has_tls || tls_scheme {
                Protection::Verified
            } else {
                Protection::Unverified(
                    "no NATS TLS settings: an attacker in between can strip the server's \
                     tls_required",
                )
            };
            let in_url = url_has_credentials(url).then_some("the URL's credentials");
            Link {
                server: Server::Nats,
                host: host_of(&address),
                address,
                protection,
                credential: configured.or(in_url),
                fix: "set nats_tls (TENURE_NATS_CA_FILE) or use a tls:// URL",
            }
        })
        .collect()
}

/// The connect options of a PostgreSQL URL and password as Tenure uses them:
/// sqlx's parse (which also reads `PG*` variables and `~/.pgpass`), the
/// password, and libpq's rule that `sslmode=require` with a root certificate
/// (`sslrootcert`, `PGSSLROOTCERT`) verifies the server as `verify-ca` does.
///
/// # Errors
/// A URL sqlx cannot parse.
pub(crate) fn pg_options(
    url: &str,
    password: Option<&super::Secret>,
) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = url.parse()?;
    let options = match password {
        Some(password) => options.password(password.expose()),
        None => options,
    };
    Ok(pg_verifying(options))
}

/// `require` with a root certificate becomes `verify-ca` (libpq's semantics;
/// sqlx alone would accept any certificate).
pub(crate) fn pg_verifying(options: PgConnectOptions) -> PgConnectOptions {
    let has_root = pg_query(&options).any(|(k, _)| k == "sslrootcert");
    match options.get_ssl_mode() {
        PgSslMode::Require if has_root => options.ssl_mode(PgSslMode::VerifyCa),
        _ => options,
    }
}

/// The options as sqlx would write them back as a URL's query (its only
/// view of the password and root certificate).
fn pg_query(options: &PgConnectOptions) -> impl Iterator<Item = (String, String)> {
    let url = options.to_url_lossy();
    url.query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect::<Vec<_>>()
        .into_iter()
}

/// The PostgreSQL connection `options` describe.
pub(crate) fn pg_link(options: &PgConnectOptions) -> Link {
    let has_password = options.to_url_lossy().password().is_some();
    let protection = match options.get_ssl_mode() {
        PgSslMode::VerifyCa | PgSslMode::VerifyFull => Protection::Verified,
        PgSslMode::Require => {
            Protection::Unverified("sslmode=require without sslrootcert verifies no certificate")
        }
        PgSslMode::Prefer => Protection::Unverified(
            "sslmode=prefer (sqlx's default) falls back to plaintext and verifies no certificate",
        ),
        PgSslMode::Allow => Protection::Unverified("sslmode=allow is plaintext"),
        PgSslMode::Disable => Protection::Unverified("sslmode=disable is plaintext"),
    };
    let (host, address) =
        host_and_address(options.get_socket(), options.get_host(), options.get_port());
    Link {
        server: Server::Postgres,
        address,
        host,
        protection,
        credential: has_password.then_some("a password"),
        fix: "use sslmode=verify-full with sslrootcert=<CA file> (or verify-ca)",
    }
}

/// The host (without IPv6 brackets; empty for a Unix socket) and the address
/// to name of a SQL server's connect options.
fn host_and_address(
    socket: Option<&std::path::PathBuf>,
    host: &str,
    port: u16,
) -> (String, String) {
    match socket {
        Some(socket) => (String::new(), socket.display().to_string()),
        None => (
            host.trim_start_matches('[').trim_end_matches(']').into(),
            format!("{host}:{port}"),
        ),
    }
}

#[cfg(feature = "mysql")]
pub(crate) use mysql::{mysql_link, mysql_verifying};

#[cfg(feature = "mysql")]
mod mysql {
    use sqlx::ConnectOptions;
    use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

    use super::{Link, Protection, Server};

    /// `REQUIRED` with a CA (`ssl-ca`) becomes `VERIFY_CA`, as the MySQL
    /// and MariaDB clients treat it (sqlx alone would accept any
    /// certificate).
    pub(crate) fn mysql_verifying(options: MySqlConnectOptions) -> MySqlConnectOptions {
        let url = options.to_url_lossy();
        let has_ca = url.query_pairs().any(|(k, _)| k == "ssl-ca");
        match options.get_ssl_mode() {
            MySqlSslMode::Required if has_ca => options.ssl_mode(MySqlSslMode::VerifyCa),
            _ => options,
        }
    }

    /// The MySQL/MariaDB connection `options` describe.
    pub(crate) fn mysql_link(options: &MySqlConnectOptions) -> Link {
        let has_password = options.to_url_lossy().password().is_some();
        let protection = match options.get_ssl_mode() {
            MySqlSslMode::VerifyCa | MySqlSslMode::VerifyIdentity => Protection::Verified,
            MySqlSslMode::Required => {
                Protection::Unverified("ssl-mode=REQUIRED without ssl-ca verifies no certificate")
            }
            MySqlSslMode::Preferred => Protection::Unverified(
                "ssl-mode=PREFERRED (the default) falls back to plaintext and verifies no \
                 certificate",
            ),
            MySqlSslMode::Disabled => Protection::Unverified("ssl-mode=DISABLED is plaintext"),
        };
        let (host, address) =
            super::host_and_address(options.get_socket(), options.get_host(), options.get_port());
        Link {
            server: Server::MySql,
            address,
            host,
            protection,
            credential: has_password.then_some("a password"),
            fix: "use ssl-mode=VERIFY_IDENTITY with ssl-ca=<CA file> (or VERIFY_CA)",
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::security::{NatsAuth, Secret, TlsFiles};

    /// The first refusal of `cfg`'s links, as `Config::validate` would meet it.
    fn refusal(cfg: &Config) -> Option<InsecureTransport> {
        let mut links = etcd_links(&cfg.etcd_endpoints, cfg.etcd_user.is_some());
        links.extend(nats_links(
            &cfg.nats_url,
            &cfg.nats_auth,
            cfg.nats_tls.is_some(),
        ));
        let pg = pg_options(&cfg.database_url, cfg.database_password.as_ref()).unwrap();
        links.push(pg_link(&pg));
        links
            .iter()
            .find_map(|l| check(l, cfg.allow_insecure_transport).err())
    }

    fn server_of(cfg: &Config) -> Option<Server> {
        refusal(cfg).map(|r| r.server)
    }

    #[test]
    fn loopback_hosts_are_this_machine() {
        for host in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
            "localhost",
            "LocalHost.",
            "",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "db",
            "10.0.0.1",
            "128.0.0.1",
            "::2",
            "localhost.evil.com",
            "0.0.0.0",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
        assert_eq!(host_of("[::1]:4222"), "::1");
        assert_eq!(host_of("db:5432"), "db");
        assert_eq!(host_of("db"), "db");
    }

    #[test]
    fn url_credentials_are_a_user_part_or_a_password_parameter() {
        assert!(url_has_credentials("nats://t0ken@nats:4222"));
        assert!(url_has_credentials("nats://u:p@nats:4222"));
        assert!(url_has_credentials(
            "postgres://db/app?sslmode=require&password=x"
        ));
        assert!(!url_has_credentials("nats://nats:4222"));
        assert!(!url_has_credentials("postgres://db/app?user=w"));
    }

    /// Each PostgreSQL `sslmode` with a password to a remote host: only
    /// verifying modes pass; `require` verifies once it has a root cert.
    #[test]
    fn postgres_needs_a_verifying_sslmode_for_a_password() {
        let remote = |query: &str| {
            Config::new("t").with_database_url(format!("postgres://w:pw@db:5432/app{query}"))
        };
        for query in [
            "",
            "?sslmode=prefer",
            "?sslmode=allow",
            "?sslmode=disable",
            "?sslmode=require",
        ] {
            let r = refusal(&remote(query)).expect(query);
            assert_eq!(
                (r.server, r.address.as_str()),
                (Server::Postgres, "db:5432")
            );
            assert!(!r.to_string().contains("pw"), "{r}");
            assert!(r.to_string().contains("allow_insecure_transport"), "{r}");
        }
        for query in [
            "?sslmode=verify-full&sslrootcert=/ca.pem",
            "?sslmode=verify-ca&sslrootcert=/ca.pem",
            "?sslmode=require&sslrootcert=/ca.pem",
        ] {
            assert_eq!(refusal(&remote(query)), None, "{query}");
        }
        // The password kept out of the URL counts; no password sends none.
        let out = Config::new("t")
            .with_database_url("postgres://w@db/app?sslmode=require")
            .with_database_password(Secret::new("pw"));
        assert_eq!(server_of(&out), Some(Server::Postgres));
        let none = Config::new("t").with_database_url("postgres://w@db/app?sslmode=disable");
        assert_eq!(refusal(&none), None);
        // Loopback and the opt-in pass.
        for url in [
            "postgres://w:pw@127.0.0.1/app?sslmode=disable",
            "postgres://w:pw@localhost/app",
            "postgres://w:pw@[::1]:5432/app",
            "postgres://w:pw@%2Fvar%2Frun%2Fpostgresql/app",
        ] {
            assert_eq!(
                refusal(&Config::new("t").with_database_url(url)),
                None,
                "{url}"
            );
        }
        assert_eq!(refusal(&remote("").allow_insecure_transport()), None);
    }

    #[test]
    fn require_with_a_root_cert_verifies_as_verify_ca() {
        let parse = |url: &str| pg_options(url, None).unwrap().get_ssl_mode();
        let verifies = |url: &str| matches!(parse(url), PgSslMode::VerifyCa);
        assert!(verifies(
            "postgres://db/app?sslmode=require&sslrootcert=/ca.pem"
        ));
        assert!(!verifies("postgres://db/app?sslmode=require"));
        assert!(matches!(
            parse("postgres://db/app?sslmode=verify-full&sslrootcert=/ca.pem"),
            PgSslMode::VerifyFull
        ));
    }

    #[test]
    fn nats_credentials_need_tls_settings_or_a_tls_url() {
        let remote = |auth: NatsAuth| {
            Config::new("t")
                .with_nats_url("nats://nats.example:4222")
                .with_nats_auth(auth)
        };
        for auth in [
            NatsAuth::UserPassword {
                user: "u".into(),
                password: Secret::new("p"),
            },
            NatsAuth::Token(Secret::new("t")),
            NatsAuth::CredsFile("/w.creds".into()),
            NatsAuth::NKey(Secret::new("SU")),
        ] {
            let r = refusal(&remote(auth.clone())).expect("refused");
            assert_eq!(
                (r.server, r.address.as_str()),
                (Server::Nats, "nats.example:4222")
            );
            let tls = remote(auth.clone()).with_nats_tls(TlsFiles::new("/ca.pem"));
            assert_eq!(refusal(&tls), None);
            let url = remote(auth).with_nats_url("tls://nats.example:4222");
            assert_eq!(refusal(&url), None);
        }
        assert_eq!(refusal(&remote(NatsAuth::None)), None, "no credential");
        let in_url = Config::new("t").with_nats_url("nats://a:4222,nats://t0ken@b:4222");
        let r = refusal(&in_url).expect("the URL's token");
        assert_eq!(r.address, "b:4222");
        assert!(!r.to_string().contains("t0ken"), "{r}");
        let local = Config::new("t")
            .with_nats_url("nats://127.0.0.1:4222")
            .with_nats_auth(NatsAuth::Token(Secret::new("t")));
        assert_eq!(refusal(&local), None);
        let allowed = remote(NatsAuth::Token(Secret::new("t"))).allow_insecure_transport();
        assert_eq!(refusal(&allowed), None);
    }

    #[test]
    fn an_etcd_user_needs_https() {
        let user = |eps: &[&str]| {
            Config::new("t")
                .with_etcd_endpoints(eps.iter().copied())
                .with_etcd_user("w", Secret::new("pw"))
        };
        let r = refusal(&user(&["http://etcd-1:2379"])).expect("refused");
        assert_eq!(
            (r.server, r.address.as_str()),
            (Server::Etcd, "etcd-1:2379")
        );
        assert_eq!(server_of(&user(&["etcd-1:2379"])), Some(Server::Etcd));
        let https = user(&["https://etcd-1:2379"]).with_etcd_tls(TlsFiles::new("/ca.pem"));
        assert_eq!(refusal(&https), None);
        assert_eq!(refusal(&user(&["http://127.0.0.1:2379"])), None);
        assert_eq!(
            refusal(&user(&["http://etcd-1:2379"]).allow_insecure_transport()),
            None
        );
        let anonymous = Config::new("t").with_etcd_endpoints(["http://etcd-1:2379"]);
        assert_eq!(refusal(&anonymous), None);
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_needs_a_verifying_ssl_mode_for_a_password() {
        use sqlx::mysql::MySqlConnectOptions;
        let link = |url: &str| {
            let options: MySqlConnectOptions = url.parse().unwrap();
            mysql_link(&mysql_verifying(options))
        };
        for query in [
            "",
            "?ssl-mode=PREFERRED",
            "?ssl-mode=DISABLED",
            "?ssl-mode=REQUIRED",
        ] {
            let l = link(&format!("mysql://root:pw@db:3306/bank{query}"));
            let r = check(&l, false).expect_err(query);
            assert_eq!((r.server, r.address.as_str()), (Server::MySql, "db:3306"));
            assert!(check(&l, true).is_ok());
        }
        for query in [
            "?ssl-mode=VERIFY_IDENTITY&ssl-ca=/ca.pem",
            "?ssl-mode=VERIFY_CA&ssl-ca=/ca.pem",
            "?ssl-mode=REQUIRED&ssl-ca=/ca.pem",
        ] {
            let l = link(&format!("mysql://root:pw@db:3306/bank{query}"));
            assert_eq!(check(&l, false), Ok(()), "{query}");
        }
        assert!(check(&link("mysql://root:pw@127.0.0.1:3306/bank"), false).is_ok());
        assert!(check(&link("mysql://root@db:3306/bank"), false).is_ok());
    }
}
