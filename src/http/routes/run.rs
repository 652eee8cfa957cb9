//! Running agents: ADK's `POST /run_sse` and `POST /run` (agentd's run control by run id is
//! in [`super::runs`]).
//!
//! Every pre-stream problem (bad body, unknown app, missing session, busy session) is a JSON
//! error before the first SSE byte. After that, problems arrive in the stream.

use super::background::background;
use super::run_request::{open_run, Opening, RunAgentRequest};
use super::runs::run_not_found;
use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::event::Event;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::JsonBody;
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, EventStream};
use crate::http::sse::follow::replay_run;
use crate::http::sse::{self, Framing};
use crate::http::AppState;
use crate::runner::{RunError, RunHandle};
use crate::store::RunStatus;
use crate::transcript::RunItem;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures::stream;
use std::time::Duration;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `POST /run_sse` answers beyond the door's codes.
    RunSseErrors: AppNotFound, SessionNotFound, AppNameRequired, InvalidId, ValidationError, AppStateForbidden, EditAmbiguous, WebhookUrlInvalid, WebhookUrlRefused, WebhookEventUnknown, WebhookSecretRequired, WebhookSecretInvalid, InvalidIdempotencyKey, IdempotencyKeyReused, IdempotencyKeyInProgress, RunNotFound, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout, NewMessageRequired, InvocationNotFound, TurnNotFound, ArtifactTooLarge
);

error_set!(
    /// What `POST /run` answers beyond the door's codes.
    RunErrors: AppNotFound, SessionNotFound, AppNameRequired, InvalidId, ValidationError, AppStateForbidden, EditAmbiguous, WebhookUrlInvalid, WebhookUrlRefused, WebhookEventUnknown, WebhookSecretRequired, WebhookSecretInvalid, InvalidIdempotencyKey, IdempotencyKeyReused, IdempotencyKeyInProgress, RunNotFound, ShuttingDown, AppLoadFailed, TooManyRuns, BudgetExhausted, TooManyParts, SessionBusy, SessionBusyTimeout, NewMessageRequired, InvocationNotFound, TurnNotFound, ArtifactTooLarge, RunFailed, RunCancelled
);

/// Partial events a JSON-mode `/run` keeps for its answer, in bytes of text; beyond it, later
/// partials are left out (committed events are always kept).
const MAX_JSON_PARTIAL_BYTES: usize = 8 * 1024 * 1024;

/// Events per database read when a JSON-mode `/run` is replayed.
const REPLAY_PAGE: u32 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(run_sse))
        .routes(routes!(run))
}

/// ADK `/run_sse`.
///
/// Runs the agent and streams its events as `data: <Event JSON>` frames (partial events
/// included with `streaming: true`), ending when the run ends. A problem before the stream is
/// a JSON error; one during the run is an event with `errorCode`. `Idempotency-Key`: a repeat
/// with the same key and body re-attaches to the first run's stream.
#[utoipa::path(post, path = "/run_sse", tag = "runs",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "A repeat with this key and the same body re-attaches instead of running again")),
    request_body = RunAgentRequest,
    responses((status = 200, description = "The run's events, as SSE `data:` frames.",
        content_type = "text/event-stream", body = EventStream,
        headers(("x-agentd-run-id" = String, description = "The run (re-attach, cancel)"),
            ("x-agentd-invocation-id" = String))),
        (status = 202, description = "With `\"background\": true`: admitted; the run goes on \
            without a client.", body = super::background::BackgroundRun), Errors, RunSseErrors))]
async fn run_sse(
    state: axum::extract::State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(req, raw): JsonBody<RunAgentRequest>,
) -> ApiResult<Response> {
    if req.background {
        return background(&state, &caller, &headers, req, "/run_sse", &raw).await;
    }
    let split_artifacts = req.function_call_event_id.is_none();
    match open_run(&state, &caller, &headers, req, &raw, ("/run_sse", false)).await? {
        Opening::Repeat { user, run_id } => {
            let framing = Framing::Adk { split_artifacts };
            replay_run(&state, &user, &run_id, framing).await
        }
        // ADK reports a missing message inside the stream (fixture 078), once the app and
        // the session have been checked.
        Opening::Started {
            key,
            started: Err(RunError::NoMessage),
        } => {
            let msg = format!(
                "{} Session: {}, User: {}",
                RunError::NoMessage,
                key.session_id,
                key.user_id
            );
            let frame = sse::adk_error_frame("ValueError", &msg);
            Ok(sse::run::adk_stream(
                stream::iter([frame]),
                HeaderMap::new(),
            ))
        }
        Opening::Started { started, .. } => {
            Ok(sse::run::adk_response(&state, started?, split_artifacts))
        }
    }
}

/// True when the client asked for JSON and not for an event stream.
fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    accept.contains("application/json") && !accept.contains("text/event-stream")
}

/// agentd `/run`: SSE with ids, keep-alives and a final `event: done` by default; the ADK JSON
/// array of every event with `Accept: application/json`.
#[utoipa::path(post, path = "/run", tag = "runs",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "A repeat with this key and the same body re-attaches (or answers the first response)")),
    request_body = RunAgentRequest,
    responses((status = 200, description = "SSE frames `id: <seq>` + `data: <Event>` for committed events, \
            `data:` for partials, `event: error`, and a last `event: done` with the run's outcome; \
            or, with `Accept: application/json`, every event of the run as one array.",
        content((EventStream = "text/event-stream"), (Vec<Event> = "application/json")),
        headers(("x-agentd-run-id" = String, description = "The run (re-attach, cancel)"),
            ("x-agentd-invocation-id" = String))),
        (status = 202, description = "With `\"background\": true`: admitted; the run goes on \
            without a client.", body = super::background::BackgroundRun), Errors, RunErrors))]
async fn run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(req, raw): JsonBody<RunAgentRequest>,
) -> ApiResult<Response> {
    if req.background {
        return background(&state, &caller, &headers, req, "/run", &raw).await;
    }
    let json = wants_json(&headers);
    match open_run(&state, &caller, &headers, req, &raw, ("/run", false)).await? {
        Opening::Repeat { user, run_id } if json => replay_json(&state, &user, &run_id).await,
        Opening::Repeat { user, run_id } => {
            replay_run(&state, &user, &run_id, Framing::Agentd).await
        }
        Opening::Started { started, .. } if json => collect_json(started?).await,
        Opening::Started { started, .. } => Ok(sse::run::agentd_response(&state, started?)),
    }
}

/// ADK `/run` semantics: wait for the end, answer every event (partials included) as JSON.
async fn collect_json(mut handle: RunHandle) -> ApiResult<Response> {
    let headers = sse::run_headers(&handle.run_id, &handle.invocation_id, None);
    let mut events: Vec<Event> = vec![];
    let mut partial_bytes = 0usize;
    while let Some(item) = handle.items.recv().await {
        match item {
            RunItem::Event { event, seq: None } => {
                partial_bytes += event.text_len();
                if partial_bytes <= MAX_JSON_PARTIAL_BYTES {
                    events.push(*event);
                }
            }
            RunItem::Event { event, .. } => events.push(*event),
            RunItem::Error { kind, message } => {
                tracing::warn!(%kind, %message, "run failed (JSON mode)");
                // A budget spent mid-run is the user's limit, not the server's failure.
                let code = match kind.as_str() {
                    crate::model::BUDGET_EXHAUSTED => ErrorCode::BudgetExhausted,
                    _ => ErrorCode::RunFailed,
                };
                return Err(ApiError::new(code, format!("{kind}: {message}")));
            }
            RunItem::Done { status, .. } => {
                if status == RunStatus::Cancelled {
                    return Err(ApiError::new(
                        ErrorCode::RunCancelled,
                        "The run was cancelled.",
                    ));
                }
                break;
            }
        }
    }
    Ok((headers, axum::Json(events)).into_response())
}

/// A repeated JSON-mode `/run`: waits for the first run to end, then answers its committed
/// events (the first answer also had its partial events; a retry gets the durable ones).
async fn replay_json(state: &AppState, user: &str, run_id: &str) -> ApiResult<Response> {
    let mut record = state
        .runner
        .get_user_run(user, run_id)
        .await?
        .ok_or_else(run_not_found)?;
    // Ends only: every partial event of a followed run would wake this loop for a read.
    let mut sub = state.runner.bus().subscribe_ends(&record.key());
    while record.status == RunStatus::Running {
        let _ = tokio::time::timeout(Duration::from_secs(1), sub.rx.recv()).await;
        record = state
            .runner
            .get_user_run(user, run_id)
            .await?
            .ok_or_else(run_not_found)?;
    }
    // Page by page: no single read holds more than a page of a long run.
    let mut events = vec![];
    let mut after = record.base_seq.unwrap_or(0);
    loop {
        let page = state
            .store
            .invocation_events(&record.key(), &record.invocation_id, after, REPLAY_PAGE)
            .await?;
        if let Some(last) = page.events.last() {
            after = last.seq;
        }
        events.extend(page.events);
        if !page.has_more {
            break;
        }
    }
    if record.user_event && events.first().is_some_and(|e| e.event.author == "user") {
        events.remove(0);
    }
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&record.run_id) {
        headers.insert("x-agentd-run-id", v);
    }
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    let events: Vec<Event> = events.into_iter().map(|e| e.event).collect();
    Ok((headers, axum::Json(events)).into_response())
}
