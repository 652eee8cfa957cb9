//! A session's live side: `GET …/sessions/{id}/stream` follows it across runs (every
//! committed event as it lands, with `id: <seq>`, the live partial events of whatever run is
//! in progress, and `event: run_started` / `event: run_done` around each run), and
//! `POST …/sessions/{id}/cancel` stops its active run (a stop button that does not need the
//! run id).

use super::runs::{cancel_request, CancelBody};
use crate::error_code::ErrorCode;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::Path;
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, EventStream, SessionPath};
use crate::http::sse::follow::SessionFollower;
use crate::http::sse::resume::{beyond_end, resume_point, sse_body, AfterQuery};
use crate::http::AppState;
use crate::store::{RunRecord, RunStatus, SessionKey};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `GET /apps/{app}/users/{user}/sessions/{session}/stream` answers beyond the door's codes.
    SessionStreamErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, AfterBeyondEnd
);

error_set!(
    /// What `POST /apps/{app}/users/{user}/sessions/{session}/cancel` answers beyond the door's codes.
    CancelSessionErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, NoActiveRun
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(session_stream))
        .routes(routes!(cancel_session))
}

/// Follows a session across runs until the client leaves: every committed event as it lands
/// (`id: <seq>`), the running run's partial events, and `event: run_started` /
/// `event: run_done` around each run.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/sessions/{session}/stream", tag = "sessions",
    params(SessionPath, AfterQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "The last seq the client has")),
    responses((status = 200, description = "SSE frames; the stream does not end by itself.",
        content_type = "text/event-stream", body = EventStream), Errors, SessionStreamErrors))]
async fn session_stream(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
    headers: HeaderMap,
    query: axum::extract::Query<AfterQuery>,
) -> ApiResult<Response> {
    let after = resume_point(&headers, &query)?;
    let key = SessionKey::new(app, user, session);
    let sub = state.runner.bus().subscribe(&key);
    let head = state
        .store
        .session_head(&key)
        .await?
        .ok_or_else(ApiError::session_not_found)?;
    if let Some(a) = after {
        if a > head.last_seq {
            return Err(beyond_end(a, head.last_seq));
        }
    }
    let current = state
        .store
        .active_run(&key)
        .await?
        .filter(|r| r.status == RunStatus::Running)
        .map(|r| r.run_id);
    let rx = SessionFollower::spawn_frames(
        state.0.clone(),
        key,
        after.unwrap_or(head.last_seq),
        current,
        sub,
    );
    Ok(sse_body(rx, HeaderMap::new()))
}

/// Cancels the session's running run (a stop button that does not need the run id).
#[utoipa::path(post, path = "/apps/{app}/users/{user}/sessions/{session}/cancel", tag = "runs",
    params(SessionPath),
    request_body(content = Option<CancelBody>, description = "Optional"),
    responses((status = 202, description = "Cancelling: the run as it was when asked.", body = RunRecord), Errors, CancelSessionErrors))]
async fn cancel_session(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
    headers: HeaderMap,
    crate::http::extract::Json(body): crate::http::extract::Json<CancelBody>,
) -> ApiResult<Response> {
    let req = cancel_request(&headers, body)?;
    let key = SessionKey::new(app, user, session);
    if state.store.session_head(&key).await?.is_none() {
        return Err(ApiError::session_not_found());
    }
    match state.runner.cancel_session(&key, &req).await? {
        Some(run) if run.status == RunStatus::Running => {
            Ok((StatusCode::ACCEPTED, axum::Json(run)).into_response())
        }
        _ => Err(ApiError::new(
            ErrorCode::NoActiveRun,
            "The session has no running run.",
        )),
    }
}
