//! A run as a stream, for every route and protocol: its items (live from a [`RunHandle`], or
//! followed from any replica) always end with [`RunItem::Done`], however the source stops; the
//! frames get keep-alives; the response names the run. The protocols' pure mappings
//! (`frontend/*/map.rs`, [`super::agentd_frame`], [`super::adk_frames`]) only turn items into
//! frames.

use super::{adk_frames, agentd_frame, event_stream, run_headers, KEEP_ALIVE, KEEP_ALIVE_EVERY};
use crate::http::error::ApiResult;
use crate::http::AppState;
use crate::runner::RunHandle;
use crate::store::RunStatus;
use crate::transcript::RunItem;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use std::pin::Pin;
use std::time::Duration;

/// A run's items, boxed: what the protocols' mappers consume.
pub type RunItems = Pin<Box<dyn Stream<Item = RunItem> + Send>>;

/// How long a stream that lost its source waits for the run's end to be recorded.
const END_WAIT: Duration = Duration::from_secs(5);

/// The items of a run this request started, keeping the run's disconnect guard alive (dropping
/// the response, when the client went away, cancels the run if it asked for that); no end is
/// added (ADK's `/run_sse` has none).
fn live(handle: RunHandle) -> impl Stream<Item = RunItem> + Send + 'static {
    let RunHandle { items, guard, .. } = handle;
    tokio_stream::wrappers::ReceiverStream::new(items).map(move |i| {
        let _keep = &guard;
        i
    })
}

/// The items of a run this request started, always ending with `Done` (see [`with_end`]).
pub fn items(state: &AppState, handle: RunHandle) -> RunItems {
    let (user, run_id) = (handle.user_id.clone(), handle.run_id.clone());
    let live = with_follow_on(state.clone(), user.clone(), run_id.clone(), live(handle));
    Box::pin(with_end(state.clone(), user, run_id, live))
}

/// Follows run `run_id` of `user` after its committed seq `after` (from its start when
/// `None`): from the database, then live, ending with `Done`. Works for a run on any replica,
/// running or not; a protocol that already sent a snapshot up to `after` goes on from it.
pub async fn follow(
    state: &AppState,
    user: &str,
    run_id: &str,
    after: Option<i64>,
) -> ApiResult<RunItems> {
    let rx = super::follow::follow_run_items(state, user, run_id, after).await?;
    let items = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Box::pin(with_end(
        state.clone(),
        user.to_string(),
        run_id.to_string(),
        items,
    )))
}

/// The live items of a run this replica runs, and when they stop without `Done` while the run
/// is still running (a draining replica handed it over to another), the run followed where it
/// now runs, from the last committed seq the client got: one stream, one run, one end. The
/// stream keeps this replica's shutdown waiting (up to its grace) until it ends.
fn with_follow_on(
    state: AppState,
    user: String,
    run_id: String,
    items: impl Stream<Item = RunItem> + Send + 'static,
) -> impl Stream<Item = RunItem> + Send + 'static {
    struct Source {
        items: Pin<Box<dyn Stream<Item = RunItem> + Send>>,
        last: Option<i64>,
        followed: bool,
        /// Keeps this replica's drain waiting while the stream follows a handed-over run.
        shutdown_wait: Option<tokio_util::task::task_tracker::TaskTrackerToken>,
    }
    let start = Source {
        items: Box::pin(items),
        last: None,
        followed: false,
        shutdown_wait: Some(state.runner.handover_stream()),
    };
    futures::stream::unfold(Some(start), move |st| {
        let (state, user, run_id) = (state.clone(), user.clone(), run_id.clone());
        async move {
            let mut src = st?;
            loop {
                match src.items.next().await {
                    Some(item @ RunItem::Done { .. }) => return Some((item, None)),
                    Some(item) => {
                        if let RunItem::Event { seq: Some(seq), .. } = &item {
                            src.last = Some(*seq);
                        }
                        return Some((item, Some(src)));
                    }
                    None if !src.followed => {
                        let running = matches!(
                            state.runner.get_user_run(&user, &run_id).await,
                            Ok(Some(r)) if r.status == RunStatus::Running
                        );
                        if !running {
                            return None;
                        }
                        let followed =
                            super::follow::follow_run_items(&state, &user, &run_id, src.last)
                                .await
                                .ok()?;
                        src = Source {
                            items: Box::pin(tokio_stream::wrappers::ReceiverStream::new(followed)),
                            last: src.last,
                            followed: true,
                            shutdown_wait: src.shutdown_wait,
                        };
                    }
                    None => return None,
                }
            }
        }
    })
}

/// `items`, ending with `Done` even when the source stopped first (a reader dropped for not
/// reading, a follower stopped by shutdown or a failed read): every protocol then still
/// closes its message. The end is read from the run's row, and if the run is still going,
/// the stream ends with an error saying so (the client can re-attach where its protocol
/// allows).
fn with_end(
    state: AppState,
    user: String,
    run_id: String,
    items: impl Stream<Item = RunItem> + Send + 'static,
) -> impl Stream<Item = RunItem> + Send + 'static {
    let source = Box::pin(items);
    let steps = futures::stream::unfold(Some(source), move |st| {
        let (state, user, run_id) = (state.clone(), user.clone(), run_id.clone());
        async move {
            let mut source = st?;
            match source.next().await {
                Some(item @ RunItem::Done { .. }) => Some((vec![item], None)),
                Some(item) => Some((vec![item], Some(source))),
                None => Some((recorded_end(&state, &user, &run_id).await, None)),
            }
        }
    });
    steps.flat_map(futures::stream::iter)
}

async fn recorded_end(state: &AppState, user: &str, run_id: &str) -> Vec<RunItem> {
    let deadline = tokio::time::Instant::now() + END_WAIT;
    loop {
        match state.runner.get_user_run(user, run_id).await {
            Ok(Some(r)) if r.status != RunStatus::Running => {
                return vec![RunItem::Done {
                    status: r.status,
                    last_seq: r.last_seq,
                }]
            }
            _ if tokio::time::Instant::now() >= deadline => break,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    vec![
        RunItem::Error {
            kind: "stream_interrupted".into(),
            message: "this stream ended before the run did".into(),
        },
        RunItem::Done {
            status: RunStatus::Interrupted,
            last_seq: None,
        },
    ]
}

/// Feeds `items` to `f` up to and including `Done`; the run's status (`Interrupted` if the
/// items ended without one, which [`items`] and [`follow`] never do).
pub async fn until_done(mut items: RunItems, mut f: impl FnMut(RunItem) + Send) -> RunStatus {
    while let Some(item) = items.next().await {
        let end = match &item {
            RunItem::Done { status, .. } => Some(*status),
            _ => None,
        };
        f(item);
        if let Some(status) = end {
            return status;
        }
    }
    RunStatus::Interrupted
}

/// `frames`, with a comment line after every quiet [`KEEP_ALIVE_EVERY`] so proxies keep the
/// connection (every client here ignores comments).
pub fn with_keep_alive(
    frames: impl Stream<Item = Bytes> + Send + 'static,
) -> impl Stream<Item = Bytes> + Send + 'static {
    futures::stream::unfold(Box::pin(frames), |mut f| async move {
        match tokio::time::timeout(KEEP_ALIVE_EVERY, f.next()).await {
            Ok(Some(frame)) => Some((frame, f)),
            Ok(None) => None,
            Err(_) => Some((Bytes::from_static(KEEP_ALIVE), f)),
        }
    })
}

/// One SSE message of a JSON payload: `data: <compact JSON>` and a blank line, LF only.
pub fn json_frame(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// agentd's `POST /run` stream: `id: <seq>` on committed events, keep-alives, and always a
/// last `event: done`.
pub fn agentd_response(state: &AppState, handle: RunHandle) -> Response {
    let headers = run_headers(&handle.run_id, &handle.invocation_id, None);
    let (run_id, invocation_id) = (handle.run_id.clone(), handle.invocation_id.clone());
    let frames = items(state, handle).map(move |item| agentd_frame(&item, &run_id, &invocation_id));
    event_stream(with_keep_alive(frames), headers)
}

/// ADK's `POST /run_sse` stream: `data:` frames only, byte for byte as ADK sends them, ending
/// when the run ends (no end marker, no keep-alive), and ADK's headers (only the content type,
/// besides the run's ids). A run handed over mid-stream is followed where it now runs.
pub fn adk_response(state: &AppState, handle: RunHandle, split_artifacts: bool) -> Response {
    let headers = run_headers(&handle.run_id, &handle.invocation_id, None);
    let (user, run_id) = (handle.user_id.clone(), handle.run_id.clone());
    let frames = with_follow_on(state.clone(), user, run_id, live(handle))
        .flat_map(move |item| futures::stream::iter(adk_frames(&item, split_artifacts)));
    adk_stream(frames, headers)
}

/// An SSE response with ADK's headers: the content type and `extra`, nothing else.
pub fn adk_stream(
    frames: impl Stream<Item = Bytes> + Send + 'static,
    extra: HeaderMap,
) -> Response {
    let open = crate::metrics::OpenStream::new();
    let frames = frames.map(move |f| {
        let _open = &open;
        Ok::<_, std::convert::Infallible>(f)
    });
    let mut resp = Response::new(axum::body::Body::from_stream(frames.fuse()));
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    resp.headers_mut().extend(extra);
    resp
}
