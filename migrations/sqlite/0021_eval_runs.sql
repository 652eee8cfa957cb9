-- Runs of stored eval sets and their results, as in migrations/postgres/0023_eval_runs.sql.
CREATE TABLE eval_runs (
    app_name    TEXT NOT NULL,
    eval_run_id TEXT NOT NULL,
    eval_set_id TEXT NOT NULL,
    criteria    TEXT NOT NULL,
    created_at  REAL NOT NULL,
    cancelled   INTEGER NOT NULL DEFAULT 0,
    open_cases  INTEGER NOT NULL,
    PRIMARY KEY (app_name, eval_run_id)
) WITHOUT ROWID;

CREATE TABLE eval_run_cases (
    app_name    TEXT NOT NULL,
    eval_run_id TEXT NOT NULL,
    eval_id     TEXT NOT NULL,
    position    INTEGER NOT NULL,
    body        TEXT NOT NULL,
    due_at      REAL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    user_id     TEXT,
    session_id  TEXT,
    result      TEXT,
    finished_at REAL,
    PRIMARY KEY (app_name, eval_run_id, eval_id)
) WITHOUT ROWID;

CREATE INDEX eval_run_cases_due ON eval_run_cases (due_at) WHERE due_at IS NOT NULL;
