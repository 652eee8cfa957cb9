-- Schedules: runs started by a cron pattern, each tick exactly once across replicas.
--
-- A replica claims a due schedule with `FOR UPDATE SKIP LOCKED`, inserts the tick (unique on
-- `(schedule_id, tick_time)`, with the run id it will use) and moves `next_tick` on, in one
-- transaction; only then does it start the run. A replica that dies in between leaves the
-- tick `claimed`: another replica takes it over once the dead one's heartbeat is stale and
-- starts the run with the same id (a run id is a primary key, so it cannot run twice).
CREATE TABLE schedules (
    id          text PRIMARY KEY,
    app_name    text NOT NULL,
    user_id     text NOT NULL,
    cron        text NOT NULL,
    timezone    text NOT NULL,
    -- The user message (ADK Content) each run sends.
    message     jsonb NOT NULL,
    -- NULL: a new session per tick.
    session_id  text,
    on_busy     text NOT NULL,
    catch_up    text NOT NULL,
    webhook     jsonb,
    enabled     boolean NOT NULL,
    -- The next tick to fire; NULL while disabled or when the pattern has no next time.
    next_tick   double precision,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_tick) WHERE enabled;
CREATE INDEX schedules_by_user ON schedules (app_name, user_id, created_at, id);

CREATE TABLE schedule_ticks (
    schedule_id text NOT NULL,
    tick_time   double precision NOT NULL,
    run_id      text NOT NULL,
    session_id  text NOT NULL,
    -- claimed | started | skipped | failed
    status      text NOT NULL,
    claimed_by  text NOT NULL,
    error       text,
    fired_at    double precision NOT NULL,
    PRIMARY KEY (schedule_id, tick_time)
);
CREATE INDEX schedule_ticks_claimed ON schedule_ticks (claimed_by) WHERE status = 'claimed';
-- Pruning old ticks (`agentd prune`, `--session-ttl`).
CREATE INDEX schedule_ticks_by_time ON schedule_ticks (fired_at);
