-- Memories a model extracts: a fact's earlier texts, as in
-- migrations/postgres/0020_memory_revisions.sql.
CREATE TABLE memory_revisions (
    app_name    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    memory_id   TEXT NOT NULL,
    revision    INTEGER NOT NULL,
    session_id  TEXT NOT NULL,
    author      TEXT NOT NULL,
    timestamp   REAL NOT NULL,
    text        TEXT NOT NULL,
    replaced_at REAL NOT NULL,
    PRIMARY KEY (app_name, user_id, memory_id, revision)
) WITHOUT ROWID;

-- A user's memories by age (--max-memories-per-user), an app's (its `memory: ttl_days:`).
CREATE INDEX memory_entries_by_age ON memory_entries (app_name, user_id, timestamp, event_id);
CREATE INDEX memory_entries_by_app_age ON memory_entries (app_name, timestamp);
CREATE INDEX memory_revisions_by_app_age ON memory_revisions (app_name, timestamp);
