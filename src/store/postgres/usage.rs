//! The run's usage added to the daily aggregates by the statement that ends the run (see
//! migration 0016 and [`crate::store::usage`]).

use super::PG_NOW;

/// CTEs adding the usage of the run a preceding CTE `ended` ended (it must return
/// `app_name, user_id, usage, key_id`) to `usage_daily` (one row per model, and one with model
/// '' counting the run) and, with `keyed`, for a run an API key started, to the key's
/// `usage_keys` row. Only immutable functions touch the row's columns, so Citus routes the
/// statement to the user's shard as it does the outbox's. Starts with `, `.
pub(crate) fn spent_cte(ended: &str, keyed: bool) -> String {
    let keyed = match keyed {
        true => keyed_cte(ended),
        false => String::new(),
    };
    format!(
        ", spent AS (
    INSERT INTO usage_daily AS t (app_name, user_id, day, model, input_tokens, output_tokens,
                                  cached_tokens, reasoning_tokens, model_calls, runs, cost,
                                  unpriced_calls)
    SELECT e.app_name, e.user_id, floor({PG_NOW} / 86400.0)::integer, m.key,
           COALESCE((m.value->>'inputTokens')::bigint, 0),
           COALESCE((m.value->>'outputTokens')::bigint, 0),
           COALESCE((m.value->>'cachedTokens')::bigint, 0),
           COALESCE((m.value->>'reasoningTokens')::bigint, 0),
           COALESCE((m.value->>'modelCalls')::bigint, 0), 1,
           COALESCE((m.value->>'pricedCost')::double precision, 0),
           COALESCE((m.value->>'unpricedCalls')::bigint, 0)
      FROM {ended} e
           CROSS JOIN LATERAL jsonb_each(e.usage || '{{\"\": {{}}}}'::jsonb) AS m
     WHERE e.usage IS NOT NULL AND e.usage <> '{{}}'::jsonb
    ON CONFLICT (app_name, user_id, day, model) DO UPDATE
       SET {sums}
)
{keyed}",
        sums = SUMS
    )
}

/// What a second run's usage adds to an aggregate row (`t`) in an upsert.
const SUMS: &str = "input_tokens = t.input_tokens + EXCLUDED.input_tokens,
           output_tokens = t.output_tokens + EXCLUDED.output_tokens,
           cached_tokens = t.cached_tokens + EXCLUDED.cached_tokens,
           reasoning_tokens = t.reasoning_tokens + EXCLUDED.reasoning_tokens,
           model_calls = t.model_calls + EXCLUDED.model_calls,
           runs = t.runs + EXCLUDED.runs,
           cost = t.cost + EXCLUDED.cost,
           unpriced_calls = t.unpriced_calls + EXCLUDED.unpriced_calls";

/// The CTE adding a keyed run's usage to its key's `usage_keys` row (see [`spent_cte`]).
fn keyed_cte(ended: &str) -> String {
    format!(
        ", keyed AS (
    INSERT INTO usage_keys AS t (user_id, key_id, day, app_name, input_tokens, output_tokens,
                                 cached_tokens, reasoning_tokens, model_calls, runs, cost,
                                 unpriced_calls)
    SELECT e.user_id, e.key_id, floor({PG_NOW} / 86400.0)::integer, e.app_name,
           COALESCE(sum((m.value->>'inputTokens')::bigint), 0),
           COALESCE(sum((m.value->>'outputTokens')::bigint), 0),
           COALESCE(sum((m.value->>'cachedTokens')::bigint), 0),
           COALESCE(sum((m.value->>'reasoningTokens')::bigint), 0),
           COALESCE(sum((m.value->>'modelCalls')::bigint), 0), 1,
           COALESCE(sum((m.value->>'pricedCost')::double precision), 0),
           COALESCE(sum((m.value->>'unpricedCalls')::bigint), 0)
      FROM {ended} e CROSS JOIN LATERAL jsonb_each(e.usage) AS m
     WHERE e.key_id IS NOT NULL AND e.usage IS NOT NULL AND e.usage <> '{{}}'::jsonb
     GROUP BY e.user_id, e.key_id, e.app_name
    ON CONFLICT (user_id, key_id, day, app_name) DO UPDATE
       SET {sums}
)",
        sums = SUMS
    )
}
