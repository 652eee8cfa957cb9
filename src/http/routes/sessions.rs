//! Session routes: ADK's create/get/list/delete/PATCH, the deprecated create-by-path, and
//! agentd's paginated `GET …/sessions/{id}/events`.

use crate::error_code::ErrorCode;
use crate::event::{Event, JsonMap, Session};
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{validate_id, Json, JsonBody, Path, Query};
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, SessionPath, UserPath};
use crate::http::AppState;
use crate::store::{EventRange, NewSession, SessionCursor, SessionKey};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `POST /apps/{app}/users/{user}/sessions` answers beyond the door's codes.
    CreateSessionErrors: AppNotFound, NotFound, InvalidId, ValidationError, AppStateForbidden, OptionsUnsupported, InvalidInitialEvent, TooManyParts, SessionExists, InvalidIdempotencyKey, IdempotencyKeyReused, IdempotencyKeyInProgress
);

error_set!(
    /// What `POST /apps/{app}/users/{user}/sessions/{session}` answers beyond the door's codes.
    CreateSessionByPathErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, AppStateForbidden, SessionExists
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/sessions/{session}` answers beyond the door's codes.
    GetSessionErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, SessionChanged
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/sessions` answers beyond the door's codes.
    ListSessionsErrors: AppNotFound, NotFound, InvalidId, ValidationError
);

error_set!(
    /// What `DELETE /apps/{app}/users/{user}/sessions/{session}` answers beyond the door's codes.
    DeleteSessionErrors: AppNotFound, SessionNotFound, InvalidId
);

error_set!(
    /// What `PATCH /apps/{app}/users/{user}/sessions/{session}` answers beyond the door's codes.
    PatchSessionErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError, AppStateForbidden, SessionChanged
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/sessions/{session}/events` answers beyond the door's codes.
    ListEventsErrors: AppNotFound, SessionNotFound, InvalidId, ValidationError
);

/// Default and largest page sizes.
pub const DEFAULT_SESSION_PAGE: u32 = 1000;
pub const DEFAULT_EVENT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 1000;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_sessions, create_session))
        .routes(routes!(
            get_session,
            create_session_by_path,
            delete_session,
            patch_session
        ))
        .routes(routes!(list_events))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct CreateSessionRequest {
    /// The new session's id (default: a generated UUID).
    #[serde(default, alias = "session_id")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    session_id: Option<String>,
    /// The initial state (`app:`/`user:` keys go to the shared scopes).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    state: Option<JsonMap>,
    /// Events to restore, oldest first (no actions, no partials, no ADK-internal calls).
    #[serde(default)]
    events: Option<Vec<Event>>,
    /// Not supported: must be absent or empty.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    options: Option<JsonMap>,
}

/// Events one create-session request may import (they are written in one transaction).
const MAX_IMPORTED_EVENTS: usize = 10_000;

fn validate_restored_events(events: &[Event]) -> ApiResult<()> {
    if events.len() > MAX_IMPORTED_EVENTS {
        return Err(ApiError::new(
            ErrorCode::InvalidInitialEvent,
            format!(
                "A session is created with at most {MAX_IMPORTED_EVENTS} events; this one has {}.",
                events.len()
            ),
        ));
    }
    for (i, e) in events.iter().enumerate() {
        if !e.actions.is_default() {
            return Err(ApiError::new(
                ErrorCode::InvalidInitialEvent,
                format!("Session initialization event {i} cannot include event actions."),
            ));
        }
        if e.long_running_tool_ids
            .as_ref()
            .is_some_and(|ids| !ids.is_empty())
        {
            return Err(ApiError::new(
                ErrorCode::InvalidInitialEvent,
                format!("Session initialization event {i} cannot include long running tool ids."),
            ));
        }
        let internal = e
            .function_calls()
            .map(|c| c.name.as_str())
            .chain(e.function_responses().map(|r| r.name.as_str()))
            .find(|n| crate::event::INTERNAL_FUNCTIONS.contains(n));
        if let Some(name) = internal {
            return Err(ApiError::new(
                ErrorCode::InvalidInitialEvent,
                format!(
                    "Session initialization event {i} cannot include internal function {name}."
                ),
            ));
        }
        if e.is_partial() {
            return Err(ApiError::new(
                ErrorCode::InvalidInitialEvent,
                format!("Session initialization event {i} cannot be partial."),
            ));
        }
        let reserved = crate::agent::remote_a2a::METADATA_PREFIX;
        if let Some(k) = e
            .custom_metadata
            .iter()
            .flat_map(|m| m.keys())
            .find(|k| k.starts_with(reserved))
        {
            return Err(ApiError::new(
                ErrorCode::InvalidInitialEvent,
                format!(
                    "Session initialization event {i} cannot include agentd's {k} metadata \
                     (keys starting {reserved} are written by its remote A2A agents)."
                ),
            ));
        }
    }
    Ok(())
}

/// ADK's create, plus `Idempotency-Key`: a repeat with the same key and body answers the first
/// response (the same session), whether or not it named the session id.
#[utoipa::path(post, path = "/apps/{app}/users/{user}/sessions", tag = "sessions",
    params(UserPath, ("Idempotency-Key" = Option<String>, Header,
        description = "A repeat with this key and the same body answers the first response")),
    request_body = CreateSessionRequest,
    responses((status = 200, description = "The new session.", body = Session), Errors, CreateSessionErrors))]
async fn create_session(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path((app, user)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    JsonBody(req, raw): JsonBody<CreateSessionRequest>,
) -> ApiResult<axum::response::Response> {
    use crate::http::idempotency::{claim_response, record_response, Claimed};
    use axum::response::IntoResponse;
    let initial_keys = req.state.iter().flat_map(|m| m.keys());
    let event_keys = req
        .events
        .iter()
        .flatten()
        .flat_map(|e| e.actions.state_delta.keys());
    crate::http::auth::check_app_state(&state.gate, &caller, initial_keys.chain(event_keys))?;
    let route = format!("/apps/{app}/users/{user}/sessions");
    let keyed = match claim_response(&state, &headers, &app, &user, &route, &raw).await? {
        Claimed::Replay(answer) => return Ok(answer),
        Claimed::New(keyed) => keyed,
    };
    let created = create_session_inner(&state, app, user, req).await;
    if let Some(k) = &keyed {
        record_response(&state, k, &created).await;
    }
    created.map(|s| axum::Json(s).into_response())
}

async fn create_session_inner(
    state: &AppState,
    app: String,
    user: String,
    req: CreateSessionRequest,
) -> ApiResult<Session> {
    if req.options.as_ref().is_some_and(|o| !o.is_empty()) {
        return Err(ApiError::new(
            ErrorCode::OptionsUnsupported,
            "Session options are not supported by the configured session service.",
        ));
    }
    if let Some(id) = &req.session_id {
        validate_id("sessionId", id)?;
    }
    let events = req.events.unwrap_or_default();
    validate_restored_events(&events)?;
    create(
        state,
        app,
        user,
        req.session_id,
        req.state.unwrap_or_default(),
        events,
    )
    .await
    .map(|axum::Json(s)| s)
}

/// Deprecated ADK route: the body is the bare initial state (or nothing).
#[utoipa::path(post, path = "/apps/{app}/users/{user}/sessions/{session}", tag = "sessions",
    params(SessionPath),
    request_body(content = Option<Object>, description = "The initial state, or `null`"),
    responses((status = 200, description = "The new session.", body = Session), Errors, CreateSessionByPathErrors))]
async fn create_session_by_path(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path((app, user, session)): Path<(String, String, String)>,
    Json(initial): Json<Option<JsonMap>>,
) -> ApiResult<axum::Json<Session>> {
    crate::http::auth::check_app_state(
        &state.gate,
        &caller,
        initial.iter().flat_map(|m| m.keys()),
    )?;
    validate_id("session id", &session)?;
    create(
        &state,
        app,
        user,
        Some(session),
        initial.unwrap_or_default(),
        vec![],
    )
    .await
}

async fn create(
    state: &AppState,
    app: String,
    user: String,
    session_id: Option<String>,
    initial: JsonMap,
    events: Vec<Event>,
) -> ApiResult<axum::Json<Session>> {
    validate_id("app name", &app)?;
    validate_id("user id", &user)?;
    let session = state
        .store
        .create_session(NewSession {
            app_name: app,
            user_id: user,
            session_id,
            state: initial,
            events,
        })
        .await?;
    tracing::info!(app = %session.app_name, user = %session.user_id, session = %session.id, "session created");
    Ok(axum::Json(session))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct GetSessionQuery {
    /// Only the newest N events (agentd addition; ADK returns them all). At most 1000
    /// ([`MAX_PAGE`]); a larger value reads 1000. Without it the whole session is streamed page
    /// by page.
    limit: Option<u32>,
    /// agentd: `false` leaves out the events a rewind annulled, and the rewind events (the
    /// conversation as it is now; a compaction's summarised events stay). Default `true`:
    /// every event, as ADK answers.
    #[serde(default, rename = "includeRewound", alias = "include_rewound")]
    include_rewound: Option<bool>,
}

/// A session with its state and events (all of them, or the newest `limit`).
#[utoipa::path(get, path = "/apps/{app}/users/{user}/sessions/{session}", tag = "sessions",
    params(SessionPath, GetSessionQuery),
    responses((status = 200, description = "The session.", body = Session), Errors, GetSessionErrors))]
async fn get_session(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
    Query(q): Query<GetSessionQuery>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let key = SessionKey::new(app, user, session);
    let include_rewound = q.include_rewound.unwrap_or(true);
    match q.limit {
        // The whole session: streamed page by page (it may hold 100,000 events).
        None => {
            super::session_body::session_body(&state, key, JsonMap::new(), include_rewound).await
        }
        Some(n) if !include_rewound => {
            let head = state
                .store
                .session_head(&key)
                .await?
                .ok_or_else(ApiError::session_not_found)?;
            let page = state
                .store
                .list_events(
                    &key,
                    crate::store::EventRange {
                        after: None,
                        before: Some(head.last_seq + 1),
                        limit: n.min(MAX_PAGE),
                    },
                )
                .await?
                .ok_or_else(ApiError::session_not_found)?;
            let rewound = state.store.rewound(&key, head.last_seq).await?;
            let events = page
                .events
                .into_iter()
                .filter(|e| !rewound.hides(e.seq))
                .map(|e| e.event)
                .collect();
            Ok(axum::Json(head.into_session(events)).into_response())
        }
        // Read in one piece, so bounded: a huge `limit` must not load a huge session at once.
        Some(n) => state
            .store
            .get_session(&key, Some(n.min(MAX_PAGE)))
            .await?
            .map(|s| axum::Json(s).into_response())
            .ok_or_else(ApiError::session_not_found),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListSessionsQuery {
    /// Sessions per page (default 1000, at most 1000).
    limit: Option<u32>,
    /// The `x-next-cursor` of the previous page.
    cursor: Option<String>,
}

/// ADK's bare array, oldest update first. When more sessions exist than fit the page, the
/// response carries `x-next-cursor` (pass it back as `?cursor=`) and a `Link: rel="next"`.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/sessions", tag = "sessions",
    params(UserPath, ListSessionsQuery),
    responses((status = 200, description = "The user's sessions, without their events.",
        body = Vec<Session>,
        headers(("x-next-cursor" = String, description = "Present when there is a next page"))), Errors, ListSessionsErrors))]
async fn list_sessions(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
    Query(q): Query<ListSessionsQuery>,
) -> ApiResult<impl IntoResponse> {
    let limit = page_size(q.limit, DEFAULT_SESSION_PAGE)?;
    let after = q.cursor.as_deref().map(decode_cursor).transpose()?;
    let page = state
        .store
        .list_sessions(&app, &user, after.as_ref(), limit)
        .await?;
    let mut headers = HeaderMap::new();
    if let Some(next) = page.next {
        let cursor = encode_cursor(&next);
        if let Ok(v) = HeaderValue::from_str(&cursor) {
            headers.insert("x-next-cursor", v);
        }
        let link = format!("<?limit={limit}&cursor={cursor}>; rel=\"next\"");
        if let Ok(v) = HeaderValue::from_str(&link) {
            headers.insert(axum::http::header::LINK, v);
        }
    }
    Ok((headers, axum::Json(page.sessions)))
}

fn page_size(limit: Option<u32>, default: u32) -> ApiResult<u32> {
    match limit {
        None => Ok(default),
        Some(0) => Err(ApiError::validation(vec![crate::http::error::problem(
            "greater_than_equal",
            vec![json!("query"), json!("limit")],
            "limit must be at least 1",
        )])),
        Some(n) => Ok(n.min(MAX_PAGE)),
    }
}

/// The cursor carries the update time as its exact bits: a float written as JSON text may
/// parse back one ulp off, which would repeat or skip a session at a page boundary.
fn encode_cursor(c: &SessionCursor) -> String {
    use base64::Engine;
    let raw = format!("{:016x}{}", c.update_time.to_bits(), c.id);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_cursor(s: &str) -> ApiResult<SessionCursor> {
    crate::event::decode_base64_any(s)
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|raw| {
            let (bits, id) = raw.split_at_checked(16)?;
            Some(SessionCursor {
                update_time: f64::from_bits(u64::from_str_radix(bits, 16).ok()?),
                id: id.to_string(),
            })
        })
        .ok_or_else(|| {
            ApiError::validation(vec![crate::http::error::problem(
                "value_error",
                vec![json!("query"), json!("cursor")],
                "cursor is not one this server issued",
            )])
        })
}

/// ADK answers 200 `null` whether or not the session existed.
#[utoipa::path(delete, path = "/apps/{app}/users/{user}/sessions/{session}", tag = "sessions",
    params(SessionPath),
    responses((status = 200, description = "Deleted (or there was nothing to delete): `null`.", body = Value), Errors, DeleteSessionErrors))]
async fn delete_session(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Value>> {
    let key = SessionKey::new(app, user, session);
    if state.store.delete_session(&key).await? {
        tracing::info!(app = %key.app_name, user = %key.user_id, session = %key.session_id, "session deleted");
    }
    Ok(axum::Json(Value::Null))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct UpdateSessionRequest {
    #[serde(alias = "state_delta")]
    #[schema(value_type = Object)]
    state_delta: JsonMap,
}

/// Applies a state delta by appending a synthetic user event (`p-<uuid>` invocation), so
/// the change is in the transcript and serializes with runs on the same append path.
#[utoipa::path(patch, path = "/apps/{app}/users/{user}/sessions/{session}", tag = "sessions",
    params(SessionPath), request_body = UpdateSessionRequest,
    responses((status = 200, description = "The updated session.", body = Session), Errors, PatchSessionErrors))]
async fn patch_session(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path((app, user, session)): Path<(String, String, String)>,
    Json(req): Json<UpdateSessionRequest>,
) -> ApiResult<axum::response::Response> {
    crate::http::auth::check_app_state(&state.gate, &caller, req.state_delta.keys())?;
    let key = SessionKey::new(app, user, session);
    let mut event = Event::new(format!("p-{}", uuid::Uuid::new_v4()), "user");
    event.actions.state_delta = req.state_delta.clone();
    state.store.append_event(&key, event, vec![]).await?;
    // ADK echoes `temp:` keys in this one response (they live in the in-memory session).
    let temp: JsonMap = req
        .state_delta
        .into_iter()
        .filter(|(k, _)| k.starts_with(crate::event::TEMP_PREFIX))
        .collect();
    super::session_body::session_response(&state, key, temp).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListEventsQuery {
    /// Events per page (default 100, at most 1000).
    limit: Option<u32>,
    /// Events with `seq` greater than this, oldest first.
    after: Option<i64>,
    /// The newest events with `seq` less than this (returned oldest first).
    before: Option<i64>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct EventPageBody {
    /// Events, oldest first, each with its `seq`.
    #[schema(value_type = Vec<Event>)]
    events: Vec<Value>,
    has_more: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_before: Option<i64>,
}

/// agentd addition: a page of a session's events, each with its `seq`.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/sessions/{session}/events", tag = "sessions",
    params(SessionPath, ListEventsQuery),
    responses((status = 200, description = "A page of events.", body = EventPageBody), Errors, ListEventsErrors))]
async fn list_events(
    state: axum::extract::State<AppState>,
    Path((app, user, session)): Path<(String, String, String)>,
    Query(q): Query<ListEventsQuery>,
) -> ApiResult<axum::Json<EventPageBody>> {
    let key = SessionKey::new(app, user, session);
    let limit = page_size(q.limit, DEFAULT_EVENT_PAGE)?;
    let page = state
        .store
        .list_events(
            &key,
            EventRange {
                after: q.after,
                before: q.before,
                limit,
            },
        )
        .await?
        .ok_or_else(ApiError::session_not_found)?;
    let backward = q.before.is_some();
    let first = page.events.first().map(|e| e.seq);
    let last = page.events.last().map(|e| e.seq);
    let events = page
        .events
        .into_iter()
        .map(|s| {
            let mut v = serde_json::to_value(&s.event).map_err(ApiError::internal)?;
            if let Some(obj) = v.as_object_mut() {
                obj.insert("seq".into(), json!(s.seq));
            }
            Ok(v)
        })
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(axum::Json(EventPageBody {
        events,
        has_more: page.has_more,
        next_after: (!backward && page.has_more).then_some(last).flatten(),
        next_before: (backward && page.has_more).then_some(first).flatten(),
    }))
}
