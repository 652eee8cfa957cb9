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

use super::map::{chat_completion, ChatStream, ResponseMeta, ResponsesStream};
use crate::auth::Caller;
use crate::event::{now_ts, Content, Event, FunctionCall, JsonMap, Part};
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::Query;
use crate::http::extract::{Json, Path};
use crate::http::frontend::kit::{
    answer_part, check_app, data_frame, open_calls, resolve_user, response_object, run_headers,
    sse_response, start_run, turn, waiting_calls,
};
use crate::http::openapi::{EventStream, OpenAiErrors, UserHeader};
use crate::http::AppState;
use crate::run::RunItem;
use crate::runner::{OnDisconnect, RunHandle, RunRequest};
use crate::store::{CancelRequest, NewSession, RunRecord, RunStatus, SessionKey};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The header that binds a Chat Completions call to a session.
pub const SESSION_HEADER: &str = "x-agentd-session-id";

/// Messages a new Chat Completions session may be seeded with.
const MAX_SEED_MESSAGES: usize = 1000;

/// How long a cancel waits for the run to stop before it answers.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(models))
        .routes(routes!(chat_completions))
        .routes(routes!(create_response))
        .routes(routes!(get_response))
        .routes(routes!(cancel_response))
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

/// The author of seeded assistant messages: the app's root agent (so the agent reads them as
/// its own turns).
fn root_agent(state: &AppState, app: &str) -> ApiResult<String> {
    match state.apps.get(app).map(|e| &e.tree) {
        Some(Ok(tree)) => Ok(tree.root().name().to_string()),
        Some(Err(e)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "app_load_failed",
            format!("Failed to load agent: {e}"),
        )),
        None => Err(crate::http::auth::app_hidden(app)),
    }
}

/// Text of an OpenAI message `content`: a string, or text parts.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// A `tool` message's content as a function response.
fn tool_output(content: &str) -> JsonMap {
    response_object(serde_json::from_str(content).unwrap_or_else(|_| Value::String(content.into())))
}

fn client_tools(tools: &[Value]) -> ApiResult<Vec<crate::model::ToolDeclaration>> {
    crate::http::frontend::kit::client_tools(tools.iter().filter_map(|t| {
        // Chat Completions nests the function; Responses has it flat.
        let f = t.get("function").unwrap_or(t);
        let name = f.get("name")?.as_str()?.to_string();
        let description = f
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Some((name, description, f.get("parameters").cloned()))
    }))
}

fn user_content(parts: Vec<Part>) -> Content {
    Content {
        parts,
        role: Some("user".into()),
        extra: JsonMap::new(),
    }
}

/// Events for the messages of a new session (a stateless client's earlier turns). Only calls
/// of the client's own tools (declared in this request) may be left for the client to answer;
/// ADK's internal functions (confirmations, credentials, transfer) may not be seeded at all,
/// as in an imported session: a forged confirmation would run a server tool.
fn seed_events(
    messages: &[Value],
    agent: &str,
    client_tools: &[crate::model::ToolDeclaration],
) -> ApiResult<Vec<Event>> {
    let inv = crate::event::new_invocation_id();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut events = vec![];
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let text = content_text(m.get("content"));
        match role {
            "user" if !text.is_empty() => {
                events.push(Event::new(&inv, "user").with_content(Content::text("user", text)));
            }
            "assistant" => {
                let mut parts = vec![];
                if !text.is_empty() {
                    parts.push(Part::text(text));
                }
                let mut ids = vec![];
                for c in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let (Some(id), Some(name)) = (
                        c.get("id").and_then(Value::as_str),
                        c["function"].get("name").and_then(Value::as_str),
                    ) else {
                        continue;
                    };
                    let args = c["function"]
                        .get("arguments")
                        .and_then(Value::as_str)
                        .and_then(|a| serde_json::from_str::<JsonMap>(a).ok())
                        .unwrap_or_default();
                    if crate::event::INTERNAL_FUNCTIONS.contains(&name) {
                        return Err(ApiError::bad_request(
                            "invalid_message",
                            format!("earlier messages cannot call the internal function {name}"),
                        ));
                    }
                    names.insert(id.into(), name.into());
                    if client_tools.iter().any(|t| t.name == name) {
                        ids.push(id.to_string());
                    }
                    parts.push(Part {
                        function_call: Some(FunctionCall {
                            id: Some(id.into()),
                            name: name.into(),
                            args,
                            extra: JsonMap::new(),
                        }),
                        ..Default::default()
                    });
                }
                if !parts.is_empty() {
                    let mut e = Event::new(&inv, agent).with_content(Content {
                        parts,
                        role: Some("model".into()),
                        extra: JsonMap::new(),
                    });
                    if !ids.is_empty() {
                        // The client resolves these: its answers are accepted later.
                        e.long_running_tool_ids = Some(ids);
                    }
                    events.push(e);
                }
            }
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if let Some(name) = names.get(id) {
                    let part = answer_part(id, name, tool_output(&text));
                    events.push(Event::new(&inv, "user").with_content(user_content(vec![part])));
                }
            }
            _ => {} // system and developer messages: the agent has its own instructions
        }
    }
    Ok(events)
}

/// Where the trailing input of `messages` starts: the last user message, or the `tool`
/// messages after the last assistant message.
fn input_start(messages: &[Value]) -> usize {
    let role = |i: usize| {
        messages[i]
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let mut i = messages.len();
    while i > 0 && role(i - 1) == "tool" {
        i -= 1;
    }
    if i == messages.len() && i > 0 && role(i - 1) == "user" {
        i -= 1;
    }
    i
}

/// The new input: tool answers for calls in `open`, and user text.
fn input_parts(messages: &[Value], open: &BTreeMap<String, String>) -> Vec<Part> {
    let mut parts = vec![];
    for m in messages {
        match m.get("role").and_then(Value::as_str) {
            Some("tool") => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if let Some(name) = open.get(id) {
                    parts.push(answer_part(
                        id,
                        name,
                        tool_output(&content_text(m.get("content"))),
                    ));
                }
            }
            Some("user") => {
                let text = content_text(m.get("content"));
                if !text.is_empty() {
                    parts.push(Part::text(text));
                }
            }
            _ => {}
        }
    }
    parts
}

/// The calls the session waits for, read only when `input` answers some.
async fn calls_answered(
    state: &AppState,
    key: &SessionKey,
    input: &[Value],
) -> ApiResult<BTreeMap<String, String>> {
    if input
        .iter()
        .any(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
    {
        open_calls(state, key).await
    } else {
        Ok(BTreeMap::new())
    }
}

fn no_input() -> ApiError {
    ApiError::bad_request(
        "no_new_input",
        "nothing to run: end the messages with a user message, or with tool messages that \
         answer the calls the session waits for",
    )
}

/// A stateless client's first request: a new session holding the earlier `messages`, and the
/// trailing input to run.
async fn new_conversation(
    state: &AppState,
    app: &str,
    user: &str,
    messages: &[Value],
    tools: &[crate::model::ToolDeclaration],
) -> ApiResult<(SessionKey, Vec<Part>)> {
    let split = input_start(messages);
    if split > MAX_SEED_MESSAGES {
        return Err(ApiError::bad_request(
            "too_many_messages",
            format!("a new conversation takes at most {MAX_SEED_MESSAGES} earlier messages"),
        ));
    }
    let seed = seed_events(&messages[..split], &root_agent(state, app)?, tools)?;
    let parts = input_parts(&messages[split..], &waiting_calls(&seed));
    if parts.is_empty() {
        return Err(no_input());
    }
    Ok((seeded_session(state, app, user, seed).await?, parts))
}

/// Creates a session seeded with `events`; its key.
async fn seeded_session(
    state: &AppState,
    app: &str,
    user: &str,
    events: Vec<Event>,
) -> ApiResult<SessionKey> {
    let session = state
        .store
        .create_session(NewSession {
            app_name: app.into(),
            user_id: user.into(),
            session_id: None,
            state: JsonMap::new(),
            events,
        })
        .await?;
    Ok(SessionKey::new(app, user, session.id))
}

/// Starts the run; if it does not start and its session was created for it, the session is
/// deleted again (a retried request must not leave a copy of the conversation each time).
async fn start_or_forget(state: &AppState, seeded: bool, req: RunRequest) -> ApiResult<RunHandle> {
    let key = req.key.clone();
    let started = start_run(state, req).await;
    if started.is_err() && seeded {
        if let Err(e) = state.store.delete_session(&key).await {
            tracing::warn!(error = %e, "could not delete the session of a run that did not start");
        }
    }
    started
}

// ------------------------------------------------------------------ Chat Completions

/// OpenAI's chat completion request (the fields agentd reads; others are ignored).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ChatCompletionRequest)]
struct ChatRequest {
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
async fn chat_completions(
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

// ------------------------------------------------------------------ Responses

/// OpenAI's create-response request (the fields agentd reads; others are ignored).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct CreateResponse {
    /// The app.
    model: String,
    /// A string, or a list of messages and `function_call_output` items.
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    tools: Vec<Value>,
    #[serde(default)]
    user: Option<String>,
}

/// `input` as Chat-style messages: a string is one user message; items are messages
/// (`role`, `content`) and `function_call_output`s (as `tool` messages).
fn input_messages(input: Option<&Value>) -> ApiResult<Vec<Value>> {
    match input {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::String(s)) => Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) => Ok(items
            .iter()
            .filter_map(|i| match i.get("type").and_then(Value::as_str) {
                Some("function_call_output") => {
                    let output = match i.get("output") {
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    };
                    Some(json!({"role": "tool", "tool_call_id": i.get("call_id"), "content": output}))
                }
                Some("function_call") => Some(json!({"role": "assistant", "tool_calls": [{
                    "id": i.get("call_id"), "type": "function",
                    "function": {"name": i.get("name"), "arguments": i.get("arguments")}}]})),
                Some("message") | None => i.get("role").map(|_| i.clone()),
                _ => None,
            })
            .collect()),
        Some(_) => Err(ApiError::bad_request(
            "invalid_input",
            "input must be a string or an array of input items",
        )),
    }
}

fn response_id(run_id: &str) -> String {
    format!("resp_{run_id}")
}

/// The run behind a response id, if the caller may see it: another user's response (the
/// authenticated user's, or the one `x-agentd-user-id` names) is "not found".
async fn response_run(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    id: &str,
) -> ApiResult<RunRecord> {
    let run_id = id.strip_prefix("resp_").unwrap_or(id);
    let named = headers
        .get(crate::http::frontend::kit::USER_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|_| caller.user_id.is_none() || caller.admin);
    state
        .runner
        .get_run(run_id)
        .await?
        .filter(|r| caller.may_access(&r.app_name, &r.user_id))
        .filter(|r| named.is_none_or(|u| u == r.user_id))
        .ok_or_else(|| {
            ApiError::not_found("response_not_found", format!("No response with id {id:?}"))
        })
}

fn meta_of(run: &RunRecord, background: Option<bool>, previous: Option<String>) -> ResponseMeta {
    ResponseMeta {
        id: response_id(&run.run_id),
        created_at: run.created_at as i64,
        model: run.app_name.clone(),
        background,
        previous_response_id: previous,
    }
}

/// The response as the stored events say, through the same mapping a stream uses.
async fn stored_response(state: &AppState, run: &RunRecord) -> ApiResult<Value> {
    let mut mapper = ResponsesStream::new(meta_of(run, None, None), false);
    let mut after = run.base_seq.unwrap_or(0);
    loop {
        let page = state
            .store
            .invocation_events(&run.key(), &run.invocation_id, after, 500)
            .await?;
        for e in &page {
            after = e.seq;
            mapper.item(&RunItem::Event {
                event: Box::new(e.event.clone()),
                seq: Some(e.seq),
            });
        }
        if page.len() < 500 {
            break;
        }
    }
    if run.status == RunStatus::Running {
        return Ok(mapper.response("in_progress"));
    }
    let end = mapper.end(run.status);
    Ok(end
        .last()
        .map(|e| e["response"].clone())
        .unwrap_or(Value::Null))
}

/// Responses events as SSE (`event:` names the type; no `[DONE]`), after `starting_after`.
fn response_frames(
    mut mapper: ResponsesStream,
    items: impl Stream<Item = RunItem> + Send + 'static,
    starting_after: Option<u64>,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let first = mapper.start();
    let body = items.flat_map(move |item| {
        let out = match item {
            RunItem::Done { status, .. } => mapper.end(status),
            item => mapper.item(&item),
        };
        stream::iter(out)
    });
    let events = stream::iter(first).chain(body).filter_map(move |e| {
        let keep =
            starting_after.is_none_or(|n| e["sequence_number"].as_u64().is_some_and(|s| s > n));
        futures::future::ready(keep.then(|| {
            Bytes::from(format!(
                "event: {}\ndata: {e}\n\n",
                e["type"].as_str().unwrap_or("message")
            ))
        }))
    });
    crate::http::frontend::kit::with_keep_alive(events)
}

/// OpenAI Responses over an app: streamed or not, `previous_response_id` continues that
/// response's session, `background: true` runs on after the request.
#[utoipa::path(post, path = "/v1/responses", tag = "openai",
    params(UserHeader),
    request_body = CreateResponse,
    responses((status = 200, description = "A `response` object, or with `stream: true` Responses events as SSE (`event:` + `data:`).",
        content((Object = "application/json"), (EventStream = "text/event-stream"))), OpenAiErrors))]
async fn create_response(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Json(req): Json<CreateResponse>,
) -> ApiResult<Response> {
    check_app(&state.apps, &caller, &req.model)?;
    let user = resolve_user(&caller, &headers, req.user.as_deref())?;
    let tools = client_tools(&req.tools)?;
    let messages = input_messages(req.input.as_ref())?;
    let (key, parts) = match &req.previous_response_id {
        Some(prev) => {
            let run = response_run(&state, &caller, &headers, prev).await?;
            if run.app_name != req.model || run.user_id != user {
                return Err(ApiError::not_found(
                    "response_not_found",
                    format!("No response with id {prev:?} for this model and user"),
                ));
            }
            let key = run.key();
            let open = calls_answered(&state, &key, &messages).await?;
            (key, input_parts(&messages, &open))
        }
        None => new_conversation(&state, &req.model, &user, &messages, &tools).await?,
    };
    if parts.is_empty() {
        return Err(no_input());
    }
    let handle: RunHandle = start_or_forget(
        &state,
        req.previous_response_id.is_none(),
        turn(
            key.clone(),
            parts,
            // A background response streams whole events only (see the module doc).
            req.stream && !req.background,
            tools,
            if req.background {
                OnDisconnect::Continue
            } else {
                OnDisconnect::Cancel
            },
        ),
    )
    .await?;
    let extra = run_headers(&handle.run_id, &handle.invocation_id, &key.session_id);
    let run = state
        .runner
        .get_run(&handle.run_id)
        .await?
        .ok_or_else(|| ApiError::internal("the run started but its row is missing"))?;
    if req.stream {
        // What a stream says is what a replay from the stored run can say again, byte for
        // byte: the request's own fields (background, previous_response_id) are not stored.
        let mapper = ResponsesStream::new(meta_of(&run, None, None), !req.background);
        let items = crate::http::frontend::kit::handle_items(&state, handle);
        return Ok(sse_response(response_frames(mapper, items, None), extra));
    }
    let meta = meta_of(&run, Some(req.background), req.previous_response_id.clone());
    let mapper = ResponsesStream::new(meta, true);
    if req.background {
        // The run goes on without this request (it does not cancel on disconnect).
        drop(handle);
        return Ok((extra, axum::Json(mapper.response("in_progress"))).into_response());
    }
    let mut mapper = mapper;
    mapper.start();
    let mut items = Box::pin(crate::http::frontend::kit::handle_items(&state, handle));
    let mut status = RunStatus::Failed;
    while let Some(item) = items.next().await {
        if let RunItem::Done { status: s, .. } = item {
            status = s;
            break;
        }
        mapper.item(&item);
    }
    let end = mapper.end(status);
    let response = end
        .last()
        .map(|e| e["response"].clone())
        .unwrap_or(Value::Null);
    Ok((extra, axum::Json(response)).into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct GetQuery {
    /// Stream the response's events (replayed, then live).
    #[serde(default)]
    stream: bool,
    /// With `stream`: only events with a larger `sequence_number`.
    #[serde(default)]
    starting_after: Option<u64>,
}

/// A response, or (`?stream=true`) its events from any replica, during or after the run.
#[utoipa::path(get, path = "/v1/responses/{response_id}", tag = "openai",
    params(("response_id" = String, Path), GetQuery, UserHeader),
    responses((status = 200, description = "The `response` object, or its events as SSE.",
        content((Object = "application/json"), (EventStream = "text/event-stream"))), OpenAiErrors))]
async fn get_response(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<GetQuery>,
) -> ApiResult<Response> {
    let run = response_run(&state, &caller, &headers, &id).await?;
    if !q.stream {
        return Ok(axum::Json(stored_response(&state, &run).await?).into_response());
    }
    let items = crate::http::frontend::kit::follow(&state, &run.run_id).await?;
    let mapper = ResponsesStream::new(meta_of(&run, None, None), false);
    let extra = run_headers(&run.run_id, &run.invocation_id, &run.session_id);
    Ok(sse_response(
        response_frames(mapper, items, q.starting_after),
        extra,
    ))
}

/// Cancels a background response; answers it as it ended.
#[utoipa::path(post, path = "/v1/responses/{response_id}/cancel", tag = "openai",
    params(("response_id" = String, Path), UserHeader),
    responses((status = 200, description = "The `response` object.", body = Object), OpenAiErrors))]
async fn cancel_response(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let run = response_run(&state, &caller, &headers, &id).await?;
    let req: CancelRequest =
        crate::http::routes::runs::cancel_request(&headers, Default::default())?;
    if run.status == RunStatus::Running {
        let mut sub = state.runner.bus().subscribe(&run.key());
        state.runner.cancel(&run.run_id, &req).await?;
        let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
        loop {
            let now = state.runner.get_run(&run.run_id).await?;
            if now.as_ref().is_none_or(|r| r.status != RunStatus::Running)
                || tokio::time::Instant::now() >= deadline
            {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), sub.rx.recv()).await;
        }
    }
    let run = response_run(&state, &caller, &headers, &id).await?;
    Ok(axum::Json(stored_response(&state, &run).await?).into_response())
}
