//! What every request passes before a page: the security headers on every
//! answer, the `Host` allow-list (DNS rebinding), the read token, and the
//! request timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{App, WebError};

/// The headers every answer carries: no framing, no sniffing, no referrer,
/// and a content policy that allows only this server's own script, style and
/// event stream.
pub const SECURITY_HEADERS: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
];

/// The `Host` values this server answers to (lower case).
#[derive(Debug, Clone)]
pub struct AllowedHosts(Vec<String>);

impl AllowedHosts {
    /// The bound address, `localhost` and `127.0.0.1` with the bound port,
    /// and each `--allow-host` name (with the port, or as given if it has one,
    /// or bare, as a proxy in front may send it).
    pub fn new(bound: SocketAddr, extra: &[String]) -> Self {
        let port = bound.port();
        let mut hosts = vec![
            bound.to_string(),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
        ];
        for h in extra {
            let h = h.trim().to_ascii_lowercase();
            if has_port(&h) {
                hosts.push(h);
            } else {
                hosts.push(format!("{h}:{port}"));
                hosts.push(h);
            }
        }
        AllowedHosts(hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect())
    }

    fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        self.0.contains(&host)
    }
}

/// `name:port` or `[v6]:port` (not a bare IPv6 address).
fn has_port(h: &str) -> bool {
    match h.rsplit_once(':') {
        Some((left, port)) => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!left.contains(':') || left.ends_with(']'))
        }
        None => false,
    }
}

/// Adds [`SECURITY_HEADERS`] to every answer.
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    for (k, v) in SECURITY_HEADERS {
        h.insert(k, HeaderValue::from_static(v));
    }
    resp
}

/// Refuses a request without a `Host` (400) or with one not allowed (421).
pub async fn check_host(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match host {
        None => WebError::BadRequest("no Host header".into()).into_response(),
        Some(h) if app.hosts.allows(&h) => next.run(req).await,
        Some(h) => {
            tracing::warn!(host = %h.escape_debug(), "request for a host not allowed (--allow-host)");
            (
                StatusCode::MISDIRECTED_REQUEST,
                "this server does not answer to that Host name (see tenure serve --allow-host)",
            )
                .into_response()
        }
    }
}

/// Paths served without the read token: the login page and static files.
fn open_path(path: &str) -> bool {
    matches!(path, "/login" | "/app.js" | "/app.css")
}

/// With a read token, every other path needs it (a session or a bearer header): 401.
pub async fn check_read(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if open_path(req.uri().path()) || app.auth.may_read(req.headers()) {
        return next.run(req).await;
    }
    let wants_html = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    if wants_html {
        let page = super::pages::login(Some("log in to read"), &super::pages::Viewer::login());
        return (
            StatusCode::UNAUTHORIZED,
            axum::response::Html(page.into_string()),
        )
            .into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        "log in (POST /login) or send Authorization: Bearer <token>",
    )
        .into_response()
}

/// Bounds the time to an answer's head (an event stream's body is not bounded).
pub async fn timeout(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let limit: Duration = app.request_timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the request took too long").into_response(),
    }
}
