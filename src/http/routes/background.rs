//! Runs without a client: `POST …/sessions/{id}/runs` and `"background": true` on `/run`
//! and `/run_sse` admit a run exactly as `/run` does and answer 202 with it; the run goes on
//! alone and is followed through `/runs/{id}` (see `docs/background.md`).

use super::run_request::{open_run, Opening, RunAgentRequest};
use crate::auth::Caller;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{JsonBody, Path};
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, SessionPath};
use crate::http::sse::run_headers;
use crate::http::AppState;
use crate::store::RunRecord;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `POST /apps/{app}/users/{user}/sessions/{session}/runs` answers beyond the door's codes.
    StartBackgroundRunErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, AppStateForbidden, EditAmbiguous, WebhookUrlInvalid, WebhookUrlRefused, WebhookEventUnknown, WebhookSecretRequired, WebhookSecretInvalid, InvalidIdempotencyKey, IdempotencyKeyReused, IdempotencyKeyInProgress, RunNotFound, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout, NewMessageRequired, InvocationNotFound, TurnNotFound, ArtifactTooLarge
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(start_background_run))
}

/// A run started without a client, as `POST …/sessions/{id}/runs` and `"background": true`
/// answer it (202).
#[derive(Debug, Serialize, ToSchema)]
pub struct BackgroundRun {
    #[serde(flatten)]
    run: RunRecord,
    links: RunLinks,
}

/// Where to follow a background run (any replica).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunLinks {
    /// `GET`: the run (`?wait=N` long-polls for its end).
    #[serde(rename = "self")]
    this: String,
    /// `POST`: wait for its end.
    wait: String,
    /// `GET`: its events, replayed then live (`/run`'s frames).
    stream: String,
    /// `POST`: cancel it.
    cancel: String,
}

/// A path segment: everything but RFC 3986's unreserved characters is escaped.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Admits the run exactly as `/run` does (same body, same errors before anything starts,
/// `onBusy`, `Idempotency-Key`), then answers 202 with the run and lets it go on alone.
pub(crate) async fn background(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    req: RunAgentRequest,
    route: &str,
    raw: &[u8],
) -> ApiResult<Response> {
    let (user, run_id, replayed) =
        match open_run(state, caller, headers, req, raw, (route, true)).await? {
            Opening::Repeat { user, run_id } => (user, run_id, true),
            // Dropping the items leaves the run without a reader; it goes on by itself.
            Opening::Started { key, started } => (key.user_id, started?.run_id, false),
        };
    let run = state
        .runner
        .get_user_run(&user, &run_id)
        .await?
        .ok_or_else(super::runs::run_not_found)?;
    // The routes under the run's user: found with the user, one shard on Citus.
    let this = format!(
        "/apps/{}/users/{}/runs/{}",
        utf8_percent_encode(&run.app_name, SEGMENT),
        utf8_percent_encode(&run.user_id, SEGMENT),
        utf8_percent_encode(&run_id, SEGMENT)
    );
    let links = RunLinks {
        wait: format!("{this}/wait"),
        stream: format!("{this}/stream"),
        cancel: format!("{this}/cancel"),
        this,
    };
    // The run's ids as `/run` sends them, and where it is.
    let mut resp_headers = run_headers(&run.run_id, &run.invocation_id, None);
    if let Ok(v) = HeaderValue::from_str(&links.this) {
        resp_headers.insert(header::LOCATION, v);
    }
    if replayed {
        resp_headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok((
        StatusCode::ACCEPTED,
        resp_headers,
        axum::Json(BackgroundRun { run, links }),
    )
        .into_response())
}

/// Starts a run on the session without a client (a background run): admitted exactly as
/// `POST /run` (same body; `appName`, `userId` and `sessionId` come from the path and, if the
/// body names them too, must match), answered 202 with the run and where to follow it.
#[utoipa::path(post, path = "/apps/{app}/users/{user}/sessions/{session}/runs", tag = "runs",
    params(SessionPath,
        ("Idempotency-Key" = Option<String>, Header,
        description = "A repeat with this key and the same body answers the first run")),
    request_body = RunAgentRequest,
    responses((status = 202, description = "Admitted; the run goes on without a client.",
        body = BackgroundRun), Errors, StartBackgroundRunErrors))]
async fn start_background_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, user, session)): Path<(String, String, String)>,
    headers: HeaderMap,
    JsonBody(body, raw): JsonBody<serde_json::Value>,
) -> ApiResult<Response> {
    let serde_json::Value::Object(mut body) = body else {
        return Err(ApiError::validation(vec![crate::http::error::problem(
            "model_attributes_type",
            vec!["body".into()],
            "the body must be a JSON object (a run request)",
        )]));
    };
    for (field, alias, value) in [
        ("appName", "app_name", &app),
        ("userId", "user_id", &user),
        ("sessionId", "session_id", &session),
    ] {
        for name in [field, alias] {
            match body.get(name) {
                Some(serde_json::Value::String(v)) if v == value => {}
                None => {}
                Some(_) => {
                    return Err(ApiError::validation(vec![crate::http::error::problem(
                        "value_error",
                        vec!["body".into(), name.into()],
                        format!("{name} must be absent or {value:?} (the path names the session)"),
                    )]))
                }
            }
            body.remove(name);
        }
        body.insert(field.into(), serde_json::Value::String(value.clone()));
    }
    let req: RunAgentRequest =
        crate::http::extract::parse_json(&serde_json::to_vec(&body).unwrap_or_default())?;
    // The session is in the path, not the body: it is part of what a key's request was.
    let route = format!("/sessions/{session}/runs");
    background(&state, &caller, &headers, req, &route, &raw).await
}
