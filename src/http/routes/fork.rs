//! `POST /apps/{app}/users/{user}/sessions/{session}/fork`: a new session from a point of
//! this one (see `docs/editing.md`). The source is unchanged.

use crate::error_code::ErrorCode;
use crate::event::JsonMap;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{validate_id, JsonBody, Path};
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, SessionPath};
use crate::http::AppState;
use crate::runner::{ForkPoint, RewindError, RunError};
use crate::store::{SessionKey, StoreError};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `POST /apps/{app}/users/{user}/sessions/{session}/fork` answers beyond the door's codes.
    ForkSessionErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, ForkPointAmbiguous, SeqOutOfRange, InvocationNotFound, SessionExists
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(fork_session))
}

/// Where to fork, and the new session.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkBody {
    /// Fork before this invocation's first event (its turn and what follows are left out).
    #[serde(default, alias = "before_invocation_id")]
    before_invocation_id: Option<String>,
    /// Or fork with the events up to and including this seq. Neither: the whole session.
    #[serde(default, alias = "at_seq")]
    at_seq: Option<i64>,
    /// The new session's id (default: a new uuid).
    #[serde(default, alias = "session_id")]
    session_id: Option<String>,
    /// Merged over the state as of the point.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    state: Option<JsonMap>,
}

/// The new session.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Forked {
    id: String,
    app_name: String,
    user_id: String,
    /// Its newest event's seq (the number of events copied).
    last_seq: i64,
    forked_from: ForkedFrom,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    session_id: String,
    /// The source's events up to this seq were copied.
    seq: i64,
}

/// Forks the session: a new session (201) with its events up to a point, the state as of then
/// (merged with `state`) and its artifacts' versions as of then. The copy is made by the
/// database in one transaction.
#[utoipa::path(post, path = "/apps/{app}/users/{user}/sessions/{session}/fork", tag = "sessions",
    params(SessionPath), request_body = ForkBody,
    responses((status = 201, description = "The new session.", body = Forked), Errors, ForkSessionErrors))]
async fn fork_session(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
    JsonBody(body, _): JsonBody<ForkBody>,
) -> ApiResult<Response> {
    let point = match (body.before_invocation_id, body.at_seq) {
        (Some(_), Some(_)) => {
            return Err(ApiError::new(
                ErrorCode::ForkPointAmbiguous,
                "give beforeInvocationId or atSeq, not both",
            ))
        }
        (Some(inv), None) => ForkPoint::BeforeInvocation(inv),
        (None, Some(seq)) => ForkPoint::AtSeq(seq),
        (None, None) => ForkPoint::End,
    };
    let new_id = body
        .session_id
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    validate_id("sessionId", &new_id)?;
    let key = SessionKey::new(&app, &user, &session);
    let last_seq = match state.runner.fork(&key, &new_id, point, body.state).await {
        Ok(n) => n,
        Err(e @ RewindError::SeqOutOfRange(..)) => {
            return Err(ApiError::new(ErrorCode::SeqOutOfRange, e.to_string()))
        }
        Err(RewindError::Run(RunError::Store(StoreError::SessionExists(id)))) => {
            return Err(ApiError::new(
                ErrorCode::SessionExists,
                format!("Session already exists: {id}"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    Ok((
        StatusCode::CREATED,
        axum::Json(Forked {
            id: new_id,
            app_name: app,
            user_id: user,
            last_seq,
            forked_from: ForkedFrom {
                session_id: session,
                seq: last_seq,
            },
        }),
    )
        .into_response())
}
