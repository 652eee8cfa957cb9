-- Budgets per app and per API key besides per user (docs/usage.md).
--
-- A run is charged to the API key that started it: the key's id is on the session row while
-- the run runs (`run_key`, written by admission), on the run's `runs` row once it has ended,
-- and a dimension of `usage_daily` ('' for a run without a key), so a key's spending is read
-- like a user's, on the user's rows (a key acts as one user).
--
-- A budget's row names its payer: (app, user, '') a user in an app, (app, '', '') an app's
-- users together, ('', user, key) an API key. Ids are never empty, so '' names nobody.
-- Adding columns with a constant default rewrites nothing; the primary keys are rebuilt
-- (`usage_daily` and `budgets` hold one row per user, app, day and model at most).
ALTER TABLE sessions ADD COLUMN run_key text;
ALTER TABLE runs ADD COLUMN key_id text;

ALTER TABLE usage_daily ADD COLUMN key_id text NOT NULL DEFAULT '';
ALTER TABLE usage_daily DROP CONSTRAINT usage_daily_pkey;
ALTER TABLE usage_daily ADD PRIMARY KEY (app_name, user_id, day, model, key_id);
-- A key's spending (its user's rows of a day), without the app the primary key starts with.
CREATE INDEX usage_daily_by_user ON usage_daily (user_id, day);

ALTER TABLE budgets ADD COLUMN key_id text NOT NULL DEFAULT '';
ALTER TABLE budgets DROP CONSTRAINT budgets_pkey;
ALTER TABLE budgets ADD PRIMARY KEY (app_name, user_id, key_id);
