//! A user's schedules: `POST/GET /apps/{app}/users/{user}/schedules`, `GET/PATCH/DELETE
//! …/schedules/{schedule}` and `GET …/schedules/{schedule}/runs` (its ticks and their runs).
//! Checked in full (pattern, zone, message, webhook) before anything is stored; firing is the
//! ticker's ([`crate::schedule::Ticker`]).

use super::run_request::webhook_error;
use crate::error_code::ErrorCode;
use crate::event::{now_ts, Content};
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{validate_id, JsonBody, Path, Query};
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, SchedulePath, UserPath};
use crate::http::AppState;
use crate::runner::OnBusy;
use crate::schedule::{CatchUp, Limits, Pattern};
use crate::store::{RunStatus, ScheduleRecord, TickRecord};
use crate::webhook::{check_resolves, WebhookSpec, WebhookTarget};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `POST /apps/{app}/users/{user}/schedules` answers beyond the door's codes.
    CreateScheduleErrors: AppNotFound, NotFound, InvalidId, ValidationError, TooManySchedules, TooManyParts, InvalidCron, CronTooFrequent, InvalidTimezone, InvalidMessage, WebhookUrlInvalid, WebhookUrlRefused, WebhookEventUnknown, WebhookSecretRequired, WebhookSecretInvalid
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/schedules` answers beyond the door's codes.
    ListSchedulesErrors: AppNotFound, NotFound, InvalidId, ValidationError, InvalidCursor
);

error_set!(
    /// What `GET /apps/{app}/schedules` answers beyond the door's codes.
    ListAppSchedulesErrors: AppNotFound, InvalidId, ValidationError, AdminRequired, InvalidCursor
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/schedules/{schedule}` answers beyond the door's codes.
    GetScheduleErrors: AppNotFound, NotFound, InvalidId, ScheduleNotFound
);

error_set!(
    /// What `PATCH /apps/{app}/users/{user}/schedules/{schedule}` answers beyond the door's codes.
    UpdateScheduleErrors: AppNotFound, NotFound, InvalidId, ValidationError, ScheduleNotFound, TooManyParts, InvalidCron, CronTooFrequent, InvalidTimezone, InvalidMessage, WebhookUrlInvalid, WebhookUrlRefused, WebhookEventUnknown, WebhookSecretRequired, WebhookSecretInvalid
);

error_set!(
    /// What `DELETE /apps/{app}/users/{user}/schedules/{schedule}` answers beyond the door's codes.
    DeleteScheduleErrors: AppNotFound, NotFound, InvalidId, ScheduleNotFound
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/schedules/{schedule}/runs` answers beyond the door's codes.
    ScheduleRunsErrors: AppNotFound, NotFound, InvalidId, ValidationError, ScheduleNotFound
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_schedule, list_schedules))
        .routes(routes!(get_schedule, update_schedule, delete_schedule))
        .routes(routes!(schedule_runs))
        .routes(routes!(list_app_schedules))
}

/// The largest message a schedule may store, as JSON bytes.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;
const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 200;

/// A new schedule.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewScheduleBody {
    /// 5 fields (`*/15 * * * *`), or 6 with seconds first.
    cron: String,
    /// An IANA time zone (default `UTC`).
    #[serde(default)]
    timezone: Option<String>,
    /// The user message of each run: a string, or an ADK `Content`.
    #[schema(value_type = Object)]
    message: Value,
    /// `"new"` (default): a new session per tick; else the id of the session every tick
    /// continues (created on the first tick if missing).
    #[serde(default)]
    session: Option<String>,
    /// When that session is busy at a tick: `reject` (default: the tick is skipped),
    /// `enqueue` or `interrupt`.
    #[serde(default)]
    on_busy: Option<OnBusy>,
    /// Ticks missed while no replica ran: `one` (default: the latest fires once) or `none`.
    #[serde(default)]
    catch_up: Option<CatchUp>,
    #[serde(default)]
    enabled: Option<bool>,
    /// A webhook for each run's end (the app's webhooks apply too).
    #[serde(default)]
    webhook: Option<WebhookSpec>,
}

/// A change to a schedule: the fields given replace the stored ones (`webhook: null`
/// removes it).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleChange {
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    message: Option<Value>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    on_busy: Option<OnBusy>,
    #[serde(default)]
    catch_up: Option<CatchUp>,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<WebhookSpec>)]
    webhook: Option<Option<WebhookSpec>>,
}

/// `Some(None)` for an explicit `null`, `None` when absent.
fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<WebhookSpec>>, D::Error> {
    Option::<WebhookSpec>::deserialize(d).map(Some)
}

/// A schedule as the API shows it (its webhook without the secret).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleView {
    #[serde(flatten)]
    schedule: ScheduleRecord,
    /// `"new"` or the session's id.
    session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    webhook: Option<WebhookView>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookView {
    url: String,
    events: Vec<String>,
    include_text: bool,
}

fn view(s: ScheduleRecord) -> ScheduleView {
    let webhook = s
        .webhook
        .clone()
        .and_then(|w| serde_json::from_value::<WebhookTarget>(w).ok())
        .map(|t| WebhookView {
            url: t.url,
            events: t.events,
            include_text: t.include_text,
        });
    ScheduleView {
        session: s.session_id.clone().unwrap_or_else(|| "new".into()),
        schedule: s,
        webhook,
    }
}

fn invalid(field: &str, code: ErrorCode, msg: impl Into<String>) -> ApiError {
    ApiError::problem(code, vec!["body".into(), field.into()], msg)
}

fn schedule_not_found() -> ApiError {
    ApiError::new(ErrorCode::ScheduleNotFound, "Schedule not found")
}

/// The message as stored: a `Content` with the user's role.
fn message(v: Value, max_parts: usize) -> ApiResult<Value> {
    let content = match v {
        Value::String(text) if !text.is_empty() => Content {
            parts: vec![crate::event::Part::text(text)],
            role: Some("user".into()),
            extra: Default::default(),
        },
        Value::Object(_) => serde_json::from_value::<Content>(v).map_err(|e| {
            invalid(
                "message",
                ErrorCode::InvalidMessage,
                format!("not a Content: {e}"),
            )
        })?,
        _ => {
            return Err(invalid(
                "message",
                ErrorCode::InvalidMessage,
                "message is a non-empty string or an ADK Content object",
            ))
        }
    };
    if content.parts.is_empty() {
        return Err(invalid(
            "message",
            ErrorCode::InvalidMessage,
            "the message has no parts",
        ));
    }
    // Each tick would be refused: refused once, now.
    if content.parts.len() > max_parts {
        return Err(invalid(
            "message",
            ErrorCode::TooManyParts,
            format!(
                "the message has {} parts, over the limit of {max_parts} (--max-message-parts)",
                content.parts.len()
            ),
        ));
    }
    let mut content = content;
    content.role = Some("user".into());
    let value = serde_json::to_value(&content).map_err(ApiError::internal)?;
    let size = serde_json::to_vec(&value)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_MESSAGE_BYTES {
        return Err(invalid(
            "message",
            ErrorCode::InvalidMessage,
            format!("the message is {size} bytes as JSON; the limit is {MAX_MESSAGE_BYTES}"),
        ));
    }
    Ok(value)
}

fn session(s: Option<String>) -> ApiResult<Option<String>> {
    match s.as_deref() {
        None | Some("new") => Ok(None),
        Some(id) => {
            validate_id("session", id)?;
            Ok(Some(id.to_string()))
        }
    }
}

async fn webhook(state: &AppState, spec: &WebhookSpec) -> ApiResult<Value> {
    let target = state
        .webhooks
        .target(spec)
        .map_err(|e| webhook_error(e, "webhook"))?;
    check_resolves(&state.webhooks, &target)
        .await
        .map_err(|e| webhook_error(e, "webhook"))?;
    serde_json::to_value(&target).map_err(ApiError::internal)
}

/// The pattern, if it parses and fires no more often than `--schedule-min-interval-secs`.
fn pattern(limits: Limits, cron: &str, timezone: &str) -> ApiResult<Pattern> {
    let p = Pattern::parse(cron, timezone).map_err(|e| {
        let field = if e.code == ErrorCode::InvalidTimezone {
            "timezone"
        } else {
            "cron"
        };
        invalid(field, e.code, e.message)
    })?;
    let every = p.min_interval_secs();
    if every < limits.min_interval_secs {
        return Err(invalid(
            "cron",
            ErrorCode::CronTooFrequent,
            format!(
                "{cron:?} fires every {every} s; this server allows one tick every {} s at \
                 most (--schedule-min-interval-secs)",
                limits.min_interval_secs
            ),
        ));
    }
    Ok(p)
}

/// The API key a schedule is made (or changed) with: its ticks stop when the key does.
fn made_by(caller: &crate::auth::Caller) -> Option<String> {
    match &caller.via {
        crate::auth::Via::ApiKey(id) => Some(id.clone()),
        _ => None,
    }
}

fn on_busy_str(b: OnBusy) -> &'static str {
    match b {
        OnBusy::Reject => "reject",
        OnBusy::Enqueue => "enqueue",
        OnBusy::Interrupt => "interrupt",
    }
}

/// Creates a schedule; its first tick is the pattern's next time after now.
#[utoipa::path(post, path = "/apps/{app}/users/{user}/schedules", tag = "schedules",
    params(UserPath), request_body = NewScheduleBody,
    responses((status = 201, description = "Created.", body = ScheduleView), Errors, CreateScheduleErrors))]
async fn create_schedule(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path((app, user)): Path<(String, String)>,
    JsonBody(body, _): JsonBody<NewScheduleBody>,
) -> ApiResult<Response> {
    validate_id("app", &app)?;
    validate_id("user", &user)?;
    crate::http::auth::served_app(&state, &caller, &app)?;
    let timezone = body.timezone.unwrap_or_else(|| "UTC".into());
    let p = pattern(state.schedules, &body.cron, &timezone)?;
    let message = message(body.message, state.runner.max_message_parts())?;
    let session_id = session(body.session)?;
    let webhook = match &body.webhook {
        Some(spec) => Some(webhook(&state, spec).await?),
        None => None,
    };
    let enabled = body.enabled.unwrap_or(true);
    let now = now_ts();
    let record = ScheduleRecord {
        id: format!("sch-{}", uuid::Uuid::new_v4().simple()),
        app_name: app,
        user_id: user,
        cron: body.cron.trim().to_string(),
        timezone,
        message,
        session_id,
        on_busy: on_busy_str(body.on_busy.unwrap_or_default()).into(),
        catch_up: body.catch_up.unwrap_or(CatchUp::One).as_str().into(),
        webhook,
        enabled,
        next_tick: enabled.then(|| p.next_after(now)).flatten(),
        created_at: now,
        updated_at: now,
        created_by: made_by(&caller),
        paused_reason: None,
    };
    let max = state.schedules.max_per_user;
    if !state.store.create_schedule(&record, max).await? {
        return Err(ApiError::new(
            ErrorCode::TooManySchedules,
            format!(
                "user {:?} already has {max} schedules in this app \
                 (--max-schedules-per-user): delete one first",
                record.user_id
            ),
        ));
    }
    tracing::info!(schedule = %record.id, cron = %record.cron, "schedule created");
    Ok((StatusCode::CREATED, axum::Json(view(record))).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// The `next` cursor of the previous page.
    after: Option<String>,
    /// Per page: 1 to 200 (default 50); out of range is 422.
    limit: Option<u32>,
}

/// A page of schedules.
#[derive(Debug, Serialize, ToSchema)]
pub struct SchedulePage {
    schedules: Vec<ScheduleView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// A user's schedules in an app, oldest first.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/schedules", tag = "schedules",
    params(UserPath, PageQuery),
    responses((status = 200, description = "Schedules, oldest first.", body = SchedulePage), Errors, ListSchedulesErrors))]
async fn list_schedules(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> ApiResult<axum::Json<SchedulePage>> {
    page(&state, &app, Some(&user), q).await
}

/// Every user's schedules in an app, oldest first (admin keys only).
#[utoipa::path(get, path = "/apps/{app}/schedules", tag = "schedules",
    params(crate::http::openapi::AppPath, PageQuery),
    responses((status = 200, description = "Schedules, oldest first.", body = SchedulePage), Errors, ListAppSchedulesErrors))]
async fn list_app_schedules(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path(app): Path<String>,
    Query(q): Query<PageQuery>,
) -> ApiResult<axum::Json<SchedulePage>> {
    if !caller.admin {
        return Err(crate::http::auth::admin_required(
            &caller,
            "Listing every user's schedules",
        ));
    }
    page(&state, &app, None, q).await
}

async fn page(
    state: &AppState,
    app: &str,
    user: Option<&str>,
    q: PageQuery,
) -> ApiResult<axum::Json<SchedulePage>> {
    let limit = crate::http::paging::limit(q.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let after = match q.after.as_deref() {
        None => None,
        Some(c) => Some(
            c.split_once('~')
                .and_then(|(at, id)| Some((at.parse::<f64>().ok()?, id.to_string())))
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidCursor,
                        "after: not a cursor from this list",
                    )
                })?,
        ),
    };
    // One more than the page: whether a next page exists.
    let mut rows = state
        .store
        .list_schedules(app, user, after, limit + 1)
        .await?;
    let next = (rows.len() > limit as usize)
        .then(|| {
            rows.truncate(limit as usize);
            rows.last().map(|s| format!("{}~{}", s.created_at, s.id))
        })
        .flatten();
    Ok(axum::Json(SchedulePage {
        schedules: rows.into_iter().map(view).collect(),
        next,
    }))
}

/// One schedule (another user's is 404).
#[utoipa::path(get, path = "/apps/{app}/users/{user}/schedules/{schedule}", tag = "schedules",
    params(SchedulePath),
    responses((status = 200, description = "The schedule.", body = ScheduleView), Errors, GetScheduleErrors))]
async fn get_schedule(
    state: axum::extract::State<AppState>,
    Path((app, user, id)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<ScheduleView>> {
    let s = state
        .store
        .get_schedule(&app, &user, &id)
        .await?
        .ok_or_else(schedule_not_found)?;
    Ok(axum::Json(view(s)))
}

/// Changes a schedule. A new pattern, zone or `enabled: true` sets its next tick from now.
#[utoipa::path(patch, path = "/apps/{app}/users/{user}/schedules/{schedule}", tag = "schedules",
    params(SchedulePath), request_body = ScheduleChange,
    responses((status = 200, description = "The changed schedule.", body = ScheduleView), Errors, UpdateScheduleErrors))]
async fn update_schedule(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path((app, user, id)): Path<(String, String, String)>,
    JsonBody(change, _): JsonBody<ScheduleChange>,
) -> ApiResult<axum::Json<ScheduleView>> {
    let mut s = state
        .store
        .get_schedule(&app, &user, &id)
        .await?
        .ok_or_else(schedule_not_found)?;
    let retime = change.cron.is_some()
        || change.timezone.is_some()
        || (change.enabled == Some(true) && !s.enabled);
    if let Some(cron) = change.cron {
        s.cron = cron.trim().to_string();
    }
    if let Some(tz) = change.timezone {
        s.timezone = tz;
    }
    let p = pattern(state.schedules, &s.cron, &s.timezone)?;
    if let Some(m) = change.message {
        s.message = message(m, state.runner.max_message_parts())?;
    }
    if change.session.is_some() {
        s.session_id = session(change.session)?;
    }
    if let Some(b) = change.on_busy {
        s.on_busy = on_busy_str(b).into();
    }
    if let Some(c) = change.catch_up {
        s.catch_up = c.as_str().into();
    }
    match change.webhook {
        Some(Some(spec)) => s.webhook = Some(webhook(&state, &spec).await?),
        Some(None) => s.webhook = None,
        None => {}
    }
    if let Some(enabled) = change.enabled {
        s.enabled = enabled;
    }
    let now = now_ts();
    if !s.enabled {
        s.next_tick = None;
    } else if retime || s.next_tick.is_none() {
        s.next_tick = p.next_after(now);
    }
    s.updated_at = now;
    // Whoever changes it now answers for it: a schedule paused because its key was revoked
    // fires again once someone with a valid credential enables it.
    s.created_by = made_by(&caller);
    if s.enabled {
        s.paused_reason = None;
    }
    if !state.store.update_schedule(&s).await? {
        return Err(schedule_not_found());
    }
    Ok(axum::Json(view(s)))
}

/// Deletes a schedule and its tick history (its runs and sessions stay).
#[utoipa::path(delete, path = "/apps/{app}/users/{user}/schedules/{schedule}", tag = "schedules",
    params(SchedulePath),
    responses((status = 204, description = "Deleted."), Errors, DeleteScheduleErrors))]
async fn delete_schedule(
    state: axum::extract::State<AppState>,
    Path((app, user, id)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    if state.store.delete_schedule(&app, &user, &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(schedule_not_found())
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TicksQuery {
    /// Only ticks before this tick time (the `next` cursor of the previous page).
    before: Option<f64>,
    /// Per page: 1 to 200 (default 50); out of range is 422.
    limit: Option<u32>,
}

/// A tick and, once started, its run's status.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TickView {
    #[serde(flatten)]
    tick: TickRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_status: Option<RunStatus>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TickPage {
    ticks: Vec<TickView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<f64>,
}

/// A schedule's ticks, newest first, each with its run (`runId`; follow it at `/runs/{id}`).
#[utoipa::path(get, path = "/apps/{app}/users/{user}/schedules/{schedule}/runs", tag = "schedules",
    params(SchedulePath, TicksQuery),
    responses((status = 200, description = "Ticks, newest first.", body = TickPage), Errors, ScheduleRunsErrors))]
async fn schedule_runs(
    state: axum::extract::State<AppState>,
    Path((app, user, id)): Path<(String, String, String)>,
    Query(q): Query<TicksQuery>,
) -> ApiResult<axum::Json<TickPage>> {
    state
        .store
        .get_schedule(&app, &user, &id)
        .await?
        .ok_or_else(schedule_not_found)?;
    let limit = crate::http::paging::limit(q.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let mut ticks = state.store.schedule_ticks(&id, q.before, limit + 1).await?;
    let next = (ticks.len() > limit as usize)
        .then(|| {
            ticks.truncate(limit as usize);
            ticks.last().map(|t| t.tick_time)
        })
        .flatten();
    let mut out = Vec::with_capacity(ticks.len());
    for tick in ticks {
        let run_status = match tick.status.as_str() {
            "started" | "claimed" => state
                .store
                .get_user_run(&tick.user_id, &tick.run_id)
                .await?
                .map(|r| r.status),
            _ => None,
        };
        out.push(TickView { tick, run_status });
    }
    Ok(axum::Json(TickPage { ticks: out, next }))
}
