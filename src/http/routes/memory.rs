//! Memory: ADK's `PATCH …/memory` (add a session) and agentd's search (by words, and by
//! meaning for apps with an embedding model: [`crate::memory`]), a fact added directly, and
//! one memory read or deleted by id.

use crate::error_code::ErrorCode;
use crate::http::error::{problem, ApiError, ApiResult};
use crate::http::extract::{Json, Path, Query};
use crate::http::openapi::error_set;
use crate::http::openapi::Errors;
use crate::http::AppState;
use crate::store::memory::changes::MemoryRevision;
use crate::store::memory::fusion::MemoryHit;
use crate::store::memory::{fact_entry, MAX_MEMORY_TEXT_BYTES};
use crate::store::{MemoryEntry, SessionKey};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `PATCH /apps/{app}/users/{user}/memory` answers beyond the door's codes.
    UpdateMemoryErrors: AppNotFound, NotFound, InvalidId, ValidationError, SessionNotFound,
        MemoryExtractionFailed, BudgetExhausted
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/memory` answers beyond the door's codes.
    SearchMemoryErrors: AppNotFound, NotFound, InvalidId, ValidationError
);

error_set!(
    /// What `POST /apps/{app}/users/{user}/memory` answers beyond the door's codes.
    AddMemoryErrors: AppNotFound, NotFound, InvalidId, ValidationError
);

error_set!(
    /// What `GET` and `DELETE /apps/{app}/users/{user}/memory/{id}` answer beyond the door's
    /// codes.
    MemoryIdErrors: AppNotFound, NotFound, InvalidId, MemoryNotFound
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(
            update_memory,
            search_memory,
            add_memory,
            forget_user
        ))
        .routes(routes!(get_memory, delete_memory))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct UpdateMemoryRequest {
    #[serde(alias = "session_id")]
    session_id: String,
}

/// ADK: adds the session's events to the memory service (idempotent). 200 `null`, or 404
/// when the session does not exist. Like ADK's session routes, the app is not checked. For an
/// app with `memory: {mode: extract}` the facts its extraction model finds are stored
/// instead (502 `memory_extraction_failed`, nothing stored, when the model fails; 429
/// `budget_exhausted`, no call made, when the user's or the app's budget is spent).
#[utoipa::path(patch, path = "/apps/{app}/users/{user}/memory", tag = "memory",
    params(crate::http::openapi::UserPath),
    request_body = UpdateMemoryRequest,
    responses((status = 200, description = "Added: `null`.", body = Value), Errors, UpdateMemoryErrors))]
async fn update_memory(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
    Json(req): Json<UpdateMemoryRequest>,
) -> ApiResult<axum::Json<Value>> {
    let memory = state
        .apps
        .get(&app)
        .map(|a| a.memory.clone())
        .unwrap_or_default();
    let key = SessionKey::new(app, user, req.session_id);
    crate::memory::add_session(
        state.store.as_ref(),
        memory.embedder.as_deref(),
        memory.extraction.as_deref(),
        state.runner.prices(),
        &key,
    )
    .await?;
    Ok(axum::Json(Value::Null))
}

/// Default and largest `limit` of a memory search.
pub const DEFAULT_MEMORY_RESULTS: u32 = 10;
pub const MAX_MEMORY_RESULTS: u32 = 100;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SearchMemoryQuery {
    /// Words; a memory matching any of them is found.
    #[serde(default)]
    query: String,
    /// At most this many (default 10, at most 100).
    #[serde(default)]
    limit: Option<u32>,
}

#[derive(Debug, serde::Serialize, ToSchema)]
struct SearchMemoryResponse {
    memories: Vec<MemoryHit>,
}

/// agentd: `GET …/memory?query=…&limit=…`, the user's memories best first (`limit` default
/// 10, at most 100): those matching any word of `query`, and for an app with an embedding
/// model also those nearest in meaning, the two rankings fused. Each says how it was found
/// (`textRank`, `vectorRank`, `similarity`) and its fused `score`. A blank query finds
/// nothing.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/memory", tag = "memory",
    params(crate::http::openapi::UserPath, SearchMemoryQuery),
    responses((status = 200, description = "The matching memories, best first.", body = SearchMemoryResponse), Errors, SearchMemoryErrors))]
async fn search_memory(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
    Query(q): Query<SearchMemoryQuery>,
) -> ApiResult<axum::Json<SearchMemoryResponse>> {
    let limit = q
        .limit
        .unwrap_or(DEFAULT_MEMORY_RESULTS)
        .min(MAX_MEMORY_RESULTS);
    let embedder = state.apps.get(&app).and_then(|a| a.memory.embedder.clone());
    let memories = crate::memory::search(
        state.store.as_ref(),
        embedder.as_deref(),
        crate::memory::charge::Charge::User(state.runner.prices()),
        &app,
        &user,
        &q.query,
        limit as usize,
    )
    .await?;
    Ok(axum::Json(SearchMemoryResponse { memories }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AddMemoryRequest {
    /// The fact, as text (at most 64 KiB).
    text: String,
    /// Who stated it (default `user`).
    #[serde(default)]
    author: Option<String>,
}

/// One memory, with its id.
#[derive(Debug, serde::Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct MemoryBody {
    id: String,
    #[serde(flatten)]
    entry: MemoryEntry,
    /// Its earlier texts, oldest first (`GET …/memory/{id}` only; an extracted fact an
    /// extraction updated has some).
    #[serde(skip_serializing_if = "Option::is_none")]
    revisions: Option<Vec<MemoryRevision>>,
}

impl From<MemoryEntry> for MemoryBody {
    fn from(entry: MemoryEntry) -> Self {
        MemoryBody {
            id: entry.event_id.clone(),
            entry,
            revisions: None,
        }
    }
}

/// agentd: adds a fact to the user's memory directly (not from a session). 201 with the
/// memory and its `id`; for an app with an embedding model, its vector follows shortly.
#[utoipa::path(post, path = "/apps/{app}/users/{user}/memory", tag = "memory",
    params(crate::http::openapi::UserPath),
    request_body = AddMemoryRequest,
    responses((status = 201, description = "Added.", body = MemoryBody), Errors, AddMemoryErrors))]
async fn add_memory(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
    Json(req): Json<AddMemoryRequest>,
) -> ApiResult<(axum::http::StatusCode, axum::Json<MemoryBody>)> {
    if state.apps.get(&app).is_none() {
        return Err(ApiError::app_not_found(&app));
    }
    let invalid = |field: &str, msg: String| {
        ApiError::validation(vec![problem(
            "value_error",
            vec![json!("body"), json!(field)],
            msg,
        )])
    };
    if req.text.len() > MAX_MEMORY_TEXT_BYTES {
        return Err(invalid(
            "text",
            format!("longer than {MAX_MEMORY_TEXT_BYTES} bytes"),
        ));
    }
    let author = req.author.as_deref().unwrap_or("user");
    if author.is_empty() || author.len() > 128 {
        return Err(invalid("author", "must be 1 to 128 bytes".into()));
    }
    let entry = fact_entry(author, &req.text).ok_or_else(|| invalid("text", "is blank".into()))?;
    state.store.insert_memory(&app, &user, &entry).await?;
    Ok((axum::http::StatusCode::CREATED, axum::Json(entry.into())))
}

#[derive(Debug, serde::Serialize, ToSchema)]
struct ForgetResponse {
    /// How many memories were deleted.
    deleted: u64,
}

error_set!(
    /// What `DELETE /apps/{app}/users/{user}/memory` answers beyond the door's codes.
    ForgetUserErrors: AppNotFound, NotFound, InvalidId
);

/// agentd: forgets every memory of the user in the app (texts and vectors), and how far each
/// session was added, so adding a session later adds it whole. The sessions themselves are
/// not changed (delete them too to erase what the user said).
#[utoipa::path(delete, path = "/apps/{app}/users/{user}/memory", tag = "memory",
    params(crate::http::openapi::UserPath),
    responses((status = 200, description = "Forgotten.", body = ForgetResponse), Errors, ForgetUserErrors))]
async fn forget_user(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
) -> ApiResult<axum::Json<ForgetResponse>> {
    let deleted = state.store.forget_user(&app, &user).await?;
    tracing::info!(%app, %user, deleted, "memory of a user forgotten");
    Ok(axum::Json(ForgetResponse { deleted }))
}

/// agentd: one memory of the user, by id (a session's memory has its event's id), with its
/// earlier texts (`revisions`, oldest first).
#[utoipa::path(get, path = "/apps/{app}/users/{user}/memory/{id}", tag = "memory",
    params(crate::http::openapi::UserPath, ("id" = String, Path, description = "The memory's id.")),
    responses((status = 200, description = "The memory.", body = MemoryBody), Errors, MemoryIdErrors))]
async fn get_memory(
    state: axum::extract::State<AppState>,
    Path((app, user, id)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<MemoryBody>> {
    let entry = state
        .store
        .get_memory(&app, &user, &id)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::MemoryNotFound, "No such memory"))?;
    let revisions = state.store.memory_revisions(&app, &user, &id).await?;
    let mut body = MemoryBody::from(entry);
    body.revisions = Some(revisions);
    Ok(axum::Json(body))
}

/// agentd: forgets one memory of the user, its text, its vector and its revisions. 204, or 404 when there
/// is none. The session it came from is not changed, and adding that session again does not
/// bring the memory back.
#[utoipa::path(delete, path = "/apps/{app}/users/{user}/memory/{id}", tag = "memory",
    params(crate::http::openapi::UserPath, ("id" = String, Path, description = "The memory's id.")),
    responses((status = 204, description = "Forgotten."), Errors, MemoryIdErrors))]
async fn delete_memory(
    state: axum::extract::State<AppState>,
    Path((app, user, id)): Path<(String, String, String)>,
) -> ApiResult<axum::http::StatusCode> {
    if state.store.delete_memory(&app, &user, &id).await? {
        Ok(axum::http::StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(ErrorCode::MemoryNotFound, "No such memory"))
    }
}
