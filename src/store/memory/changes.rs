//! What memory extraction ([`crate::memory::extract`]) does to a user's memories: facts
//! added, updated (the earlier text kept as a revision) and deleted, applied together with the
//! session's mark in one transaction ([`super::MemoryStore::apply_memory_changes`]).

use super::MemoryEntry;

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
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRevision {
    /// 1 for the memory's first text, then 2, 3, …; the memory itself is the next one.
    pub revision: i64,
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
