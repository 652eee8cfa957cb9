//! Memory on SQLite: `memory_entries` indexed by the external-content FTS5 table `memory_fts`
//! (unicode61 tokenizer under porter), searched with `MATCH` and ranked by `bm25`
//! (see migrations/sqlite/0002_memory.sql). The bundled SQLite is built with FTS5.

use super::*;
use crate::store::memory::changes::{Applied, MemoryChange, MemoryRevision};
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
        if added > 0 {
            trim(
                &mut tx,
                &key.app_name,
                &key.user_id,
                self.limits.max_memories_per_user,
            )
            .await?;
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
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        let existed = delete_one(&mut tx, app, user, id).await?;
        tx.commit().await?;
        Ok(existed)
    }

    async fn forget_user(&self, app: &str, user: &str) -> StoreResult<u64> {
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        let deleted = sqlx::query("DELETE FROM memory_entries WHERE app_name = ? AND user_id = ?")
            .bind(app)
            .bind(user)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        for table in ["memory_revisions", "memory_sessions"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE app_name = ? AND user_id = ?"
            ))
            .bind(app)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(deleted)
    }

    async fn insert_memory(&self, app: &str, user: &str, e: &MemoryEntry) -> StoreResult<()> {
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        insert_entry(&mut tx, app, user, e, "").await?;
        trim(&mut tx, app, user, self.limits.max_memories_per_user).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn memory_mark(&self, key: &SessionKey) -> StoreResult<Option<IngestMark>> {
        self.ingest_mark(key).await
    }

    async fn apply_memory_changes(
        &self,
        key: &SessionKey,
        from: IngestMark,
        to: IngestMark,
        changes: &[MemoryChange],
    ) -> StoreResult<Option<Applied>> {
        let (app, user) = (key.app_name.as_str(), key.user_id.as_str());
        let mut tx = self.writer().begin_with("BEGIN IMMEDIATE").await?;
        // The session the mark was read for must still be the one of that id (the writer is
        // one at a time: it stays so until the commit).
        let same = sqlx::query(
            "SELECT 1 FROM sessions
              WHERE app_name = ? AND user_id = ? AND id = ? AND create_time = ?",
        )
        .bind(app)
        .bind(user)
        .bind(&key.session_id)
        .bind(from.session_create_time)
        .fetch_optional(&mut *tx)
        .await?;
        if same.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        let moved = sqlx::query(
            "INSERT INTO memory_sessions AS t
                    (app_name, user_id, session_id, session_create_time, ingested_seq)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (app_name, user_id, session_id) DO UPDATE
                SET ingested_seq = excluded.ingested_seq,
                    session_create_time = excluded.session_create_time
              WHERE (t.session_create_time = ?6 AND t.ingested_seq = ?7)
                 OR (?7 = 0 AND t.session_create_time <> ?6)
             RETURNING 1",
        )
        .bind(app)
        .bind(user)
        .bind(&key.session_id)
        .bind(to.session_create_time)
        .bind(to.ingested_seq)
        .bind(from.session_create_time)
        .bind(from.ingested_seq)
        .fetch_optional(&mut *tx)
        .await?;
        if moved.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        let mut applied = Applied::default();
        let now = crate::event::now_ts();
        for change in changes {
            match change {
                MemoryChange::Add(e) => {
                    applied.added +=
                        insert_entry(&mut tx, app, user, e, "ON CONFLICT DO NOTHING").await?;
                }
                MemoryChange::Update(e) => {
                    let kept = sqlx::query(
                        "INSERT INTO memory_revisions (app_name, user_id, memory_id, revision,
                                session_id, author, timestamp, text, replaced_at)
                         SELECT app_name, user_id, event_id,
                                (SELECT coalesce(max(revision), 0) + 1 FROM memory_revisions
                                  WHERE app_name = ?1 AND user_id = ?2 AND memory_id = ?3),
                                session_id, author, timestamp, text, ?4
                           FROM memory_entries
                          WHERE app_name = ?1 AND user_id = ?2 AND event_id = ?3",
                    )
                    .bind(app)
                    .bind(user)
                    .bind(&e.event_id)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    if kept == 0 {
                        continue;
                    }
                    // In place (the writer is one at a time); its vector and claim cleared, so
                    // the embedder makes one for the new text and one that claimed the old
                    // text stores nothing.
                    sqlx::query(
                        "UPDATE memory_entries
                            SET session_id = ?4, author = ?5, timestamp = ?6, text = ?7,
                                content = ?8, embedding = NULL, space = NULL,
                                claimed_until = NULL
                          WHERE app_name = ?1 AND user_id = ?2 AND event_id = ?3",
                    )
                    .bind(app)
                    .bind(user)
                    .bind(&e.event_id)
                    .bind(&e.session_id)
                    .bind(&e.author)
                    .bind(e.timestamp)
                    .bind(&e.text)
                    .bind(serde_json::to_string(&e.content)?)
                    .execute(&mut *tx)
                    .await?;
                    applied.updated += 1;
                }
                MemoryChange::Delete(id) => {
                    if delete_one(&mut tx, app, user, id).await? {
                        applied.deleted += 1;
                    }
                }
            }
        }
        if applied.added > 0 {
            trim(&mut tx, app, user, self.limits.max_memories_per_user).await?;
        }
        tx.commit().await?;
        Ok(Some(applied))
    }

    async fn expire_memories(&self, app: &str, before: f64) -> StoreResult<u64> {
        // Revisions first: a pass cut short leaves no revision of a memory already gone that
        // the next pass would not take.
        sqlx::query(r#"DELETE FROM memory_revisions WHERE app_name = ?1 AND timestamp < ?2"#)
            .bind(app)
            .bind(before)
            .execute(self.writer())
            .await?;
        let gone =
            sqlx::query(r#"DELETE FROM memory_entries WHERE app_name = ?1 AND timestamp < ?2"#)
                .bind(app)
                .bind(before)
                .execute(self.writer())
                .await?
                .rows_affected();
        Ok(gone)
    }

    async fn memory_revisions(
        &self,
        app: &str,
        user: &str,
        id: &str,
    ) -> StoreResult<Vec<MemoryRevision>> {
        let rows = sqlx::query(
            "SELECT revision, text, author, session_id, timestamp, replaced_at
               FROM memory_revisions
              WHERE app_name = ? AND user_id = ? AND memory_id = ?
              ORDER BY revision",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(MemoryRevision {
                    revision: r.try_get("revision")?,
                    text: r.try_get("text")?,
                    author: r.try_get("author")?,
                    session_id: r.try_get("session_id")?,
                    timestamp: r.try_get("timestamp")?,
                    replaced_at: r.try_get("replaced_at")?,
                })
            })
            .collect()
    }
}

/// Inserts one memory (`conflict`: `""`, or `ON CONFLICT DO NOTHING`); how many rows it added.
async fn insert_entry(
    conn: &mut sqlx::SqliteConnection,
    app: &str,
    user: &str,
    e: &MemoryEntry,
    conflict: &str,
) -> StoreResult<usize> {
    Ok(sqlx::query(&format!(
        "INSERT INTO memory_entries
                (app_name, user_id, session_id, event_id, author, timestamp, text, content)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?) {conflict}"
    ))
    .bind(app)
    .bind(user)
    .bind(&e.session_id)
    .bind(&e.event_id)
    .bind(&e.author)
    .bind(e.timestamp)
    .bind(&e.text)
    .bind(serde_json::to_string(&e.content)?)
    .execute(conn)
    .await?
    .rows_affected() as usize)
}

/// Forgets (app, user)'s oldest memories beyond the newest `keep`, at most
/// [`TRIM_BATCH`](crate::store::memory::TRIM_BATCH) a write, with their revisions
/// (`--max-memories-per-user`); how many.
async fn trim(
    conn: &mut sqlx::SqliteConnection,
    app: &str,
    user: &str,
    keep: usize,
) -> StoreResult<usize> {
    let gone: Vec<String> = sqlx::query_scalar(
        "DELETE FROM memory_entries
          WHERE app_name = ?1 AND user_id = ?2
            AND event_id IN (SELECT event_id FROM memory_entries
                              WHERE app_name = ?1 AND user_id = ?2
                              ORDER BY timestamp DESC, event_id DESC
                              LIMIT ?4 OFFSET ?3)
         RETURNING event_id",
    )
    .bind(app)
    .bind(user)
    .bind(keep.min(i64::MAX as usize) as i64)
    .bind(crate::store::memory::TRIM_BATCH)
    .fetch_all(&mut *conn)
    .await?;
    for id in &gone {
        sqlx::query(
            "DELETE FROM memory_revisions WHERE app_name = ? AND user_id = ? AND memory_id = ?",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    }
    if !gone.is_empty() {
        tracing::info!(
            app,
            user,
            forgotten = gone.len(),
            "memories over the user's limit: the oldest forgotten"
        );
    }
    Ok(gone.len())
}

/// Deletes memory `id` of (app, user) and its revisions; whether it existed.
async fn delete_one(
    conn: &mut sqlx::SqliteConnection,
    app: &str,
    user: &str,
    id: &str,
) -> StoreResult<bool> {
    let existed = sqlx::query(
        "DELETE FROM memory_entries WHERE app_name = ? AND user_id = ? AND event_id = ?",
    )
    .bind(app)
    .bind(user)
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        > 0;
    sqlx::query(
        "DELETE FROM memory_revisions WHERE app_name = ? AND user_id = ? AND memory_id = ?",
    )
    .bind(app)
    .bind(user)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    Ok(existed)
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
