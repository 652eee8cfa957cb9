//! The Responses API: `POST /v1/responses` (streamed, not, or in the background), `GET` and
//! cancel by id, `previous_response_id` chains (naming an older response branches from it).

use super::conversation::*;
use crate::error_code::ErrorCode;

use super::map::{ResponseMeta, ResponsesStream};
use crate::auth::Caller;
use crate::event::Part;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::Query;
use crate::http::extract::{Json, Path};
use crate::http::frontend::kit::{check_app, resolve_user, turn};
use crate::http::openapi::error_set;
use crate::http::openapi::{EventStream, OpenAiErrors, UserHeader};
use crate::http::sse::event_stream as sse_response;
use crate::http::sse::run::{until_done, RunItems};
use crate::http::sse::run_headers;
use crate::http::AppState;
use crate::runner::{ForkPoint, OnDisconnect, RunHandle};
use crate::store::{CancelRequest, EventRange, RunRecord, RunStatus, SessionKey};
use crate::transcript::RunItem;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};

error_set!(
    /// What `POST /v1/responses` answers beyond the door's codes.
    CreateResponseErrors as "OpenAiErrorBody": AppNotFound, InvalidId, UserForbidden, UserRequired, ValidationError, TooManyTools, InvalidTool, InvalidInput, ResponseNotFound, TooManyMessages, InvalidMessage, NoNewInput, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout
);

error_set!(
    /// What `GET /v1/responses/{response_id}` answers beyond the door's codes.
    GetResponseErrors as "OpenAiErrorBody": ValidationError, ResponseNotFound
);

error_set!(
    /// What `POST /v1/responses/{response_id}/cancel` answers beyond the door's codes.
    CancelResponseErrors as "OpenAiErrorBody": ResponseNotFound, RunNotFound
);

// ------------------------------------------------------------------ Responses

/// OpenAI's create-response request (the fields agentd reads; others are ignored).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct CreateResponse {
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
        Some(_) => Err(ApiError::new(
            ErrorCode::InvalidInput,
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
    // The user, when the caller is one or names one: the run is then found with it (one
    // shard on Citus); an admin naming no one asks by id alone.
    let user = named.or(caller.user_id.as_deref().filter(|_| !caller.admin));
    let run = match user {
        Some(user) => state.runner.get_user_run(user, run_id).await?,
        None => state.runner.get_run(run_id).await?,
    };
    run.filter(|r| caller.may_access(&r.app_name, &r.user_id))
        .filter(|r| named.is_none_or(|u| u == r.user_id))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::ResponseNotFound,
                format!("No response with id {id:?}"),
            )
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
        for e in &page.events {
            after = e.seq;
            mapper.item(&RunItem::Event {
                event: Box::new(e.event.clone()),
                seq: Some(e.seq),
            });
        }
        if !page.has_more {
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

/// The session a response continues: its own while nothing but summaries came after it; when
/// the session went on after it (a later response, a rewind), a fork of the session as of
/// that response's end (a branch, as OpenAI does), so the session and its later responses
/// stay as they were.
async fn branch_from(state: &AppState, run: &RunRecord) -> ApiResult<SessionKey> {
    let key = run.key();
    let (Some(last), false) = (run.last_seq, run.status == RunStatus::Running) else {
        return Ok(key);
    };
    let head = state.store.session_head(&key).await?;
    if head.is_none_or(|h| h.last_seq <= last) {
        return Ok(key);
    }
    // Only a later turn or a rewind went on from it: a summary of older turns did not.
    let after = state
        .store
        .list_events(
            &key,
            EventRange {
                after: Some(last),
                before: None,
                limit: 100,
            },
        )
        .await?
        .map(|p| p.events)
        .unwrap_or_default();
    if after
        .iter()
        .all(|e| crate::transcript::compaction::compaction_of(&e.event).is_some())
    {
        return Ok(key);
    }
    let branch = format!("resp-branch-{}", uuid::Uuid::new_v4());
    state
        .runner
        .fork(&key, &branch, ForkPoint::AtSeq(last), None)
        .await
        .map_err(|e| ApiError::from(crate::runner::RunError::from(e)))?;
    tracing::info!(from = %key.session_id, session = %branch, seq = last, "response branched");
    Ok(SessionKey::new(&key.app_name, &key.user_id, branch))
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
    crate::http::sse::run::with_keep_alive(events)
}

/// OpenAI Responses over an app: streamed or not, `previous_response_id` continues that
/// response's session, `background: true` runs on after the request.
#[utoipa::path(post, path = "/v1/responses", tag = "openai",
    params(UserHeader),
    request_body = CreateResponse,
    responses((status = 200, description = "A `response` object, or with `stream: true` Responses events as SSE (`event:` + `data:`).",
        content((Object = "application/json"), (EventStream = "text/event-stream"))), OpenAiErrors, CreateResponseErrors))]
pub(super) async fn create_response(
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
            previous_turn(&state, &caller, &headers, &req, &user, prev, &messages).await?
        }
        None => new_conversation(&state, &req.model, &user, &messages, &tools).await?,
    };
    if parts.is_empty() {
        return Err(no_input());
    }
    // A background response streams whole events only (see the module doc) and goes on
    // without this request.
    let on_disconnect = match req.background {
        true => OnDisconnect::Continue,
        false => OnDisconnect::Cancel,
    };
    let streaming = req.stream && !req.background;
    let turn = turn(
        caller.api_key(),
        key.clone(),
        parts,
        streaming,
        tools,
        on_disconnect,
    );
    let new_session = req.previous_response_id.is_none();
    let handle: RunHandle = start_or_forget(&state, new_session, turn).await?;
    let extra = run_headers(&handle.run_id, &handle.invocation_id, Some(&key.session_id));
    let run = state
        .runner
        .get_user_run(&key.user_id, &handle.run_id)
        .await?
        .ok_or_else(|| ApiError::internal("the run started but its row is missing"))?;
    if req.stream {
        // What a stream says is what a replay from the stored run can say again, byte for
        // byte: the request's own fields (background, previous_response_id) are not stored.
        let mapper = ResponsesStream::new(meta_of(&run, None, None), !req.background);
        let items = crate::http::sse::run::items(&state, handle);
        return Ok(sse_response(response_frames(mapper, items, None), extra));
    }
    let meta = meta_of(&run, Some(req.background), req.previous_response_id.clone());
    let mapper = ResponsesStream::new(meta, true);
    if req.background {
        drop(handle);
        return Ok((extra, axum::Json(mapper.response("in_progress"))).into_response());
    }
    let items = crate::http::sse::run::items(&state, handle);
    Ok((extra, axum::Json(blocking(mapper, items).await)).into_response())
}

/// The session and the input of a response that continues `prev` (the caller's, for this
/// model and user): on a branch of its session when the session went on after it.
async fn previous_turn(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    req: &CreateResponse,
    user: &str,
    prev: &str,
    messages: &[Value],
) -> ApiResult<(SessionKey, Vec<Part>)> {
    let run = response_run(state, caller, headers, prev).await?;
    if run.app_name != req.model || run.user_id != user {
        return Err(ApiError::new(
            ErrorCode::ResponseNotFound,
            format!("No response with id {prev:?} for this model and user"),
        ));
    }
    let key = branch_from(state, &run).await?;
    let open = calls_answered(state, &key, messages).await?;
    let parts = input_parts(messages, &open);
    Ok((key, parts))
}

/// A `response` object once the run ends.
async fn blocking(mut mapper: ResponsesStream, items: RunItems) -> Value {
    mapper.start();
    let status = until_done(items, |item| {
        if !matches!(item, RunItem::Done { .. }) {
            mapper.item(&item);
        }
    })
    .await;
    let end = mapper.end(status);
    end.last()
        .map(|e| e["response"].clone())
        .unwrap_or(Value::Null)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct GetQuery {
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
        content((Object = "application/json"), (EventStream = "text/event-stream"))), OpenAiErrors, GetResponseErrors))]
pub(super) async fn get_response(
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
    let items = crate::http::sse::run::follow(&state, &run.user_id, &run.run_id, None).await?;
    let mapper = ResponsesStream::new(meta_of(&run, None, None), false);
    let extra = run_headers(&run.run_id, &run.invocation_id, Some(&run.session_id));
    Ok(sse_response(
        response_frames(mapper, items, q.starting_after),
        extra,
    ))
}

/// Cancels a background response; answers it as it ended.
#[utoipa::path(post, path = "/v1/responses/{response_id}/cancel", tag = "openai",
    params(("response_id" = String, Path), UserHeader),
    responses((status = 200, description = "The `response` object.", body = Object), OpenAiErrors, CancelResponseErrors))]
pub(super) async fn cancel_response(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let run = response_run(&state, &caller, &headers, &id).await?;
    let req: CancelRequest =
        crate::http::routes::runs::cancel_request(&headers, Default::default())?;
    if run.status == RunStatus::Running {
        state.runner.cancel(&run.user_id, &run.run_id, &req).await?;
        crate::http::routes::runs::wait_for_end(&state, run, CANCEL_WAIT.as_secs()).await?;
    }
    let run = response_run(&state, &caller, &headers, &id).await?;
    Ok(axum::Json(stored_response(&state, &run).await?).into_response())
}
