-- Scale-out: run ownership on the session row, liveness per replica, cancel metadata.
--
-- `sessions.active_run` is THE owner of a session: admission sets it (only when it is NULL),
-- finishing or abandoning a run clears it, and every append made on behalf of a run is fenced
-- by `active_run = <run id>` in the same UPDATE that bumps `last_seq`. That UPDATE takes the
-- session's row lock, so a takeover (which writes the same row) and a stale run's append are
-- serialized: whichever comes second sees the other's result, and a run that lost the session
-- cannot commit into it.
ALTER TABLE sessions ADD COLUMN active_run text;

-- One row per agentd process. A run is alive while its owner's heartbeat is fresh (younger
-- than that replica's own lease), so liveness costs one write per replica per lease/3, not one
-- per open run.
CREATE TABLE replicas (
    id           text PRIMARY KEY,
    heartbeat_at double precision NOT NULL,
    lease_secs   double precision NOT NULL,
    started_at   double precision NOT NULL,
    draining     boolean NOT NULL DEFAULT false
);

-- base_seq: the session's last seq when the run was admitted (its events come after it);
-- user_event: the run's first event is the user's message (not part of the run's stream);
-- cancel_reason/cancelled_by: who asked for the cancel and why (cancel is idempotent: the
-- first request's values stay); sealed: false while an abandoned run's transcript still needs
-- its open calls answered and its INVOCATION_ABORTED event.
ALTER TABLE runs
    ADD COLUMN base_seq bigint,
    ADD COLUMN user_event boolean NOT NULL DEFAULT false,
    ADD COLUMN cancel_reason text,
    ADD COLUMN cancelled_by text,
    ADD COLUMN sealed boolean NOT NULL DEFAULT true;

-- The heartbeat reads the running runs of one replica (cancel flags); the sweeper finds runs
-- of dead replicas. Both go through this small partial index.
CREATE INDEX runs_running_by_owner ON runs (owner) WHERE status = 'running';
CREATE INDEX runs_unsealed ON runs (app_name, user_id, session_id) WHERE NOT sealed;

-- An append is idempotent on the event id: after a connection drops with the COMMIT in
-- flight, the runner asks for the event by id instead of guessing, and a retry can never store
-- it twice.
-- Before this migration create-session `events` could repeat an id within a session: later
-- copies get their seq as a suffix (in the column and in the event JSON) so the index can be
-- built on any existing database.
UPDATE events e
   SET id = e.id || '-' || e.seq,
       event = jsonb_set(e.event, '{id}', to_jsonb(e.id || '-' || e.seq))
 WHERE EXISTS (SELECT 1 FROM events f
                WHERE f.app_name = e.app_name AND f.user_id = e.user_id
                  AND f.session_id = e.session_id AND f.id = e.id AND f.seq < e.seq);
CREATE UNIQUE INDEX events_by_id ON events (app_name, user_id, session_id, id);

-- `onBusy: enqueue` across replicas, first come first served: a waiting request holds a
-- ticket; admission of a session with tickets goes to the smallest live one.
CREATE TABLE run_queue (
    ticket     bigserial PRIMARY KEY,
    app_name   text NOT NULL,
    user_id    text NOT NULL,
    session_id text NOT NULL,
    owner      text NOT NULL,
    created_at double precision NOT NULL
);
CREATE INDEX run_queue_by_session ON run_queue (app_name, user_id, session_id, ticket);
