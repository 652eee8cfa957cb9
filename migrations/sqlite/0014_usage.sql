-- Usage and budgets: see migrations/postgres/0016_usage.sql. A running run's usage is on its
-- `runs` row (SQLite keeps running runs there), written by every commit of the run in its
-- transaction; a trigger adds it to `usage_daily` when the run ends, as the webhooks'
-- deliveries are written (0008), or when its session is deleted while it runs (what it spent
-- stays spent).
ALTER TABLE runs ADD COLUMN usage TEXT;

CREATE TABLE usage_daily (
    app_name         TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    day              INTEGER NOT NULL,
    model            TEXT NOT NULL,
    input_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    cached_tokens    INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    model_calls      INTEGER NOT NULL DEFAULT 0,
    runs             INTEGER NOT NULL DEFAULT 0,
    cost             REAL NOT NULL DEFAULT 0,
    unpriced_calls   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, day, model)
);
CREATE INDEX usage_daily_by_day ON usage_daily (day);

CREATE TABLE budgets (
    app_name       TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    tokens_per_day INTEGER,
    cost_per_month REAL,
    update_time    REAL NOT NULL,
    PRIMARY KEY (app_name, user_id)
);

CREATE TRIGGER runs_usage AFTER UPDATE OF status ON runs
    WHEN OLD.status = 'running' AND NEW.status <> 'running' AND NEW.usage IS NOT NULL
         AND NEW.usage <> '{}'
BEGIN
    INSERT INTO usage_daily (app_name, user_id, day, model, input_tokens, output_tokens,
                             cached_tokens, reasoning_tokens, model_calls, runs, cost,
                             unpriced_calls)
    SELECT NEW.app_name, NEW.user_id, CAST(julianday('now') - 2440587.5 AS INTEGER), m.key,
           COALESCE(json_extract(m.value, '$.inputTokens'), 0),
           COALESCE(json_extract(m.value, '$.outputTokens'), 0),
           COALESCE(json_extract(m.value, '$.cachedTokens'), 0),
           COALESCE(json_extract(m.value, '$.reasoningTokens'), 0),
           COALESCE(json_extract(m.value, '$.modelCalls'), 0), 1,
           COALESCE(json_extract(m.value, '$.pricedCost'), 0),
           COALESCE(json_extract(m.value, '$.unpricedCalls'), 0)
      FROM json_each(json_patch(NEW.usage, '{"": {}}')) AS m
     WHERE true
    ON CONFLICT (app_name, user_id, day, model) DO UPDATE
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
    INSERT INTO usage_daily (app_name, user_id, day, model, input_tokens, output_tokens,
                             cached_tokens, reasoning_tokens, model_calls, runs, cost,
                             unpriced_calls)
    SELECT OLD.app_name, OLD.user_id, CAST(julianday('now') - 2440587.5 AS INTEGER), m.key,
           COALESCE(json_extract(m.value, '$.inputTokens'), 0),
           COALESCE(json_extract(m.value, '$.outputTokens'), 0),
           COALESCE(json_extract(m.value, '$.cachedTokens'), 0),
           COALESCE(json_extract(m.value, '$.reasoningTokens'), 0),
           COALESCE(json_extract(m.value, '$.modelCalls'), 0), 1,
           COALESCE(json_extract(m.value, '$.pricedCost'), 0),
           COALESCE(json_extract(m.value, '$.unpricedCalls'), 0)
      FROM json_each(json_patch(OLD.usage, '{"": {}}')) AS m
     WHERE true
    ON CONFLICT (app_name, user_id, day, model) DO UPDATE
       SET input_tokens = input_tokens + excluded.input_tokens,
           output_tokens = output_tokens + excluded.output_tokens,
           cached_tokens = cached_tokens + excluded.cached_tokens,
           reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,
           model_calls = model_calls + excluded.model_calls,
           runs = runs + excluded.runs,
           cost = cost + excluded.cost,
           unpriced_calls = unpriced_calls + excluded.unpriced_calls;
END;
