//! Vercel AI SDK `useChat` (`DefaultChatTransport`):
//!
//! - `POST /apps/{app}/chat`: the transport's body (`id` = session id, `messages`, `trigger`,
//!   `messageId`). Only the new input is taken from `messages` — the last user message, or the
//!   tool outputs and approvals in the last assistant message that answer calls the session is
//!   waiting for; the history comes from the session. `regenerate()` and an edited user
//!   message rewind the session to before the n-th user turn (n = the user messages sent) and
//!   run the message there. Answers the UI message stream.
//! - `GET /apps/{app}/chat/{chatId}/stream` (the transport's resume): 204 when the session
//!   has no active run; else the whole current assistant message, replayed from the stored
//!   events, then live.
//! - `POST /apps/{app}/chat/{chatId}/stop`: cancels the active run (a stop button). A client
//!   that merely goes away does not cancel, so it can resume.

use super::map::UiStream;
use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::event::{decode_base64_any, Blob, Bytes64, JsonMap, Part};
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{Json, Path};
use crate::http::frontend::kit::{
    answer_part, check_app, confirmation_answer, open_calls, resolve_user, response_object,
    start_run, turn,
};
use crate::http::openapi::error_set;
use crate::http::openapi::{AppPath, Errors, EventStream, UserHeader};
use crate::http::sse::event_stream as sse_response;
use crate::http::sse::run::json_frame as data_frame;
use crate::http::sse::run_headers;
use crate::http::AppState;
use crate::runner::{EditPoint, OnDisconnect, RunRequest};
use crate::store::RunRecord;
use crate::store::{EventRange, RunStatus, SessionKey, StoredEvent};
use crate::transcript::RunItem;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `POST /apps/{app}/chat` answers beyond the door's codes.
    ChatErrors: AppNotFound, InvalidId, UserForbidden, UserRequired, ValidationError, NoNewInput, InvalidFile, SessionNotFound, InvocationNotFound, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout
);

error_set!(
    /// What `GET /apps/{app}/chat/{chat_id}/stream` answers beyond the door's codes.
    ResumeErrors: AppNotFound, InvalidId, UserForbidden, UserRequired
);

error_set!(
    /// What `POST /apps/{app}/chat/{chat_id}/stop` answers beyond the door's codes.
    StopErrors: AppNotFound, InvalidId, UserForbidden, UserRequired
);

/// Sent by a client that wants ai 5's chunk set (no approval chunks): `5`.
pub const VERSION_HEADER: &str = "x-agentd-ai-sdk-version";

/// How many of the session's newest events a resume reads to find the current message.
const RESUME_WINDOW: u32 = 1000;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(chat))
        .routes(routes!(resume))
        .routes(routes!(stop))
}

/// `useChat`'s request body (extra keys from the app's `body` option are ignored).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = AiSdkChatRequest)]
struct ChatRequest {
    id: String,
    #[serde(default)]
    messages: Vec<UiMessage>,
    #[serde(default)]
    trigger: Option<String>,
    #[serde(default)]
    message_id: Option<String>,
    /// The user, when authentication is off and no `x-agentd-user-id` header is sent.
    #[serde(default)]
    user_id: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct UiMessage {
    #[serde(default)]
    id: Option<String>,
    /// `user`, `assistant` or `system`.
    role: String,
    /// The AI SDK's `UIMessage` parts (`text`, `file`, `tool-*`, …).
    #[serde(default)]
    parts: Vec<Value>,
}

fn approvals(headers: &HeaderMap) -> bool {
    headers
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
        .is_none_or(|major| major >= 6)
}

fn stream_headers(extra: HeaderMap) -> HeaderMap {
    let mut h = extra;
    h.insert(
        "x-vercel-ai-ui-message-stream",
        HeaderValue::from_static("v1"),
    );
    h
}

/// The user message's parts: text, and files (a `data:` URL inline, any other URL by
/// reference).
fn user_parts(parts: &[Value]) -> ApiResult<Vec<Part>> {
    let mut out = vec![];
    for p in parts {
        match p.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    out.push(Part::text(t));
                }
            }
            Some("file") => {
                let url = p.get("url").and_then(Value::as_str).unwrap_or_default();
                let mime = p
                    .get("mediaType")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if let Some(rest) = url.strip_prefix("data:") {
                    let Some((_, b64)) = rest.split_once(";base64,") else {
                        return Err(ApiError::new(
                            ErrorCode::InvalidFile,
                            "a file part's data: URL must be base64",
                        ));
                    };
                    let data = decode_base64_any(b64).ok_or_else(|| {
                        ApiError::new(
                            ErrorCode::InvalidFile,
                            "a file part's data: URL is not valid base64",
                        )
                    })?;
                    out.push(Part {
                        inline_data: Some(Blob {
                            data: Bytes64(data),
                            mime_type: mime,
                            display_name: p
                                .get("filename")
                                .and_then(Value::as_str)
                                .map(str::to_string),
                        }),
                        ..Default::default()
                    });
                } else if !url.is_empty() {
                    let mut file = JsonMap::new();
                    file.insert("fileUri".into(), Value::String(url.into()));
                    if let Some(m) = mime {
                        file.insert("mimeType".into(), Value::String(m));
                    }
                    let mut part = Part::default();
                    part.extra.insert("fileData".into(), Value::Object(file));
                    out.push(part);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The answers in the last assistant message to calls the session waits for: tool outputs
/// (`output-available`, `output-error`) and approvals (`approval-responded`).
fn answers(parts: &[Value], open: &std::collections::BTreeMap<String, String>) -> Vec<Part> {
    let mut out = vec![];
    for p in parts {
        let kind = p.get("type").and_then(Value::as_str).unwrap_or_default();
        if !(kind.starts_with("tool-") || kind == "dynamic-tool") {
            continue;
        }
        let call_id = p
            .get("toolCallId")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match p.get("state").and_then(Value::as_str) {
            Some("output-available") => {
                if let Some(name) = open.get(call_id) {
                    let output = p.get("output").cloned().unwrap_or(Value::Null);
                    out.push(answer_part(call_id, name, response_object(output)));
                }
            }
            Some("output-error") => {
                if let Some(name) = open.get(call_id) {
                    let text = p
                        .get("errorText")
                        .and_then(Value::as_str)
                        .unwrap_or("error");
                    let mut r = JsonMap::new();
                    r.insert("error".into(), Value::String(text.into()));
                    out.push(answer_part(call_id, name, r));
                }
            }
            Some("approval-responded") => {
                let approval = p.get("approval");
                let id = approval
                    .and_then(|a| a.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let approved = approval
                    .and_then(|a| a.get("approved"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                if open.contains_key(id) {
                    out.push(confirmation_answer(id, approved));
                }
            }
            _ => {}
        }
    }
    out
}

/// The AI SDK's `DefaultChatTransport` endpoint: the chat (`id`) is the session; the last user
/// message, or the tool outputs and approvals answering the calls the session waits for, is
/// the input. Answers a UI message stream.
#[utoipa::path(post, path = "/apps/{app}/chat", tag = "ai-sdk",
    params(AppPath, UserHeader,
        ("x-agentd-ai-sdk-version" = Option<String>, Header, description = "`5` for ai 5's chunk set (no approval chunks)")),
    request_body = ChatRequest,
    responses((status = 200, description = "UI message stream chunks as SSE `data:` frames, then `data: [DONE]`.",
        content_type = "text/event-stream", body = EventStream), Errors, ChatErrors))]
async fn chat(
    State(state): State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ChatRequest>,
) -> ApiResult<Response> {
    check_app(&state.apps, &caller, &app)?;
    let user = resolve_user(&caller, &headers, req.user_id.as_deref())?;
    crate::http::extract::validate_id("id", &req.id)?;
    let key = SessionKey::new(app, user, req.id.clone());
    let edit = edit_point(&req)?;
    let (parts, continued) = new_input(&state, &key, &req).await?;
    let handle = start_run(
        &state,
        RunRequest {
            edit,
            // A dropped connection is not a stop: the client can resume the stream.
            ..turn(
                caller.api_key(),
                key.clone(),
                parts,
                true,
                vec![],
                OnDisconnect::Continue,
            )
        },
    )
    .await?;
    let message_id = continued.unwrap_or_else(|| format!("msg_{}", handle.invocation_id));
    let ids = run_headers(&handle.run_id, &handle.invocation_id, Some(&key.session_id));
    let mapper = UiStream::new(message_id, approvals(&headers), true);
    let items = crate::http::sse::run::items(&state, handle);
    Ok(sse_response(ui_frames(mapper, items), stream_headers(ids)))
}

/// Where a chat goes back to first, if it does: `regenerate()` and an edited user message
/// (`sendMessage` with the user message's `messageId`) re-send the list up to that user
/// message, and the session goes back to before its turn and runs it, in one commit. An
/// assistant message of agentd's (`msg_{invocation}`) names its turn; otherwise the turn is
/// counted among the user messages sent.
fn edit_point(req: &ChatRequest) -> ApiResult<Option<EditPoint>> {
    let Some(last) = req.messages.last() else {
        return Err(ApiError::new(ErrorCode::NoNewInput, "messages is empty"));
    };
    let regenerate = req.trigger.as_deref() == Some("regenerate-message");
    if regenerate && last.role != "user" {
        return Err(ApiError::new(
            ErrorCode::NoNewInput,
            "a regenerated chat must end with the user message to answer again",
        ));
    }
    let edited = last.role == "user"
        && req.message_id.is_some()
        && req.message_id == last.id
        && req.trigger.as_deref() == Some("submit-message");
    let named = req
        .message_id
        .as_deref()
        .and_then(|id| id.strip_prefix("msg_"))
        .filter(|inv| inv.starts_with("e-"));
    Ok(match (regenerate, edited, named) {
        (true, _, Some(inv)) => Some(EditPoint::Invocation(inv.to_string())),
        (true, _, None) | (false, true, _) => Some(EditPoint::Turn(
            req.messages.iter().filter(|m| m.role == "user").count(),
        )),
        _ => None,
    })
}

/// The last message's new input: a user message's parts, or an assistant message's tool
/// outputs and approvals answering the calls the chat waits for (which continue that
/// assistant message: its id comes back).
async fn new_input(
    state: &AppState,
    key: &SessionKey,
    req: &ChatRequest,
) -> ApiResult<(Vec<Part>, Option<String>)> {
    let Some(last) = req.messages.last() else {
        return Err(ApiError::new(ErrorCode::NoNewInput, "messages is empty"));
    };
    let (parts, continued) = match last.role.as_str() {
        "user" => (user_parts(&last.parts)?, None),
        "assistant" => {
            let open = open_calls(state, key).await?;
            let id = req.message_id.clone().or_else(|| last.id.clone());
            (answers(&last.parts, &open), id)
        }
        other => {
            return Err(ApiError::new(
                ErrorCode::NoNewInput,
                format!("the last message must be the user's or an assistant message with tool outputs, not {other:?}"),
            ))
        }
    };
    if parts.is_empty() {
        return Err(ApiError::new(
            ErrorCode::NoNewInput,
            "the last message carries nothing to send: no text or file, and no tool output or \
             approval for a call the chat is waiting for",
        ));
    }
    Ok((parts, continued))
}

/// The chunks of `items` (ending at `Done`), as SSE, then `[DONE]`.
fn ui_frames(
    mut mapper: UiStream,
    items: impl Stream<Item = RunItem> + Send + 'static,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let start = stream::iter([data_frame(&mapper.start())]);
    // The item streams end after `Done` (the run, or the follower, drops its sender).
    let body = items.flat_map(move |item| {
        stream::iter(
            mapper
                .item(&item)
                .iter()
                .map(data_frame)
                .collect::<Vec<_>>(),
        )
    });
    start
        .chain(crate::http::sse::run::with_keep_alive(body))
        .chain(stream::iter([Bytes::from_static(b"data: [DONE]\n\n")]))
}

/// The session of chat `chat_id` of the caller's user.
fn chat_key(
    apps: &crate::apps::AppRegistry,
    caller: &Caller,
    headers: &HeaderMap,
    app: String,
    chat_id: String,
) -> ApiResult<SessionKey> {
    check_app(apps, caller, &app)?;
    let user = resolve_user(caller, headers, None)?;
    crate::http::extract::validate_id("chatId", &chat_id)?;
    Ok(SessionKey::new(app, user, chat_id))
}

/// Resumes the chat's current message (`resumeStream()`): the whole message so far, then
/// live; 204 when nothing is running.
#[utoipa::path(get, path = "/apps/{app}/chat/{chat_id}/stream", tag = "ai-sdk",
    params(AppPath, ("chat_id" = String, Path), UserHeader),
    responses((status = 200, description = "UI message stream chunks as SSE.", content_type = "text/event-stream", body = EventStream),
        (status = 204, description = "Nothing is running."), Errors, ResumeErrors))]
async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path((app, chat_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let key = chat_key(&state.apps, &caller, &headers, app, chat_id)?;
    let Some(run) = state
        .store
        .active_run(&key)
        .await?
        .filter(|r| r.status == RunStatus::Running)
    else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let Some((message_id, earlier)) = current_message(&state, &key, &run).await? else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let followed = crate::http::sse::run::follow(&state, &run.user_id, &run.run_id, None).await?;
    let earlier = stream::iter(earlier.into_iter().map(|e| RunItem::Event {
        event: Box::new(e.event),
        seq: Some(e.seq),
    }));
    let ids = run_headers(&run.run_id, &run.invocation_id, Some(&key.session_id));
    let mapper = UiStream::new(message_id, approvals(&headers), false);
    let items = earlier.chain(followed);
    Ok(sse_response(ui_frames(mapper, items), stream_headers(ids)))
}

/// The chat's current assistant message: its id, and its events committed before `run`
/// began (the message began after the last message the user typed; answers to tool calls
/// continue it). `None` when the session is gone.
async fn current_message(
    state: &AppState,
    key: &SessionKey,
    run: &RunRecord,
) -> ApiResult<Option<(String, Vec<StoredEvent>)>> {
    let Some(head) = state.store.session_head(key).await? else {
        return Ok(None);
    };
    let range = EventRange {
        after: None,
        before: Some(head.last_seq + 1),
        limit: RESUME_WINDOW,
    };
    let recent = state
        .store
        .list_events(key, range)
        .await?
        .map(|p| p.events)
        .unwrap_or_default();
    let base = run.base_seq.unwrap_or(0);
    let start = recent
        .iter()
        .rposition(|e| crate::transcript::rewind::is_user_turn(&e.event));
    Ok(Some(match start {
        Some(i) => (
            format!("msg_{}", recent[i].event.invocation_id),
            recent[i + 1..]
                .iter()
                .filter(|e| e.seq <= base)
                .cloned()
                .collect(),
        ),
        None => (format!("msg_{}", run.invocation_id), vec![]),
    }))
}

/// Stops the chat's running message (the run is cancelled); 204 when nothing is running.
#[utoipa::path(post, path = "/apps/{app}/chat/{chat_id}/stop", tag = "ai-sdk",
    params(AppPath, ("chat_id" = String, Path), UserHeader),
    responses((status = 202, description = "Cancelling: the run as it was when asked.", body = RunRecord),
        (status = 204, description = "Nothing is running."), Errors, StopErrors))]
async fn stop(
    State(state): State<AppState>,
    caller: Caller,
    Path((app, chat_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let key = chat_key(&state.apps, &caller, &headers, app, chat_id)?;
    let req = crate::http::routes::runs::cancel_request(&headers, Default::default())?;
    match state.runner.cancel_session(&key, &req).await? {
        Some(run) if run.status == RunStatus::Running => {
            Ok((StatusCode::ACCEPTED, axum::Json(run)).into_response())
        }
        _ => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}
