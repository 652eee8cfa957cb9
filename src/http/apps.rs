//! Service routes: health, version, the app list, app info, and memory (ADK's PATCH and
//! agentd's search).

use super::error::{ApiError, ApiResult};
use super::extract::{Json, Path, Query};
use super::AppState;
use crate::store::{MemoryEntry, SessionKey};
use axum::routing::{get, patch};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/version", get(version))
        .route("/list-apps", get(list_apps))
        .route("/apps/{app}/app-info", get(app_info))
        .route(
            "/apps/{app}/users/{user}/memory",
            patch(update_memory).get(search_memory),
        )
}

/// Liveness plus a database round trip: a replica that cannot reach its database is not
/// healthy (load balancers and the Docker HEALTHCHECK use this).
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

async fn version() -> axum::Json<Value> {
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "language": "rust",
        "language_version": option_env!("CARGO_PKG_RUST_VERSION").unwrap_or(""),
    }))
}

#[derive(Debug, Deserialize)]
struct ListAppsQuery {
    #[serde(default)]
    detailed: bool,
    /// Sent by the ADK web UI; ignored.
    #[serde(default, rename = "relative_path")]
    _relative_path: Option<String>,
}

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

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateMemoryRequest {
    #[serde(alias = "session_id")]
    session_id: String,
}

/// ADK: adds the session's events to the memory service (idempotent). 200 `null`, or 404
/// when the session does not exist. Like ADK's session routes, the app is not checked.
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

#[derive(Debug, Deserialize)]
struct SearchMemoryQuery {
    #[serde(default)]
    query: String,
    #[serde(default)]
    limit: Option<u32>,
}

#[derive(Debug, serde::Serialize)]
struct SearchMemoryResponse {
    memories: Vec<MemoryEntry>,
}

/// agentd: `GET …/memory?query=…&limit=…`, the user's memories matching any word of `query`,
/// best first (`limit` default 10, at most 100). A blank query finds nothing.
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
