//! The statements of sessions and events on PostgreSQL ([`super::sessions`]): the append of
//! a complete event in its forms, creating a session, listing sessions, and reading events
//! and heads. Each says how it is planned; `tests/plans.rs` and `tests/citus/` check them.

use super::*;

/// The append of one complete event (see the module docs of [`super`]), in both forms
/// ([`Routed`]): parameters $1 app, $2 user, $3 session, then [`bind_event`]'s, then $12 the
/// run that must own the session (or NULL), $13 the dead run being sealed (or NULL), $14 the
/// epoch the run must own it at (its takeovers so far; NULL when $12 is), $15 the run's usage
/// so far (or NULL: unchanged).
pub static APPEND: std::sync::LazyLock<Routed> =
    std::sync::LazyLock::new(|| Routed::new(APPEND_ROUTED.to_string()));

const APPEND_ROUTED: &str = r#"
WITH s AS (
    UPDATE sessions
       SET state = state || $4::jsonb, update_time = $7,
           run_usage = CASE WHEN $12::text IS NULL THEN run_usage ELSE COALESCE($15::jsonb, run_usage) END,
           last_seq = last_seq + 1
     WHERE app_name = $1 AND user_id = $2 AND id = $3
       AND ($12::text IS NULL
            OR (active_run = $12 AND run_resumes = $14::integer AND run_released_at IS NULL))
       AND ($13::text IS NULL
            OR (active_run IS NULL AND EXISTS (SELECT 1 FROM runs r WHERE /*route*/ r.user_id = $2 AND r.id = $13 AND NOT r.sealed)))
 RETURNING last_seq
), a AS (
    INSERT INTO app_states AS t (app_name, state, update_time)
    SELECT $1, $5::jsonb, $7 FROM s WHERE $5::jsonb <> '{}'::jsonb
    ON CONFLICT (app_name) DO UPDATE
       SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time
), u AS (
    INSERT INTO user_states AS t (app_name, user_id, state, update_time)
    SELECT $1, $2, $6::jsonb, $7 FROM s WHERE $6::jsonb <> '{}'::jsonb
    ON CONFLICT (app_name, user_id) DO UPDATE
       SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time
)
INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author, "timestamp", event)
SELECT $1, $2, $3, s.last_seq, $8, $9, $10, $7, $11::jsonb FROM s
RETURNING seq
"#;

/// [`APPEND`] for [`Fence::RunEnd`]: the same append, fenced by the run (`$12`) not having
/// been asked to cancel, which also frees the session and writes the run's one `runs` row,
/// `completed` with the event's seq (see [`super::run_record`]). One statement, one synchronous commit: the reply and the
/// outcome are durable together. It locks only the session row, as every statement about a
/// running run does. This form also adds the run's usage to the daily aggregates: for a run
/// that spent something ($15 is its usage) and that an API key started (it adds to the key's
/// `usage_keys` row too; [`APPEND_END_KEYLESS`] is the form for a run without a key).
pub static APPEND_END: std::sync::LazyLock<Routed> =
    std::sync::LazyLock::new(|| append_end(super::run_record::after_end("r")));

/// [`APPEND_END`] for a run no API key started: the same statement without the key's
/// aggregates (`usage_keys`).
pub static APPEND_END_KEYLESS: std::sync::LazyLock<Routed> =
    std::sync::LazyLock::new(|| append_end(super::run_record::after_end_keyless("r")));

/// [`APPEND_END`] for a run that called no model ($15 NULL): the same statement without the
/// usage aggregates, so that it does not touch `usage_daily` at all. Every relation a
/// statement names costs a lock at each execution; past a backend's 16 fast-path slots those
/// go through the shared lock manager, which 32 concurrent runs measurably contend on
/// (docs/performance.md).
pub static APPEND_END_UNMETERED: std::sync::LazyLock<Routed> =
    std::sync::LazyLock::new(|| append_end(super::outbox::outbox_cte("r")));

fn append_end(after_end: String) -> Routed {
    let fence = "AND ($12::text IS NULL
            OR (active_run = $12 AND run_resumes = $14::integer AND run_released_at IS NULL))";
    let free = "last_seq = last_seq + 1\n";
    let finish = " RETURNING last_seq\n), a AS (";
    assert!([fence, free, finish]
        .iter()
        .all(|part| APPEND_ROUTED.contains(part)));
    let sql = APPEND_ROUTED
        .replacen(
            fence,
            "AND active_run = $12 AND run_resumes = $14::integer AND run_released_at IS NULL
       AND NOT run_cancel_requested",
            1,
        )
        .replacen(free, "last_seq = last_seq + 1, active_run = NULL\n", 1)
        .replacen(
            finish,
            &format!(
                " RETURNING last_seq, {ending}
), r AS ({insert}){outbox}, a AS (",
                ending = super::run_record::ENDING_RETURNING,
                insert = super::run_record::insert_ended(
                    "s",
                    "$12",
                    "'completed'",
                    "f.last_seq",
                    "NULL::text",
                    "true"
                ),
                outbox = after_end
            ),
            1,
        );
    Routed::new(sql)
}

/// Creating a session with no initial events and no `app:`/`user:` state (the usual case) is
/// one statement: insert the row, read back the head with the shared state. No conflict
/// means no row.
pub const CREATE_SQL: &str = r#"
WITH s AS (
    INSERT INTO sessions (app_name, user_id, id, state, initial_state, create_time, update_time,
                          last_seq)
    VALUES ($1, $2, $3, $4, NULLIF($4::jsonb, '{}'::jsonb), $5, $6, 0)
    ON CONFLICT DO NOTHING
    RETURNING state, update_time, last_seq
)
SELECT s.state, s.update_time, s.last_seq,
       COALESCE(a.state, '{}'::jsonb) AS app_state,
       COALESCE(u.state, '{}'::jsonb) AS user_state
  FROM s
  LEFT JOIN app_states a ON a.app_name = $1
  LEFT JOIN user_states u ON u.app_name = $1 AND u.user_id = $2
"#;

/// A user's sessions in ADK order, a page after a keyset cursor. It reaches the sessions only
/// through `sessions_by_owner_update_time`'s expression (see migration 0007), so no
/// primary-key lookup can be planned on that index and this query cannot be planned on the
/// primary key (then sorting every session of the user), statistics or not.
pub const LIST_SESSIONS_SQL: &str = r#"
SELECT s.id, s.state, s.update_time,
       COALESCE(a.state, '{}'::jsonb) AS app_state,
       COALESCE(u.state, '{}'::jsonb) AS user_state
  FROM sessions s
  LEFT JOIN app_states a ON a.app_name = s.app_name
  LEFT JOIN user_states u ON u.app_name = s.app_name AND u.user_id = s.user_id
 WHERE (s.app_name || E'\x1f' || s.user_id) = ($1 || E'\x1f' || $2)
   AND char_length(s.app_name) = char_length($1)
   AND s.user_id = $2
   AND ($3::double precision IS NULL OR (s.update_time, s.id) > ($3, $4))
   AND s.id NOT LIKE 'adk-eval-session-%' AND s.id NOT LIKE '\_\_\_eval\_\_\_session\_\_\_%'
 ORDER BY s.update_time, s.id
 LIMIT $5
"#;

/// A page of a session's events after a seq (history reads, listings, replays).
pub const EVENTS_AFTER_SQL: &str = r#"
SELECT seq, "timestamp", event FROM events
 WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND seq > $4
 ORDER BY seq LIMIT $5
"#;

/// One event by id (resolving an append whose commit was ambiguous).
pub const EVENT_BY_ID_SQL: &str = r#"
SELECT seq, "timestamp", event FROM events
 WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND id = $4
"#;

pub const HEAD_SQL: &str = r#"
SELECT s.state, s.update_time, s.last_seq,
       COALESCE(a.state, '{}'::jsonb) AS app_state,
       COALESCE(u.state, '{}'::jsonb) AS user_state
  FROM sessions s
  LEFT JOIN app_states a ON a.app_name = s.app_name
  LEFT JOIN user_states u ON u.app_name = s.app_name AND u.user_id = s.user_id
 WHERE s.app_name = $1 AND s.user_id = $2 AND s.id = $3
"#;
