-- A running run lives on its session's row; `runs` gets one row per run, written once, when
-- the run ends (docs/storage.md, "The run record"). The session row is already the run's
-- ownership (`active_run`) and is written by admission and by the run's end anyway; holding
-- the run's other facts there too spares every run an insert into `runs` with five index
-- entries at admission, a row lock on it at the reply, and an update that PostgreSQL cannot
-- make HOT (its status is in index predicates). The run columns mean something only while
-- `active_run` is set; admission overwrites all of them.
--
-- Replicas older than this migration must be stopped before it runs: they write running
-- runs into `runs`, which newer replicas no longer read as running (docs/storage.md). So it
-- refuses to run while any replica is heartbeating (the replica running it has not yet).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM replicas
                WHERE heartbeat_at > extract(epoch from now())::double precision - lease_secs) THEN
        RAISE EXCEPTION 'migration 0012 needs every agentd replica stopped: % replica(s) still heartbeating; stop them (a Recreate deployment, not a rolling update) and start again',
            (SELECT count(*) FROM replicas
              WHERE heartbeat_at > extract(epoch from now())::double precision - lease_secs);
    END IF;
END $$;

-- Multi-shard statements after DDL in one transaction need one connection per worker when
-- the tables are already distributed (Citus); a plain PostgreSQL takes the setting as an
-- unused placeholder.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

ALTER TABLE sessions
    ADD COLUMN run_invocation       text,
    ADD COLUMN run_owner            text,
    ADD COLUMN run_created_at       double precision,
    ADD COLUMN run_base_seq         bigint,
    ADD COLUMN run_user_event       boolean NOT NULL DEFAULT false,
    ADD COLUMN run_webhooks         jsonb,
    ADD COLUMN run_cancel_requested boolean NOT NULL DEFAULT false,
    ADD COLUMN run_cancelled_by     text,
    ADD COLUMN run_cancel_reason    text;

-- Runs in flight move onto their sessions.
UPDATE sessions s
   SET run_invocation = r.invocation_id, run_owner = r.owner, run_created_at = r.created_at,
       run_base_seq = r.base_seq, run_user_event = r.user_event, run_webhooks = r.webhooks,
       run_cancel_requested = r.cancel_requested, run_cancelled_by = r.cancelled_by,
       run_cancel_reason = r.cancel_reason
  FROM runs r
 WHERE r.status = 'running' AND r.user_id = s.user_id AND r.app_name = s.app_name
   AND r.session_id = s.id AND r.id = s.active_run;

-- A session that pointed at no running run was free (the old `heal`).
UPDATE sessions SET active_run = NULL WHERE active_run IS NOT NULL AND run_owner IS NULL;

-- A running row that its session did not point at (written before migration 0003) is
-- abandoned; its transcript is sealed like any dead run's.
UPDATE runs SET status = 'abandoned', finished_at = extract(epoch from now())::double precision,
       sealed = false, error = 'its replica stopped heartbeating'
 WHERE status = 'running'
   AND NOT EXISTS (SELECT 1 FROM sessions s
                    WHERE s.user_id = runs.user_id AND s.app_name = runs.app_name
                      AND s.id = runs.session_id AND s.active_run = runs.id);
DELETE FROM runs WHERE status = 'running';

-- No row of `runs` is running any more.
DROP INDEX IF EXISTS runs_one_active_per_session;
DROP INDEX IF EXISTS runs_running_by_owner;

-- A running run by its id (`GET …/runs/{id}`, cancel, the end of a run); unique, as the key
-- of `runs` was for a running run (with the user: Citus wants the distribution column in
-- every unique index). A user's running runs, newest first (list runs: keyed by the same
-- expression as the sessions listing of 0007, which only that query names, so no lookup of
-- one session is planned on it without statistics), and a replica's (heartbeat,
-- reconciliation, the sweep). All small: only running runs. Built without
-- `CONCURRENTLY` (migrations run in a transaction): on a large `sessions` table, writes wait.
CREATE UNIQUE INDEX sessions_running ON sessions (active_run, user_id) WHERE active_run IS NOT NULL;
CREATE INDEX sessions_running_by_user
    ON sessions ((app_name || E'\x1f' || user_id), run_created_at, active_run)
    WHERE active_run IS NOT NULL;
CREATE INDEX sessions_running_by_owner ON sessions (run_owner) WHERE active_run IS NOT NULL;

-- What migration 0011 kept for replicas older than it (none can run past this migration):
-- the webhook triggers (no statement changes a run's status any more) and the unique keys
-- without the user. Only a trigger that exists is dropped: Citus refuses even
-- `DROP TRIGGER IF EXISTS` on a distributed table, and distributing dropped them there.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'runs'::regclass
                                          AND tgname = 'runs_webhooks') THEN
        DROP TRIGGER runs_webhooks ON runs;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'runs'::regclass
                                          AND tgname = 'runs_deleted') THEN
        DROP TRIGGER runs_deleted ON runs;
    END IF;
END $$;
DROP INDEX IF EXISTS idempotency_keys_compat;
DROP INDEX IF EXISTS schedule_ticks_compat;
