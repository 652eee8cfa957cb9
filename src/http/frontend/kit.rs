//! What every frontend protocol shares: who the user is, which app, a turn as a run request,
//! the calls waiting for the client, text bookkeeping between partial and complete events,
//! and the stream plumbing (keep-alives, a guaranteed end, run headers).

use crate::agent::RunConfig;
use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::event::REQUEST_CONFIRMATION;
use crate::event::{Event, JsonMap};
use crate::http::error::{ApiError, ApiResult};
use crate::http::AppState;
use crate::model::ToolDeclaration;
use crate::runner::{OnBusy, OnDisconnect, RunHandle, RunRequest};
use crate::store::{EventRange, SessionKey};
use axum::http::HeaderMap;
use serde_json::Value;
use std::collections::BTreeMap;

/// The header naming the user when authentication is off (or an admin key acts for a user).
pub const USER_HEADER: &str = "x-agentd-user-id";

/// How many of a session's newest events are read to find the calls waiting for the client.
pub const OPEN_CALL_WINDOW: u32 = 500;

/// Tools a client may declare with one request.
pub const MAX_CLIENT_TOOLS: usize = 64;

/// Who a frontend request acts for. With authentication the caller's own user (an admin key
/// may name another with the header or the body's user field); without it the
/// `x-agentd-user-id` header, else the body's user field, else a 400 saying so.
pub fn resolve_user(
    caller: &Caller,
    headers: &HeaderMap,
    body_user: Option<&str>,
) -> ApiResult<String> {
    let header = headers
        .get(USER_HEADER)
        .map(|v| {
            v.to_str().map(str::to_string).map_err(|_| {
                ApiError::new(
                    ErrorCode::InvalidId,
                    "x-agentd-user-id must be printable ASCII",
                )
            })
        })
        .transpose()?;
    // A key that names another user in the header is a backend expecting to act for its end
    // users: without an admin key that would put them all under one user, so it is refused.
    // (The protocols' body user fields are advisory, as OpenAI's `user` is: ignored.)
    if let (Some(own), Some(named)) = (&caller.user_id, &header) {
        if !caller.admin && named != own {
            return Err(ApiError::new(
                ErrorCode::UserForbidden,
                format!(
                    "this key acts for user {own:?}; only an admin key may act for another user \
                     (x-agentd-user-id)"
                ),
            ));
        }
    }
    let named = header.or_else(|| body_user.map(str::to_string));
    let user = match (&caller.user_id, named) {
        (Some(_), Some(named)) if caller.admin && !named.is_empty() => named,
        (Some(own), _) => own.clone(),
        (None, Some(named)) => named,
        (None, None) => {
            return Err(ApiError::new(
                ErrorCode::UserRequired,
                "Say which user this is: send the x-agentd-user-id header (or the protocol's \
                 user field), or authenticate with an API key or a JWT.",
            ))
        }
    };
    crate::http::extract::validate_id("user", &user)?;
    Ok(user)
}

/// The app a request names, if it exists and the caller may use it (else 404, the same for
/// both, so a key limited to some apps cannot learn the others' names).
pub fn check_app(apps: &crate::apps::AppRegistry, caller: &Caller, app: &str) -> ApiResult<()> {
    crate::http::extract::validate_id("app", app)?;
    if !caller.may_use_app(app) || apps.get(app).is_none() {
        return Err(crate::http::auth::app_hidden(apps, caller, app));
    }
    Ok(())
}

/// A frontend's turn as a run request: the new input as the user's message, the session
/// created on demand, a busy session refused (409), charged to the caller's API key.
pub fn turn(
    api_key: Option<crate::usage::ChargedKey>,
    key: SessionKey,
    parts: Vec<crate::event::Part>,
    streaming: bool,
    client_tools: Vec<crate::model::ToolDeclaration>,
    on_disconnect: OnDisconnect,
) -> RunRequest {
    RunRequest {
        key,
        new_message: Some(crate::event::Content {
            parts,
            role: Some("user".into()),
            extra: JsonMap::new(),
        }),
        state_delta: None,
        run_config: RunConfig {
            streaming,
            client_tools,
            ..Default::default()
        },
        on_busy: OnBusy::Reject,
        on_disconnect,
        create_session: true,
        max_duration: None,
        webhook: None,
        run_id: None,
        edit: None,
        api_key,
    }
}

/// Starts a run, mapping pre-stream failures to the same JSON errors as `/run`.
pub async fn start_run(state: &AppState, req: RunRequest) -> ApiResult<RunHandle> {
    state.runner.start_run(req).await.map_err(ApiError::from)
}

/// Function calls in the session still waiting for an answer from the client (long-running
/// calls, client tools, confirmation requests): call id → tool name. Only these may be
/// answered by a frontend request, so a replayed history cannot inject tool results.
pub async fn open_calls(state: &AppState, key: &SessionKey) -> ApiResult<BTreeMap<String, String>> {
    Ok(waiting_calls(
        &recent_events(state, key, OPEN_CALL_WINDOW).await?,
    ))
}

/// The session's newest `limit` events, oldest first (none if the session does not exist).
pub async fn recent_events(
    state: &AppState,
    key: &SessionKey,
    limit: u32,
) -> ApiResult<Vec<Event>> {
    let Some(head) = state.store.session_head(key).await? else {
        return Ok(vec![]);
    };
    let page = state
        .store
        .list_events(
            key,
            EventRange {
                after: None,
                before: Some(head.last_seq + 1),
                limit,
            },
        )
        .await?;
    Ok(page
        .map(|p| p.events.into_iter().map(|e| e.event).collect())
        .unwrap_or_default())
}

/// The calls in `events` that wait for the client: listed in `longRunningToolIds` and not
/// answered by a later function response.
pub fn waiting_calls(events: &[Event]) -> BTreeMap<String, String> {
    let mut open = BTreeMap::new();
    // A call in a rewound turn waits for nothing.
    let live = crate::transcript::rewind::live(events);
    for e in events.iter().zip(live).filter(|(_, l)| *l).map(|(e, _)| e) {
        let long: &[String] = e.long_running_tool_ids.as_deref().unwrap_or(&[]);
        for c in e.function_calls() {
            if let Some(id) = &c.id {
                if long.contains(id) {
                    open.insert(id.clone(), c.name.clone());
                }
            }
        }
        for r in e.function_responses() {
            if let Some(id) = &r.id {
                open.remove(id);
            }
        }
    }
    open
}

/// A tool's output as a function response body: objects as they are, anything else as
/// `{"result": value}` (ADK's rule).
pub fn response_object(value: serde_json::Value) -> JsonMap {
    match value {
        serde_json::Value::Object(m) => m,
        other => {
            let mut m = JsonMap::new();
            m.insert("result".into(), other);
            m
        }
    }
}

/// The answer to a confirmation request (`adk_request_confirmation`).
pub fn confirmation_answer(id: &str, approved: bool) -> crate::event::Part {
    let mut response = JsonMap::new();
    response.insert("confirmed".into(), serde_json::Value::Bool(approved));
    crate::event::Part {
        function_response: Some(crate::event::FunctionResponse {
            id: Some(id.to_string()),
            name: REQUEST_CONFIRMATION.into(),
            response,
            extra: JsonMap::new(),
        }),
        ..Default::default()
    }
}

/// A function response part answering call `id`.
pub fn answer_part(id: &str, name: &str, response: JsonMap) -> crate::event::Part {
    crate::event::Part {
        function_response: Some(crate::event::FunctionResponse {
            id: Some(id.to_string()),
            name: name.to_string(),
            response,
            extra: JsonMap::new(),
        }),
        ..Default::default()
    }
}

/// The non-thought text of an event's parts.
pub fn answer_text(event: &Event) -> String {
    event
        .content
        .iter()
        .flat_map(|c| c.parts.iter())
        .filter(|p| p.thought != Some(true))
        .filter_map(|p| p.text.as_deref())
        .collect()
}

/// The thought text of an event's parts.
pub fn thought_text(event: &Event) -> String {
    event
        .content
        .iter()
        .flat_map(|c| c.parts.iter())
        .filter(|p| p.thought == Some(true))
        .filter_map(|p| p.text.as_deref())
        .collect()
}

/// What a protocol still has to send of an event's text: partial chunks stream as they come;
/// the complete event then adds only what the chunks did not carry (usually nothing). If the
/// complete text does not extend what was streamed (an after-model callback rewrote it), no
/// protocol can take text back: nothing more is sent, and the stored text wins on replay.
///
/// Bounded whatever the agent streams: per event only the streamed length and a running
/// SHA-256 of it are kept, for the newest [`STREAMED_EVENTS`] events.
#[derive(Default)]
pub struct Streamed {
    by_event: std::collections::VecDeque<(String, usize, sha2::Sha256)>,
}

/// Events whose streamed text a mapping remembers (partial-only events never complete).
const STREAMED_EVENTS: usize = 32;

impl std::fmt::Debug for Streamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamed")
            .field("events", &self.by_event.len())
            .finish()
    }
}

impl Streamed {
    /// Records a partial chunk of `event_id`.
    pub fn partial(&mut self, event_id: &str, chunk: &str) {
        use sha2::Digest;
        if let Some((_, len, hash)) = self.by_event.iter_mut().find(|(id, ..)| id == event_id) {
            *len += chunk.len();
            hash.update(chunk.as_bytes());
            return;
        }
        if self.by_event.len() == STREAMED_EVENTS {
            self.by_event.pop_front();
        }
        let mut hash = sha2::Sha256::new();
        hash.update(chunk.as_bytes());
        self.by_event
            .push_back((event_id.to_string(), chunk.len(), hash));
    }

    /// The part of `full` not yet sent for `event_id` (forgetting the event).
    pub fn rest(&mut self, event_id: &str, full: &str) -> String {
        use sha2::Digest;
        let Some(i) = self.by_event.iter().position(|(id, ..)| id == event_id) else {
            return full.to_string();
        };
        let Some((_, len, hash)) = self.by_event.remove(i) else {
            return full.to_string();
        };
        let sent_prefix = full
            .get(..len)
            .is_some_and(|prefix| sha2::Sha256::digest(prefix.as_bytes()) == hash.finalize());
        if sent_prefix {
            full[len..].to_string()
        } else {
            tracing::debug!(
                event = event_id,
                "complete text differs from the streamed text"
            );
            String::new()
        }
    }
}

/// The client tools, checked: bounded in number, with names a model accepts.
pub fn client_tools(
    tools: impl IntoIterator<Item = (String, String, Option<Value>)>,
) -> ApiResult<Vec<ToolDeclaration>> {
    let mut out: Vec<ToolDeclaration> = vec![];
    for (name, description, parameters) in tools {
        if out.len() == MAX_CLIENT_TOOLS {
            return Err(ApiError::new(
                ErrorCode::TooManyTools,
                format!("at most {MAX_CLIENT_TOOLS} client tools per request"),
            ));
        }
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(ApiError::new(
                ErrorCode::InvalidTool,
                format!(
                    "tool name {name:?} must be 1 to 64 characters of a-z, A-Z, 0-9, '_' or '-'"
                ),
            ));
        }
        if crate::event::INTERNAL_FUNCTIONS.contains(&name.as_str())
            || name == crate::tools::builtin::TRANSFER_TO_AGENT
        {
            return Err(ApiError::new(
                ErrorCode::InvalidTool,
                format!("{name:?} is a name agentd reserves; choose another"),
            ));
        }
        if out.iter().any(|t| t.name == name) {
            return Err(ApiError::new(
                ErrorCode::InvalidTool,
                format!("tool {name:?} is declared twice"),
            ));
        }
        out.push(ToolDeclaration {
            name,
            description,
            parameters: parameters.filter(|p| p.is_object()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_complete_text_adds_only_what_the_chunks_did_not_carry() {
        let mut s = Streamed::default();
        s.partial("e1", "Hel");
        s.partial("e1", "lo ");
        assert_eq!(s.rest("e1", "Hello world"), "world");
        // Forgotten once complete; an event never streamed is sent whole.
        assert_eq!(s.rest("e1", "Hello world"), "Hello world");
        // A rewritten text cannot be taken back: nothing more.
        s.partial("e2", "secret");
        assert_eq!(s.rest("e2", "[redacted]"), "");
        // A multi-byte boundary that does not match is a mismatch, not a panic.
        s.partial("e3", "é");
        assert_eq!(s.rest("e3", "aé"), "");
    }

    #[test]
    fn remembered_events_are_bounded() {
        let mut s = Streamed::default();
        for i in 0..1000 {
            s.partial(&format!("e{i}"), "x");
        }
        assert_eq!(s.by_event.len(), STREAMED_EVENTS);
        assert_eq!(s.rest("e0", "x"), "x", "the oldest was forgotten");
        assert_eq!(s.rest("e999", "xy"), "y");
    }
}
