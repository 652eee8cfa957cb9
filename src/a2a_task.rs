//! A2A's task model over agentd's runs, in one place: which state a run's task is in, which
//! states are terminal and how a listing filters by them, how a failed task says why, and a
//! task's status update (the body of a push notification). The A2A routes
//! (`http::frontend::a2a`) and push notifications (`webhook`) both read tasks through here, so
//! the two cannot tell a task's state differently; it sits below both.

use crate::store::{RunRecord, RunStatus};
use a2a_types as a2a;

/// What a task is, from its run and whether calls still wait for the client.
pub fn task_state(status: RunStatus, waiting: bool) -> a2a::TaskState {
    match status {
        RunStatus::Running => a2a::TaskState::Working,
        RunStatus::Completed if waiting => a2a::TaskState::InputRequired,
        RunStatus::Completed => a2a::TaskState::Completed,
        RunStatus::Cancelled => a2a::TaskState::Canceled,
        RunStatus::Failed | RunStatus::TimedOut | RunStatus::Interrupted | RunStatus::Abandoned => {
            a2a::TaskState::Failed
        }
    }
}

/// Whether no message may continue a task in this state.
pub fn is_terminal(state: a2a::TaskState) -> bool {
    matches!(
        state,
        a2a::TaskState::Completed
            | a2a::TaskState::Failed
            | a2a::TaskState::Canceled
            | a2a::TaskState::Rejected
    )
}

/// What a listing of tasks in state `wanted` asks of the runs: `Some(filter)` with the run
/// status that lists them (`None`: every status, filtered by state afterwards: failed has
/// several run statuses, input-required is a completed run with calls waiting), or `None` for
/// a state no run is ever in (the listing is empty).
pub fn run_filter(wanted: a2a::TaskState) -> Option<Option<RunStatus>> {
    match wanted {
        a2a::TaskState::Unspecified | a2a::TaskState::Failed => Some(None),
        a2a::TaskState::Working | a2a::TaskState::Submitted => Some(Some(RunStatus::Running)),
        a2a::TaskState::Completed | a2a::TaskState::InputRequired => {
            Some(Some(RunStatus::Completed))
        }
        a2a::TaskState::Canceled => Some(Some(RunStatus::Cancelled)),
        a2a::TaskState::Rejected | a2a::TaskState::AuthRequired => None,
    }
}

/// Seconds since the epoch as a protobuf timestamp.
pub fn timestamp(secs: f64) -> pbjson_types::Timestamp {
    let secs = secs.max(0.0);
    pbjson_types::Timestamp {
        seconds: secs.trunc() as i64,
        nanos: ((secs.fract() * 1e9) as i32).clamp(0, 999_999_999),
    }
}

/// Why a failed task failed, in a sentence.
pub fn failure(run: &RunRecord) -> String {
    run.error
        .clone()
        .unwrap_or_else(|| format!("the run ended {}", run.status.as_str()))
}

/// A text part.
pub fn text_part(text: String) -> a2a::Part {
    a2a::Part {
        content: Some(a2a::part::Content::Text(text)),
        metadata: None,
        filename: String::new(),
        media_type: String::new(),
    }
}

/// The agent's message a task status carries (why it failed, what it waits for).
pub fn status_message(task_id: &str, context_id: &str, parts: Vec<a2a::Part>) -> a2a::Message {
    a2a::Message {
        message_id: format!("{task_id}-status"),
        context_id: context_id.to_string(),
        task_id: task_id.to_string(),
        role: a2a::Role::Agent.into(),
        parts,
        metadata: None,
        extensions: vec![],
        reference_task_ids: vec![],
    }
}

/// The body of a push notification: `{"statusUpdate": {taskId, contextId, status}}`, the
/// status message saying why a failed task failed. The receiver gets the rest with `GetTask`.
pub fn status_body(run: &RunRecord, waiting: bool) -> Vec<u8> {
    let state = task_state(run.status, waiting);
    let message = (state == a2a::TaskState::Failed)
        .then(|| status_message(&run.run_id, &run.session_id, vec![text_part(failure(run))]));
    let at = run.finished_at.unwrap_or(run.created_at);
    let body = a2a::StreamResponse {
        payload: Some(a2a::stream_response::Payload::StatusUpdate(
            a2a::TaskStatusUpdateEvent {
                task_id: run.run_id.clone(),
                context_id: run.session_id.clone(),
                status: Some(a2a::TaskStatus {
                    state: state.into(),
                    message,
                    timestamp: Some(timestamp(at)),
                }),
                metadata: None,
            },
        )),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}
