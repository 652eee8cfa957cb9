//! ADK's dev-server trace routes, which the web UI calls for its Trace tab and for an event's
//! request and response: `GET /dev/apps/{app}/debug/trace/session/{session}` (the session's
//! spans) and `GET /dev/apps/{app}/debug/trace/{event_id}` (the span that made the event).
//!
//! They answer from the spans this replica keeps ([`crate::telemetry::traces`], on with
//! `--web-ui-dir` or `--trace-spans`): a session run elsewhere, or whose spans are gone, has
//! an empty trace, as in ADK. A caller sees the spans of the users it may act as, in the apps
//! it may use.

use super::map;
use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::http::auth::served_app;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::Path;
use crate::http::AppState;
use crate::telemetry::traces;
use axum::extract::State;
use axum::routing::get;
use axum::Json;
use serde_json::Value;

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route(
            "/dev/apps/{app}/debug/trace/session/{session}",
            get(session_trace),
        )
        .route("/dev/apps/{app}/debug/trace/{event}", get(event_trace))
}

/// The session's spans, in the order they ended (`[]` when none are kept).
async fn session_trace(
    State(state): State<AppState>,
    caller: Caller,
    Path((app, session)): Path<(String, String)>,
) -> ApiResult<Json<Vec<Value>>> {
    served_app(&state, &caller, &app)?;
    let Some(kept) = traces::kept() else {
        return Ok(Json(Vec::new()));
    };
    let spans = kept
        .spans(|s| s.run.app == app && s.run.session == session && caller.may_act_as(&s.run.user));
    Ok(Json(spans.iter().map(|s| map::web_ui_span(s)).collect()))
}

/// The attributes of the model call or tool call that made the event.
async fn event_trace(
    State(state): State<AppState>,
    caller: Caller,
    Path((app, event)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    served_app(&state, &caller, &app)?;
    let found = traces::kept().and_then(|kept| {
        kept.spans(|s| {
            map::made_event(s) == Some(event.as_str())
                && s.run.app == app
                && caller.may_act_as(&s.run.user)
        })
        .pop()
    });
    match found {
        Some(span) => Ok(Json(map::event_trace(&span))),
        None => Err(ApiError::new(ErrorCode::TraceNotFound, "Trace not found")),
    }
}
