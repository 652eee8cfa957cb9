-- agentd schema, PostgreSQL.
--
-- State is split the ADK way: plain keys on the session row, `app:` keys in app_states,
-- `user:` keys in user_states (prefixes stripped). Every complete event has a per-session,
-- gapless `seq`, assigned in the same statement that applies its state delta and bumps
-- sessions.last_seq (the session's version). Timestamps are float epoch seconds, as on the wire.
--
-- There is deliberately no foreign key from events to sessions: the append statement only
-- inserts an event when it has just updated (and row-locked) its session, and deleting a
-- session removes its events in the same transaction. An FK would add a lookup and a
-- row lock to every append on the hot path and buy nothing.

CREATE TABLE app_states (
    app_name    text PRIMARY KEY,
    state       jsonb NOT NULL DEFAULT '{}',
    update_time double precision NOT NULL
);

CREATE TABLE user_states (
    app_name    text NOT NULL,
    user_id     text NOT NULL,
    state       jsonb NOT NULL DEFAULT '{}',
    update_time double precision NOT NULL,
    PRIMARY KEY (app_name, user_id)
);

CREATE TABLE sessions (
    app_name    text NOT NULL,
    user_id     text NOT NULL,
    id          text NOT NULL,
    state       jsonb NOT NULL DEFAULT '{}',
    create_time double precision NOT NULL,
    update_time double precision NOT NULL,
    last_seq    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, id)
);

-- List sessions of a user oldest-update first (ADK order), with a keyset cursor.
CREATE INDEX sessions_by_update_time ON sessions (app_name, user_id, update_time, id);

CREATE TABLE events (
    app_name      text NOT NULL,
    user_id       text NOT NULL,
    session_id    text NOT NULL,
    seq           bigint NOT NULL,
    id            text NOT NULL,
    invocation_id text NOT NULL,
    author        text NOT NULL,
    "timestamp"   double precision NOT NULL,
    event         jsonb NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id, seq)
);

-- Artifacts: versioned from 0. session_id is '' for user-scoped (`user:`) filenames.
-- `part` is the stored Part without its inline bytes, which live in `data`.
CREATE TABLE artifacts (
    app_name        text NOT NULL,
    user_id         text NOT NULL,
    session_id      text NOT NULL,
    filename        text NOT NULL,
    version         integer NOT NULL,
    mime_type       text,
    part            jsonb NOT NULL,
    data            bytea,
    custom_metadata jsonb NOT NULL DEFAULT '{}',
    create_time     double precision NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id, filename, version)
);

-- Runs: one row per POST /run. "At most one active run per session" is the partial unique
-- index below, so it holds across replicas. A running row carries a lease that its owner
-- renews; a row whose lease expired belongs to a dead process and may be taken over.
CREATE TABLE runs (
    id               text PRIMARY KEY,
    app_name         text NOT NULL,
    user_id          text NOT NULL,
    session_id       text NOT NULL,
    invocation_id    text NOT NULL,
    status           text NOT NULL,
    owner            text NOT NULL,
    lease_expires_at double precision NOT NULL,
    cancel_requested boolean NOT NULL DEFAULT false,
    created_at       double precision NOT NULL,
    started_at       double precision,
    finished_at      double precision,
    last_seq         bigint,
    error            text
);

CREATE UNIQUE INDEX runs_one_active_per_session
    ON runs (app_name, user_id, session_id) WHERE status = 'running';
CREATE INDEX runs_by_session ON runs (app_name, user_id, session_id, created_at);
