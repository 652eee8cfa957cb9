//! Hybrid ranking: the full-text ranking and the vector ranking of a memory search fused by
//! reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009): a memory scores
//! `Σ 1 / (k + rank)` over the rankings it appears in, with `k` = 60.
//!
//! RRF needs no common scale between `ts_rank` (or FTS5's bm25) and cosine distance, which
//! have none: only the order within each ranking counts, so a memory both rankings place
//! high beats one only a single ranking found.

use super::vectors::NearMemory;
use super::MemoryEntry;
use std::collections::HashMap;

/// RRF's `k`: how much the first places outweigh the rest.
pub const RRF_K: f64 = 60.0;

/// One memory a search found, with how it was found.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryHit {
    /// The memory's id (for raw memories, the event's id).
    pub id: String,
    #[serde(flatten)]
    pub entry: MemoryEntry,
    /// The fused score: higher is better.
    pub score: f64,
    /// Its place (1 = first) in the full-text ranking, if the words matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_rank: Option<usize>,
    /// Its place in the vector ranking, if the app's memory has vectors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vector_rank: Option<usize>,
    /// Cosine similarity to the query (1 the same direction), if ranked by vector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f64>,
}

/// Fuses the two rankings (each best first) and keeps the best `limit`: higher score first,
/// then newer, then by id, so equal inputs always give the same order.
pub fn fuse(text: Vec<MemoryEntry>, near: Vec<NearMemory>, limit: usize) -> Vec<MemoryHit> {
    let mut hits: HashMap<String, MemoryHit> = HashMap::new();
    for (i, entry) in text.into_iter().enumerate() {
        ranked(&mut hits, entry, i + 1).text_rank = Some(i + 1);
    }
    for (i, near) in near.into_iter().enumerate() {
        let hit = ranked(&mut hits, near.entry, i + 1);
        hit.vector_rank = Some(i + 1);
        hit.similarity = Some(1.0 - near.distance);
    }
    let mut hits: Vec<MemoryHit> = hits.into_values().collect();
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.entry.timestamp.total_cmp(&a.entry.timestamp))
            .then_with(|| a.id.cmp(&b.id))
    });
    hits.truncate(limit);
    hits
}

/// `entry`'s hit, with `1 / (k + place)` added for its place in one ranking.
fn ranked(
    hits: &mut HashMap<String, MemoryHit>,
    entry: MemoryEntry,
    place: usize,
) -> &mut MemoryHit {
    let hit = hits
        .entry(entry.event_id.clone())
        .or_insert_with(|| MemoryHit {
            id: entry.event_id.clone(),
            entry,
            score: 0.0,
            text_rank: None,
            vector_rank: None,
            similarity: None,
        });
    hit.score += 1.0 / (RRF_K + place as f64);
    hit
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Content;

    fn entry(id: &str, ts: f64) -> MemoryEntry {
        MemoryEntry {
            session_id: "s".into(),
            event_id: id.into(),
            author: "user".into(),
            timestamp: ts,
            text: id.into(),
            content: Content::default(),
        }
    }

    fn near(id: &str, distance: f64) -> NearMemory {
        NearMemory {
            entry: entry(id, 0.0),
            distance,
        }
    }

    #[test]
    fn found_by_both_beats_found_by_one() {
        let hits = fuse(
            vec![entry("a", 1.0), entry("b", 2.0)],
            vec![near("c", 0.1), near("b", 0.2)],
            10,
        );
        let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        // b: 1/62 + 1/62; a: 1/61 (text first); c: 1/61 (vector first), a is newer.
        assert_eq!(ids, ["b", "a", "c"]);
        assert_eq!(hits[0].text_rank, Some(2));
        assert_eq!(hits[0].vector_rank, Some(2));
        assert!((hits[0].similarity.unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(hits[1].vector_rank, None);
        assert!((hits[0].score - 2.0 / 62.0).abs() < 1e-12);
    }

    #[test]
    fn the_limit_keeps_the_best() {
        let hits = fuse(vec![entry("a", 1.0), entry("b", 1.0)], vec![], 1);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].id, "a");
        assert!(fuse(vec![], vec![], 5).is_empty());
    }
}
