-- Sessions whose memory is due (an app's `memory: idle_seconds:`, docs/memory.md#when-sessions-are-added): a run's
-- end sets `due_at` to when the session will have been idle that long, and every later run's end
-- moves it on, so a conversation is added to memory once it has paused, not after every turn.
-- A replica that takes a due session claims it by moving `due_at` past a lease; it deletes the
-- row when the session is added, only while `due_at` is still its claim (a run that ended since
-- made the session due again). A replica that dies mid-way leaves its claim to expire, and
-- another replica takes the session then: nothing waits on a process.
-- Distributed by user_id on Citus, colocated with sessions (src/store/postgres/citus.rs).
CREATE TABLE memory_due (
    app_name   text NOT NULL,
    user_id    text NOT NULL,
    session_id text NOT NULL,
    due_at     double precision NOT NULL,
    attempts   integer NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, session_id)
);

-- The due sessions, soonest first: what the sweep reads (src/memory/idle.rs).
CREATE INDEX memory_due_by_time ON memory_due (due_at);

-- The sweep's turn (src/store/turns.rs): one replica of the deployment reads per period.
INSERT INTO poll_turns (kind, polled_at) VALUES ('memory_idle', 0);
