-- Memories a model extracts (docs/memory.md, "Extraction"): when a new conversation updates a
-- fact the user's memory already holds, the fact's row takes the new text and its earlier text
-- is kept here, numbered from 1 (the first text). Deleting a memory deletes its revisions in
-- the same transaction (the user's right to be forgotten covers every revision).
-- Distributed by user_id on Citus, colocated with memory_entries (src/store/postgres/citus.rs).
CREATE TABLE memory_revisions (
    app_name    text NOT NULL,
    user_id     text NOT NULL,
    memory_id   text NOT NULL,
    revision    integer NOT NULL,
    session_id  text NOT NULL,
    author      text NOT NULL,
    "timestamp" double precision NOT NULL,
    text        text NOT NULL,
    replaced_at double precision NOT NULL,
    PRIMARY KEY (app_name, user_id, memory_id, revision)
);

-- A user's memories by age, with the trim's tie-break: the newest --max-memories-per-user
-- are kept (a write that adds past it forgets the oldest, src/store/postgres/memory.rs). Keyed
-- by an expression of the user, as 0007 keys sessions: with (app_name, user_id) first, a
-- database never analyzed plans a memory's lookup by id on this index (reading every index
-- entry of the user) as readily as on the primary key; the trim names the expression.
-- And an app's memories by age: its `memory: ttl_days:` forgets the older ones
-- (src/memory/retention.rs) through a range of this index, not a scan of the app.
-- Plain indexes, built while the migration holds the table: on a large table, create them
-- CONCURRENTLY by hand first (docs/operations.md#upgrading), and these are skipped.
CREATE INDEX IF NOT EXISTS memory_entries_by_age
    ON memory_entries ((app_name || E'\x1f' || user_id), "timestamp", event_id);
CREATE INDEX IF NOT EXISTS memory_entries_by_app_age ON memory_entries (app_name, "timestamp");
CREATE INDEX memory_revisions_by_app_age ON memory_revisions (app_name, "timestamp");

-- The memory TTL's scan takes turns with the other cluster-wide scans (src/store/turns.rs).
INSERT INTO poll_turns (kind, polled_at) VALUES ('memory_ttl', 0);
