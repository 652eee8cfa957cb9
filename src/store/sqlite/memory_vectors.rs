//! Memory vectors on SQLite (migrations/sqlite/0016_memory_vectors.sql): float32 blobs in
//! `memory_entries.embedding`, compared with sqlite-vec's `vec_distance_cosine`, which
//! [`super::vec_extension`] puts on every connection.
//!
//! A search of a space of 128 values or more ranks the user's vectors by their signs first
//! (`memory_vector_bits`, migrations/sqlite/0018_memory_vector_bits.sql: a 32nd of each vector,
//! compared by Hamming distance; keyed by the user's part of the space since
//! 0022_memory_vector_parts.sql) and measures only the nearest [`rescored`] exactly: reading
//! every vector of a user with 100,000 memories took 160 ms, the bits 10 ms
//! (docs/performance.md#memory-search). A user with no more vectors than are rescored is
//! measured whole, so the ranking is exact for them; past that it is approximate, as
//! PostgreSQL's HNSW index is. Shorter vectors are always scanned exactly.

use super::memory::entry_of;
use super::*;
use crate::store::memory::vectors::{
    nearest_first, vector_blob, NearMemory, PendingMemory, VectorSpace, VectorStore, VectorSupport,
    MAX_CLAIM,
};
use async_trait::async_trait;
use sqlx::Row;

/// The shortest vectors ranked by their signs first (the migration's `length >= 512`).
const BITS_MIN_DIMS: u32 = 128;

/// How many of the user's vectors nearest by their signs are measured exactly for a search
/// of `limit`: enough that the exact nearest are among them (recall@10 1.000 at 100,000
/// memories in `agentd-bench memory`), few enough to stay cheap.
fn rescored(limit: usize) -> usize {
    limit.saturating_mul(8).clamp(200, 2_000)
}

/// Every vector of the user measured: for short vectors.
const NEAREST_EXACT: &str = "SELECT session_id, event_id, author, timestamp, text, content,
        vec_distance_cosine(embedding, ?4) AS distance
   FROM memory_entries
  WHERE app_name = ?1 AND user_id = ?2 AND space = ?3 AND embedding IS NOT NULL
  ORDER BY distance IS NULL, distance, timestamp DESC, event_id
  LIMIT ?5";

/// The user's `?6` vectors nearest by their signs (the primary key's range of the user's part
/// of the space), then those measured exactly.
const NEAREST_BY_BITS: &str = "WITH near AS (
     SELECT b.id FROM memory_vector_bits b
      WHERE b.part = (SELECT part FROM memory_vector_parts
                       WHERE app_name = ?1 AND user_id = ?2 AND space = ?3)
      ORDER BY agentd_hamming(b.bits, vec_quantize_binary(?4))
      LIMIT ?6)
 SELECT m.session_id, m.event_id, m.author, m.timestamp, m.text, m.content,
        vec_distance_cosine(m.embedding, ?4) AS distance
   FROM near JOIN memory_entries m ON m.id = near.id
  WHERE m.app_name = ?1 AND m.user_id = ?2 AND m.space = ?3 AND m.embedding IS NOT NULL
  ORDER BY distance IS NULL, distance, m.timestamp DESC, m.event_id
  LIMIT ?5";

#[async_trait]
impl VectorStore for SqliteStore {
    fn vector_support(&self) -> VectorSupport {
        if super::vec_extension::registered() {
            VectorSupport::Available
        } else {
            VectorSupport::Missing("sqlite-vec could not be registered with SQLite".into())
        }
    }

    async fn adopt_space(&self, app: &str, space: &VectorSpace) -> StoreResult<bool> {
        if self.current_space(app).await?.as_deref() == Some(space.name.as_str()) {
            return Ok(false);
        }
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        let reset = sqlx::query(
            "UPDATE memory_entries SET embedding = NULL, space = NULL, claimed_until = NULL
              WHERE app_name = ? AND embedding IS NOT NULL AND space IS NOT ?",
        )
        .bind(app)
        .bind(&space.name)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let changed = sqlx::query(
            "INSERT INTO memory_spaces (app_name, space) VALUES (?1, ?2)
             ON CONFLICT (app_name) DO UPDATE SET space = excluded.space
              WHERE memory_spaces.space IS NOT excluded.space",
        )
        .bind(app)
        .bind(&space.name)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(reset > 0 || changed > 0)
    }

    async fn current_space(&self, app: &str) -> StoreResult<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT space FROM memory_spaces WHERE app_name = ?")
                .bind(app)
                .fetch_optional(&self.reader)
                .await?,
        )
    }

    async fn defer_pending(
        &self,
        app: &str,
        memories: &[(String, String)],
        delay: Duration,
    ) -> StoreResult<()> {
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        for (user, event_id) in memories {
            sqlx::query(
                "UPDATE memory_entries SET claimed_until = ?
                  WHERE app_name = ? AND user_id = ? AND event_id = ? AND embedding IS NULL",
            )
            .bind(now_ts() + delay.as_secs_f64())
            .bind(app)
            .bind(user)
            .bind(event_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn claim_pending(
        &self,
        app: &str,
        limit: usize,
        lease: Duration,
    ) -> StoreResult<Vec<PendingMemory>> {
        let now = now_ts();
        // One writer at a time: the select and the claim cannot interleave with another's.
        let rows: Vec<PendingMemory> = sqlx::query_as(
            "UPDATE memory_entries SET claimed_until = ?3
              WHERE id IN (SELECT id FROM memory_entries
                            WHERE app_name = ?1 AND embedding IS NULL
                              AND (claimed_until IS NULL OR claimed_until < ?2)
                            LIMIT ?4)
              RETURNING user_id, event_id, text",
        )
        .bind(app)
        .bind(now)
        .bind(now + lease.as_secs_f64())
        .bind(limit.min(MAX_CLAIM) as i64)
        .fetch_all(self.writer())
        .await?;
        Ok(rows)
    }

    async fn store_vectors(
        &self,
        app: &str,
        space: &VectorSpace,
        vectors: &[(PendingMemory, Vec<f32>)],
    ) -> StoreResult<usize> {
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        let mut stored = 0;
        for (p, v) in vectors {
            stored += sqlx::query(
                "UPDATE memory_entries SET embedding = ?, space = ?, claimed_until = NULL
                  WHERE app_name = ? AND user_id = ? AND event_id = ? AND text = ?",
            )
            .bind(vector_blob(v))
            .bind(&space.name)
            .bind(app)
            .bind(&p.user_id)
            .bind(&p.event_id)
            .bind(&p.text)
            .execute(&mut *tx)
            .await?
            .rows_affected() as usize;
        }
        tx.commit().await?;
        Ok(stored)
    }

    async fn pending_count(&self, app: &str) -> StoreResult<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM memory_entries WHERE app_name = ? AND embedding IS NULL",
        )
        .bind(app)
        .fetch_one(&self.reader)
        .await?;
        Ok(n as u64)
    }

    async fn nearest_memories(
        &self,
        app: &str,
        user: &str,
        space: &VectorSpace,
        vector: &[f32],
        limit: usize,
    ) -> StoreResult<Vec<NearMemory>> {
        if limit == 0 || vector.len() != space.dims as usize {
            return Ok(vec![]);
        }
        let by_bits = space.dims >= BITS_MIN_DIMS && space.dims % 8 == 0;
        let query = sqlx::query(if by_bits {
            NEAREST_BY_BITS
        } else {
            NEAREST_EXACT
        })
        .bind(app)
        .bind(user)
        .bind(&space.name)
        .bind(vector_blob(vector))
        .bind(limit.min(i64::MAX as usize) as i64);
        let query = if by_bits {
            query.bind(rescored(limit) as i64)
        } else {
            query
        };
        let rows = query.fetch_all(&self.reader).await?;
        let rows = rows
            .iter()
            .map(|r| Ok((entry_of(r)?, r.try_get::<Option<f64>, _>("distance")?)))
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(nearest_first(rows, limit))
    }
}
