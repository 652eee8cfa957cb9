//! The OpenAI API over agentd's apps, so every OpenAI SDK (and every tool that takes a
//! `base_url`) can talk to an agent:
//!
//! - `GET /v1/models`: the apps the caller may use.
//! - `POST /v1/chat/completions` (`model` = app; stream or not). With `x-agentd-session-id`
//!   the call continues that session and only its new input is taken (the trailing user
//!   message, or `tool` messages answering the calls the session waits for); without it a new
//!   session is created, seeded with the earlier `messages`, and its id is returned in
//!   `x-agentd-session-id`.
//! - `POST /v1/responses` (stream or not; `previous_response_id` continues that response's
//!   session; `background: true` runs on after the request and can be polled, resumed and
//!   cancelled), `GET /v1/responses/{id}` (`?stream=true&starting_after=N` resumes),
//!   `POST /v1/responses/{id}/cancel`. A response id is `resp_<run id>`.
//!
//! A background response is run without token streaming: its events are then a function of
//! the stored events alone, so a resume on any replica, at any time, gets the same events with
//! the same `sequence_number`s (the Python SDK replays from the first event and filters
//! locally).

use crate::auth::Caller;
use crate::http::openapi::OpenAiErrors;
use crate::http::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(models))
        .routes(routes!(super::chat::chat_completions))
        .routes(routes!(super::responses::create_response))
        .routes(routes!(super::responses::get_response))
        .routes(routes!(super::responses::cancel_response))
        .route_layer(axum::middleware::map_response(openai_error))
}

/// Errors also in OpenAI's shape, `{"error": {"message", "type", "code", "param"}}`, which the
/// OpenAI SDKs read (agentd's `detail` and `code` stay beside it).
async fn openai_error(resp: Response) -> Response {
    let status = resp.status();
    let json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || !json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return (status, "error").into_response();
    };
    let mut value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if let Some(obj) = value.as_object_mut().filter(|o| !o.contains_key("error")) {
        let message = obj.get("detail").cloned().unwrap_or(Value::Null);
        let message = match message {
            Value::String(s) => s,
            other => other.to_string(),
        };
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        obj.insert(
            "error".into(),
            json!({"message": message, "type": kind, "code": obj.get("code"), "param": null}),
        );
    }
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(value.to_string()))
}

/// The apps the caller may use, as OpenAI models.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses((status = 200, description = "`{\"object\": \"list\", \"data\": [{\"id\": <app>, \"object\": \"model\", …}]}`", body = Object), OpenAiErrors))]
async fn models(State(state): State<AppState>, caller: Caller) -> axum::Json<Value> {
    let data: Vec<Value> = state
        .apps
        .names()
        .filter(|a| caller.may_use_app(a))
        .map(|a| json!({"id": a, "object": "model", "created": 0, "owned_by": "agentd"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data}))
}
