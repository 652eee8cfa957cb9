-- agentd schema, SQLite (the embedded default). Same model as migrations/postgres:
-- JSON is stored as TEXT and merged in Rust under the single writer connection.

CREATE TABLE app_states (
    app_name    TEXT PRIMARY KEY,
    state       TEXT NOT NULL DEFAULT '{}',
    update_time REAL NOT NULL
);

CREATE TABLE user_states (
    app_name    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT '{}',
    update_time REAL NOT NULL,
    PRIMARY KEY (app_name, user_id)
);

CREATE TABLE sessions (
    app_name    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    id          TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT '{}',
    create_time REAL NOT NULL,
    update_time REAL NOT NULL,
    last_seq    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, id)
);

CREATE INDEX sessions_by_update_time ON sessions (app_name, user_id, update_time, id);

CREATE TABLE events (
    app_name      TEXT NOT NULL,
    user_id       TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    id            TEXT NOT NULL,
    invocation_id TEXT NOT NULL,
    author        TEXT NOT NULL,
    timestamp     REAL NOT NULL,
    event         TEXT NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id, seq)
) WITHOUT ROWID;

CREATE TABLE artifacts (
    app_name        TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    session_id      TEXT NOT NULL,
    filename        TEXT NOT NULL,
    version         INTEGER NOT NULL,
    mime_type       TEXT,
    part            TEXT NOT NULL,
    data            BLOB,
    custom_metadata TEXT NOT NULL DEFAULT '{}',
    create_time     REAL NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id, filename, version)
);

CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    app_name         TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    invocation_id    TEXT NOT NULL,
    status           TEXT NOT NULL,
    owner            TEXT NOT NULL,
    lease_expires_at REAL NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    started_at       REAL,
    finished_at      REAL,
    last_seq         INTEGER,
    error            TEXT
);

CREATE UNIQUE INDEX runs_one_active_per_session
    ON runs (app_name, user_id, session_id) WHERE status = 'running';
CREATE INDEX runs_by_session ON runs (app_name, user_id, session_id, created_at);
