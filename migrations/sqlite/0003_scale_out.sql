-- Scale-out: see migrations/postgres/0003_scale_out.sql for the reasoning; the same schema.
ALTER TABLE sessions ADD COLUMN active_run TEXT;

CREATE TABLE replicas (
    id           TEXT PRIMARY KEY,
    heartbeat_at REAL NOT NULL,
    lease_secs   REAL NOT NULL,
    started_at   REAL NOT NULL,
    draining     INTEGER NOT NULL DEFAULT 0
);

ALTER TABLE runs ADD COLUMN base_seq INTEGER;
ALTER TABLE runs ADD COLUMN user_event INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cancel_reason TEXT;
ALTER TABLE runs ADD COLUMN cancelled_by TEXT;
ALTER TABLE runs ADD COLUMN sealed INTEGER NOT NULL DEFAULT 1;

CREATE INDEX runs_running_by_owner ON runs (owner) WHERE status = 'running';
CREATE INDEX runs_unsealed ON runs (app_name, user_id, session_id) WHERE NOT sealed;
UPDATE events
   SET id = id || '-' || seq,
       event = json_set(event, '$.id', id || '-' || seq)
 WHERE EXISTS (SELECT 1 FROM events f
                WHERE f.app_name = events.app_name AND f.user_id = events.user_id
                  AND f.session_id = events.session_id AND f.id = events.id
                  AND f.seq < events.seq);
CREATE UNIQUE INDEX events_by_id ON events (app_name, user_id, session_id, id);

CREATE TABLE run_queue (
    ticket     INTEGER PRIMARY KEY AUTOINCREMENT,
    app_name   TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    session_id TEXT NOT NULL,
    owner      TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX run_queue_by_session ON run_queue (app_name, user_id, session_id, ticket);
