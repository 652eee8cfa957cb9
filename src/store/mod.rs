//! Durable storage: sessions, events, shared state, artifacts and runs.
//!
//! Two backends implement the same traits: [`postgres::PgStore`] (production, several
//! replicas may share one database) and [`sqlite::SqliteStore`] (the embedded default).
//! `tests/store_conformance.rs` runs one behaviour suite against both.
//!
//! The one operation that must be right is [`SessionStore::append_event`]: it commits a
//! complete event, its state delta (split by prefix), its staged artifacts and the session's
//! new `seq` atomically. Callers stream an event to a client only after it returns.

pub mod artifacts;
pub mod eval_runs;
pub mod evals;
pub mod fork;
pub mod idempotency;
pub mod keys;
pub mod memory;
pub mod page;
pub mod postgres;
pub mod prune;
pub mod push;
pub mod rewinds;
pub mod runs;
pub mod schedules;
pub mod sessions;
pub mod sqlite;
pub mod turns;
pub mod usage;
pub mod webhooks;

pub use artifacts::{
    artifact_mime_type, is_user_scoped, validate_artifact, ArtifactScope, ArtifactStore,
    ArtifactVersion, ArtifactWrite,
};
pub(crate) use artifacts::{join_part, split_part};
pub use eval_runs::{
    ClaimedEvalCase, DueEvalCase, EvalCaseKey, EvalRunStore, NewEvalRun, RunCreate, StoredEvalRun,
    StoredEvalRunCase,
};
pub use evals::{CaseWrite, EvalStore, SetWrite, StoredEvalSet};
pub use idempotency::{IdempotencyStore, IdempotentRecord, KeyClaim};
pub use keys::{ApiKeyRecord, KeyStore};
pub use memory::{MemoryEntry, MemoryStore};
pub use prune::{PruneReport, PruneRequest, PruneStore};
pub use rewinds::{RewindMark, RewindStore, Rewound};
pub use runs::{
    CancelRequest, Durable, Expired, Insert, NewRun, Orphan, ResumeReason, ResumeStep, RunRecord,
    RunStatus, RunStore, TakenOver,
};
pub use schedules::{ScheduleRecord, ScheduleStore, TickPlan, TickRecord};
pub(crate) use sessions::{initial_update_time, prepare_event, prepare_initial_events};
pub use sessions::{
    EventPage, EventRange, Metered, NewSession, SessionCursor, SessionHead, SessionPage,
    SessionStore, StoredEvent,
};
pub use usage::{GroupBy, UsageQuery, UsageRow, UsageStore};
pub use webhooks::{Delivery, DeliveryRecord, DueDelivery, Settle, WebhookStore};

use crate::event::{Event, JsonMap, Part, Session};
use async_trait::async_trait;
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
    /// A run tried to record itself `completed` (with its last event, or by finishing) after a
    /// cancel of it was accepted: nothing was written; the run ends `cancelled` instead (a
    /// cancel answered 202 always wins over the run's own end).
    #[error("a cancel of the run was requested")]
    CancelRequested,
    /// Two events of one session with the same id (create-session `events`).
    #[error("duplicate event id in the session: {0}")]
    DuplicateEvent(String),
    #[error("artifact is {size} bytes, over the {limit}-byte limit")]
    ArtifactTooLarge { size: usize, limit: usize },
    /// An event with more parts than `--max-message-parts`: nothing was written.
    #[error("an event has {parts} parts, over the limit of {limit} (--max-message-parts)")]
    TooManyParts { parts: usize, limit: usize },
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
    /// cut, an exhausted pool), or refused the statement for a reason a retry clears
    /// ([`StoreError::is_transient`]): the request may succeed if repeated, so HTTP answers
    /// 503 with `Retry-After` rather than 500.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Database(e) => is_connection_error(e) || is_transient(e),
            _ => false,
        }
    }

    /// The database refused the statement for a reason of its own that a retry can clear,
    /// having rolled it back: a serialization failure or deadlock (class 40), a system error
    /// (class 58), or Citus' `CIINF`: a step of a distributed statement found no
    /// intermediate result from the step before it, as happens while the user's shard group
    /// is being moved (tests/citus/shard_move.rs). Nothing of the statement was committed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Database(e) if is_transient(e))
    }
}

fn is_transient(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
    if db.code().is_some_and(|c| {
        // 40003 (statement completion unknown) is not a refusal: it may have committed.
        (c.starts_with("40") && c != "40003") || c.starts_with("58") || c == "CIINF"
    }))
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
/// assigns its seq also checks that `sessions.active_run` is that run, at the epoch the writer
/// holds it at (its takeovers so far), under the session's row lock. So a run that was taken
/// over, or resumed by another replica under the same id, can never be written to by its
/// previous owner again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence<'a> {
    /// Not a run's write (PATCH state, restored history): no ownership check.
    Unfenced,
    /// Only while this run owns the session, at this epoch, and was not handed over.
    Run(&'a str, i32),
    /// Sealing the transcript of this dead run by a sweeper: only while no run owns the
    /// session and the dead run is still unsealed (whoever seals first wins; nobody seals twice).
    Sealing(&'a str),
    /// This run's last write: only while the run owns the session, as [`Fence::Run`], and the
    /// same commit records the run as `completed` (its last seq being this event's) and frees
    /// the session. A run's reply and its outcome then cost one durable commit, not two. An
    /// event already stored (the idempotent case) is returned as stored and ends nothing: its
    /// seq is not past the run's last one, which is how the caller tells.
    RunEnd(&'a str, i32),
}
impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

/// Everything the daemon persists, behind one handle.
pub trait Store:
    SessionStore
    + ArtifactStore
    + RunStore
    + MemoryStore
    + memory::vectors::VectorStore
    + memory::due::MemoryDueStore
    + IdempotencyStore
    + PruneStore
    + KeyStore
    + WebhookStore
    + ScheduleStore
    + fork::ForkStore
    + push::PushStore
    + rewinds::RewindStore
    + UsageStore
    + turns::TurnStore
    + EvalStore
    + EvalRunStore
{
    /// `postgres` or `sqlite`, for logs and `/health`.
    fn backend(&self) -> &'static str;

    /// A statement failed on a dead connection (see [`StoreError::is_unavailable`]): the
    /// pool's other connections may be dead too, so check them before use for a while. A
    /// retried read then gets a live connection rather than the next dead one.
    fn connection_lost(&self) {}

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
    /// Parts one stored event may have (`--max-message-parts`): what reading an event back
    /// costs grows with its parts.
    pub max_event_parts: usize,
    /// Memories one user may have in one app (`--max-memories-per-user`): a write that adds
    /// past it forgets the user's oldest in the same transaction.
    pub max_memories_per_user: usize,
}

/// The default of `--max-message-parts`.
pub const DEFAULT_MAX_EVENT_PARTS: usize = 1000;

/// The default of `--max-memories-per-user`.
pub const DEFAULT_MAX_MEMORIES_PER_USER: usize = 100_000;

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_artifact_bytes: 16 * 1024 * 1024,
            max_event_parts: DEFAULT_MAX_EVENT_PARTS,
            max_memories_per_user: DEFAULT_MAX_MEMORIES_PER_USER,
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

/// Runs migrations only (`agentd migrate`); with `citus`, creates the extension first, so
/// the tables are distributed (PostgreSQL only).
pub async fn migrate(url: &str, citus: bool) -> StoreResult<()> {
    if citus {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(StoreError::Database(sqlx::Error::Configuration(
                "--citus needs a postgres:// database URL".into(),
            )));
        }
        let store = postgres::PgStore::connect(url, 1, StoreLimits::default()).await?;
        let available: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'citus')",
        )
        .fetch_one(store.pool())
        .await?;
        if !available {
            return Err(StoreError::Database(sqlx::Error::Configuration(
                "--citus: this PostgreSQL server has no Citus extension. Install Citus on the \
                 coordinator and every worker (a package such as postgresql-15-citus, or \
                 scripts/citus.sh install, which builds it), add citus to \
                 shared_preload_libraries in postgresql.conf, restart PostgreSQL, register the \
                 workers (SELECT citus_add_node(host, port) on the coordinator), then run \
                 agentd migrate --citus again (docs/citus.md)."
                    .into(),
            )));
        }
        let created = sqlx::query("CREATE EXTENSION IF NOT EXISTS citus")
            .execute(store.pool())
            .await;
        if let Err(e) = created {
            return Err(StoreError::Database(sqlx::Error::Configuration(
                format!(
                    "--citus: CREATE EXTENSION citus failed ({e}). Citus must be in \
                     shared_preload_libraries (postgresql.conf) and PostgreSQL restarted \
                     (docs/citus.md)."
                )
                .into(),
            )));
        }
    }
    open(url, 1, StoreLimits::default()).await.map(|_| ())
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
}
