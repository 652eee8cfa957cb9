//! Runs on SQLite: admission, ownership, liveness and outcomes (see [`crate::store::runs`]
//! for the rules), each a write transaction of the single writer.

use super::*;
use std::time::Duration;

use crate::store::runs::{record_sqlite, unique_violation, Opened, RUN_COLUMNS};
use crate::store::{Expired, Orphan, ResumeReason, TakenOver};

/// The invocation ids of a session's runs (every run has its row here, running or not).
const RUN_INVOCATIONS: &str =
    "SELECT invocation_id FROM runs WHERE app_name = $1 AND user_id = $2 AND session_id = $3";

/// SQLite's form of [`PG_OWNER_DEAD`]; `?2` is now.
pub(super) const SQLITE_OWNER_DEAD: &str = "runs.lease_expires_at < ?2
                                 AND NOT EXISTS (SELECT 1 FROM replicas p WHERE p.id = runs.owner
                                   AND p.heartbeat_at > ?2 - p.lease_secs)";

/// SQLite: one writer, so each multi-step change is one `BEGIN IMMEDIATE` transaction.
#[async_trait]
impl RunStore for SqliteStore {
    async fn run_invocations(&self, key: &SessionKey) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(RUN_INVOCATIONS)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .fetch_all(&self.reader)
            .await?)
    }

    async fn insert_run(&self, run: &NewRun, ticket: Option<i64>) -> StoreResult<Insert> {
        let now = now_ts();
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "SELECT last_seq, active_run FROM sessions WHERE app_name = ? AND user_id = ? AND id = ?",
        )
        .bind(&run.key.app_name)
        .bind(&run.key.user_id)
        .bind(&run.key.session_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(Insert::NoSession);
        };
        if row.try_get::<Option<String>, _>("active_run")?.is_some() {
            return Ok(Insert::Occupied);
        }
        let first: Option<i64> = sqlx::query_scalar(
            "SELECT min(q.ticket) FROM run_queue q
              WHERE q.app_name = ?1 AND q.user_id = ?2 AND q.session_id = ?3
                AND q.created_at > ?4 - ?5
                AND EXISTS (SELECT 1 FROM replicas r WHERE r.id = q.owner
                             AND r.heartbeat_at > ?4 - r.lease_secs)",
        )
        .bind(&run.key.app_name)
        .bind(&run.key.user_id)
        .bind(&run.key.session_id)
        .bind(now)
        .bind(run.queue_ttl.as_secs_f64())
        .fetch_one(&mut *tx)
        .await?;
        if first.is_some() && first != ticket {
            return Ok(Insert::Occupied);
        }
        let base_seq: i64 = row.try_get("last_seq")?;
        let durable = run.durable.as_ref();
        let inserted = sqlx::query(
            "INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                               lease_expires_at, created_at, started_at, base_seq, user_event,
                               webhooks, durable, run_config, deadline, key_id)
             VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, 0, ?7, ?7, ?8, ?9, ?10, ?11, ?12,
                     ?7 + ?13, ?14)",
        )
        .bind(&run.run_id)
        .bind(&run.key.app_name)
        .bind(&run.key.user_id)
        .bind(&run.key.session_id)
        .bind(&run.invocation_id)
        .bind(&run.owner)
        .bind(now)
        .bind(base_seq)
        .bind(run.user_event)
        .bind(&run.webhooks)
        .bind(durable.is_some())
        .bind(
            durable
                .and_then(|d| d.config.as_ref())
                .map(serde_json::Value::to_string),
        )
        .bind(durable.map(|d| d.max_secs))
        .bind(&run.api_key)
        .execute(&mut *tx)
        .await;
        match inserted {
            Err(e) if unique_violation(&e) => return Ok(Insert::Occupied),
            r => r?,
        };
        sqlx::query(
            "UPDATE sessions SET active_run = ? WHERE app_name = ? AND user_id = ? AND id = ?",
        )
        .bind(&run.run_id)
        .bind(&run.key.app_name)
        .bind(&run.key.user_id)
        .bind(&run.key.session_id)
        .execute(&mut *tx)
        .await?;
        let unsealed: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE app_name = ? AND user_id = ?
                               AND session_id = ? AND NOT sealed)",
        )
        .bind(&run.key.app_name)
        .bind(&run.key.user_id)
        .bind(&run.key.session_id)
        .fetch_one(&mut *tx)
        .await?;
        // The user event in the same transaction (one commit, one fsync, fewer), unless a dead
        // run's transcript must be sealed first.
        let opened = match &run.opening {
            Some(event) if !unsealed => {
                let fence = Fence::Run(&run.run_id, 0);
                // Stamped again now that this transaction holds the write lock: every event
                // committed before it was stamped earlier, so the transcript's times never go
                // backwards (the runner's stamp predates the wait for the lock).
                let mut event = event.clone();
                event.timestamp = event.timestamp.max(now_ts());
                let stored =
                    SqliteStore::append_in(&mut tx, &run.key, event, &[], fence, &self.limits)
                        .await?;
                let head = SqliteStore::head_with(&mut tx, &run.key).await?;
                Some(Box::new(Opened {
                    stored,
                    state: head.map(|h| h.state),
                }))
            }
            _ => None,
        };
        tx.commit().await?;
        Ok(Insert::Inserted {
            base_seq,
            unsealed,
            opened,
        })
    }

    async fn expire_run(&self, run: &RunRecord) -> StoreResult<Expired> {
        let run_id = run.run_id.as_str();
        let now = now_ts();
        let mut tx = self.begin().await?;
        let durable_dead: bool = sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE id = ?1 AND status = 'running' AND durable
                              AND {SQLITE_OWNER_DEAD})"
        ))
        .bind(run_id)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        if durable_dead {
            return Ok(Expired::Durable);
        }
        let dead = sqlx::query(&format!(
            "UPDATE runs SET status = 'abandoned', finished_at = ?2, sealed = 0,
                    error = 'its replica stopped heartbeating'
              WHERE id = ?1 AND status = 'running' AND NOT durable AND {SQLITE_OWNER_DEAD}"
        ))
        .bind(run_id)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        // Frees the session of a dead run, or one pointing at a run that no longer runs.
        let freed = sqlx::query(
            "UPDATE sessions SET active_run = NULL
              WHERE app_name = ?2 AND user_id = ?3 AND id = ?4 AND active_run = ?1
                AND NOT EXISTS (SELECT 1 FROM runs WHERE id = ?1 AND status = 'running')",
        )
        .bind(run_id)
        .bind(&run.app_name)
        .bind(&run.user_id)
        .bind(&run.session_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        tx.commit().await?;
        Ok(match dead || freed {
            true => Expired::Ended,
            false => Expired::Alive,
        })
    }

    async fn heartbeat(
        &self,
        replica: &str,
        lease: Duration,
        draining: bool,
        runs: bool,
    ) -> StoreResult<Vec<String>> {
        let now = now_ts();
        sqlx::query(
            "INSERT INTO replicas (id, heartbeat_at, lease_secs, started_at, draining)
             VALUES (?1, ?2, ?3, ?2, ?4)
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
                    lease_secs = excluded.lease_secs, draining = excluded.draining",
        )
        .bind(replica)
        .bind(now)
        .bind(lease.as_secs_f64())
        .bind(draining)
        .execute(self.writer())
        .await?;
        if !runs {
            return Ok(vec![]);
        }
        Ok(sqlx::query_scalar(
            "SELECT id FROM runs WHERE owner = ? AND status = 'running' AND cancel_requested",
        )
        .bind(replica)
        .fetch_all(&self.reader)
        .await?)
    }

    async fn owned_runs(&self, replica: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM runs WHERE owner = ? AND status = 'running' AND released_at IS NULL",
        )
        .bind(replica)
        .fetch_all(self.writer())
        .await?)
    }

    async fn retire_replica(&self, replica: &str) -> StoreResult<()> {
        // Its lease ends now (see the PostgreSQL store).
        sqlx::query("UPDATE replicas SET heartbeat_at = ?2 - lease_secs WHERE id = ?1")
            .bind(replica)
            .bind(now_ts())
            .execute(self.writer())
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
        _user: &str,
        run_id: &str,
        epoch: i32,
        me: &str,
    ) -> StoreResult<bool> {
        self.release(run_id, epoch, me).await
    }

    async fn live_replicas(&self, me: &str) -> StoreResult<usize> {
        self.count_live_replicas(me).await
    }

    async fn runs_may_be_orphaned(&self, within_secs: f64) -> StoreResult<bool> {
        let now = now_ts();
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM replicas
                             WHERE heartbeat_at + lease_secs >= ?1 - ?2
                               AND (draining OR heartbeat_at + lease_secs <= ?1))",
        )
        .bind(now)
        .bind(within_secs)
        .fetch_one(&self.reader)
        .await?)
    }

    async fn sweep_housekeeping(&self, me: &str) -> StoreResult<()> {
        let now = now_ts();
        let mut tx = self.begin().await?;
        sqlx::query("DELETE FROM run_queue WHERE created_at < ? - 3600")
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM replicas WHERE heartbeat_at < ?2 - 3600 AND id <> ?1")
            .bind(me)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn unsealed_runs(&self, key: &SessionKey) -> StoreResult<Vec<RunRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs
              WHERE app_name = ? AND user_id = ? AND session_id = ? AND NOT sealed
              ORDER BY created_at"
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_all(self.writer())
        .await?;
        rows.iter().map(record_sqlite).collect()
    }

    async fn mark_sealed(&self, user: &str, run_id: &str) -> StoreResult<()> {
        sqlx::query("UPDATE runs SET sealed = 1 WHERE user_id = ?2 AND id = ?1")
            .bind(run_id)
            .bind(user)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn finish_metered(
        &self,
        _user: &str,
        run_id: &str,
        epoch: i32,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
        usage: Option<&crate::usage::RunUsage>,
    ) -> StoreResult<bool> {
        let mut tx = self.begin().await?;
        // Before the outcome: the trigger that adds the run's usage to the aggregates reads
        // the row as the outcome's update leaves it (migration 0014).
        if let Some(usage) = usage {
            sqlx::query("UPDATE runs SET usage = ? WHERE id = ? AND status = 'running'")
                .bind(serde_json::to_string(usage)?)
                .bind(run_id)
                .execute(&mut *tx)
                .await?;
        }
        let done = Self::finish_in(&mut tx, run_id, epoch, status, last_seq, error).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn request_cancel(
        &self,
        user: &str,
        run_id: &str,
        req: &CancelRequest,
    ) -> StoreResult<Option<RunRecord>> {
        sqlx::query(
            "UPDATE runs SET cancel_requested = 1,
                    cancelled_by = COALESCE(cancelled_by, ?2),
                    cancel_reason = COALESCE(cancel_reason, ?3)
              WHERE user_id = ?4 AND id = ?1 AND status = 'running'",
        )
        .bind(run_id)
        .bind(&req.by)
        .bind(&req.reason)
        .bind(user)
        .execute(self.writer())
        .await?;
        self.get_user_run(user, run_id).await
    }

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"))
            .bind(run_id)
            .fetch_optional(self.writer())
            .await?;
        row.as_ref().map(record_sqlite).transpose()
    }

    async fn get_user_run(&self, user: &str, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE user_id = ?2 AND id = ?1"
        ))
        .bind(run_id)
        .bind(user)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(record_sqlite).transpose()
    }

    async fn list_runs(
        &self,
        app: &str,
        user: &str,
        status: Option<RunStatus>,
        before: Option<(f64, String)>,
        limit: u32,
    ) -> StoreResult<Vec<RunRecord>> {
        let (at, id) = before.unzip();
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs
              WHERE app_name = ?1 AND user_id = ?2
                AND (?3 IS NULL OR status = ?3)
                AND (?4 IS NULL OR created_at < ?4 OR (created_at = ?4 AND id < ?5))
              ORDER BY created_at DESC, id DESC
              LIMIT ?6"
        ))
        .bind(app)
        .bind(user)
        .bind(status.map(RunStatus::as_str))
        .bind(at)
        .bind(id)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(record_sqlite).collect()
    }

    async fn list_session_runs(
        &self,
        key: &SessionKey,
        before: Option<(f64, String)>,
        limit: u32,
    ) -> StoreResult<Vec<RunRecord>> {
        let (at, id) = before.unzip();
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs
              WHERE app_name = ?1 AND user_id = ?2 AND session_id = ?3
                AND (?4 IS NULL OR created_at < ?4 OR (created_at = ?4 AND id < ?5))
              ORDER BY created_at DESC, id DESC
              LIMIT ?6"
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(at)
        .bind(id)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(record_sqlite).collect()
    }

    async fn active_run(&self, key: &SessionKey) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs
              WHERE id = (SELECT active_run FROM sessions
                           WHERE app_name = ?1 AND user_id = ?2 AND id = ?3)
             UNION ALL
             SELECT {RUN_COLUMNS} FROM runs
              WHERE app_name = ?1 AND user_id = ?2 AND session_id = ?3 AND status = 'running'
             LIMIT 1"
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(record_sqlite).transpose()
    }

    async fn enqueue(&self, key: &SessionKey, owner: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(
            "INSERT INTO run_queue (app_name, user_id, session_id, owner, created_at)
             VALUES (?, ?, ?, ?, ?) RETURNING ticket",
        )
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(owner)
        .bind(now_ts())
        .fetch_one(self.writer())
        .await?)
    }

    async fn dequeue(&self, user: &str, ticket: i64) -> StoreResult<()> {
        sqlx::query("DELETE FROM run_queue WHERE user_id = ?2 AND ticket = ?1")
            .bind(ticket)
            .bind(user)
            .execute(self.writer())
            .await?;
        Ok(())
    }
}

impl SqliteStore {
    /// Records a run's outcome and frees its session, inside the writer's transaction `tx`
    /// (`finish_run`'s, or the append that carries the run's last event). False if the run
    /// was not running.
    pub(crate) async fn finish_in(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        run_id: &str,
        epoch: i32,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let key = sqlx::query(
            "UPDATE runs SET status = ?2, finished_at = ?3, last_seq = ?4, error = ?5
              WHERE id = ?1 AND status = 'running' AND resumes = ?6 AND released_at IS NULL
                AND NOT (?2 = 'completed' AND cancel_requested)
             RETURNING app_name, user_id, session_id",
        )
        .bind(run_id)
        .bind(status.as_str())
        .bind(now_ts())
        .bind(last_seq)
        .bind(error)
        .bind(epoch)
        .fetch_optional(&mut **tx)
        .await?;
        let done = key.is_some();
        if !done && status == RunStatus::Completed {
            // Refused for a cancel that came first, or the run no longer runs.
            let flagged: Option<bool> = sqlx::query_scalar(
                "SELECT cancel_requested FROM runs WHERE id = ?1 AND status = 'running'",
            )
            .bind(run_id)
            .fetch_optional(&mut **tx)
            .await?;
            if flagged == Some(true) {
                return Err(StoreError::CancelRequested);
            }
        }
        if let Some(k) = key {
            sqlx::query(
                "UPDATE sessions SET active_run = NULL
                  WHERE app_name = ? AND user_id = ? AND id = ? AND active_run = ?",
            )
            .bind(k.try_get::<String, _>(0)?)
            .bind(k.try_get::<String, _>(1)?)
            .bind(k.try_get::<String, _>(2)?)
            .bind(run_id)
            .execute(&mut **tx)
            .await?;
        }
        Ok(done)
    }
}
