-- Memory service, SQLite: the same model as migrations/postgres/0002_memory.sql, searched with
-- FTS5. memory_fts is an external-content FTS5 index over memory_entries.text (the text is
-- stored once), kept in step by the triggers below. Tokenizer: unicode61 (Unicode-aware word
-- splitting and case folding, diacritics removed, so "zurich" also finds "Zürich") under the
-- porter stemmer (English stemming, like PostgreSQL's 'english' configuration).
CREATE TABLE memory_entries (
    id          INTEGER PRIMARY KEY,
    app_name    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    author      TEXT NOT NULL,
    timestamp   REAL NOT NULL,
    text        TEXT NOT NULL,
    content     TEXT NOT NULL,
    UNIQUE (app_name, user_id, event_id)
);

CREATE VIRTUAL TABLE memory_fts USING fts5(
    text,
    content = 'memory_entries',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);

-- INSERT … ON CONFLICT DO NOTHING fires no trigger for a skipped row.
CREATE TRIGGER memory_entries_ai AFTER INSERT ON memory_entries BEGIN
    INSERT INTO memory_fts (rowid, text) VALUES (new.id, new.text);
END;

CREATE TRIGGER memory_entries_ad AFTER DELETE ON memory_entries BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;

CREATE TRIGGER memory_entries_au AFTER UPDATE OF text ON memory_entries BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO memory_fts (rowid, text) VALUES (new.id, new.text);
END;

CREATE TABLE memory_sessions (
    app_name            TEXT NOT NULL,
    user_id             TEXT NOT NULL,
    session_id          TEXT NOT NULL,
    session_create_time REAL NOT NULL,
    ingested_seq        INTEGER NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id)
) WITHOUT ROWID;
