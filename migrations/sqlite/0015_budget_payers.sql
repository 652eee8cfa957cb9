-- Budgets per app and per API key besides per user: see migrations/postgres/0017. SQLite keeps
-- running runs in `runs`, so the run's key is there from admission on, and triggers add a
-- keyed run's usage to `usage_keys` as 0014's add every run's to `usage_daily`.
ALTER TABLE api_keys ADD COLUMN budget_tokens_per_day INTEGER;
ALTER TABLE api_keys ADD COLUMN budget_cost_per_month REAL;
ALTER TABLE runs ADD COLUMN key_id TEXT;

CREATE TABLE usage_keys (
    user_id          TEXT NOT NULL,
    key_id           TEXT NOT NULL,
    day              INTEGER NOT NULL,
    app_name         TEXT NOT NULL,
    input_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    cached_tokens    INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    model_calls      INTEGER NOT NULL DEFAULT 0,
    runs             INTEGER NOT NULL DEFAULT 0,
    cost             REAL NOT NULL DEFAULT 0,
    unpriced_calls   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, key_id, day, app_name)
);
CREATE INDEX usage_keys_by_key ON usage_keys (key_id, day);
CREATE INDEX usage_daily_by_app ON usage_daily ((app_name || '/'), day);
-- The running runs an app's or a key's budget check reads (only running runs: every entry
-- has the one key 'running', which is what makes SQLite read the table through it).
CREATE INDEX runs_running ON runs (status) WHERE status = 'running';

CREATE TRIGGER runs_usage_keys AFTER UPDATE OF status ON runs
    WHEN OLD.status = 'running' AND NEW.status <> 'running' AND NEW.key_id IS NOT NULL
         AND NEW.usage IS NOT NULL AND NEW.usage <> '{}'
BEGIN
    INSERT INTO usage_keys (user_id, key_id, day, app_name, input_tokens, output_tokens,
                            cached_tokens, reasoning_tokens, model_calls, runs, cost,
                            unpriced_calls)
    SELECT NEW.user_id, NEW.key_id, CAST(julianday('now') - 2440587.5 AS INTEGER), NEW.app_name,
           COALESCE(sum(json_extract(m.value, '$.inputTokens')), 0),
           COALESCE(sum(json_extract(m.value, '$.outputTokens')), 0),
           COALESCE(sum(json_extract(m.value, '$.cachedTokens')), 0),
           COALESCE(sum(json_extract(m.value, '$.reasoningTokens')), 0),
           COALESCE(sum(json_extract(m.value, '$.modelCalls')), 0), 1,
           COALESCE(sum(json_extract(m.value, '$.pricedCost')), 0),
           COALESCE(sum(json_extract(m.value, '$.unpricedCalls')), 0)
      FROM json_each(NEW.usage) AS m
     WHERE true
    ON CONFLICT (user_id, key_id, day, app_name) DO UPDATE
       SET input_tokens = input_tokens + excluded.input_tokens,
           output_tokens = output_tokens + excluded.output_tokens,
           cached_tokens = cached_tokens + excluded.cached_tokens,
           reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,
           model_calls = model_calls + excluded.model_calls,
           runs = runs + excluded.runs,
           cost = cost + excluded.cost,
           unpriced_calls = unpriced_calls + excluded.unpriced_calls;
END;

CREATE TRIGGER runs_usage_keys_deleted AFTER DELETE ON runs
    WHEN OLD.status = 'running' AND OLD.key_id IS NOT NULL AND OLD.usage IS NOT NULL
         AND OLD.usage <> '{}'
BEGIN
    INSERT INTO usage_keys (user_id, key_id, day, app_name, input_tokens, output_tokens,
                            cached_tokens, reasoning_tokens, model_calls, runs, cost,
                            unpriced_calls)
    SELECT OLD.user_id, OLD.key_id, CAST(julianday('now') - 2440587.5 AS INTEGER), OLD.app_name,
           COALESCE(sum(json_extract(m.value, '$.inputTokens')), 0),
           COALESCE(sum(json_extract(m.value, '$.outputTokens')), 0),
           COALESCE(sum(json_extract(m.value, '$.cachedTokens')), 0),
           COALESCE(sum(json_extract(m.value, '$.reasoningTokens')), 0),
           COALESCE(sum(json_extract(m.value, '$.modelCalls')), 0), 1,
           COALESCE(sum(json_extract(m.value, '$.pricedCost')), 0),
           COALESCE(sum(json_extract(m.value, '$.unpricedCalls')), 0)
      FROM json_each(OLD.usage) AS m
     WHERE true
    ON CONFLICT (user_id, key_id, day, app_name) DO UPDATE
       SET input_tokens = input_tokens + excluded.input_tokens,
           output_tokens = output_tokens + excluded.output_tokens,
           cached_tokens = cached_tokens + excluded.cached_tokens,
           reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,
           model_calls = model_calls + excluded.model_calls,
           runs = runs + excluded.runs,
           cost = cost + excluded.cost,
           unpriced_calls = unpriced_calls + excluded.unpriced_calls;
END;
