//! The outbox of one run: where an event becomes a fact before anyone sees it.
//!
//! Partial events go straight to the client (no database work). A complete event is committed
//! with [`crate::store::SessionStore::append_fenced`] — event row, state delta, staged
//! artifacts and the session's new `seq` in one transaction, fenced by the run's ownership of
//! the session — and only then handed to the client. Everything that reports or reads goes
//! through one lock per run ([`Outbox::emit`]), so the wire order is the commit order.
//!
//! A final response may be *held* ([`Outbox::hold`]) for at most [`HOLD_LIMIT`], so that the
//! run's end can commit it together with the outcome ([`Outbox::settle_held`] with
//! `completed`); whatever the run reports or reads next commits it first.
//!
//! The agent side ([`crate::agent::InvocationContext`]) and the runner ([`crate::runner`])
//! both drive this; neither reaches into the other.

use super::{Meter, RunItem, RunObserver};
use crate::event::{apply_delta, Event, JsonMap, TEMP_PREFIX};
use crate::store::{
    ArtifactWrite, Fence, SessionKey, SessionStore, StoreError, StoreResult, StoredEvent,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;

/// How long [`Outbox::hold`] holds an event back at most, waiting for the run to end so that
/// the event and the outcome share one commit. A run that goes on past it (a workflow's next
/// agent thinking) commits and delivers the event then.
pub const HOLD_LIMIT: Duration = Duration::from_millis(5);

/// A complete event could not be committed; the run stops with it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CommitError(pub String);

pub type CommitResult<T = ()> = Result<T, CommitError>;

/// Emit-side state, guarded by the per-run emit lock.
pub struct EmitState {
    out: mpsc::Sender<RunItem>,
    client_gone: bool,
    /// A fenced commit found the session owned by another run: this run was taken over and
    /// must neither write nor seal anything more.
    pub lost: bool,
    pub last_seq: Option<i64>,
    /// Function calls committed in this run without a committed response: id → (name, author).
    pub open_calls: BTreeMap<String, (String, String)>,
    /// A final response waiting to be committed with the run's outcome (see
    /// [`Outbox::hold`]). Whatever the run reports next commits it first.
    held: Option<Event>,
    /// The commit of a held event failed after its agent had moved on: the run fails with it.
    failed: Option<CommitError>,
    /// The run's last event could not record it `completed`: a cancel of the run was accepted
    /// first (the event was committed as an ordinary one). The run ends `cancelled`.
    pub cancel_requested: bool,
}

/// What the runner gives a run's outbox.
pub struct OutboxParts {
    pub invocation_id: String,
    pub key: SessionKey,
    /// Where its events are committed: the one service the outbox writes to.
    pub sessions: Arc<dyn SessionStore>,
    pub cancel: CancellationToken,
    /// Cancel the run when the client goes away (else it runs on, bounded by the deadline).
    pub cancel_on_disconnect: bool,
    /// The run that owns the session: every commit is fenced by it.
    pub run_id: Option<String>,
    /// The epoch the run owns it at (its takeovers so far): part of every commit's fence.
    pub epoch: i32,
    /// The session's last seq when the run starts (a resumed run: where the previous owner's
    /// commits end), so the partial events it streams carry where they follow on.
    pub last_seq: Option<i64>,
    /// Once set, the run stops after its next commit (a draining replica hands it over at a
    /// commit boundary: nothing in flight is cut).
    pub boundary: Arc<std::sync::atomic::AtomicBool>,
    pub observer: Option<Arc<dyn RunObserver>>,
    /// The session state the run starts from.
    pub state: JsonMap,
    pub out: mpsc::Sender<RunItem>,
    /// What the run spends: its total rides on every commit of the run.
    pub meter: Option<Arc<Meter>>,
}

/// One run's commit-then-deliver machinery (see the module docs).
pub struct Outbox {
    invocation_id: String,
    key: SessionKey,
    sessions: Arc<dyn SessionStore>,
    cancel: CancellationToken,
    cancel_on_disconnect: bool,
    run_id: Option<String>,
    epoch: i32,
    boundary: Arc<std::sync::atomic::AtomicBool>,
    observer: Option<Arc<dyn RunObserver>>,
    /// The session state as this run sees it (see [`Outbox::state`]).
    state: Mutex<JsonMap>,
    emit: Arc<tokio::sync::Mutex<EmitState>>,
    meter: Option<Arc<Meter>>,
}

/// The `temp:` keys of an event's state delta: never stored, but the run sees them.
pub fn temp_keys(event: &Event) -> JsonMap {
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

impl Outbox {
    pub fn new(p: OutboxParts) -> Arc<Self> {
        Arc::new(Outbox {
            invocation_id: p.invocation_id,
            key: p.key,
            sessions: p.sessions,
            cancel: p.cancel,
            cancel_on_disconnect: p.cancel_on_disconnect,
            run_id: p.run_id,
            epoch: p.epoch,
            boundary: p.boundary,
            observer: p.observer,
            state: Mutex::new(p.state),
            emit: Arc::new(tokio::sync::Mutex::new(EmitState {
                out: p.out,
                client_gone: false,
                lost: false,
                last_seq: p.last_seq,
                open_calls: BTreeMap::new(),
                held: None,
                failed: None,
                cancel_requested: false,
            })),
            meter: p.meter,
        })
    }

    pub fn invocation_id(&self) -> &str {
        &self.invocation_id
    }

    /// The run's meter, if it counts what it spends.
    pub fn meter(&self) -> Option<&Arc<Meter>> {
        self.meter.as_ref()
    }

    pub fn session_key(&self) -> &SessionKey {
        &self.key
    }

    /// Whether this run owns its session (then every commit is fenced by it).
    pub fn is_owned(&self) -> bool {
        self.run_id.is_some()
    }

    /// The session state as this run sees it: merged stored state, plus every delta this run
    /// committed (or holds), plus `temp:` keys (which live only for the invocation).
    pub fn state(&self) -> JsonMap {
        lock(&self.state).clone()
    }

    pub fn state_get(&self, key: &str) -> Option<serde_json::Value> {
        lock(&self.state).get(key).cloned()
    }

    /// Takes the per-run emit lock: nothing else is reported or committed while it is held.
    pub async fn emit(&self) -> OwnedMutexGuard<EmitState> {
        self.emit.clone().lock_owned().await
    }

    /// Holds `event` back to be committed with the run's outcome (the caller holds the emit
    /// lock, already settled, and gives it up here). A timer commits it after [`HOLD_LIMIT`]
    /// if nothing else did first. The run's state includes its delta at once.
    pub fn hold(self: &Arc<Self>, mut st: OwnedMutexGuard<EmitState>, event: Event) {
        apply_delta(&mut lock(&self.state), &event.actions.state_delta);
        let id = event.id.clone();
        st.held = Some(event);
        drop(st);
        // Weak, and outside the agent's span: a run that ended meanwhile is not kept alive
        // (its client's stream ends when the run's last reference goes), nor its trace open.
        let outbox = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(HOLD_LIMIT).await;
            let Some(outbox) = outbox.upgrade() else {
                return;
            };
            let mut st = outbox.emit.lock().await;
            if st.held.as_ref().is_some_and(|e| e.id == id) {
                if let Err(e) = outbox.settle(&mut st).await {
                    st.failed = Some(e);
                }
            }
        });
    }

    /// Before anything else is reported: fails with the error of a held event's failed
    /// commit, or commits the held event and hands it to the client.
    pub async fn settle(&self, st: &mut EmitState) -> CommitResult {
        self.settle_held(st, false, None).await.map(drop)
    }

    /// [`Outbox::settle`] at the run's end. `completed`: the same commit records the run as
    /// completed ([`Fence::RunEnd`]). `within`: how long the client has to take the event
    /// (nothing else bounds the wait once the run has ended). True if an event was held and
    /// committed now, with a new seq (an event the store already had, reported twice, is
    /// returned as stored and recorded no outcome).
    pub async fn settle_held(
        &self,
        st: &mut EmitState,
        completed: bool,
        within: Option<Duration>,
    ) -> CommitResult<bool> {
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

    /// [`Outbox::settle`] from an agent's task: the commit runs as a task of its own (as in
    /// [`Outbox::commit_detached`]), so a run cancelled meanwhile cannot abandon it half-way.
    pub async fn settled(
        self: &Arc<Self>,
        mut st: OwnedMutexGuard<EmitState>,
    ) -> CommitResult<OwnedMutexGuard<EmitState>> {
        if st.held.is_none() && st.failed.is_none() {
            return Ok(st);
        }
        let outbox = self.clone();
        let (st, settled) = tokio::spawn(tracing::Instrument::instrument(
            async move {
                let r = outbox.settle(&mut st).await;
                (st, r)
            },
            tracing::Span::current(),
        ))
        .await
        .map_err(|e| CommitError(format!("commit task failed: {e}")))?;
        settled.map(|()| st)
    }

    /// Settles, then commits one complete event and hands it to the client, as a task of its
    /// own: a run cancelled meanwhile cannot abandon a commit half-way, and the runner's seal
    /// waits for it (same lock). The task keeps the caller's span: its commit belongs to the
    /// same trace.
    pub async fn commit_detached(
        self: &Arc<Self>,
        guard: OwnedMutexGuard<EmitState>,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
    ) -> CommitResult<i64> {
        let outbox = self.clone();
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let mut guard = guard;
                outbox.settle(&mut guard).await?;
                outbox.commit(&mut guard, event, artifacts).await
            },
            tracing::Span::current(),
        ))
        .await
        .map_err(|e| CommitError(format!("commit task failed: {e}")))?
    }

    /// Hands a partial event to the client (after settling: a held event goes first).
    pub async fn deliver_partial(self: &Arc<Self>, mut event: Event) -> CommitResult {
        crate::event::strip_temp_keys(&mut event.actions.state_delta);
        let st = self.emit().await;
        let mut st = self.settled(st).await?;
        self.deliver(
            &mut st,
            RunItem::Event {
                event: Box::new(event),
                seq: None,
            },
        )
        .await;
        Ok(())
    }

    /// Commits one complete event, then hands it to the client. Holds the emit lock.
    pub async fn commit(
        &self,
        st: &mut EmitState,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
    ) -> CommitResult<i64> {
        self.commit_as(st, event, artifacts, false, None).await
    }

    /// [`Outbox::commit`]; `last`: the same commit records the run as completed; `within`:
    /// how long the client has to take the event ([`Outbox::deliver_within`]), else as long
    /// as the run is not cancelled ([`Outbox::deliver`]).
    async fn commit_as(
        &self,
        st: &mut EmitState,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
        last: bool,
        within: Option<Duration>,
    ) -> CommitResult<i64> {
        // A last event refused for a cancel that came first is committed as an ordinary one.
        let retry = last.then(|| event.clone());
        let recorded = match self.record_as(st, event, artifacts, last).await {
            Err(StoreError::CancelRequested) => {
                st.cancel_requested = true;
                match retry {
                    Some(event) => self.record_as(st, event, vec![], false).await,
                    None => Err(StoreError::CancelRequested),
                }
            }
            other => other,
        };
        let stored = match recorded {
            Ok(stored) => stored,
            Err(StoreError::NotOwner) => {
                st.lost = true;
                tracing::warn!(invocation = %self.invocation_id, "the run lost its session to another run; stopping without writing");
                return Err(CommitError("the run no longer owns the session".into()));
            }
            Err(e) => {
                tracing::error!(invocation = %self.invocation_id, error = %e, "event commit failed");
                return Err(CommitError("the event could not be saved".into()));
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
        if self.boundary.load(std::sync::atomic::Ordering::SeqCst) {
            self.cancel.cancel();
        }
        Ok(seq)
    }

    /// Commits one complete event and brings the run's view up to date (state, `temp:` keys,
    /// last seq, open function calls) without handing it to the client. The user event of a
    /// run goes only this far.
    pub async fn record(
        &self,
        st: &mut EmitState,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
    ) -> StoreResult<StoredEvent> {
        self.record_as(st, event, artifacts, false).await
    }

    /// [`Outbox::record`] for several events in one commit: all or nothing (an edit's rewind
    /// and its user event).
    pub async fn record_all(
        &self,
        st: &mut EmitState,
        events: Vec<(Event, Vec<ArtifactWrite>)>,
    ) -> StoreResult<Vec<StoredEvent>> {
        let temps: Vec<JsonMap> = events.iter().map(|(e, _)| temp_keys(e)).collect();
        let fence = match &self.run_id {
            Some(run) => Fence::Run(run, self.epoch),
            None => Fence::Unfenced,
        };
        let stored = self
            .sessions
            .append_all_fenced(&self.key, events, fence)
            .await?;
        for (s, temp) in stored.iter().zip(temps) {
            self.adopt(st, s, temp);
        }
        Ok(stored)
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
            Some(run) if last => Fence::RunEnd(run, self.epoch),
            Some(run) => Fence::Run(run, self.epoch),
            None => Fence::Unfenced,
        };
        let started = std::time::Instant::now();
        let span = tracing::info_span!("commit", event = %event.id, seq = tracing::field::Empty);
        // The run's last commit carries all its usage if it spent anything (the statement then
        // adds it to the aggregates; one that spent nothing leaves them untouched), any other
        // commit what changed since the one before.
        let usage = match &self.meter {
            Some(m) if last => Some(m.usage()).filter(|u| !u.is_empty()),
            Some(m) => m.pending(),
            None => None,
        };
        let metered = usage.as_ref().map(|usage| crate::store::Metered {
            usage,
            keyed: self.meter.as_ref().is_some_and(|m| m.keyed()),
        });
        let stored = tracing::Instrument::instrument(
            self.sessions
                .append_metered(&self.key, event, artifacts, fence, metered),
            span.clone(),
        )
        .await?;
        if let (Some(meter), Some(usage)) = (&self.meter, usage) {
            meter.committed(usage);
        }
        span.record("seq", stored.seq);
        metrics::histogram!("agentd_commit_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        self.adopt(st, &stored, temp);
        Ok(stored)
    }

    /// Brings the run's view up to date with an event committed on its behalf (by
    /// [`Outbox::record`], or by admission itself for the user event): state with the event's
    /// `temp:` keys, last seq, open function calls.
    pub fn adopt(&self, st: &mut EmitState, stored: &StoredEvent, temp: JsonMap) {
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

    /// [`Outbox::deliver`], but a client that does not take the item within `limit` is dropped
    /// as a reader (used once the run has ended, so a stalled client cannot hold it).
    pub async fn deliver_within(&self, st: &mut EmitState, item: RunItem, limit: Duration) {
        self.hand_over(st, item, tokio::time::sleep(limit)).await;
    }

    /// Hands an item to the client. A client that went away is noted once; depending on the
    /// request the run is then cancelled or goes on without a reader. A client that does not
    /// read holds the run up (backpressure) only until the run is cancelled or times out: then
    /// it is dropped as a reader, so the run ends on time; it can re-attach to read the end.
    pub async fn deliver(&self, st: &mut EmitState, item: RunItem) {
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
