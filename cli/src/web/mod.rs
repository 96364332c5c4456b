//! `tenure serve`: the operator's web view.
//!
//! Server-rendered HTML (`maud`, escaped by default) with one small script for
//! live counts (server-sent events); no build step. Pages: `/` (overview),
//! `/jobs` (filtered, keyset-paged list), `/jobs/{id}` (timeline, checkpoint,
//! DLQ entries), `/dlq` (grouped by reason, redrive), `/workers`,
//! `/schedules` (pause, resume, trigger). Each page's
//! data is also JSON under `/api/...`, the same structures `tenure ... --json`
//! prints (`crate::data`). Everything is read through `tenure::blocks::fence` and
//! `tenure::blocks::queue`; actions go through `tenure::Client`.
//!
//! Safe by default: binds 127.0.0.1 unless `--bind` says otherwise (an
//! address off loopback needs `--tls-cert`/`--tls-key`, or `--insecure-http`);
//! answers only to its own `Host` names (`--allow-host` adds more); sends a
//! strict content policy and no-framing headers on every answer; is read-only
//! unless given an operator token (`--operator-token-file` or
//! `TENURE_OPERATOR_TOKEN`, never on the command line), and then actions are
//! POSTs that need a logged-in session and its CSRF token ([`auth`]). A read
//! token (`--read-token-file` or `TENURE_READ_TOKEN`) closes the pages too.
//! Visitors see a reference for a server error; the detail, redacted, goes to
//! the log (standard error). Its own connections use the CLI's settings, TLS
//! and credentials.

mod auth;
mod guard;
mod overview;
mod pages;
mod schedules;
mod server;
mod timeline;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Json, Redirect, Response};
use axum::routing::{get, post};
use chrono::Utc;
use serde::Deserialize;
use tenure::blocks::fence::{FenceStore, JobFilter, JobStatus};
use tenure::blocks::queue::Queue;
use tenure::security::{Secret, redact_text};
use tenure::{Client, JobId};
use tokio::sync::Semaphore;

use crate::ctx::Ctx;
use crate::data;
use auth::{Auth, Refused};
use pages::{JobsQuery, Viewer};

/// `tenure serve` options.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the address is printed).
    /// Off loopback it needs --tls-cert/--tls-key, or --insecure-http.
    #[arg(long, default_value = "127.0.0.1:8023")]
    bind: SocketAddr,
    /// Another `Host` name this server answers to (repeatable), e.g. the name
    /// of a proxy in front; without a port it is allowed with and without the
    /// bound port. Other names are refused with 421 (DNS rebinding).
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_host: Vec<String>,
    /// PEM certificate chain: serve HTTPS only (with --tls-key).
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Allow plain HTTP on an address off loopback (tokens and cookies cross
    /// the network in the clear).
    #[arg(long)]
    insecure_http: bool,
    /// File holding the operator token (12 characters or more) that allows
    /// actions after logging in; or `TENURE_OPERATOR_TOKEN`. Never on the command line.
    #[arg(long, env = "TENURE_OPERATOR_TOKEN_FILE", value_name = "FILE")]
    operator_token_file: Option<PathBuf>,
    /// File holding a read token: without it (or the operator token) nothing
    /// but the login page is served; or `TENURE_READ_TOKEN`.
    #[arg(long, env = "TENURE_READ_TOKEN_FILE", value_name = "FILE")]
    read_token_file: Option<PathBuf>,
    /// Seconds a login session lasts.
    #[arg(long, default_value_t = 8 * 3600, value_parser = clap::value_parser!(u64).range(1..=7 * 86_400))]
    session_ttl: u64,
    /// Seconds a client has to send a request's headers (and finish TLS).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    header_timeout: u64,
    /// Seconds to answer a request (its head; live streams run on).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    request_timeout: u64,
    /// Open connections at most; the next one is answered 503.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_connections: u64,
    /// Live-update streams (server-sent events) at most; the next one is 503.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    max_streams: u64,
    /// Seconds between live updates of the overview.
    #[arg(long, default_value_t = 2.0, value_parser = crate::args::parse_secs)]
    refresh: f64,
}

/// The flags that would put a token on the command line (seen by every
/// local user in `ps`), refused before parsing: the message names the
/// alternatives and never repeats the value.
pub fn token_on_argv(args: impl IntoIterator<Item = std::ffi::OsString>) -> Option<String> {
    let flags = [("--operator-token", "OPERATOR"), ("--read-token", "READ")];
    for arg in args {
        let arg = arg.to_string_lossy().to_string();
        for (flag, var) in flags {
            if arg == flag || arg.starts_with(&format!("{flag}=")) {
                return Some(format!(
                    "{flag} is not accepted: a token on the command line is visible to every \
                     local user; give it in a file ({flag}-file) or the environment (TENURE_{var}_TOKEN)"
                ));
            }
        }
    }
    None
}

/// A token from `file` or the environment variable `var` (not both), checked.
fn token_from(file: Option<&FsPath>, var: &str, flag: &str) -> Result<Option<Secret>, String> {
    let env = std::env::var(var).ok().filter(|v| !v.is_empty());
    let raw = match (file, env) {
        (Some(_), Some(_)) => return Err(format!("give {flag} or {var}, not both")),
        (Some(f), None) => std::fs::read_to_string(f)
            .map_err(|e| format!("cannot read {flag} {}: {e}", f.display()))?
            .trim_end_matches(['\r', '\n'])
            .to_string(),
        (None, Some(v)) => v,
        (None, None) => return Ok(None),
    };
    if raw.chars().count() < auth::MIN_TOKEN_LEN {
        return Err(format!(
            "the token of {flag} / {var} must have at least {} characters",
            auth::MIN_TOKEN_LEN
        ));
    }
    Ok(Some(Secret::new(raw)))
}

/// `tenure serve`'s settings, checked before any server is contacted.
pub struct Prepared {
    bind: SocketAddr,
    allow_host: Vec<String>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    auth: Auth,
    limits: server::Limits,
    request_timeout: Duration,
    max_streams: usize,
    refresh: Duration,
}

impl ServeArgs {
    /// Checks the flags, reads the tokens and the TLS files.
    ///
    /// # Errors
    /// A message for a bad combination or an unreadable file (exit code 2).
    pub fn prepare(&self) -> Result<Prepared, String> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some(server::tls_acceptor(c, k).map_err(|e| format!("{e:#}"))?),
            _ => None,
        };
        if !self.bind.ip().is_loopback() && tls.is_none() && !self.insecure_http {
            return Err(format!(
                "--bind {} is off loopback: give --tls-cert and --tls-key to serve HTTPS, \
                 or --insecure-http to send tokens and cookies in the clear",
                self.bind
            ));
        }
        let operator = token_from(
            self.operator_token_file.as_deref(),
            "TENURE_OPERATOR_TOKEN",
            "--operator-token-file",
        )?;
        let reader = token_from(
            self.read_token_file.as_deref(),
            "TENURE_READ_TOKEN",
            "--read-token-file",
        )?;
        let ttl = Duration::from_secs(self.session_ttl);
        Ok(Prepared {
            bind: self.bind,
            allow_host: self.allow_host.clone(),
            tls,
            auth: Auth::new(operator, reader, ttl),
            limits: server::Limits {
                header_timeout: Duration::from_secs(self.header_timeout),
                max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            },
            request_timeout: Duration::from_secs(self.request_timeout),
            max_streams: usize::try_from(self.max_streams).unwrap_or(usize::MAX),
            refresh: Duration::from_secs_f64(self.refresh),
        })
    }
}

/// Rows per job-list page by default, and at most.
const PAGE: u32 = 50;
const PAGE_MAX: u32 = 500;

/// DLQ entries shown.
const DLQ_LIMIT: usize = 500;

/// Request bodies (forms) above this are refused with 413.
const BODY_LIMIT: usize = 16 * 1024;

struct App {
    ctx: Ctx,
    store: FenceStore,
    queue: Queue,
    /// Operator mode only: what a redrive needs.
    client: Option<Client>,
    auth: Auth,
    /// Serving HTTPS: cookies are `Secure`.
    tls: bool,
    hosts: guard::AllowedHosts,
    request_timeout: Duration,
    /// One permit per live-update stream.
    streams: Arc<Semaphore>,
    refresh: Duration,
    /// The overview's last numbers, shared by every viewer.
    overview: overview::OverviewCache,
}

type Shared = Arc<App>;

/// A request that failed, as a typed status and message (HTML or JSON).
#[derive(Debug, thiserror::Error)]
enum WebError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("{0:#}")]
    Server(#[from] anyhow::Error),
}

impl WebError {
    fn status(&self) -> StatusCode {
        match self {
            WebError::BadRequest(_) => StatusCode::BAD_REQUEST,
            WebError::NotFound(_) => StatusCode::NOT_FOUND,
            WebError::Refused(Refused::LockedOut(_)) => StatusCode::TOO_MANY_REQUESTS,
            WebError::Refused(_) => StatusCode::FORBIDDEN,
            WebError::Server(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// What a visitor may see: the message of a bad request or a refusal; for
    /// a server error only a reference, the detail (redacted) logged under it.
    fn public(&self) -> (String, Option<String>) {
        match self {
            WebError::Server(e) => {
                let reference = logged(&format!("{e:#}"));
                (
                    format!(
                        "The servers behind this view failed to answer. Reference {reference}: \
                         the detail is in the log of tenure serve."
                    ),
                    Some(reference),
                )
            }
            other => (other.to_string(), None),
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            WebError::Refused(Refused::LockedOut(d)) => Some(d.as_secs().max(1)),
            _ => None,
        }
    }
}

/// Logs `detail` (redacted) under a fresh reference, and returns the reference.
fn logged(detail: &str) -> String {
    let reference = format!("ref-{}", &auth::random_hex()[..12]);
    tracing::error!(reference = %reference, error = %redact_text(detail), "request failed");
    reference
}

fn with_retry_after(mut resp: Response, secs: Option<u64>) -> Response {
    if let Some(s) = secs {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    resp
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (message, _) = self.public();
        let page = pages::error(status.as_u16(), &message);
        with_retry_after(
            (status, Html(page.into_string())).into_response(),
            self.retry_after(),
        )
    }
}

/// The same error as JSON (`/api/...`).
struct ApiError(WebError);

impl From<WebError> for ApiError {
    fn from(e: WebError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (message, reference) = self.0.public();
        let body = serde_json::json!({ "error": message, "reference": reference });
        with_retry_after(
            (self.0.status(), Json(body)).into_response(),
            self.0.retry_after(),
        )
    }
}

/// Connects, binds and serves until interrupted (Ctrl-C / SIGTERM).
///
/// # Errors
/// A server that cannot be reached, an address that cannot be bound.
pub async fn serve(ctx: Ctx, p: Prepared) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TENURE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init()
        .map_err(|e| anyhow!("cannot start logging: {e}"))?;
    let store = ctx.store().await?;
    let queue = ctx.queue().await?;
    let client = match p.auth.operator_mode() {
        true => Some(ctx.client().await?),
        false => None,
    };
    let listener = tokio::net::TcpListener::bind(p.bind)
        .await
        .with_context(|| format!("cannot listen on {}", p.bind))?;
    let addr = listener.local_addr()?;
    let app = Arc::new(App {
        ctx,
        store,
        queue,
        client,
        tls: p.tls.is_some(),
        hosts: guard::AllowedHosts::new(addr, &p.allow_host),
        request_timeout: p.request_timeout,
        streams: Arc::new(Semaphore::new(p.max_streams)),
        auth: p.auth,
        refresh: p.refresh,
        overview: overview::OverviewCache::default(),
    });
    let mode = match (app.auth.operator_mode(), app.auth.reads_need_token()) {
        (true, false) => "operator",
        (true, true) => "operator, reads need a token",
        (false, true) => "read-only, reads need a token",
        (false, false) => "read-only",
    };
    let scheme = if app.tls { "https" } else { "http" };
    println!("listening on {scheme}://{addr} ({mode})");
    server::run(listener, p.tls, router(app), p.limits, shutdown()).await;
    Ok(())
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

fn router(app: Shared) -> Router {
    use axum::middleware::from_fn_with_state as with;
    Router::new()
        .route("/", get(overview_page))
        .route("/api/overview", get(overview_api))
        .route("/events/overview", get(overview_events))
        .route("/jobs", get(jobs_page))
        .route("/api/jobs", get(jobs_api))
        .route("/jobs/{id}", get(job_page))
        .route("/api/jobs/{id}", get(job_api))
        .route("/dlq", get(dlq_page))
        .route("/api/dlq", get(dlq_api))
        .route("/dlq/redrive", post(redrive_one))
        .route("/dlq/redrive-reason", post(redrive_reason))
        .route("/jobs/cancel", post(cancel_job))
        .route("/jobs/retry-now", post(retry_now_job))
        .route("/jobs/reschedule", post(reschedule_job))
        .route("/types/pause", post(pause_type))
        .route("/types/resume", post(resume_type))
        .route("/schedules", get(schedules::schedules_page))
        .route("/api/schedules", get(schedules::schedules_api))
        .route("/schedules/pause", post(schedules::pause_schedule))
        .route("/schedules/resume", post(schedules::resume_schedule))
        .route("/schedules/trigger", post(schedules::trigger_schedule))
        .route("/workers", get(workers_page))
        .route("/api/workers", get(workers_api))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/app.js", get(app_js))
        .route("/app.css", get(app_css))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(with(app.clone(), guard::timeout))
        .layer(with(app.clone(), guard::check_read))
        .layer(with(app.clone(), guard::check_host))
        .layer(axum::middleware::from_fn(guard::security_headers))
        .with_state(app)
}

fn viewer(app: &App, headers: &HeaderMap) -> Viewer {
    Viewer {
        operator_mode: app.auth.operator_mode(),
        csrf: app.auth.csrf_of(headers),
        logged_in: app.auth.role_of_session(headers).is_some(),
        login: app.auth.operator_mode() || app.auth.reads_need_token(),
    }
}

fn page(m: maud::Markup) -> Response {
    ([(header::CACHE_CONTROL, "no-store")], Html(m.into_string())).into_response()
}

async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        pages::APP_JS,
    )
        .into_response()
}

async fn app_css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        pages::CSS,
    )
        .into_response()
}

async fn overview_data(app: &Shared) -> Result<data::OverviewView, WebError> {
    Ok(app.overview.get(app).await?.view)
}

async fn overview_page(
    State(app): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    let o = app.overview.get(&app).await?;
    let paused = data::paused(&app.ctx, &app.store).await?;
    let flash = app.auth.take_flash(&headers);
    let shown = pages::Overview {
        view: &o.view,
        age: o.age,
        paused: &paused,
        flash: flash.as_deref(),
    };
    Ok(page(pages::overview(&shown, &viewer(&app, &headers))))
}

async fn overview_api(State(app): State<Shared>) -> Result<Json<data::OverviewView>, ApiError> {
    Ok(Json(overview_data(&app).await?))
}

/// The overview's numbers every `refresh`, as `overview` events (the first
/// at once); at most `--max-streams` at a time (503 beyond). A failure is an
/// `error` event with a reference only.
async fn overview_events(State(app): State<Shared>) -> Response {
    let Ok(permit) = app.streams.clone().try_acquire_owned() else {
        tracing::warn!("live stream refused: --max-streams reached");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            "too many live streams",
        )
            .into_response();
    };
    let ticks = tokio::time::interval(app.refresh);
    let stream = futures::stream::unfold(
        (app, ticks, permit),
        |(app, mut ticks, permit)| async move {
            ticks.tick().await;
            let event = overview_event(&app).await;
            Some((Ok::<_, Infallible>(event), (app, ticks, permit)))
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn overview_event(app: &Shared) -> Event {
    let failed = |detail: String| {
        let reference = logged(&detail);
        Event::default().event("error").data(format!(
            "the servers behind this view failed; reference {reference}"
        ))
    };
    match overview_data(app).await {
        Ok(v) => Event::default()
            .event("overview")
            .json_data(&v)
            .unwrap_or_else(|e| failed(e.to_string())),
        Err(e) => failed(e.to_string()),
    }
}

/// "30m", "2h", "7d", "45s" as a duration.
fn parse_age(s: &str) -> Result<chrono::Duration, WebError> {
    let bad = || {
        WebError::BadRequest(format!(
            "bad age {s:?}: expected a number and s, m, h or d (e.g. 30m)"
        ))
    };
    // The unit is the last character, which may be more than one byte.
    let cut = s.char_indices().last().map_or(0, |(i, _)| i);
    let (num, unit) = s.split_at(cut);
    let n: i64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(bad()),
    };
    if !(0..=10 * 365 * 86_400).contains(&secs) {
        return Err(bad());
    }
    Ok(chrono::Duration::seconds(secs))
}

/// The query as a filter, a cursor and a limit; each bad value is a clear 400.
fn parse_jobs_query(
    q: &JobsQuery,
) -> Result<(JobFilter, Option<tenure::blocks::fence::JobCursor>, u32), WebError> {
    let set = |o: &Option<String>| {
        o.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let status = match set(&q.status) {
        Some(s) => Some(
            s.parse::<JobStatus>()
                .map_err(|e| WebError::BadRequest(e.to_string()))?,
        ),
        None => None,
    };
    let job_type = set(&q.job_type);
    if job_type.as_ref().is_some_and(|t| t.len() > 128) {
        return Err(WebError::BadRequest(
            "job type longer than 128 characters".into(),
        ));
    }
    let created_since = match set(&q.age) {
        Some(a) => Some(Utc::now() - parse_age(&a)?),
        None => None,
    };
    let with_takeovers = match set(&q.takeovers).as_deref() {
        None | Some("off" | "false" | "0") => false,
        Some("on" | "true" | "1") => true,
        Some(other) => {
            return Err(WebError::BadRequest(format!(
                "bad takeovers {other:?}: expected on or off"
            )));
        }
    };
    let after = match set(&q.after) {
        Some(c) => Some(data::parse_cursor(&c).map_err(WebError::BadRequest)?),
        None => None,
    };
    let limit = match set(&q.limit) {
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=PAGE_MAX).contains(l))
            .ok_or_else(|| {
                WebError::BadRequest(format!("bad limit {l:?}: expected 1 to {PAGE_MAX}"))
            })?,
        None => PAGE,
    };
    let filter = JobFilter {
        job_type,
        status,
        created_since,
        with_takeovers,
    };
    Ok((filter, after, limit))
}

async fn jobs_data(app: &App, q: &JobsQuery) -> Result<data::JobsPage, WebError> {
    let (filter, after, limit) = parse_jobs_query(q)?;
    Ok(data::jobs_page(&app.ctx, &app.store, &filter, after, limit).await?)
}

async fn jobs_page(
    State(app): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<JobsQuery>,
) -> Result<Response, WebError> {
    let p = jobs_data(&app, &q).await?;
    Ok(page(pages::jobs(&p, &q, &viewer(&app, &headers))))
}

async fn jobs_api(
    State(app): State<Shared>,
    Query(q): Query<JobsQuery>,
) -> Result<Json<data::JobsPage>, ApiError> {
    Ok(Json(jobs_data(&app, &q).await?))
}

async fn job_data(app: &App, id: &str) -> Result<data::JobDetail, WebError> {
    let id: JobId = id
        .parse()
        .map_err(|e| WebError::BadRequest(format!("not a job id {id:?} (expected a UUID): {e}")))?;
    data::job(&app.ctx, &app.store, Some(&app.queue), id)
        .await?
        .ok_or_else(|| {
            WebError::NotFound(format!("no job {id} in schema {:?}", app.ctx.cfg.schema))
        })
}

async fn job_page(
    State(app): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, WebError> {
    let d = job_data(&app, &id).await?;
    let flash = app.auth.take_flash(&headers);
    Ok(page(pages::job(
        &d,
        flash.as_deref(),
        &viewer(&app, &headers),
    )))
}

async fn job_api(
    State(app): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<data::JobDetail>, ApiError> {
    Ok(Json(job_data(&app, &id).await?))
}

async fn dlq_page(State(app): State<Shared>, headers: HeaderMap) -> Result<Response, WebError> {
    let entries = data::dlq(&app.ctx, &app.queue, DLQ_LIMIT).await?;
    let flash = app.auth.take_flash(&headers);
    Ok(page(pages::dlq(
        &entries,
        flash.as_deref(),
        &viewer(&app, &headers),
    )))
}

async fn dlq_api(State(app): State<Shared>) -> Result<Json<Vec<data::DeadLetterView>>, ApiError> {
    Ok(Json(
        data::dlq(&app.ctx, &app.queue, DLQ_LIMIT)
            .await
            .map_err(WebError::from)?,
    ))
}

async fn workers_page(State(app): State<Shared>, headers: HeaderMap) -> Result<Response, WebError> {
    let ws = data::workers(&app.ctx, &app.store).await?;
    Ok(page(pages::workers(&ws, &viewer(&app, &headers))))
}

async fn workers_api(State(app): State<Shared>) -> Result<Json<Vec<data::WorkerView>>, ApiError> {
    Ok(Json(
        data::workers(&app.ctx, &app.store)
            .await
            .map_err(WebError::from)?,
    ))
}

/// The fields of an action's form (redrive one, redrive by reason, cancel,
/// retry now, reschedule, pause and resume a type).
#[derive(Debug, Deserialize)]
struct ActionForm {
    csrf: Option<String>,
    job_id: Option<String>,
    reason: Option<String>,
    job_type: Option<String>,
    /// Reschedule: a time (RFC 3339).
    at: Option<String>,
    /// Reschedule: a delay from now (`90s`).
    after: Option<String>,
}

/// The client of an allowed action: operator mode, a session, its CSRF token.
fn allowed<'a>(
    app: &'a App,
    headers: &HeaderMap,
    csrf: Option<&str>,
) -> Result<&'a Client, WebError> {
    app.auth.allow(headers, csrf)?;
    app.client.as_ref().ok_or(Refused::ReadOnly.into())
}

/// The job id an action's form names.
fn form_job_id(raw: Option<String>) -> Result<JobId, WebError> {
    let raw = raw.unwrap_or_default();
    raw.parse()
        .map_err(|e| WebError::BadRequest(format!("not a job id {raw:?}: {e}")))
}

/// Redrives `ids`; what happened is the session's flash on `/dlq`.
async fn redrive_ids(
    app: &App,
    headers: &HeaderMap,
    client: &Client,
    ids: Vec<JobId>,
) -> Result<Response, WebError> {
    let mut skipped = Vec::new();
    let done = data::redrive(&app.ctx, client, ids, &mut skipped).await?;
    let mut note = done
        .iter()
        .map(|r| r.job_id.clone())
        .collect::<Vec<_>>()
        .join(", ");
    if note.is_empty() {
        note = "nothing".into();
    }
    if !skipped.is_empty() {
        note.push_str(&format!("; skipped: {}", skipped.join("; ")));
    }
    app.auth.set_flash(headers, format!("Redriven: {note}"));
    Ok(Redirect::to("/dlq").into_response())
}

async fn redrive_one(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    let client = allowed(&app, &headers, f.csrf.as_deref())?;
    let id = form_job_id(f.job_id)?;
    redrive_ids(&app, &headers, client, vec![id]).await
}

async fn redrive_reason(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    let client = allowed(&app, &headers, f.csrf.as_deref())?;
    let reason = f
        .reason
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| WebError::BadRequest("give a reason".into()))?;
    let ids = data::jobs_with_reason(&app.ctx, client.queue(), &reason).await?;
    redrive_ids(&app, &headers, client, ids).await
}

/// Cancels one job (`Client::cancel`: pending, running or dead), then shows
/// its page with what happened.
async fn cancel_job(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    let client = allowed(&app, &headers, f.csrf.as_deref())?;
    let id = form_job_id(f.job_id)?;
    let reason = f
        .reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "cancelled by an operator".into());
    let note = match data::cancel(&app.ctx, client, id, &reason).await {
        Ok(v) => v.outcome.to_string(),
        Err(e) => {
            let reference = logged(&format!("cancelling {id}: {e:#}"));
            format!("not cancelled: the servers failed (reference {reference})")
        }
    };
    app.auth.set_flash(&headers, note);
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

/// Starts one job waiting in retry backoff now (`Client::retry_now`), then
/// shows its page with what happened.
async fn retry_now_job(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    let client = allowed(&app, &headers, f.csrf.as_deref())?;
    let id = form_job_id(f.job_id)?;
    let done = data::retry_now(&app.ctx, client, id).await;
    let note = moved_note(id, "not started", done);
    app.auth.set_flash(&headers, note);
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

/// Moves one delayed job's `run_at` (`Client::reschedule`): `at` (RFC 3339)
/// or `after` (`90s`), neither: now. Then shows its page with what happened.
async fn reschedule_job(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    let client = allowed(&app, &headers, f.csrf.as_deref())?;
    let id = form_job_id(f.job_id)?;
    let given = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let run_at = match (given(f.at), given(f.after)) {
        (Some(at), _) => crate::args::parse_time(at.trim()).map_err(WebError::BadRequest)?,
        (None, Some(after)) => crate::args::parse_age(after.trim())
            .ok()
            .and_then(|d| chrono::Duration::from_std(d).ok())
            .and_then(|d| chrono::Utc::now().checked_add_signed(d))
            .ok_or_else(|| WebError::BadRequest(format!("not a delay such as 90s: {after:?}")))?,
        (None, None) => chrono::Utc::now(),
    };
    let done = data::reschedule(&app.ctx, client, id, run_at).await;
    let note = moved_note(id, "not rescheduled", done);
    app.auth.set_flash(&headers, note);
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

/// The flash after a retry-now or reschedule: its outcome, the refusal as
/// the client said it, or a reference to a server failure (whose text only
/// the log shows).
fn moved_note(
    id: JobId,
    not: &str,
    done: anyhow::Result<Result<data::MoveView, String>>,
) -> String {
    match done {
        Ok(Ok(v)) => v.outcome,
        Ok(Err(why)) => format!("{not}: {why}"),
        Err(e) => {
            let reference = logged(&format!("{not} {id}: {e:#}"));
            format!("{not}: the servers failed (reference {reference})")
        }
    }
}

async fn pause_type(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    pause_or_resume(&app, &headers, f, true).await
}

async fn resume_type(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    pause_or_resume(&app, &headers, f, false).await
}

/// Pauses or resumes the form's job type (`Client::pause`, `Client::resume`),
/// then shows the overview with what happened.
async fn pause_or_resume(
    app: &App,
    headers: &HeaderMap,
    f: ActionForm,
    pause: bool,
) -> Result<Response, WebError> {
    let client = allowed(app, headers, f.csrf.as_deref())?;
    let job_type = f.job_type.unwrap_or_default();
    let job_type = job_type.trim();
    if job_type.is_empty() {
        return Err(WebError::BadRequest("give a job type".into()));
    }
    let note = match data::pause(&app.ctx, client, job_type, pause).await {
        Ok(v) => format!("{} {}", v.outcome, v.job_type),
        Err(e) => {
            let reference = logged(&format!("{e:#}"));
            format!("not changed: {job_type} (reference {reference})")
        }
    };
    app.auth.set_flash(headers, note);
    Ok(Redirect::to("/").into_response())
}

async fn login_page(State(app): State<Shared>, headers: HeaderMap) -> Response {
    page(pages::login(None, &viewer(&app, &headers)))
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: Option<String>,
}

/// Checks the token (form field or `Authorization: Bearer`), sets the session
/// cookie, and answers with a redirect (a browser) or the CSRF token as JSON
/// (a script, which sends `Accept: application/json`). A wrong token is 403
/// (and counts towards the address's lockout, 429).
async fn login(
    State(app): State<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Result<Response, WebError> {
    if !app.auth.operator_mode() && !app.auth.reads_need_token() {
        return Err(Refused::ReadOnly.into());
    }
    let given = auth::bearer(&headers).or(f.token).unwrap_or_default();
    let (session, csrf) = match app.auth.login(client_ip(peer), &given) {
        Ok(s) => s,
        Err(Refused::WrongToken) => {
            let v = viewer(&app, &headers);
            let html = pages::login(Some(&Refused::WrongToken.to_string()), &v);
            return Ok((StatusCode::FORBIDDEN, Html(html.into_string())).into_response());
        }
        Err(e) => return Err(e.into()),
    };
    let secure = if app.tls { "; Secure" } else { "" };
    let cookie = format!(
        "{}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
        auth::COOKIE,
        app.auth.ttl().as_secs()
    );
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    let mut resp = if wants_json {
        Json(serde_json::json!({ "csrf": csrf })).into_response()
    } else {
        Redirect::to("/dlq").into_response()
    };
    resp.headers_mut().insert(
        header::SET_COOKIE,
        cookie
            .parse()
            .map_err(|_| WebError::Server(anyhow!("bad cookie header")))?,
    );
    Ok(resp)
}

/// The address failures are counted by (an IPv4-mapped IPv6 address as IPv4).
fn client_ip(peer: SocketAddr) -> IpAddr {
    match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

async fn logout(State(app): State<Shared>, headers: HeaderMap) -> Response {
    app.auth.logout(&headers);
    Redirect::to("/").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_filters_are_clear_errors() {
        let q = |f: fn(&mut JobsQuery)| {
            let mut q = JobsQuery::default();
            f(&mut q);
            parse_jobs_query(&q)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(q(|q| q.status = Some("zombie".into())).contains("zombie"));
        assert!(q(|q| q.age = Some("3 weeks".into())).contains("bad age"));
        assert!(q(|q| q.takeovers = Some("maybe".into())).contains("takeovers"));
        assert!(q(|q| q.after = Some("x".into())).contains("cursor"));
        assert!(q(|q| q.limit = Some("0".into())).contains("limit"));
        assert_eq!(parse_age("30m").map(|d| d.num_seconds()).ok(), Some(1800));
        let ok = parse_jobs_query(&JobsQuery {
            takeovers: Some("on".into()),
            ..JobsQuery::default()
        });
        assert!(ok.is_ok_and(|(f, _, l)| f.with_takeovers && l == PAGE));
    }
}
