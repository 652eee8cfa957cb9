//! Retention on SQLite (see [`crate::store::prune`]).

use super::*;

use crate::store::prune::SESSION_TABLES;

#[async_trait]
impl PruneStore for SqliteStore {
    async fn idle_sessions(
        &self,
        req: &PruneRequest,
        after: Option<&SessionKey>,
    ) -> StoreResult<(Vec<SessionKey>, Option<SessionKey>)> {
        let (a, u, i) = after.map_or(("", "", ""), |k| {
            (
                k.app_name.as_str(),
                k.user_id.as_str(),
                k.session_id.as_str(),
            )
        });
        let rows = sqlx::query(
            "SELECT app_name, user_id, id, (update_time < ?4 AND active_run IS NULL
                    AND (?5 IS NULL OR app_name = ?5)) AS idle
               FROM sessions
              WHERE (app_name, user_id, id) > (?1, ?2, ?3)
              ORDER BY app_name, user_id, id
              LIMIT ?6",
        )
        .bind(a)
        .bind(u)
        .bind(i)
        .bind(req.sessions_before)
        .bind(&req.app)
        .bind(i64::from(req.batch.max(1)))
        .fetch_all(&self.reader)
        .await?;
        let mut idle = vec![];
        let mut last = None;
        for r in &rows {
            let key = SessionKey::new(
                r.try_get::<String, _>(0)?,
                r.try_get::<String, _>(1)?,
                r.try_get::<String, _>(2)?,
            );
            if r.try_get::<bool, _>(3)? {
                idle.push(key.clone());
            }
            last = Some(key);
        }
        if rows.len() < req.batch.max(1) as usize {
            last = None;
        }
        Ok((idle, last))
    }

    async fn delete_sessions(
        &self,
        keys: &[SessionKey],
        req: &PruneRequest,
    ) -> StoreResult<PruneReport> {
        let mut report = PruneReport {
            dry_run: req.dry_run,
            ..Default::default()
        };
        let mut tx = self.begin().await?;
        for k in keys {
            let verb = if req.dry_run {
                "SELECT count(*) FROM"
            } else {
                "DELETE FROM"
            };
            let check = format!(
                "{verb} sessions WHERE app_name = ? AND user_id = ? AND id = ?
                    AND update_time < ? AND active_run IS NULL"
            );
            let q = sqlx::query(&check)
                .bind(&k.app_name)
                .bind(&k.user_id)
                .bind(&k.session_id)
                .bind(req.sessions_before);
            let gone = if req.dry_run {
                q.fetch_one(&mut *tx).await?.try_get::<i64, _>(0)? > 0
            } else {
                q.execute(&mut *tx).await?.rows_affected() > 0
            };
            if !gone {
                continue;
            }
            report.sessions += 1;
            for (table, rows) in SESSION_TABLES {
                // `$N` as on PostgreSQL: SQLite numbers them in order of first use, 1, 2, 3.
                let sql = format!("{verb} {table} WHERE app_name = $1 AND user_id = $2 AND {rows}");
                let q = sqlx::query(&sql)
                    .bind(&k.app_name)
                    .bind(&k.user_id)
                    .bind(&k.session_id);
                let n = if req.dry_run {
                    q.fetch_one(&mut *tx).await?.try_get::<i64, _>(0)? as u64
                } else {
                    q.execute(&mut *tx).await?.rows_affected()
                };
                match table {
                    "events" => report.events += n,
                    "artifacts" => report.artifacts += n,
                    "memory_entries" => report.memory_entries += n,
                    "runs" => report.runs += n,
                    _ => {}
                }
            }
        }
        if req.dry_run {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
        Ok(report)
    }

    async fn delete_old_runs(&self, req: &PruneRequest) -> StoreResult<u64> {
        let runs = sqlx::query(
            "DELETE FROM runs WHERE id IN (
                 SELECT id FROM runs WHERE status <> 'running' AND finished_at < ?1
                    AND (?2 IS NULL OR app_name = ?2)
                  LIMIT ?3)",
        )
        .bind(req.runs_before)
        .bind(&req.app)
        .bind(i64::from(req.batch.max(1)))
        .execute(self.writer())
        .await?
        .rows_affected();
        // Schedule ticks as old (their runs' webhook deliveries go with the runs: a trigger).
        sqlx::query(
            "DELETE FROM schedule_ticks WHERE (schedule_id, tick_time) IN (
                 SELECT schedule_id, tick_time FROM schedule_ticks
                  WHERE fired_at < ?1 AND status <> 'claimed'
                    AND (?2 IS NULL
                         OR schedule_id IN (SELECT id FROM schedules WHERE app_name = ?2))
                  LIMIT ?3)",
        )
        .bind(req.runs_before)
        .bind(&req.app)
        .bind(i64::from(req.batch.max(1)))
        .execute(self.writer())
        .await?;
        Ok(runs)
    }
}
