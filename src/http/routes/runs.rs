//! A run by its id, from any replica: `GET /runs/{id}`, `POST /runs/{id}/cancel`, and
//! `GET /runs/{id}/stream` (re-attach: the committed events after `Last-Event-ID` or
//! `?after=` replayed from the database, then live with exactly the frames `POST /run` sends;
//! a finished run: replay, then `done`).

use crate::auth::Caller;
use crate::http::error::{problem, ApiError, ApiResult};
use crate::http::extract::Path;
use crate::http::openapi::{Errors, EventStream};
use crate::http::sse::follow::RunFollower;
use crate::http::sse::resume::{beyond_end, resume_point, run_headers, sse_body, AfterQuery};
use crate::http::AppState;
use crate::store::{CancelRequest, RunRecord, RunStatus};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_run))
        .routes(routes!(cancel_run))
        .routes(routes!(run_stream))
}

/// Re-attaches to a run from any replica: the committed events after `Last-Event-ID` (or
/// `?after=`), then live, in `POST /run`'s frames, ending with `event: done`.
#[utoipa::path(get, path = "/runs/{run_id}/stream", tag = "runs",
    params(("run_id" = String, Path, description = "From `x-agentd-run-id`"), AfterQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "The last seq the client has")),
    responses((status = 200, description = "`POST /run`'s SSE frames, from the resume point.",
        content_type = "text/event-stream", body = EventStream), Errors))]
async fn run_stream(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    query: axum::extract::Query<AfterQuery>,
) -> ApiResult<Response> {
    let after = resume_point(&headers, &query)?;
    let run = visible_run(&state, &caller, &run_id).await?;
    // Follow before reading anything else: whatever happens from here on is heard.
    let sub = state.runner.bus().subscribe(&run.key());
    let Some(run) = state.runner.get_run(&run_id).await? else {
        return Err(ApiError::not_found("run_not_found", "Run not found"));
    };
    let head = state
        .store
        .session_head(&run.key())
        .await?
        .ok_or_else(|| ApiError::not_found("run_not_found", "The run's session was deleted"))?;
    if let Some(a) = after {
        if a > head.last_seq {
            return Err(beyond_end(a, head.last_seq));
        }
    }
    let extra = run_headers(&run);
    let rx = RunFollower::spawn_frames(state.0.clone(), run, after, sub);
    Ok(sse_body(rx, extra))
}

pub fn run_not_found() -> ApiError {
    ApiError::not_found("run_not_found", "Run not found")
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

/// A run: its status, owner, timing, seq range and cancel record.
#[utoipa::path(get, path = "/runs/{run_id}", tag = "runs",
    params(("run_id" = String, Path, description = "From `x-agentd-run-id`")),
    responses((status = 200, description = "The run.", body = RunRecord), Errors))]
async fn get_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> ApiResult<axum::Json<RunRecord>> {
    visible_run(&state, &caller, &run_id).await.map(axum::Json)
}

/// Cancels a running run on whichever replica executes it: 202 with the run, 404 if unknown,
/// 409 if it already ended. Optional body `{"reason": "…"}`; who asked and why are kept on
/// the run (the first request's).
#[utoipa::path(post, path = "/runs/{run_id}/cancel", tag = "runs",
    params(("run_id" = String, Path, description = "From `x-agentd-run-id`")),
    request_body(content = Option<CancelBody>, description = "Optional"),
    responses((status = 202, description = "Cancelling: the run as it was when asked.", body = RunRecord), Errors))]
async fn cancel_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    crate::http::extract::Json(body): crate::http::extract::Json<CancelBody>,
) -> ApiResult<Response> {
    let req = cancel_request(&headers, body)?;
    visible_run(&state, &caller, &run_id).await?;
    let record = state
        .runner
        .cancel(&run_id, &req)
        .await?
        .ok_or_else(run_not_found)?;
    if record.status != RunStatus::Running {
        return Err(ApiError::conflict(
            "run_not_active",
            format!("Run {run_id} already ended ({}).", record.status.as_str()),
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
