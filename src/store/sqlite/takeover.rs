//! Durable runs on SQLite (migration 0013): the runs nobody runs, the takeover that moves one
//! to this process (at a restart: SQLite has one process), the end of one that cannot be
//! resumed, and the release at a drain's commit boundary. Each is one write transaction.
//! A takeover never sets `runs.status`: the webhook trigger fires on the run's end only.

use super::runs::SQLITE_OWNER_DEAD;
use super::*;
use crate::store::runs::{record_sqlite, Orphan, ResumeReason, TakenOver, RUN_COLUMNS};

/// Whether `runs`' run may be taken by `?me` now (`?restart`: `?me` is a process that died and
/// started again); `?2` is now.
fn takeable(me: &str, restart: &str) -> String {
    format!(
        "(released_at IS NOT NULL
          OR (owner <> {me} AND {SQLITE_OWNER_DEAD})
          OR (owner = {me} AND {restart}))"
    )
}

impl SqliteStore {
    pub(super) async fn find_orphans(&self, me: &str, mine: bool) -> StoreResult<Vec<Orphan>> {
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS}, durable <> 0 AS is_durable,
                    released_at IS NOT NULL AS released, deadline - ?2 AS remaining
               FROM runs
              WHERE status = 'running'
                AND (released_at IS NOT NULL OR (owner <> ?1 AND {SQLITE_OWNER_DEAD})
                     OR (?3 AND owner = ?1))"
        ))
        .bind(me)
        .bind(now_ts())
        .bind(mine)
        .fetch_all(self.writer())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Orphan {
                    run: record_sqlite(r)?,
                    durable: r.try_get("is_durable")?,
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
        let now = now_ts();
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE runs
                SET owner = ?3, resumes = resumes + 1, released_at = NULL,
                    resume_log = json_insert(COALESCE(resume_log, '[]'), '$[#]',
                        json_object('from', owner, 'to', ?3, 'at', ?2, 'reason', ?4))
              WHERE id = ?1 AND status = 'running' AND resumes = ?5 AND durable
                AND {takeable}
             RETURNING {RUN_COLUMNS}, run_config, COALESCE(deadline - ?2, 0) AS remaining,
                       webhooks IS NOT NULL AS has_webhooks",
            takeable = takeable("?3", "?6"),
        ))
        .bind(&run.run_id)
        .bind(now)
        .bind(me)
        .bind(reason.as_str())
        .bind(run.resumes)
        .bind(restart)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let taken = record_sqlite(&row)?;
        let session_seq: i64 = sqlx::query_scalar(
            "SELECT last_seq FROM sessions WHERE app_name = ? AND user_id = ? AND id = ?",
        )
        .bind(&taken.app_name)
        .bind(&taken.user_id)
        .bind(&taken.session_id)
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or(0);
        tx.commit().await?;
        let config: Option<String> = row.try_get("run_config")?;
        Ok(Some(TakenOver {
            run: taken,
            config: config.map(|c| serde_json::from_str(&c)).transpose()?,
            remaining: row.try_get("remaining")?,
            session_seq,
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
        let now = now_ts();
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE runs SET status = ?4, finished_at = ?2, sealed = 0, error = ?5
              WHERE id = ?1 AND status = 'running' AND resumes = ?6 AND {takeable}
             RETURNING {RUN_COLUMNS}",
            takeable = takeable("?3", "?7"),
        ))
        .bind(&run.run_id)
        .bind(now)
        .bind(me)
        .bind(status.as_str())
        .bind(error)
        .bind(run.resumes)
        .bind(restart)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let ended = record_sqlite(&row)?;
        sqlx::query(
            "UPDATE sessions SET active_run = NULL
              WHERE app_name = ? AND user_id = ? AND id = ? AND active_run = ?",
        )
        .bind(&ended.app_name)
        .bind(&ended.user_id)
        .bind(&ended.session_id)
        .bind(&ended.run_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(ended))
    }

    pub(super) async fn release(&self, run_id: &str, epoch: i32, me: &str) -> StoreResult<bool> {
        let n = sqlx::query(
            "UPDATE runs SET released_at = ?4
              WHERE id = ?1 AND status = 'running' AND resumes = ?2 AND owner = ?3 AND durable
                AND released_at IS NULL AND NOT cancel_requested",
        )
        .bind(run_id)
        .bind(epoch)
        .bind(me)
        .bind(now_ts())
        .execute(self.writer())
        .await?
        .rows_affected();
        Ok(n > 0)
    }

    pub(super) async fn count_live_replicas(&self, me: &str) -> StoreResult<usize> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM replicas
              WHERE id <> ?1 AND NOT draining AND heartbeat_at > ?2 - lease_secs",
        )
        .bind(me)
        .bind(now_ts())
        .fetch_one(self.writer())
        .await?;
        Ok(n as usize)
    }
}
