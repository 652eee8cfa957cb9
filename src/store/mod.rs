//! Durable storage: sessions, events, shared state, artifacts and runs.
//!
//! Two backends implement the same traits: [`postgres::PgStore`] (production, several
//! replicas may share one database) and [`sqlite::SqliteStore`] (the embedded default).
//! `tests/store_conformance.rs` runs one behaviour suite against both.
//!
//! The one operation that must be right is [`SessionStore::append_event`]: it commits a
//! complete event, its state delta (split by prefix), its staged artifacts and the session's
//! new `seq` atomically. Callers stream an event to a client only after it returns.

pub mod idempotency;
pub mod keys;
pub mod memory;
pub mod postgres;
pub mod prune;
pub mod runs;
pub mod sqlite;

pub use idempotency::{IdempotencyStore, IdempotentRecord, KeyClaim};
pub use keys::{ApiKeyRecord, KeyStore};
pub use memory::{MemoryEntry, MemoryStore};
pub use prune::{PruneReport, PruneRequest, PruneStore};
pub use runs::{CancelRequest, Insert, NewRun, RunRecord, RunStatus, RunStore};

use crate::event::{Event, JsonMap, Part, Session};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Identifies one session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub app_name: String,
    pub user_id: String,
    pub session_id: String,
}

impl SessionKey {
    pub fn new(
        app: impl Into<String>,
        user: impl Into<String>,
        session: impl Into<String>,
    ) -> Self {
        SessionKey {
            app_name: app.into(),
            user_id: user.into(),
            session_id: session.into(),
        }
    }
}

/// What the store can fail with. `Database` is the only variant that is not the caller's doing.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session not found")]
    SessionNotFound,
    #[error("session already exists: {0}")]
    SessionExists(String),
    /// A fenced append found the session owned by another run (or by none): the writing run
    /// lost its ownership (it was taken over) and must stop without writing anything more.
    #[error("the run no longer owns the session")]
    NotOwner,
    /// Two events of one session with the same id (create-session `events`).
    #[error("duplicate event id in the session: {0}")]
    DuplicateEvent(String),
    #[error("artifact is {size} bytes, over the {limit}-byte limit")]
    ArtifactTooLarge { size: usize, limit: usize },
    #[error("invalid artifact: {0}")]
    InvalidArtifact(String),
    #[error("conflicting concurrent write, try again")]
    Conflict,
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// The database could not be reached or dropped the connection (a restart, a network
    /// cut, an exhausted pool): the request may succeed if repeated, so HTTP answers 503 with
    /// `Retry-After` rather than 500.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Database(e) => is_connection_error(e),
            _ => false,
        }
    }
}

/// A connection-level failure: I/O, a closed or exhausted pool, or a server that is shutting
/// down or not accepting connections (SQLSTATE classes 08 and 57P).
pub fn is_connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Protocol(m) => m.contains("connection") || m.contains("unexpected eof"),
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

/// Whose write an append is. Every event a run commits is fenced by the run: the statement that
/// assigns its seq also checks that `sessions.active_run` is that run, under the session's row
/// lock, so a run that was taken over can never write into the session again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence<'a> {
    /// Not a run's write (PATCH state, restored history): no ownership check.
    Unfenced,
    /// Only while this run owns the session.
    Run(&'a str),
    /// Sealing the transcript of this dead run by a sweeper: only while no run owns the
    /// session and the dead run is still unsealed (whoever seals first wins; nobody seals twice).
    Sealing(&'a str),
    /// This run's last write: only while the run owns the session, as [`Fence::Run`], and the
    /// same commit records the run as `completed` (its last seq being this event's) and frees
    /// the session. A run's reply and its outcome then cost one durable commit, not two. An
    /// event already stored (the idempotent case) is returned as stored and ends nothing: its
    /// seq is not past the run's last one, which is how the caller tells.
    RunEnd(&'a str),
}
impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

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

/// An artifact to store together with the event that announces it in `artifactDelta`.
#[derive(Debug, Clone)]
pub struct ArtifactWrite {
    pub filename: String,
    pub part: Part,
    pub custom_metadata: JsonMap,
}

/// Metadata of one stored artifact version (ADK `ArtifactVersion`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactVersion {
    pub version: i64,
    pub canonical_uri: String,
    #[schema(value_type = Object)]
    pub custom_metadata: JsonMap,
    pub create_time: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
}

/// Addresses the artifacts visible to one session: its own, plus the user's `user:` ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactScope {
    pub app_name: String,
    pub user_id: String,
    pub session_id: String,
}

impl From<&SessionKey> for ArtifactScope {
    fn from(k: &SessionKey) -> Self {
        ArtifactScope {
            app_name: k.app_name.clone(),
            user_id: k.user_id.clone(),
            session_id: k.session_id.clone(),
        }
    }
}

impl ArtifactScope {
    pub fn new(app: &str, user: &str, session: &str) -> Self {
        ArtifactScope {
            app_name: app.into(),
            user_id: user.into(),
            session_id: session.into(),
        }
    }

    /// The `session_id` column value for `filename`: `''` for user-scoped names.
    pub fn storage_session<'a>(&'a self, filename: &str) -> &'a str {
        if is_user_scoped(filename) {
            ""
        } else {
            &self.session_id
        }
    }

    pub fn canonical_uri(&self, filename: &str, version: i64) -> String {
        if is_user_scoped(filename) {
            format!(
                "agentd://apps/{}/users/{}/artifacts/{}/versions/{}",
                self.app_name, self.user_id, filename, version
            )
        } else {
            format!(
                "agentd://apps/{}/users/{}/sessions/{}/artifacts/{}/versions/{}",
                self.app_name, self.user_id, self.session_id, filename, version
            )
        }
    }
}

/// `user:` filenames belong to the user and are listed in every one of their sessions.
pub fn is_user_scoped(filename: &str) -> bool {
    filename.starts_with("user:")
}

/// Checks a filename and part before anything is written.
pub fn validate_artifact(filename: &str, part: &Part, max_bytes: usize) -> StoreResult<()> {
    if filename.is_empty() || filename.len() > 1024 {
        return Err(StoreError::InvalidArtifact(
            "filename must be 1 to 1024 bytes".into(),
        ));
    }
    if filename.contains('\0') {
        return Err(StoreError::InvalidArtifact(
            "filename must not contain NUL".into(),
        ));
    }
    if part.inline_data.is_none() && part.text.is_none() && part.extra.get("fileData").is_none() {
        return Err(StoreError::InvalidArtifact(
            "artifact must have inlineData, text or fileData".into(),
        ));
    }
    let size = artifact_size(part);
    if size > max_bytes {
        return Err(StoreError::ArtifactTooLarge {
            size,
            limit: max_bytes,
        });
    }
    Ok(())
}

fn artifact_size(part: &Part) -> usize {
    part.inline_data.as_ref().map_or(0, |b| b.data.0.len())
        + part.text.as_ref().map_or(0, |t| t.len())
}

/// The MIME type ADK reports for a part: the blob's, or `text/plain` for text.
pub fn artifact_mime_type(part: &Part) -> Option<String> {
    match (&part.inline_data, &part.text) {
        (Some(b), _) => b.mime_type.clone(),
        (None, Some(_)) => Some("text/plain".to_string()),
        _ => part
            .extra
            .get("fileData")
            .and_then(|f| f.get("mimeType"))
            .and_then(|m| m.as_str())
            .map(str::to_string),
    }
}

/// Splits a part into its JSON without inline bytes, and the bytes.
pub(crate) fn split_part(part: &Part) -> StoreResult<(String, Option<Vec<u8>>)> {
    let mut p = part.clone();
    let data = p
        .inline_data
        .as_mut()
        .map(|b| std::mem::take(&mut b.data.0));
    Ok((serde_json::to_string(&p)?, data))
}

/// Rebuilds a part stored by [`split_part`].
pub(crate) fn join_part(json: &str, data: Option<Vec<u8>>) -> StoreResult<Part> {
    let mut p: Part = serde_json::from_str(json)?;
    if let (Some(b), Some(d)) = (p.inline_data.as_mut(), data) {
        b.data.0 = d;
    }
    Ok(p)
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
    ) -> StoreResult<StoredEvent>;

    /// The stored event with this id, if any.
    async fn find_event(
        &self,
        key: &SessionKey,
        event_id: &str,
    ) -> StoreResult<Option<StoredEvent>>;

    /// Events of one invocation with `seq > after`, oldest first, at most `limit`.
    async fn invocation_events(
        &self,
        key: &SessionKey,
        invocation_id: &str,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<StoredEvent>>;

    /// One page of a session's events by `seq`; `None` if the session does not exist.
    async fn list_events(
        &self,
        key: &SessionKey,
        range: EventRange,
    ) -> StoreResult<Option<EventPage>>;
}

/// Versioned artifacts, stored in the database.
#[async_trait]
pub trait ArtifactStore: Send + Sync + 'static {
    /// Saves a new version (0, 1, 2, ...) and returns its metadata.
    async fn save_artifact(
        &self,
        scope: &ArtifactScope,
        write: ArtifactWrite,
    ) -> StoreResult<ArtifactVersion>;

    /// The part at `version`, or the newest one.
    async fn load_artifact(
        &self,
        scope: &ArtifactScope,
        filename: &str,
        version: Option<i64>,
    ) -> StoreResult<Option<Part>>;

    /// Sorted filenames visible to the session (its own plus the user's `user:` ones).
    async fn list_artifact_keys(&self, scope: &ArtifactScope) -> StoreResult<Vec<String>>;

    /// Every version's metadata, oldest first (`[]` when there is none).
    async fn list_artifact_versions(
        &self,
        scope: &ArtifactScope,
        filename: &str,
    ) -> StoreResult<Vec<ArtifactVersion>>;

    /// One version's metadata (`None` version: the newest).
    async fn artifact_version(
        &self,
        scope: &ArtifactScope,
        filename: &str,
        version: Option<i64>,
    ) -> StoreResult<Option<ArtifactVersion>>;

    /// Deletes every version. Deleting nothing is not an error.
    async fn delete_artifact(&self, scope: &ArtifactScope, filename: &str) -> StoreResult<()>;
}

/// Everything the daemon persists, behind one handle.
pub trait Store:
    SessionStore + ArtifactStore + RunStore + MemoryStore + IdempotencyStore + PruneStore + KeyStore
{
    /// `postgres` or `sqlite`, for logs and `/health`.
    fn backend(&self) -> &'static str;

    /// Pooled connections: (open, idle), for metrics.
    fn pool_stats(&self) -> (u32, usize) {
        (0, 0)
    }

    /// The PostgreSQL pool, for the notification bus (LISTEN/NOTIFY). `None` on SQLite.
    fn pg_pool(&self) -> Option<sqlx::PgPool> {
        None
    }
}

/// Limits the stores enforce.
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    pub max_artifact_bytes: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_artifact_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Opens the database named by `url` (`postgres://…` or `sqlite://…`) and runs migrations.
pub async fn open(
    url: &str,
    max_connections: u32,
    limits: StoreLimits,
) -> StoreResult<Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = postgres::PgStore::connect(url, max_connections, limits).await?;
        store.migrate().await?;
        Ok(Arc::new(store))
    } else if url.starts_with("sqlite:") {
        let store = sqlite::SqliteStore::connect(url, max_connections, limits).await?;
        store.migrate().await?;
        Ok(Arc::new(store))
    } else {
        // Only the scheme: the rest of a URL may hold a password.
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        Err(StoreError::Database(sqlx::Error::Configuration(
            format!("unsupported database URL scheme {scheme:?}: use postgres://… or sqlite://…")
                .into(),
        )))
    }
}

/// Runs migrations only (`agentd migrate`).
pub async fn migrate(url: &str) -> StoreResult<()> {
    open(url, 1, StoreLimits::default()).await.map(|_| ())
}

/// An event as it is stored: id and time filled in if missing, `temp:` keys removed (they
/// are never stored). Every way into the `events` table goes through this.
pub(crate) fn prepare_event(e: &mut Event) {
    e.fill_defaults();
    crate::event::strip_temp_keys(&mut e.actions.state_delta);
}

/// Assigns ids/timestamps and validates restored events before a create.
pub(crate) fn prepare_initial_events(events: &mut [Event]) -> StoreResult<()> {
    let mut seen = std::collections::HashSet::new();
    for e in events.iter_mut() {
        prepare_event(e);
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

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn an_unsupported_url_is_reported_without_its_password() {
        let err = super::open(
            "mysql://app:hunter2@db.internal/agentd",
            1,
            Default::default(),
        )
        .await
        .err()
        .expect("refused");
        let text = err.to_string();
        assert!(text.contains("\"mysql\""), "{text}");
        assert!(
            !text.contains("hunter2") && !text.contains("db.internal"),
            "{text}"
        );
    }

    #[test]
    fn database_errors_reach_clients_only_as_a_generic_sentence() {
        let e = super::StoreError::Database(sqlx::Error::Protocol("relation secret_table".into()));
        let agent = crate::agent::AgentError::store(e);
        assert!(
            !agent.message().contains("secret_table"),
            "{}",
            agent.message()
        );
        let e = super::StoreError::SessionNotFound;
        assert_eq!(
            crate::agent::AgentError::store(e).message(),
            "session not found"
        );
    }
}
