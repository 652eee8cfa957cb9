//! Memory: ADK's `PATCH …/memory` (add a session) and agentd's search.

use crate::http::error::ApiResult;
use crate::http::extract::{Json, Path, Query};
use crate::http::openapi::error_set;
use crate::http::openapi::Errors;
use crate::http::AppState;
use crate::store::{MemoryEntry, SessionKey};
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `PATCH /apps/{app}/users/{user}/memory` answers beyond the door's codes.
    UpdateMemoryErrors: AppNotFound, NotFound, InvalidId, ValidationError, SessionNotFound
);

error_set!(
    /// What `GET /apps/{app}/users/{user}/memory` answers beyond the door's codes.
    SearchMemoryErrors: AppNotFound, NotFound, InvalidId, ValidationError
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(update_memory, search_memory))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct UpdateMemoryRequest {
    #[serde(alias = "session_id")]
    session_id: String,
}

/// ADK: adds the session's events to the memory service (idempotent). 200 `null`, or 404
/// when the session does not exist. Like ADK's session routes, the app is not checked.
#[utoipa::path(patch, path = "/apps/{app}/users/{user}/memory", tag = "memory",
    params(crate::http::openapi::UserPath),
    request_body = UpdateMemoryRequest,
    responses((status = 200, description = "Added: `null`.", body = Value), Errors, UpdateMemoryErrors))]
async fn update_memory(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
    Json(req): Json<UpdateMemoryRequest>,
) -> ApiResult<axum::Json<Value>> {
    let key = SessionKey::new(app, user, req.session_id);
    let added = state.store.add_session_to_memory(&key).await?;
    tracing::debug!(added, session = %key.session_id, "session added to memory");
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
    memories: Vec<MemoryEntry>,
}

/// agentd: `GET …/memory?query=…&limit=…`, the user's memories matching any word of `query`,
/// best first (`limit` default 10, at most 100). A blank query finds nothing.
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
    let memories = state
        .store
        .search_memory(&app, &user, &q.query, limit as usize)
        .await?;
    Ok(axum::Json(SearchMemoryResponse { memories }))
}
