//! Sessions and their events: the types and the [`SessionStore`] trait. **A complete event
//! is committed in [`SessionStore::append_fenced`]** (one transaction: event row, state
//! delta, artifact delta, the session's new `seq`), by each database in its `sessions.rs`.

use super::{ArtifactWrite, Fence, SessionKey, StoreError, StoreResult};
use crate::event::{Event, JsonMap, Session};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A session to create. `events` are restored history (ADK create-session `events`).
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub app_name: String,
    pub user_id: String,
    /// `None`: a uuid4 is generated.
    pub session_id: Option<String>,
    pub state: JsonMap,
    pub events: Vec<Event>,
}

/// A session without its events: what the runner needs to start a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionHead {
    pub key: SessionKey,
    /// Merged state (prefixes re-added).
    pub state: JsonMap,
    pub last_update_time: f64,
    /// The session's version: the `seq` of its newest event (0 when it has none).
    pub last_seq: i64,
}

impl SessionHead {
    pub fn into_session(self, events: Vec<Event>) -> Session {
        Session {
            id: self.key.session_id,
            app_name: self.key.app_name,
            user_id: self.key.user_id,
            state: self.state,
            events,
            last_update_time: self.last_update_time,
        }
    }
}

/// A committed event and its position in the session.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: i64,
    pub event: Event,
}

/// A page request over a session's events, by `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EventRange {
    /// Only events with `seq > after`, oldest first.
    pub after: Option<i64>,
    /// Only events with `seq < before`; the newest `limit` of them, returned oldest first.
    pub before: Option<i64>,
    pub limit: u32,
}

/// One page of events, oldest first. `has_more`: another page exists in the paging direction.
#[derive(Debug, Clone, PartialEq)]
pub struct EventPage {
    pub events: Vec<StoredEvent>,
    pub has_more: bool,
}

/// Keyset cursor for listing sessions in ADK order (`lastUpdateTime`, then id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionCursor {
    pub update_time: f64,
    pub id: String,
}

/// One page of sessions, events left empty as ADK lists them.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPage {
    pub sessions: Vec<Session>,
    pub next: Option<SessionCursor>,
}

/// What a run's commit writes of its usage ([`SessionStore::append_metered`]).
#[derive(Debug, Clone, Copy)]
pub struct Metered<'a> {
    /// The run's usage so far.
    pub usage: &'a crate::usage::RunUsage,
    /// The run is charged to an API key: its last commit adds the usage to the key's
    /// aggregates too (and only such a commit names them: every relation a statement names
    /// costs a lock at each execution, docs/performance.md).
    pub keyed: bool,
}

/// Sessions and their events.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Creates a session; `SessionExists` if the id is taken. Initial state is split by
    /// prefix (`temp:` dropped); restored events are stored with seq 1..n.
    async fn create_session(&self, new: NewSession) -> StoreResult<Session>;

    /// The session with its events, oldest first; `recent` keeps only the newest N.
    async fn get_session(
        &self,
        key: &SessionKey,
        recent: Option<u32>,
    ) -> StoreResult<Option<Session>>;

    /// The session without events (merged state and version): one cheap read.
    async fn session_head(&self, key: &SessionKey) -> StoreResult<Option<SessionHead>>;

    /// A user's sessions in ADK order (`lastUpdateTime` ascending, then id), events empty.
    async fn list_sessions(
        &self,
        app_name: &str,
        user_id: &str,
        after: Option<&SessionCursor>,
        limit: u32,
    ) -> StoreResult<SessionPage>;

    /// Deletes the session, its events, session-scoped artifacts, runs and queue tickets in one
    /// transaction (its memory entries stay: memory outlives sessions).
    /// Returns whether it existed.
    async fn delete_session(&self, key: &SessionKey) -> StoreResult<bool>;

    /// Commits one complete event atomically: the event row with the next `seq`, its state
    /// delta (`app:`/`user:`/plain; `temp:` removed from the stored and returned event), the
    /// staged artifacts (versions assigned here and written into `artifactDelta`), and the
    /// session's `last_seq`/`update_time`. All or nothing. `SessionNotFound` if it is gone.
    async fn append_event(
        &self,
        key: &SessionKey,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
    ) -> StoreResult<StoredEvent> {
        self.append_fenced(key, event, artifacts, Fence::Unfenced)
            .await
    }

    /// [`SessionStore::append_event`], only if `fence` holds (else `NotOwner`). Idempotent on
    /// the event id: an event already stored under that id is returned as it was stored, never
    /// written twice (this is how a commit whose acknowledgement was lost is resolved).
    async fn append_fenced(
        &self,
        key: &SessionKey,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
        fence: Fence<'_>,
    ) -> StoreResult<StoredEvent> {
        self.append_metered(key, event, artifacts, fence, None)
            .await
    }

    /// [`SessionStore::append_fenced`] for a run's commit, writing the run's usage so far
    /// (`usage`: when it changed; on the run's last commit, [`Fence::RunEnd`], whenever the
    /// run spent anything) on the run's record in the same statement: what the run spent is
    /// committed with the events it spent it on, at no commit of its own, and a replica that
    /// takes the run over goes on from it. A last commit without usage may leave the daily
    /// aggregates untouched: the caller says the run spent nothing. Ignored unless `fence`
    /// names a run.
    async fn append_metered(
        &self,
        key: &SessionKey,
        event: Event,
        artifacts: Vec<ArtifactWrite>,
        fence: Fence<'_>,
        usage: Option<Metered<'_>>,
    ) -> StoreResult<StoredEvent>;

    /// Several complete events committed in one transaction, in order, each as
    /// [`SessionStore::append_fenced`] commits one: all or nothing. An edit of a conversation
    /// commits its rewind event and the new user message this way, so a failure leaves the
    /// session as it was.
    async fn append_all_fenced(
        &self,
        key: &SessionKey,
        events: Vec<(Event, Vec<ArtifactWrite>)>,
        fence: Fence<'_>,
    ) -> StoreResult<Vec<StoredEvent>>;

    /// The stored event with this id, if any.
    async fn find_event(
        &self,
        key: &SessionKey,
        event_id: &str,
    ) -> StoreResult<Option<StoredEvent>>;

    /// Events of one invocation with `seq > after`, oldest first, at most `limit` and at most
    /// [`super::page::PAGE_BYTES`] of them; `has_more` if the invocation has more after them.
    async fn invocation_events(
        &self,
        key: &SessionKey,
        invocation_id: &str,
        after: i64,
        limit: u32,
    ) -> StoreResult<EventPage>;

    /// One page of a session's events by `seq`, at most `limit` and at most
    /// [`super::page::PAGE_BYTES`] of them; `None` if the session does not exist.
    async fn list_events(
        &self,
        key: &SessionKey,
        range: EventRange,
    ) -> StoreResult<Option<EventPage>>;
}

/// An event as it is stored: id and time filled in if missing, `temp:` keys removed (they
/// are never stored), and no more parts than the limit (what reading it back costs grows
/// with its parts). Every way into the `events` table goes through this.
pub(crate) fn prepare_event(e: &mut Event, limits: &super::StoreLimits) -> StoreResult<()> {
    let parts = e.content.as_ref().map_or(0, |c| c.parts.len());
    if parts > limits.max_event_parts {
        return Err(StoreError::TooManyParts {
            parts,
            limit: limits.max_event_parts,
        });
    }
    e.fill_defaults();
    crate::event::strip_temp_keys(&mut e.actions.state_delta);
    Ok(())
}

/// Assigns ids/timestamps and validates restored events before a create.
pub(crate) fn prepare_initial_events(
    events: &mut [Event],
    limits: &super::StoreLimits,
) -> StoreResult<()> {
    let mut seen = std::collections::HashSet::new();
    for e in events.iter_mut() {
        prepare_event(e, limits)?;
        if !seen.insert(e.id.clone()) {
            return Err(StoreError::DuplicateEvent(e.id.clone()));
        }
    }
    Ok(())
}

/// The update time of a new session: its last restored event's timestamp, else now.
pub(crate) fn initial_update_time(events: &[Event], now: f64) -> f64 {
    events.last().map_or(now, |e| e.timestamp)
}
