//! Running agents: ADK's `POST /run_sse` and `POST /run` (agentd's run control by run id is
//! in [`super::runs`]).
//!
//! Every pre-stream problem (bad body, unknown app, missing session, busy session) is a JSON
//! error before the first SSE byte. After that, problems arrive in the stream.

use super::background::background;
use super::run_request::{idempotent_prior, run_error, start_keyed, RunAgentRequest};
use super::runs::run_not_found;
use crate::auth::Caller;
use crate::event::Event;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::JsonBody;
use crate::http::openapi::{Errors, EventStream};
use crate::http::sse::{self, Framing, KEEP_ALIVE_EVERY};
use crate::http::AppState;
use crate::runner::{RunError, RunHandle};
use crate::store::RunStatus;
use crate::transcript::RunItem;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use std::convert::Infallible;
use std::time::Duration;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

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

fn sse_response(body: Body, headers: HeaderMap) -> Response {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    resp.headers_mut().extend(headers);
    resp
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
            without a client.", body = super::background::BackgroundRun), Errors))]
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
    let run_req = req.into_run_request(&caller, &state).await?;
    let key = run_req.key.clone();
    let (keyed, prior) = idempotent_prior(&state, &headers, &run_req, "/run_sse", &raw).await?;
    if let Some(run_id) = prior {
        return crate::http::sse::follow::replay_run(
            &state,
            &key.user_id,
            &run_id,
            Framing::Adk { split_artifacts },
        )
        .await;
    }
    let handle = match start_keyed(&state, run_req, keyed).await {
        Ok(handle) => handle,
        // ADK reports a missing message inside the stream (fixture 078), once the app and
        // the session have been checked.
        Err(RunError::NoMessage) => {
            let msg = format!(
                "{} Session: {}, User: {}",
                RunError::NoMessage,
                key.session_id,
                key.user_id
            );
            let frame = sse::adk_error_frame("ValueError", &msg);
            let body = Body::from_stream(stream::once(async move { Ok::<_, Infallible>(frame) }));
            return Ok(sse_response(body, HeaderMap::new()));
        }
        Err(e) => return Err(run_error(e)),
    };
    let headers = run_headers(&handle);
    let RunHandle { items, guard, .. } = handle;
    let open = crate::metrics::OpenStream::new();
    let frames = tokio_stream::wrappers::ReceiverStream::new(items).flat_map(move |item| {
        let _keep = (&guard, &open);
        stream::iter(
            sse::adk_frames(&item, split_artifacts)
                .into_iter()
                .map(Ok::<_, Infallible>),
        )
    });
    Ok(sse_response(Body::from_stream(frames.fuse()), headers))
}

fn run_headers(handle: &RunHandle) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&handle.run_id) {
        h.insert("x-agentd-run-id", v);
    }
    if let Ok(v) = HeaderValue::from_str(&handle.invocation_id) {
        h.insert("x-agentd-invocation-id", v);
    }
    h
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
            without a client.", body = super::background::BackgroundRun), Errors))]
async fn run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(req, raw): JsonBody<RunAgentRequest>,
) -> ApiResult<Response> {
    if req.background {
        return background(&state, &caller, &headers, req, "/run", &raw).await;
    }
    let run_req = req.into_run_request(&caller, &state).await?;
    let (keyed, prior) = idempotent_prior(&state, &headers, &run_req, "/run", &raw).await?;
    if let Some(run_id) = prior {
        let user = &run_req.key.user_id;
        if wants_json(&headers) {
            return replay_json(&state, user, &run_id).await;
        }
        return crate::http::sse::follow::replay_run(&state, user, &run_id, Framing::Agentd).await;
    }
    let handle = start_keyed(&state, run_req, keyed)
        .await
        .map_err(run_error)?;
    let mut resp_headers = run_headers(&handle);
    if wants_json(&headers) {
        return collect_json(handle, resp_headers).await;
    }
    resp_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp_headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    let RunHandle {
        run_id,
        user_id,
        invocation_id,
        items,
        guard,
    } = handle;
    let runner = state.runner.clone();
    let open = crate::metrics::OpenStream::new();
    let frames = stream::unfold(
        (items, false, (guard, open)),
        move |(mut items, done, guard)| {
            let (run_id, user_id, invocation_id) =
                (run_id.clone(), user_id.clone(), invocation_id.clone());
            let runner = runner.clone();
            async move {
                if done {
                    return None;
                }
                match tokio::time::timeout(KEEP_ALIVE_EVERY, items.recv()).await {
                    Err(_) => Some((Bytes::from_static(sse::KEEP_ALIVE), (items, false, guard))),
                    // The run dropped this client as a reader (it did not read while the run was
                    // stopping): its end is in the database, so the stream still ends with `done`.
                    Ok(None) => {
                        let record = runner
                            .get_user_run(&user_id, &run_id)
                            .await
                            .ok()
                            .flatten()?;
                        if record.status == RunStatus::Running {
                            return None;
                        }
                        let item = RunItem::Done {
                            status: record.status,
                            last_seq: record.last_seq,
                        };
                        let frame = sse::agentd_frame(&item, &run_id, &invocation_id);
                        Some((frame, (items, true, guard)))
                    }
                    Ok(Some(item)) => {
                        let last = matches!(item, RunItem::Done { .. });
                        let frame = sse::agentd_frame(&item, &run_id, &invocation_id);
                        Some((frame, (items, last, guard)))
                    }
                }
            }
        },
    )
    .map(Ok::<_, Infallible>);
    Ok(sse_response(Body::from_stream(frames.fuse()), resp_headers))
}

/// ADK `/run` semantics: wait for the end, answer every event (partials included) as JSON.
async fn collect_json(mut handle: RunHandle, headers: HeaderMap) -> ApiResult<Response> {
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
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "run_failed",
                    format!("{kind}: {message}"),
                ));
            }
            RunItem::Done { status, .. } => {
                if status == RunStatus::Cancelled {
                    return Err(ApiError::new(
                        StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
                        "run_cancelled",
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
        let full = page.len() == REPLAY_PAGE as usize;
        if let Some(last) = page.last() {
            after = last.seq;
        }
        events.extend(page);
        if !full {
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
