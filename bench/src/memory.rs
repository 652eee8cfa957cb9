//! `agentd-bench memory`: memory search at scale (issue 41's figures, docs/performance.md).
//!
//! One user with `--memories` memories (vectors of `--memory-dims` values near one of 500
//! topic centres, random but seeded, and texts of words from a 1,000-word vocabulary), beside 20 other users with 1,000
//! each. Timed, one search after another:
//!
//! - **agentd, hybrid**: `agentd::memory::search` (full-text and vector rankings fused), with
//!   an in-process embedding model, so the provider's time is not counted;
//! - **agentd, vector**: the store's nearest-memories call alone;
//! - **ceiling**: the database's own query for the same top 10, written by hand (pgvector's
//!   HNSW `ORDER BY … <=> … LIMIT 10` on the same table, or on SQLite the same two steps
//!   agentd takes, the user's vectors ranked by their signs and the nearest measured exactly),
//!   with nothing of agentd around it; on SQLite also the exact scan of every vector, for scale.
//!
//! Also each vector search's recall@10 against an exact scan, and the HNSW index's build time.

use crate::pg::Admin;
use crate::BenchArgs;
use agentd::model::embed::{Embedder, Embeddings, Purpose};
use agentd::model::ModelError;
use agentd::store::memory::vectors::VectorSpace;
use agentd::store::memory::{or_query, query_words};
use agentd::store::{Store, StoreLimits};
use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const APP: &str = "bench";
const USER: &str = "u1";
const OTHERS: usize = 20;
const PER_OTHER: usize = 1000;
const TOP: usize = 10;
/// Searches of each half run before any is timed.
const WARM_UP: usize = 50;

/// xorshift64*: seeded, so every run loads the same memories and asks the same questions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vector(&mut self, dims: usize) -> Vec<f32> {
        (0..dims).map(|_| self.unit()).collect()
    }
    /// A vector near one of `centers` (what embeddings of texts on a few hundred topics look
    /// like; uniformly random vectors have no neighbours worth the name).
    fn near(&mut self, centers: &[Vec<f32>]) -> Vec<f32> {
        let c = &centers[(self.next() % centers.len() as u64) as usize];
        c.iter().map(|x| x + 0.35 * self.unit()).collect()
    }
    fn words(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| format!("w{}", self.next() % 1000))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The query embedding: the next seeded random vector, instantly.
struct Fixed {
    dims: usize,
    rng: Mutex<Rng>,
}

#[async_trait::async_trait]
impl Embedder for Fixed {
    fn space(&self) -> String {
        format!("bench/{}", self.dims)
    }
    fn model(&self) -> &str {
        "bench"
    }
    fn dimensions(&self) -> u32 {
        self.dims as u32
    }
    async fn embed(&self, texts: &[String], _: Purpose) -> Result<Embeddings, ModelError> {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Embeddings {
            vectors: texts.iter().map(|_| rng.vector(self.dims)).collect(),
            tokens: 0,
        })
    }
}

fn text(v: &[f32]) -> String {
    let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(","))
}

fn blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

struct Row {
    user: String,
    id: String,
    text: String,
    vector: Vec<f32>,
}

/// Topic centres of the synthetic embeddings.
const TOPICS: usize = 500;

fn centers(dims: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng(0xc0ffee);
    (0..TOPICS).map(|_| rng.vector(dims)).collect()
}

fn rows(args: &BenchArgs) -> Vec<Row> {
    let centers = centers(args.memory_dims);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut out = Vec::with_capacity(args.memories + OTHERS * PER_OTHER);
    for i in 0..args.memories {
        out.push(Row {
            user: USER.into(),
            id: format!("m{i}"),
            text: format!("memory {i}: {}", rng.words(8)),
            vector: rng.near(&centers),
        });
    }
    for u in 0..OTHERS {
        for i in 0..PER_OTHER {
            out.push(Row {
                user: format!("other{u}"),
                id: format!("o{u}-{i}"),
                text: format!("memory {i}: {}", rng.words(8)),
                vector: rng.near(&centers),
            });
        }
    }
    out
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn line(out: &mut String, what: &str, h: &Histogram<u64>) {
    let _ = writeln!(
        out,
        "| {what} | {:.2} | {:.2} | {:.2} |",
        ms(h, 0.5),
        ms(h, 0.9),
        ms(h, 0.99)
    );
}

pub async fn run(args: &BenchArgs, admin: &Admin) -> Result<String> {
    let data = rows(args);
    let mut out = String::new();
    let citus = !admin.citus_workers().await?.is_empty();
    let _ = writeln!(
        out,
        "## Memory search: {} memories of one user ({} dims), {} of {OTHERS} other users\n",
        args.memories,
        args.memory_dims,
        OTHERS * PER_OTHER
    );
    let _ = writeln!(
        out,
        "`agentd-bench memory --memories {} --memory-dims {} --memory-queries {}` — milliseconds per search, one after another, top {TOP}.\n",
        args.memories, args.memory_dims, args.memory_queries
    );
    let pg = postgres(args, admin, &data, citus).await?;
    out.push_str(&pg);
    let lite = sqlite(args, &data).await?;
    out.push_str(&lite);
    Ok(out)
}

/// Migration 0019, whose function the PostgreSQL measures run beside 0024's.
const WORDS_0019: &str = include_str!("../../migrations/postgres/0019_memory_search.sql");

/// 0024's words function and 0019's (created as `agentd_bench_words_0019`), taking turns on
/// each of `n` queries.
async fn words_pair(
    pool: &sqlx::PgPool,
    queries: &[(String, Vec<f32>)],
    n: usize,
) -> Result<(Histogram<u64>, Histogram<u64>)> {
    let words = |function: &'static str| {
        move |i: usize| {
            let pool = pool.clone();
            // As the store sends a query (src/store/postgres/memory.rs).
            let words = or_query(&query_words(&queries[i].0), "or");
            async move {
                let ids: Vec<String> =
                    sqlx::query_scalar(&format!("SELECT event_id FROM {function}($1, $2, $3, $4)"))
                        .bind(APP)
                        .bind(USER)
                        .bind(words)
                        .bind(TOP as i32)
                        .fetch_all(&pool)
                        .await?;
                anyhow::ensure!(!ids.is_empty());
                Ok(())
            }
        }
    };
    time_pair(
        n,
        words("agentd_memory_by_words_v1"),
        words("agentd_bench_words_0019"),
    )
    .await
}

/// The searches' words and vectors (near the memories' topics), seeded.
fn queries(args: &BenchArgs) -> Vec<(String, Vec<f32>)> {
    let mut rng = Rng(11);
    let topics = centers(args.memory_dims);
    (0..args.memory_queries + 10)
        .map(|_| (rng.words(3), rng.near(&topics)))
        .collect()
}

/// agentd's three measures: the hybrid search (with an instant embedding model), the store's
/// nearest-memories call and its search by words, `n` of each.
async fn agentd_searches(
    store: &Arc<dyn Store>,
    space: &VectorSpace,
    queries: &[(String, Vec<f32>)],
    n: usize,
) -> Result<(Histogram<u64>, Histogram<u64>, Histogram<u64>)> {
    let embedder = Fixed {
        dims: space.dims as usize,
        rng: Mutex::new(Rng(7)),
    };
    // Every measure after the same warm-up of both halves: timed first and cold, the hybrid
    // search measured 35 ms on SQLite where it takes 26 once the pages the halves read are
    // cached, as they are for the measures after it.
    for (q, v) in queries.iter().take(WARM_UP) {
        store.search_memory(APP, USER, q, TOP).await?;
        store.nearest_memories(APP, USER, space, v, TOP).await?;
    }
    let hybrid = time(n, |i| {
        let q = queries[i].0.clone();
        let e = &embedder;
        async move {
            let free = agentd::usage::Prices::default();
            let charge = agentd::memory::charge::Charge::User(&free);
            let hits =
                agentd::memory::search(store.as_ref(), Some(e), charge, APP, USER, &q, TOP).await?;
            anyhow::ensure!(!hits.is_empty(), "a hybrid search found nothing");
            Ok(())
        }
    })
    .await?;
    let vector = time(n, |i| {
        let v = queries[i].1.clone();
        async move {
            let near = store.nearest_memories(APP, USER, space, &v, TOP).await?;
            anyhow::ensure!(near.len() == TOP, "{} of {TOP} nearest", near.len());
            Ok(())
        }
    })
    .await?;
    let words = time(n, |i| {
        let q = queries[i].0.clone();
        async move {
            let found = store.search_memory(APP, USER, &q, TOP).await?;
            anyhow::ensure!(!found.is_empty(), "a search by words found nothing");
            Ok(())
        }
    })
    .await?;
    Ok((hybrid, vector, words))
}

/// Times `n` calls each of `a` and `b`, one of each per query, taking turns at going first:
/// a pair measured so, unlike two measures one after the other, finds the same pages cached.
async fn time_pair<A, FutA, B, FutB>(
    n: usize,
    mut a: A,
    mut b: B,
) -> Result<(Histogram<u64>, Histogram<u64>)>
where
    A: FnMut(usize) -> FutA,
    FutA: std::future::Future<Output = Result<()>>,
    B: FnMut(usize) -> FutB,
    FutB: std::future::Future<Output = Result<()>>,
{
    let (mut ha, mut hb) = (Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?);
    for i in 0..10 {
        a(i).await?;
        b(i).await?;
    }
    for i in 0..n {
        let a_first = i % 2 == 0;
        for a_now in [a_first, !a_first] {
            let t = Instant::now();
            if a_now {
                a(i).await?;
                ha.record(t.elapsed().as_micros() as u64)?;
            } else {
                b(i).await?;
                hb.record(t.elapsed().as_micros() as u64)?;
            }
        }
    }
    Ok((ha, hb))
}

/// Times `searches` calls of `f` (each given the query's index).
async fn time<F, Fut>(n: usize, mut f: F) -> Result<Histogram<u64>>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut h = Histogram::<u64>::new(3)?;
    // Warm-up: the first searches load pages and plans.
    for i in 0..10 {
        f(i).await?;
    }
    for i in 0..n {
        let t = Instant::now();
        f(i).await?;
        h.record(t.elapsed().as_micros() as u64)?;
    }
    Ok(h)
}

async fn postgres(args: &BenchArgs, admin: &Admin, data: &[Row], citus: bool) -> Result<String> {
    let url = admin.create_database("memory").await?;
    let dims = args.memory_dims;
    let space = VectorSpace {
        name: format!("bench/{dims}"),
        dims: dims as u32,
    };
    // Migrates and installs the vector columns.
    let store = agentd::store::open(&url, 4, StoreLimits::default()).await?;
    if let agentd::store::memory::vectors::VectorSupport::Missing(why) = store.vector_support() {
        anyhow::bail!("no memory vectors on this PostgreSQL: {why} (scripts/pgvector.sh install)");
    }
    let pool = crate::pg::connect(&url, 2).await?;
    if !citus {
        // Never analyzed until the measures below say otherwise, wherever autovacuum runs.
        sqlx::query("ALTER TABLE memory_entries SET (autovacuum_enabled = false)")
            .execute(&pool)
            .await?;
    }
    let load = Instant::now();
    for chunk in data.chunks(1000) {
        sqlx::query(
            r#"INSERT INTO memory_entries
                   (app_name, user_id, session_id, event_id, author, "timestamp", text, content,
                    embedding, space)
               SELECT $1, r.u, '', r.id, 'user', 0, r.t,
                      jsonb_build_object('parts', jsonb_build_array(jsonb_build_object('text', r.t)),
                                         'role', 'user'),
                      r.v::vector, $2
                 FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[]) AS r(u, id, t, v)"#,
        )
        .bind(APP)
        .bind(&space.name)
        .bind(chunk.iter().map(|r| r.user.as_str()).collect::<Vec<_>>())
        .bind(chunk.iter().map(|r| r.id.as_str()).collect::<Vec<_>>())
        .bind(chunk.iter().map(|r| r.text.as_str()).collect::<Vec<_>>())
        .bind(chunk.iter().map(|r| text(&r.vector)).collect::<Vec<_>>())
        .execute(&pool)
        .await
        .context("loading memories")?;
    }
    let load_s = load.elapsed().as_secs_f64();
    // Room for the index build (as an operator would give it), on fresh connections.
    let db = url.rsplit('/').next().unwrap_or_default().to_string();
    sqlx::query(&format!(
        "ALTER DATABASE {db} SET maintenance_work_mem = '1GB'"
    ))
    .execute(&pool)
    .await?;
    let store = agentd::store::open(&url, 4, StoreLimits::default()).await?;
    // The words half by 0024's function and as before it (0019's, under another name), on
    // one PostgreSQL, taking turns on each query: first as a fresh deployment has the table,
    // never analyzed (no statistics, and no row count until an index is built), then after
    // the adoption's index build gave the planner the table's size.
    let queries = queries(args);
    let n = args.memory_queries;
    let mut words_pairs = Vec::new();
    if !citus {
        let sql = WORDS_0019
            .split_once("CREATE FUNCTION agentd_memory_by_words_v1(")
            .map(|(_, f)| format!("CREATE FUNCTION agentd_bench_words_0019({f}"))
            .context("0019's function")?;
        sqlx::raw_sql(&sql).execute(&pool).await?;
        words_pairs.push(("never analyzed", words_pair(&pool, &queries, n).await?));
    }
    let build = Instant::now();
    store.adopt_space(APP, &space).await?;
    let build_s = build.elapsed().as_secs_f64();
    if !citus {
        words_pairs.push(("its size known", words_pair(&pool, &queries, n).await?));
    }

    let (hybrid, vector, words) = agentd_searches(&store, &space, &queries, n).await?;
    // The ceiling: pgvector's own query on the same index, nothing else. On Citus, on the
    // worker holding the user's shard, against the shard itself (no Citus in between).
    let (ceiling_url, table) = if citus {
        let (shard, host, port): (i64, String, i32) = sqlx::query_as(
            "SELECT s.shardid, s.nodename, s.nodeport FROM citus_shards s
              WHERE s.table_name = 'memory_entries'::regclass
                AND s.shardid = get_shard_id_for_distribution_column('memory_entries', $1)",
        )
        .bind(USER)
        .fetch_one(&pool)
        .await
        .context("the user's shard")?;
        let node = crate::pg::with_host_port(&url, &format!("{host}:{port}"))?;
        (node, format!("memory_entries_{shard}"))
    } else {
        (url.clone(), "memory_entries".to_string())
    };
    let ceiling_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                for set in [
                    "SET hnsw.ef_search = 100",
                    "SET hnsw.iterative_scan = strict_order",
                    "SET enable_sort = off",
                ] {
                    sqlx::query(set).execute(&mut *conn).await?;
                }
                Ok(())
            })
        })
        .connect(&ceiling_url)
        .await?;
    let ceiling_sql = format!(
        "SELECT event_id FROM {table}
          WHERE app_name = $1 AND user_id = $2 AND vector_dims(embedding) = {dims}
          ORDER BY embedding::vector({dims}) <=> $3::vector({dims}) LIMIT {TOP}"
    );
    let ceiling = time(n, |i| {
        let pool = ceiling_pool.clone();
        let v = text(&queries[i].1);
        let sql = ceiling_sql.clone();
        async move {
            let ids: Vec<String> = sqlx::query_scalar(&sql)
                .bind(APP)
                .bind(USER)
                .bind(v)
                .fetch_all(&pool)
                .await?;
            anyhow::ensure!(ids.len() == TOP);
            Ok(())
        }
    })
    .await?;
    // Recall@10 of agentd's vector search against an exact scan (no index: the expression
    // does not match it).
    let mut found = 0usize;
    let recall_queries = 30.min(n);
    for (_, v) in queries.iter().take(recall_queries) {
        let near = store.nearest_memories(APP, USER, &space, v, TOP).await?;
        let exact: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT event_id FROM memory_entries WHERE app_name = $1 AND user_id = $2
              ORDER BY embedding <=> $3::vector LIMIT {TOP}"
        ))
        .bind(APP)
        .bind(USER)
        .bind(text(v))
        .fetch_all(&pool)
        .await?;
        found += near
            .iter()
            .filter(|n| exact.contains(&n.entry.event_id))
            .count();
    }
    let recall = found as f64 / (recall_queries * TOP) as f64;
    let server = admin.server_version().await.unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### {} ({server})\n\nLoaded in {load_s:.1} s; the HNSW index (m 16, ef_construction 64) built in {build_s:.1} s at adoption. Recall@{TOP} of agentd's vector search against an exact scan: {:.3} ({recall_queries} queries).\n",
        if citus { "Citus" } else { "PostgreSQL" },
        recall
    );
    let _ = writeln!(
        out,
        "| search | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|"
    );
    line(&mut out, "agentd, hybrid (words + vector, fused)", &hybrid);
    line(&mut out, "agentd, vector (the store's call)", &vector);
    line(&mut out, "agentd, words (the store's call)", &words);
    line(&mut out, "ceiling: pgvector's HNSW query alone", &ceiling);
    for (state, (after, before)) in &words_pairs {
        line(
            &mut out,
            &format!("words, 0024's function, table {state} (taking turns with the next)"),
            after,
        );
        line(
            &mut out,
            &format!("words, as before migration 0024 (0019's function), table {state}"),
            before,
        );
    }
    out.push('\n');
    Ok(out)
}

async fn sqlite(args: &BenchArgs, data: &[Row]) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}/bench.db", dir.path().display());
    let dims = args.memory_dims;
    let space = VectorSpace {
        name: format!("bench/{dims}"),
        dims: dims as u32,
    };
    // Registers sqlite-vec for every connection of this process, and migrates.
    let store = agentd::store::open(&url, 4, StoreLimits::default()).await?;
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    let load = Instant::now();
    let mut tx = pool.begin().await?;
    for r in data {
        sqlx::query(
            "INSERT INTO memory_entries
                 (app_name, user_id, session_id, event_id, author, timestamp, text, content,
                  embedding, space)
             VALUES (?, ?, '', ?, 'user', 0, ?, json_object('parts', json_array(json_object('text', ?)), 'role', 'user'), ?, ?)",
        )
        .bind(APP)
        .bind(&r.user)
        .bind(&r.id)
        .bind(&r.text)
        .bind(&r.text)
        .bind(blob(&r.vector))
        .bind(&space.name)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    let load_s = load.elapsed().as_secs_f64();
    store.adopt_space(APP, &space).await?;
    let queries = queries(args);
    let n = args.memory_queries;
    let (hybrid, vector, words) = agentd_searches(&store, &space, &queries, n).await?;
    // The ceiling: the same two steps written by hand (the user's vectors ranked by their
    // signs, the nearest 200 measured exactly, as the store does for a top 10), and, for
    // scale, the exact scan of every vector of the user.
    let by_bits = format!(
        "WITH near AS (SELECT b.id FROM memory_vector_bits b
                        WHERE b.part = (SELECT part FROM memory_vector_parts
                                         WHERE app_name = ?1 AND user_id = ?2 AND space = ?3)
                        ORDER BY agentd_hamming(b.bits, vec_quantize_binary(?4))
                        LIMIT 200)
         SELECT m.event_id FROM near JOIN memory_entries m ON m.id = near.id
          ORDER BY vec_distance_cosine(m.embedding, ?4) LIMIT {TOP}"
    );
    let exact = format!(
        "SELECT event_id FROM memory_entries WHERE app_name = ?1 AND user_id = ?2 AND space = ?3
          ORDER BY vec_distance_cosine(embedding, ?4) LIMIT {TOP}"
    );
    // The same two steps on the bits as they were kept before migration 0022 (keyed by app,
    // user and space), copied into a table of that shape.
    sqlx::raw_sql(
        "CREATE TABLE bench_bits_0018 (
             app_name TEXT NOT NULL, user_id TEXT NOT NULL, space TEXT NOT NULL,
             id INTEGER NOT NULL, bits BLOB NOT NULL,
             PRIMARY KEY (app_name, user_id, space, id)) WITHOUT ROWID;
         INSERT INTO bench_bits_0018
         SELECT p.app_name, p.user_id, p.space, b.id, b.bits
           FROM memory_vector_bits b JOIN memory_vector_parts p USING (part);",
    )
    .execute(&pool)
    .await?;
    let by_bits_0018 = format!(
        "WITH near AS (SELECT id FROM bench_bits_0018
                        WHERE app_name = ?1 AND user_id = ?2 AND space = ?3
                        ORDER BY agentd_hamming(bits, vec_quantize_binary(?4))
                        LIMIT 200)
         SELECT m.event_id FROM near JOIN memory_entries m ON m.id = near.id
          ORDER BY vec_distance_cosine(m.embedding, ?4) LIMIT {TOP}"
    );
    let hand = |sql: &String| {
        let (pool, queries, space, sql) = (pool.clone(), &queries, space.name.clone(), sql.clone());
        move |i: usize| {
            let (pool, v, space, sql) = (
                pool.clone(),
                blob(&queries[i].1),
                space.clone(),
                sql.clone(),
            );
            async move {
                let ids: Vec<String> = sqlx::query_scalar(&sql)
                    .bind(APP)
                    .bind(USER)
                    .bind(space)
                    .bind(v)
                    .fetch_all(&pool)
                    .await?;
                anyhow::ensure!(ids.len() == TOP);
                Ok(())
            }
        }
    };
    let mut ceilings = Vec::new();
    for sql in [&by_bits, &exact] {
        ceilings.push(time(n, hand(sql)).await?);
    }
    let pair_0022 = time_pair(n, hand(&by_bits), hand(&by_bits_0018)).await?;
    // Recall@10 of agentd's vector search against the exact scan.
    let mut found = 0usize;
    let recall_queries = 30.min(n);
    for (_, v) in queries.iter().take(recall_queries) {
        let near = store.nearest_memories(APP, USER, &space, v, TOP).await?;
        let exact: Vec<String> = sqlx::query_scalar(&exact)
            .bind(APP)
            .bind(USER)
            .bind(&space.name)
            .bind(blob(v))
            .fetch_all(&pool)
            .await?;
        found += near
            .iter()
            .filter(|n| exact.contains(&n.entry.event_id))
            .count();
    }
    let recall = found as f64 / (recall_queries * TOP) as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### SQLite (bundled, sqlite-vec {})\n\nLoaded in {load_s:.1} s. Recall@{TOP} of agentd's vector search (the user's vectors ranked by their signs, the nearest measured exactly) against an exact scan: {recall:.3} ({recall_queries} queries).\n",
        sqlite_vec_version(&pool).await
    );
    let _ = writeln!(
        out,
        "| search | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|"
    );
    line(&mut out, "agentd, hybrid (words + vector, fused)", &hybrid);
    line(&mut out, "agentd, vector (the store's call)", &vector);
    line(&mut out, "agentd, words (the store's call)", &words);
    line(
        &mut out,
        "ceiling: the same two steps by hand (bits, then 200 exactly)",
        &ceilings[0],
    );
    line(
        &mut out,
        "for scale: sqlite-vec's exact distance over every vector of the user",
        &ceilings[1],
    );
    line(
        &mut out,
        "the two steps by hand, on the bits of 0022 (taking turns with the next)",
        &pair_0022.0,
    );
    line(
        &mut out,
        "the two steps by hand, on the bits as kept before migration 0022",
        &pair_0022.1,
    );
    out.push('\n');
    Ok(out)
}

async fn sqlite_vec_version(pool: &sqlx::SqlitePool) -> String {
    sqlx::query_scalar::<_, String>("SELECT vec_version()")
        .fetch_one(pool)
        .await
        .unwrap_or_default()
}
