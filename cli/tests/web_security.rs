//! `tenure serve` against a hostile visitor: over raw HTTP (and TLS) and in
//! headless chromium, each test its own `tenure serve` on a loopback port
//! against the dev stack (issue 31, item 5; the "web visitor" rows of
//! `security.md`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::{Client as Browser, Locator};
use tenure::devstack::DevStack;
use tenure::{Client, Config, JobId};
use tenure_tests::{config_for, prepare_schema, wait_until};

mod support;
use support::{Serve, browser_with, get, get_with, log_in, post, raw, tenure_cmd};

const OPERATOR: &str = "operator-token-for-web-tests";
const READER: &str = "reader-token-for-web-tests";

/// A fresh namespace with its schema and streams.
async fn setup(prefix: &str) -> (Config, Client) {
    let stack = DevStack::shared().expect("dev stack");
    let ns = DevStack::unique_namespace(prefix);
    let cfg = config_for(stack, &ns, Duration::from_secs(2));
    let client = Client::connect(&cfg).await.expect("client");
    prepare_schema(&client).await;
    (cfg, client)
}

async fn text(b: &Browser, css: &str) -> String {
    b.find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The body of the page chromium shows.
async fn body(b: &Browser) -> String {
    text(b, "body").await
}

/// The first server-sent event of `path` (its raw text), read off a raw connection.
fn first_event(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
        let t = String::from_utf8_lossy(&out);
        if t.contains("data:") && t.rsplit("data:").next().is_some_and(|r| r.contains("\n\n")) {
            break;
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

/// Server errors show a reference, never the servers' URLs or credentials:
/// not on an HTML page, not in `/api/*` JSON, not in server-sent events; the
/// log has the detail (redacted) under that reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_show_a_reference_not_the_servers_urls() {
    let (mut cfg, client) = setup("websec-leak").await;
    // Credentials the servers ignore (no auth on the plain dev stack) but the
    // URLs carry: a NATS token in the user part, a password in the query.
    let sep = if cfg.database_url.contains('?') {
        '&'
    } else {
        '?'
    };
    cfg.database_url = format!("{}{sep}password=pg-secret-in-query", cfg.database_url);
    cfg.nats_url = cfg
        .nats_url
        .replacen("nats://", "nats://nats-secret-token@", 1);
    let serve = Serve::start(&cfg, &[], &[]);
    // PostgreSQL fails under the running server: its job table is gone.
    sqlx::query(&format!(
        "ALTER TABLE {}.jobs RENAME TO jobs_gone",
        cfg.schema
    ))
    .execute(client.store().pool())
    .await
    .unwrap();
    // And NATS: the DLQ stream is deleted.
    let nats = async_nats::connect(client_nats_url(&cfg)).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let names = tenure::blocks::queue::QueueNames::new(&cfg.namespace);
    js.delete_stream(&names.dlq_stream).await.unwrap();

    let addr = serve.addr();
    let secrets = ["pg-secret-in-query", "nats-secret-token"];
    for path in ["/jobs", "/api/jobs", "/dlq", "/api/dlq", "/api/overview"] {
        let a = get(&addr, path);
        assert!(a.status >= 500, "{path}: {a:?}");
        for s in secrets {
            assert!(!a.body.contains(s), "{path} shows {s}: {}", a.body);
        }
        assert!(!a.body.contains("://"), "{path} shows a URL: {}", a.body);
        let reference = reference_in(&a.body).unwrap_or_else(|| panic!("{path}: {}", a.body));
        let logged = wait_until(Duration::from_secs(5), || async {
            serve.log().contains(&reference)
        })
        .await;
        assert!(logged, "the log names {reference}: {}", serve.log());
    }
    let event = first_event(&addr, "/events/overview");
    assert!(event.contains("event: error"), "{event}");
    for s in secrets {
        assert!(!event.contains(s), "the event shows {s}: {event}");
    }
    assert!(reference_in(&event).is_some(), "{event}");
    let log = serve.log();
    for s in secrets {
        assert!(!log.contains(s), "the log shows {s}: {log}");
    }
    assert!(log.contains("password=***"), "{log}");

    // In chromium, the error page says the same.
    let (_driver, b) = browser_with(&[]).await;
    b.goto(&format!("{}/jobs", serve.base)).await.unwrap();
    let page = body(&b).await;
    assert!(page.contains("Reference"), "{page}");
    assert!(
        !page.contains("pg-secret-in-query") && !page.contains("://"),
        "{page}"
    );
    b.close().await.unwrap();
}

/// The NATS URL the test itself uses (without the planted token).
fn client_nats_url(cfg: &Config) -> String {
    cfg.nats_url.replacen("nats-secret-token@", "", 1)
}

/// The `ref-...` reference an error shows, if any.
fn reference_in(text: &str) -> Option<String> {
    let at = text.find("ref-")?;
    let r: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    (r.len() > 8).then_some(r)
}

/// DNS rebinding: a request whose `Host` is not the server's own names is
/// refused (421), whatever address it reached; `--allow-host` adds a name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_header_is_refused() {
    let (cfg, _client) = setup("websec-host").await;
    let serve = Serve::start(&cfg, &["--allow-host", "ops.example"], &[]);
    let addr = serve.addr();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let with_host = |host: &str| {
        raw(
            &addr,
            &format!("GET /api/jobs HTTP/1.1\r\nHost: {host}"),
            b"",
        )
    };
    for host in [
        addr.clone(),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("ops.example:{port}"),
        "ops.example".into(),
    ] {
        assert_eq!(with_host(&host).status, 200, "{host}");
    }
    for host in [
        format!("rebind.attacker.example:{port}"),
        format!("127.0.0.1.attacker.example:{port}"),
        "localhost".into(),
        format!("ops.example:{}", port.parse::<u16>().unwrap() ^ 1),
    ] {
        let a = with_host(&host);
        assert_eq!(a.status, 421, "{host}: {a:?}");
        assert!(!a.body.contains("\"jobs\""), "{host}: {}", a.body);
    }
    let a = raw(&addr, "GET /api/jobs HTTP/1.1", b"");
    assert_eq!(a.status, 400, "no Host: {a:?}");
}

/// The same in chromium: a name that resolves to the server (as a rebinding
/// attacker's does) shows no data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_name_in_chromium_shows_nothing() {
    let (cfg, client) = setup("websec-rebind").await;
    let id = client
        .enqueue_json("websec.nobody", "k", serde_json::json!({}))
        .await
        .unwrap()
        .job_id;
    let serve = Serve::start(&cfg, &[], &[]);
    let port = serve.addr().rsplit(':').next().unwrap().to_string();
    let (_driver, b) = browser_with(&["--host-resolver-rules=MAP rebind.test 127.0.0.1"]).await;
    b.goto(&format!("http://rebind.test:{port}/jobs"))
        .await
        .unwrap();
    let page = body(&b).await;
    assert!(!page.contains(&id.to_string()), "{page}");
    b.goto(&format!("http://localhost:{port}/jobs"))
        .await
        .unwrap();
    assert!(body(&b).await.contains(&id.to_string()));
    b.close().await.unwrap();
}

/// A `--bind` off loopback without TLS is refused before anything is bound,
/// unless `--insecure-http` says so; `--tls-cert` needs `--tls-key`.
#[test]
fn a_non_loopback_bind_needs_tls() {
    // Servers that do not exist: the check comes before any connection.
    let cfg = Config::new("websec_bind")
        .with_nats_url("nats://127.0.0.1:1")
        .with_database_url("postgres://postgres@127.0.0.1:1/none");
    let run = |args: &[&str]| {
        let out = tenure_cmd(&cfg)
            .args(["--timeout", "1", "serve"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&["--bind", "0.0.0.0:0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--tls-cert") && err.contains("--insecure-http"),
        "{err}"
    );
    let (code, err) = run(&["--bind", "[::]:0"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = run(&["--bind", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tls-key"), "{err}");
}

/// A self-signed certificate for 127.0.0.1 and localhost: (dir, cert, key, DER).
fn self_signed() -> (tempfile::TempDir, String, String, Vec<u8>) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("web.pem");
    let key = dir.path().join("web.key");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let der = ck.cert.der().to_vec();
    (
        dir,
        cert.display().to_string(),
        key.display().to_string(),
        der,
    )
}

/// One request over TLS to `addr`, trusting only `ca_der`.
fn tls_request(addr: &str, ca_der: &[u8], head: &str, body: &[u8]) -> support::Answer {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    support::exchange(&mut tls, addr, head, body)
}

/// Under `--tls-cert/--tls-key` the view speaks HTTPS only, and its session
/// cookie is `Secure; HttpOnly; SameSite=Strict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_https_with_secure_cookies() {
    let (cfg, _client) = setup("websec-tls").await;
    let (_dir, cert, key, der) = self_signed();
    let serve = Serve::start(
        &cfg,
        &["--tls-cert", &cert, "--tls-key", &key],
        &[("TENURE_OPERATOR_TOKEN", OPERATOR)],
    );
    assert!(serve.base.starts_with("https://"), "{}", serve.base);
    let addr = serve.addr();
    let a = tls_request(&addr, &der, "GET /api/jobs HTTP/1.1\r\nHost: {host}", b"");
    assert_eq!(a.status, 200, "{a:?}");
    let login = tls_request(
        &addr,
        &der,
        "POST /login HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded",
        format!("token={OPERATOR}").as_bytes(),
    );
    assert_eq!(login.status, 303, "{login:?}");
    let cookie = login.header("set-cookie").unwrap();
    for flag in ["Secure", "HttpOnly", "SameSite=Strict"] {
        assert!(cookie.contains(flag), "{cookie}");
    }
    // Plain HTTP on the TLS port gets no page.
    let plain = get(&addr, "/api/jobs");
    assert_ne!(plain.status, 200, "{plain:?}");
}

/// The same in chromium: it logs in over HTTPS and holds a secure, HTTP-only cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_logs_in_over_tls() {
    let (cfg, _client) = setup("websec-tlsb").await;
    let (_dir, cert, key, _der) = self_signed();
    let serve = Serve::start(
        &cfg,
        &["--tls-cert", &cert, "--tls-key", &key],
        &[("TENURE_OPERATOR_TOKEN", OPERATOR)],
    );
    let (_driver, b) = browser_with(&["--ignore-certificate-errors"]).await;
    log_in(&b, &serve.base, OPERATOR).await;
    let c = b.get_named_cookie("tenure_session").await.unwrap();
    assert_eq!(c.secure(), Some(true));
    assert_eq!(c.http_only(), Some(true));
    assert!(body(&b).await.contains("Log out"));
    b.close().await.unwrap();
}

/// With a read token, nothing but the login page and the static files is
/// served without it (a bearer header or a session); a reader's session
/// cannot act.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_need_the_read_token_when_one_is_set() {
    let (cfg, client) = setup("websec-read").await;
    let id = client
        .enqueue_json("websec.nobody", "k", serde_json::json!({}))
        .await
        .unwrap()
        .job_id;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("read-token");
    std::fs::write(&file, format!("{READER}\n")).unwrap();
    let serve = Serve::start(
        &cfg,
        &["--read-token-file", &file.display().to_string()],
        &[("TENURE_OPERATOR_TOKEN", OPERATOR)],
    );
    let addr = serve.addr();
    let job = format!("/jobs/{id}");
    let api = format!("/api/jobs/{id}");
    for path in [
        "/",
        "/jobs",
        job.as_str(),
        "/api/jobs",
        api.as_str(),
        "/dlq",
        "/api/dlq",
        "/workers",
        "/events/overview",
    ] {
        let a = get(&addr, path);
        assert_eq!(a.status, 401, "{path}: {a:?}");
        assert!(!a.body.contains(&id.to_string()), "{path}");
        let wrong = get_with(&addr, path, "Authorization: Bearer not-the-read-token\r\n");
        assert_eq!(wrong.status, 401, "{path} with a wrong token");
    }
    for path in ["/app.js", "/login"] {
        assert_eq!(get(&addr, path).status, 200, "{path}");
    }
    let a = get_with(&addr, &api, &format!("Authorization: Bearer {READER}\r\n"));
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.body.contains(&id.to_string()));
    let login = post(
        &addr,
        "/login",
        "Accept: application/json\r\n",
        &format!("token={READER}"),
    );
    assert_eq!(login.status, 200, "{login:?}");
    let cookie = login.cookie();
    let a = get_with(&addr, "/api/jobs", &format!("Cookie: {cookie}\r\n"));
    assert_eq!(a.status, 200);
    let csrf = serde_json::from_str::<serde_json::Value>(&login.body).unwrap()["csrf"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let act = post(
        &addr,
        "/jobs/cancel",
        &format!("Cookie: {cookie}\r\n"),
        &format!("job_id={id}&csrf={csrf}"),
    );
    assert_eq!(act.status, 403, "a reader cannot act: {act:?}");

    // In chromium: the login page first; the read token opens the pages, without actions.
    let (_driver, b) = browser_with(&[]).await;
    b.goto(&format!("{}{job}", serve.base)).await.unwrap();
    assert!(!body(&b).await.contains(&id.to_string()));
    log_in(&b, &serve.base, READER).await;
    b.goto(&format!("{}{job}", serve.base)).await.unwrap();
    assert!(body(&b).await.contains(&id.to_string()));
    assert!(
        b.find_all(Locator::Css("button.cancel"))
            .await
            .unwrap()
            .is_empty()
    );
    b.close().await.unwrap();
}

/// A token on the command line (visible to every local user in `ps`) is
/// refused with a clear error that does not repeat it.
#[test]
fn tokens_on_the_command_line_are_refused() {
    let cfg = Config::new("websec_argv")
        .with_nats_url("nats://127.0.0.1:1")
        .with_database_url("postgres://postgres@127.0.0.1:1/none");
    for flag in ["--operator-token", "--read-token"] {
        let out = tenure_cmd(&cfg)
            .args(["--timeout", "1", "serve", flag, "argv-secret-token-value"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains("-file") && err.contains("TENURE_"),
            "{flag}: {err}"
        );
        assert!(!err.contains("argv-secret-token-value"), "{flag}: {err}");
    }
}

/// Every answer, pages, JSON, static files, errors and refusals alike,
/// carries the headers that keep it out of frames and other sites.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_carries_the_security_headers() {
    let (cfg, _client) = setup("websec-headers").await;
    let serve = Serve::start(&cfg, &[], &[("TENURE_OPERATOR_TOKEN", OPERATOR)]);
    let addr = serve.addr();
    let answers = [
        get(&addr, "/"),
        get(&addr, "/api/jobs"),
        get(&addr, "/app.js"),
        get(&addr, "/no-such-page"),
        get(&addr, "/jobs?status=zombie"),
        post(&addr, "/dlq/redrive", "", "job_id=x"),
        raw(&addr, "GET / HTTP/1.1\r\nHost: elsewhere.example", b""),
    ];
    for a in &answers {
        let csp = a.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("frame-ancestors 'none'"), "{a:?}");
        assert!(csp.contains("default-src 'none'"), "{a:?}");
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"), "{a:?}");
        assert_eq!(a.header("referrer-policy"), Some("no-referrer"), "{a:?}");
        assert_eq!(a.header("x-frame-options"), Some("DENY"), "{a:?}");
    }
}

/// A client that sends its headers too slowly is cut off; beyond
/// `--max-connections` a connection is answered 503 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_surplus_connections_are_cut_off() {
    let (cfg, _client) = setup("websec-slow").await;
    let serve = Serve::start(
        &cfg,
        &["--header-timeout", "1", "--max-connections", "2"],
        &[],
    );
    let addr = serve.addr();
    let started = Instant::now();
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(slow, "GET / HTTP/1.1\r\nHost: {addr}\r\n").unwrap();
    let mut idle = std::net::TcpStream::connect(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let third = get(&addr, "/api/jobs");
    assert_eq!(third.status, 503, "over the connection cap: {third:?}");
    let mut out = Vec::new();
    let _ = slow.read_to_end(&mut out);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cut off after {:?}",
        started.elapsed()
    );
    let mut rest = Vec::new();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = idle.read_to_end(&mut rest);
    assert_eq!(get(&addr, "/api/jobs").status, 200, "served again");
}

/// A request that takes longer than `--request-timeout` (its table locked by
/// another session) is answered 503 then, not after the servers' own bound
/// (`--timeout`, 5 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_is_cut_off() {
    use sqlx::Connection;
    let (cfg, _client) = setup("websec-reqto").await;
    let serve = Serve::start(&cfg, &["--request-timeout", "1"], &[]);
    // A connection of its own: the pool's sessions end idle transactions.
    let mut locker = sqlx::PgConnection::connect(&cfg.database_url)
        .await
        .unwrap();
    let mut tx = locker.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE",
        cfg.schema
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let started = Instant::now();
    let a = get(&serve.addr(), "/api/jobs");
    let took = started.elapsed();
    tx.rollback().await.unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    assert!(took < Duration::from_secs(4), "answered after {took:?}");
    assert_eq!(get(&serve.addr(), "/api/jobs").status, 200);
}

/// Live streams are capped by `--max-streams`; a request body above the cap is 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_bodies_are_bounded() {
    let (cfg, _client) = setup("websec-bound").await;
    let serve = Serve::start(
        &cfg,
        &["--max-streams", "1"],
        &[("TENURE_OPERATOR_TOKEN", OPERATOR)],
    );
    let addr = serve.addr();
    let big = format!("token={}", "x".repeat(1 << 20));
    let a = post(&addr, "/login", "", &big);
    assert_eq!(
        a.status,
        413,
        "{} {}",
        a.status,
        a.header("content-length").unwrap_or_default()
    );
    let mut first = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        first,
        "GET /events/overview HTTP/1.1\r\nHost: {addr}\r\n\r\n"
    )
    .unwrap();
    let mut buf = [0u8; 512];
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(first.read(&mut buf).unwrap() > 0);
    let second = get(&addr, "/events/overview");
    assert_eq!(second.status, 503, "{second:?}");
    drop(first);
    let freed = wait_until(Duration::from_secs(10), || async {
        first_event(&addr, "/events/overview").contains("event: overview")
    })
    .await;
    assert!(freed, "a closed stream frees its place");
}

/// Five wrong logins from one address lock it out for a while (429, even
/// with the right token); each failure is logged without the attempted token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_throttled_and_logged() {
    let (cfg, _client) = setup("websec-throttle").await;
    let serve = Serve::start(&cfg, &[], &[("TENURE_OPERATOR_TOKEN", OPERATOR)]);
    let addr = serve.addr();
    for i in 0..5 {
        let a = post(&addr, "/login", "", &format!("token=guess-number-{i}"));
        assert_eq!(a.status, 403, "attempt {i}: {a:?}");
    }
    let locked = post(&addr, "/login", "", &format!("token={OPERATOR}"));
    assert_eq!(locked.status, 429, "{locked:?}");
    assert!(locked.header("retry-after").is_some(), "{locked:?}");
    // The server's standard error reaches the test through a reader thread,
    // which a loaded machine runs after the answer (`make test`, 2026-12-07).
    let logged = wait_until(Duration::from_secs(10), || async {
        serve.log().matches("failed login").count() >= 5
    })
    .await;
    let log = serve.log();
    assert!(logged && log.contains("127.0.0.1"), "{log}");
    assert!(
        !log.contains("guess-number"),
        "the log shows a tried token: {log}"
    );
}

/// A session ends after `--session-ttl`: its cookie and CSRF token act no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_expire() {
    let (cfg, client) = setup("websec-ttl").await;
    let id = client
        .enqueue_json("websec.nobody", "k", serde_json::json!({}))
        .await
        .unwrap()
        .job_id;
    let serve = Serve::start(
        &cfg,
        &["--session-ttl", "2"],
        &[("TENURE_OPERATOR_TOKEN", OPERATOR)],
    );
    let addr = serve.addr();
    let login = post(
        &addr,
        "/login",
        &format!("Authorization: Bearer {OPERATOR}\r\nAccept: application/json\r\n"),
        "",
    );
    assert_eq!(login.status, 200, "{login:?}");
    assert!(login.header("set-cookie").unwrap().contains("Max-Age=2"));
    let cookie = login.cookie();
    let csrf = serde_json::from_str::<serde_json::Value>(&login.body).unwrap()["csrf"]
        .as_str()
        .unwrap()
        .to_string();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let act = post(
        &addr,
        "/jobs/cancel",
        &format!("Cookie: {cookie}\r\n"),
        &format!("job_id={id}&csrf={csrf}"),
    );
    assert_eq!(act.status, 403, "{act:?}");
    assert!(act.body.contains("log in"), "{}", act.body);
    assert_eq!(
        client.job(id).await.unwrap().unwrap().status,
        tenure::blocks::fence::JobStatus::Pending
    );
}

/// A job's page finds its DLQ entries by subject, however many other entries
/// come before them (it used to scan the first 10,000 only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_page_finds_its_dlq_entry_behind_ten_thousand_others() {
    let (cfg, client) = setup("websec-dlq").await;
    let id = client
        .enqueue_json("websec.nobody", "k", serde_json::json!({}))
        .await
        .unwrap()
        .job_id;
    let names = tenure::blocks::queue::QueueNames::new(&cfg.namespace);
    let js = async_nats::jetstream::new(async_nats::connect(&cfg.nats_url).await.unwrap());
    let entry = |job: JobId, reason: &str| {
        let mut h = async_nats::HeaderMap::new();
        h.insert("Tenure-Job-Id", job.to_string().as_str());
        h.insert("Tenure-Job-Type", "websec.nobody");
        h.insert("Tenure-Reason", reason);
        (names.dlq_subject(Some(job)), h)
    };
    for chunk in 0..20 {
        let mut acks = Vec::new();
        for i in 0..500 {
            let other = JobId::from_key("websec.filler", &format!("{chunk}-{i}"));
            let (subject, h) = entry(other, "permanent_error: filler");
            acks.push(
                js.publish_with_headers(subject, h, "{}".into())
                    .await
                    .unwrap(),
            );
        }
        for a in acks {
            a.await.unwrap();
        }
    }
    let (subject, h) = entry(id, "permanent_error: the one to find");
    js.publish_with_headers(subject, h, "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let serve = Serve::start(&cfg, &[], &[]);
    let started = Instant::now();
    let a = get(&serve.addr(), &format!("/api/jobs/{id}"));
    let took = started.elapsed();
    assert_eq!(a.status, 200, "{a:?}");
    let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
    let dl = v["dead_letters"].as_array().unwrap();
    assert_eq!(dl.len(), 1, "{v}");
    assert_eq!(dl[0]["reason"], "permanent_error: the one to find");
    eprintln!("job page with 10,001 DLQ entries answered in {took:?}");
}

/// A bad query value is a 400 with a message, never a panic (a multi-byte
/// character where the age's unit goes used to panic the handler).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_query_values_answer_400() {
    let (cfg, _client) = setup("websec-query").await;
    let serve = Serve::start(&cfg, &[], &[]);
    let addr = serve.addr();
    for path in [
        "/jobs?age=5%C3%A9",
        "/api/jobs?age=5%C3%A9",
        "/api/jobs?age=%C3%A9",
        "/api/jobs?limit=%C3%A9",
        "/api/jobs?after=%C3%A9_%C3%A9",
        "/api/jobs?status=%FF",
        "/api/jobs/%C3%A9",
    ] {
        let a = get(&addr, path);
        assert_eq!(a.status, 400, "{path}: {a:?}");
    }
    assert_eq!(get(&addr, "/api/jobs?age=5m").status, 200);
}

/// A flash message comes from the session after an action, never from the
/// query string (a link could otherwise put any text on the operator's page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flash_text_never_comes_from_the_query() {
    let (cfg, client) = setup("websec-flash").await;
    let id = client
        .enqueue_json("websec.nobody", "k", serde_json::json!({}))
        .await
        .unwrap()
        .job_id;
    let serve = Serve::start(&cfg, &[], &[("TENURE_OPERATOR_TOKEN", OPERATOR)]);
    let addr = serve.addr();
    let planted = "Call%20the%20hotline%20and%20read%20out%20your%20token";
    for path in [
        format!("/dlq?done={planted}"),
        format!("/jobs/{id}?done={planted}"),
    ] {
        let a = get(&addr, &path);
        assert_eq!(a.status, 200, "{path}");
        assert!(!a.body.contains("hotline"), "{path}: {}", a.body);
    }
    // In chromium, logged in: the planted text does not show; a real
    // action's outcome does, once.
    let (_driver, b) = browser_with(&[]).await;
    log_in(&b, &serve.base, OPERATOR).await;
    b.goto(&format!("{}/jobs/{id}?done={planted}", serve.base))
        .await
        .unwrap();
    assert!(!body(&b).await.contains("hotline"));
    b.find(Locator::Css(&format!("button.cancel[data-job='{id}']")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let shown = wait_until(Duration::from_secs(10), || async {
        b.find(Locator::Css("#flash")).await.is_ok()
    })
    .await;
    assert!(shown);
    assert_eq!(text(&b, "#flash").await, "cancelled");
    b.refresh().await.unwrap();
    assert!(b.find(Locator::Css("#flash")).await.is_err(), "shown once");
    b.close().await.unwrap();
}
