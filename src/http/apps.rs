//! Service routes: health, version, the app list, app info, and memory (ADK's PATCH and
//! agentd's search).

use super::error::{ApiError, ApiResult};
use super::extract::{Json, Path, Query};
use super::openapi::{Errors, Status};
use super::AppState;
use crate::store::{MemoryEntry, SessionKey};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(ready))
        .routes(routes!(version))
        .routes(routes!(list_apps))
        .routes(routes!(app_info))
        .routes(routes!(update_memory, search_memory))
}

/// Liveness plus a database round trip: a replica that cannot reach its database is not
/// healthy (load balancers and the Docker HEALTHCHECK use this).
#[utoipa::path(get, path = "/health", tag = "service",
    responses((status = 200, description = "Alive and the database answers.", body = Status), Errors))]
async fn health(state: axum::extract::State<AppState>) -> ApiResult<axum::Json<Value>> {
    let probe = SessionKey::new("__health__", "__health__", "__health__");
    state.store.session_head(&probe).await.map_err(|e| {
        tracing::warn!(error = %e, "health check: database unreachable");
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            "database unreachable",
        )
    })?;
    Ok(axum::Json(json!({ "status": "ok" })))
}

/// Readiness for a load balancer: 503 `shutting_down` from the moment a shutdown starts (so
/// the balancer stops sending new runs while in-flight ones drain), and 503 when the database
/// is unreachable. `/health` stays 200 during a drain: the process is alive and finishing.
#[utoipa::path(get, path = "/ready", tag = "service",
    responses((status = 200, description = "Ready for new runs.", body = Status), Errors))]
async fn ready(state: axum::extract::State<AppState>) -> ApiResult<axum::Json<Value>> {
    if state.runner.is_draining() {
        return Err(ApiError::unavailable(
            "shutting_down",
            "This replica is shutting down; send new runs to another replica.",
            1,
        ));
    }
    health(state)
        .await
        .map(|_| axum::Json(json!({ "status": "ready" })))
}

/// The server's version (ADK's shape).
#[utoipa::path(get, path = "/version", tag = "service",
    responses((status = 200, description = "The version.", body = VersionBody)))]
async fn version() -> axum::Json<Value> {
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "language": "rust",
        "language_version": option_env!("CARGO_PKG_RUST_VERSION").unwrap_or(""),
    }))
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct VersionBody {
    version: String,
    language: String,
    language_version: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListAppsQuery {
    /// An object with each app's root agent and description instead of the names.
    #[serde(default)]
    detailed: bool,
    /// Sent by the ADK web UI; ignored.
    #[serde(default, rename = "relative_path")]
    _relative_path: Option<String>,
}

/// `GET /list-apps` answers the names, or with `?detailed=true` this.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct AppList {
    apps: Vec<AppSummary>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct AppSummary {
    name: String,
    root_agent_name: String,
    description: String,
    language: String,
    is_computer_use: bool,
    /// Why the app failed to load, if it did.
    #[schema(nullable = false)]
    error: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum AppsBody {
    Names(Vec<String>),
    Detailed(AppList),
}

/// The apps the caller may use (ADK).
#[utoipa::path(get, path = "/list-apps", tag = "apps", params(ListAppsQuery),
    responses((status = 200, description = "App names, or details with `detailed=true`.", body = AppsBody), Errors))]
async fn list_apps(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Query(q): Query<ListAppsQuery>,
) -> axum::Json<Value> {
    if !q.detailed {
        return axum::Json(json!(state
            .apps
            .names()
            .filter(|a| caller.may_use_app(a))
            .collect::<Vec<_>>()));
    }
    let apps: Vec<Value> = state
        .apps
        .entries()
        .filter(|a| caller.may_use_app(&a.name))
        .map(|a| match &a.tree {
            Ok(tree) => json!({
                "name": a.name, "rootAgentName": tree.root().name(),
                "description": tree.root().description(),
                "language": "yaml", "isComputerUse": false, "agents": null,
            }),
            Err(e) => json!({
                "name": a.name, "rootAgentName": "", "description": "",
                "language": "yaml", "isComputerUse": false, "agents": null, "error": e,
            }),
        })
        .collect();
    axum::Json(json!({ "apps": apps }))
}

/// An app's agents and their tools (ADK's web UI reads it).
#[utoipa::path(get, path = "/apps/{app}/app-info", tag = "apps",
    params(super::openapi::AppPath),
    responses((status = 200, description = "The app's agent tree.", body = AppInfoBody), Errors))]
async fn app_info(
    state: axum::extract::State<AppState>,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    let entry = state.apps.get(&app).ok_or_else(|| {
        ApiError::not_found(
            "app_not_found",
            format!(
                "Agent not found: '{app}'. No matching directory or module exists in '{}'.",
                state.apps.dir.join(&app).display()
            ),
        )
    })?;
    let tree = entry.tree.as_ref().map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "app_load_failed",
            format!("Failed to load agent: {e}"),
        )
    })?;
    let root = tree.root();
    if root.agent_class() != "LlmAgent" {
        return Err(ApiError::bad_request(
            "not_llm_agent",
            "Root agent is not an LlmAgent",
        ));
    }
    let mut agents = serde_json::Map::new();
    let mut stack = vec![root.clone()];
    while let Some(agent) = stack.pop() {
        let subs: Vec<&str> = agent.sub_agents().iter().map(|a| a.name()).collect();
        let declarations: Vec<Value> = agent
            .tool_declarations()
            .into_iter()
            .map(|d| {
                let mut f = json!({ "description": d.description, "name": d.name });
                if let Some(p) = d.parameters {
                    f["parametersJsonSchema"] = p;
                }
                f
            })
            .collect();
        let tools = if declarations.is_empty() {
            json!([])
        } else {
            json!([{ "functionDeclarations": declarations }])
        };
        agents.insert(
            agent.name().to_string(),
            json!({
                "name": agent.name(), "description": agent.description(),
                "instruction": agent.instruction(), "tools": tools, "sub_agents": subs,
            }),
        );
        stack.extend(agent.sub_agents().iter().cloned());
    }
    Ok(axum::Json(json!({
        "name": app, "rootAgentName": root.name(), "description": root.description(),
        "language": "yaml", "isComputerUse": false, "agents": agents,
    })))
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct AppInfoBody {
    name: String,
    root_agent_name: String,
    description: String,
    language: String,
    is_computer_use: bool,
    /// Each agent by name: `name`, `description`, `instruction`, `tools`, `sub_agents`.
    agents: std::collections::BTreeMap<String, Value>,
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
    params(super::openapi::UserPath),
    request_body = UpdateMemoryRequest,
    responses((status = 200, description = "Added: `null`.", body = Value), Errors))]
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
    params(super::openapi::UserPath, SearchMemoryQuery),
    responses((status = 200, description = "The matching memories, best first.", body = SearchMemoryResponse), Errors))]
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
