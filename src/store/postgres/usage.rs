//! The run's usage added to the daily aggregates by the statement that ends the run (see
//! migration 0016 and [`crate::store::usage`]).

use super::PG_NOW;

/// A CTE adding the usage of the run a preceding CTE `ended` ended (it must return
/// `app_name, user_id, usage, key_id`) to `usage_daily`: one row per model, and one with model
/// '' counting the run, under the API key that started the run ('' for none). Only immutable functions touch the row's columns, so Citus routes the
/// statement to the user's shard as it does the outbox's. Starts with `, `.
pub(crate) fn spent_cte(ended: &str) -> String {
    format!(
        ", spent AS (
    INSERT INTO usage_daily AS t (app_name, user_id, day, model, key_id, input_tokens,
                                  output_tokens, cached_tokens, reasoning_tokens, model_calls,
                                  runs, cost, unpriced_calls)
    SELECT e.app_name, e.user_id, floor({PG_NOW} / 86400.0)::integer, m.key,
           COALESCE(e.key_id, ''),
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
    ON CONFLICT (app_name, user_id, day, model, key_id) DO UPDATE
       SET input_tokens = t.input_tokens + EXCLUDED.input_tokens,
           output_tokens = t.output_tokens + EXCLUDED.output_tokens,
           cached_tokens = t.cached_tokens + EXCLUDED.cached_tokens,
           reasoning_tokens = t.reasoning_tokens + EXCLUDED.reasoning_tokens,
           model_calls = t.model_calls + EXCLUDED.model_calls,
           runs = t.runs + EXCLUDED.runs,
           cost = t.cost + EXCLUDED.cost,
           unpriced_calls = t.unpriced_calls + EXCLUDED.unpriced_calls
)"
    )
}
