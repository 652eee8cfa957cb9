//! What the Chat Completions and Responses routes share: an OpenAI conversation turned into
//! a session (new, seeded with earlier messages, or continued) and its new input into a run.

use crate::error_code::ErrorCode;
use crate::event::{Content, Event, FunctionCall, JsonMap, Part};
use crate::http::error::{ApiError, ApiResult};
use crate::http::frontend::kit::{
    answer_part, open_calls, response_object, start_run, waiting_calls,
};
use crate::http::AppState;
use crate::runner::{RunHandle, RunRequest};
use crate::store::{NewSession, SessionKey};
use axum::http::StatusCode;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The header that binds a Chat Completions call to a session.
pub const SESSION_HEADER: &str = "x-agentd-session-id";

/// Messages a new Chat Completions session may be seeded with.
pub(super) const MAX_SEED_MESSAGES: usize = 1000;

/// How long a cancel waits for the run to stop before it answers.
pub(super) const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// The author of seeded assistant messages: the app's root agent (so the agent reads them as
/// its own turns).
pub(super) fn root_agent(state: &AppState, app: &str) -> ApiResult<String> {
    match state.apps.get(app).map(|e| &e.tree) {
        Some(Ok(tree)) => Ok(tree.root().name().to_string()),
        // The load error names files and quotes YAML: it goes to the log, not to the caller.
        Some(Err(e)) => {
            tracing::warn!(error = %e, "request refused: the app failed to load");
            Err(ApiError::new(
                ErrorCode::AppLoadFailed,
                format!("Failed to load agent: {}", crate::http::error::LOAD_FAILED),
            ))
        }
        None => Err(ApiError::app_not_found(app)),
    }
}

/// Text of an OpenAI message `content`: a string, or text parts.
pub(super) fn content_text(content: Option<&Value>) -> String {
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
pub(super) fn tool_output(content: &str) -> JsonMap {
    response_object(serde_json::from_str(content).unwrap_or_else(|_| Value::String(content.into())))
}

pub(super) fn client_tools(tools: &[Value]) -> ApiResult<Vec<crate::model::ToolDeclaration>> {
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

pub(super) fn user_content(parts: Vec<Part>) -> Content {
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
pub(super) fn seed_events(
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
                        return Err(ApiError::new(
                            ErrorCode::InvalidMessage,
                            format!("earlier messages cannot call the internal function {name}"),
                        )
                        .with_status(StatusCode::BAD_REQUEST));
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
pub(super) fn input_start(messages: &[Value]) -> usize {
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
pub(super) fn input_parts(messages: &[Value], open: &BTreeMap<String, String>) -> Vec<Part> {
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
pub(super) async fn calls_answered(
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

pub(super) fn no_input() -> ApiError {
    ApiError::new(
        ErrorCode::NoNewInput,
        "nothing to run: end the messages with a user message, or with tool messages that \
         answer the calls the session waits for",
    )
}

/// A stateless client's first request: a new session holding the earlier `messages`, and the
/// trailing input to run.
pub(super) async fn new_conversation(
    state: &AppState,
    app: &str,
    user: &str,
    messages: &[Value],
    tools: &[crate::model::ToolDeclaration],
) -> ApiResult<(SessionKey, Vec<Part>)> {
    let split = input_start(messages);
    if split > MAX_SEED_MESSAGES {
        return Err(ApiError::new(
            ErrorCode::TooManyMessages,
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
pub(super) async fn seeded_session(
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
pub(super) async fn start_or_forget(
    state: &AppState,
    seeded: bool,
    req: RunRequest,
) -> ApiResult<RunHandle> {
    let key = req.key.clone();
    let started = start_run(state, req).await;
    if started.is_err() && seeded {
        if let Err(e) = state.store.delete_session(&key).await {
            tracing::warn!(error = %e, "could not delete the session of a run that did not start");
        }
    }
    started
}
