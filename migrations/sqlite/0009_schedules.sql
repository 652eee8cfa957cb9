-- Schedules: see migrations/postgres/0010_schedules.sql; the same schema.
CREATE TABLE schedules (
    id          TEXT PRIMARY KEY,
    app_name    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    message     TEXT NOT NULL,
    session_id  TEXT,
    on_busy     TEXT NOT NULL,
    catch_up    TEXT NOT NULL,
    webhook     TEXT,
    enabled     INTEGER NOT NULL,
    next_tick   REAL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_tick) WHERE enabled;
CREATE INDEX schedules_by_user ON schedules (app_name, user_id, created_at, id);

CREATE TABLE schedule_ticks (
    schedule_id TEXT NOT NULL,
    tick_time   REAL NOT NULL,
    run_id      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    status      TEXT NOT NULL,
    claimed_by  TEXT NOT NULL,
    error       TEXT,
    fired_at    REAL NOT NULL,
    PRIMARY KEY (schedule_id, tick_time)
);
CREATE INDEX schedule_ticks_claimed ON schedule_ticks (claimed_by) WHERE status = 'claimed';
-- Pruning old ticks (`agentd prune`, `--session-ttl`).
CREATE INDEX schedule_ticks_by_time ON schedule_ticks (fired_at);
