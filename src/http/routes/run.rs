//! Running agents: ADK's `POST /run_sse` and `POST /run` (agentd's run control by run id is
//! in [`super::runs`]).
//!
//! Every pre-stream problem (bad body, unknown app, missing session, busy session) is a JSON
//! error before the first SSE byte. After that, problems arrive in the stream.

use super::runs::run_not_found;
use crate::agent::RunConfig;
use crate::auth::Caller;
use crate::event::{Content, Event, JsonMap};
use crate::http::auth::Gate;
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{JsonBody, Path};
use crate::http::idempotency::{self, Prior};
use crate::http::openapi::{Errors, EventStream, SessionPath};
use crate::http::sse::{self, Framing, KEEP_ALIVE_EVERY};
use crate::http::AppState;
use crate::run::RunItem;
use crate::runner::{OnBusy, OnDisconnect, RunError, RunHandle, RunRequest};
use crate::store::{RunRecord, RunStatus, SessionKey};
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use std::time::Duration;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The most `customMetadata` a run may carry, as JSON bytes.
pub const MAX_CUSTOM_METADATA_BYTES: usize = 64 * 1024;

/// Partial events a JSON-mode `/run` keeps for its answer, in bytes of text; beyond it, later
/// partials are left out (committed events are always kept).
const MAX_JSON_PARTIAL_BYTES: usize = 8 * 1024 * 1024;

/// Events per database read when a JSON-mode `/run` is replayed.
const REPLAY_PAGE: u32 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(run_sse))
        .routes(routes!(run))
        .routes(routes!(start_background_run))
}

/// ADK's `RunAgentRequest` plus agentd's additive fields.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentRequest {
    #[serde(default, alias = "app_name")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    app_name: Option<String>,
    #[serde(alias = "user_id")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    user_id: String,
    #[serde(alias = "session_id")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^/\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    session_id: String,
    #[serde(default, alias = "new_message")]
    new_message: Option<Content>,
    #[serde(default)]
    streaming: bool,
    #[serde(default, alias = "state_delta")]
    #[schema(value_type = Option<Object>)]
    state_delta: Option<JsonMap>,
    #[serde(default, alias = "function_call_event_id")]
    function_call_event_id: Option<String>,
    /// ADK's resume of an interrupted invocation: with no `newMessage`, the same as
    /// `resume: true`.
    #[serde(default, alias = "invocation_id")]
    invocation_id: Option<String>,
    /// agentd: execute tool calls an interrupted run left without a response first, then
    /// continue the agent's loop (`newMessage` may then be omitted).
    #[serde(default)]
    resume: bool,
    #[serde(default, alias = "custom_metadata")]
    #[schema(value_type = Option<Object>)]
    custom_metadata: Option<JsonMap>,
    #[serde(default, alias = "service_tier")]
    #[allow(dead_code)]
    service_tier: Option<String>,
    /// agentd: `reject` (default, 409), `enqueue` or `interrupt`.
    #[serde(default, alias = "on_busy")]
    on_busy: OnBusy,
    /// agentd: `cancel` (default) or `continue` when the client disconnects.
    #[serde(default, alias = "on_disconnect")]
    on_disconnect: OnDisconnect,
    /// agentd: create the session if it does not exist.
    #[serde(default, alias = "create_session")]
    create_session: bool,
    /// agentd: store inline blobs of the message as artifacts.
    #[serde(default, alias = "save_input_blobs_as_artifacts")]
    save_input_blobs_as_artifacts: bool,
    /// agentd: a shorter limit than the server's `--max-run-secs`.
    #[serde(default, alias = "max_duration_secs")]
    max_duration_secs: Option<u64>,
    /// agentd: run without a client: answered 202 with the run once it is admitted; the run
    /// goes on (bounded by `--max-run-secs`), and `GET /runs/{id}?wait=`,
    /// `POST /runs/{id}/wait` and `GET /runs/{id}/stream` follow it from any replica.
    #[serde(default)]
    background: bool,
}

impl RunAgentRequest {
    /// Validates the body and binds it to the caller: another user's session, or an app the
    /// caller may not use, answers as if it did not exist.
    fn into_run_request(self, caller: &Caller, gate: &Gate) -> ApiResult<RunRequest> {
        let app = self.app_name.ok_or_else(|| {
            ApiError::bad_request(
                "app_name_required",
                "app_name is required when ADK_DEFAULT_APP_NAME is not set",
            )
        })?;
        // The same id rule as the session routes (a run may create its session).
        crate::http::extract::validate_id("appName", &app)?;
        crate::http::extract::validate_id("userId", &self.user_id)?;
        crate::http::extract::validate_id("sessionId", &self.session_id)?;
        if !caller.may_use_app(&app) {
            return Err(crate::http::auth::app_hidden(&app));
        }
        if !caller.may_act_as(&self.user_id) {
            return Err(ApiError::session_not_found());
        }
        if let Some(delta) = &self.state_delta {
            crate::http::auth::check_app_state(gate, caller, delta.keys())?;
        }
        // Copied onto every event of the run: bounded.
        if let Some(m) = &self.custom_metadata {
            let size = serde_json::to_vec(m).map(|v| v.len()).unwrap_or(usize::MAX);
            if size > MAX_CUSTOM_METADATA_BYTES {
                return Err(ApiError::validation(vec![crate::http::error::problem(
                    "value_error",
                    vec!["body".into(), "customMetadata".into()],
                    format!(
                        "customMetadata is {size} bytes as JSON; the limit is \
                         {MAX_CUSTOM_METADATA_BYTES} (it is copied onto every event of the run)"
                    ),
                )]));
            }
        }
        let custom_metadata = self.custom_metadata.map(|mut m| {
            m.retain(|k, _| !k.starts_with("__adk_internal_"));
            m
        });
        let resume = self.resume || (self.invocation_id.is_some() && self.new_message.is_none());
        Ok(RunRequest {
            key: SessionKey::new(app, self.user_id, self.session_id),
            new_message: self.new_message,
            state_delta: self.state_delta,
            run_config: RunConfig {
                streaming: self.streaming,
                save_input_blobs_as_artifacts: self.save_input_blobs_as_artifacts,
                custom_metadata,
                resume,
                client_tools: vec![],
            },
            on_busy: self.on_busy,
            on_disconnect: self.on_disconnect,
            create_session: self.create_session,
            max_duration: self.max_duration_secs.map(Duration::from_secs),
        })
    }
}

pub fn run_error(e: RunError) -> ApiError {
    match e {
        RunError::AppNotFound(app) => super::apps::app_not_found(&app),
        // The load error names files and quotes YAML: it is in the log, and in `list-apps`
        // for callers who may see it.
        RunError::AppBroken(m) => {
            tracing::warn!(error = %m, "run refused: the app failed to load");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "app_load_failed",
                format!("Failed to load agent: {}", super::apps::LOAD_FAILED),
            )
        }
        RunError::SessionNotFound(sid) => {
            ApiError::not_found("session_not_found", format!("Session not found: {sid}"))
        }
        e @ RunError::NoMessage => ApiError::bad_request("new_message_required", e.to_string()),
        RunError::Busy(active) => ApiError::conflict(
            "session_busy",
            format!(
                "The session already has an active run ({active}). Retry later, or send \
                 \"onBusy\": \"enqueue\" or \"interrupt\"."
            ),
        ),
        e @ RunError::QueueTimeout(_) => ApiError::conflict("session_busy_timeout", e.to_string()),
        RunError::ShuttingDown => ApiError::unavailable(
            "shutting_down",
            "The server is shutting down; retry on another replica.",
            1,
        ),
        e @ RunError::TooManyRuns(_) => ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_runs",
                e.to_string(),
            )
        },
        RunError::Internal(m) => ApiError::internal(m),
        RunError::Store(e) => e.into(),
    }
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

/// With an `Idempotency-Key`: the prior run to replay, if this is a repeat.
async fn idempotent_prior(
    state: &AppState,
    headers: &HeaderMap,
    req: &RunRequest,
    route: &str,
    raw: &[u8],
) -> ApiResult<(Option<idempotency::Keyed>, Option<String>)> {
    let scope = idempotency::scope(&req.key.app_name, &req.key.user_id);
    let Some(keyed) = idempotency::keyed(headers, scope, route, raw)? else {
        return Ok((None, None));
    };
    match idempotency::claim(state, &keyed).await? {
        Prior::New => Ok((Some(keyed), None)),
        Prior::Run(run) => Ok((None, Some(run))),
        Prior::Response(..) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "This Idempotency-Key was used with a different request; use a new key.",
        )),
    }
}

/// Starts the run; with a key, records the run on it (or gives the key up if nothing started).
async fn start_keyed(
    state: &AppState,
    req: RunRequest,
    keyed: Option<idempotency::Keyed>,
) -> Result<RunHandle, RunError> {
    let started = state.runner.start_run(req).await;
    if let Some(k) = keyed {
        match &started {
            Ok(handle) => {
                if let Err(e) = state.store.key_run(&k.scope, &k.key, &handle.run_id).await {
                    tracing::warn!(error = %e, "could not record the run on its idempotency key");
                }
            }
            Err(_) => idempotency::release(state, &k).await,
        }
    }
    started
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
            ("x-agentd-invocation-id" = String))), Errors))]
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
    let run_req = req.into_run_request(&caller, &state.gate)?;
    let key = run_req.key.clone();
    let (keyed, prior) = idempotent_prior(&state, &headers, &run_req, "/run_sse", &raw).await?;
    if let Some(run_id) = prior {
        return crate::http::sse::follow::replay_run(
            &state,
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
            ("x-agentd-invocation-id" = String))), Errors))]
async fn run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(req, raw): JsonBody<RunAgentRequest>,
) -> ApiResult<Response> {
    if req.background {
        return background(&state, &caller, &headers, req, "/run", &raw).await;
    }
    let run_req = req.into_run_request(&caller, &state.gate)?;
    let (keyed, prior) = idempotent_prior(&state, &headers, &run_req, "/run", &raw).await?;
    if let Some(run_id) = prior {
        if wants_json(&headers) {
            return replay_json(&state, &run_id).await;
        }
        return crate::http::sse::follow::replay_run(&state, &run_id, Framing::Agentd).await;
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
        invocation_id,
        items,
        guard,
    } = handle;
    let runner = state.runner.clone();
    let open = crate::metrics::OpenStream::new();
    let frames = stream::unfold(
        (items, false, (guard, open)),
        move |(mut items, done, guard)| {
            let (run_id, invocation_id) = (run_id.clone(), invocation_id.clone());
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
                        let record = runner.get_run(&run_id).await.ok().flatten()?;
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

/// A run started without a client, as `POST …/sessions/{id}/runs` and `"background": true`
/// answer it (202).
#[derive(Debug, Serialize, ToSchema)]
pub struct BackgroundRun {
    #[serde(flatten)]
    run: RunRecord,
    links: RunLinks,
}

/// Where to follow a background run (any replica).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunLinks {
    /// `GET`: the run (`?wait=N` long-polls for its end).
    #[serde(rename = "self")]
    this: String,
    /// `POST`: wait for its end.
    wait: String,
    /// `GET`: its events, replayed then live (`/run`'s frames).
    stream: String,
    /// `POST`: cancel it.
    cancel: String,
}

/// Admits the run exactly as `/run` does (same body, same errors before anything starts,
/// `onBusy`, `Idempotency-Key`), then answers 202 with the run and lets it go on alone.
async fn background(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    req: RunAgentRequest,
    route: &str,
    raw: &[u8],
) -> ApiResult<Response> {
    let mut run_req = req.into_run_request(caller, &state.gate)?;
    // Nobody reads this run's stream: a client that "goes away" must not cancel it.
    run_req.on_disconnect = OnDisconnect::Continue;
    let (keyed, prior) = idempotent_prior(state, headers, &run_req, route, raw).await?;
    let (run_id, replayed) = match prior {
        Some(run_id) => (run_id, true),
        None => {
            let handle = start_keyed(state, run_req, keyed)
                .await
                .map_err(run_error)?;
            // Dropping the items leaves the run without a reader; it goes on by itself.
            (handle.run_id, false)
        }
    };
    let run = state
        .runner
        .get_run(&run_id)
        .await?
        .ok_or_else(super::runs::run_not_found)?;
    let links = RunLinks {
        this: format!("/runs/{run_id}"),
        wait: format!("/runs/{run_id}/wait"),
        stream: format!("/runs/{run_id}/stream"),
        cancel: format!("/runs/{run_id}/cancel"),
    };
    let mut resp_headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&links.this) {
        resp_headers.insert(header::LOCATION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&run.run_id) {
        resp_headers.insert("x-agentd-run-id", v);
    }
    if let Ok(v) = HeaderValue::from_str(&run.invocation_id) {
        resp_headers.insert("x-agentd-invocation-id", v);
    }
    if replayed {
        resp_headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok((
        StatusCode::ACCEPTED,
        resp_headers,
        axum::Json(BackgroundRun { run, links }),
    )
        .into_response())
}

/// Starts a run on the session without a client (a background run): admitted exactly as
/// `POST /run` (same body; `appName`, `userId` and `sessionId` come from the path and, if the
/// body names them too, must match), answered 202 with the run and where to follow it.
#[utoipa::path(post, path = "/apps/{app}/users/{user}/sessions/{session}/runs", tag = "runs",
    params(SessionPath,
        ("Idempotency-Key" = Option<String>, Header,
        description = "A repeat with this key and the same body answers the first run")),
    request_body = RunAgentRequest,
    responses((status = 202, description = "Admitted; the run goes on without a client.",
        body = BackgroundRun), Errors))]
async fn start_background_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, user, session)): Path<(String, String, String)>,
    headers: HeaderMap,
    JsonBody(body, raw): JsonBody<serde_json::Value>,
) -> ApiResult<Response> {
    let serde_json::Value::Object(mut body) = body else {
        return Err(ApiError::validation(vec![crate::http::error::problem(
            "model_attributes_type",
            vec!["body".into()],
            "the body must be a JSON object (a run request)",
        )]));
    };
    for (field, alias, value) in [
        ("appName", "app_name", &app),
        ("userId", "user_id", &user),
        ("sessionId", "session_id", &session),
    ] {
        for name in [field, alias] {
            match body.get(name) {
                Some(serde_json::Value::String(v)) if v == value => {}
                None => {}
                Some(_) => {
                    return Err(ApiError::validation(vec![crate::http::error::problem(
                        "value_error",
                        vec!["body".into(), name.into()],
                        format!("{name} must be absent or {value:?} (the path names the session)"),
                    )]))
                }
            }
            body.remove(name);
        }
        body.insert(field.into(), serde_json::Value::String(value.clone()));
    }
    let req: RunAgentRequest =
        crate::http::extract::parse_json(&serde_json::to_vec(&body).unwrap_or_default())?;
    // The session is in the path, not the body: it is part of what a key's request was.
    let route = format!("/sessions/{session}/runs");
    background(&state, &caller, &headers, req, &route, &raw).await
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
async fn replay_json(state: &AppState, run_id: &str) -> ApiResult<Response> {
    let mut record = state
        .runner
        .get_run(run_id)
        .await?
        .ok_or_else(run_not_found)?;
    let sub = state.runner.bus().subscribe(&record.key());
    let mut sub = sub;
    while record.status == RunStatus::Running {
        let _ = tokio::time::timeout(Duration::from_secs(1), sub.rx.recv()).await;
        record = state
            .runner
            .get_run(run_id)
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
