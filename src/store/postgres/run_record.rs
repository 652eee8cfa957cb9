//! Where a run's record lives on PostgreSQL (migration 0012): while it runs, on its session's
//! row (the `run_*` columns beside `active_run`, the ownership); once it has ended, in one
//! `runs` row, inserted by the very statement that frees the session. So a run costs `runs`
//! one insert, and a run that ends cleanly never touches a `runs` row before that.
//! docs/storage.md ("The run record") says why.
//!
//! Readers see both places as one record: [`running_columns`] reads a session row as the
//! `runs` row of its running run, and [`union_sql`] asks both for the same run.

use super::PG_NOW;
use crate::store::runs::RUN_COLUMNS;

/// The columns of a session row read as its running run's record, named and ordered as
/// [`RUN_COLUMNS`]. `id` is the run id's expression (`active_run`, or the statement's
/// parameter after an `UPDATE` has cleared `active_run`); `t` qualifies the session's columns.
pub(crate) fn running_columns(id: &str, t: &str) -> String {
    format!(
        "{id} AS id, {t}.app_name, {t}.user_id, {t}.id AS session_id,
         {t}.run_invocation AS invocation_id, 'running'::text AS status, {t}.run_owner AS owner,
         {t}.run_cancel_requested AS cancel_requested, {t}.run_cancelled_by AS cancelled_by,
         {t}.run_cancel_reason AS cancel_reason, {t}.run_created_at AS created_at,
         {t}.run_created_at AS started_at, NULL::double precision AS finished_at,
         {t}.run_base_seq AS base_seq, {t}.run_user_event AS user_event,
         NULL::bigint AS last_seq, NULL::text AS error, true AS sealed,
         {t}.run_resumes AS resumes, {t}.run_resume_log AS resume_log, {t}.run_usage AS usage,
         CASE WHEN {t}.run_key_run = {id} THEN {t}.run_key END AS key_id"
    )
}

/// What an `UPDATE sessions … SET active_run = NULL` that ends a run must return for
/// [`insert_ended`]: the run's facts as they were on the row.
pub(crate) const ENDING_RETURNING: &str = "sessions.app_name, sessions.user_id, \
     sessions.id AS session_id, sessions.run_invocation, sessions.run_owner, \
     sessions.run_cancel_requested, sessions.run_cancelled_by, sessions.run_cancel_reason, \
     sessions.run_created_at, sessions.run_base_seq, sessions.run_user_event, \
     sessions.run_webhooks, sessions.run_resumes, sessions.run_resume_log, sessions.run_usage, \
     sessions.run_key, sessions.run_key_run";

/// A CTE body inserting the ended run's one `runs` row from `from` (a CTE returning
/// [`ENDING_RETURNING`]): `id`, `status`, `last_seq`, `error` and `sealed` are SQL
/// expressions. It returns [`RUN_COLUMNS`] and `webhooks`, what the outbox CTE and the
/// caller read. Admission refuses a run id that a running or ended run has, but it cannot see
/// a run ending concurrently elsewhere with the same id; a row already there is kept, and the
/// session is freed all the same (a session never stays held by a run that cannot end).
pub(crate) fn insert_ended(
    from: &str,
    id: &str,
    status: &str,
    last_seq: &str,
    error: &str,
    sealed: &str,
) -> String {
    format!(
        "INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                           lease_expires_at, cancel_requested, cancelled_by, cancel_reason,
                           created_at, started_at, finished_at, base_seq, user_event, last_seq,
                           error, sealed, webhooks, resumes, resume_log, usage, key_id)
         SELECT {id}, f.app_name, f.user_id, f.session_id, f.run_invocation, {status},
                f.run_owner, 0, f.run_cancel_requested, f.run_cancelled_by,
                f.run_cancel_reason, f.run_created_at, f.run_created_at, {PG_NOW},
                f.run_base_seq, f.run_user_event, {last_seq}, {error}, {sealed}, f.run_webhooks,
                f.run_resumes, f.run_resume_log, f.run_usage,
                CASE WHEN f.run_key_run = {id} THEN f.run_key END
           FROM {from} f
         ON CONFLICT DO NOTHING
         RETURNING {RUN_COLUMNS}, webhooks"
    )
}

/// What the statement that ends a run writes besides its row, as CTEs following the CTE
/// `ended` ([`insert_ended`]'s): the webhook deliveries the outcome owes
/// ([`super::outbox::outbox_cte`]) and the run's usage added to the daily aggregates
/// ([`super::usage::spent_cte`]). Starts with `, `.
pub(crate) fn after_end(ended: &str) -> String {
    format!(
        "{}{}",
        super::outbox::outbox_cte(ended),
        super::usage::spent_cte(ended, true)
    )
}

/// [`after_end`] for a run no API key started: without the key's aggregates.
pub(crate) fn after_end_keyless(ended: &str) -> String {
    format!(
        "{}{}",
        super::outbox::outbox_cte(ended),
        super::usage::spent_cte(ended, false)
    )
}

/// One run asked for in both places: `runs_where` filters `runs`, `sessions_where` the
/// sessions (with `active_run IS NOT NULL` added). A run is in one place or the other in any
/// snapshot: the statement that ends it inserts its row and clears the session together.
pub(crate) fn union_sql(runs_where: &str, sessions_where: &str) -> String {
    format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE {runs_where}
         UNION ALL
         SELECT {running} FROM sessions s WHERE s.active_run IS NOT NULL AND {sessions_where}",
        running = running_columns("s.active_run", "s"),
    )
}
