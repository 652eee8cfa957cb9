-- Eval sets and their cases, as in migrations/postgres/0022_evals.sql.
CREATE TABLE eval_sets (
    app_name    TEXT NOT NULL,
    eval_set_id TEXT NOT NULL,
    head        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (app_name, eval_set_id)
) WITHOUT ROWID;

CREATE TABLE eval_cases (
    app_name    TEXT NOT NULL,
    eval_set_id TEXT NOT NULL,
    eval_id     TEXT NOT NULL,
    position    INTEGER NOT NULL,
    body        TEXT NOT NULL,
    PRIMARY KEY (app_name, eval_set_id, eval_id)
) WITHOUT ROWID;
