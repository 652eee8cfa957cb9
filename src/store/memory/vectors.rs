//! Memory vectors: each memory's embedding, stored beside its text, so a search finds what
//! a user said by meaning as well as by words ([`super::fusion`] ranks both together).
//!
//! A memory is embedded **after** it is stored, by [`crate::memory::embedder`]: adding a
//! session never waits for an embedding provider. A memory without a vector of its app's
//! current space is *pending*; the embedder claims pending memories for a short lease (so
//! replicas share the work and a killed replica's claims expire), embeds them in batches and
//! stores the vectors. Vectors of another space (the app changed its embedding model or
//! size) are never compared with the current one: adopting a new space makes every memory of
//! the app pending again, and an embedder whose space is no longer the app's stores nothing.
//!
//! SQLite stores vectors as float32 blobs searched with `sqlite-vec`; PostgreSQL needs the
//! pgvector extension, and without it memory search stays full-text only
//! ([`VectorSupport::Missing`]).

use super::MemoryEntry;
use crate::store::StoreResult;
use async_trait::async_trait;
use std::time::Duration;

/// Whether this database can store and search vectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VectorSupport {
    Available,
    /// Why not (PostgreSQL without pgvector): memory search is full-text only.
    Missing(String),
}

/// The space of an app's vectors: its embedding model and size (`model/dims`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorSpace {
    pub name: String,
    pub dims: u32,
}

/// A memory waiting for its vector, claimed by one embedder until its lease ends.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PendingMemory {
    pub user_id: String,
    pub event_id: String,
    pub text: String,
}

/// A memory found by its vector, with its cosine distance to the query (0 the same
/// direction, 2 the opposite).
#[derive(Debug, Clone, PartialEq)]
pub struct NearMemory {
    pub entry: MemoryEntry,
    pub distance: f64,
}

/// Most memories one claim takes.
pub const MAX_CLAIM: usize = 256;

#[async_trait]
pub trait VectorStore: Send + Sync {
    /// Whether vectors can be stored here (decided when the store opened).
    fn vector_support(&self) -> VectorSupport;

    /// Makes `space` app `app`'s current one: when it was another, every memory of the app
    /// with a vector of another space becomes pending (the app changed its model). Cheap when
    /// it did not change. Returns whether it changed.
    async fn adopt_space(&self, app: &str, space: &VectorSpace) -> StoreResult<bool>;

    /// App `app`'s current space (its name), if it has one.
    async fn current_space(&self, app: &str) -> StoreResult<Option<String>>;

    /// Puts off claimed memories of `app` (`(user, event_id)`) for `delay`: texts the provider
    /// refuses, so they do not hold back the memories after them.
    async fn defer_pending(
        &self,
        app: &str,
        memories: &[(String, String)],
        delay: Duration,
    ) -> StoreResult<()>;

    /// Claims up to `limit` pending memories of `app` (none claimed by another embedder whose
    /// lease is still running) for `lease`.
    async fn claim_pending(
        &self,
        app: &str,
        limit: usize,
        lease: Duration,
    ) -> StoreResult<Vec<PendingMemory>>;

    /// Stores the vectors of claimed memories (each with the memory as claimed) in `space`, in
    /// one transaction. A memory deleted meanwhile is skipped, and so is one whose text is no
    /// longer the one embedded (an extraction updated it: it waits for a vector of its new
    /// text). Returns how many were stored.
    async fn store_vectors(
        &self,
        app: &str,
        space: &VectorSpace,
        vectors: &[(PendingMemory, Vec<f32>)],
    ) -> StoreResult<usize>;

    /// How many memories of `app` wait for a vector (the tests and the benchmark wait on it).
    async fn pending_count(&self, app: &str) -> StoreResult<u64>;

    /// The `limit` memories of `(app, user)` nearest to `vector` in `space`, nearest first.
    /// Only that user's memories are ever compared.
    async fn nearest_memories(
        &self,
        app: &str,
        user: &str,
        space: &VectorSpace,
        vector: &[f32],
        limit: usize,
    ) -> StoreResult<Vec<NearMemory>>;
}

/// Rows of a nearest-memories query as the answer: each memory once (its first row), those
/// without a distance dropped (a vector of no direction has none), nearest first (then newer,
/// then by id), at most `limit`.
pub(crate) fn nearest_first(
    rows: Vec<(MemoryEntry, Option<f64>)>,
    limit: usize,
) -> Vec<NearMemory> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<NearMemory> = rows
        .into_iter()
        .filter_map(|(entry, d)| {
            let distance = d.filter(|d| d.is_finite())?;
            seen.insert(entry.event_id.clone())
                .then_some(NearMemory { entry, distance })
        })
        .collect();
    out.sort_by(|a, b| {
        a.distance
            .total_cmp(&b.distance)
            .then(b.entry.timestamp.total_cmp(&a.entry.timestamp))
            .then_with(|| a.entry.event_id.cmp(&b.entry.event_id))
    });
    out.truncate(limit);
    out
}

/// A vector as pgvector's text form: `[0.1,0.2,…]`.
pub(crate) fn vector_text(v: &[f32]) -> String {
    let mut s = String::with_capacity(v.len() * 10 + 2);
    s.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&x.to_string());
    }
    s.push(']');
    s
}

/// A vector as sqlite-vec's blob form: little-endian float32s.
pub(crate) fn vector_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_memory_once_nearest_first() {
        let e = |id: &str| MemoryEntry {
            session_id: String::new(),
            event_id: id.into(),
            author: "user".into(),
            timestamp: 0.0,
            text: id.into(),
            content: Default::default(),
        };
        let rows = vec![
            (e("b"), Some(0.3)),
            (e("a"), Some(0.1)),
            (e("b"), Some(0.3)),
            (e("z"), Some(f64::NAN)),
            (e("y"), None),
            (e("c"), Some(0.2)),
        ];
        let ids: Vec<String> = nearest_first(rows, 2)
            .into_iter()
            .map(|n| n.entry.event_id)
            .collect();
        assert_eq!(ids, ["a", "c"]);
    }

    #[test]
    fn vectors_in_both_wire_forms() {
        assert_eq!(vector_text(&[1.0, -0.5, 0.25]), "[1,-0.5,0.25]");
        assert_eq!(vector_text(&[]), "[]");
        assert_eq!(
            vector_blob(&[1.0, -2.0]),
            [0, 0, 128, 63, 0, 0, 0, 192].to_vec()
        );
    }
}
