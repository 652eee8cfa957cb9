-- Sessions whose memory is due (an app's `memory: idle_seconds:`), as in
-- migrations/postgres/0021_memory_due.sql.
CREATE TABLE memory_due (
    app_name   TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    session_id TEXT NOT NULL,
    due_at     REAL NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, session_id)
) WITHOUT ROWID;

CREATE INDEX memory_due_by_time ON memory_due (due_at);
