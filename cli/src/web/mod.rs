//! `tenure serve`: the operator's web view.
//!
//! Server-rendered HTML (`maud`, escaped by default) with one small script for
//! live counts (server-sent events); no build step. Pages: `/` (overview),
//! `/jobs` (filtered, keyset-paged list), `/jobs/{id}` (timeline, checkpoint,
//! DLQ entries), `/dlq` (grouped by reason, redrive), `/workers`. Each page's
//! data is also JSON under `/api/...`, the same structures `tenure ... --json`
//! prints (`crate::data`). Everything is read through `tenure::blocks::fence` and
//! `tenure::blocks::queue`; actions go through `tenure::Client`.
//!
//! Safe by default: binds 127.0.0.1 unless `--bind` says otherwise, and is
//! read-only unless started with `--operator-token` (`TENURE_OPERATOR_TOKEN`);
//! then actions are POSTs that need a logged-in session and its CSRF token
//! ([`auth`]). Its own connections use the CLI's settings, TLS and credentials.

mod auth;
mod overview;
mod pages;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Json, Redirect, Response};
use axum::routing::{get, post};
use chrono::Utc;
use futures::Stream;
use serde::Deserialize;
use tenure::blocks::fence::{FenceStore, JobFilter, JobStatus};
use tenure::blocks::queue::Queue;
use tenure::security::Secret;
use tenure::{Client, JobId};

use crate::ctx::Ctx;
use crate::data;
use auth::{Auth, Refused};
use pages::{JobsQuery, Viewer};

/// `tenure serve` options.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8023")]
    bind: SocketAddr,
    /// Allow actions (redrive) after logging in with this token (12 characters or more).
    #[arg(long, env = "TENURE_OPERATOR_TOKEN", hide_env_values = true, value_parser = operator_token)]
    operator_token: Option<Secret>,
    /// Seconds between live updates of the overview.
    #[arg(long, default_value_t = 2.0, value_parser = crate::parse_secs)]
    refresh: f64,
}

fn operator_token(s: &str) -> Result<Secret, String> {
    if s.chars().count() < auth::MIN_TOKEN_LEN {
        return Err(format!(
            "the operator token must have at least {} characters",
            auth::MIN_TOKEN_LEN
        ));
    }
    Ok(Secret::new(s))
}

/// Rows per job-list page by default, and at most.
const PAGE: u32 = 50;
const PAGE_MAX: u32 = 500;

/// DLQ entries shown.
const DLQ_LIMIT: usize = 500;

struct App {
    ctx: Ctx,
    store: FenceStore,
    queue: Queue,
    /// Operator mode only: what a redrive needs.
    client: Option<Client>,
    auth: Option<Auth>,
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
            WebError::Refused(_) => StatusCode::FORBIDDEN,
            WebError::Server(_) => StatusCode::BAD_GATEWAY,
        }
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = self.status();
        let page = pages::error(status.as_u16(), &self.to_string());
        (status, Html(page.into_string())).into_response()
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
        let body = serde_json::json!({ "error": self.0.to_string() });
        (self.0.status(), Json(body)).into_response()
    }
}

/// Connects, binds and serves until interrupted (Ctrl-C / SIGTERM).
///
/// # Errors
/// A server that cannot be reached, an address that cannot be bound.
pub async fn serve(ctx: Ctx, args: ServeArgs) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let queue = ctx.queue().await?;
    let client = match &args.operator_token {
        Some(_) => Some(ctx.client().await?),
        None => None,
    };
    let app = Arc::new(App {
        ctx,
        store,
        queue,
        client,
        auth: args.operator_token.map(Auth::new),
        refresh: Duration::from_secs_f64(args.refresh),
        overview: overview::OverviewCache::default(),
    });
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("cannot listen on {}", args.bind))?;
    let addr = listener.local_addr()?;
    let mode = if app.auth.is_some() {
        "operator"
    } else {
        "read-only"
    };
    println!("listening on http://{addr} ({mode})");
    axum::serve(listener, router(app))
        .with_graceful_shutdown(shutdown())
        .await
        .context("serving")
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
        .route("/workers", get(workers_page))
        .route("/api/workers", get(workers_api))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/app.js", get(app_js))
        .with_state(app)
}

fn viewer(app: &App, headers: &HeaderMap) -> Viewer {
    Viewer {
        operator_mode: app.auth.is_some(),
        csrf: app.auth.as_ref().and_then(|a| a.csrf_of(headers)),
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

async fn overview_data(app: &Shared) -> Result<data::OverviewView, WebError> {
    Ok(app.overview.get(app).await?.view)
}

async fn overview_page(
    State(app): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    let o = app.overview.get(&app).await?;
    Ok(page(pages::overview(
        &o.view,
        o.age,
        &viewer(&app, &headers),
    )))
}

async fn overview_api(State(app): State<Shared>) -> Result<Json<data::OverviewView>, ApiError> {
    Ok(Json(overview_data(&app).await?))
}

/// The overview's numbers every `refresh`, as `overview` events (the first at once).
async fn overview_events(
    State(app): State<Shared>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let ticks = tokio::time::interval(app.refresh);
    let stream = futures::stream::unfold((app, ticks), |(app, mut ticks)| async move {
        ticks.tick().await;
        let event = match overview_data(&app).await {
            Ok(v) => Event::default()
                .event("overview")
                .json_data(&v)
                .unwrap_or_else(|e| Event::default().event("error").data(e.to_string())),
            Err(e) => Event::default().event("error").data(e.to_string()),
        };
        Some((Ok(event), (app, ticks)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// "30m", "2h", "7d", "45s" as a duration.
fn parse_age(s: &str) -> Result<chrono::Duration, WebError> {
    let bad = || {
        WebError::BadRequest(format!(
            "bad age {s:?}: expected a number and s, m, h or d (e.g. 30m)"
        ))
    };
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
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
    Query(q): Query<FlashQuery>,
) -> Result<Response, WebError> {
    let d = job_data(&app, &id).await?;
    let flash = q.done.as_deref();
    Ok(page(pages::job(&d, flash, &viewer(&app, &headers))))
}

async fn job_api(
    State(app): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<data::JobDetail>, ApiError> {
    Ok(Json(job_data(&app, &id).await?))
}

/// `?done=...`: what the action that redirected here did.
#[derive(Debug, Deserialize)]
struct FlashQuery {
    done: Option<String>,
}

async fn dlq_page(
    State(app): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<FlashQuery>,
) -> Result<Response, WebError> {
    let entries = data::dlq(&app.ctx, &app.queue, DLQ_LIMIT).await?;
    let flash = q.done.map(|n| format!("Redriven: {n}"));
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

async fn workers_api(
    State(app): State<Shared>,
) -> Result<Json<Vec<tenure::blocks::fence::WorkerSeen>>, ApiError> {
    Ok(Json(
        data::workers(&app.ctx, &app.store)
            .await
            .map_err(WebError::from)?,
    ))
}

/// The fields of an action's form (redrive one, redrive by reason, cancel).
#[derive(Debug, Deserialize)]
struct ActionForm {
    csrf: Option<String>,
    job_id: Option<String>,
    reason: Option<String>,
}

/// The client of an allowed action: operator mode, a session, its CSRF token.
fn allowed<'a>(
    app: &'a App,
    headers: &HeaderMap,
    csrf: Option<&str>,
) -> Result<&'a Client, WebError> {
    let (Some(auth), Some(client)) = (&app.auth, &app.client) else {
        return Err(Refused::ReadOnly.into());
    };
    auth.allow(headers, csrf)?;
    Ok(client)
}

/// The job id an action's form names.
fn form_job_id(raw: Option<String>) -> Result<JobId, WebError> {
    let raw = raw.unwrap_or_default();
    raw.parse()
        .map_err(|e| WebError::BadRequest(format!("not a job id {raw:?}: {e}")))
}

async fn redrive_ids(app: &App, client: &Client, ids: Vec<JobId>) -> Result<Response, WebError> {
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
    Ok(Redirect::to(&format!("/dlq?done={}", pages::urlencode(&note))).into_response())
}

async fn redrive_one(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    let client = allowed(&app, &headers, f.csrf.as_deref())?;
    let id = form_job_id(f.job_id)?;
    redrive_ids(&app, client, vec![id]).await
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
    redrive_ids(&app, client, ids).await
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
        Err(e) => format!("not cancelled: {e}"),
    };
    let to = format!("/jobs/{id}?done={}", pages::urlencode(&note));
    Ok(Redirect::to(&to).into_response())
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
/// (a script, which sends `Accept: application/json`).
async fn login(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Result<Response, WebError> {
    let auth = app.auth.as_ref().ok_or(Refused::ReadOnly)?;
    let given = auth::bearer(&headers).or(f.token).unwrap_or_default();
    let (session, csrf) = match auth.login(&given) {
        Ok(s) => s,
        Err(e) => {
            let html = pages::login(Some(&e.to_string()), &viewer(&app, &headers));
            return Ok((StatusCode::FORBIDDEN, Html(html.into_string())).into_response());
        }
    };
    let cookie = format!(
        "{}={session}; HttpOnly; SameSite=Strict; Path=/",
        auth::COOKIE
    );
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    let body = if wants_json {
        Json(serde_json::json!({ "csrf": csrf })).into_response()
    } else {
        Redirect::to("/dlq").into_response()
    };
    let mut resp = body;
    resp.headers_mut().insert(
        header::SET_COOKIE,
        cookie
            .parse()
            .map_err(|_| WebError::Server(anyhow!("bad cookie header")))?,
    );
    Ok(resp)
}

async fn logout(State(app): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(auth) = &app.auth {
        auth.logout(&headers);
    }
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
