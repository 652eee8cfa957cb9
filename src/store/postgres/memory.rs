//! Memory on PostgreSQL: `memory_entries` with a generated `tsvector` (English configuration)
//! and a GIN index, searched with `websearch_to_tsquery` and ranked by `ts_rank`
//! (see migrations/postgres/0002_memory.sql).

use super::*;
use crate::store::memory::{
    add_session, or_query, query_words, IngestMark, MemoryBackend, MemoryEntry, MemoryStore,
};
use async_trait::async_trait;
use sqlx::types::Json;
use sqlx::Row;

/// The query's words OR-ed (`"a" or "b"`), parsed by `memory_tsquery` (websearch_to_tsquery,
/// which never fails), ranked by `ts_rank`, newest first among equals: one call of
/// `agentd_memory_by_words_v1` (migrations/postgres/0019_memory_search.sql, which says how it
/// stays fast for a user with many memories).
const SEARCH_SQL: &str = "SELECT * FROM agentd_memory_by_words_v1($1, $2, $3, $4)";

#[async_trait]
impl MemoryBackend for PgStore {
    async fn ingest_mark(&self, key: &SessionKey) -> StoreResult<Option<IngestMark>> {
        let row = sqlx::query(
            "SELECT s.create_time,
                    CASE WHEN m.session_create_time = s.create_time THEN m.ingested_seq ELSE 0 END
                      AS ingested_seq
               FROM sessions s
               LEFT JOIN memory_sessions m
                 ON m.app_name = s.app_name AND m.user_id = s.user_id AND m.session_id = s.id
              WHERE s.app_name = $1 AND s.user_id = $2 AND s.id = $3",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(IngestMark {
                session_create_time: r.try_get("create_time")?,
                ingested_seq: r.try_get("ingested_seq")?,
            })
        })
        .transpose()
    }

    async fn forget_memory(&self, key: &SessionKey, ranges: &[(i64, i64)]) -> StoreResult<usize> {
        let mut removed = 0;
        for (from, to) in ranges {
            removed += sqlx::query(
                "DELETE FROM memory_entries
              WHERE app_name = $1 AND user_id = $2 AND session_id = $3
                AND event_id IN (SELECT id FROM events
                                  WHERE app_name = $1 AND user_id = $2 AND session_id = $3
                                    AND seq BETWEEN $4 AND $5)",
            )
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(from)
            .bind(to)
            .execute(&self.pool)
            .await?
            .rows_affected() as usize;
        }
        Ok(removed)
    }

    async fn write_memory(
        &self,
        key: &SessionKey,
        mark: IngestMark,
        entries: &[MemoryEntry],
    ) -> StoreResult<usize> {
        let mut tx = self.pool().begin().await?;
        let mut added = 0;
        if !entries.is_empty() {
            let mut contents = Vec::with_capacity(entries.len());
            for e in entries {
                contents.push(serde_json::to_string(&e.content)?);
            }
            // One statement per page: the entries as parallel arrays.
            added = sqlx::query(
                r#"INSERT INTO memory_entries
                       (app_name, user_id, session_id, event_id, author, "timestamp", text, content)
                   SELECT $1, $2, $3, e.event_id, e.author, e.ts, e.text, e.content::jsonb
                     FROM UNNEST($4::text[], $5::text[], $6::float8[], $7::text[], $8::text[])
                          AS e(event_id, author, ts, text, content)
                   ON CONFLICT DO NOTHING
                   RETURNING 1"#,
            )
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(
                entries
                    .iter()
                    .map(|e| e.event_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                entries
                    .iter()
                    .map(|e| e.author.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(entries.iter().map(|e| e.timestamp).collect::<Vec<_>>())
            .bind(entries.iter().map(|e| e.text.as_str()).collect::<Vec<_>>())
            .bind(contents)
            // Counted from RETURNING: on Citus, an INSERT … SELECT's command tag counts the
            // rows it tried, not those it inserted.
            .fetch_all(&mut *tx)
            .await?
            .len();
        }
        sqlx::query(
            "INSERT INTO memory_sessions AS t
                    (app_name, user_id, session_id, session_create_time, ingested_seq)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (app_name, user_id, session_id) DO UPDATE
                SET ingested_seq = CASE
                        WHEN t.session_create_time = EXCLUDED.session_create_time
                        THEN GREATEST(t.ingested_seq, EXCLUDED.ingested_seq)
                        ELSE EXCLUDED.ingested_seq END,
                    session_create_time = EXCLUDED.session_create_time",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(mark.session_create_time)
        .bind(mark.ingested_seq)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(added)
    }
}

#[async_trait]
impl MemoryStore for PgStore {
    async fn add_session_to_memory(&self, key: &SessionKey) -> StoreResult<usize> {
        add_session(self, key).await
    }

    async fn search_memory(
        &self,
        app: &str,
        user: &str,
        query: &str,
        limit: usize,
    ) -> StoreResult<Vec<MemoryEntry>> {
        let words = query_words(query);
        if words.is_empty() || limit == 0 {
            return Ok(vec![]);
        }
        let rows = sqlx::query(SEARCH_SQL)
            .bind(app)
            .bind(user)
            .bind(or_query(&words, "or"))
            .bind(limit.min(i32::MAX as usize) as i32)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(entry_of).collect()
    }

    async fn get_memory(
        &self,
        app: &str,
        user: &str,
        id: &str,
    ) -> StoreResult<Option<MemoryEntry>> {
        let row = sqlx::query(
            r#"SELECT session_id, event_id, author, "timestamp", text, content
                 FROM memory_entries WHERE app_name = $1 AND user_id = $2 AND event_id = $3"#,
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(entry_of).transpose()
    }

    async fn delete_memory(&self, app: &str, user: &str, id: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "DELETE FROM memory_entries WHERE app_name = $1 AND user_id = $2 AND event_id = $3",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn forget_user(&self, app: &str, user: &str) -> StoreResult<u64> {
        let mut tx = self.pool().begin().await?;
        let deleted =
            sqlx::query("DELETE FROM memory_entries WHERE app_name = $1 AND user_id = $2")
                .bind(app)
                .bind(user)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        sqlx::query("DELETE FROM memory_sessions WHERE app_name = $1 AND user_id = $2")
            .bind(app)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn insert_memory(&self, app: &str, user: &str, e: &MemoryEntry) -> StoreResult<()> {
        sqlx::query(
            r#"INSERT INTO memory_entries
                   (app_name, user_id, session_id, event_id, author, "timestamp", text, content)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"#,
        )
        .bind(app)
        .bind(user)
        .bind(&e.session_id)
        .bind(&e.event_id)
        .bind(&e.author)
        .bind(e.timestamp)
        .bind(&e.text)
        .bind(Json(&e.content))
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

/// A `memory_entries` row (its `session_id` … `content` columns) as an entry.
pub(super) fn entry_of(r: &sqlx::postgres::PgRow) -> StoreResult<MemoryEntry> {
    let Json(content) = r.try_get("content")?;
    Ok(MemoryEntry {
        session_id: r.try_get("session_id")?,
        event_id: r.try_get("event_id")?,
        author: r.try_get("author")?,
        timestamp: r.try_get("timestamp")?,
        text: r.try_get("text")?,
        content,
    })
}
