//! `POST /v1/chat/completions`: a conversation resent whole (or continued by session id),
//! answered streamed or not.

use super::conversation::*;
use crate::error_code::ErrorCode;

use super::map::{chat_completion, ChatStream};
use crate::auth::Caller;
use crate::event::now_ts;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::Json;
use crate::http::frontend::kit::{check_app, resolve_user, turn};
use crate::http::openapi::error_set;
use crate::http::openapi::{EventStream, OpenAiErrors, UserHeader};
use crate::http::sse::event_stream as sse_response;
use crate::http::sse::run::{json_frame as data_frame, until_done, RunItems};
use crate::http::sse::run_headers;
use crate::http::AppState;
use crate::runner::OnDisconnect;
use crate::store::SessionKey;
use crate::transcript::RunItem;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::Value;

error_set!(
    /// What `POST /v1/chat/completions` answers beyond the door's codes.
    ChatCompletionsErrors as "OpenAiErrorBody": AppNotFound, InvalidId, UserForbidden, UserRequired, ValidationError, TooManyTools, InvalidTool, TooManyMessages, InvalidMessage, NoNewInput, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout
);

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
        headers(("x-agentd-session-id" = String, description = "The session"))), OpenAiErrors, ChatCompletionsErrors))]
pub(super) async fn chat_completions(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Json(req): Json<ChatRequest>,
) -> ApiResult<Response> {
    check_app(&state.apps, &caller, &req.model)?;
    let user = resolve_user(&caller, &headers, req.user.as_deref())?;
    let tools = client_tools(&req.tools)?;
    let bound = bound_session(&headers)?;
    let new_session = bound.is_none();
    let (key, parts) = match bound {
        Some(sid) => {
            let key = SessionKey::new(req.model.clone(), user, sid);
            let split = input_start(&req.messages);
            let open = calls_answered(&state, &key, &req.messages[split..]).await?;
            let parts = input_parts(&req.messages[split..], &open);
            (key, parts)
        }
        None => new_conversation(&state, &req.model, &user, &req.messages, &tools).await?,
    };
    if parts.is_empty() {
        return Err(no_input());
    }
    let api_key = caller.api_key();
    let run = turn(
        api_key,
        key.clone(),
        parts,
        req.stream,
        tools,
        OnDisconnect::Cancel,
    );
    let handle = start_or_forget(&state, new_session, run).await?;
    let extra = run_headers(&handle.run_id, &handle.invocation_id, Some(&key.session_id));
    let id = format!("chatcmpl-{}", handle.run_id);
    let mapper = ChatStream::new(id, now_ts() as i64, req.model.clone());
    let items = crate::http::sse::run::items(&state, handle);
    if !req.stream {
        return Ok(completion(mapper, items, extra).await);
    }
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(chunks(mapper, items, include_usage, extra))
}

/// The session `x-agentd-session-id` binds the request to, if it names one.
fn bound_session(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(v) = headers.get(SESSION_HEADER) else {
        return Ok(None);
    };
    let sid = v
        .to_str()
        .map_err(|_| ApiError::new(ErrorCode::InvalidId, "x-agentd-session-id must be ASCII"))?;
    crate::http::extract::validate_id("x-agentd-session-id", sid)?;
    Ok(Some(sid.to_string()))
}

/// A `chat.completion` once the run ends (a 500 with OpenAI's error object if it failed).
async fn completion(mut mapper: ChatStream, items: RunItems, extra: HeaderMap) -> Response {
    let mut chunks = vec![mapper.start()];
    let status = until_done(items, |item| {
        if !matches!(item, RunItem::Done { .. }) {
            chunks.extend(mapper.item(&item));
        }
    })
    .await;
    chunks.extend(mapper.end(status, false));
    if let Some(e) = mapper.error() {
        return (StatusCode::INTERNAL_SERVER_ERROR, extra, axum::Json(e)).into_response();
    }
    (extra, axum::Json(chat_completion(&mapper, &chunks))).into_response()
}

/// `chat.completion.chunk` frames as the run goes, then `data: [DONE]`.
fn chunks(
    mut mapper: ChatStream,
    items: RunItems,
    include_usage: bool,
    extra: HeaderMap,
) -> Response {
    let first = data_frame(&mapper.start());
    let body = items.flat_map(move |item| {
        let out = match item {
            RunItem::Done { status, .. } => mapper.end(status, include_usage),
            item => mapper.item(&item),
        };
        stream::iter(out.iter().map(data_frame).collect::<Vec<_>>())
    });
    let frames = stream::iter([first])
        .chain(crate::http::sse::run::with_keep_alive(body))
        .chain(stream::iter([Bytes::from_static(b"data: [DONE]\n\n")]));
    sse_response(frames, extra)
}
