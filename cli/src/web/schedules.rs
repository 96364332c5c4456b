//! The schedules page (`/schedules`, `/api/schedules`) and its actions
//! (operator mode): pause, resume and trigger one cron schedule through
//! `tenure::Client`. Each trigger form carries a trigger id made when the page
//! was rendered, so submitting that form twice (a double click, a resent
//! POST) is one job; a reloaded page carries a new one.

use axum::extract::{Form, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json, Redirect, Response};
use serde::Deserialize;

use super::{ApiError, App, Shared, WebError, allowed, logged, page, pages, viewer};
use crate::data;

pub(super) async fn schedules_page(
    State(app): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    let view = data::schedules(&app.ctx, &app.store).await?;
    let flash = app.auth.take_flash(&headers);
    let trigger_id = uuid::Uuid::new_v4().to_string();
    let shown = pages::Schedules {
        view: &view,
        flash: flash.as_deref(),
        trigger_id: &trigger_id,
    };
    Ok(page(pages::schedules(&shown, &viewer(&app, &headers))))
}

pub(super) async fn schedules_api(
    State(app): State<Shared>,
) -> Result<Json<data::SchedulesView>, ApiError> {
    let view = data::schedules(&app.ctx, &app.store).await;
    Ok(Json(view.map_err(WebError::from)?))
}

/// The fields of a schedule's action form.
#[derive(Debug, Deserialize)]
pub(super) struct ScheduleForm {
    csrf: Option<String>,
    schedule: Option<String>,
    trigger_id: Option<String>,
}

/// What a schedule action does.
#[derive(Debug, Clone, Copy)]
enum Action {
    Pause,
    Resume,
    Trigger,
}

pub(super) async fn pause_schedule(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ScheduleForm>,
) -> Result<Response, WebError> {
    act(&app, &headers, f, Action::Pause).await
}

pub(super) async fn resume_schedule(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ScheduleForm>,
) -> Result<Response, WebError> {
    act(&app, &headers, f, Action::Resume).await
}

pub(super) async fn trigger_schedule(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<ScheduleForm>,
) -> Result<Response, WebError> {
    act(&app, &headers, f, Action::Trigger).await
}

/// Does `action` on the form's schedule, then shows the schedules page with
/// what happened (a refusal, e.g. an unknown schedule, said plainly; a
/// server failure as a reference).
async fn act(
    app: &App,
    headers: &HeaderMap,
    f: ScheduleForm,
    action: Action,
) -> Result<Response, WebError> {
    let client = allowed(app, headers, f.csrf.as_deref())?;
    let name = f.schedule.unwrap_or_default();
    if name.trim().is_empty() {
        return Err(WebError::BadRequest("give a schedule".into()));
    }
    let done = match action {
        Action::Pause => data::control_schedule(&app.ctx, client, &name, true).await,
        Action::Resume => data::control_schedule(&app.ctx, client, &name, false).await,
        Action::Trigger => {
            let id = f.trigger_id.unwrap_or_default();
            data::trigger_schedule(&app.ctx, client, &name, &id).await
        }
    };
    let note = match done {
        Ok(v) => v.line(),
        Err(e) => {
            let reference = logged(&format!("{e:#}"));
            format!("not changed: {name} (reference {reference})")
        }
    };
    app.auth.set_flash(headers, note);
    Ok(Redirect::to("/schedules").into_response())
}
