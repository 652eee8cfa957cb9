//! Memory on SQLite: `memory_entries` indexed by the external-content FTS5 table `memory_fts`
//! (unicode61 tokenizer under porter), searched with `MATCH` and ranked by `bm25`
//! (see migrations/sqlite/0002_memory.sql). The bundled SQLite is built with FTS5.

use super::*;
use crate::store::memory::changes::{apply, Applied, ChangeTx, MemoryChange, MemoryRevision};
use crate::store::memory::sql;
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
        let row = sqlx::query(sql::MEMORY_BY_ID)
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

    async fn apply_memory_changes(
        &self,
        key: &SessionKey,
        from: IngestMark,
        to: IngestMark,
        changes: &[MemoryChange],
    ) -> StoreResult<Option<Applied>> {
        // One writer at a time: what the checks read stays so until the commit.
        let mut w = SqliteChanges {
            tx: self.writer().begin_with("BEGIN IMMEDIATE").await?,
            keep: self.limits.max_memories_per_user,
        };
        let applied = apply(&mut w, key, from, to, changes).await?;
        match applied {
            Some(_) => w.tx.commit().await?,
            None => w.tx.rollback().await?,
        }
        Ok(applied)
    }

    async fn expire_memories(&self, app: &str, before: f64) -> StoreResult<u64> {
        // Revisions first: a pass cut short leaves no revision of a memory already gone that
        // the next pass would not take.
        sqlx::query(sql::EXPIRE_REVISIONS)
            .bind(app)
            .bind(before)
            .execute(self.writer())
            .await?;
        let gone = sqlx::query(sql::EXPIRE_MEMORIES)
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
        Ok(sqlx::query_as(sql::REVISIONS)
            .bind(app)
            .bind(user)
            .bind(id)
            .fetch_all(&self.reader)
            .await?)
    }
}

/// [`apply`]'s statements on SQLite, in one `BEGIN IMMEDIATE` transaction.
struct SqliteChanges {
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    /// `--max-memories-per-user`.
    keep: usize,
}

#[async_trait]
impl ChangeTx for SqliteChanges {
    async fn same_session(&mut self, key: &SessionKey, create_time: f64) -> StoreResult<bool> {
        Ok(sqlx::query(sql::SAME_SESSION)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(create_time)
            .fetch_optional(&mut *self.tx)
            .await?
            .is_some())
    }

    async fn move_mark(
        &mut self,
        key: &SessionKey,
        from: IngestMark,
        to: IngestMark,
    ) -> StoreResult<bool> {
        Ok(sqlx::query(sql::MOVE_MARK)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(to.session_create_time)
            .bind(to.ingested_seq)
            .bind(from.session_create_time)
            .bind(from.ingested_seq)
            .fetch_optional(&mut *self.tx)
            .await?
            .is_some())
    }

    async fn add(&mut self, key: &SessionKey, e: &MemoryEntry) -> StoreResult<bool> {
        let added = insert_entry(
            &mut self.tx,
            &key.app_name,
            &key.user_id,
            e,
            "ON CONFLICT DO NOTHING",
        );
        Ok(added.await? > 0)
    }

    async fn update(&mut self, key: &SessionKey, e: &MemoryEntry, now: f64) -> StoreResult<bool> {
        let (app, user, id) = (&key.app_name, &key.user_id, &e.event_id);
        let current = sqlx::query(sql::MEMORY_BY_ID)
            .bind(app)
            .bind(user)
            .bind(id)
            .fetch_optional(&mut *self.tx)
            .await?;
        let Some(current) = current.as_ref().map(entry_of).transpose()? else {
            return Ok(false);
        };
        let last: i32 = sqlx::query_scalar(sql::LAST_REVISION)
            .bind(app)
            .bind(user)
            .bind(id)
            .fetch_one(&mut *self.tx)
            .await?;
        sqlx::query(sql::INSERT_REVISION)
            .bind(app)
            .bind(user)
            .bind(id)
            .bind(last + 1)
            .bind(&current.session_id)
            .bind(&current.author)
            .bind(current.timestamp)
            .bind(&current.text)
            .bind(now)
            .execute(&mut *self.tx)
            .await?;
        // In place; its vector and claim cleared, so the embedder makes one for the new text.
        sqlx::query(
            "UPDATE memory_entries
                SET session_id = ?4, author = ?5, timestamp = ?6, text = ?7, content = ?8,
                    embedding = NULL, space = NULL, claimed_until = NULL
              WHERE app_name = ?1 AND user_id = ?2 AND event_id = ?3",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .bind(&e.session_id)
        .bind(&e.author)
        .bind(e.timestamp)
        .bind(&e.text)
        .bind(serde_json::to_string(&e.content)?)
        .execute(&mut *self.tx)
        .await?;
        Ok(true)
    }

    async fn delete(&mut self, key: &SessionKey, id: &str) -> StoreResult<bool> {
        delete_one(&mut self.tx, &key.app_name, &key.user_id, id).await
    }

    async fn trim(&mut self, key: &SessionKey) -> StoreResult<()> {
        trim(&mut self.tx, &key.app_name, &key.user_id, self.keep).await?;
        Ok(())
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
    if !gone.is_empty() {
        sqlx::query(
            "DELETE FROM memory_revisions
              WHERE app_name = ?1 AND user_id = ?2 AND memory_id IN (SELECT value FROM json_each(?3))",
        )
        .bind(app)
        .bind(user)
        .bind(serde_json::to_string(&gone)?)
        .execute(&mut *conn)
        .await?;
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
    let existed = sqlx::query(sql::DELETE_MEMORY)
        .bind(app)
        .bind(user)
        .bind(id)
        .execute(&mut *conn)
        .await?
        .rows_affected()
        > 0;
    sqlx::query(sql::DELETE_REVISIONS)
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

// Sessions whose memory is due: the same statements on both backends (`store::memory::due`).
crate::store::memory::due::due_store!(SqliteStore, writer, reader);
