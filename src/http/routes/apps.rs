//! The apps: ADK's `GET /list-apps` and `GET /apps/{app}/app-info`.

use crate::error_code::ErrorCode;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{Path, Query};
use crate::http::openapi::error_set;
use crate::http::openapi::Errors;
use crate::http::AppState;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `GET /list-apps` answers beyond the door's codes.
    ListAppsErrors: ValidationError
);

error_set!(
    /// What `GET /apps/{app}/app-info` answers beyond the door's codes.
    AppInfoErrors: AppNotFound, InvalidId, AppLoadFailed, NotLlmAgent
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_apps))
        .routes(routes!(app_info))
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
    responses((status = 200, description = "App names, or details with `detailed=true`.", body = AppsBody), Errors, ListAppsErrors))]
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
                "language": "yaml", "isComputerUse": false, "agents": null,
                "error": if caller.may_see_internals() { e.as_str() } else { crate::http::error::LOAD_FAILED },
            }),
        })
        .collect();
    axum::Json(json!({ "apps": apps }))
}

/// An app's agents and their tools (ADK's web UI reads it).
#[utoipa::path(get, path = "/apps/{app}/app-info", tag = "apps",
    params(crate::http::openapi::AppPath),
    responses((status = 200, description = "The app's agent tree.", body = AppInfoBody), Errors, AppInfoErrors))]
async fn app_info(
    state: axum::extract::State<AppState>,
    caller: crate::auth::Caller,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    let entry = crate::http::auth::served_app(&state, &caller, &app)?;
    let internals = caller.may_see_internals();
    let tree = entry.tree.as_ref().map_err(|e| {
        ApiError::new(
            ErrorCode::AppLoadFailed,
            format!(
                "Failed to load agent: {}",
                if internals {
                    e.as_str()
                } else {
                    crate::http::error::LOAD_FAILED
                }
            ),
        )
    })?;
    let root = tree.root();
    if root.agent_class() != "LlmAgent" {
        return Err(ApiError::new(
            ErrorCode::NotLlmAgent,
            "Root agent is not an LlmAgent",
        ));
    }
    let agents = agents_info(root, internals);
    Ok(axum::Json(json!({
        "name": app, "rootAgentName": root.name(), "description": root.description(),
        "language": "yaml", "isComputerUse": false, "agents": agents,
    })))
}

/// Every agent of the tree under `root` as `app-info` shows it (instructions only to callers
/// who may see the server's internals).
fn agents_info(
    root: &std::sync::Arc<dyn crate::invocation::Agent>,
    internals: bool,
) -> serde_json::Map<String, Value> {
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
                "instruction": if internals { agent.instruction() } else { "" },
                "tools": tools, "sub_agents": subs,
            }),
        );
        stack.extend(agent.sub_agents().iter().cloned());
    }
    agents
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
