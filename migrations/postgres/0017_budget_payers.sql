-- Budgets per app and per API key besides per user (docs/usage.md#budgets). Only additions:
-- replicas from before this migration go on working beside it (a rolling update).
--
-- An app's budget is a `budgets` row with user '' (ids are never empty, so '' names nobody).
-- An API key's budget is on the key's own row (a reference table on Citus: one read on any node).
ALTER TABLE api_keys ADD COLUMN budget_tokens_per_day bigint;
ALTER TABLE api_keys ADD COLUMN budget_cost_per_month double precision;

-- A run is charged to the API key that started it. While it runs the key is on its session
-- row, with the run it was written for: a replica from before this migration admits runs
-- without writing `run_key`, and such a run must not inherit the key of the session's
-- previous run. Once ended, the key is on the run's `runs` row.
ALTER TABLE sessions ADD COLUMN run_key text;
ALTER TABLE sessions ADD COLUMN run_key_run text;
ALTER TABLE runs ADD COLUMN key_id text;

-- What each key spent, per user, UTC day and app: written by the statement that ends a keyed
-- run, beside `usage_daily` (whose key this migration leaves alone, for the older replicas'
-- statements). Distributed by user on Citus: a key that acts as one user is read on that
-- user's shard; an admin key's spending (any user's) on every shard, by `usage_keys_by_key`.
CREATE TABLE usage_keys (
    user_id          text NOT NULL,
    key_id           text NOT NULL,
    -- Days since 1970-01-01, UTC.
    day              integer NOT NULL,
    app_name         text NOT NULL,
    input_tokens     bigint NOT NULL DEFAULT 0,
    output_tokens    bigint NOT NULL DEFAULT 0,
    cached_tokens    bigint NOT NULL DEFAULT 0,
    reasoning_tokens bigint NOT NULL DEFAULT 0,
    model_calls      bigint NOT NULL DEFAULT 0,
    runs             bigint NOT NULL DEFAULT 0,
    cost             double precision NOT NULL DEFAULT 0,
    unpriced_calls   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, key_id, day, app_name)
);
CREATE INDEX usage_keys_by_key ON usage_keys (key_id, day);
-- An app's spending (an app budget's check) reads the app's rows of the month, not its
-- history. On an expression (ids never hold '/'), so that a user's check, which names the app
-- too, is never planned on it instead of the primary key (whose prefix is the user's rows).
CREATE INDEX usage_daily_by_app ON usage_daily ((app_name || '/'), day);
