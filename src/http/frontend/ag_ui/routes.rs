//! AG-UI: `POST /apps/{app}/ag-ui` takes a `RunAgentInput` (`threadId` = session id, `runId`
//! echoed back, `messages`, `state`, `tools`, `forwardedProps`) and answers AG-UI events over
//! SSE (see [`super::map`]).
//!
//! The client re-sends the whole history every run; the session is the truth, so only the
//! new input is taken: the trailing user message, and trailing tool messages that answer
//! calls the session waits for. A user message whose id is already an event id of the session
//! (the ids `MESSAGES_SNAPSHOT` gave the client) is not run again — unless the re-sent thread
//! leaves the stored one after the newest message both hold (an edited or regenerated
//! message): then the session is rewound to before the first stored message the client no
//! longer has, and the trailing user message runs there, in one commit. Changed `state` keys are
//! applied with the run; `tools` are offered to the agent as client-resolved tools. A client
//! that goes away cancels the run (AG-UI has no resume).

use super::map::{messages, new_input, state_delta, AgUiStream};
use crate::auth::Caller;
use crate::event::{JsonMap, Part};
use crate::http::error::ApiResult;
use crate::http::extract::{Json, Path};
use crate::http::frontend::kit::{check_app, open_calls, recent_events, resolve_user, start_run};
use crate::http::openapi::error_set;
use crate::http::openapi::{AppPath, Errors, EventStream, UserHeader};
use crate::http::sse::event_stream as sse_response;
use crate::http::sse::run::json_frame as data_frame;
use crate::http::sse::run_headers;
use crate::http::AppState;
use crate::runner::{EditPoint, OnDisconnect, RunHandle, RunRequest};
use crate::store::{EventRange, RunStatus, SessionKey};
use crate::transcript::RunItem;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use futures::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `POST /apps/{app}/ag-ui` answers beyond the door's codes.
    RunErrors: AppNotFound, InvalidId, UserForbidden, UserRequired, ValidationError, TooManyTools, InvalidTool, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout
);

/// The longest thread (in events) that gets a closing `MESSAGES_SNAPSHOT` (it replaces the
/// client's transcript, so it is sent only when it holds the whole thread).
const SNAPSHOT_EVENTS: u32 = 200;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(run))
}

/// AG-UI's `RunAgentInput`: the thread is the session.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct RunAgentInput {
    thread_id: String,
    run_id: String,
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    state: Option<Value>,
    #[serde(default)]
    tools: Vec<ClientTool>,
    #[serde(default)]
    forwarded_props: Option<Value>,
}

/// A tool the frontend runs.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct ClientTool {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    parameters: Option<Value>,
}

/// How many of the client's newest messages may meet the session's: the trailing user
/// message itself (a regenerate) or the message before it (an edit). A client whose copy meets
/// the session's further back holds messages the session never stored under their ids (a turn
/// that failed before a snapshot gave it the event ids): that is not an edit.
const MATCH_TRIES: usize = 2;

/// How many events after that meeting point are read to find where the copies part.
const DIVERGE_WINDOW: u32 = 200;

/// Where a re-sent thread leaves the stored one: the invocation of the first stored message,
/// after the message both hold, that the client no longer has (it edited or regenerated from
/// there). Only the client's last two messages are matched ([`MATCH_TRIES`]). `None` when the
/// client has everything up to that message, or neither of them is a stored event.
async fn diverged(
    state: &AppState,
    key: &SessionKey,
    messages: &[Value],
) -> ApiResult<Option<String>> {
    // Tool result messages are `{event}:{call}`.
    let event_id = |id: &str| id.split(':').next().unwrap_or(id).to_string();
    let ids: Vec<String> = messages
        .iter()
        .filter_map(|m| m.get("id").and_then(Value::as_str))
        .map(event_id)
        .collect();
    let mut met = None;
    for id in ids.iter().rev().take(MATCH_TRIES) {
        if let Some(e) = state.store.find_event(key, id).await? {
            met = Some(e);
            break;
        }
    }
    let Some(met) = met else { return Ok(None) };
    let after = state
        .store
        .list_events(
            key,
            EventRange {
                after: Some(met.seq),
                before: None,
                limit: DIVERGE_WINDOW,
            },
        )
        .await?
        .map(|p| p.events)
        .unwrap_or_default();
    let events: Vec<_> = after.into_iter().map(|e| e.event).collect();
    let live = crate::transcript::rewind::live(&events);
    Ok(events
        .iter()
        .zip(live)
        .filter(|(e, l)| *l && !ids.contains(&e.id))
        .find(|(e, _)| !messages_of(e).is_empty())
        .map(|(e, _)| e.invocation_id.clone()))
}

fn messages_of(e: &crate::event::Event) -> Vec<Value> {
    messages(std::slice::from_ref(e))
}

/// Runs the agent on the thread's trailing user message (or tool results) and streams AG-UI
/// events: `RUN_STARTED` … `RUN_FINISHED` or `RUN_ERROR`.
#[utoipa::path(post, path = "/apps/{app}/ag-ui", tag = "ag-ui", operation_id = "ag_ui_run",
    params(AppPath, UserHeader),
    request_body = RunAgentInput,
    responses((status = 200, description = "AG-UI events as SSE `data:` frames.",
        content_type = "text/event-stream", body = EventStream), Errors, RunErrors))]
async fn run(
    State(state): State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
    headers: HeaderMap,
    Json(input): Json<RunAgentInput>,
) -> ApiResult<Response> {
    check_app(&state.apps, &caller, &app)?;
    let body_user = input
        .forwarded_props
        .as_ref()
        .and_then(|p| p.get("userId"))
        .and_then(Value::as_str);
    let user = resolve_user(&caller, &headers, body_user)?;
    crate::http::extract::validate_id("threadId", &input.thread_id)?;
    crate::http::extract::validate_id("runId", &input.run_id)?;
    let key = SessionKey::new(app, user, input.thread_id.clone());
    let turn = read_turn(&state, &key, &input).await?;
    let mapper = AgUiStream::new(input.thread_id.clone(), input.run_id.clone(), true);
    if turn.parts.is_empty() {
        let frames: Vec<_> = mapper.empty().iter().map(data_frame).collect();
        return Ok(sse_response(stream::iter(frames), HeaderMap::new()));
    }
    let tools = crate::http::frontend::kit::client_tools(
        input
            .tools
            .into_iter()
            .map(|t| (t.name, t.description, t.parameters)),
    )?;
    let mut start_state = turn.state;
    start_state.extend(turn.delta.clone());
    let handle = start_run(
        &state,
        RunRequest {
            state_delta: (!turn.delta.is_empty()).then_some(turn.delta),
            edit: turn.edit.map(EditPoint::Invocation),
            ..crate::http::frontend::kit::turn(
                caller.api_key(),
                key.clone(),
                turn.parts,
                true,
                tools,
                OnDisconnect::Cancel,
            )
        },
    )
    .await?;
    Ok(respond(state, key, mapper, &start_state, handle))
}

/// What a re-sent thread asks of the session.
struct Turn {
    /// The session's state now.
    state: JsonMap,
    /// The new input (trailing tool answers, or the trailing user message); empty: nothing new.
    parts: Vec<Part>,
    /// The session's own keys the client changed.
    delta: JsonMap,
    /// The invocation to go back before (an edited or regenerated message).
    edit: Option<String>,
}

/// Reads what the thread adds to the session: tool answers for the calls it waits for, a user
/// message it has not run (or one to run again where the thread left the stored one), and
/// changed state.
async fn read_turn(state: &AppState, key: &SessionKey, input: &RunAgentInput) -> ApiResult<Turn> {
    let head = state.store.session_head(key).await?;
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_string);
    let last = input.messages.last().and_then(role);
    // The session's events are read only when the input answers tool calls.
    let open = match (last.as_deref(), &head) {
        (Some("tool"), Some(_)) => open_calls(state, key).await?,
        _ => Default::default(),
    };
    // A thread that left the stored one (an edited or regenerated message) goes back to
    // where it left it, and runs its trailing user message there.
    let edit = match (&head, last.as_deref()) {
        (Some(_), Some("user")) => diverged(state, key, &input.messages).await?,
        _ => None,
    };
    // A user message whose id is an event id (the ids `MESSAGES_SNAPSHOT` gave the client)
    // was run before.
    let id = input.messages.last().and_then(|m| m.get("id")?.as_str());
    let seen = match (id, &head, last.as_deref()) {
        (Some(id), Some(_), Some("user")) if edit.is_none() => {
            state.store.find_event(key, id).await?.is_some()
        }
        _ => false,
    };
    let current = head.map(|h| h.state).unwrap_or_default();
    Ok(Turn {
        parts: new_input(&input.messages, &open, seen),
        delta: state_delta(&current, input.state.as_ref()),
        state: current,
        edit,
    })
}

/// The run's AG-UI events: `RUN_STARTED` with the starting state, the run's, and at its end
/// the state and message snapshots (read when it completed).
fn respond(
    state: AppState,
    key: SessionKey,
    mapper: AgUiStream,
    start_state: &JsonMap,
    handle: RunHandle,
) -> Response {
    let extra = run_headers(&handle.run_id, &handle.invocation_id, Some(&key.session_id));
    let first: Vec<Value> = mapper.start(start_state);
    let items = crate::http::sse::run::items(&state, handle);
    let rest = stream::unfold(Some((mapper, items, state, key)), |st| async move {
        let (mut mapper, mut items, app, key) = st?;
        match items.next().await? {
            RunItem::Done { status, .. } => {
                let (final_state, transcript) = snapshots(&app, &key, status).await;
                Some((mapper.end(status, final_state.as_ref(), transcript), None))
            }
            item => {
                let out = mapper.item(&item);
                Some((out, Some((mapper, items, app, key))))
            }
        }
    })
    .flat_map(|events| stream::iter(events.iter().map(data_frame).collect::<Vec<_>>()));
    let frames = stream::iter(first.iter().map(data_frame).collect::<Vec<_>>())
        .chain(crate::http::sse::run::with_keep_alive(rest));
    sse_response(frames, extra)
}

/// The state and the transcript the run's end sends: they replace the client's copies, so
/// only a completed run's, and the transcript only when read in full.
async fn snapshots(
    app: &AppState,
    key: &SessionKey,
    status: RunStatus,
) -> (Option<JsonMap>, Option<Vec<Value>>) {
    if status != RunStatus::Completed {
        return (None, None);
    }
    let head = app.store.session_head(key).await.ok().flatten();
    let events = recent_events(app, key, SNAPSHOT_EVENTS + 1).await.ok();
    let transcript = events
        .filter(|e| e.len() <= SNAPSHOT_EVENTS as usize)
        .map(|e| messages(&e));
    (head.map(|h| h.state), transcript)
}
