//! ADK's dev-server trace routes, which the web UI calls for its Trace tab and for an event's
//! request and response: `GET /dev/apps/{app}/debug/trace/session/{session}` (the session's
//! spans) and `GET /dev/apps/{app}/debug/trace/{event}` (the span that made the event).
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
use crate::http::openapi::{error_set, Errors};
use crate::http::AppState;
use crate::telemetry::traces;
use axum::extract::State;
use axum::Json;
use serde_json::Value;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What reading a session's trace answers beyond the door's codes.
    SessionTraceErrors: AppNotFound
);

error_set!(
    /// What reading an event's trace answers beyond the door's codes.
    EventTraceErrors: AppNotFound, TraceNotFound
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(session_trace))
        .routes(routes!(event_trace))
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct SessionPath {
    /// The app's name.
    app: String,
    /// The session's id.
    session: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct EventPath {
    /// The app's name.
    app: String,
    /// The event's id.
    event: String,
}

/// The session's spans, in the order they ended (`[]` when none are kept).
#[utoipa::path(get, path = "/dev/apps/{app}/debug/trace/session/{session}", tag = "web-ui",
    params(SessionPath),
    responses((status = 200, description = "ADK's span list.", body = Vec<Object>), Errors, SessionTraceErrors))]
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
#[utoipa::path(get, path = "/dev/apps/{app}/debug/trace/{event}", tag = "web-ui",
    params(EventPath),
    responses((status = 200, description = "The span's attributes, as ADK answers them.", body = Object), Errors, EventTraceErrors))]
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
