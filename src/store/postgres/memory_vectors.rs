//! Memory vectors on PostgreSQL, with pgvector: `memory_entries.embedding vector`, compared
//! with `<=>` (cosine distance). A search is one call of `agentd_memory_nearest_v1`
//! (`memory_vectors.sql`): exact over the user's rows up to 2,000 vectors, the HNSW index of
//! the vector size beyond; on Citus, the call runs whole on the user's worker.
//!
//! pgvector is optional. [`PgStore::install_vectors`] runs at every start (after the
//! migrations): when the extension is available it creates it and adds the columns, once;
//! when it is not, agentd starts anyway, says so once, and memory search stays full-text
//! ([`VectorSupport::Missing`], which `/ready` reports). So no numbered migration depends on
//! it, and installing pgvector later and restarting is all it takes.
//!
//! Statements that touch many users' rows (claiming pending memories, storing a batch of
//! vectors) filter with `= ANY(array)` and set values with `array_position`, never by joining
//! a set of rows: on Citus each is then one multi-shard statement, pruned to the shards of
//! the users named.

use super::memory::entry_of;
use super::*;
use crate::store::memory::vectors::{
    nearest_first, vector_text, NearMemory, PendingMemory, VectorSpace, VectorStore, VectorSupport,
    MAX_CLAIM,
};
use async_trait::async_trait;
use sqlx::Row;
use std::time::Duration;

/// Held while one replica installs, so two starting together do not both create.
const INSTALL_LOCK: i64 = 0x6167_656e_7464_7663;

/// The nearest-memories function (`memory_vectors.sql`, which says how it searches).
const NEAREST_SQL: &str = include_str!("memory_vectors.sql");

/// Its signature.
const NEAREST: &str = "agentd_memory_nearest_v1(text, text, text, integer, text, integer)";

/// The separator in `user_id || SEP || event_id`, a key naming one memory of an app.
const SEP: &str = "\u{1f}";

impl PgStore {
    /// Creates pgvector and the vector columns when they are missing and pgvector is
    /// available; records whether vectors can be stored. Never fails the start for want of
    /// pgvector.
    pub(super) async fn install_vectors(&self) -> StoreResult<()> {
        let support = match self.try_install_vectors().await {
            Ok(s) => s,
            Err(e) => VectorSupport::Missing(format!("could not install pgvector: {e}")),
        };
        if let VectorSupport::Missing(why) = &support {
            tracing::warn!(reason = %why, "memory search is full-text only");
        }
        self.set_vector_support(support);
        Ok(())
    }

    async fn try_install_vectors(&self) -> StoreResult<VectorSupport> {
        let citus = self.is_citus().await?;
        if self.detect_vectors().await? == VectorSupport::Available
            && (!citus || self.nearest_is_routed().await?)
        {
            return Ok(VectorSupport::Available);
        }
        let available: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')",
        )
        .fetch_one(self.pool())
        .await?;
        if !available {
            return Ok(VectorSupport::Missing(
                "the pgvector extension is not installed on this PostgreSQL server".into(),
            ));
        }
        // A connection of its own: the session-level lock goes with it when it closes.
        let mut conn = self.pool().acquire().await?.detach();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(INSTALL_LOCK)
            .execute(&mut conn)
            .await?;
        for statement in [
            "CREATE EXTENSION IF NOT EXISTS vector",
            "ALTER TABLE memory_entries
                 ADD COLUMN IF NOT EXISTS embedding vector,
                 ADD COLUMN IF NOT EXISTS space text,
                 ADD COLUMN IF NOT EXISTS claimed_until double precision",
            "CREATE INDEX IF NOT EXISTS memory_entries_pending
                 ON memory_entries (app_name, claimed_until) WHERE embedding IS NULL",
            "CREATE TABLE IF NOT EXISTS memory_spaces (
                 app_name text PRIMARY KEY,
                 space    text NOT NULL)",
        ] {
            sqlx::query(statement).execute(&mut conn).await?;
        }
        // The search sets hnsw.iterative_scan, which pgvector has from 0.8 on.
        let version: String =
            sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
                .fetch_one(&mut conn)
                .await?;
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        if (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < (0, 8) {
            return Ok(VectorSupport::Missing(format!(
                "pgvector {version} is installed; memory search needs 0.8 or later \
                 (ALTER EXTENSION vector UPDATE after installing it)"
            )));
        }
        sqlx::raw_sql(NEAREST_SQL).execute(&mut conn).await?;
        if citus {
            // Delegated by its user argument, like router.sql's functions: the call runs whole
            // on the worker with the user's shards.
            if !self.nearest_is_routed().await? {
                sqlx::query(
                    "SELECT create_distributed_function($1::regprocedure, 'p_user', \
                     colocate_with => 'memory_entries')",
                )
                .bind(NEAREST)
                .execute(&mut conn)
                .await?;
            }
        }
        let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(INSTALL_LOCK)
            .execute(&mut conn)
            .await;
        tracing::info!("memory vectors installed (pgvector)");
        self.detect_vectors().await
    }

    /// Creates the HNSW index over the vectors of size `dims` when it is missing (a failed
    /// earlier build, left invalid, is dropped first). Built concurrently: writes go on. One
    /// replica at a time builds (an advisory lock per size, held on a connection of its own);
    /// the others go on without waiting, and search exactly until the index is there.
    async fn ensure_hnsw_index(&self, dims: u32) -> StoreResult<()> {
        let name = format!("memory_entries_hnsw_{dims}");
        if index_valid(&mut *self.pool().acquire().await?, &name).await? == Some(true) {
            return Ok(());
        }
        let mut conn = self.pool().acquire().await?.detach();
        let lock = INSTALL_LOCK + i64::from(dims);
        let mine: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(lock)
            .fetch_one(&mut conn)
            .await?;
        if !mine {
            return Ok(());
        }
        // Under the lock an invalid index is a build that failed, not one under way.
        if index_valid(&mut conn, &name).await? == Some(false) {
            sqlx::query(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}"))
                .execute(&mut conn)
                .await?;
        }
        // `dims` is a number, so the statement is not open to injection.
        sqlx::query(&format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON memory_entries
                 USING hnsw ((embedding::vector({dims})) vector_cosine_ops)
                 WHERE vector_dims(embedding) = {dims}"
        ))
        .execute(&mut conn)
        .await?;
        tracing::info!(dims, "created the HNSW index of memory vectors");
        // The connection closes here, and the lock with it.
        Ok(())
    }

    /// Whether Citus delegates the search function's calls by their user argument.
    async fn nearest_is_routed(&self) -> StoreResult<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_dist_object
                             WHERE objid = to_regprocedure($1)
                               AND distribution_argument_index IS NOT NULL)",
        )
        .bind(NEAREST)
        .fetch_one(self.pool())
        .await?)
    }

    /// Whether `memory_entries.embedding` is a pgvector column.
    pub(super) async fn detect_vectors(&self) -> StoreResult<VectorSupport> {
        let ready: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                             WHERE a.attrelid = to_regclass('memory_entries')
                               AND a.attname = 'embedding' AND t.typname = 'vector'
                               AND NOT a.attisdropped)
               AND to_regclass('memory_spaces') IS NOT NULL
               AND to_regprocedure($1) IS NOT NULL",
        )
        .bind(NEAREST)
        .fetch_one(self.pool())
        .await?;
        Ok(if ready {
            VectorSupport::Available
        } else {
            VectorSupport::Missing("pgvector is not installed in this database".into())
        })
    }
}

/// Whether index `name` is valid (`None`: there is none).
async fn index_valid(conn: &mut sqlx::PgConnection, name: &str) -> StoreResult<Option<bool>> {
    Ok(sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE c.relname = $1 AND c.relnamespace = current_schema()::regnamespace",
    )
    .bind(name)
    .fetch_optional(conn)
    .await?)
}

#[async_trait]
impl VectorStore for PgStore {
    fn vector_support(&self) -> VectorSupport {
        self.vector_support_now()
    }

    async fn adopt_space(&self, app: &str, space: &VectorSpace) -> StoreResult<bool> {
        if let Err(e) = self.ensure_hnsw_index(space.dims).await {
            // Searches stay right without it (exact); the next adoption tries again.
            tracing::warn!(dims = space.dims, error = %e, "could not create the HNSW index of memory vectors");
        }
        if self.current_space(app).await?.as_deref() == Some(space.name.as_str()) {
            return Ok(false);
        }
        // Two statements, not one transaction: on Citus memory_spaces stays on the
        // coordinator. A crash between them repeats the first at the next adoption.
        let reset = sqlx::query(
            "UPDATE memory_entries SET embedding = NULL, space = NULL, claimed_until = NULL
              WHERE app_name = $1 AND embedding IS NOT NULL AND space IS DISTINCT FROM $2",
        )
        .bind(app)
        .bind(&space.name)
        .execute(self.pool())
        .await?
        .rows_affected();
        let changed = sqlx::query(
            "INSERT INTO memory_spaces AS s (app_name, space) VALUES ($1, $2)
             ON CONFLICT (app_name) DO UPDATE SET space = EXCLUDED.space
              WHERE s.space IS DISTINCT FROM EXCLUDED.space",
        )
        .bind(app)
        .bind(&space.name)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(reset > 0 || changed > 0)
    }

    async fn current_space(&self, app: &str) -> StoreResult<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT space FROM memory_spaces WHERE app_name = $1")
                .bind(app)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    async fn defer_pending(
        &self,
        app: &str,
        memories: &[(String, String)],
        delay: Duration,
    ) -> StoreResult<()> {
        if memories.is_empty() {
            return Ok(());
        }
        let users: Vec<&str> = memories.iter().map(|(u, _)| u.as_str()).collect();
        let keys: Vec<String> = memories
            .iter()
            .map(|(u, e)| format!("{u}{SEP}{e}"))
            .collect();
        sqlx::query(
            "UPDATE memory_entries SET claimed_until = $2
              WHERE app_name = $1 AND user_id = ANY($3) AND (user_id || $5 || event_id) = ANY($4)
                AND embedding IS NULL",
        )
        .bind(app)
        .bind(now_ts() + delay.as_secs_f64())
        .bind(&users)
        .bind(&keys)
        .bind(SEP)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn claim_pending(
        &self,
        app: &str,
        limit: usize,
        lease: Duration,
    ) -> StoreResult<Vec<PendingMemory>> {
        let now = now_ts();
        let candidates = sqlx::query(
            "SELECT user_id, event_id FROM memory_entries
              WHERE app_name = $1 AND embedding IS NULL
                AND (claimed_until IS NULL OR claimed_until < $2)
              LIMIT $3",
        )
        .bind(app)
        .bind(now)
        .bind(limit.min(MAX_CLAIM) as i64)
        .fetch_all(self.pool())
        .await?;
        if candidates.is_empty() {
            return Ok(vec![]);
        }
        let mut users = Vec::with_capacity(candidates.len());
        let mut keys = Vec::with_capacity(candidates.len());
        for r in &candidates {
            let user: String = r.try_get("user_id")?;
            let event: String = r.try_get("event_id")?;
            keys.push(format!("{user}{SEP}{event}"));
            users.push(user);
        }
        // The claim re-checks what the candidates were read with, under the row locks: of
        // two embedders reading the same candidates, each memory goes to one.
        let rows: Vec<PendingMemory> = sqlx::query_as(
            "UPDATE memory_entries SET claimed_until = $3
              WHERE app_name = $1 AND user_id = ANY($4) AND (user_id || $6 || event_id) = ANY($5)
                AND embedding IS NULL AND (claimed_until IS NULL OR claimed_until < $2)
              RETURNING user_id, event_id, text",
        )
        .bind(app)
        .bind(now)
        .bind(now + lease.as_secs_f64())
        .bind(&users)
        .bind(&keys)
        .bind(SEP)
        .fetch_all(self.pool())
        .await?;
        Ok(rows)
    }

    async fn store_vectors(
        &self,
        app: &str,
        space: &VectorSpace,
        vectors: &[(PendingMemory, Vec<f32>)],
    ) -> StoreResult<usize> {
        if vectors.is_empty() {
            return Ok(0);
        }
        let users: Vec<&str> = vectors.iter().map(|(p, _)| p.user_id.as_str()).collect();
        let keys: Vec<String> = vectors
            .iter()
            .map(|(p, _)| format!("{}{SEP}{}", p.user_id, p.event_id))
            .collect();
        let values: Vec<String> = vectors.iter().map(|(_, v)| vector_text(v)).collect();
        let texts: Vec<&str> = vectors.iter().map(|(p, _)| p.text.as_str()).collect();
        let done = sqlx::query(
            "UPDATE memory_entries
                SET embedding = ($5::text[])[array_position($4::text[], user_id || $6 || event_id)]::vector,
                    space = $2, claimed_until = NULL
              WHERE app_name = $1 AND user_id = ANY($3) AND (user_id || $6 || event_id) = ANY($4)
                AND text = ($7::text[])[array_position($4::text[], user_id || $6 || event_id)]",
        )
        .bind(app)
        .bind(&space.name)
        .bind(&users)
        .bind(&keys)
        .bind(&values)
        .bind(SEP)
        .bind(&texts)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() as usize)
    }

    async fn pending_count(&self, app: &str) -> StoreResult<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM memory_entries WHERE app_name = $1 AND embedding IS NULL",
        )
        .bind(app)
        .fetch_one(self.pool())
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
        let rows = sqlx::query("SELECT * FROM agentd_memory_nearest_v1($1, $2, $3, $4, $5, $6)")
            .bind(app)
            .bind(user)
            .bind(&space.name)
            .bind(space.dims as i32)
            .bind(vector_text(vector))
            .bind(limit.min(i32::MAX as usize) as i32)
            .fetch_all(self.pool())
            .await?;
        let rows = rows
            .iter()
            .map(|r| Ok((entry_of(r)?, r.try_get::<Option<f64>, _>("distance")?)))
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(nearest_first(rows, limit))
    }
}
