//! The run loop: one user message in, the agent's events out.
//!
//! For `(app, user, session, new message)`, [`Runner::start`] does everything that can fail
//! because of the request, before the caller sends a byte: admit the run (the claim is one
//! statement that also checks the session exists; one running run per session, enforced by
//! the database), read the session state (only now: an admitted run has the session to
//! itself), save input blobs as artifacts and commit the user event. Then, in the background,
//! it picks the agent and runs it — partial events stream to the client at once, complete
//! events are committed first (see [`crate::agent::InvocationContext::emit`]) — and ends by
//! sealing a cancelled transcript, recording the outcome and telling the client.

use crate::agent::context::{ContextParts, RunItem};
use crate::agent::{
    run_agent, Agent, AgentError, AgentTree, InvocationContext, PluginSet, RunConfig,
};
use crate::apps::AppRegistry;
use crate::event::{new_invocation_id, Content, Event, FunctionResponse, JsonMap, Part};
use crate::store::{
    ArtifactWrite, Claim, EventRange, Lease, NewRun, NewSession, RunRecord, RunStatus, SessionKey,
    Store, StoreError,
};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How many items a run may have in flight towards a slow client before the agent waits.
pub const RUN_BUFFER: usize = 16;

/// How far back agent selection looks for the last agent that spoke.
const SELECTION_SCAN_LIMIT: usize = 1000;

/// Runner settings (from flags).
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// This replica's id: the owner recorded on the runs it executes.
    pub owner: String,
    /// A run's admission lease; renewed every `lease / 3`.
    pub lease: Duration,
    /// Longest a run may take (also bounds runs whose client left with `on_disconnect=continue`).
    pub max_run_duration: Duration,
    /// Longest an `enqueue`d request waits for the session.
    pub enqueue_timeout: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            owner: format!("agentd-{}", uuid::Uuid::new_v4().simple()),
            lease: Duration::from_secs(10),
            max_run_duration: Duration::from_secs(600),
            enqueue_timeout: Duration::from_secs(60),
        }
    }
}

/// What a request does when its session already has a running run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBusy {
    /// Fail at once (HTTP 409).
    #[default]
    Reject,
    /// Wait for the session to be free (up to the enqueue timeout).
    Enqueue,
    /// Cancel the running run, then start.
    Interrupt,
}

/// What happens to a run whose client disconnects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
    #[error("Session is busy with run {0}")]
    Busy(String),
    #[error("Timed out waiting for the session's active run {0} to finish")]
    QueueTimeout(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A started run: its ids, and its items in order (ending with [`RunItem::Done`]).
pub struct RunHandle {
    pub run_id: String,
    pub invocation_id: String,
    pub items: mpsc::Receiver<RunItem>,
    /// Cancels the run when dropped before the run ends, if the request asked for
    /// `on_disconnect: cancel`: the HTTP layer keeps it inside the response stream, so a
    /// client that goes away cancels even an agent that is not emitting at that moment.
    pub guard: Option<tokio_util::sync::DropGuard>,
}

/// Runs agents over sessions. One per process, shared by every request.
pub struct Runner {
    store: Arc<dyn Store>,
    apps: Arc<AppRegistry>,
    plugins: Arc<PluginSet>,
    config: RunnerConfig,
    /// Runs executing in this process, for instant local cancel and shutdown.
    local: Mutex<HashMap<String, CancellationToken>>,
    /// Woken whenever a local run ends (enqueued requests re-check at once).
    finished: Notify,
    shutdown: CancellationToken,
    tracker: tokio_util::task::TaskTracker,
}

impl Runner {
    pub fn new(
        store: Arc<dyn Store>,
        apps: Arc<AppRegistry>,
        plugins: PluginSet,
        config: RunnerConfig,
    ) -> Self {
        Runner {
            store,
            apps,
            plugins: Arc::new(plugins),
            config,
            local: Mutex::new(HashMap::new()),
            finished: Notify::new(),
            shutdown: CancellationToken::new(),
            tracker: tokio_util::task::TaskTracker::new(),
        }
    }

    fn local(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Validates and admits a run, commits its user event, then runs the agent in the
    /// background. Everything that can fail because of the request fails here, before the
    /// caller has sent a byte: unknown app, missing session, busy session, a user message the
    /// store refuses (e.g. an oversize blob saved as an artifact).
    pub async fn start(self: &Arc<Self>, req: RunRequest) -> Result<RunHandle, RunError> {
        if self.shutdown.is_cancelled() {
            return Err(RunError::ShuttingDown);
        }
        let entry = self
            .apps
            .get(&req.key.app_name)
            .ok_or_else(|| RunError::AppNotFound(req.key.app_name.clone()))?;
        let tree = entry.tree.clone().map_err(RunError::AppBroken)?;
        let new_message = req.new_message.clone();
        if new_message.is_none() && !req.run_config.resume {
            // As ADK: a missing session is reported before a missing message.
            return Err(
                if req.create_session || self.store.session_head(&req.key).await?.is_some() {
                    RunError::NoMessage
                } else {
                    RunError::SessionNotFound(req.key.session_id.clone())
                },
            );
        }

        let run_id = format!("run-{}", uuid::Uuid::new_v4());
        let invocation_id = new_invocation_id();
        let new_run = NewRun {
            run_id: run_id.clone(),
            key: req.key.clone(),
            invocation_id: invocation_id.clone(),
            owner: self.config.owner.clone(),
            lease: self.config.lease,
        };
        self.admit(&new_run, &req).await?;
        let cancel = self.shutdown.child_token();
        let lease_done = CancellationToken::new();
        self.spawn_lease_keeper(&run_id, cancel.clone(), lease_done.clone());

        let (tx, rx) = mpsc::channel(RUN_BUFFER);
        let ctx = match self
            .begin(&req, &invocation_id, &tree, new_message, cancel.clone(), tx)
            .await
        {
            Ok(ctx) => ctx,
            Err(e) => {
                // Free the session again; nothing of this run was stored.
                let reason = e.to_string();
                if let Err(e) = self
                    .store
                    .finish_run(&run_id, RunStatus::Failed, None, Some(&reason))
                    .await
                {
                    tracing::error!(error = %e, "could not release the session; its lease will expire");
                }
                lease_done.cancel();
                self.finished.notify_waiters();
                return Err(e);
            }
        };

        self.local().insert(run_id.clone(), cancel.clone());
        let guard =
            (req.on_disconnect == OnDisconnect::Cancel).then(|| cancel.clone().drop_guard());
        let span = tracing::info_span!(
            "run",
            app = %req.key.app_name, user = %req.key.user_id, session = %req.key.session_id,
            run = %run_id, invocation = %invocation_id,
        );
        let runner = self.clone();
        let run = ActiveRun {
            run_id: run_id.clone(),
            tree,
            ctx,
            max_duration: req.max_duration,
            cancel,
            lease_done,
        };
        self.tracker
            .spawn(async move { runner.drive(run).await }.instrument(span));
        Ok(RunHandle {
            run_id,
            invocation_id,
            items: rx,
            guard,
        })
    }

    /// With the session held: reads its state (only now, so a run that finished while this
    /// request waited is seen), builds the invocation context and commits the user event.
    async fn begin(
        &self,
        req: &RunRequest,
        invocation_id: &str,
        tree: &Arc<AgentTree>,
        new_message: Option<Content>,
        cancel: CancellationToken,
        out: mpsc::Sender<RunItem>,
    ) -> Result<InvocationContext, RunError> {
        let head = self
            .store
            .session_head(&req.key)
            .await?
            .ok_or_else(|| RunError::SessionNotFound(req.key.session_id.clone()))?;
        let user =
            new_message.map(|m| user_event(invocation_id, m, &req.state_delta, &req.run_config));
        let ctx = InvocationContext::new(ContextParts {
            invocation_id: invocation_id.to_string(),
            key: req.key.clone(),
            store: self.store.clone(),
            user_content: user.as_ref().and_then(|(e, _)| e.content.clone()),
            run_config: req.run_config.clone(),
            cancel,
            tree: tree.clone(),
            plugins: self.plugins.clone(),
            cancel_on_disconnect: req.on_disconnect == OnDisconnect::Cancel,
            state: head.state,
            out,
        });
        // A resume without a message has no user event.
        if let Some((user_event, artifacts)) = user {
            let shared = ctx.shared();
            let mut st = shared.emit.lock().await;
            match shared.record(&mut st, user_event, artifacts).await {
                Ok(_) => {}
                Err(StoreError::SessionNotFound) => {
                    return Err(RunError::SessionNotFound(req.key.session_id.clone()))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(ctx)
    }

    async fn create_session(&self, key: &SessionKey) -> Result<(), RunError> {
        let created = self
            .store
            .create_session(NewSession {
                app_name: key.app_name.clone(),
                user_id: key.user_id.clone(),
                session_id: Some(key.session_id.clone()),
                ..Default::default()
            })
            .await;
        match created {
            Ok(_) | Err(StoreError::SessionExists(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Claims the session for `run` according to the request's `on_busy` (creating the
    /// session first if it is missing and the request asks for that).
    async fn admit(&self, run: &NewRun, req: &RunRequest) -> Result<(), RunError> {
        let deadline = Instant::now() + self.config.enqueue_timeout;
        let mut interrupted = false;
        let mut created = false;
        loop {
            let notified = self.finished.notified();
            let active = match self.store.claim_run(run).await? {
                Claim::Acquired => return Ok(()),
                Claim::NoSession if req.create_session && !created => {
                    self.create_session(&run.key).await?;
                    created = true;
                    continue;
                }
                Claim::NoSession => {
                    return Err(RunError::SessionNotFound(run.key.session_id.clone()))
                }
                Claim::Busy(active) => active,
            };
            match req.on_busy {
                OnBusy::Reject => return Err(RunError::Busy(active.run_id)),
                OnBusy::Interrupt if !interrupted => {
                    self.cancel(&active.run_id).await?;
                    interrupted = true;
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(RunError::QueueTimeout(active.run_id));
            }
            // A local run wakes us at once; a run on another replica is polled.
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = self.shutdown.cancelled() => return Err(RunError::ShuttingDown),
            }
        }
    }

    /// Requests cancellation: instantly if the run is local, else through the database
    /// (its owner sees the flag within a third of the lease).
    pub async fn cancel(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let record = self.store.request_cancel(run_id).await?;
        if let Some(token) = self.local().get(run_id) {
            token.cancel();
        }
        Ok(record)
    }

    pub async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.store.get_run(run_id).await
    }

    /// Cancels every local run (each is sealed and recorded) and waits up to `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("runs still finishing after the shutdown grace period");
        }
        self.plugins.close().await;
    }

    /// Runs the agent of a started run to its end and records the outcome.
    async fn drive(self: Arc<Self>, run: ActiveRun) {
        let ActiveRun {
            run_id,
            tree,
            ctx,
            max_duration,
            cancel,
            lease_done,
        } = run;
        let max = max_duration.map_or(self.config.max_run_duration, |d| {
            d.min(self.config.max_run_duration)
        });
        let mut timed_out = false;
        let result = tokio::select! {
            r = self.run_turn(&ctx, &tree) => r,
            _ = cancel.cancelled() => Err(AgentError::Cancelled),
            _ = tokio::time::sleep(max) => {
                timed_out = true;
                cancel.cancel();
                Err(AgentError::Cancelled)
            }
        };

        let status = match &result {
            Ok(()) => RunStatus::Completed,
            Err(AgentError::Cancelled) if timed_out => RunStatus::TimedOut,
            Err(AgentError::Cancelled) => RunStatus::Cancelled,
            Err(_) => RunStatus::Failed,
        };
        let mut st = ctx.shared().emit.clone().lock_owned().await;
        if matches!(status, RunStatus::Cancelled | RunStatus::TimedOut) {
            let reason = if timed_out {
                format!(
                    "Invocation exceeded its maximum duration of {} s.",
                    max.as_secs()
                )
            } else {
                "Invocation was aborted by client.".to_string()
            };
            seal(&ctx, &mut st, tree.root().name(), &reason).await;
        }
        let error = match &result {
            Err(e @ (AgentError::Failed { .. } | AgentError::Commit(_))) => {
                tracing::warn!(error = %e, "run failed");
                ctx.shared()
                    .deliver(
                        &mut st,
                        RunItem::Error {
                            kind: e.kind().to_string(),
                            message: e.message(),
                        },
                    )
                    .await;
                Some(e.to_string())
            }
            _ => None,
        };
        let last_seq = st.last_seq;
        drop(st);
        self.plugins.after_run(&ctx).await;
        if let Err(e) = self
            .store
            .finish_run(&run_id, status, last_seq, error.as_deref())
            .await
        {
            tracing::error!(error = %e, "could not record the run outcome; its lease will expire");
        }
        lease_done.cancel();
        self.local().remove(&run_id);
        self.finished.notify_waiters();
        tracing::info!(status = status.as_str(), last_seq, "run finished");
        let mut st = ctx.shared().emit.lock().await;
        ctx.shared()
            .deliver(&mut st, RunItem::Done { status, last_seq })
            .await;
    }

    /// Plugins' before-run hook, agent selection, the agent.
    async fn run_turn(
        &self,
        ctx: &InvocationContext,
        tree: &Arc<AgentTree>,
    ) -> Result<(), AgentError> {
        if let Some(content) = self.plugins.before_run(ctx).await? {
            let root = ctx.for_agent(tree.root().name());
            root.emit(root.new_event().with_content(content)).await?;
            return Ok(());
        }
        // A tree of one agent has nothing to choose from: no history read.
        if tree.root().sub_agents().is_empty() {
            return run_agent(tree.root(), ctx).await;
        }
        let answered: Vec<String> = ctx
            .user_content()
            .map(|c| {
                c.parts
                    .iter()
                    .filter_map(|p| p.function_response.as_ref()?.id.clone())
                    .collect()
            })
            .unwrap_or_default();
        let agent = self
            .select_agent(tree, ctx.session_key(), &answered)
            .await
            .map_err(|e| AgentError::failed("StoreError", e.to_string()))?;
        tracing::debug!(agent = agent.name(), "agent selected");
        run_agent(&agent, ctx).await
    }

    /// A new message that answers function calls (a long-running tool's result, a
    /// confirmation) goes to the agent that made the calls. Otherwise the last agent that
    /// spoke keeps the conversation if it and its ancestors allow it, else the root answers.
    /// Sealing events of cancelled runs do not count as speaking. Reads history
    /// newest-first, a page at a time.
    async fn select_agent(
        &self,
        tree: &AgentTree,
        key: &SessionKey,
        answered_calls: &[String],
    ) -> Result<Arc<dyn Agent>, StoreError> {
        let root = tree.root();
        // Newest first: `before` past the last seq asks for the newest page.
        let mut before = Some(i64::MAX);
        let mut scanned = 0;
        while scanned < SELECTION_SCAN_LIMIT {
            let Some(page) = self
                .store
                .list_events(
                    key,
                    EventRange {
                        after: None,
                        before,
                        limit: 50,
                    },
                )
                .await?
            else {
                break;
            };
            for stored in page.events.iter().rev() {
                let author = stored.event.author.as_str();
                if !answered_calls.is_empty() {
                    let made_call = stored
                        .event
                        .function_calls()
                        .any(|c| c.id.as_ref().is_some_and(|id| answered_calls.contains(id)));
                    if let (true, Some(agent)) = (made_call, tree.find(author)) {
                        return Ok(agent.clone());
                    }
                    continue;
                }
                if author == "user"
                    || stored.event.error_code.as_deref() == Some(INVOCATION_ABORTED)
                {
                    continue;
                }
                if author == root.name() {
                    return Ok(root.clone());
                }
                if let Some(agent) = tree.find(author) {
                    if tree.may_keep_turn(author) {
                        return Ok(agent.clone());
                    }
                }
            }
            scanned += page.events.len();
            match (page.has_more, page.events.first()) {
                (true, Some(first)) => before = Some(first.seq),
                _ => break,
            }
        }
        Ok(root.clone())
    }

    /// Renews the run's lease every third of its length; a cancel flag set by any replica
    /// (or a lost lease) cancels the run.
    fn spawn_lease_keeper(&self, run_id: &str, cancel: CancellationToken, done: CancellationToken) {
        let store = self.store.clone();
        let run_id = run_id.to_string();
        let owner = self.config.owner.clone();
        let lease = self.config.lease;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(lease / 3);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = done.cancelled() => break,
                    _ = tick.tick() => {}
                }
                match store.renew_run(&run_id, &owner, lease).await {
                    Ok(Lease::Held {
                        cancel_requested: true,
                    }) => cancel.cancel(),
                    Ok(Lease::Held { .. }) => {}
                    Ok(Lease::Lost) => {
                        tracing::warn!(run = %run_id, "run lease lost; cancelling");
                        cancel.cancel();
                    }
                    Err(e) => tracing::warn!(run = %run_id, error = %e, "lease renewal failed"),
                }
            }
        });
    }
}

/// `errorCode` of the event that seals a cancelled or timed-out run.
pub const INVOCATION_ABORTED: &str = "INVOCATION_ABORTED";

/// A started run (user event committed), moved into its task.
struct ActiveRun {
    run_id: String,
    tree: Arc<AgentTree>,
    ctx: InvocationContext,
    max_duration: Option<Duration>,
    cancel: CancellationToken,
    lease_done: CancellationToken,
}

/// The user event: role forced to `user`, the request's state delta and metadata attached,
/// inline blobs moved to artifacts (`artifact_<invocation>_<n>`) when the run config says so.
fn user_event(
    invocation_id: &str,
    mut content: Content,
    state_delta: &Option<JsonMap>,
    config: &RunConfig,
) -> (Event, Vec<ArtifactWrite>) {
    content.role = Some("user".into());
    let mut artifacts = vec![];
    if config.save_input_blobs_as_artifacts {
        for (i, part) in content.parts.iter_mut().enumerate() {
            if part.inline_data.is_some() {
                let filename = format!("artifact_{invocation_id}_{i}");
                artifacts.push(ArtifactWrite {
                    filename: filename.clone(),
                    part: std::mem::take(part),
                    custom_metadata: JsonMap::new(),
                });
                *part = Part::text(format!(
                    "Uploaded file: {filename}. It is saved into artifacts"
                ));
            }
        }
    }
    let mut event = Event::new(invocation_id, "user").with_content(content);
    if let Some(delta) = state_delta {
        event.actions.state_delta = delta.clone();
    }
    event.custom_metadata = config.custom_metadata.clone();
    (event, artifacts)
}

/// Leaves a cancelled run's transcript valid: every function call without a response gets
/// an error response (so an LLM's next turn does not fail), then an `INVOCATION_ABORTED` event.
async fn seal(
    ctx: &InvocationContext,
    st: &mut crate::agent::context::EmitState,
    root: &str,
    reason: &str,
) {
    let open = std::mem::take(&mut st.open_calls);
    let mut by_author: BTreeMap<String, Vec<Part>> = BTreeMap::new();
    for (id, (name, author)) in open {
        let response = serde_json::from_value(serde_json::json!({
            "error": "cancelled", "message": reason,
        }))
        .unwrap_or_default();
        by_author.entry(author).or_default().push(Part {
            function_response: Some(FunctionResponse {
                id: Some(id),
                name,
                response,
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let mut events: Vec<Event> = by_author
        .into_iter()
        .map(|(author, parts)| {
            Event::new(ctx.invocation_id(), author).with_content(Content {
                parts,
                role: Some("user".into()),
                ..Default::default()
            })
        })
        .collect();
    let mut abort = Event::new(ctx.invocation_id(), root);
    abort.error_code = Some(INVOCATION_ABORTED.into());
    abort.error_message = Some(reason.to_string());
    abort.interrupted = Some(true);
    events.push(abort);
    for mut event in events {
        if let Some(meta) = &ctx.run_config().custom_metadata {
            event.custom_metadata = Some(meta.clone());
        }
        if let Err(e) = ctx.shared().commit(st, event, vec![]).await {
            tracing::error!(error = %e, "could not seal the cancelled run");
            return;
        }
    }
}
