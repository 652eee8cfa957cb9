//! Retention: deleting idle sessions (with their events, session artifacts, memory entries and
//! runs) and old finished runs, in small batches.
//!
//! Sessions are visited in primary-key order a page at a time, so no new index is needed on the
//! hot path and no statement holds many locks for long. Each page's deletions are one short
//! transaction, and a session is deleted only if it is still idle and no run owns it at that
//! moment (the DELETE re-checks both), so pruning never races a run.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::{SessionKey, StoreResult};
use async_trait::async_trait;
use serde::Serialize;
use sqlx::Row;

/// What a prune removed (or, in a dry run, would remove).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    pub sessions: u64,
    pub events: u64,
    pub artifacts: u64,
    pub memory_entries: u64,
    pub runs: u64,
    pub dry_run: bool,
}

/// What to prune.
#[derive(Debug, Clone)]
pub struct PruneRequest {
    /// Sessions whose last update is older than this (epoch seconds) are deleted.
    pub sessions_before: f64,
    /// Finished runs that ended before this are deleted (runs of deleted sessions go too).
    pub runs_before: f64,
    pub app: Option<String>,
    /// Sessions per transaction.
    pub batch: u32,
    pub dry_run: bool,
}

#[async_trait]
pub trait PruneStore: Send + Sync + 'static {
    /// One page of sessions after `after` (PK order) that are idle and free, at most `batch`;
    /// also returns the last key looked at (None at the end).
    async fn idle_sessions(
        &self,
        req: &PruneRequest,
        after: Option<&SessionKey>,
    ) -> StoreResult<(Vec<SessionKey>, Option<SessionKey>)>;

    /// Deletes `keys` (re-checking idle and free) with everything that belongs to them.
    async fn delete_sessions(
        &self,
        keys: &[SessionKey],
        req: &PruneRequest,
    ) -> StoreResult<PruneReport>;

    /// Deletes up to `batch` finished runs that ended before the cutoff; returns how many.
    async fn delete_old_runs(&self, req: &PruneRequest) -> StoreResult<u64>;

    /// Runs a whole prune in batches.
    async fn prune(&self, req: &PruneRequest) -> StoreResult<PruneReport> {
        let mut total = PruneReport {
            dry_run: req.dry_run,
            ..Default::default()
        };
        let mut after: Option<SessionKey> = None;
        loop {
            let (keys, last) = self.idle_sessions(req, after.as_ref()).await?;
            if !keys.is_empty() {
                let r = self.delete_sessions(&keys, req).await?;
                total.sessions += r.sessions;
                total.events += r.events;
                total.artifacts += r.artifacts;
                total.memory_entries += r.memory_entries;
                total.runs += r.runs;
            }
            match last {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        if !req.dry_run {
            loop {
                let n = self.delete_old_runs(req).await?;
                total.runs += n;
                if n < u64::from(req.batch) {
                    break;
                }
            }
        }
        Ok(total)
    }
}

/// The tables a session's rows live in, and the column that names the session.
const SESSION_TABLES: [(&str, &str); 5] = [
    ("events", "session_id"),
    ("artifacts", "session_id"),
    ("memory_entries", "session_id"),
    ("memory_sessions", "session_id"),
    ("runs", "session_id"),
];

#[async_trait]
impl PruneStore for PgStore {
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
            "SELECT app_name, user_id, id, update_time < $4 AND active_run IS NULL
                    AND ($5::text IS NULL OR app_name = $5) AS idle
               FROM sessions
              WHERE (app_name, user_id, id) > ($1, $2, $3)
              ORDER BY app_name, user_id, id
              LIMIT $6",
        )
        .bind(a)
        .bind(u)
        .bind(i)
        .bind(req.sessions_before)
        .bind(&req.app)
        .bind(i64::from(req.batch.max(1)))
        .fetch_all(self.pool())
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
        let mut tx = self.pool().begin().await?;
        for k in keys {
            // The session row first, re-checked: a run that started meanwhile keeps it.
            let gone = if req.dry_run {
                sqlx::query(
                    "SELECT 1 FROM sessions WHERE app_name = $1 AND user_id = $2 AND id = $3
                        AND update_time < $4 AND active_run IS NULL",
                )
                .bind(&k.app_name)
                .bind(&k.user_id)
                .bind(&k.session_id)
                .bind(req.sessions_before)
                .fetch_optional(&mut *tx)
                .await?
                .is_some()
            } else {
                sqlx::query(
                    "DELETE FROM sessions WHERE app_name = $1 AND user_id = $2 AND id = $3
                        AND update_time < $4 AND active_run IS NULL",
                )
                .bind(&k.app_name)
                .bind(&k.user_id)
                .bind(&k.session_id)
                .bind(req.sessions_before)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    > 0
            };
            if !gone {
                continue;
            }
            report.sessions += 1;
            for (table, column) in SESSION_TABLES {
                let verb = if req.dry_run {
                    "SELECT count(*) FROM"
                } else {
                    "DELETE FROM"
                };
                let sql = format!(
                    "{verb} {table} WHERE app_name = $1 AND user_id = $2 AND {column} = $3"
                );
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
        Ok(sqlx::query(
            "DELETE FROM runs WHERE id IN (
                 SELECT id FROM runs WHERE status <> 'running' AND finished_at < $1
                    AND ($2::text IS NULL OR app_name = $2)
                  LIMIT $3)",
        )
        .bind(req.runs_before)
        .bind(&req.app)
        .bind(i64::from(req.batch.max(1)))
        .execute(self.pool())
        .await?
        .rows_affected())
    }
}

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
            for (table, column) in SESSION_TABLES {
                let sql =
                    format!("{verb} {table} WHERE app_name = ? AND user_id = ? AND {column} = ?");
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
        Ok(sqlx::query(
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
        .rows_affected())
    }
}
