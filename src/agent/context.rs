//! The invocation context: everything an agent sees during one run, and the emit path.
//!
//! [`InvocationContext::emit`] is where an agent's event becomes a fact. Partial events go
//! straight to the client (no database work). A complete event is committed with
//! [`crate::store::SessionStore::append_event`] — event row, state delta, staged artifacts
//! and the session's new `seq` in one transaction — and only then handed to the client.
//! Emits are serialized by one lock per run, so the wire order is the commit order.

use super::plugin::PluginSet;
use super::{AgentError, AgentResult, AgentTree};
use crate::event::{apply_delta, Content, Event, JsonMap, Part, TEMP_PREFIX};
use crate::run::{RunItem, RunObserver};
use crate::store::{ArtifactScope, ArtifactWrite, SessionKey, Store, StoreResult, StoredEvent};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
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
    /// Tool calls left without a response by an interrupted run are executed first.
    pub resume: bool,
    /// Tools the client declared with the request (AG-UI `tools`, OpenAI `tools`): offered to
    /// LLM agents beside their own, and resolved by the client (the run ends with the call
    /// open, as for a long-running tool; the client answers in its next request).
    pub client_tools: Vec<crate::model::ToolDeclaration>,
}

/// Emit-side state, guarded by the per-run emit lock.
pub(crate) struct EmitState {
    out: mpsc::Sender<RunItem>,
    client_gone: bool,
    /// A fenced commit found the session owned by another run: this run was taken over and
    /// must neither write nor seal anything more.
    pub(crate) lost: bool,
    pub(crate) last_seq: Option<i64>,
    /// Function calls committed in this run without a committed response: id → (name, author).
    pub(crate) open_calls: BTreeMap<String, (String, String)>,
    /// A final response waiting to be committed with the run's outcome (see
    /// [`InvocationContext::emit_final`]). Whatever the run reports next commits it first.
    pub(crate) held: Option<Event>,
    /// The commit of a held event failed after its agent had moved on: the run fails with it.
    pub(crate) failed: Option<AgentError>,
}

/// How long [`InvocationContext::emit_final`] holds an event back at most, waiting for the
/// run to end so that the event and the outcome share one commit. A run that goes on past
/// it (a workflow's next agent thinking) commits and delivers the event then.
pub const HOLD_LIMIT: Duration = Duration::from_millis(5);

pub(crate) struct Shared {
    pub(crate) invocation_id: String,
    pub(crate) key: SessionKey,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) user_content: Option<Content>,
    pub(crate) run_config: RunConfig,
    pub(crate) cancel: CancellationToken,
    pub(crate) tree: Arc<AgentTree>,
    pub(crate) plugins: Arc<PluginSet>,
    /// Cancel the run when the client goes away (else it runs on, bounded by the deadline).
    pub(crate) cancel_on_disconnect: bool,
    /// The run that owns the session: every commit is fenced by it.
    pub(crate) run_id: Option<String>,
    pub(crate) observer: Option<Arc<dyn RunObserver>>,
    state: Mutex<JsonMap>,
    ended: AtomicBool,
    pub(crate) emit: Arc<tokio::sync::Mutex<EmitState>>,
    pending_artifacts: Mutex<Vec<ArtifactWrite>>,
}

/// Everything one agent sees during one run. Cheap to clone.
#[derive(Clone)]
pub struct InvocationContext {
    shared: Arc<Shared>,
    agent: Arc<str>,
    branch: Option<Arc<str>>,
    escalation: Option<Arc<AtomicBool>>,
}

/// Inputs to build a context (the runner's side).
pub(crate) struct ContextParts {
    pub invocation_id: String,
    pub key: SessionKey,
    pub store: Arc<dyn Store>,
    pub user_content: Option<Content>,
    pub run_config: RunConfig,
    pub cancel: CancellationToken,
    pub tree: Arc<AgentTree>,
    pub plugins: Arc<PluginSet>,
    pub cancel_on_disconnect: bool,
    pub run_id: Option<String>,
    pub observer: Option<Arc<dyn RunObserver>>,
    pub state: JsonMap,
    pub out: mpsc::Sender<RunItem>,
}

/// The `temp:` keys of an event's state delta: never stored, but the run sees them.
pub(crate) fn temp_keys(event: &Event) -> JsonMap {
    event
        .actions
        .state_delta
        .iter()
        .filter(|(k, _)| k.starts_with(TEMP_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl InvocationContext {
    pub(crate) fn new(p: ContextParts) -> Self {
        let root = p.tree.root().name().to_string();
        InvocationContext {
            shared: Arc::new(Shared {
                invocation_id: p.invocation_id,
                key: p.key,
                store: p.store,
                user_content: p.user_content,
                run_config: p.run_config,
                cancel: p.cancel,
                tree: p.tree,
                plugins: p.plugins,
                cancel_on_disconnect: p.cancel_on_disconnect,
                run_id: p.run_id,
                observer: p.observer,
                state: Mutex::new(p.state),
                ended: AtomicBool::new(false),
                emit: Arc::new(tokio::sync::Mutex::new(EmitState {
                    out: p.out,
                    client_gone: false,
                    lost: false,
                    last_seq: None,
                    open_calls: BTreeMap::new(),
                    held: None,
                    failed: None,
                })),
                pending_artifacts: Mutex::new(vec![]),
            }),
            agent: root.into(),
            branch: None,
            escalation: None,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// `e-<uuid>` of this run.
    pub fn invocation_id(&self) -> &str {
        &self.shared.invocation_id
    }

    pub fn session_key(&self) -> &SessionKey {
        &self.shared.key
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
        lock(&self.shared.state).clone()
    }

    pub fn state_get(&self, key: &str) -> Option<Value> {
        lock(&self.shared.state).get(key).cloned()
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
            .load_artifact(&ArtifactScope::from(&self.shared.key), filename, version)
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
        if event.is_partial() {
            crate::event::strip_temp_keys(&mut event.actions.state_delta);
            let st = self.shared.emit.clone().lock_owned().await;
            let mut st = self.shared.settled(st).await?;
            self.shared
                .deliver(
                    &mut st,
                    RunItem::Event {
                        event: Box::new(event),
                        seq: None,
                    },
                )
                .await;
            return Ok(None);
        }
        let artifacts = std::mem::take(&mut *lock(&self.shared.pending_artifacts));
        let guard = self.shared.emit.clone().lock_owned().await;
        self.check_cancelled()?;
        // The commit and hand-off run as their own task: a run cancelled meanwhile cannot
        // abandon a commit half-way, and the runner's seal waits for it (same lock).
        let shared = self.shared.clone();
        // The task keeps the emitting agent's span: its commit belongs to the same trace.
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let mut guard = guard;
                shared.settle(&mut guard).await?;
                shared.commit(&mut guard, event, artifacts).await
            },
            tracing::Span::current(),
        ))
        .await
        .map_err(|e| AgentError::Commit(format!("commit task failed: {e}")))?
        .map(Some)
    }

    /// Reports a complete event whose `seq` the agent does not need: typically its final
    /// response. If the run ends right after it, the event is committed in the same
    /// transaction as the run's outcome, which saves a commit per run. Like [`Self::emit`]
    /// it reaches the client only once committed; it is committed before anything the run
    /// reports next, and [`HOLD_LIMIT`] after this call at the latest, so a run that goes on
    /// delays it by no more. The run's state includes its delta at once; the session's
    /// stored events include it once committed ([`Self::flush`] commits it at once). A commit
    /// that fails after this returned fails the run (the next `emit` returns the error).
    pub async fn emit_final(&self, mut event: Event) -> AgentResult {
        let staged = !lock(&self.shared.pending_artifacts).is_empty();
        if self.shared.run_id.is_none() || event.is_partial() || staged {
            return self.emit(event).await.map(|_| ());
        }
        self.prepare(&mut event).await?;
        let st = self.shared.emit.clone().lock_owned().await;
        self.check_cancelled()?;
        let mut st = self.shared.settled(st).await?;
        apply_delta(&mut lock(&self.shared.state), &event.actions.state_delta);
        let id = event.id.clone();
        st.held = Some(event);
        drop(st);
        // Weak, and outside the agent's span: a run that ended meanwhile is not kept alive
        // (its client's stream ends when the run's last reference goes), nor its trace open.
        let shared = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            tokio::time::sleep(HOLD_LIMIT).await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let mut st = shared.emit.lock().await;
            if st.held.as_ref().is_some_and(|e| e.id == id) {
                if let Err(e) = shared.settle(&mut st).await {
                    st.failed = Some(e);
                }
            }
        });
        Ok(())
    }

    /// Commits an event [`Self::emit_final`] is holding back, now. Reads of the session's
    /// events through [`Self::store`] see a held event only after this; agentd's history
    /// reads call it first.
    pub async fn flush(&self) -> AgentResult {
        let st = self.shared.emit.clone().lock_owned().await;
        self.shared.settled(st).await.map(drop)
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
        let mut st = self.shared.emit.lock().await;
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

impl Shared {
    /// Before anything else is reported: fails with the error of a held event's failed
    /// commit, or commits the held event and hands it to the client.
    pub(crate) async fn settle(&self, st: &mut EmitState) -> AgentResult {
        self.settle_held(st, false, None).await.map(drop)
    }

    /// [`Shared::settle`] at the run's end. `completed`: the same commit records the run as
    /// completed ([`Fence::RunEnd`](crate::store::Fence::RunEnd)). `within`: how long the
    /// client has to take the event (nothing else bounds the wait once the run has ended).
    /// True if an event was held and committed now, with a new seq (an event the store already
    /// had, reported twice, is returned as stored and recorded no outcome).
    pub(crate) async fn settle_held(
        &self,
        st: &mut EmitState,
        completed: bool,
        within: Option<Duration>,
    ) -> AgentResult<bool> {
        if let Some(e) = st.failed.take() {
            return Err(e);
        }
        let Some(event) = st.held.take() else {
            return Ok(false);
        };
        let before = st.last_seq;
        let seq = self.commit_as(st, event, vec![], completed, within).await?;
        Ok(before.is_none_or(|b| seq > b))
    }

    /// [`Shared::settle`] from an agent's task: the commit runs as a task of its own (as in
    /// [`InvocationContext::emit`]), so a run cancelled meanwhile cannot abandon it half-way.
    async fn settled(
        self: &Arc<Self>,
        mut st: tokio::sync::OwnedMutexGuard<EmitState>,
    ) -> AgentResult<tokio::sync::OwnedMutexGuard<EmitState>> {
        if st.held.is_none() && st.failed.is_none() {
            return Ok(st);
        }
        let shared = self.clone();
        let (st, settled) = tokio::spawn(tracing::Instrument::instrument(
            async move {
                let r = shared.settle(&mut st).await;
                (st, r)
            },
            tracing::Span::current(),
        ))
        .await
        .map_err(|e| AgentError::Commit(format!("commit task failed: {e}")))?;
        settled.map(|()| st)
    }

    /// Commits one complete event, then hands it to the client. Holds the emit lock.
    pub(crate) async fn commit(
        &self,
        st: &mut EmitState,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
    ) -> AgentResult<i64> {
        self.commit_as(st, event, artifacts, false, None).await
    }

    /// [`Shared::commit`]; `last`: the same commit records the run as completed; `within`:
    /// how long the client has to take the event ([`Shared::deliver_within`]), else as long
    /// as the run is not cancelled ([`Shared::deliver`]).
    async fn commit_as(
        &self,
        st: &mut EmitState,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
        last: bool,
        within: Option<Duration>,
    ) -> AgentResult<i64> {
        let stored = match self.record_as(st, event, artifacts, last).await {
            Ok(stored) => stored,
            Err(crate::store::StoreError::NotOwner) => {
                st.lost = true;
                tracing::warn!(invocation = %self.invocation_id, "the run lost its session to another run; stopping without writing");
                return Err(AgentError::Commit(
                    "the run no longer owns the session".into(),
                ));
            }
            Err(e) => {
                tracing::error!(invocation = %self.invocation_id, error = %e, "event commit failed");
                return Err(AgentError::Commit("the event could not be saved".into()));
            }
        };
        let seq = stored.seq;
        let item = RunItem::Event {
            event: Box::new(stored.event),
            seq: Some(seq),
        };
        match within {
            Some(limit) => self.deliver_within(st, item, limit).await,
            None => self.deliver(st, item).await,
        }
        Ok(seq)
    }

    /// Commits one complete event and brings the run's view up to date (state, `temp:` keys,
    /// last seq, open function calls) without handing it to the client. The user event of a
    /// run goes only this far.
    pub(crate) async fn record(
        &self,
        st: &mut EmitState,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
    ) -> StoreResult<StoredEvent> {
        self.record_as(st, event, artifacts, false).await
    }

    async fn record_as(
        &self,
        st: &mut EmitState,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
        last: bool,
    ) -> StoreResult<StoredEvent> {
        let temp = temp_keys(&event);
        let fence = match &self.run_id {
            Some(run) if last => crate::store::Fence::RunEnd(run),
            Some(run) => crate::store::Fence::Run(run),
            None => crate::store::Fence::Unfenced,
        };
        let started = std::time::Instant::now();
        let span = tracing::info_span!("commit", event = %event.id, seq = tracing::field::Empty);
        let stored = tracing::Instrument::instrument(
            self.store.append_fenced(&self.key, event, artifacts, fence),
            span.clone(),
        )
        .await?;
        span.record("seq", stored.seq);
        metrics::histogram!("agentd_commit_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        self.adopt(st, &stored, temp);
        Ok(stored)
    }

    /// Brings the run's view up to date with an event committed on its behalf (by
    /// [`Shared::record`], or by admission itself for the user event): state with the event's
    /// `temp:` keys, last seq, open function calls.
    pub(crate) fn adopt(&self, st: &mut EmitState, stored: &StoredEvent, temp: JsonMap) {
        metrics::counter!("agentd_events_committed_total").increment(1);
        {
            let mut state = lock(&self.state);
            apply_delta(&mut state, &stored.event.actions.state_delta);
            apply_delta(&mut state, &temp);
        }
        st.last_seq = Some(stored.seq);
        for call in stored.event.function_calls() {
            if let Some(id) = &call.id {
                st.open_calls
                    .insert(id.clone(), (call.name.clone(), stored.event.author.clone()));
            }
        }
        for resp in stored.event.function_responses() {
            if let Some(id) = &resp.id {
                st.open_calls.remove(id);
            }
        }
    }

    /// [`Shared::deliver`], but a client that does not take the item within `limit` is dropped
    /// as a reader (used once the run has ended, so a stalled client cannot hold it).
    pub(crate) async fn deliver_within(
        &self,
        st: &mut EmitState,
        item: RunItem,
        limit: std::time::Duration,
    ) {
        self.hand_over(st, item, tokio::time::sleep(limit)).await;
    }

    /// Hands an item to the client. A client that went away is noted once; depending on the
    /// request the run is then cancelled or goes on without a reader. A client that does not
    /// read holds the run up (backpressure) only until the run is cancelled or times out: then
    /// it is dropped as a reader, so the run ends on time; it can re-attach to read the end.
    pub(crate) async fn deliver(&self, st: &mut EmitState, item: RunItem) {
        self.hand_over(st, item, self.cancel.cancelled()).await;
    }

    /// Observes `item`, then sends it to the client unless `give_up` completes first (the
    /// client is then dropped as a reader).
    async fn hand_over(
        &self,
        st: &mut EmitState,
        item: RunItem,
        give_up: impl std::future::Future<Output = ()>,
    ) {
        if let Some(observer) = &self.observer {
            observer.observe(&item, st.last_seq);
        }
        if st.client_gone {
            return;
        }
        let sent = tokio::select! {
            biased;
            sent = st.out.send(item) => sent.is_ok(),
            _ = give_up => {
                st.client_gone = true;
                tracing::info!(invocation = %self.invocation_id, "client not reading; dropped as a reader");
                return;
            }
        };
        if !sent {
            st.client_gone = true;
            tracing::info!(invocation = %self.invocation_id, cancel = self.cancel_on_disconnect, "client disconnected");
            if self.cancel_on_disconnect {
                self.cancel.cancel();
            }
        }
    }
}
