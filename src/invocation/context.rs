//! The invocation context: everything an agent sees during one run.
//!
//! [`InvocationContext::emit`] is where an agent's event becomes a fact: it goes through the
//! run's outbox ([`crate::transcript::Outbox`]), which streams partial events at once and commits a
//! complete one (fenced by the run's ownership) before the client sees it.

use super::plugin::PluginSet;
use super::{AgentError, AgentResult, AgentTree};
use crate::event::{Content, Event, JsonMap, Part};
use crate::store::{ArtifactScope, ArtifactWrite, SessionKey, Store};
use crate::transcript::Outbox;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Per-run settings from the request.
#[derive(Debug, Clone, Default)]
pub struct RunConfig {
    /// LLM agents stream token chunks as partial events.
    pub streaming: bool,
    /// Inline blobs of the user message are saved as artifacts and replaced by a placeholder.
    pub save_input_blobs_as_artifacts: bool,
    /// Copied into `customMetadata` of every event of the run.
    pub custom_metadata: Option<JsonMap>,
    /// Added to `customMetadata` of the run's user event only (what a protocol keeps of the
    /// client's message, e.g. A2A's `messageId` under `a2a:message_id`).
    pub user_event_metadata: Option<JsonMap>,
    /// Tool calls left without a response by an interrupted run are executed first.
    pub resume: bool,
    /// Tools the client declared with the request (AG-UI `tools`, OpenAI `tools`): offered to
    /// LLM agents beside their own, and resolved by the client (the run ends with the call
    /// open, as for a long-running tool; the client answers in its next request).
    pub client_tools: Vec<crate::model::ToolDeclaration>,
    /// The run was taken over from a replica that stopped (docs/replicas.md, "Durable runs"):
    /// its agent goes on from its committed events, and a tool call that was in flight is run
    /// again only if its tool is safe to repeat ([`crate::tools::Tool::is_idempotent`]).
    pub takeover: bool,
}

/// Everything one agent sees during one run. Cheap to clone.
#[derive(Clone)]
pub struct InvocationContext {
    shared: Arc<Shared>,
    agent: Arc<str>,
    branch: Option<Arc<str>>,
    escalation: Option<Arc<AtomicBool>>,
}

/// What every agent of one run shares.
struct Shared {
    user_content: Option<Content>,
    run_config: RunConfig,
    cancel: CancellationToken,
    tree: Arc<AgentTree>,
    plugins: Arc<PluginSet>,
    ended: AtomicBool,
    pending_artifacts: Mutex<Vec<ArtifactWrite>>,
    /// Where the run's events are committed and delivered.
    outbox: Arc<Outbox>,
    /// The store, for agents and tools that read it themselves (history, artifacts, memory).
    store: Arc<dyn Store>,
    /// The app's `context_cache:`, for the model requests of its agents.
    context_cache: Option<crate::model::ContextCache>,
    /// The app's `memory:`: its embedding model (search by meaning) and extraction.
    memory: crate::memory::app::AppMemory,
}

/// Inputs to build a context (the runner's side).
pub(crate) struct ContextParts {
    pub user_content: Option<Content>,
    pub run_config: RunConfig,
    pub cancel: CancellationToken,
    pub tree: Arc<AgentTree>,
    pub plugins: Arc<PluginSet>,
    pub outbox: Arc<Outbox>,
    pub store: Arc<dyn Store>,
    pub context_cache: Option<crate::model::ContextCache>,
    pub memory: crate::memory::app::AppMemory,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl InvocationContext {
    pub(crate) fn new(p: ContextParts) -> Self {
        let root = p.tree.root().name().to_string();
        InvocationContext {
            shared: Arc::new(Shared {
                user_content: p.user_content,
                run_config: p.run_config,
                cancel: p.cancel,
                tree: p.tree,
                plugins: p.plugins,
                ended: AtomicBool::new(false),
                pending_artifacts: Mutex::new(vec![]),
                outbox: p.outbox,
                store: p.store,
                context_cache: p.context_cache,
                memory: p.memory,
            }),
            agent: root.into(),
            branch: None,
            escalation: None,
        }
    }

    /// `e-<uuid>` of this run.
    pub fn invocation_id(&self) -> &str {
        self.shared.outbox.invocation_id()
    }

    pub fn session_key(&self) -> &SessionKey {
        self.shared.outbox.session_key()
    }

    /// The app's embedding model (`memory:` of its `agentd.yaml`), if it has one.
    pub fn embedder(&self) -> Option<&Arc<dyn crate::model::embed::Embedder>> {
        self.shared.memory.embedder.as_ref()
    }

    /// The app's extraction (`memory: {mode: extract}`), if it has one.
    pub fn memory_extraction(&self) -> Option<&Arc<crate::memory::extract::Extraction>> {
        self.shared.memory.extraction.as_ref()
    }

    /// How long the app's sessions must pause before they are added to memory (`memory:
    /// idle_seconds:`), if they wait.
    pub fn memory_idle(&self) -> Option<std::time::Duration> {
        self.shared.memory.idle
    }

    /// The app's prompt-cache settings (`context_cache:` of its `agentd.yaml`).
    pub fn context_cache(&self) -> Option<&crate::model::ContextCache> {
        self.shared.context_cache.as_ref()
    }

    /// Counts a model call's tokens against the run (see [`crate::transcript::Meter`]).
    pub fn record_usage(&self, model: &str, tokens: crate::usage::Tokens) {
        if let Some(m) = self.shared.outbox.meter() {
            m.record(&self.session_key().app_name, model, tokens);
        }
    }

    /// Whether the run's budgets (its user's, its app's, its API key's) allow another
    /// model call.
    pub async fn check_budget(&self) -> Result<(), crate::usage::Exhausted> {
        match self.shared.outbox.meter() {
            Some(m) => m.check(self.store().as_ref()).await,
            None => Ok(()),
        }
    }

    /// The store, for agents that read history or artifacts themselves.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// The user's new message (after input blobs were replaced by placeholders).
    pub fn user_content(&self) -> Option<&Content> {
        self.shared.user_content.as_ref()
    }

    /// The concatenated text of the user's new message.
    pub fn user_text(&self) -> String {
        self.user_content()
            .map(|c| {
                c.parts
                    .iter()
                    .filter_map(|p| p.text.as_deref())
                    .collect::<String>()
            })
            .unwrap_or_default()
    }

    pub fn run_config(&self) -> &RunConfig {
        &self.shared.run_config
    }

    /// The agent this context belongs to.
    pub fn agent_name(&self) -> &str {
        &self.agent
    }

    /// Dot path of agent names for parallel branches (`None` on the main line).
    pub fn branch(&self) -> Option<&str> {
        self.branch.as_deref()
    }

    pub fn tree(&self) -> &Arc<AgentTree> {
        &self.shared.tree
    }

    pub fn plugins(&self) -> &Arc<PluginSet> {
        &self.shared.plugins
    }

    /// The same invocation, as seen by agent `name`.
    pub fn for_agent(&self, name: &str) -> Self {
        InvocationContext {
            agent: name.into(),
            ..self.clone()
        }
    }

    /// The same invocation on its own branch (parallel children).
    pub fn with_branch(&self, branch: String) -> Self {
        InvocationContext {
            branch: Some(branch.into()),
            ..self.clone()
        }
    }

    /// The same invocation where events with `actions.escalate` raise `flag` (loop agents).
    pub fn with_escalation(&self, flag: Arc<AtomicBool>) -> Self {
        InvocationContext {
            escalation: Some(flag),
            ..self.clone()
        }
    }

    /// Fires when the run is cancelled; long waits should select on it.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.shared.cancel
    }

    pub fn is_cancelled(&self) -> bool {
        self.shared.cancel.is_cancelled()
    }

    pub fn check_cancelled(&self) -> AgentResult {
        if self.is_cancelled() {
            Err(AgentError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Sleeps unless the run is cancelled first.
    pub async fn sleep(&self, d: Duration) -> AgentResult {
        tokio::select! {
            _ = tokio::time::sleep(d) => Ok(()),
            _ = self.shared.cancel.cancelled() => Err(AgentError::Cancelled),
        }
    }

    /// Ends the invocation after the current agent: no further agents or after-callbacks run.
    pub fn end_invocation(&self) {
        self.shared.ended.store(true, Ordering::SeqCst);
    }

    pub fn is_ended(&self) -> bool {
        self.shared.ended.load(Ordering::SeqCst)
    }

    /// The session state as this run sees it: merged stored state, plus every delta this run
    /// committed, plus `temp:` keys (which live only for the invocation).
    pub fn state(&self) -> JsonMap {
        self.shared.outbox.state()
    }

    pub fn state_get(&self, key: &str) -> Option<Value> {
        self.shared.outbox.state_get(key)
    }

    /// Stages an artifact; it is stored atomically with this agent's next complete event
    /// (whose `artifactDelta` then names its version), or with a state-only event when the
    /// agent ends without emitting one.
    pub fn save_artifact(&self, filename: impl Into<String>, part: Part) {
        lock(&self.shared.pending_artifacts).push(ArtifactWrite {
            filename: filename.into(),
            part,
            custom_metadata: JsonMap::new(),
        });
    }

    /// Loads an artifact visible to this session (latest version when `version` is `None`).
    pub async fn load_artifact(
        &self,
        filename: &str,
        version: Option<i64>,
    ) -> AgentResult<Option<Part>> {
        self.shared
            .store
            .load_artifact(
                &ArtifactScope::from(self.shared.outbox.session_key()),
                filename,
                version,
            )
            .await
            .map_err(AgentError::store)
    }

    /// Commits staged artifacts that no event carried yet.
    pub(crate) async fn flush_artifacts(&self) -> AgentResult {
        if lock(&self.shared.pending_artifacts).is_empty() {
            return Ok(());
        }
        self.emit(self.new_event()).await.map(|_| ())
    }

    /// A new complete event authored by this agent in this invocation and branch.
    pub fn new_event(&self) -> Event {
        let mut e = Event::new(self.invocation_id(), self.agent_name());
        e.branch = self.branch.as_deref().map(str::to_string);
        e
    }

    /// Reports an event. Returns its `seq` once committed (complete events) or `None` once
    /// handed to the client (partial events). Fails with `Cancelled` if the run was cancelled,
    /// or `Commit` if the database refused the event (the run then stops).
    pub async fn emit(&self, mut event: Event) -> AgentResult<Option<i64>> {
        self.prepare(&mut event).await?;
        let outbox = &self.shared.outbox;
        if event.is_partial() {
            outbox.deliver_partial(event).await?;
            return Ok(None);
        }
        let artifacts = std::mem::take(&mut *lock(&self.shared.pending_artifacts));
        let guard = outbox.emit().await;
        self.check_cancelled()?;
        Ok(Some(outbox.commit_detached(guard, event, artifacts).await?))
    }

    /// Reports a complete event whose `seq` the agent does not need: typically its final
    /// response. If the run ends right after it, the event is committed in the same
    /// transaction as the run's outcome, which saves a commit per run. Like [`Self::emit`]
    /// it reaches the client only once committed; it is committed before anything the run
    /// reports next, and [`HOLD_LIMIT`](crate::transcript::HOLD_LIMIT) after this call at the latest, so a run that goes on
    /// delays it by no more. The run's state includes its delta at once; the session's
    /// stored events include it once committed ([`Self::flush`] commits it at once). A commit
    /// that fails after this returned fails the run (the next `emit` returns the error).
    pub async fn emit_final(&self, mut event: Event) -> AgentResult {
        let staged = !lock(&self.shared.pending_artifacts).is_empty();
        let outbox = &self.shared.outbox;
        if !outbox.is_owned() || event.is_partial() || staged {
            return self.emit(event).await.map(|_| ());
        }
        self.prepare(&mut event).await?;
        let st = outbox.emit().await;
        self.check_cancelled()?;
        let st = outbox.settled(st).await?;
        outbox.hold(st, event);
        Ok(())
    }

    /// Commits an event [`Self::emit_final`] is holding back, now. Reads of the session's
    /// events through [`Self::store`] see a held event only after this; agentd's history
    /// reads call it first.
    pub async fn flush(&self) -> AgentResult {
        let outbox = &self.shared.outbox;
        let st = outbox.emit().await;
        outbox.settled(st).await.map(drop).map_err(AgentError::from)
    }

    /// What every reported event goes through first: the cancel check, [`Self::stamp`],
    /// plugins' `on_event`, and an escalation noted for the enclosing loop.
    async fn prepare(&self, event: &mut Event) -> AgentResult {
        self.check_cancelled()?;
        self.stamp(event);
        self.shared.plugins.on_event(self, event).await?;
        if event.actions.escalate == Some(true) {
            if let Some(flag) = &self.escalation {
                flag.store(true, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    /// Marks `calls` (some made in an earlier run: approved, resumed) as open in this run, so
    /// a cancel before they are answered seals them with an error response.
    pub(crate) async fn track_open_calls(&self, calls: &[crate::event::FunctionCall]) {
        let mut st = self.shared.outbox.emit().await;
        for c in calls {
            if let Some(id) = &c.id {
                st.open_calls
                    .insert(id.clone(), (c.name.clone(), self.agent_name().to_string()));
            }
        }
    }

    /// Fills what the agent left out: invocation, author, branch, run metadata, id, time.
    fn stamp(&self, event: &mut Event) {
        if event.invocation_id.is_empty() {
            event.invocation_id = self.invocation_id().to_string();
        }
        if event.author.is_empty() {
            let is_user = event
                .content
                .as_ref()
                .and_then(|c| c.role.as_deref())
                .is_some_and(|r| r == "user")
                && event.function_responses().next().is_none();
            event.author = if is_user {
                "user".into()
            } else {
                self.agent_name().into()
            };
        }
        if event.branch.is_none() {
            event.branch = self.branch.as_deref().map(str::to_string);
        }
        if let Some(meta) = &self.shared.run_config.custom_metadata {
            let target = event.custom_metadata.get_or_insert_with(JsonMap::new);
            for (k, v) in meta {
                target.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        event.fill_defaults();
    }
}
