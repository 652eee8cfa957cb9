//! A run by its id, from any replica: `GET /runs/{id}` (with `?wait=` a long poll for its end,
//! as `POST /runs/{id}/wait`), `POST /runs/{id}/cancel`, and `GET /runs/{id}/stream`
//! (re-attach: the committed events after `Last-Event-ID` or `?after=` replayed from the
//! database, then live with exactly the frames `POST /run` sends; a finished run: replay, then
//! `done`); and a user's runs, newest first (`GET /apps/{app}/users/{user}/runs`).
//!
//! Each route on one run also lives under its user (`/apps/{app}/users/{user}/runs/{id}…`):
//! that form finds the run with its user, one shard on Citus; the bare form has to ask every
//! shard for the id, then goes on with the run's user (docs/citus.md).

use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::http::error::{problem, ApiError, ApiResult};
use crate::http::extract::Path;
use crate::http::extract::Query;
use crate::http::openapi::error_set;
use crate::http::openapi::UserPath;
use crate::http::openapi::{Errors, EventStream};
use crate::http::sse::follow::RunFollower;
use crate::http::sse::resume::{beyond_end, resume_point, sse_body, AfterQuery};
use crate::http::sse::run_headers;
use crate::http::AppState;
use crate::store::{CancelRequest, DeliveryRecord, RunRecord, RunStatus};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `GET /runs/{run_id}/stream` answers beyond the door's codes.
    RunStreamErrors: InvalidId, ValidationError, RunNotFound, AfterBeyondEnd
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/runs/{run_id}/stream` answers beyond the door's codes.
    UserRunStreamErrors: AppNotFound, NotFound, InvalidId, ValidationError, RunNotFound, AfterBeyondEnd
);

error_set!(
    /// What `GET /runs/{run_id}` answers beyond the door's codes.
    GetRunErrors: InvalidId, ValidationError, RunNotFound
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/runs/{run_id}` answers beyond the door's codes.
    GetUserRunErrors: AppNotFound, NotFound, InvalidId, ValidationError, RunNotFound
);

error_set!(
    /// What `POST /runs/{run_id}/wait` answers beyond the door's codes.
    WaitRunErrors: InvalidId, ValidationError, RunNotFound
);

error_set!(
    /// What `POST /apps/{app}/users/{user}/runs/{run_id}/wait` answers beyond the door's codes.
    WaitUserRunErrors: AppNotFound, NotFound, InvalidId, ValidationError, RunNotFound
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/runs` answers beyond the door's codes.
    ListRunsErrors: AppNotFound, NotFound, InvalidId, ValidationError
);

error_set!(
    /// What `POST /runs/{run_id}/cancel` answers beyond the door's codes.
    CancelRunErrors: InvalidId, ValidationError, RunNotFound, RunNotActive
);

error_set!(
    /// What `POST /apps/{app}/users/{user}/runs/{run_id}/cancel` answers beyond the door's codes.
    CancelUserRunErrors: AppNotFound, NotFound, InvalidId, ValidationError, RunNotFound, RunNotActive
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_run))
        .routes(routes!(wait_run))
        .routes(routes!(cancel_run))
        .routes(routes!(run_stream))
        .routes(routes!(get_user_run))
        .routes(routes!(wait_user_run))
        .routes(routes!(cancel_user_run))
        .routes(routes!(user_run_stream))
        .routes(routes!(list_runs))
}

/// Longest a long poll for a run's end waits (`?wait=`, `POST …/wait`); the default.
pub const MAX_WAIT_SECS: u64 = 60;
pub const DEFAULT_WAIT_SECS: u64 = 30;
/// Runs per page of a user's runs (default and largest).
pub const DEFAULT_RUNS_PAGE: u32 = 50;
pub const MAX_RUNS_PAGE: u32 = 200;

/// Re-attaches to a run from any replica: the committed events after `Last-Event-ID` (or
/// `?after=`), then live, in `POST /run`'s frames, ending with `event: done`.
#[utoipa::path(get, path = "/runs/{run_id}/stream", tag = "runs",
    params(("run_id" = String, Path, description = "From `x-agentd-run-id`"), AfterQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "The last seq the client has")),
    responses((status = 200, description = "`POST /run`'s SSE frames, from the resume point.",
        content_type = "text/event-stream", body = EventStream), Errors, RunStreamErrors))]
async fn run_stream(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    query: axum::extract::Query<AfterQuery>,
) -> ApiResult<Response> {
    let after = resume_point(&headers, &query)?;
    let run = visible_run(&state, &caller, &run_id).await?;
    stream_from(&state, run, after).await
}

/// `GET /runs/{run_id}/stream` for a run found with its user.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/runs/{run_id}/stream", tag = "runs",
    params(UserPath, ("run_id" = String, Path, description = "From `x-agentd-run-id`"), AfterQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "The last seq the client has")),
    responses((status = 200, description = "`POST /run`'s SSE frames, from the resume point.",
        content_type = "text/event-stream", body = EventStream), Errors, UserRunStreamErrors))]
async fn user_run_stream(
    state: axum::extract::State<AppState>,
    Path((app, user, run_id)): Path<(String, String, String)>,
    headers: HeaderMap,
    query: axum::extract::Query<AfterQuery>,
) -> ApiResult<Response> {
    let after = resume_point(&headers, &query)?;
    let run = user_run(&state, &app, &user, &run_id).await?;
    stream_from(&state, run, after).await
}

async fn stream_from(state: &AppState, run: RunRecord, after: Option<i64>) -> ApiResult<Response> {
    // Follow before reading anything else: whatever happens from here on is heard.
    let sub = state.runner.bus().subscribe(&run.key());
    let run = state
        .runner
        .get_user_run(&run.user_id, &run.run_id)
        .await?
        .ok_or_else(run_not_found)?;
    let head =
        state.store.session_head(&run.key()).await?.ok_or_else(|| {
            ApiError::new(ErrorCode::RunNotFound, "The run's session was deleted")
        })?;
    if let Some(a) = after {
        if a > head.last_seq {
            return Err(beyond_end(a, head.last_seq));
        }
    }
    let extra = run_headers(&run.run_id, &run.invocation_id, None);
    let rx = RunFollower::spawn_frames(state.clone(), run, after, sub);
    Ok(sse_body(rx, extra))
}

pub fn run_not_found() -> ApiError {
    ApiError::new(ErrorCode::RunNotFound, "Run not found")
}

/// The run, if it exists and the caller may see it (another user's run is "not found").
pub async fn visible_run(state: &AppState, caller: &Caller, run_id: &str) -> ApiResult<RunRecord> {
    state
        .runner
        .get_run(run_id)
        .await?
        .filter(|r| caller.may_access(&r.app_name, &r.user_id))
        .ok_or_else(run_not_found)
}

/// The run of `user` in `app` (the path's app and user, which the auth layer checked).
async fn user_run(state: &AppState, app: &str, user: &str, run_id: &str) -> ApiResult<RunRecord> {
    state
        .runner
        .get_user_run(user, run_id)
        .await?
        .filter(|r| r.app_name == app)
        .ok_or_else(run_not_found)
}

/// A run with its webhook deliveries (`GET /runs/{id}`, the waits).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    #[serde(flatten)]
    run: RunRecord,
    /// Its webhooks' deliveries (written when the run ended): status, attempts, last error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    webhooks: Vec<DeliveryRecord>,
}

/// The run and its webhook deliveries. The app's own webhooks (URLs of the operator's, with
/// their secrets and errors) are shown only to a caller who may see the server's internals.
async fn with_deliveries(
    state: &AppState,
    caller: &Caller,
    run: RunRecord,
) -> ApiResult<axum::Json<RunView>> {
    let mut webhooks = if run.status == RunStatus::Running {
        vec![]
    } else {
        state
            .store
            .run_deliveries(&run.user_id, &run.run_id)
            .await?
    };
    if !caller.may_see_internals() {
        // Runs admitted before targets were marked: the app's URLs as configured now.
        let app_urls: Vec<&str> = state
            .apps
            .get(&run.app_name)
            .map(|a| a.webhooks.iter().map(|w| w.url.as_str()).collect())
            .unwrap_or_default();
        webhooks.retain(|d| !d.app && !app_urls.contains(&d.url.as_str()));
    }
    Ok(axum::Json(RunView { run, webhooks }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Wait up to this many seconds for the run to end (at most 60); answered at once when it
    /// has ended, else with the run as it is when the time is up.
    wait: Option<u64>,
}

/// A run: its status, owner, timing, seq range and cancel record. With `?wait=N`, a long poll:
/// the answer comes when the run ends or after N seconds (at most 60), whichever is first.
#[utoipa::path(get, path = "/runs/{run_id}", tag = "runs",
    params(("run_id" = String, Path, description = "From `x-agentd-run-id`"), WaitQuery),
    responses((status = 200, description = "The run.", body = RunView), Errors, GetRunErrors))]
async fn get_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<axum::Json<RunView>> {
    let run = visible_run(&state, &caller, &run_id).await?;
    let run = match q.wait {
        None | Some(0) => run,
        Some(secs) => wait_for_end(&state, run, secs).await?,
    };
    with_deliveries(&state, &caller, run).await
}

/// `GET /runs/{run_id}` for a run found with its user.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/runs/{run_id}", tag = "runs",
    params(UserPath, ("run_id" = String, Path, description = "From `x-agentd-run-id`"), WaitQuery),
    responses((status = 200, description = "The run.", body = RunView), Errors, GetUserRunErrors))]
async fn get_user_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, user, run_id)): Path<(String, String, String)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<axum::Json<RunView>> {
    let run = user_run(&state, &app, &user, &run_id).await?;
    let run = match q.wait {
        None | Some(0) => run,
        Some(secs) => wait_for_end(&state, run, secs).await?,
    };
    with_deliveries(&state, &caller, run).await
}

/// Waits for a run to end (a long poll, for clients of background runs): the run when it has
/// ended, or as it is after `?wait=` seconds (default 30, at most 60).
#[utoipa::path(post, path = "/runs/{run_id}/wait", tag = "runs",
    params(("run_id" = String, Path, description = "From `x-agentd-run-id`"), WaitQuery),
    responses((status = 200, description = "The run, ended or as it is when the wait is over.",
        body = RunView), Errors, WaitRunErrors))]
async fn wait_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<axum::Json<RunView>> {
    let run = visible_run(&state, &caller, &run_id).await?;
    let secs = q.wait.unwrap_or(DEFAULT_WAIT_SECS);
    let run = wait_for_end(&state, run, secs).await?;
    with_deliveries(&state, &caller, run).await
}

/// `POST /runs/{run_id}/wait` for a run found with its user.
#[utoipa::path(post, path = "/apps/{app}/users/{user}/runs/{run_id}/wait", tag = "runs",
    params(UserPath, ("run_id" = String, Path, description = "From `x-agentd-run-id`"), WaitQuery),
    responses((status = 200, description = "The run, ended or as it is when the wait is over.",
        body = RunView), Errors, WaitUserRunErrors))]
async fn wait_user_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, user, run_id)): Path<(String, String, String)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<axum::Json<RunView>> {
    let run = user_run(&state, &app, &user, &run_id).await?;
    let secs = q.wait.unwrap_or(DEFAULT_WAIT_SECS);
    let run = wait_for_end(&state, run, secs).await?;
    with_deliveries(&state, &caller, run).await
}

/// `run` once it has ended (read from the database, so it works for a run on any replica), or
/// as it is after `secs` (bounded by [`MAX_WAIT_SECS`]). The bus says when the session's run
/// ends; a one-second re-read covers a lost notification.
pub async fn wait_for_end(state: &AppState, run: RunRecord, secs: u64) -> ApiResult<RunRecord> {
    if run.status != RunStatus::Running {
        return Ok(run);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs.min(MAX_WAIT_SECS));
    // Ends only: a waiter must not make the run publish its partial events.
    let mut sub = state.runner.bus().subscribe_ends(&run.key());
    let (user, run_id) = (run.user_id, run.run_id);
    loop {
        // Subscribed first, then read: an end in between is not missed.
        let current = state
            .runner
            .get_user_run(&user, &run_id)
            .await?
            .ok_or_else(run_not_found)?;
        if current.status != RunStatus::Running {
            return Ok(current);
        }
        let poll = tokio::time::Instant::now() + Duration::from_secs(1);
        tokio::select! {
            _ = sub.rx.recv() => {}
            _ = tokio::time::sleep_until(poll.min(deadline)) => {}
            // Shutting down: answer with the run as it is, rather than hold the shutdown.
            _ = state.runner.stopped() => return Ok(current),
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(state
                .runner
                .get_user_run(&user, &run_id)
                .await?
                .unwrap_or(current));
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListRunsQuery {
    /// Only runs with this status (`running`, `completed`, `failed`, `cancelled`,
    /// `timed_out`, `interrupted`, `abandoned`).
    status: Option<String>,
    /// The `next` cursor of the previous page.
    after: Option<String>,
    /// Runs per page (default 50, at most 200).
    limit: Option<u32>,
}

/// A page of a user's runs.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunPage {
    runs: Vec<RunRecord>,
    /// Pass as `?after=` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// A user's runs in an app, newest first (background runs included), a page at a time.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/runs", tag = "runs",
    params(UserPath, ListRunsQuery),
    responses((status = 200, description = "Runs, newest first.", body = RunPage), Errors, ListRunsErrors))]
async fn list_runs(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
    Query(q): Query<ListRunsQuery>,
) -> ApiResult<Response> {
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(parse_status(s)?),
    };
    let limit = crate::http::paging::limit(q.limit, DEFAULT_RUNS_PAGE, MAX_RUNS_PAGE)?;
    let before = q.after.as_deref().map(decode_cursor).transpose()?;
    // One more than the page: whether a next page exists, without a second query.
    let mut runs = state
        .store
        .list_runs(&app, &user, status, before, limit + 1)
        .await?;
    let next = if runs.len() > limit as usize {
        runs.truncate(limit as usize);
        runs.last().map(|r| encode_cursor(r.created_at, &r.run_id))
    } else {
        None
    };
    let mut headers = HeaderMap::new();
    if let Some(v) = next.as_deref().and_then(|n| HeaderValue::from_str(n).ok()) {
        headers.insert("x-next-cursor", v);
    }
    Ok((headers, axum::Json(RunPage { runs, next })).into_response())
}

fn parse_status(s: &str) -> ApiResult<RunStatus> {
    let parsed = RunStatus::parse(s);
    if parsed.as_str() == s {
        Ok(parsed)
    } else {
        Err(ApiError::validation(vec![problem(
            "enum",
            vec![json!("query"), json!("status")],
            format!(
                "status must be one of running, completed, failed, cancelled, timed_out, \
                 interrupted, abandoned; got {s:?}"
            ),
        )]))
    }
}

/// The position after a run in the listing: its creation time and id, opaque to clients.
pub fn encode_cursor(created_at: f64, run_id: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&json!([created_at, run_id])).unwrap_or_default())
}

pub fn decode_cursor(s: &str) -> ApiResult<(f64, String)> {
    use base64::Engine;
    let bad = || {
        ApiError::validation(vec![problem(
            "value_error",
            vec![json!("query"), json!("after")],
            "after must be the `next` cursor of a previous page",
        )])
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| bad())?;
    let (at, id): (f64, String) = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    Ok((at, id))
}

/// Cancels a running run on whichever replica executes it: 202 with the run, 404 if unknown,
/// 409 if it already ended. Optional body `{"reason": "…"}`; who asked and why are kept on
/// the run (the first request's).
#[utoipa::path(post, path = "/runs/{run_id}/cancel", tag = "runs",
    params(("run_id" = String, Path, description = "From `x-agentd-run-id`")),
    request_body(content = Option<CancelBody>, description = "Optional"),
    responses((status = 202, description = "Cancelling: the run as it was when asked.", body = RunRecord), Errors, CancelRunErrors))]
async fn cancel_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    crate::http::extract::Json(body): crate::http::extract::Json<CancelBody>,
) -> ApiResult<Response> {
    let req = cancel_request(&headers, body)?;
    let run = visible_run(&state, &caller, &run_id).await?;
    cancel_found(&state, run, &req).await
}

/// `POST /runs/{run_id}/cancel` for a run found with its user.
#[utoipa::path(post, path = "/apps/{app}/users/{user}/runs/{run_id}/cancel", tag = "runs",
    params(UserPath, ("run_id" = String, Path, description = "From `x-agentd-run-id`")),
    request_body(content = Option<CancelBody>, description = "Optional"),
    responses((status = 202, description = "Cancelling: the run as it was when asked.", body = RunRecord), Errors, CancelUserRunErrors))]
async fn cancel_user_run(
    state: axum::extract::State<AppState>,
    Path((app, user, run_id)): Path<(String, String, String)>,
    headers: HeaderMap,
    crate::http::extract::Json(body): crate::http::extract::Json<CancelBody>,
) -> ApiResult<Response> {
    let req = cancel_request(&headers, body)?;
    let run = user_run(&state, &app, &user, &run_id).await?;
    cancel_found(&state, run, &req).await
}

async fn cancel_found(
    state: &AppState,
    run: RunRecord,
    req: &CancelRequest,
) -> ApiResult<Response> {
    let record = state
        .runner
        .cancel(&run.user_id, &run.run_id, req)
        .await?
        .ok_or_else(run_not_found)?;
    // A retried cancel of a run that a cancel has already ended did what it asked: not an
    // error (the record says it ended cancelled).
    let cancelled = record.status == RunStatus::Cancelled && record.cancel_requested;
    if record.status != RunStatus::Running && !cancelled {
        return Err(ApiError::new(
            ErrorCode::RunNotActive,
            format!(
                "Run {} already ended ({}).",
                record.run_id,
                record.status.as_str()
            ),
        ));
    }
    Ok((StatusCode::ACCEPTED, axum::Json(record)).into_response())
}

/// Optional body of a cancel request.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelBody {
    /// Why (recorded on the run; at most 1,000 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Who asked: the request id (authenticated callers will be named here).
pub fn cancel_request(headers: &HeaderMap, body: CancelBody) -> ApiResult<CancelRequest> {
    let reason = body.reason;
    if reason.as_ref().is_some_and(|r| r.chars().count() > 1000) {
        return Err(ApiError::validation(vec![problem(
            "string_too_long",
            vec![json!("body"), json!("reason")],
            "at most 1000 characters",
        )]));
    }
    let by = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(|id| format!("request {id}"));
    Ok(CancelRequest { by, reason })
}
