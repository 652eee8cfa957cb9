//! `POST /apps/{app}/users/{user}/sessions/{session}/rewind`: ADK's rewind as a route. The
//! session keeps every event; one more event annuls the turns from the named invocation on
//! and restores state and artifacts (see `docs/editing.md`).

use crate::http::error::ApiResult;
use crate::http::extract::{JsonBody, Path};
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, SessionPath};
use crate::http::AppState;
use crate::runner::OnBusy;
use crate::store::SessionKey;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `POST /apps/{app}/users/{user}/sessions/{session}/rewind` answers beyond the door's codes.
    RewindSessionErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, InvocationNotFound, ShuttingDown, SessionBusy, SessionBusyTimeout, RunCancelled
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(rewind_session))
}

/// Where to rewind to.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RewindBody {
    /// The invocation whose first event the session goes back to before (`e-…`).
    #[serde(
        alias = "rewind_before_invocation_id",
        alias = "rewindBeforeInvocationId"
    )]
    before_invocation_id: String,
    /// As for runs: `reject` (default, 409), `enqueue` (wait for the run holding the session,
    /// up to the enqueue timeout) or `interrupt` (cancel it, then rewind).
    #[serde(default, alias = "on_busy")]
    on_busy: OnBusy,
}

/// The rewind event, as stored.
#[derive(Debug, Serialize, ToSchema)]
pub struct Rewound {
    /// Its seq in the session.
    seq: i64,
    #[schema(value_type = Object)]
    event: crate::event::Event,
}

/// Rewinds the session to before an invocation (ADK's `Runner.rewind_async`): appends one
/// event with `actions.rewindBeforeInvocationId`, the state delta that restores the session's
/// plain state, and new artifact versions that restore each session artifact as of that point.
/// A session a run holds answers 409 `session_busy`, or is waited for (`onBusy: enqueue`) or
/// interrupted (`onBusy: interrupt`).
#[utoipa::path(post, path = "/apps/{app}/users/{user}/sessions/{session}/rewind", tag = "sessions",
    params(SessionPath), request_body = RewindBody,
    responses((status = 200, description = "The rewind event.", body = Rewound), Errors, RewindSessionErrors))]
async fn rewind_session(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
    JsonBody(body, _): JsonBody<RewindBody>,
) -> ApiResult<axum::Json<Rewound>> {
    let key = SessionKey::new(app, user, session);
    match state
        .runner
        .rewind(&key, &body.before_invocation_id, body.on_busy)
        .await
    {
        Ok(stored) => Ok(axum::Json(Rewound {
            seq: stored.seq,
            event: stored.event,
        })),
        Err(e) => Err(e.into()),
    }
}
