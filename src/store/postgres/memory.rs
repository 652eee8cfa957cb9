//! Memory on PostgreSQL: `memory_entries` with a generated `tsvector` (English configuration)
//! and a GIN index, searched with `websearch_to_tsquery` and ranked by `ts_rank`
//! (see migrations/postgres/0002_memory.sql).

use super::*;
use crate::store::memory::changes::{apply, Applied, ChangeTx, MemoryChange, MemoryRevision};
use crate::store::memory::sql;
use crate::store::memory::{
    add_session, or_query, query_words, IngestMark, MemoryBackend, MemoryEntry, MemoryStore,
};
use async_trait::async_trait;
use sqlx::types::Json;
use sqlx::Row;

/// The query's words OR-ed (`"a" or "b"`), parsed by `memory_tsquery` (websearch_to_tsquery,
/// which never fails), ranked by `ts_rank`, newest first among equals: one call of
/// `agentd_memory_by_words_v1` (migrations/postgres/0019_memory_search.sql, which says how it
/// stays fast for a user with many memories, as changed by 0024_memory_search_reads.sql).
const SEARCH_SQL: &str = "SELECT * FROM agentd_memory_by_words_v1($1, $2, $3, $4)";

#[async_trait]
impl MemoryBackend for PgStore {
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
        let row = sqlx::query(sql::MEMORY_BY_ID)
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

    async fn apply_memory_changes(
        &self,
        key: &SessionKey,
        from: IngestMark,
        to: IngestMark,
        changes: &[MemoryChange],
    ) -> StoreResult<Option<Applied>> {
        let mut w = PgChanges {
            tx: self.pool().begin().await?,
            keep: self.limits.max_memories_per_user,
            vectors: self.has_vectors(),
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
            .execute(self.pool())
            .await?;
        let gone = sqlx::query(sql::EXPIRE_MEMORIES)
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
        Ok(sqlx::query_as(sql::REVISIONS)
            .bind(app)
            .bind(user)
            .bind(id)
            .fetch_all(self.pool())
            .await?)
    }
}

/// [`apply`]'s statements on PostgreSQL, in one transaction.
struct PgChanges {
    tx: sqlx::Transaction<'static, Postgres>,
    /// `--max-memories-per-user`.
    keep: usize,
    /// Whether `memory_entries` has its vector columns ([`PgStore::has_vectors`]).
    vectors: bool,
}

#[async_trait]
impl ChangeTx for PgChanges {
    async fn same_session(&mut self, key: &SessionKey, create_time: f64) -> StoreResult<bool> {
        // Locked, so the session stays the one read until the commit.
        Ok(sqlx::query(&format!("{} FOR KEY SHARE", sql::SAME_SESSION))
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
        // The row lock makes a second extraction of the same events wait here, then find the
        // mark moved.
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
        update_one(&mut self.tx, key, e, now, self.vectors).await
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

/// Gives memory `e.event_id` of the key's user `e`'s text, author, session and time, its text
/// until now kept as its next revision; whether it existed. In place, with the row locked
/// first: a delete or another update of the same memory waits for this one and then acts on
/// what it wrote (the revision numbers stay unique). Its vector and claim are cleared (when
/// the database keeps vectors), so the embedder makes one for the new text.
async fn update_one(
    conn: &mut sqlx::PgConnection,
    key: &SessionKey,
    e: &MemoryEntry,
    now: f64,
    vectors: bool,
) -> StoreResult<bool> {
    let (app, user, id) = (&key.app_name, &key.user_id, &e.event_id);
    let current = sqlx::query(&format!("{} FOR UPDATE", sql::MEMORY_BY_ID))
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(current) = current.as_ref().map(entry_of).transpose()? else {
        return Ok(false);
    };
    let last: i32 = sqlx::query_scalar(sql::LAST_REVISION)
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_one(&mut *conn)
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
    .bind(id)
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

// Sessions whose memory is due: the same statements on both backends (`store::memory::due`).
crate::store::memory::due::due_store!(PgStore, pool, pool);
