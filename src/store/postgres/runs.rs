//! Runs on PostgreSQL: admission, ownership, liveness and outcomes (see [`crate::store::runs`]
//! for the rules). Times come from PostgreSQL's clock, so replicas with skewed clocks agree.
//! Every statement about one run names its user (the distribution column on Citus), so it
//! touches one shard; only the liveness queries (`heartbeat`, `owned_runs`, `sweep`'s
//! candidates) read across users, and they lock nothing.

use super::*;
use std::time::Duration;

use super::run_record;
use crate::store::runs::{record_pg, Opened, RUN_COLUMNS};
use crate::store::{Expired, Orphan, ResumeReason, TakenOver};

/// A live ticket: its waiter's replica is heartbeating.
const PG_LIVE_TICKET: &str = "EXISTS (SELECT 1 FROM replicas r WHERE r.id = q.owner
                                AND r.heartbeat_at > extract(epoch from statement_timestamp())::double precision - r.lease_secs)";

/// The owner of the run on a session row (`sessions`) is dead: no fresh heartbeat.
pub(super) const PG_OWNER_DEAD: &str = "NOT EXISTS (SELECT 1 FROM replicas p WHERE p.id = sessions.run_owner
                               AND p.heartbeat_at > extract(epoch from statement_timestamp())::double precision - p.lease_secs)";

/// Admission on PostgreSQL (see [`RunStore::insert_run`]); public for the plan tests.
///
/// With a user event (`$10` true) the same statement commits it, fenced by construction (the
/// statement is what makes the run the owner), and reads back the run's starting state: the
/// session row's new state from the `UPDATE` (always its newest version: the row lock makes
/// a concurrent writer's commit visible to it) and the `app:`/`user:` state from the
/// statement's snapshot. That snapshot can be older than the newest session row in one case:
/// a write to the free session (an append outside any run, e.g. a sweeper sealing a dead
/// run's transcript) committed after the snapshot was taken, and this `UPDATE` waited for it.
/// (A run that is still active when the snapshot is taken makes the `UPDATE` skip the row:
/// admission then reports the session busy, it never waits for that run.) `snapshot_seq`
/// then differs from the session's `last_seq` before the event, and the runner reads the
/// state again rather than trust a stale one. Every write made through this session goes with
/// an append, which bumps `last_seq`, so the check misses none of those. (Another session's
/// concurrent write to the shared `app:`/`user:` state can land just before or just after any
/// read; that race is inherent in shared state and the same for every way of reading it.) The
/// user event is held back when a dead run awaits sealing (its transcript must come first).
///
/// Without a user event (a resume) admission alone commits asynchronously (`ASYNC_COMMIT`);
/// with one it is the user event's durable commit.
#[doc(hidden)]
pub fn pg_insert_run_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
        "WITH async_commit AS (
                 SELECT set_config('synchronous_commit',
                                   CASE WHEN $10 THEN current_setting('synchronous_commit') ELSE 'off' END,
                                   true)
             ), q AS (
                 SELECT min(q.ticket) AS first FROM run_queue q
                  WHERE q.app_name = $2 AND q.user_id = $3 AND q.session_id = $4 AND {PG_LIVE_TICKET}
                    AND q.created_at > {PG_NOW} - $9
             ), snap AS MATERIALIZED (
                 SELECT last_seq FROM sessions WHERE app_name = $2 AND user_id = $3 AND id = $4
             ), dead AS (
                 SELECT EXISTS (SELECT 1 FROM runs WHERE app_name = $2 AND user_id = $3
                                   AND session_id = $4 AND NOT sealed) AS unsealed,
                        EXISTS (SELECT 1 FROM runs WHERE user_id = $3 AND id = $1) AS taken
             ), s AS (
                 UPDATE sessions
                    SET active_run = $1, run_invocation = $5, run_owner = $6,
                        run_created_at = {PG_NOW}, run_base_seq = last_seq, run_user_event = $7,
                        run_webhooks = $19::jsonb, run_cancel_requested = false,
                        run_cancelled_by = NULL, run_cancel_reason = NULL,
                        run_durable = $20, run_config = $21::jsonb,
                        run_deadline = {PG_NOW} + $22::double precision, run_resumes = 0,
                        run_resume_log = NULL, run_released_at = NULL, run_usage = NULL,
                        run_key = $23, run_key_run = $1,
                        state = CASE WHEN o.with_event THEN state || $11::jsonb ELSE state END,
                        update_time = CASE WHEN o.with_event THEN GREATEST($14, update_time)
                                           ELSE update_time END,
                        last_seq = last_seq + CASE WHEN o.with_event THEN 1 ELSE 0 END
                   FROM (SELECT $10 AND NOT d.unsealed AS with_event, d.taken FROM dead d) o
                  WHERE app_name = $2 AND user_id = $3 AND id = $4 AND active_run IS NULL
                    AND NOT o.taken
                    AND ((SELECT first FROM q) IS NULL OR (SELECT first FROM q) = $8)
                 RETURNING sessions.last_seq, sessions.state, o.with_event,
                           sessions.update_time AS ts, sessions.run_base_seq AS base_seq
             ), a AS (
                 INSERT INTO app_states AS t (app_name, state, update_time)
                 SELECT $2, $12::jsonb, $14 FROM s WHERE s.with_event AND $12::jsonb <> '{{}}'::jsonb
                 ON CONFLICT (app_name) DO UPDATE
                    SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time
                 RETURNING t.state
             ), u AS (
                 INSERT INTO user_states AS t (app_name, user_id, state, update_time)
                 SELECT $2, $3, $13::jsonb, $14 FROM s WHERE s.with_event AND $13::jsonb <> '{{}}'::jsonb
                 ON CONFLICT (app_name, user_id) DO UPDATE
                    SET state = t.state || EXCLUDED.state, update_time = EXCLUDED.update_time
                 RETURNING t.state
             ), e AS (
                 INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author,
                                     \"timestamp\", event)
                 SELECT $2, $3, $4, s.last_seq, $15, $16, $17, s.ts,
                        jsonb_set($18::jsonb, '{{timestamp}}', to_jsonb(s.ts))
                   FROM s WHERE s.with_event
                 RETURNING seq, \"timestamp\"
             )
             SELECT EXISTS (SELECT 1 FROM sessions WHERE app_name = $2 AND user_id = $3 AND id = $4)
                        AS session,
                    (SELECT base_seq FROM s) AS base_seq,
                    d.unsealed,
                    d.taken,
                    (SELECT seq FROM e) AS seq,
                    (SELECT \"timestamp\" FROM e) AS ts,
                    (SELECT state FROM s) AS state,
                    (SELECT last_seq FROM snap) AS snapshot_seq,
                    COALESCE((SELECT state FROM a),
                             (SELECT state FROM app_states WHERE app_name = $2),
                             '{{}}'::jsonb) AS app_state,
                    COALESCE((SELECT state FROM u),
                             (SELECT state FROM user_states WHERE app_name = $2 AND user_id = $3),
                             '{{}}'::jsonb) AS user_state
               FROM dead d, async_commit"
        )
    });
    &SQL
}

/// A user's runs, newest first (`RunStore::list_runs`): the ended runs in `runs`
/// (`runs_by_owner_created`) and the running ones on their sessions
/// (`sessions_running_by_user`), each side ordered and limited on its own index, then merged;
/// a status filter reads only the side that can hold that status. The user's own qual on the
/// sessions side is for Citus only ([`Routed`]): on a plain PostgreSQL without statistics it
/// made the planner combine the index with the key's (every session of the user). A status filter and a cursor only where asked: a generic plan keeps `$n IS NULL OR
/// …` as a filter, so a deep page would scan every newer run of the user instead of starting
/// at the cursor. Parameters: $1 app, $2 user, then the status, the cursor's time and id when
/// present, then the limit. Public for the plan tests.
pub fn list_runs_sql(status: bool, cursor: bool) -> Routed {
    let mut n = 2;
    let mut next = || {
        n += 1;
        n
    };
    let (status_ended, status_running) = if status {
        let k = next();
        (
            format!("AND status = ${k} AND ${k} <> 'running'"),
            format!("AND ${k} = 'running'"),
        )
    } else {
        (String::new(), String::new())
    };
    let (cursor_ended, cursor_running) = if cursor {
        let (at, id) = (next(), next());
        (
            format!("AND (created_at, id) < (${at}, ${id})"),
            format!("AND (s.run_created_at, s.active_run) < (${at}, ${id})"),
        )
    } else {
        (String::new(), String::new())
    };
    let limit = next();
    let running = run_record::running_columns("s.active_run", "s");
    Routed::new(format!(
        "(SELECT {RUN_COLUMNS} FROM runs
           WHERE (app_name || E'\\x1f' || user_id) = ($1 || E'\\x1f' || $2)
             AND char_length(app_name) = char_length($1)
             AND user_id = $2
             {status_ended} {cursor_ended}
           ORDER BY created_at DESC, id DESC
           LIMIT ${limit})
         UNION ALL
         (SELECT {running} FROM sessions s
           WHERE (s.app_name || E'\\x1f' || s.user_id) = ($1 || E'\\x1f' || $2)
             AND char_length(s.app_name) = char_length($1)
             AND /*route*/ s.user_id = $2 AND s.active_run IS NOT NULL
             {status_running} {cursor_running}
           ORDER BY s.run_created_at DESC, s.active_run DESC
           LIMIT ${limit})
         ORDER BY created_at DESC, id DESC
         LIMIT ${limit}"
    ))
}

/// A session's runs, newest first (`RunStore::list_session_runs`): its ended runs on
/// `runs_by_session`, and its running run from the session row; the cursor only where asked,
/// as in [`list_runs_sql`]. Parameters: $1 app, $2 user, $3 session, then the cursor's time
/// and id when present, then the limit. Public for the plan tests.
pub fn list_session_runs_sql(cursor: bool) -> String {
    let (cursor_ended, cursor_running, limit) = if cursor {
        (
            "AND (created_at, id) < ($4, $5)",
            "AND (s.run_created_at, s.active_run) < ($4, $5)",
            "$6",
        )
    } else {
        ("", "", "$4")
    };
    let running = run_record::running_columns("s.active_run", "s");
    format!(
        "(SELECT {RUN_COLUMNS} FROM runs
           WHERE app_name = $1 AND user_id = $2 AND session_id = $3 {cursor_ended}
           ORDER BY created_at DESC, id DESC
           LIMIT {limit})
         UNION ALL
         SELECT {running} FROM sessions s
          WHERE s.app_name = $1 AND s.user_id = $2 AND s.id = $3 AND s.active_run IS NOT NULL
            {cursor_running}
         ORDER BY created_at DESC, id DESC
         LIMIT {limit}"
    )
}

/// A run's outcome, freeing its session, writing its one `runs` row and its webhook
/// deliveries (`RunStore::finish_run`). Parameters: $1 run, $2 status, $3 last seq, $4 error,
/// $5 user, $6 the epoch the run holds it at, $7 the run's usage if its commits have not
/// written all of it (or NULL).
pub static FINISH_RUN: std::sync::LazyLock<Routed> = std::sync::LazyLock::new(|| {
    Routed::new(format!(
        "WITH async_commit AS ({ASYNC_COMMIT}), s AS (
                 UPDATE sessions SET active_run = NULL,
                        run_usage = COALESCE($7::jsonb, run_usage)
                   FROM async_commit
                  WHERE user_id = $5 AND active_run = $1 AND run_resumes = $6
                    AND run_released_at IS NULL
                    AND ($2 <> 'completed' OR NOT run_cancel_requested)
                 RETURNING {ending}
             ), r AS ({insert}){outbox}
             SELECT count(*) FROM s",
        ending = run_record::ENDING_RETURNING,
        insert = run_record::insert_ended("s", "$1", "$2", "$3", "$4", "true"),
        outbox = run_record::after_end("r")
    ))
});

/// Whether running run `$1` of user `$2` was asked to cancel.
pub const CANCEL_FLAG_SQL: &str =
    "SELECT run_cancel_requested FROM sessions WHERE active_run = $1 AND user_id = $2";

/// Flags a running run for cancellation, on its session row, and reads it back
/// (`RunStore::request_cancel`; a run that is not running is read by the caller).
/// Parameters: $1 run, $2 by, $3 reason, $4 user.
pub static CANCEL_RUN: std::sync::LazyLock<Routed> = std::sync::LazyLock::new(|| {
    Routed::new(format!(
        "UPDATE sessions SET run_cancel_requested = true,
                run_cancelled_by = COALESCE(run_cancelled_by, $2),
                run_cancel_reason = COALESCE(run_cancel_reason, $3)
          WHERE user_id = $4 AND active_run = $1
         RETURNING {running}",
        running = run_record::running_columns("sessions.active_run", "sessions"),
    ))
});

/// A run found with its user (`RunStore::get_user_run`): ended, or running on its session.
/// Parameters: $1 run, $2 user.
pub static USER_RUN_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{} LIMIT 1",
        run_record::union_sql(
            "user_id = $2 AND id = $1",
            "s.user_id = $2 AND s.active_run = $1"
        )
    )
});

/// Abandons a run whose owner is dead and that is not durable (a durable one is taken over:
/// `super::takeover`): frees its session and writes its `runs` row, unsealed. Parameters:
/// $1 run, $2 user.
pub static EXPIRE_RUN: std::sync::LazyLock<Routed> = std::sync::LazyLock::new(|| {
    Routed::new(format!(
        "WITH s AS (
                 UPDATE sessions SET active_run = NULL
                  WHERE user_id = $2 AND active_run = $1 AND {PG_OWNER_DEAD}
                    AND run_durable IS DISTINCT FROM active_run
                 RETURNING {ending}
             ), r AS ({insert}){outbox}
             SELECT {RUN_COLUMNS} FROM r",
        ending = run_record::ENDING_RETURNING,
        insert = run_record::insert_ended(
            "s",
            "$1",
            "'abandoned'",
            "NULL::bigint",
            "'its replica stopped heartbeating'",
            "false"
        ),
        outbox = run_record::after_end("r")
    ))
});

/// The run that owns a session (`RunStore::active_run`), from the session row. Parameters:
/// $1 app, $2 user, $3 session.
pub static ACTIVE_RUN_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM sessions s
          WHERE s.app_name = $1 AND s.user_id = $2 AND s.id = $3 AND s.active_run IS NOT NULL",
        run_record::running_columns("s.active_run", "s")
    )
});

/// The invocation ids of a session's runs, ended and running (`RunStore::run_invocations`).
pub const RUN_INVOCATIONS_SQL: &str = "SELECT invocation_id FROM runs
      WHERE app_name = $1 AND user_id = $2 AND session_id = $3
     UNION ALL
     SELECT run_invocation FROM sessions
      WHERE app_name = $1 AND user_id = $2 AND id = $3 AND active_run IS NOT NULL";

/// A place in a session's queue (`RunStore::enqueue`). Parameters: $1 app, $2 user, $3
/// session, $4 the waiter's replica.
pub static ENQUEUE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO run_queue (app_name, user_id, session_id, owner, created_at)
         VALUES ($1, $2, $3, $4, {PG_NOW}) RETURNING ticket"
    )
});

/// Leaves the queue. Parameters: $1 ticket, $2 user.
pub const DEQUEUE_SQL: &str = "DELETE FROM run_queue WHERE user_id = $2 AND ticket = $1";

#[async_trait]
impl RunStore for PgStore {
    async fn run_invocations(&self, key: &SessionKey) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(RUN_INVOCATIONS_SQL)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .fetch_all(self.pool())
            .await?)
    }

    async fn insert_run(&self, run: &NewRun, ticket: Option<i64>) -> StoreResult<Insert> {
        let opening = match run.opening.clone() {
            Some(mut e) => {
                crate::store::prepare_event(&mut e, &self.limits)?;
                Some(e)
            }
            None => None,
        };
        let split = opening
            .as_ref()
            .map(|e| SplitState::split(&e.actions.state_delta))
            .unwrap_or_default();
        let empty = Event::new("", "");
        let event = opening.as_ref().unwrap_or(&empty);
        // On Citus, one routed call (unless the user event writes `app:` state: `router.sql`).
        let sql = match self.routed() && split.app.is_empty() {
            true => super::router::ADMIT_CALL,
            false => pg_insert_run_sql(),
        };
        let q = sqlx::query(sql)
            .bind(&run.run_id)
            .bind(&run.key.app_name)
            .bind(&run.key.user_id)
            .bind(&run.key.session_id)
            .bind(&run.invocation_id)
            .bind(&run.owner)
            .bind(run.user_event)
            .bind(ticket)
            .bind(run.queue_ttl.as_secs_f64())
            .bind(opening.is_some());
        let durable = run.durable.as_ref();
        let row = bind_event(q, event, &split)
            .bind(&run.webhooks)
            .bind(durable.map(|_| run.run_id.as_str()))
            .bind(durable.and_then(|d| d.config.clone()))
            .bind(durable.map(|d| d.max_secs))
            .bind(&run.api_key)
            .fetch_one(self.pool())
            .await;
        let row = match row {
            // Another session's running run has this id (`sessions_running` is unique).
            Err(sqlx::Error::Database(db)) if violates(db.as_ref(), "sessions_running") => {
                return Err(StoreError::Conflict)
            }
            // The connection broke with the statement sent: it committed whole or not at all.
            // With a user event, its id tells which (as for an append); without one, the
            // admission alone is ambiguous as before and reconciliation repairs a stray one.
            Err(e) => {
                let e = StoreError::from(e);
                if let (true, Some(event)) = (e.is_unavailable(), &opening) {
                    if let Some(stored) = self.resolve_by_id(&run.key, &event.id).await? {
                        if stored.event.invocation_id == event.invocation_id {
                            tracing::warn!(run = %run.run_id, error = %e, "admission's outcome was unknown; its user event is stored, so it committed");
                            return Ok(Insert::Inserted {
                                base_seq: stored.seq - 1,
                                unsealed: false,
                                opened: Some(Box::new(Opened {
                                    stored,
                                    state: None,
                                })),
                            });
                        }
                    }
                }
                return Err(e);
            }
            Ok(row) => row,
        };
        // An ended run has this id: a run id names one run, ever (a schedule's re-fired tick,
        // an MCP request id used twice).
        if row.try_get::<bool, _>("taken")? {
            return Err(StoreError::Conflict);
        }
        let session: bool = row.try_get("session")?;
        let base_seq: Option<i64> = row.try_get("base_seq")?;
        let unsealed: bool = row.try_get("unsealed")?;
        let Some(base_seq) = base_seq else {
            return Ok(if session {
                Insert::Occupied
            } else {
                Insert::NoSession
            });
        };
        let seq: Option<i64> = row.try_get("seq")?;
        let ts: Option<f64> = row.try_get("ts")?;
        let opened = match (opening, seq) {
            (Some(mut event), Some(seq)) => {
                // The statement stamps it no earlier than the session's last write (it may have
                // waited for that write's row lock after the runner stamped it).
                if let Some(ts) = ts {
                    event.timestamp = ts;
                }
                let snapshot_seq: Option<i64> = row.try_get("snapshot_seq")?;
                let state = if snapshot_seq == Some(seq - 1) {
                    let Json(session): Json<JsonMap> = row.try_get("state")?;
                    let Json(app): Json<JsonMap> = row.try_get("app_state")?;
                    let Json(user): Json<JsonMap> = row.try_get("user_state")?;
                    Some(SplitState::merge(session, app, user))
                } else {
                    None
                };
                Some(Box::new(Opened {
                    stored: StoredEvent { seq, event },
                    state,
                }))
            }
            _ => None,
        };
        Ok(Insert::Inserted {
            base_seq,
            unsealed,
            opened,
        })
    }

    async fn expire_run(&self, run: &RunRecord) -> StoreResult<Expired> {
        if self.expire(run).await?.is_some() {
            return Ok(Expired::Ended);
        }
        let durable_dead: Option<bool> = sqlx::query_scalar(&format!(
            "SELECT run_durable = active_run AND {PG_OWNER_DEAD} FROM sessions
              WHERE user_id = $2 AND active_run = $1"
        ))
        .bind(&run.run_id)
        .bind(&run.user_id)
        .fetch_optional(self.pool())
        .await?
        .flatten();
        Ok(match durable_dead {
            Some(true) => Expired::Durable,
            _ => Expired::Alive,
        })
    }

    async fn heartbeat(
        &self,
        replica: &str,
        lease: Duration,
        draining: bool,
        runs: bool,
    ) -> StoreResult<Vec<String>> {
        // The cancel requests are read only with runs going: the read spans every user's
        // sessions (on Citus, every shard), and an idle replica has nothing to cancel.
        let cancels = match runs {
            true => {
                "SELECT active_run FROM sessions
                      WHERE active_run IS NOT NULL AND run_owner = $1 AND run_cancel_requested"
            }
            false => "SELECT NULL::text FROM h WHERE false",
        };
        let rows = sqlx::query(&format!(
            "WITH async_commit AS ({ASYNC_COMMIT}), h AS (
                 INSERT INTO replicas (id, heartbeat_at, lease_secs, started_at, draining)
                 SELECT $1, {PG_NOW}, $2, {PG_NOW}, $3 FROM async_commit
                 ON CONFLICT (id) DO UPDATE
                    SET heartbeat_at = EXCLUDED.heartbeat_at, lease_secs = EXCLUDED.lease_secs,
                        draining = EXCLUDED.draining
                 RETURNING 1
             )
             {cancels}"
        ))
        .bind(replica)
        .bind(lease.as_secs_f64())
        .bind(draining)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(StoreError::from))
            .collect()
    }

    async fn owned_runs(&self, replica: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT active_run FROM sessions
              WHERE active_run IS NOT NULL AND run_owner = $1 AND run_released_at IS NULL",
        )
        .bind(replica)
        .fetch_all(self.pool())
        .await?)
    }

    async fn retire_replica(&self, replica: &str) -> StoreResult<()> {
        // Its lease ends now: dead to every check, and a replica that just retired (its
        // runs handed over) is what `runs_may_be_orphaned` looks for.
        sqlx::query(&format!(
            "UPDATE replicas SET heartbeat_at = {PG_NOW} - lease_secs WHERE id = $1"
        ))
        .bind(replica)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn orphans(&self, me: &str, mine: bool) -> StoreResult<Vec<Orphan>> {
        self.find_orphans(me, mine).await
    }

    async fn take_over(
        &self,
        run: &RunRecord,
        me: &str,
        reason: ResumeReason,
        restart: bool,
    ) -> StoreResult<Option<TakenOver>> {
        self.take_over_run(run, me, reason, restart).await
    }

    async fn expire_as(
        &self,
        run: &RunRecord,
        me: &str,
        restart: bool,
        status: RunStatus,
        error: &str,
    ) -> StoreResult<Option<RunRecord>> {
        self.expire_run_as(run, me, restart, status, error).await
    }

    async fn release_run(
        &self,
        user: &str,
        run_id: &str,
        epoch: i32,
        me: &str,
    ) -> StoreResult<bool> {
        self.release(user, run_id, epoch, me).await
    }

    async fn live_replicas(&self, me: &str) -> StoreResult<usize> {
        self.count_live_replicas(me).await
    }

    async fn runs_may_be_orphaned(&self, within_secs: f64) -> StoreResult<bool> {
        Ok(sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM replicas
                             WHERE heartbeat_at + lease_secs >= {PG_NOW} - $1
                               AND (draining OR heartbeat_at + lease_secs <= {PG_NOW}))"
        ))
        .bind(within_secs)
        .fetch_one(self.pool())
        .await?)
    }

    async fn sweep_housekeeping(&self, me: &str) -> StoreResult<()> {
        // Tickets whose waiters are long gone; replicas gone for an hour (their runs were
        // swept long ago).
        sqlx::query(&format!(
            "DELETE FROM run_queue WHERE created_at < {PG_NOW} - 3600"
        ))
        .execute(self.pool())
        .await?;
        sqlx::query(&format!(
            "DELETE FROM replicas WHERE heartbeat_at < {PG_NOW} - 3600 AND id <> $1"
        ))
        .bind(me)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn unsealed_runs(&self, key: &SessionKey) -> StoreResult<Vec<RunRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs
              WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND NOT sealed
              ORDER BY created_at"
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(record_pg).collect()
    }

    async fn mark_sealed(&self, user: &str, run_id: &str) -> StoreResult<()> {
        sqlx::query("UPDATE runs SET sealed = true WHERE user_id = $2 AND id = $1")
            .bind(run_id)
            .bind(user)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn finish_metered(
        &self,
        user: &str,
        run_id: &str,
        epoch: i32,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
        usage: Option<&crate::usage::RunUsage>,
    ) -> StoreResult<bool> {
        let sql = match self.routed() {
            true => super::router::FINISH_CALL,
            false => FINISH_RUN.pick(self.citus),
        };
        let n: i64 = sqlx::query_scalar(sql)
            .bind(run_id)
            .bind(status.as_str())
            .bind(last_seq)
            .bind(error)
            .bind(user)
            .bind(epoch)
            .bind(usage.map(Json))
            .fetch_one(self.pool())
            .await?;
        if n == 0 && status == RunStatus::Completed {
            // Refused for a cancel that came first, or the run no longer owns its session.
            let flagged: Option<bool> = sqlx::query_scalar(CANCEL_FLAG_SQL)
                .bind(run_id)
                .bind(user)
                .fetch_optional(self.pool())
                .await?;
            if flagged == Some(true) {
                return Err(StoreError::CancelRequested);
            }
        }
        Ok(n > 0)
    }

    async fn request_cancel(
        &self,
        user: &str,
        run_id: &str,
        req: &CancelRequest,
    ) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(CANCEL_RUN.pick(self.citus))
            .bind(run_id)
            .bind(&req.by)
            .bind(&req.reason)
            .bind(user)
            .fetch_optional(self.pool())
            .await?;
        match row {
            Some(row) => Ok(Some(record_pg(&row)?)),
            // Not running: read it as it is now (a run that ended while the UPDATE waited
            // for its session row is in `runs` only for a newer snapshot than that one).
            None => self.get_user_run(user, run_id).await,
        }
    }

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        // By id alone every shard is asked on Citus, where the two tables' shards are read
        // in separate snapshots: a run ending in between could be missed by a union. Asked
        // in this order, a run that has left its session is in `runs` for the second read.
        let running = sqlx::query(&format!(
            "SELECT {} FROM sessions s WHERE s.active_run = $1",
            run_record::running_columns("s.active_run", "s")
        ))
        .bind(run_id)
        .fetch_optional(self.pool())
        .await?;
        if let Some(row) = running {
            return Ok(Some(record_pg(&row)?));
        }
        let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"))
            .bind(run_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(record_pg).transpose()
    }

    async fn get_user_run(&self, user: &str, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&USER_RUN_SQL)
            .bind(run_id)
            .bind(user)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(record_pg).transpose()
    }

    async fn list_runs(
        &self,
        app: &str,
        user: &str,
        status: Option<RunStatus>,
        before: Option<(f64, String)>,
        limit: u32,
    ) -> StoreResult<Vec<RunRecord>> {
        let sql = list_runs_sql(status.is_some(), before.is_some());
        let mut q = sqlx::query(sql.pick(self.citus)).bind(app).bind(user);
        if let Some(status) = status {
            q = q.bind(status.as_str());
        }
        if let Some((at, id)) = before {
            q = q.bind(at).bind(id);
        }
        let rows = q.bind(i64::from(limit)).fetch_all(self.pool()).await?;
        rows.iter().map(record_pg).collect()
    }

    async fn list_session_runs(
        &self,
        key: &SessionKey,
        before: Option<(f64, String)>,
        limit: u32,
    ) -> StoreResult<Vec<RunRecord>> {
        let sql = list_session_runs_sql(before.is_some());
        let mut q = sqlx::query(&sql)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id);
        if let Some((at, id)) = before {
            q = q.bind(at).bind(id);
        }
        let rows = q.bind(i64::from(limit)).fetch_all(self.pool()).await?;
        rows.iter().map(record_pg).collect()
    }

    async fn active_run(&self, key: &SessionKey) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&ACTIVE_RUN_SQL)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(record_pg).transpose()
    }

    async fn enqueue(&self, key: &SessionKey, owner: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(&ENQUEUE_SQL)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .bind(owner)
            .fetch_one(self.pool())
            .await?)
    }

    async fn dequeue(&self, user: &str, ticket: i64) -> StoreResult<()> {
        sqlx::query(DEQUEUE_SQL)
            .bind(ticket)
            .bind(user)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

impl PgStore {
    /// Marks `run` abandoned (unsealed) and frees its session, if it is still running and its
    /// owner is dead; returns the run as it is now. One statement about one run (one shard).
    async fn expire(&self, run: &RunRecord) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(EXPIRE_RUN.pick(self.citus))
            .bind(&run.run_id)
            .bind(&run.user_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(record_pg).transpose()
    }
}
