//! A2A's operations on agentd's runs, shared by both bindings (JSON-RPC in [`super::routes::rpc`],
//! HTTP+JSON in [`super::routes::rest`]): each answers an A2A object or a stream of A2A stream
//! responses; the bindings only frame them.
//!
//! Tasks are runs, so everything here is durable and replica-safe: a task is read from the
//! database, followed from any replica (replayed, then live), cancelled from any replica, and
//! a client that leaves a stream does not cancel its task (A2A's rule; `--max-run-secs`
//! bounds it).

use super::error::{A2aError, A2aResult};
use super::map::{self, is_terminal, task_of, task_state, TaskStream};
pub use super::scope::{task_run, Scope};
use crate::event::{Event, Part};
use crate::http::frontend::kit::{self, turn};
use crate::http::AppState;
use crate::runner::OnDisconnect;
use crate::store::{CancelRequest, RunRecord, RunStatus, SessionKey};
use crate::transcript::RunItem;
use a2a_types as a2a;
use axum::http::HeaderMap;
use futures::{Stream, StreamExt};
use std::time::Duration;

/// Events of one task read at most (its history and artifacts); a longer run shows its newest.
const MAX_TASK_EVENTS: usize = 5_000;

/// Tasks per `ListTasks` page, by default and at most.
const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 100;

/// How long a cancel waits for the task to stop before answering it as it is.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// Events of one task read for a list entry (its newest; a longer run lists with those).
const LIST_TASK_EVENTS: usize = 500;

/// A task's committed events as read: the newest `max` of its run (oldest first), the seq
/// they were read up to, and whether the calls they leave open were answered later in the
/// session (by the next turn, which is the next task).
struct RunView {
    events: Vec<Event>,
    upto: i64,
    answered: bool,
}

/// Reads a run's newest `max` committed events — never more: a run's events lie between its
/// base seq and its last seq (one run per session at a time), so the read starts near the
/// end. For a completed run that left calls open, the session's next events say whether a
/// later turn answered them.
async fn run_view(state: &AppState, run: &RunRecord, max: usize) -> A2aResult<RunView> {
    let key = run.key();
    let base = run.base_seq.unwrap_or(0);
    let upto = match run.last_seq {
        Some(last) if run.status != RunStatus::Running => last,
        _ => state
            .store
            .session_head(&key)
            .await?
            .map(|h| h.last_seq)
            .unwrap_or(base),
    };
    let mut after = base.max(upto - max as i64);
    let mut events = Vec::new();
    while after < upto {
        let page = state
            .store
            .invocation_events(&key, &run.invocation_id, after, 500)
            .await?;
        for e in page.events {
            if e.seq > upto {
                break;
            }
            after = e.seq;
            events.push(e.event);
        }
        if !page.has_more {
            break;
        }
    }
    let mut answered = false;
    if run.status == RunStatus::Completed && !map::waiting_calls(&events).is_empty() {
        // The next turn's events: do their function responses close every open call?
        let later = state
            .store
            .list_events(
                &key,
                crate::store::EventRange {
                    after: Some(upto),
                    before: None,
                    limit: OPEN_AFTER as u32,
                },
            )
            .await?
            .map(|p| p.events.into_iter().map(|e| e.event).collect::<Vec<_>>())
            .unwrap_or_default();
        if !later.is_empty() {
            let mut all = events.clone();
            all.extend(later);
            answered = map::waiting_calls(&all).is_empty();
        }
    }
    Ok(RunView {
        events,
        upto,
        answered,
    })
}

/// Events after a task read to see whether its open calls were answered.
const OPEN_AFTER: usize = 200;

impl RunView {
    fn task(&self, run: &RunRecord, history: Option<usize>, artifacts: bool) -> a2a::Task {
        let mut task = task_of(run, &self.events, history, artifacts);
        if self.answered {
            // Its question was answered by the next turn (the next task): it is done.
            if let Some(status) = &mut task.status {
                status.state = a2a::TaskState::Completed.into();
                status.message = None;
            }
        }
        task
    }
}

/// A context id names a session: it must be an id agentd accepts.
fn context_id(id: &str) -> A2aResult<()> {
    crate::http::extract::validate_id("contextId", id)
        .map_err(|e| A2aError::InvalidParams(A2aError::Api(e).message()))
}

/// A task as stored.
pub async fn get_task(
    state: &AppState,
    scope: &Scope,
    id: &str,
    history_length: Option<i32>,
) -> A2aResult<a2a::Task> {
    let history = history(history_length)?;
    let run = task_run(state, scope, id).await?;
    Ok(run_view(state, &run, MAX_TASK_EVENTS)
        .await?
        .task(&run, history, true))
}

fn history(n: Option<i32>) -> A2aResult<Option<usize>> {
    match n {
        Some(n) if n < 0 => Err(A2aError::InvalidParams(
            "historyLength must not be negative".into(),
        )),
        Some(n) => Ok(Some(n as usize)),
        None => Ok(None),
    }
}

/// A message, admitted as a run: the task's first response and its items.
pub struct Started {
    pub first: a2a::Task,
    pub stream: TaskStream,
    pub items: std::pin::Pin<Box<dyn Stream<Item = RunItem> + Send>>,
    pub run_id: String,
}

/// Starts the run a message asks for. A message naming a task continues it only if the task
/// waits for input (its answer is the new run, in the same context); a context id names the
/// session (created on first use, the caller's own); no context starts a new one.
pub async fn send(
    state: &AppState,
    scope: &Scope,
    req: &a2a::SendMessageRequest,
) -> A2aResult<Started> {
    let (message, parts) = map::checked_input(req)?;
    // The task's id is chosen here, so a push config sent with the message can name it and
    // be stored with the run at admission.
    let run_id = format!("run-{}", uuid::Uuid::new_v4());
    let push = match req
        .configuration
        .as_ref()
        .and_then(|c| c.task_push_notification_config.as_ref())
    {
        Some(config) => Some(super::push::target(state, &run_id, config).await?),
        None => None,
    };
    let session = session_for(state, scope, message).await?;
    let key = SessionKey::new(&scope.app, &scope.user, &session);
    check_answers(state, &key, &parts).await?;
    let mut run = turn(
        scope.api_key.clone(),
        key,
        parts.clone(),
        true,
        vec![],
        OnDisconnect::Continue,
    );
    run.run_id = Some(run_id);
    run.webhook = push;
    run.run_config.save_input_blobs_as_artifacts = map::saves_blobs(req);
    run.run_config.user_event_metadata = map::message_metadata(message);
    let handle = kit::start_run(state, run).await?;
    let first = map::submitted(&handle.run_id, &session, &parts, &message.message_id);
    let run_id = handle.run_id.clone();
    Ok(Started {
        first,
        stream: TaskStream::new(&run_id, &session),
        items: crate::http::sse::run::items(state, handle),
        run_id,
    })
}

/// The session a message goes to: its task's (a task continues only while it waits for
/// input, in the same context), else its context (the caller's own, created on first use),
/// else a new one.
async fn session_for(state: &AppState, scope: &Scope, message: &a2a::Message) -> A2aResult<String> {
    let mut session = (!message.context_id.is_empty()).then(|| message.context_id.clone());
    if !message.task_id.is_empty() {
        let run = task_run(state, scope, &message.task_id).await?;
        if run.status == RunStatus::Running {
            return Err(A2aError::Unsupported(format!(
                "task {:?} is still working: wait for it, subscribe to it or cancel it",
                run.run_id
            )));
        }
        let view = run_view(state, &run, MAX_TASK_EVENTS).await?;
        let state_now = task_state(
            run.status,
            !view.answered && !map::waiting_calls(&view.events).is_empty(),
        );
        if is_terminal(state_now) {
            return Err(A2aError::Unsupported(format!(
                "task {:?} is {}; a terminal task takes no more messages",
                run.run_id,
                state_now.as_str_name()
            )));
        }
        if session.as_ref().is_some_and(|s| s != &run.session_id) {
            return Err(A2aError::InvalidParams(
                "the message's contextId is not its task's".into(),
            ));
        }
        session = Some(run.session_id);
    }
    match session {
        Some(s) => {
            context_id(&s)?;
            Ok(s)
        }
        None => Ok(uuid::Uuid::new_v4().to_string()),
    }
}

/// A function response must answer a call that waits for the client: a message cannot inject
/// tool results the agent never asked for.
async fn check_answers(state: &AppState, key: &SessionKey, parts: &[Part]) -> A2aResult<()> {
    let answers: Vec<&str> = parts
        .iter()
        .filter_map(|p| p.function_response.as_ref())
        .map(|r| r.id.as_deref().unwrap_or(""))
        .collect();
    if answers.is_empty() {
        return Ok(());
    }
    let open = kit::open_calls(state, key).await?;
    match answers.iter().find(|id| !open.contains_key(**id)) {
        Some(stray) => Err(A2aError::InvalidParams(format!(
            "function response {stray:?} answers no call waiting in this context"
        ))),
        None => Ok(()),
    }
}

/// `SendMessage`: the task when it stops (ends or waits for input), or at once with
/// `returnImmediately` (the task goes on; get or subscribe to follow it).
pub async fn send_blocking(
    state: &AppState,
    scope: &Scope,
    req: &a2a::SendMessageRequest,
) -> A2aResult<a2a::SendMessageResponse> {
    let config = req.configuration.as_ref();
    let history_length = history(config.and_then(|c| c.history_length))?;
    let mut started = send(state, scope, req).await?;
    let task = if config.is_some_and(|c| c.return_immediately) {
        let mut task = started.first;
        if let Some(s) = &mut task.status {
            s.state = a2a::TaskState::Working.into();
        }
        task
    } else {
        while let Some(item) = started.items.next().await {
            if matches!(item, RunItem::Done { .. }) {
                break;
            }
        }
        get_task(
            state,
            scope,
            &started.run_id,
            history_length.map(|n| n as i32),
        )
        .await?
    };
    Ok(a2a::SendMessageResponse {
        payload: Some(a2a::send_message_response::Payload::Task(task)),
    })
}

/// `SendStreamingMessage`: the task, a working status, then its artifacts and statuses as
/// they happen, ending with the final status.
pub async fn send_streaming(
    state: &AppState,
    scope: &Scope,
    req: &a2a::SendMessageRequest,
) -> A2aResult<impl Stream<Item = a2a::StreamResponse> + Send + 'static> {
    let Started {
        first,
        mut stream,
        items,
        ..
    } = send(state, scope, req).await?;
    let head = vec![stream.start(first), stream.working()];
    let body = items.flat_map(move |item| futures::stream::iter(stream.item(&item)));
    Ok(futures::stream::iter(head).chain(body))
}

/// `SubscribeToTask`: the task as it is now, then what happens next, from any replica.
pub async fn subscribe(
    state: &AppState,
    scope: &Scope,
    id: &str,
) -> A2aResult<impl Stream<Item = a2a::StreamResponse> + Send + 'static> {
    let run = task_run(state, scope, id).await?;
    let view = run_view(state, &run, MAX_TASK_EVENTS).await?;
    let task = view.task(&run, None, true);
    let now = a2a::TaskState::try_from(task.status.as_ref().map_or(0, |s| s.state))
        .unwrap_or(a2a::TaskState::Unspecified);
    if run.status != RunStatus::Running || is_terminal(now) {
        return Err(A2aError::Unsupported(format!(
            "task {id:?} is {}; only a working task can be subscribed to (get it instead)",
            now.as_str_name()
        )));
    }
    // The follower starts right after what the snapshot was read up to: nothing committed
    // in between is lost or sent twice.
    let mut stream = TaskStream::new(&run.run_id, &run.session_id);
    stream.seed(&view.events);
    let first = stream.start(task);
    let items =
        crate::http::sse::run::follow(state, &run.user_id, &run.run_id, Some(view.upto)).await?;
    let body = items.flat_map(move |item| futures::stream::iter(stream.item(&item)));
    Ok(futures::stream::iter([first]).chain(body))
}

/// `CancelTask`: stops a working task (on whichever replica runs it) and answers it as it
/// ended; a task that already ended is not cancelable.
pub async fn cancel(
    state: &AppState,
    scope: &Scope,
    id: &str,
    headers: &HeaderMap,
) -> A2aResult<a2a::Task> {
    let run = task_run(state, scope, id).await?;
    if run.status != RunStatus::Running {
        let task = run_view(state, &run, MAX_TASK_EVENTS)
            .await?
            .task(&run, None, true);
        let name = a2a::TaskState::try_from(task.status.as_ref().map_or(0, |s| s.state))
            .map(|s| s.as_str_name())
            .unwrap_or("ended");
        return Err(A2aError::TaskNotCancelable(format!(
            "task {id:?} is {name} and cannot be canceled"
        )));
    }
    let req: CancelRequest =
        crate::http::routes::runs::cancel_request(headers, Default::default())?;
    state.runner.cancel(&run.user_id, &run.run_id, &req).await?;
    crate::http::routes::runs::wait_for_end(state, run, CANCEL_WAIT.as_secs()).await?;
    get_task(state, scope, id, None).await
}

/// `ListTasks`: the caller's tasks of this app, newest first, optionally of one context and
/// in one state; `pageToken` continues where the last page ended.
pub async fn list(
    state: &AppState,
    scope: &Scope,
    req: &a2a::ListTasksRequest,
) -> A2aResult<a2a::ListTasksResponse> {
    let q = ListQuery::parse(req)?;
    let mut answer = a2a::ListTasksResponse {
        page_size: q.page as i32,
        // `totalSize` stays 0 (unknown): counting every task of a user on each page would
        // cost more than the page.
        total_size: 0,
        tasks: vec![],
        next_page_token: String::new(),
    };
    // A state no run is ever in lists nothing.
    let Some(status) = crate::a2a_task::run_filter(q.wanted) else {
        return Ok(answer);
    };
    let mut before = page_token(&req.page_token)?;
    let mut exhausted = false;
    // A state the runs table cannot filter on is filtered here, a bounded number of pages per
    // request: a page may then come back short, with a token to go on.
    'pages: for _ in 0..3 {
        let runs = runs_page(state, scope, &q, status, before.clone()).await?;
        let more = runs.len() > q.page as usize;
        for run in runs.into_iter().take(q.page as usize) {
            before = Some((run.created_at, run.run_id.clone()));
            if !q.may_list(&run, status) {
                continue;
            }
            let view = run_view(state, &run, LIST_TASK_EVENTS).await?;
            let task = view.task(&run, q.history_length, q.with_artifacts);
            let state_now = task.status.as_ref().map_or(0, |s| s.state);
            if q.wanted != a2a::TaskState::Unspecified && state_now != i32::from(q.wanted) {
                continue;
            }
            answer.tasks.push(task);
            if answer.tasks.len() == q.page as usize {
                break 'pages;
            }
        }
        if !more {
            exhausted = true;
            break;
        }
    }
    if let (false, Some((at, id))) = (exhausted, before) {
        answer.next_page_token = crate::http::routes::runs::encode_cursor(at, &id);
    }
    Ok(answer)
}

/// A `ListTasks` request, checked.
struct ListQuery {
    page: u32,
    history_length: Option<usize>,
    with_artifacts: bool,
    wanted: a2a::TaskState,
    /// Only tasks that changed after this (seconds since the epoch).
    since: Option<f64>,
    /// Only the tasks of this context (session).
    context: Option<String>,
}

impl ListQuery {
    fn parse(req: &a2a::ListTasksRequest) -> A2aResult<ListQuery> {
        let page = match req.page_size {
            None | Some(0) => DEFAULT_PAGE,
            Some(n) if n < 0 || n as u32 > MAX_PAGE => {
                return Err(A2aError::InvalidParams(format!(
                    "pageSize must be between 1 and {MAX_PAGE}"
                )))
            }
            Some(n) => n as u32,
        };
        let wanted = a2a::TaskState::try_from(req.status).map_err(|_| {
            A2aError::InvalidParams(format!("status {} is not a task state", req.status))
        })?;
        if !req.context_id.is_empty() {
            context_id(&req.context_id)?;
        }
        Ok(ListQuery {
            page,
            history_length: history(req.history_length)?,
            with_artifacts: req.include_artifacts.unwrap_or(false),
            wanted,
            since: req
                .status_timestamp_after
                .as_ref()
                .map(|t| t.seconds as f64 + f64::from(t.nanos) / 1e9),
            context: (!req.context_id.is_empty()).then(|| req.context_id.clone()),
        })
    }

    /// Whether `run` may be a listed task, before its events are read: a rewind or a summary
    /// that held the session is not a task anyone sent.
    fn may_list(&self, run: &RunRecord, status: Option<RunStatus>) -> bool {
        let changed = run.finished_at.or(run.started_at).unwrap_or(run.created_at);
        !run.invocation_id.starts_with(crate::runner::HOLD_PREFIX)
            && status.is_none_or(|s| s == run.status)
            && self.since.is_none_or(|t| changed > t)
    }
}

/// One page (and one more, to tell whether there are more) of the caller's runs of `status`,
/// of one context if the query names one, newest first, before `before`.
async fn runs_page(
    state: &AppState,
    scope: &Scope,
    q: &ListQuery,
    status: Option<RunStatus>,
    before: Option<(f64, String)>,
) -> A2aResult<Vec<RunRecord>> {
    Ok(match &q.context {
        None => {
            state
                .store
                .list_runs(&scope.app, &scope.user, status, before, q.page + 1)
                .await?
        }
        Some(context) => {
            let key = SessionKey::new(&scope.app, &scope.user, context);
            state
                .store
                .list_session_runs(&key, before, q.page + 1)
                .await?
        }
    })
}

/// A page token is the runs listing's cursor (`GET …/runs?after=`): opaque, the same keyset.
fn page_token(token: &str) -> A2aResult<Option<(f64, String)>> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || A2aError::InvalidParams("pageToken is not one this server gave".into());
    let (at, id) = crate::http::routes::runs::decode_cursor(token).map_err(|_| bad())?;
    if id.chars().any(char::is_control) {
        return Err(bad());
    }
    Ok(Some((at, id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_refuse_forgeries() {
        let t = crate::http::routes::runs::encode_cursor(1764110000.25, "run-1");
        assert_eq!(
            page_token(&t).unwrap(),
            Some((1764110000.25, "run-1".into()))
        );
        assert_eq!(page_token("").unwrap(), None);
        assert!(page_token("!!").is_err());
        assert!(page_token("bm8tYmFy").is_err());
    }
}
