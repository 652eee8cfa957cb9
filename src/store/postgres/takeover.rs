//! Durable runs on PostgreSQL (migration 0015): the runs nobody runs (their replica died, or
//! handed them over while draining), the takeover that moves one to this replica (the same
//! run and invocation, the next epoch), the end of one that cannot be resumed, and the
//! release at a drain's commit boundary. Every statement about one run names its user (one
//! shard on Citus); only the orphan read and the replica count read across users.

use super::run_record;
use super::runs::PG_OWNER_DEAD;
use super::*;
use crate::store::runs::{record_pg, Orphan, ResumeReason, TakenOver, RUN_COLUMNS};
use sqlx::types::Json;

/// Whether the run on a session row may be taken by `$me` now (`$restart`: `$me` is the id of
/// a process that died and started again, so a run it owned is nobody's).
fn takeable(me: &str, restart: &str) -> String {
    format!(
        "(run_released_at IS NOT NULL
          OR (run_owner <> {me} AND {PG_OWNER_DEAD})
          OR (run_owner = {me} AND {restart}))"
    )
}

/// Moves a durable run to this replica: the same run and invocation, the epoch one higher, the
/// move logged. No `runs` row, no webhook: the run goes on. Parameters: $1 run, $2 user, $3
/// me, $4 the owner the caller saw, $5 the epoch the caller saw, $6 restart, $7 now, $8 the
/// log entry (`[{from, to, at, reason}]`). Citus refuses a stable function beside a column in
/// an `UPDATE` (`jsonb_build_object(.., run_owner, ..)`, `statement_timestamp()` next to a
/// column), so the time and the entry come as values; the owner the entry names is checked.
pub static TAKE_OVER: std::sync::LazyLock<Routed> = std::sync::LazyLock::new(|| {
    Routed::new(format!(
        "UPDATE sessions
            SET run_owner = $3, run_resumes = run_resumes + 1, run_released_at = NULL,
                run_resume_log = COALESCE(run_resume_log, '[]'::jsonb) || $8::jsonb
          WHERE user_id = $2 AND active_run = $1 AND run_resumes = $5 AND run_owner = $4
            AND run_durable = active_run AND {takeable}
         RETURNING {running}, run_config,
                   COALESCE(run_deadline - $7::double precision, 0) AS remaining,
                   last_seq AS session_seq, run_webhooks IS NOT NULL AS has_webhooks",
        takeable = takeable("$3", "$6::boolean"),
        running = run_record::running_columns("sessions.active_run", "sessions"),
    ))
});

/// Ends a run nobody runs that is not to be resumed: its session freed, its `runs` row
/// written (unsealed: its transcript is sealed next) with its webhook deliveries, in one
/// statement. Parameters: $1 run, $2 user, $3 status, $4 error, $5 the epoch the caller saw,
/// $6 me, $7 restart.
pub static EXPIRE_AS: std::sync::LazyLock<Routed> = std::sync::LazyLock::new(|| {
    Routed::new(format!(
        "WITH s AS (
                 UPDATE sessions SET active_run = NULL
                  WHERE user_id = $2 AND active_run = $1 AND run_resumes = $5 AND {takeable}
                 RETURNING {ending}
             ), r AS ({insert}){outbox}
             SELECT {RUN_COLUMNS} FROM r",
        takeable = takeable("$6", "$7::boolean"),
        ending = run_record::ENDING_RETURNING,
        insert =
            run_record::insert_ended("s", "$1", "$3::text", "NULL::bigint", "$4::text", "false"),
        outbox = super::run_record::after_end("r")
    ))
});

/// A draining owner gives its run up at a commit boundary, for a live replica to take (unless
/// a cancel came first: the owner then ends it). Parameters: $1 run, $2 user, $3 epoch, $4 me.
pub const RELEASE_SQL: &str = "UPDATE sessions SET run_released_at = extract(epoch from statement_timestamp())::double precision
      WHERE user_id = $2 AND active_run = $1 AND run_resumes = $3 AND run_owner = $4
        AND run_durable = active_run AND run_released_at IS NULL AND NOT run_cancel_requested
     RETURNING 1";

impl PgStore {
    pub(super) async fn find_orphans(&self, me: &str, mine: bool) -> StoreResult<Vec<Orphan>> {
        // Read without a lock (across users: on Citus, across shards); each is then taken or
        // ended by a statement about that one run, which checks again.
        let rows = sqlx::query(&format!(
            "SELECT {running}, COALESCE(run_durable = active_run, false) AS durable,
                    run_released_at IS NOT NULL AS released, run_deadline - {PG_NOW} AS remaining
               FROM sessions
              WHERE active_run IS NOT NULL
                AND (run_released_at IS NOT NULL OR (run_owner <> $1 AND {PG_OWNER_DEAD})
                     OR ($2 AND run_owner = $1))",
            running = run_record::running_columns("sessions.active_run", "sessions"),
        ))
        .bind(me)
        .bind(mine)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Orphan {
                    run: record_pg(r)?,
                    durable: r.try_get("durable")?,
                    released: r.try_get("released")?,
                    remaining: r.try_get("remaining")?,
                })
            })
            .collect()
    }

    pub(super) async fn take_over_run(
        &self,
        run: &RunRecord,
        me: &str,
        reason: ResumeReason,
        restart: bool,
    ) -> StoreResult<Option<TakenOver>> {
        let now = crate::event::now_ts();
        let entry = serde_json::json!([{
            "from": run.owner, "to": me, "at": now, "reason": reason.as_str(),
        }]);
        let row = sqlx::query(TAKE_OVER.pick(self.citus))
            .bind(&run.run_id)
            .bind(&run.user_id)
            .bind(me)
            .bind(&run.owner)
            .bind(run.resumes)
            .bind(restart)
            .bind(now)
            .bind(Json(entry))
            .fetch_optional(self.pool())
            .await?;
        let Some(row) = row else { return Ok(None) };
        let config: Option<Json<serde_json::Value>> = row.try_get("run_config")?;
        Ok(Some(TakenOver {
            run: record_pg(&row)?,
            config: config.map(|c| c.0),
            remaining: row.try_get("remaining")?,
            session_seq: row.try_get("session_seq")?,
            has_webhooks: row.try_get("has_webhooks")?,
        }))
    }

    pub(super) async fn expire_run_as(
        &self,
        run: &RunRecord,
        me: &str,
        restart: bool,
        status: RunStatus,
        error: &str,
    ) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(EXPIRE_AS.pick(self.citus))
            .bind(&run.run_id)
            .bind(&run.user_id)
            .bind(status.as_str())
            .bind(error)
            .bind(run.resumes)
            .bind(me)
            .bind(restart)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(record_pg).transpose()
    }

    pub(super) async fn release(
        &self,
        user: &str,
        run_id: &str,
        epoch: i32,
        me: &str,
    ) -> StoreResult<bool> {
        Ok(sqlx::query(RELEASE_SQL)
            .bind(run_id)
            .bind(user)
            .bind(epoch)
            .bind(me)
            .fetch_optional(self.pool())
            .await?
            .is_some())
    }

    pub(super) async fn count_live_replicas(&self, me: &str) -> StoreResult<usize> {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM replicas
              WHERE id <> $1 AND NOT draining AND heartbeat_at > {PG_NOW} - lease_secs"
        ))
        .bind(me)
        .fetch_one(self.pool())
        .await?;
        Ok(n as usize)
    }
}
