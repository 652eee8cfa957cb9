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

-- A user's memories by age: the newest --max-memories-per-user are kept (a write that adds
-- past it forgets the oldest, src/store/postgres/memory.rs), and an app's `memory: ttl:` expires
-- the older ones (src/memory/retention.rs).
CREATE INDEX memory_entries_by_age ON memory_entries (app_name, user_id, "timestamp");

-- The memory TTL's scan takes turns with the other cluster-wide scans (src/store/turns.rs).
INSERT INTO poll_turns (kind, polled_at) VALUES ('memory_ttl', 0);
