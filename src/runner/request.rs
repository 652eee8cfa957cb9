//! What a run request is, and what starting one gives back or fails with.

use crate::agent::RunConfig;
pub use crate::config::DrainHandover;
use crate::event::{Content, JsonMap};
use crate::store::{SessionKey, StoreError};
use crate::transcript::RunItem;
use crate::webhook::WebhookTarget;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// Runner settings (from flags).
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// This replica's id: the owner recorded on the runs it executes.
    pub owner: String,
    /// How long this replica may go without a heartbeat before its runs count as dead.
    /// Heartbeats are written every `lease / 3`.
    pub lease: Duration,
    /// Longest a run may take (also bounds runs whose client left with `on_disconnect=continue`).
    pub max_run_duration: Duration,
    /// Longest an `enqueue`d request waits for the session.
    pub enqueue_timeout: Duration,
    /// How long an `Idempotency-Key` is remembered (expired keys are deleted by the sweeper).
    pub idempotency_ttl: Duration,
    /// Concurrent runs per user on this replica; 0: no limit.
    pub max_runs_per_user: usize,
    /// Parts a run's new message may have (`--max-message-parts`).
    pub max_message_parts: usize,
    /// Times a run may move to another replica because its replica died (`--max-resumes`);
    /// then it fails. Hand-overs by a draining replica do not count.
    pub max_resumes: u32,
    /// What a draining replica does with a run still going at the end of `--drain-secs`.
    pub drain_handover: DrainHandover,
    /// Notified when a run of this replica that has webhook targets ends (the webhook sender
    /// looks for the deliveries its end wrote at once instead of at its next poll).
    pub run_ended: Arc<Notify>,
    /// The operator's prices (`--prices`): what the runs' model calls cost.
    pub prices: Arc<crate::usage::Prices>,
    /// The users' budgets as admission reads them (cached; see [`super::budgets`]).
    pub budgets: Arc<super::budgets::BudgetCache>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            owner: format!("agentd-{}", uuid::Uuid::new_v4().simple()),
            lease: Duration::from_secs(10),
            max_run_duration: Duration::from_secs(600),
            enqueue_timeout: Duration::from_secs(60),
            idempotency_ttl: Duration::from_secs(86_400),
            max_runs_per_user: 0,
            max_message_parts: crate::store::DEFAULT_MAX_EVENT_PARTS,
            max_resumes: 3,
            drain_handover: DrainHandover::End,
            run_ended: Arc::new(Notify::new()),
            prices: Arc::default(),
            budgets: Arc::default(),
        }
    }
}

/// What a request does when its session already has a running run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnBusy {
    /// Fail at once (HTTP 409).
    #[default]
    Reject,
    /// Wait for the session to be free (up to the enqueue timeout), first come first served.
    Enqueue,
    /// Cancel the running run, then start.
    Interrupt,
}

/// What happens to a run whose client disconnects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnDisconnect {
    #[default]
    Cancel,
    Continue,
}

/// One run to start.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub key: SessionKey,
    pub new_message: Option<Content>,
    /// Applied with the user event.
    pub state_delta: Option<JsonMap>,
    pub run_config: RunConfig,
    pub on_busy: OnBusy,
    pub on_disconnect: OnDisconnect,
    /// Create the session if it does not exist.
    pub create_session: bool,
    /// Shorter than the server's maximum, if given.
    pub max_duration: Option<Duration>,
    /// The request's own webhook (the app's are added by the runner).
    pub webhook: Option<WebhookTarget>,
    /// The run's id, when the caller must know it before admission (a schedule's tick
    /// re-fired after a crash uses the id its first try recorded); else a new one.
    pub run_id: Option<String>,
    /// Go back to before a turn first (regenerate, edit): the rewind and the new user event
    /// are one commit of this run. Without `new_message`, the turn's own message runs again.
    pub edit: Option<EditPoint>,
    /// The API key that asked for the run (`None`: no key, as under `--auth none` or with a
    /// JWT): the run is held to the key's budget too, and its spending is counted as the key's.
    pub api_key: Option<crate::usage::ChargedKey>,
}

/// The turn an edit of the conversation goes back to (see `docs/editing.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditPoint {
    /// The last user turn still in the conversation: regenerate its answer.
    LastTurn,
    /// The n-th user turn still in the conversation (1-based), as a frontend that re-sends
    /// its message list counts them. A session with fewer turns is not rewound.
    Turn(usize),
    /// The turn that began this invocation (`e-…`).
    Invocation(String),
}

/// Why a run did not start. All of these happen before any byte is streamed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("Agent not found: '{0}'")]
    AppNotFound(String),
    #[error("Failed to load agent: {0}")]
    AppBroken(String),
    #[error("Session not found: {0}")]
    SessionNotFound(String),
    #[error("Running an agent requires either a new_message or an invocation_id to resume a previous invocation.")]
    NoMessage,
    #[error("Invocation not found in the session: {0}")]
    InvocationNotFound(String),
    #[error("the session has no user turn to regenerate")]
    NoTurn,
    #[error("Session is busy with run {0}")]
    Busy(String),
    #[error("Timed out waiting for the session's active run {0} to finish")]
    QueueTimeout(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("this user already has {0} runs in progress")]
    TooManyRuns(usize),
    /// A budget the run is held to is spent (until its `reset`, Unix seconds).
    #[error(transparent)]
    BudgetExhausted(crate::usage::Exhausted),
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A started run: its ids, and its items in order (ending with [`RunItem::Done`], unless the
/// client fell so far behind that it was dropped as a reader; the run's end is then in the
/// database, see [`Runner::get_run`](super::Runner::get_run)).
pub struct RunHandle {
    pub run_id: String,
    /// The run's user: with the run id, what finds its row on one shard (Citus).
    pub user_id: String,
    pub invocation_id: String,
    pub items: mpsc::Receiver<RunItem>,
    /// Cancels the run when dropped before the run ends, if the request asked for
    /// `on_disconnect: cancel`: the HTTP layer keeps it inside the response stream, so a
    /// client that goes away cancels even an agent that is not emitting at that moment.
    pub guard: Option<tokio_util::sync::DropGuard>,
}
