//! A2A's HTTP+JSON binding under `/a2a/{app}`: `POST message:send` and `message:stream`,
//! `GET tasks` and `tasks/{id}`, `POST tasks/{id}:cancel` and `tasks/{id}:subscribe`, the
//! push notification config routes, `GET extendedAgentCard`, and the agent cards. Errors are
//! `google.rpc.Status` bodies ([`crate::http::frontend::a2a::error`]).

use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::http::extract::Path;
use crate::http::frontend::a2a::card::agent_card;
use crate::http::frontend::a2a::error::{A2aError, A2aResult};
use crate::http::frontend::a2a::push;
use crate::http::frontend::a2a::tasks::{self, Scope};
use crate::http::openapi::error_set;
use crate::http::openapi::EventStream;
use crate::http::AppState;
use a2a_types as a2a;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::IntoResponses;
use utoipa_axum::{router::OpenApiRouter, routes};

error_set!(
    /// What `GET /a2a/{app}/.well-known/agent-card.json` answers beyond the door's codes.
    CardErrors as "A2aErrorBody": AppNotFound, InvalidId
);

error_set!(
    /// What `GET /.well-known/agent-card.json` answers beyond the door's codes.
    DefaultCardErrors as "A2aErrorBody": AppNotFound, NoDefaultApp
);

error_set!(
    /// What `POST /a2a/{app}/message:send` answers beyond the door's codes.
    MessageSendErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout, ArtifactTooLarge
);

error_set!(
    /// What `POST /a2a/{app}/message:stream` answers beyond the door's codes.
    MessageStreamErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout, ArtifactTooLarge
);

error_set!(
    /// What `GET /a2a/{app}/tasks` answers beyond the door's codes.
    ListTasksErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden
);

error_set!(
    /// What `GET /a2a/{app}/tasks/{task}` answers beyond the door's codes.
    GetTaskErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden
);

error_set!(
    /// What `POST /a2a/{app}/tasks/{task}` answers beyond the door's codes.
    TaskActionErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden, RunNotFound
);

error_set!(
    /// What `GET /a2a/{app}/tasks/{task}/pushNotificationConfigs` answers beyond the door's codes.
    PushConfigsErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden
);

error_set!(
    /// What `POST /a2a/{app}/tasks/{task}/pushNotificationConfigs` answers beyond the door's codes.
    CreatePushConfigErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden
);

error_set!(
    /// What `GET /a2a/{app}/tasks/{task}/pushNotificationConfigs/{config}` answers beyond the door's codes.
    PushConfigErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden
);

error_set!(
    /// What `DELETE /a2a/{app}/tasks/{task}/pushNotificationConfigs/{config}` answers beyond the door's codes.
    DeletePushConfigErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden
);

error_set!(
    /// What `GET /a2a/{app}/extendedAgentCard` answers beyond the door's codes.
    ExtendedCardErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(card))
        .routes(routes!(default_card))
        .routes(routes!(message_send))
        .routes(routes!(message_stream))
        .routes(routes!(list_tasks))
        .routes(routes!(get_task, task_action))
        .routes(routes!(push_configs, create_push_config))
        .routes(routes!(push_config, delete_push_config))
        .routes(routes!(extended_card))
}

/// A2A's errors: a `google.rpc.Status` (`{"error": {"code", "status", "message",
/// "details": [ErrorInfo]}}`), or agentd's `{"detail", "code"}` for what the door refuses
/// before the route (authentication, an unknown app).
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum A2aErrors {
    #[response(status = "4XX")]
    Client(#[to_schema] serde_json::Map<String, Value>),
    #[response(status = "5XX")]
    Server(#[to_schema] serde_json::Map<String, Value>),
}

/// A JSON body as an A2A request type.
pub fn body<T: DeserializeOwned>(raw: &[u8]) -> A2aResult<T> {
    let value: Value = serde_json::from_slice(raw)
        .map_err(|e| A2aError::Parse(format!("the body is not JSON: {e}")))?;
    params(value)
}

/// JSON as an A2A request type (proto JSON: unknown fields are refused, by name).
pub fn params<T: DeserializeOwned>(value: Value) -> A2aResult<T> {
    if !value.is_object() {
        return Err(A2aError::InvalidParams("params must be an object".into()));
    }
    serde_json::from_value(value).map_err(|e| A2aError::InvalidParams(e.to_string()))
}

/// Query parameters (camelCase, as the proto names them) as an A2A request type.
fn query<T: DeserializeOwned>(raw: Option<&str>, ints: &[&str], bools: &[&str]) -> A2aResult<T> {
    let mut map = serde_json::Map::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        let value = if ints.contains(&k.as_ref()) {
            Value::Number(
                v.parse::<i32>()
                    .map_err(|_| A2aError::InvalidParams(format!("{k} must be an integer")))?
                    .into(),
            )
        } else if bools.contains(&k.as_ref()) {
            Value::Bool(v == "true")
        } else {
            Value::String(v.into_owned())
        };
        map.insert(k.into_owned(), value);
    }
    params(Value::Object(map))
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    axum::Json(value).into_response()
}

/// A stream of A2A responses as SSE, one `data:` line of JSON each, kept alive.
pub fn sse(frames: impl Stream<Item = Value> + Send + 'static) -> Response {
    let bytes = frames.map(|v| crate::http::sse::run::json_frame(&v));
    crate::http::sse::event_stream(
        crate::http::sse::run::with_keep_alive(bytes),
        HeaderMap::new(),
    )
}

fn as_json(r: a2a::StreamResponse) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}

fn app_card(state: &AppState, headers: &HeaderMap, app: &str) -> A2aResult<Response> {
    let tree = state
        .apps
        .get(app)
        .and_then(|e| e.tree.as_ref().ok().map(|t| (t.clone(), e.a2a.clone())))
        .ok_or_else(|| A2aError::Api(crate::http::error::ApiError::app_not_found(app)))?;
    Ok(json(&agent_card(
        &state.interop,
        headers,
        app,
        &tree.0,
        tree.1.as_ref(),
    )))
}

/// The app's agent card (behind the door unless `--a2a-public-cards`: see `docs/a2a.md`).
#[utoipa::path(get, path = "/a2a/{app}/.well-known/agent-card.json", tag = "a2a",
    params(("app" = String, Path)),
    responses((status = 200, description = "The app's A2A agent card.", body = Object), A2aErrors, CardErrors))]
async fn card(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(app): Path<String>,
) -> Result<Response, A2aError> {
    crate::http::extract::validate_id("app", &app)?;
    app_card(&state, &headers, &app)
}

/// The agent card of `--a2a-default-app`, or of the only app served.
#[utoipa::path(get, path = "/.well-known/agent-card.json", tag = "a2a",
    responses((status = 200, description = "The default app's A2A agent card.", body = Object), A2aErrors, DefaultCardErrors))]
async fn default_card(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    headers: HeaderMap,
) -> Result<Response, A2aError> {
    let app = match &state.interop.default_app {
        Some(app) => app.clone(),
        None => {
            let mut names = state.apps.names();
            match (names.next(), names.next()) {
                (Some(only), None) => only.to_string(),
                _ => {
                    return Err(A2aError::Api(crate::http::error::ApiError::new(
                        ErrorCode::NoDefaultApp,
                        "Several apps are served: each has its card at \
                         /a2a/{app}/.well-known/agent-card.json (or name one with \
                         --a2a-default-app).",
                    )))
                }
            }
        }
    };
    // Behind the door, a key limited to some apps sees only their cards (the app is not in
    // this path, so the door could not check it).
    if let Some(axum::Extension(caller)) = caller {
        if !caller.may_use_app(&app) {
            return Err(A2aError::Api(crate::http::auth::app_hidden(
                &state.apps,
                &caller,
                &app,
            )));
        }
    }
    app_card(&state, &headers, &app)
}

/// `SendMessage`: runs the message; answers the task when it ends or waits for input (at
/// once with `configuration.returnImmediately`).
#[utoipa::path(post, path = "/a2a/{app}/message:send", tag = "a2a",
    params(("app" = String, Path)),
    request_body(content = Object, description = "A2A `SendMessageRequest`."),
    responses((status = 200, description = "A2A `SendMessageResponse` (`{\"task\": …}`).", body = Object), A2aErrors, MessageSendErrors))]
async fn message_send(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(app): Path<String>,
    raw: Bytes,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    crate::http::extract::require_json(&headers, &raw, state.json)?;
    let req: a2a::SendMessageRequest = body(&raw)?;
    Ok(json(&tasks::send_blocking(&state, &scope, &req).await?))
}

/// `SendStreamingMessage`: runs the message, streaming the task, its artifacts in chunks and
/// its status updates; leaving the stream does not cancel the task.
#[utoipa::path(post, path = "/a2a/{app}/message:stream", tag = "a2a",
    params(("app" = String, Path)),
    request_body(content = Object, description = "A2A `SendMessageRequest`."),
    responses((status = 200, description = "A2A `StreamResponse`s as SSE `data:` lines.",
        content((EventStream = "text/event-stream"))), A2aErrors, MessageStreamErrors))]
async fn message_stream(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(app): Path<String>,
    raw: Bytes,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    crate::http::extract::require_json(&headers, &raw, state.json)?;
    let req: a2a::SendMessageRequest = body(&raw)?;
    let frames = tasks::send_streaming(&state, &scope, &req).await?;
    Ok(sse(frames.map(as_json)))
}

/// `ListTasks`: the caller's tasks of the app, newest first (`contextId`, `status`,
/// `pageSize`, `pageToken`, `historyLength`, `includeArtifacts`, `statusTimestampAfter`).
#[utoipa::path(get, path = "/a2a/{app}/tasks", tag = "a2a",
    params(("app" = String, Path)),
    responses((status = 200, description = "A2A `ListTasksResponse`.", body = Object), A2aErrors, ListTasksErrors))]
async fn list_tasks(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(app): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    let req: a2a::ListTasksRequest = query(
        q.as_deref(),
        &["pageSize", "historyLength"],
        &["includeArtifacts"],
    )?;
    Ok(json(&tasks::list(&state, &scope, &req).await?))
}

/// `GetTask` (`historyLength` keeps the newest messages).
#[utoipa::path(get, path = "/a2a/{app}/tasks/{task}", tag = "a2a",
    params(("app" = String, Path), ("task" = String, Path)),
    responses((status = 200, description = "A2A `Task`.", body = Object), A2aErrors, GetTaskErrors))]
async fn get_task(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((app, task)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    let req: a2a::GetTaskRequest = query(q.as_deref(), &["historyLength"], &[])?;
    Ok(json(
        &tasks::get_task(&state, &scope, &task, req.history_length).await?,
    ))
}

/// `CancelTask` (`POST tasks/{id}:cancel`) and `SubscribeToTask` (`POST
/// tasks/{id}:subscribe`, SSE).
#[utoipa::path(post, path = "/a2a/{app}/tasks/{task}", tag = "a2a",
    params(("app" = String, Path), ("task" = String, Path, description = "`{id}:cancel` or `{id}:subscribe`")),
    responses((status = 200, description = "`:cancel`: the A2A `Task`; `:subscribe`: A2A `StreamResponse`s as SSE.",
        content((Object = "application/json"), (EventStream = "text/event-stream"))), A2aErrors, TaskActionErrors))]
async fn task_action(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((app, task)): Path<(String, String)>,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    if let Some(id) = task.strip_suffix(":cancel") {
        return Ok(json(&tasks::cancel(&state, &scope, id, &headers).await?));
    }
    if let Some(id) = task.strip_suffix(":subscribe") {
        let frames = tasks::subscribe(&state, &scope, id).await?;
        return Ok(sse(frames.map(as_json)));
    }
    Err(A2aError::MethodNotFound(format!(
        "POST /a2a/{app}/tasks/{task}: expected {{id}}:cancel or {{id}}:subscribe"
    )))
}

/// `ListTaskPushNotificationConfigs`.
#[utoipa::path(get, path = "/a2a/{app}/tasks/{task}/pushNotificationConfigs", tag = "a2a",
    params(("app" = String, Path), ("task" = String, Path)),
    responses((status = 200, description = "A2A `ListTaskPushNotificationConfigsResponse`.", body = Object), A2aErrors, PushConfigsErrors))]
async fn push_configs(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((app, task)): Path<(String, String)>,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    Ok(json(&push::list(&state, &scope, &task).await?))
}

/// `CreateTaskPushNotificationConfig`: the task's end is posted to the URL (while the task
/// works; SSRF rules as for webhooks).
#[utoipa::path(post, path = "/a2a/{app}/tasks/{task}/pushNotificationConfigs", tag = "a2a",
    params(("app" = String, Path), ("task" = String, Path)),
    request_body(content = Object, description = "A2A `TaskPushNotificationConfig`."),
    responses((status = 200, description = "The stored A2A `TaskPushNotificationConfig` (credentials not echoed).", body = Object), A2aErrors, CreatePushConfigErrors))]
async fn create_push_config(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((app, task)): Path<(String, String)>,
    raw: Bytes,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    crate::http::extract::require_json(&headers, &raw, state.json)?;
    let mut config: a2a::TaskPushNotificationConfig = body(&raw)?;
    if !config.task_id.is_empty() && config.task_id != task {
        return Err(A2aError::InvalidParams(
            "the body's taskId is not the path's".into(),
        ));
    }
    config.task_id = task;
    Ok(json(&push::create(&state, &scope, &config).await?))
}

/// `GetTaskPushNotificationConfig`.
#[utoipa::path(get, path = "/a2a/{app}/tasks/{task}/pushNotificationConfigs/{config}", tag = "a2a",
    params(("app" = String, Path), ("task" = String, Path), ("config" = String, Path)),
    responses((status = 200, description = "A2A `TaskPushNotificationConfig`.", body = Object), A2aErrors, PushConfigErrors))]
async fn push_config(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((app, task, config)): Path<(String, String, String)>,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    Ok(json(&push::get(&state, &scope, &task, &config).await?))
}

/// `DeleteTaskPushNotificationConfig`.
#[utoipa::path(delete, path = "/a2a/{app}/tasks/{task}/pushNotificationConfigs/{config}", tag = "a2a",
    params(("app" = String, Path), ("task" = String, Path), ("config" = String, Path)),
    responses((status = 200, description = "`{}`: the config is gone.", body = Object), A2aErrors, DeletePushConfigErrors))]
async fn delete_push_config(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((app, task, config)): Path<(String, String, String)>,
) -> Result<Response, A2aError> {
    let scope = Scope::for_call(&state, &caller, &headers, &app)?;
    push::delete(&state, &scope, &task, &config).await?;
    Ok(json(&serde_json::json!({})))
}

/// `GetExtendedAgentCard`: agentd has no card beyond the public one.
#[utoipa::path(get, path = "/a2a/{app}/extendedAgentCard", tag = "a2a",
    params(("app" = String, Path)),
    responses((status = 200, description = "Never: there is no extended card.", body = Object), A2aErrors, ExtendedCardErrors))]
async fn extended_card(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(app): Path<String>,
) -> Result<Response, A2aError> {
    Scope::for_call(&state, &caller, &headers, &app)?;
    Err(A2aError::ExtendedCardNotConfigured)
}
