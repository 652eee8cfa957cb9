//! `POST /v1/chat/completions`: a conversation resent whole (or continued by session id),
//! answered streamed or not.

use super::conversation::*;

use super::map::{chat_completion, ChatStream};
use crate::auth::Caller;
use crate::event::now_ts;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::Json;
use crate::http::frontend::kit::{
    check_app, data_frame, resolve_user, run_headers, sse_response, turn,
};
use crate::http::openapi::{EventStream, OpenAiErrors, UserHeader};
use crate::http::AppState;
use crate::runner::OnDisconnect;
use crate::store::{RunStatus, SessionKey};
use crate::transcript::RunItem;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::Value;

// ------------------------------------------------------------------ Chat Completions

/// OpenAI's chat completion request (the fields agentd reads; others are ignored).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ChatCompletionRequest)]
pub(super) struct ChatRequest {
    /// The app.
    model: String,
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default)]
    tools: Vec<Value>,
    #[serde(default)]
    user: Option<String>,
}

/// OpenAI Chat Completions over an app. With `x-agentd-session-id` it continues that session;
/// without, it starts a new session seeded with the earlier `messages` and names it in the
/// same header of the answer.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    params(("x-agentd-session-id" = Option<String>, Header, description = "Continue this session"), UserHeader),
    request_body = ChatRequest,
    responses((status = 200, description = "A `chat.completion` object, or with `stream: true` `chat.completion.chunk` SSE frames and `data: [DONE]`.",
        content((Object = "application/json"), (EventStream = "text/event-stream")),
        headers(("x-agentd-session-id" = String, description = "The session"))), OpenAiErrors))]
pub(super) async fn chat_completions(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Json(req): Json<ChatRequest>,
) -> ApiResult<Response> {
    check_app(&state.apps, &caller, &req.model)?;
    let user = resolve_user(&caller, &headers, req.user.as_deref())?;
    let tools = client_tools(&req.tools)?;
    let split = input_start(&req.messages);
    let bound = headers
        .get(SESSION_HEADER)
        .map(|v| v.to_str().map(str::to_string))
        .transpose()
        .map_err(|_| ApiError::bad_request("invalid_id", "x-agentd-session-id must be ASCII"))?;
    let bound_is_none = bound.is_none();
    let (key, parts) = match bound {
        Some(sid) => {
            crate::http::extract::validate_id("x-agentd-session-id", &sid)?;
            let key = SessionKey::new(req.model.clone(), user, sid);
            let open = calls_answered(&state, &key, &req.messages[split..]).await?;
            let parts = input_parts(&req.messages[split..], &open);
            (key, parts)
        }
        None => new_conversation(&state, &req.model, &user, &req.messages, &tools).await?,
    };
    if parts.is_empty() {
        return Err(no_input());
    }
    let handle = start_or_forget(
        &state,
        bound_is_none,
        turn(key.clone(), parts, req.stream, tools, OnDisconnect::Cancel),
    )
    .await?;
    let extra = run_headers(&handle.run_id, &handle.invocation_id, &key.session_id);
    let mut mapper = ChatStream::new(
        format!("chatcmpl-{}", handle.run_id),
        now_ts() as i64,
        req.model.clone(),
    );
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if !req.stream {
        let mut items = Box::pin(crate::http::frontend::kit::handle_items(&state, handle));
        let mut chunks = vec![mapper.start()];
        let mut status = RunStatus::Failed;
        while let Some(item) = items.next().await {
            if let RunItem::Done { status: s, .. } = item {
                status = s;
                break;
            }
            chunks.extend(mapper.item(&item));
        }
        chunks.extend(mapper.end(status, false));
        if let Some(e) = mapper.error() {
            return Ok((StatusCode::INTERNAL_SERVER_ERROR, extra, axum::Json(e)).into_response());
        }
        return Ok((extra, axum::Json(chat_completion(&mapper, &chunks))).into_response());
    }
    let first = data_frame(&mapper.start());
    let items = crate::http::frontend::kit::handle_items(&state, handle);
    let body = items.flat_map(move |item| {
        let out = match item {
            RunItem::Done { status, .. } => mapper.end(status, include_usage),
            item => mapper.item(&item),
        };
        stream::iter(out.iter().map(data_frame).collect::<Vec<_>>())
    });
    let frames = stream::iter([first])
        .chain(crate::http::frontend::kit::with_keep_alive(body))
        .chain(stream::iter([Bytes::from_static(b"data: [DONE]\n\n")]));
    Ok(sse_response(frames, extra))
}
