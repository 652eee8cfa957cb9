//! Memory on PostgreSQL: `memory_entries` with a generated `tsvector` (English configuration)
//! and a GIN index, searched with `websearch_to_tsquery` and ranked by `ts_rank`
//! (see migrations/postgres/0002_memory.sql).

use super::*;
use crate::store::memory::changes::{Applied, MemoryChange, MemoryRevision};
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
        let row = sqlx::query(MEMORY_BY_ID_SQL)
            .bind(app)
            .bind(user)
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(entry_of).transpose()
    }

    async fn delete_memory(&self, app: &str, user: &str, id: &str) -> StoreResult<bool> {
        let mut tx = self.pool().begin().await?;
        let existed = delete_one(&mut tx, app, user, id).await?;
        tx.commit().await?;
        Ok(existed)
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
        for table in ["memory_revisions", "memory_sessions"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE app_name = $1 AND user_id = $2"
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
        let mut tx = self.pool().begin().await?;
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
        let mut tx = self.pool().begin().await?;
        // The session the mark was read for must still be the one of that id (a session
        // deleted, or deleted and created again, is not extracted into): locked, so it stays
        // until the commit.
        let same = sqlx::query(
            "SELECT 1 FROM sessions
              WHERE app_name = $1 AND user_id = $2 AND id = $3 AND create_time = $4
                FOR KEY SHARE",
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
        // Then the mark, so the row lock makes a second extraction of the same events wait
        // here and then find the mark moved.
        let moved = sqlx::query(MOVE_MARK)
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
                    if update_one(&mut tx, app, user, e, now, self.has_vectors()).await? {
                        applied.updated += 1;
                    }
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
        sqlx::query(EXPIRE_REVISIONS_SQL)
            .bind(app)
            .bind(before)
            .execute(self.pool())
            .await?;
        let gone = sqlx::query(EXPIRE_MEMORIES_SQL)
            .bind(app)
            .bind(before)
            .execute(self.pool())
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
            r#"SELECT revision::bigint AS revision, text, author, session_id, "timestamp",
                      replaced_at
                 FROM memory_revisions
                WHERE app_name = $1 AND user_id = $2 AND memory_id = $3
                ORDER BY revision"#,
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_all(self.pool())
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

/// One memory: $1 app, $2 user, $3 id.
pub const MEMORY_BY_ID_SQL: &str = r#"SELECT session_id, event_id, author, "timestamp", text, content
  FROM memory_entries WHERE app_name = $1 AND user_id = $2 AND event_id = $3"#;

/// An app's memories stated before $2 (`memory: ttl_days:`), and their revisions' texts.
pub const EXPIRE_MEMORIES_SQL: &str =
    r#"DELETE FROM memory_entries WHERE app_name = $1 AND "timestamp" < $2"#;
pub const EXPIRE_REVISIONS_SQL: &str =
    r#"DELETE FROM memory_revisions WHERE app_name = $1 AND "timestamp" < $2"#;

/// Moves a session's memory mark from (`$6`, `$7`) to (`$4`, `$5`): inserts it when the
/// session has none, updates it while it is the one read (or, when the one read was 0, a mark
/// of an earlier session of that id: the caller checked that the session is the one read), and
/// returns no row otherwise.
const MOVE_MARK: &str = "INSERT INTO memory_sessions AS t
        (app_name, user_id, session_id, session_create_time, ingested_seq)
     VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (app_name, user_id, session_id) DO UPDATE
        SET ingested_seq = EXCLUDED.ingested_seq,
            session_create_time = EXCLUDED.session_create_time
      WHERE (t.session_create_time = $6 AND t.ingested_seq = $7)
         OR ($7 = 0 AND t.session_create_time <> $6)
     RETURNING 1";

/// Inserts one memory (`conflict`: `""`, or `ON CONFLICT DO NOTHING`); how many rows it added.
async fn insert_entry(
    conn: &mut sqlx::PgConnection,
    app: &str,
    user: &str,
    e: &MemoryEntry,
    conflict: &str,
) -> StoreResult<usize> {
    Ok(sqlx::query(&format!(
        r#"INSERT INTO memory_entries
               (app_name, user_id, session_id, event_id, author, "timestamp", text, content)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8) {conflict}"#
    ))
    .bind(app)
    .bind(user)
    .bind(&e.session_id)
    .bind(&e.event_id)
    .bind(&e.author)
    .bind(e.timestamp)
    .bind(&e.text)
    .bind(Json(&e.content))
    .execute(conn)
    .await?
    .rows_affected() as usize)
}

/// Gives memory `e.event_id` of (app, user) `e`'s text, author, session and time, its text
/// until now kept as its next revision; whether it existed. In place, with the row locked
/// first: a delete or another update of the same memory waits for this one and then acts on
/// what it wrote (the revision numbers stay unique). Its vector and claim are cleared (when
/// the database keeps vectors), so the embedder makes one for the new text, and one that
/// claimed the old text stores nothing.
async fn update_one(
    conn: &mut sqlx::PgConnection,
    app: &str,
    user: &str,
    e: &MemoryEntry,
    now: f64,
    vectors: bool,
) -> StoreResult<bool> {
    let current = sqlx::query(
        r#"SELECT session_id, author, "timestamp", text FROM memory_entries
            WHERE app_name = $1 AND user_id = $2 AND event_id = $3 FOR UPDATE"#,
    )
    .bind(app)
    .bind(user)
    .bind(&e.event_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(current) = current else {
        return Ok(false);
    };
    let last: i32 = sqlx::query_scalar(
        "SELECT coalesce(max(revision), 0) FROM memory_revisions
          WHERE app_name = $1 AND user_id = $2 AND memory_id = $3",
    )
    .bind(app)
    .bind(user)
    .bind(&e.event_id)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        r#"INSERT INTO memory_revisions (app_name, user_id, memory_id, revision, session_id,
                  author, "timestamp", text, replaced_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"#,
    )
    .bind(app)
    .bind(user)
    .bind(&e.event_id)
    .bind(last + 1)
    .bind(current.try_get::<String, _>("session_id")?)
    .bind(current.try_get::<String, _>("author")?)
    .bind(current.try_get::<f64, _>("timestamp")?)
    .bind(current.try_get::<String, _>("text")?)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let reset = match vectors {
        true => ", embedding = NULL, space = NULL, claimed_until = NULL",
        false => "",
    };
    sqlx::query(&format!(
        r#"UPDATE memory_entries
              SET session_id = $4, author = $5, "timestamp" = $6, text = $7, content = $8{reset}
            WHERE app_name = $1 AND user_id = $2 AND event_id = $3"#
    ))
    .bind(app)
    .bind(user)
    .bind(&e.event_id)
    .bind(&e.session_id)
    .bind(&e.author)
    .bind(e.timestamp)
    .bind(&e.text)
    .bind(Json(&e.content))
    .execute(&mut *conn)
    .await?;
    Ok(true)
}

/// The trim ([`trim`]): $1 app, $2 user, $3 how many to keep, $4 at most how many to forget.
/// The ids first, once (an InitPlan, through `memory_entries_by_age`), then each deleted
/// through the primary key.
pub const TRIM_SQL: &str = r#"DELETE FROM memory_entries
            WHERE app_name = $1 AND user_id = $2
              AND event_id = ANY (ARRAY(
                  SELECT event_id FROM memory_entries
                   WHERE (app_name || E'\x1f' || user_id) = ($1 || E'\x1f' || $2)
                     AND user_id = $2
                   ORDER BY (app_name || E'\x1f' || user_id) DESC, "timestamp" DESC,
                            event_id DESC
                   LIMIT $4 OFFSET $3))
           RETURNING event_id"#;

/// Forgets (app, user)'s oldest memories beyond the newest `keep`, at most [`TRIM_BATCH`](crate::store::memory::TRIM_BATCH) a
/// write, with their revisions (`--max-memories-per-user`); how many. It walks
/// `memory_entries_by_age` newest first (the only index with that order, so the plan whatever
/// the statistics; `tests/plans.rs`), so a write costs the user's memories up to `keep`:
/// little for most users, the limit's worth for one at it.
async fn trim(
    conn: &mut sqlx::PgConnection,
    app: &str,
    user: &str,
    keep: usize,
) -> StoreResult<usize> {
    let gone: Vec<String> = sqlx::query_scalar(TRIM_SQL)
        .bind(app)
        .bind(user)
        .bind(keep.min(i64::MAX as usize) as i64)
        .bind(crate::store::memory::TRIM_BATCH)
        .fetch_all(&mut *conn)
        .await?;
    if !gone.is_empty() {
        sqlx::query(
            "DELETE FROM memory_revisions
              WHERE app_name = $1 AND user_id = $2 AND memory_id = ANY($3)",
        )
        .bind(app)
        .bind(user)
        .bind(&gone)
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
    conn: &mut sqlx::PgConnection,
    app: &str,
    user: &str,
    id: &str,
) -> StoreResult<bool> {
    let existed = sqlx::query(
        "DELETE FROM memory_entries WHERE app_name = $1 AND user_id = $2 AND event_id = $3",
    )
    .bind(app)
    .bind(user)
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        > 0;
    sqlx::query(
        "DELETE FROM memory_revisions WHERE app_name = $1 AND user_id = $2 AND memory_id = $3",
    )
    .bind(app)
    .bind(user)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    Ok(existed)
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
