//! The webhook outbox on PostgreSQL: the deliveries a run's end owes, written by the very
//! statement that ends the run (so the outcome and its deliveries commit together, and a
//! crash loses neither). Until migration 0011 a trigger on `runs` wrote them; on Citus a
//! trigger on a shard cannot write another distributed table, so each statement that moves a
//! run out of `running` carries this CTE instead. SQLite keeps its trigger
//! (`migrations/sqlite/0008_webhooks.sql`): one file, one writer, nothing distributed.

use super::PG_NOW;

/// A CTE named `outbox` that inserts the deliveries for the runs a preceding CTE `ended`
/// moved out of `running` (it must return `id, app_name, user_id, status, webhooks`). The
/// event type follows the status; a target asking for `run.input_required` hears of a
/// completed run (the payload says which). Starts with `, ` to follow another CTE.
pub(crate) fn outbox_cte(ended: &str) -> String {
    format!(
        ", outbox AS (
    INSERT INTO webhook_deliveries (id, run_id, app_name, user_id, event_type, url, target,
                                    next_attempt_at, created_at)
    SELECT e.id || '-w' || t.ord, e.id, e.app_name, e.user_id, k.kind, t.target->>'url',
           t.target, {PG_NOW}, {PG_NOW}
      FROM {ended} e
           CROSS JOIN LATERAL (SELECT CASE e.status WHEN 'completed' THEN 'run.completed'
                                                    WHEN 'cancelled' THEN 'run.cancelled'
                                                    ELSE 'run.failed' END AS kind) k
           CROSS JOIN LATERAL jsonb_array_elements(e.webhooks) WITH ORDINALITY AS t(target, ord)
     WHERE e.webhooks IS NOT NULL
       AND (t.target->'events' ? k.kind
            OR (k.kind = 'run.completed' AND t.target->'events' ? 'run.input_required'))
    ON CONFLICT (user_id, id) DO NOTHING
)"
    )
}

/// Deletes the webhook deliveries of a session's runs (`$1` app, `$2` user, `$3` session),
/// before the runs themselves go: a session deleted or pruned takes its runs' deliveries with
/// it (a trigger did this before migration 0011, and on a plain PostgreSQL until 0012).
pub(crate) const DELETE_SESSION_DELIVERIES: &str = "DELETE FROM webhook_deliveries
      WHERE user_id = $2
        AND run_id IN (SELECT id FROM runs
                        WHERE app_name = $1 AND user_id = $2 AND session_id = $3)";
