-- Eval sets and their cases (docs/evals.md, src/store/evals.rs), per app. JSON is kept as text
-- in ADK's file form: jsonb would reorder keys, and an exported `*.evalset.json` must be the
-- file that was imported. A set's cases come back in `position` order, the order they were
-- added (ADK keeps them so). On Citus both tables are distributed by app_name and colocated
-- (src/store/postgres/citus.rs): a set's reads and writes run on one worker.
CREATE TABLE eval_sets (
    app_name    text NOT NULL,
    eval_set_id text NOT NULL,
    -- The set's file form without `eval_cases`.
    head        text NOT NULL,
    created_at  double precision NOT NULL,
    PRIMARY KEY (app_name, eval_set_id)
);

CREATE TABLE eval_cases (
    app_name    text NOT NULL,
    eval_set_id text NOT NULL,
    eval_id     text NOT NULL,
    position    bigint NOT NULL,
    -- The case's file form.
    body        text NOT NULL,
    PRIMARY KEY (app_name, eval_set_id, eval_id)
);
