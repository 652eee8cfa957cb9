//! Users with more memories than an exact scan is for: PostgreSQL's HNSW index (its plan
//! without statistics) and SQLite's ranking by the vectors' signs, each against an exact
//! scan, with another user's nearer vectors never in the results.

use super::*;
use crate::postgres_backends;

/// A user with more vectors than an exact scan is for (2,000) is searched through the HNSW
/// index: the plan says so without statistics, the nearest come back in order, and another
/// user's vectors, nearer still, never do.
async fn a_large_user_is_searched_through_the_hnsw_index(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store: Arc<dyn Store> = db.store().await;
    let space = VectorSpace {
        name: "big/8".into(),
        dims: 8,
    };
    store.adopt_space(APP, &space).await.unwrap();
    // 2,500 memories of u1 at angles 0.001 apart; 50 of u2 right at the query's angle.
    let mut angle = std::collections::HashMap::new();
    for i in 0..2550 {
        let (user, theta) = if i < 2500 {
            ("u1", i as f64 * 0.001)
        } else {
            ("u2", 1.0)
        };
        let e = agentd::store::memory::fact_entry("user", &format!("fact {i}")).unwrap();
        store.insert_memory(APP, user, &e).await.unwrap();
        angle.insert(e.event_id, theta);
    }
    loop {
        let pending = store
            .claim_pending(APP, 256, Duration::from_secs(60))
            .await
            .unwrap();
        if pending.is_empty() {
            break;
        }
        let vectors: Vec<_> = pending
            .into_iter()
            .map(|p| {
                let t = angle[&p.event_id];
                let mut v = vec![0.0f32; 8];
                v[0] = t.cos() as f32;
                v[1] = t.sin() as f32;
                (p, v)
            })
            .collect();
        store.store_vectors(APP, &space, &vectors).await.unwrap();
    }
    let query = [
        1.0f64.cos() as f32,
        1.0f64.sin() as f32,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ];
    let near = store
        .nearest_memories(APP, "u1", &space, &query, 5)
        .await
        .unwrap();
    // The index is approximate: the nearest five lie among the ten nearest, u1's only,
    // nearest first.
    let got: Vec<&str> = near.iter().map(|n| n.entry.text.as_str()).collect();
    assert_eq!(got.len(), 5);
    for text in &got {
        let i: i64 = text.trim_start_matches("fact ").parse().unwrap();
        assert!((995..=1005).contains(&i), "{got:?}");
    }
    assert!(near.windows(2).all(|w| w[0].distance <= w[1].distance));
    // By words, a user this large is searched through the words' index: the memory with both
    // words first, and only the user's.
    let found = store
        .search_memory(APP, "u1", "fact 1000", 5)
        .await
        .unwrap();
    assert_eq!(found[0].text, "fact 1000");
    assert_eq!(found.len(), 5);
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    if backend == Backend::Citus {
        // On Citus the search is one call, run whole on the user's worker: there it plans as
        // on one PostgreSQL, below (a coordinator's EXPLAIN of the statement would not show
        // the function's settings).
        let delegated: bool = sqlx::query_scalar(
            "SELECT distribution_argument_index IS NOT NULL FROM pg_dist_object
              WHERE objid = to_regprocedure(
                'agentd_memory_nearest_v1(text, text, text, integer, text, integer)')",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(delegated);
        return;
    }
    // The search itself went through the index: this transaction's own index statistics.
    let mut tx = pool.begin().await.unwrap();
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT event_id FROM agentd_memory_nearest_v1('recall', 'u1', 'big/8', 8, \
         '[1,0,0,0,0,0,0,0]', 5)",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(rows.len(), 5);
    let scans: i64 =
        sqlx::query_scalar("SELECT pg_stat_get_xact_numscans('memory_entries_hnsw_8'::regclass)")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert!(scans >= 1, "the search did not use the HNSW index");
    tx.rollback().await.unwrap();
    // The plan of the index search, as the function runs it, with no statistics.
    let mut tx = pool.begin().await.unwrap();
    for set in [
        "SET LOCAL enable_sort = off",
        "SET LOCAL hnsw.iterative_scan = strict_order",
    ] {
        sqlx::query(set).execute(&mut *tx).await.unwrap();
    }
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT m.event_id FROM memory_entries m
          WHERE m.app_name = 'recall' AND m.user_id = 'u1' AND m.space = 'big/8'
            AND vector_dims(m.embedding) = 8
          ORDER BY m.embedding::vector(8) <=> '[1,0,0,0,0,0,0,0]'::vector(8) LIMIT 5",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("memory_entries_hnsw_8"), "{plan}");
    // And the words' plan of agentd_memory_by_words_v1 for a user past 2,000 memories (its
    // reads: tests/plans.rs).
    sqlx::query("SET LOCAL enable_seqscan = off")
        .execute(&mut *tx)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT m.event_id FROM memory_entries m, memory_tsquery('\"fact\" or \"1000\"') AS t(q)
          WHERE m.app_name || '' = 'recall' AND m.user_id = 'u1' COLLATE \"C\" AND m.tsv @@ t.q
          ORDER BY ts_rank(m.tsv, t.q) DESC, m.\"timestamp\" DESC, m.event_id LIMIT 5",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("memory_entries_tsv"), "{plan}");
}

/// On SQLite, a user with more vectors than a search measures exactly (200 for a top 5) is
/// ranked by the vectors' signs first (migrations/sqlite/0018_memory_vector_bits.sql, 0022), then
/// measured: the nearest five are exactly an exact scan's, another user's vectors (nearer
/// still) never come back, and a deleted or re-embedded memory leaves the ranking at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_sqlite_user_is_ranked_by_signs_then_measured() {
    let db = TestDb::new(Backend::Sqlite).await;
    let store: Arc<dyn Store> = db.store().await;
    const DIMS: usize = 384;
    let space = VectorSpace {
        name: "big/384".into(),
        dims: DIMS as u32,
    };
    store.adopt_space(APP, &space).await.unwrap();
    // Seeded values in [-1, 1).
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut unit = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    };
    let base: Vec<f32> = (0..DIMS).map(|_| unit()).collect();
    // u1: 2,380 memories anywhere, 20 near `base` at growing distances; u2: 50 right at it.
    let mut vectors = std::collections::HashMap::new();
    for i in 0..2450 {
        let v: Vec<f32> = match i {
            0..=2379 => (0..DIMS).map(|_| unit()).collect(),
            2380..=2399 => {
                let k = (i - 2379) as f32 * 0.03;
                base.iter().map(|b| b + k * unit()).collect()
            }
            _ => base.clone(),
        };
        let user = if i < 2400 { "u1" } else { "u2" };
        let e = agentd::store::memory::fact_entry("user", &format!("fact {i}")).unwrap();
        store.insert_memory(APP, user, &e).await.unwrap();
        vectors.insert(e.event_id, (user, v));
    }
    loop {
        let pending = store
            .claim_pending(APP, 256, Duration::from_secs(60))
            .await
            .unwrap();
        if pending.is_empty() {
            break;
        }
        let batch: Vec<_> = pending
            .into_iter()
            .map(|p| {
                let v = vectors[&p.event_id].1.clone();
                (p, v)
            })
            .collect();
        store.store_vectors(APP, &space, &batch).await.unwrap();
    }
    let query: Vec<f32> = base.iter().map(|b| b + 0.01 * unit()).collect();
    let cosine = |a: &[f32], b: &[f32]| {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
        1.0 - dot / (na * nb)
    };
    let exact = |vectors: &std::collections::HashMap<String, (&str, Vec<f32>)>| {
        let mut all: Vec<(f32, String)> = vectors
            .iter()
            .filter(|(_, (u, _))| *u == "u1")
            .map(|(id, (_, v))| (cosine(&query, v), id.clone()))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        all.into_iter()
            .take(5)
            .map(|(_, id)| id)
            .collect::<Vec<_>>()
    };
    let nearest = |store: Arc<dyn Store>, query: Vec<f32>| {
        let space = space.clone();
        async move {
            store
                .nearest_memories(APP, "u1", &space, &query, 5)
                .await
                .unwrap()
                .into_iter()
                .map(|n| n.entry.event_id)
                .collect::<Vec<_>>()
        }
    };
    let want = exact(&vectors);
    assert_eq!(nearest(store.clone(), query.clone()).await, want);
    // The nearest forgotten: the next five are an exact scan's again.
    assert!(store.delete_memory(APP, "u1", &want[0]).await.unwrap());
    vectors.remove(&want[0]);
    let want = exact(&vectors);
    assert_eq!(nearest(store.clone(), query.clone()).await, want);
    // A new space: no vector of the old one is searched.
    let other = VectorSpace {
        name: "other/384".into(),
        dims: DIMS as u32,
    };
    store.adopt_space(APP, &other).await.unwrap();
    assert!(nearest(store.clone(), query.clone()).await.is_empty());
    let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
    let bits: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_vector_bits")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(bits, 0, "bits of cleared vectors are left");
    let parts: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_vector_parts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(parts, 0, "a part with no vectors is left");
}

postgres_backends!(a_large_user_is_searched_through_the_hnsw_index);
