-- Budgets per app and per API key besides per user: see migrations/postgres/0017. SQLite
-- cannot change a primary key, so `usage_daily` and `budgets` are rebuilt (their triggers
-- first dropped, then written again with the key).
ALTER TABLE runs ADD COLUMN key_id TEXT;

DROP TRIGGER runs_usage;
DROP TRIGGER runs_usage_deleted;

CREATE TABLE usage_daily_next (
    app_name         TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    day              INTEGER NOT NULL,
    model            TEXT NOT NULL,
    key_id           TEXT NOT NULL DEFAULT '',
    input_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    cached_tokens    INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    model_calls      INTEGER NOT NULL DEFAULT 0,
    runs             INTEGER NOT NULL DEFAULT 0,
    cost             REAL NOT NULL DEFAULT 0,
    unpriced_calls   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, day, model, key_id)
);
INSERT INTO usage_daily_next (app_name, user_id, day, model, key_id, input_tokens, output_tokens,
                              cached_tokens, reasoning_tokens, model_calls, runs, cost,
                              unpriced_calls)
SELECT app_name, user_id, day, model, '', input_tokens, output_tokens, cached_tokens,
       reasoning_tokens, model_calls, runs, cost, unpriced_calls
  FROM usage_daily;
DROP TABLE usage_daily;
ALTER TABLE usage_daily_next RENAME TO usage_daily;
CREATE INDEX usage_daily_by_day ON usage_daily (day);
CREATE INDEX usage_daily_by_user ON usage_daily (user_id, day);

CREATE TABLE budgets_next (
    app_name       TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    key_id         TEXT NOT NULL DEFAULT '',
    tokens_per_day INTEGER,
    cost_per_month REAL,
    update_time    REAL NOT NULL,
    PRIMARY KEY (app_name, user_id, key_id)
);
INSERT INTO budgets_next (app_name, user_id, key_id, tokens_per_day, cost_per_month, update_time)
SELECT app_name, user_id, '', tokens_per_day, cost_per_month, update_time FROM budgets;
DROP TABLE budgets;
ALTER TABLE budgets_next RENAME TO budgets;

-- A run's usage added to the aggregates when it ends, or when its session is deleted while it
-- runs (what it spent stays spent): one row per model and one with model '' counting the run,
-- under the key that started it.
CREATE TRIGGER runs_usage AFTER UPDATE OF status ON runs
    WHEN OLD.status = 'running' AND NEW.status <> 'running' AND NEW.usage IS NOT NULL
         AND NEW.usage <> '{}'
BEGIN
    INSERT INTO usage_daily (app_name, user_id, day, model, key_id, input_tokens, output_tokens,
                             cached_tokens, reasoning_tokens, model_calls, runs, cost,
                             unpriced_calls)
    SELECT NEW.app_name, NEW.user_id, CAST(julianday('now') - 2440587.5 AS INTEGER), m.key,
           COALESCE(NEW.key_id, ''),
           COALESCE(json_extract(m.value, '$.inputTokens'), 0),
           COALESCE(json_extract(m.value, '$.outputTokens'), 0),
           COALESCE(json_extract(m.value, '$.cachedTokens'), 0),
           COALESCE(json_extract(m.value, '$.reasoningTokens'), 0),
           COALESCE(json_extract(m.value, '$.modelCalls'), 0), 1,
           COALESCE(json_extract(m.value, '$.pricedCost'), 0),
           COALESCE(json_extract(m.value, '$.unpricedCalls'), 0)
      FROM json_each(json_patch(NEW.usage, '{"": {}}')) AS m
     WHERE true
    ON CONFLICT (app_name, user_id, day, model, key_id) DO UPDATE
       SET input_tokens = input_tokens + excluded.input_tokens,
           output_tokens = output_tokens + excluded.output_tokens,
           cached_tokens = cached_tokens + excluded.cached_tokens,
           reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,
           model_calls = model_calls + excluded.model_calls,
           runs = runs + excluded.runs,
           cost = cost + excluded.cost,
           unpriced_calls = unpriced_calls + excluded.unpriced_calls;
END;

CREATE TRIGGER runs_usage_deleted AFTER DELETE ON runs
    WHEN OLD.status = 'running' AND OLD.usage IS NOT NULL AND OLD.usage <> '{}'
BEGIN
    INSERT INTO usage_daily (app_name, user_id, day, model, key_id, input_tokens, output_tokens,
                             cached_tokens, reasoning_tokens, model_calls, runs, cost,
                             unpriced_calls)
    SELECT OLD.app_name, OLD.user_id, CAST(julianday('now') - 2440587.5 AS INTEGER), m.key,
           COALESCE(OLD.key_id, ''),
           COALESCE(json_extract(m.value, '$.inputTokens'), 0),
           COALESCE(json_extract(m.value, '$.outputTokens'), 0),
           COALESCE(json_extract(m.value, '$.cachedTokens'), 0),
           COALESCE(json_extract(m.value, '$.reasoningTokens'), 0),
           COALESCE(json_extract(m.value, '$.modelCalls'), 0), 1,
           COALESCE(json_extract(m.value, '$.pricedCost'), 0),
           COALESCE(json_extract(m.value, '$.unpricedCalls'), 0)
      FROM json_each(json_patch(OLD.usage, '{"": {}}')) AS m
     WHERE true
    ON CONFLICT (app_name, user_id, day, model, key_id) DO UPDATE
       SET input_tokens = input_tokens + excluded.input_tokens,
           output_tokens = output_tokens + excluded.output_tokens,
           cached_tokens = cached_tokens + excluded.cached_tokens,
           reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,
           model_calls = model_calls + excluded.model_calls,
           runs = runs + excluded.runs,
           cost = cost + excluded.cost,
           unpriced_calls = unpriced_calls + excluded.unpriced_calls;
END;
