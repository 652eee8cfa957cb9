//! The memory statements both backends run as they are: `$N` parameters (SQLite numbers them
//! in order of first use, so each statement names `$1`, `$2`, … first in that order), quoted
//! `"timestamp"`, `EXCLUDED`. What differs stays in each backend's `memory.rs`: a memory's
//! `content` (jsonb or text), the update (PostgreSQL locks the row and names its vector
//! columns only when pgvector is there) and the trim.

/// One memory: $1 app, $2 user, $3 id.
pub const MEMORY_BY_ID: &str = r#"SELECT session_id, event_id, author, "timestamp", text, content
  FROM memory_entries WHERE app_name = $1 AND user_id = $2 AND event_id = $3"#;

/// Deletes memory $3 of ($1, $2).
pub const DELETE_MEMORY: &str =
    "DELETE FROM memory_entries WHERE app_name = $1 AND user_id = $2 AND event_id = $3";

/// Deletes the revisions of memory $3 of ($1, $2).
pub const DELETE_REVISIONS: &str =
    "DELETE FROM memory_revisions WHERE app_name = $1 AND user_id = $2 AND memory_id = $3";

/// The revisions of memory $3 of ($1, $2), oldest first.
pub const REVISIONS: &str = r#"SELECT revision, text, author, session_id, "timestamp", replaced_at
  FROM memory_revisions WHERE app_name = $1 AND user_id = $2 AND memory_id = $3
 ORDER BY revision"#;

/// The highest revision of memory $3 of ($1, $2), 0 for none.
pub const LAST_REVISION: &str = "SELECT coalesce(max(revision), 0) FROM memory_revisions
  WHERE app_name = $1 AND user_id = $2 AND memory_id = $3";

/// Keeps a memory's text as its revision: $1 app, $2 user, $3 id, $4 revision, $5 session,
/// $6 author, $7 when it was stated, $8 the text, $9 when it is replaced.
pub const INSERT_REVISION: &str = r#"INSERT INTO memory_revisions (app_name, user_id, memory_id,
       revision, session_id, author, "timestamp", text, replaced_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"#;

/// An app's memories stated before $2 (`memory: ttl_days:`), and the revisions' texts.
pub const EXPIRE_MEMORIES: &str =
    r#"DELETE FROM memory_entries WHERE app_name = $1 AND "timestamp" < $2"#;
pub const EXPIRE_REVISIONS: &str =
    r#"DELETE FROM memory_revisions WHERE app_name = $1 AND "timestamp" < $2"#;

/// Whether session ($1, $2, $3) is the one created at $4 (the one a mark was read for).
pub const SAME_SESSION: &str = "SELECT 1 FROM sessions
  WHERE app_name = $1 AND user_id = $2 AND id = $3 AND create_time = $4";

/// Moves a session's memory mark from ($6, $7) to ($4, $5): inserts it when the session has
/// none, updates it while it is the one read (or, when the one read was 0, a mark of an
/// earlier session of that id: the caller checked that the session is the one read), and
/// returns no row otherwise.
pub const MOVE_MARK: &str = "INSERT INTO memory_sessions AS t
        (app_name, user_id, session_id, session_create_time, ingested_seq)
     VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (app_name, user_id, session_id) DO UPDATE
        SET ingested_seq = EXCLUDED.ingested_seq,
            session_create_time = EXCLUDED.session_create_time
      WHERE (t.session_create_time = $6 AND t.ingested_seq = $7)
         OR ($7 = 0 AND t.session_create_time <> $6)
     RETURNING 1";
