//! Memory vectors on SQLite (migrations/sqlite/0016_memory_vectors.sql): float32 blobs in
//! `memory_entries.embedding`, compared with sqlite-vec's `vec_distance_cosine`, which
//! [`register_sqlite_vec`] puts on every connection. A search reads only the user's rows (the
//! `(app_name, user_id, event_id)` index) and measures each: exact, no index to tune.

use super::memory::entry_of;
use super::*;
use crate::store::memory::vectors::{
    nearest_first, vector_blob, NearMemory, PendingMemory, VectorSpace, VectorStore, VectorSupport,
    MAX_CLAIM,
};
use async_trait::async_trait;
use sqlx::Row;

/// Whether [`register_sqlite_vec`] succeeded.
static SQLITE_VEC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Registers sqlite-vec with the SQLite sqlx bundles, for every connection opened from now
/// on. Idempotent.
pub(super) fn register_sqlite_vec() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        type Init = unsafe extern "C" fn(
            *mut libsqlite3_sys::sqlite3,
            *mut *mut std::os::raw::c_char,
            *const libsqlite3_sys::sqlite3_api_routines,
        ) -> std::os::raw::c_int;
        // SAFETY: `sqlite3_vec_init` is sqlite-vec's extension entry point, which has exactly
        // the `Init` signature; the crate declares it without arguments. It is compiled
        // against the same SQLite (SQLITE_CORE), and registering an auto extension only
        // stores the pointer, which is 'static.
        let rc = unsafe {
            let init =
                std::mem::transmute::<*const (), Init>(sqlite_vec::sqlite3_vec_init as *const ());
            libsqlite3_sys::sqlite3_auto_extension(Some(init))
        };
        if rc == libsqlite3_sys::SQLITE_OK {
            SQLITE_VEC.store(true, std::sync::atomic::Ordering::Relaxed);
        } else {
            tracing::error!(
                rc,
                "could not register sqlite-vec; memory search is full-text only"
            );
        }
    });
}

#[async_trait]
impl VectorStore for SqliteStore {
    fn vector_support(&self) -> VectorSupport {
        if SQLITE_VEC.load(std::sync::atomic::Ordering::Relaxed) {
            VectorSupport::Available
        } else {
            VectorSupport::Missing("sqlite-vec could not be registered with SQLite".into())
        }
    }

    async fn adopt_space(&self, app: &str, space: &VectorSpace) -> StoreResult<bool> {
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
        let rows = sqlx::query(
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
        rows.iter()
            .map(|r| {
                Ok(PendingMemory {
                    user_id: r.try_get("user_id")?,
                    event_id: r.try_get("event_id")?,
                    text: r.try_get("text")?,
                })
            })
            .collect()
    }

    async fn store_vectors(
        &self,
        app: &str,
        space: &VectorSpace,
        vectors: &[(String, String, Vec<f32>)],
    ) -> StoreResult<usize> {
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        let mut stored = 0;
        for (user, event_id, v) in vectors {
            stored += sqlx::query(
                "UPDATE memory_entries SET embedding = ?, space = ?, claimed_until = NULL
                  WHERE app_name = ? AND user_id = ? AND event_id = ?",
            )
            .bind(vector_blob(v))
            .bind(&space.name)
            .bind(app)
            .bind(user)
            .bind(event_id)
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
        let rows = sqlx::query(
            "SELECT session_id, event_id, author, timestamp, text, content,
                    vec_distance_cosine(embedding, ?4) AS distance
               FROM memory_entries
              WHERE app_name = ?1 AND user_id = ?2 AND space = ?3 AND embedding IS NOT NULL
              ORDER BY distance, timestamp DESC, event_id
              LIMIT ?5",
        )
        .bind(app)
        .bind(user)
        .bind(&space.name)
        .bind(vector_blob(vector))
        .bind(limit.min(i64::MAX as usize) as i64)
        .fetch_all(&self.reader)
        .await?;
        let rows = rows
            .iter()
            .map(|r| Ok((entry_of(r)?, r.try_get::<Option<f64>, _>("distance")?)))
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(nearest_first(rows, limit))
    }
}
