//! A2A's JSON-RPC 2.0 binding: `POST /a2a/{app}`. Errors are JSON-RPC errors with the
//! spec's codes (on HTTP 200, as JSON-RPC over HTTP answers); the streaming methods answer
//! SSE, one JSON-RPC response per `data:` line. 0.3's method names are answered too
//! ([`crate::http::frontend::a2a::v03`]).

use super::rest::{params, sse, A2aErrors};
use crate::auth::Caller;
use crate::http::extract::Path;
use crate::http::frontend::a2a::error::{A2aError, A2aResult};
use crate::http::frontend::a2a::push;
use crate::http::frontend::a2a::tasks::{self, Scope};
use crate::http::frontend::a2a::v03;
use crate::http::openapi::error_set;
use crate::http::openapi::EventStream;
use crate::http::AppState;
use a2a_types as a2a;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{json, Value};
use utoipa_axum::{router::OpenApiRouter, routes};

error_set!(
    /// What `POST /a2a/{app}` answers beyond the door's codes.
    RpcErrors as "A2aErrorBody": AppNotFound, InvalidId, UserForbidden, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout, ArtifactTooLarge, RunNotFound
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(rpc))
}

/// One JSON-RPC request, checked.
struct Call {
    id: Value,
    method: &'static str,
    /// Answer in 0.3's shapes.
    v03: bool,
    params: Value,
}

const METHODS: &[&str] = &[
    "SendMessage",
    "SendStreamingMessage",
    "GetTask",
    "ListTasks",
    "CancelTask",
    "SubscribeToTask",
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
    "GetExtendedAgentCard",
];

/// The request in `raw`, or the error to answer (with the id, when one could be read).
fn call(raw: &[u8]) -> Result<Call, (Value, A2aError)> {
    let value: Value = serde_json::from_slice(raw).map_err(|e| {
        (
            Value::Null,
            A2aError::Parse(format!("the body is not JSON: {e}")),
        )
    })?;
    let Value::Object(o) = value else {
        return Err((
            Value::Null,
            A2aError::InvalidRequest(
                "a JSON-RPC request is an object (batches are not supported)".into(),
            ),
        ));
    };
    let id = match o.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => {
            return Err((
                Value::Null,
                A2aError::InvalidRequest("the request needs an id (a string or a number)".into()),
            ))
        }
    };
    if o.get("jsonrpc") != Some(&json!("2.0")) {
        return Err((
            id,
            A2aError::InvalidRequest("jsonrpc must be \"2.0\"".into()),
        ));
    }
    let Some(name) = o.get("method").and_then(Value::as_str) else {
        return Err((
            id,
            A2aError::InvalidRequest("method must be a string".into()),
        ));
    };
    let Some((method, v03)) = method_of(name) else {
        return Err((id, A2aError::MethodNotFound(format!("no method {name:?}"))));
    };
    let params = match o.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) if v03 => v03::params_in(method, p.clone()),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err((
                id,
                A2aError::InvalidParams("params must be an object".into()),
            ));
        }
    };
    Ok(Call {
        id,
        method,
        v03,
        params,
    })
}

/// The 1.0 method `name` is, and whether a 0.3 client named it.
fn method_of(name: &str) -> Option<(&'static str, bool)> {
    match METHODS.iter().find(|m| **m == name) {
        Some(m) => Some((*m, false)),
        None => v03::method(name).map(|m| (m, true)),
    }
}

fn ok(call: &Call, result: Value) -> Value {
    let result = if call.v03 {
        v03::result_out(call.method, result)
    } else {
        result
    };
    json!({"jsonrpc": "2.0", "id": call.id, "result": result})
}

fn to_json<T: serde::Serialize>(v: &T) -> A2aResult<Value> {
    serde_json::to_value(v).map_err(|e| A2aError::Internal(format!("serializing: {e}")))
}

/// A2A over JSON-RPC: `SendMessage`, `SendStreamingMessage` (SSE), `GetTask`, `ListTasks`,
/// `CancelTask`, `SubscribeToTask` (SSE), the push notification config methods and
/// `GetExtendedAgentCard` (and 0.3's names for them).
#[utoipa::path(post, path = "/a2a/{app}", tag = "a2a",
    params(("app" = String, Path)),
    request_body(content = Object, description = "A JSON-RPC 2.0 request."),
    responses((status = 200, description = "A JSON-RPC response (errors too), or for the streaming methods JSON-RPC responses as SSE `data:` lines.",
        content((Object = "application/json"), (EventStream = "text/event-stream"))), A2aErrors, RpcErrors))]
async fn rpc(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(app): Path<String>,
    raw: Bytes,
) -> Response {
    // As every route: a body must be labelled JSON, and of bounded complexity (415 or 413
    // before any JSON-RPC framing).
    if let Err(e) = crate::http::extract::require_json(&headers, &raw, state.json) {
        return e.into_response();
    }
    let call = match call(&raw) {
        Ok(c) => c,
        Err((id, e)) => return axum::Json(e.rpc_response(&id)).into_response(),
    };
    match dispatch(&state, &caller, &headers, &app, &call).await {
        Ok(r) => r,
        Err(e) => {
            if let A2aError::Api(inner) = &e {
                if inner.status.is_server_error() {
                    tracing::warn!(code = inner.code.as_str(), "a2a call failed");
                }
            }
            axum::Json(e.rpc_response(&call.id)).into_response()
        }
    }
}

async fn dispatch(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    app: &str,
    call: &Call,
) -> A2aResult<Response> {
    let scope = Scope::for_call(state, caller, headers, app)?;
    let p = call.params.clone();
    let answer = |v: Value| axum::Json(ok(call, v)).into_response();
    Ok(match call.method {
        "SendMessage" => {
            let req: a2a::SendMessageRequest = params(p)?;
            answer(to_json(&tasks::send_blocking(state, &scope, &req).await?)?)
        }
        "SendStreamingMessage" => {
            let req: a2a::SendMessageRequest = params(p)?;
            let frames = tasks::send_streaming(state, &scope, &req).await?;
            stream(call, frames)
        }
        "GetTask" => {
            let req: a2a::GetTaskRequest = params(p)?;
            answer(to_json(
                &tasks::get_task(state, &scope, &req.id, req.history_length).await?,
            )?)
        }
        "ListTasks" => {
            let req: a2a::ListTasksRequest = params(p)?;
            answer(to_json(&tasks::list(state, &scope, &req).await?)?)
        }
        "CancelTask" => {
            let req: a2a::CancelTaskRequest = params(p)?;
            answer(to_json(
                &tasks::cancel(state, &scope, &req.id, headers).await?,
            )?)
        }
        "SubscribeToTask" => {
            let req: a2a::SubscribeToTaskRequest = params(p)?;
            let frames = tasks::subscribe(state, &scope, &req.id).await?;
            stream(call, frames)
        }
        method if method.contains("PushNotificationConfig") => {
            answer(push_call(state, &scope, method, p).await?)
        }
        _ => return Err(A2aError::ExtendedCardNotConfigured),
    })
}

/// The push notification config methods, answered as JSON.
async fn push_call(state: &AppState, scope: &Scope, method: &str, p: Value) -> A2aResult<Value> {
    match method {
        "CreateTaskPushNotificationConfig" => {
            let req: a2a::TaskPushNotificationConfig = params(p)?;
            to_json(&push::create(state, scope, &req).await?)
        }
        "GetTaskPushNotificationConfig" => {
            let req: a2a::GetTaskPushNotificationConfigRequest = params(p)?;
            to_json(&push::get(state, scope, &req.task_id, &req.id).await?)
        }
        "ListTaskPushNotificationConfigs" => {
            let req: a2a::ListTaskPushNotificationConfigsRequest = params(p)?;
            to_json(&push::list(state, scope, &req.task_id).await?)
        }
        "DeleteTaskPushNotificationConfig" => {
            let req: a2a::DeleteTaskPushNotificationConfigRequest = params(p)?;
            push::delete(state, scope, &req.task_id, &req.id).await?;
            Ok(json!({}))
        }
        _ => Err(A2aError::ExtendedCardNotConfigured),
    }
}

fn stream(
    call: &Call,
    frames: impl futures::Stream<Item = a2a::StreamResponse> + Send + 'static,
) -> Response {
    let (id, method, v03) = (call.id.clone(), call.method, call.v03);
    sse(frames.map(move |r| {
        let result = serde_json::to_value(r).unwrap_or(Value::Null);
        let result = if v03 {
            v03::result_out(method, result)
        } else {
            result
        };
        json!({"jsonrpc": "2.0", "id": id, "result": result})
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_requests_get_the_spec_codes() {
        let code = |raw: &str| call(raw.as_bytes()).err().map(|(_, e)| e.code());
        assert_eq!(code("{not json"), Some(-32700));
        assert_eq!(code("[]"), Some(-32600));
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"GetTask"}"#),
            Some(-32600)
        );
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"GetTask"}"#),
            Some(-32600)
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"Nope"}"#),
            Some(-32601)
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}"#),
            Some(-32602)
        );
        let ok = call(br#"{"jsonrpc":"2.0","id":"x","method":"tasks/get","params":{"id":"t"}}"#)
            .ok()
            .unwrap();
        assert_eq!((ok.method, ok.v03), ("GetTask", true));
    }
}
