//! What memory extraction ([`crate::memory::extract`]) does to a user's memories: facts
//! added, updated (the earlier text kept as a revision) and deleted, applied together with the
//! session's mark in one transaction ([`super::MemoryStore::apply_memory_changes`]).

use super::{IngestMark, MemoryEntry};
use crate::store::{SessionKey, StoreResult};
use async_trait::async_trait;

/// One change to a user's memories.
#[derive(Debug, Clone, PartialEq)]
pub enum MemoryChange {
    /// A new memory (its event id is new: a `mem-` id).
    Add(MemoryEntry),
    /// Memory `entry.event_id` takes `entry`'s text, author, session and time; its text until
    /// now becomes its latest revision. A memory that no longer exists is skipped. Its vector
    /// is dropped, so the embedder gives it a new one.
    Update(MemoryEntry),
    /// Memory `id` and its revisions are deleted. One that no longer exists is skipped.
    Delete(String),
}

/// An earlier text of a memory (`GET …/memory/{id}`: `revisions`, oldest first).
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRevision {
    /// 1 for the memory's first text, then 2, 3, …; the memory itself is the next one.
    pub revision: i32,
    pub text: String,
    pub author: String,
    /// The session the text came from ("" for a fact added directly).
    pub session_id: String,
    /// When the text was stated (seconds since the epoch).
    pub timestamp: f64,
    /// When a later text replaced it.
    pub replaced_at: f64,
}

/// What [`super::MemoryStore::apply_memory_changes`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    pub added: usize,
    pub updated: usize,
    pub deleted: usize,
}

/// One backend's statements of [`apply`], inside its transaction.
#[async_trait]
pub(crate) trait ChangeTx: Send {
    /// Whether the session is still the one created at `create_time` (the one the mark was
    /// read for), kept so until the commit.
    async fn same_session(&mut self, key: &SessionKey, create_time: f64) -> StoreResult<bool>;
    /// Moves the mark from `from` to `to` while it is `from` ([`super::sql::MOVE_MARK`]);
    /// whether it moved.
    async fn move_mark(
        &mut self,
        key: &SessionKey,
        from: IngestMark,
        to: IngestMark,
    ) -> StoreResult<bool>;
    /// Inserts a new memory unless its id is taken; whether it did.
    async fn add(&mut self, key: &SessionKey, e: &MemoryEntry) -> StoreResult<bool>;
    /// [`MemoryChange::Update`], the old text kept as revision, stamped `now`; whether the
    /// memory existed.
    async fn update(&mut self, key: &SessionKey, e: &MemoryEntry, now: f64) -> StoreResult<bool>;
    /// Deletes memory `id` and its revisions; whether it existed.
    async fn delete(&mut self, key: &SessionKey, id: &str) -> StoreResult<bool>;
    /// Keeps the user within `--max-memories-per-user`.
    async fn trim(&mut self, key: &SessionKey) -> StoreResult<()>;
}

/// [`super::MemoryStore::apply_memory_changes`] for any backend, in `tx`: the session and
/// mark checks first (`None`: refused, the caller rolls back), then the changes, then the trim
/// when something was added.
pub(crate) async fn apply<T: ChangeTx>(
    tx: &mut T,
    key: &SessionKey,
    from: IngestMark,
    to: IngestMark,
    changes: &[MemoryChange],
) -> StoreResult<Option<Applied>> {
    if !tx.same_session(key, from.session_create_time).await?
        || !tx.move_mark(key, from, to).await?
    {
        return Ok(None);
    }
    let mut applied = Applied::default();
    let now = crate::event::now_ts();
    for change in changes {
        match change {
            MemoryChange::Add(e) => applied.added += usize::from(tx.add(key, e).await?),
            MemoryChange::Update(e) => {
                applied.updated += usize::from(tx.update(key, e, now).await?)
            }
            MemoryChange::Delete(id) => applied.deleted += usize::from(tx.delete(key, id).await?),
        }
    }
    if applied.added > 0 {
        tx.trim(key).await?;
    }
    Ok(Some(applied))
}
