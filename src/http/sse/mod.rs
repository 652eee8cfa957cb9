//! Server-Sent Events framing for the two run endpoints.
//!
//! `/run_sse` is byte-exact ADK: `data: <compact JSON>\n\n` per event, one write per message,
//! no ids, no comments, no end marker; an error is one last `data: {"error": …}` message in
//! Python `json.dumps` spacing; an event with both content and an `artifactDelta` is sent
//! twice with the same id (content first with an empty delta, then the delta alone).
//!
//! agentd's `/run` adds what a production client needs: `id: <seq>` on committed events (the
//! resume point), `event: error`, a final `event: done` with the outcome and the last seq (so
//! a finished stream can be told from a dropped one), and keep-alive comments.

pub mod follow;
pub mod resume;
pub mod run;

use crate::error_code::ErrorCode;
use crate::event::{now_ts, Event};
use crate::transcript::RunItem;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use futures::Stream;
use serde_json::json;
use std::convert::Infallible;
use std::time::Duration;

fn data_frame(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

/// ADK `/run_sse` frames for one item (empty for `Done`: the stream just ends).
pub fn adk_frames(item: &RunItem, split_artifacts: bool) -> Vec<Bytes> {
    match item {
        RunItem::Event { event, .. } => {
            let has_content = event.content.as_ref().is_some_and(|c| !c.parts.is_empty());
            if split_artifacts && has_content && !event.actions.artifact_delta.is_empty() {
                let mut content_only = event.clone();
                content_only.actions.artifact_delta.clear();
                let mut delta_only = event.clone();
                delta_only.content = None;
                vec![event_frame(&content_only), event_frame(&delta_only)]
            } else {
                vec![event_frame(event)]
            }
        }
        RunItem::Error { kind, message } => vec![adk_error_frame(kind, message)],
        RunItem::Done { .. } => vec![],
    }
}

fn event_frame(event: &Event) -> Bytes {
    match serde_json::to_string(event) {
        Ok(json) => data_frame(&json),
        Err(e) => adk_error_frame("SerializationError", &e.to_string()),
    }
}

/// ADK's error message: produced by Python's `json.dumps`, hence the `": "`/`", "` spacing.
pub fn adk_error_frame(kind: &str, message: &str) -> Bytes {
    let s = |v: &str| serde_json::to_string(v).unwrap_or_else(|_| "\"\"".into());
    data_frame(&format!(
        "{{\"error\": {}, \"error_details\": {{\"error_type\": {}, \"error_message\": {}, \"timestamp\": {}}}}}",
        s(&format!("{kind}: {message}")),
        s(kind),
        s(message),
        now_ts()
    ))
}

/// agentd `/run` frames for one item.
pub fn agentd_frame(item: &RunItem, run_id: &str, invocation_id: &str) -> Bytes {
    match item {
        RunItem::Event { event, seq } => match (serde_json::to_string(event), seq) {
            (Ok(json), Some(seq)) => Bytes::from(format!("id: {seq}\ndata: {json}\n\n")),
            (Ok(json), None) => data_frame(&json),
            (Err(e), _) => error_frame("SerializationError", &e.to_string()),
        },
        RunItem::Error { kind, message } => error_frame(kind, message),
        RunItem::Done { status, last_seq } => {
            let body = json!({
                "runId": run_id, "invocationId": invocation_id,
                "status": status.as_str(), "lastSeq": last_seq,
            });
            Bytes::from(format!("event: done\ndata: {body}\n\n"))
        }
    }
}

fn error_frame(kind: &str, message: &str) -> Bytes {
    let body = json!({
        "error": format!("{kind}: {message}"), "code": ErrorCode::RunFailed.as_str(),
        "errorType": kind, "errorMessage": message,
    });
    Bytes::from(format!("event: error\ndata: {body}\n\n"))
}

/// Headers naming the run (and, for the frontends, its session).
pub fn run_headers(run_id: &str, invocation_id: &str, session_id: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    let named = [
        ("x-agentd-run-id", Some(run_id)),
        ("x-agentd-invocation-id", Some(invocation_id)),
        ("x-agentd-session-id", session_id),
    ];
    for (name, value) in named {
        if let Some(v) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
            h.insert(name, v);
        }
    }
    h
}

/// Sent on `/run` after a quiet period so proxies keep the connection open.
pub const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// An SSE response over `frames`, counted as an open stream while it lasts, with the headers
/// every stream wants (no caching, no proxy buffering).
pub fn event_stream(
    frames: impl Stream<Item = Bytes> + Send + 'static,
    extra: HeaderMap,
) -> Response {
    let open = crate::metrics::OpenStream::new();
    // Fused: a body may be polled again after its end (an encoding layer does), and most of
    // these streams are `unfold`s, which panic when polled after they ended.
    let frames = futures::StreamExt::fuse(frames);
    let body = Body::from_stream(futures::StreamExt::map(frames, move |f| {
        let _open = &open;
        Ok::<_, Infallible>(f)
    }));
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    h.extend(extra);
    resp
}

/// Quiet time on a run or session stream after which a keep-alive comment is sent.
pub const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(15);

/// How a followed run's items are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// agentd's `/run` frames (ids, keep-alives, `event: done`).
    Agentd,
    /// ADK's `/run_sse` frames (data only, no end marker).
    Adk { split_artifacts: bool },
}
