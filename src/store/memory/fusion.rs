//! Hybrid ranking: the full-text ranking and the vector ranking of a memory search fused by
//! weighted reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009): a memory scores
//! `Σ weight / (k + rank)` over the rankings it appears in.
//!
//! RRF needs no common scale between `ts_rank` (or FTS5's bm25) and cosine distance, which
//! have none: only the order within each ranking counts, so a memory both rankings place
//! high beats one only a single ranking found. The paper's `k` = 60 with equal weights is made
//! for rankers of like quality; memory questions are mostly paraphrases, where a shared common
//! word ("work", "morning") is weak evidence and the vector ranking's first places are strong.
//! So `k` is small (the first places count) and the words weigh [`TEXT_WEIGHT`]: a memory the
//! words rank first rises a few places in meaning, but does not overtake the memory nearest in
//! meaning. Measured with a real model (tests/memory_recall.rs, docs/memory.md#search): equal
//! weights and `k` = 60 find 84–86% of the questions' facts in the top 3, these 94–96%.
//!
//! A memory only the words found counts fully when the vector ranking holds every memory of
//! the user that has a vector (it returned fewer than it was asked for): it has no vector yet
//! (or one of an earlier model), and its words are all there is to go on. When the vector
//! ranking is full, such a memory is far in meaning, and its words weigh [`TEXT_WEIGHT`].

use super::vectors::NearMemory;
use super::MemoryEntry;
use std::collections::HashMap;

/// RRF's `k`: how much the first places outweigh the rest (1/3, 1/4, 1/5, …).
pub const RRF_K: f64 = 2.0;

/// How much the words ranking counts beside the vector ranking.
pub const TEXT_WEIGHT: f64 = 0.3;

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

/// Fuses the two rankings (each best first; the vector ranking was asked for `candidates`) and
/// keeps the best `limit`: higher score first, then newer, then by id, so equal inputs always
/// give the same order.
pub fn fuse(
    text: Vec<MemoryEntry>,
    near: Vec<NearMemory>,
    candidates: usize,
    limit: usize,
) -> Vec<MemoryHit> {
    let mut hits: HashMap<String, MemoryHit> = HashMap::new();
    let full = near.len() >= candidates;
    for (i, near) in near.into_iter().enumerate() {
        let hit = ranked(&mut hits, near.entry, i + 1, 1.0);
        hit.vector_rank = Some(i + 1);
        hit.similarity = Some(1.0 - near.distance);
    }
    for (i, entry) in text.into_iter().enumerate() {
        let weight = match hits.get(&entry.event_id) {
            Some(_) => TEXT_WEIGHT,
            None if full => TEXT_WEIGHT,
            None => 1.0,
        };
        ranked(&mut hits, entry, i + 1, weight).text_rank = Some(i + 1);
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

/// `entry`'s hit, with `weight / (k + place)` added for its place in one ranking.
fn ranked(
    hits: &mut HashMap<String, MemoryHit>,
    entry: MemoryEntry,
    place: usize,
    weight: f64,
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
    hit.score += weight / (RRF_K + place as f64);
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
            vec![near("b", 0.2), near("c", 0.1)],
            2,
            10,
        );
        let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        // b: 1/3 + 0.3/4; c: 1/4; a: 0.3/3 (the vector ranking is full: a is far in meaning).
        assert_eq!(ids, ["b", "c", "a"]);
        assert_eq!(hits[0].text_rank, Some(2));
        assert_eq!(hits[0].vector_rank, Some(1));
        assert!((hits[0].similarity.unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(hits[2].vector_rank, None);
        assert!((hits[0].score - (1.0 / 3.0 + 0.3 / 4.0)).abs() < 1e-12);
        assert!((hits[2].score - 0.3 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn the_nearest_in_meaning_keeps_its_place_against_a_shared_word() {
        // "how do I commute to work?": the words rank a memory that says "work" first, the
        // vectors rank the answer first and that memory second.
        let hits = fuse(
            vec![entry("work", 1.0), entry("answer", 1.0)],
            vec![near("answer", 0.4), near("work", 0.5), near("other", 0.6)],
            3,
            2,
        );
        assert_eq!(hits[0].id, "answer");
        // A memory the words rank first rises above the third in meaning.
        let hits = fuse(
            vec![entry("exact", 1.0)],
            vec![
                near("n1", 0.1),
                near("n2", 0.2),
                near("n3", 0.3),
                near("exact", 0.4),
            ],
            4,
            4,
        );
        let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["n1", "exact", "n2", "n3"]);
    }

    #[test]
    fn a_memory_without_a_vector_counts_by_its_words() {
        // The vector ranking holds fewer than asked for: every memory with a vector. "new" has
        // none yet, and the words rank it first: it ties with the nearest (and is newer).
        let hits = fuse(vec![entry("new", 5.0)], vec![near("old", 0.1)], 20, 10);
        let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["new", "old"]);
        assert!((hits[0].score - 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn the_limit_keeps_the_best() {
        let hits = fuse(vec![entry("a", 1.0), entry("b", 1.0)], vec![], 20, 1);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].id, "a");
        assert!(fuse(vec![], vec![], 20, 5).is_empty());
    }
}
