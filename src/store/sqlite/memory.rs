//! Memory on SQLite: `memory_entries` indexed by the external-content FTS5 table `memory_fts`
//! (unicode61 tokenizer under porter), searched with `MATCH` and ranked by `bm25`
//! (see migrations/sqlite/0002_memory.sql). The bundled SQLite is built with FTS5.

use super::*;
use crate::store::memory::{
    add_session, content_words, or_query, IngestMark, MemoryBackend, MemoryEntry, MemoryStore,
};
use async_trait::async_trait;
use sqlx::Row;

/// The query's words as quoted FTS5 strings OR-ed (`"a" OR "b"`), so no input is FTS5 syntax;
/// `bm25` is smaller for better matches; newest first among equals.
const SEARCH_SQL: &str = r#"
SELECT m.session_id, m.event_id, m.author, m.timestamp, m.text, m.content
  FROM memory_fts f JOIN memory_entries m ON m.id = f.rowid
 WHERE memory_fts MATCH ?3 AND m.app_name = ?1 AND m.user_id = ?2
 ORDER BY bm25(memory_fts), m.timestamp DESC, m.event_id
 LIMIT ?4
"#;

#[async_trait]
impl MemoryBackend for SqliteStore {
    async fn ingest_mark(&self, key: &SessionKey) -> StoreResult<Option<IngestMark>> {
        let row = sqlx::query(
            "SELECT s.create_time,
                    CASE WHEN m.session_create_time = s.create_time THEN m.ingested_seq ELSE 0 END
                      AS ingested_seq
               FROM sessions s
               LEFT JOIN memory_sessions m
                 ON m.app_name = s.app_name AND m.user_id = s.user_id AND m.session_id = s.id
              WHERE s.app_name = ? AND s.user_id = ? AND s.id = ?",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(&self.reader)
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
              WHERE app_name = ?1 AND user_id = ?2 AND session_id = ?3
                AND event_id IN (SELECT id FROM events
                                  WHERE app_name = ?1 AND user_id = ?2 AND session_id = ?3
                                    AND seq BETWEEN ?4 AND ?5)",
            )
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(from)
            .bind(to)
            .execute(self.writer())
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
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        let mut added = 0;
        for e in entries {
            added += sqlx::query(
                "INSERT INTO memory_entries
                        (app_name, user_id, session_id, event_id, author, timestamp, text, content)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (app_name, user_id, event_id) DO NOTHING",
            )
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(&e.event_id)
            .bind(&e.author)
            .bind(e.timestamp)
            .bind(&e.text)
            .bind(serde_json::to_string(&e.content)?)
            .execute(&mut *tx)
            .await?
            .rows_affected() as usize;
        }
        sqlx::query(
            "INSERT INTO memory_sessions
                    (app_name, user_id, session_id, session_create_time, ingested_seq)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (app_name, user_id, session_id) DO UPDATE
                SET ingested_seq = CASE
                        WHEN session_create_time = excluded.session_create_time
                        THEN max(ingested_seq, excluded.ingested_seq)
                        ELSE excluded.ingested_seq END,
                    session_create_time = excluded.session_create_time",
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
impl MemoryStore for SqliteStore {
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
        let words = content_words(query);
        if words.is_empty() || limit == 0 {
            return Ok(vec![]);
        }
        let rows = sqlx::query(SEARCH_SQL)
            .bind(app)
            .bind(user)
            .bind(or_query(&words, "OR"))
            .bind(limit.min(i64::MAX as usize) as i64)
            .fetch_all(&self.reader)
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
            "SELECT session_id, event_id, author, timestamp, text, content FROM memory_entries
              WHERE app_name = ? AND user_id = ? AND event_id = ?",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_optional(&self.reader)
        .await?;
        row.as_ref().map(entry_of).transpose()
    }

    async fn delete_memory(&self, app: &str, user: &str, id: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "DELETE FROM memory_entries WHERE app_name = ? AND user_id = ? AND event_id = ?",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .execute(self.writer())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn forget_user(&self, app: &str, user: &str) -> StoreResult<u64> {
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        let deleted = sqlx::query("DELETE FROM memory_entries WHERE app_name = ? AND user_id = ?")
            .bind(app)
            .bind(user)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM memory_sessions WHERE app_name = ? AND user_id = ?")
            .bind(app)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn insert_memory(&self, app: &str, user: &str, e: &MemoryEntry) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO memory_entries
                    (app_name, user_id, session_id, event_id, author, timestamp, text, content)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(app)
        .bind(user)
        .bind(&e.session_id)
        .bind(&e.event_id)
        .bind(&e.author)
        .bind(e.timestamp)
        .bind(&e.text)
        .bind(serde_json::to_string(&e.content)?)
        .execute(self.writer())
        .await?;
        Ok(())
    }
}

/// A `memory_entries` row (its `session_id` … `content` columns) as an entry.
pub(super) fn entry_of(r: &sqlx::sqlite::SqliteRow) -> StoreResult<MemoryEntry> {
    Ok(MemoryEntry {
        session_id: r.try_get("session_id")?,
        event_id: r.try_get("event_id")?,
        author: r.try_get("author")?,
        timestamp: r.try_get("timestamp")?,
        text: r.try_get("text")?,
        content: serde_json::from_str(r.try_get::<&str, _>("content")?)?,
    })
}
