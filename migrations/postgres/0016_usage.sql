-- Usage and budgets (docs/usage.md).
--
-- A running run's usage (tokens by model, priced) is on its session row beside the other
-- `run_*` columns; every commit of the run writes the run's running total there in the same
-- statement, so it costs no commit of its own and a replica that takes the run over goes on
-- from it. The statement that ends the run copies it to the run's `runs` row and adds it to
-- `usage_daily`, one row per (app, user, UTC day, model) plus one with model '' counting the
-- runs. Adding nullable columns rewrites nothing.
ALTER TABLE sessions ADD COLUMN run_usage jsonb;
ALTER TABLE runs ADD COLUMN usage jsonb;

CREATE TABLE usage_daily (
    app_name         text NOT NULL,
    user_id          text NOT NULL,
    -- Days since 1970-01-01, UTC.
    day              integer NOT NULL,
    model            text NOT NULL,
    input_tokens     bigint NOT NULL DEFAULT 0,
    output_tokens    bigint NOT NULL DEFAULT 0,
    cached_tokens    bigint NOT NULL DEFAULT 0,
    reasoning_tokens bigint NOT NULL DEFAULT 0,
    model_calls      bigint NOT NULL DEFAULT 0,
    runs             bigint NOT NULL DEFAULT 0,
    -- The cost of the calls that had a price; `unpriced_calls` counts the others (a report
    -- shows no cost for them, never a guess; a cost budget counts what is known).
    cost             double precision NOT NULL DEFAULT 0,
    unpriced_calls   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, day, model)
);
-- The admins' report over every user reads a range of days.
CREATE INDEX usage_daily_by_day ON usage_daily (day);

CREATE TABLE budgets (
    app_name       text NOT NULL,
    user_id        text NOT NULL,
    tokens_per_day bigint,
    cost_per_month double precision,
    update_time    double precision NOT NULL,
    PRIMARY KEY (app_name, user_id)
);
