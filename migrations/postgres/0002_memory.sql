-- Memory service (ADK `PATCH /apps/{app}/users/{user}/memory`, the `load_memory` tool):
-- the text of a session's complete events, searchable per (app, user).
--
-- Text search configuration: 'english'. Memory is searched by an agent's natural-language
-- query ("what is my favourite colour?"), and agentd matches ANY of the query's words (see
-- src/store/postgres_memory.rs), so it matters that stop words ("what", "is", "my") are not
-- terms and that "colours" finds "colour". Words of other languages pass through the English
-- stemmer unchanged or stemmed the same way on both sides, so exact words still match ("Zürich",
-- "Straße"); only English gets stemming. SQLite uses the porter stemmer for the same reason.
-- The same (app, user, event) is stored once, so adding a session again is a no-op.
CREATE TABLE memory_entries (
    app_name    text NOT NULL,
    user_id     text NOT NULL,
    session_id  text NOT NULL,
    event_id    text NOT NULL,
    author      text NOT NULL,
    "timestamp" double precision NOT NULL,
    text        text NOT NULL,
    content     jsonb NOT NULL,
    tsv         tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    PRIMARY KEY (app_name, user_id, event_id)
);

CREATE INDEX memory_entries_tsv ON memory_entries USING gin (tsv);

-- A search query as a tsquery. websearch_to_tsquery never fails on user input; a query of
-- stop words only becomes the empty query (matches nothing) and raises a NOTICE, which the
-- SET keeps out of agentd's log.
CREATE FUNCTION memory_tsquery(query text) RETURNS tsquery
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET client_min_messages = warning
    AS $$ SELECT websearch_to_tsquery('english', query) $$;

-- How far each session has been added to memory: events with seq <= ingested_seq are done, so
-- adding a long session again (the auto-ingest plugin does it after every run) reads only its
-- new events. session_create_time tells a deleted-and-recreated session (same id, seq from 1
-- again) from the one that was ingested.
CREATE TABLE memory_sessions (
    app_name            text NOT NULL,
    user_id             text NOT NULL,
    session_id          text NOT NULL,
    session_create_time double precision NOT NULL,
    ingested_seq        bigint NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id)
);
