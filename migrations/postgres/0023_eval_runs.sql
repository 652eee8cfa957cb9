-- Runs of stored eval sets (docs/evals.md#running-a-stored-set, src/store/eval_runs.rs) and
-- their results. A run is a row in `eval_runs` (its id is ADK's result id,
-- `{app}_{set}_{timestamp}`) and one row per case in `eval_run_cases`, each holding the case as
-- it was when the run started, so editing the set does not change a run in flight.
--
-- A case waits with `due_at` set. A replica claims it by moving `due_at` past a lease and
-- counting the attempt, renews the lease while the case runs, and finishes it by writing its
-- result and clearing `due_at`; every write after the claim names the attempt, so a replica
-- whose lease ran out (it stalled, or the case was cancelled) writes nothing. A replica that
-- dies mid-case leaves its lease to run out, and another replica runs the case again in a new
-- session. A run is running while it has open cases; cancelling one clears them.
--
-- On Citus both tables are distributed by app_name, colocated with eval_sets
-- (src/store/postgres/citus.rs): a run's statements run on one worker, but the read of the
-- cases due, which spans every shard and takes the `evals` turn (src/store/turns.rs).
CREATE TABLE eval_runs (
    app_name    text NOT NULL,
    eval_run_id text NOT NULL,
    eval_set_id text NOT NULL,
    -- The eval config the cases are scored by, `{"criteria": {…}}` (ADK's EvalConfig).
    criteria    text NOT NULL,
    created_at  double precision NOT NULL,
    cancelled   boolean NOT NULL DEFAULT false,
    -- Cases not yet finished: the run is running while this is above 0. Kept here, in the
    -- transaction that finishes a case, so that the count of an app's runs in flight reads
    -- one row per run, not every case.
    open_cases  bigint NOT NULL,
    PRIMARY KEY (app_name, eval_run_id)
);

CREATE TABLE eval_run_cases (
    app_name    text NOT NULL,
    eval_run_id text NOT NULL,
    eval_id     text NOT NULL,
    position    bigint NOT NULL,
    -- The case's file form when the run started.
    body        text NOT NULL,
    -- Waiting since, or claimed until; NULL once the case finished or was cancelled.
    due_at      double precision,
    attempts    integer NOT NULL DEFAULT 0,
    -- The session of the attempt in flight, or of the one that finished.
    user_id     text,
    session_id  text,
    -- ADK's EvalCaseResult, in the file form.
    result      text,
    finished_at double precision,
    PRIMARY KEY (app_name, eval_run_id, eval_id)
);

-- The cases waiting or claimed, soonest first: what every replica's worker reads
-- (src/eval/worker.rs). Partial, so finished cases cost the index nothing, and the planner
-- takes it for `due_at <= $1` with or without statistics.
CREATE INDEX eval_run_cases_due ON eval_run_cases (due_at) WHERE due_at IS NOT NULL;

INSERT INTO poll_turns (kind, polled_at) VALUES ('evals', 0);
