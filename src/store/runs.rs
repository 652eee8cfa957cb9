//! Run admission records: at most one running run per session, as a database fact.
//!
//! `runs_one_active_per_session` (a partial unique index on `status = 'running'`) makes the
//! claim an atomic insert on every replica. A running row carries a lease that its owner
//! renews; a row whose lease ran out belongs to a process that died, is marked `abandoned`,
//! and the session is free again. Cancel requests are a flag on the row, so any replica can
//! cancel a run that another replica executes (the owner sees the flag when it renews).
//!
//! PostgreSQL computes lease times with its own clock, so replicas with skewed clocks agree.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::{SessionKey, StoreResult};
use crate::event::now_ts;
use async_trait::async_trait;
use serde::Serialize;
use sqlx::Row;
use std::time::Duration;

/// A run about to start.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: String,
    pub key: SessionKey,
    pub invocation_id: String,
    /// The replica that executes it (the lease holder).
    pub owner: String,
    pub lease: Duration,
}

/// How a run ended. `Abandoned`: its process died and the lease expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
    TimedOut,
    Abandoned,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::TimedOut => "timed_out",
            RunStatus::Abandoned => "abandoned",
        }
    }

    pub fn parse(s: &str) -> RunStatus {
        match s {
            "running" => RunStatus::Running,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            "timed_out" => RunStatus::TimedOut,
            _ => RunStatus::Abandoned,
        }
    }
}

/// A row of `runs`, as `GET /runs/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub run_id: String,
    pub app_name: String,
    pub user_id: String,
    pub session_id: String,
    pub invocation_id: String,
    pub status: RunStatus,
    #[serde(skip)]
    pub owner: String,
    #[serde(skip)]
    pub lease_expires_at: f64,
    pub cancel_requested: bool,
    pub created_at: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The result of trying to admit a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    Acquired,
    /// Another live run holds the session.
    Busy(Box<RunRecord>),
    /// The session does not exist (nothing was written).
    NoSession,
}

/// What one attempt to insert a running row did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    Inserted,
    /// The partial unique index refused it: a run is already `running` on the session.
    Occupied,
    NoSession,
}

/// What a lease renewal learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    Held {
        cancel_requested: bool,
    },
    /// The row is no longer ours and running (finished elsewhere, or taken over).
    Lost,
}

#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// Inserts the run as `running` if its session exists and has no running run. One statement.
    async fn insert_run(&self, run: &NewRun) -> StoreResult<Insert>;

    /// Marks the run `abandoned` if it is running with an expired lease. Returns whether it did.
    async fn expire_run(&self, run_id: &str) -> StoreResult<bool>;

    /// Admits `run`: inserts it as `running` unless another live run holds the session. A
    /// holder whose lease expired belongs to a dead process: it is marked `abandoned` and the
    /// claim is retried. One round trip when the session is free.
    async fn claim_run(&self, run: &NewRun) -> StoreResult<Claim> {
        for _ in 0..5 {
            match self.insert_run(run).await? {
                Insert::Inserted => return Ok(Claim::Acquired),
                Insert::NoSession => return Ok(Claim::NoSession),
                Insert::Occupied => {}
            }
            let Some(active) = self.active_run(&run.key).await? else {
                continue; // it finished in between: try again
            };
            if !self.expire_run(&active.run_id).await? {
                return Ok(Claim::Busy(Box::new(active)));
            }
            tracing::warn!(run = %active.run_id, owner = %active.owner, "took over a session whose run lease expired");
        }
        Err(super::StoreError::Conflict)
    }

    /// Extends the lease; tells whether a cancel was requested.
    async fn renew_run(&self, run_id: &str, owner: &str, lease: Duration) -> StoreResult<Lease>;
    /// Records the outcome and frees the session.
    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<()>;
    /// Flags a running run for cancellation. `None` if no such run.
    async fn request_cancel(&self, run_id: &str) -> StoreResult<Option<RunRecord>>;
    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>>;
    /// The running run of a session, if any.
    async fn active_run(&self, key: &SessionKey) -> StoreResult<Option<RunRecord>>;
}

const RUN_COLUMNS: &str =
    "id, app_name, user_id, session_id, invocation_id, status, owner, lease_expires_at, \
     cancel_requested, created_at, started_at, finished_at, last_seq, error";

/// Reads a `runs` row; the same code for both backends' row types.
macro_rules! run_record_reader {
    ($fn_name:ident, $row:ty) => {
        fn $fn_name(r: &$row) -> StoreResult<RunRecord> {
            Ok(RunRecord {
                run_id: r.try_get("id")?,
                app_name: r.try_get("app_name")?,
                user_id: r.try_get("user_id")?,
                session_id: r.try_get("session_id")?,
                invocation_id: r.try_get("invocation_id")?,
                status: RunStatus::parse(r.try_get::<&str, _>("status")?),
                owner: r.try_get("owner")?,
                lease_expires_at: r.try_get("lease_expires_at")?,
                cancel_requested: r.try_get("cancel_requested")?,
                created_at: r.try_get("created_at")?,
                started_at: r.try_get("started_at")?,
                finished_at: r.try_get("finished_at")?,
                last_seq: r.try_get("last_seq")?,
                error: r.try_get("error")?,
            })
        }
    };
}

run_record_reader!(record_pg, sqlx::postgres::PgRow);
run_record_reader!(record_sqlite, sqlx::sqlite::SqliteRow);

fn insert_outcome(session: bool, inserted: bool) -> Insert {
    match (session, inserted) {
        (_, true) => Insert::Inserted,
        (true, false) => Insert::Occupied,
        (false, false) => Insert::NoSession,
    }
}

/// PostgreSQL's clock, as epoch seconds.
const PG_NOW: &str = "extract(epoch from clock_timestamp())::double precision";

/// Makes the statement's own (implicit) transaction commit without waiting for its WAL to
/// reach disk (`SET LOCAL synchronous_commit = off`, inside the one statement, so it costs no
/// round trip). Used where losing the write in a database crash is harmless:
///
/// - Admission: the run id is revealed to no one until the run's user event is committed,
///   synchronously, right after it, and that flush covers the earlier admission record too
///   (WAL is flushed in order); every failure path ends in a synchronous `finish_run`. So no
///   client can act on an admission that a crash could undo; a crash before that flush simply
///   means the run never started.
/// - Lease renewals: losing one only moves the lease's expiry back to the previous renewal's,
///   which the owner renews again long before it runs out.
/// - Finishing a run: every event of the run is already durable (each was committed
///   synchronously before the client saw it). Losing the outcome record in a crash leaves
///   the row `running` until its lease expires, then the session is taken over as after any
///   crash (`abandoned`); no event is lost or duplicated.
///
/// Each saves a WAL flush wait (~0.7 ms here) per run (admission, finish) or per renewal.
const ASYNC_COMMIT: &str = "SELECT set_config('synchronous_commit', 'off', true)";

#[async_trait]
impl RunStore for PgStore {
    async fn insert_run(&self, run: &NewRun) -> StoreResult<Insert> {
        let row = sqlx::query(&format!(
            "WITH async_commit AS ({ASYNC_COMMIT}), s AS (
                 SELECT 1 FROM sessions WHERE app_name = $2 AND user_id = $3 AND id = $4
             ), ins AS (
                 INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                                   lease_expires_at, created_at, started_at)
                 SELECT $1, $2, $3, $4, $5, 'running', $6, {PG_NOW} + $7, {PG_NOW}, {PG_NOW} FROM s
                 ON CONFLICT DO NOTHING
                 RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM s) AS session, EXISTS (SELECT 1 FROM ins) AS inserted
               FROM async_commit"
        ))
        .bind(&run.run_id)
        .bind(&run.key.app_name)
        .bind(&run.key.user_id)
        .bind(&run.key.session_id)
        .bind(&run.invocation_id)
        .bind(&run.owner)
        .bind(run.lease.as_secs_f64())
        .fetch_one(self.pool())
        .await?;
        Ok(insert_outcome(
            row.try_get("session")?,
            row.try_get("inserted")?,
        ))
    }

    async fn expire_run(&self, run_id: &str) -> StoreResult<bool> {
        let expired = sqlx::query(&format!(
            "UPDATE runs SET status = 'abandoned', finished_at = {PG_NOW}, error = 'lease expired'
              WHERE id = $1 AND status = 'running' AND lease_expires_at < {PG_NOW}"
        ))
        .bind(run_id)
        .execute(self.pool())
        .await?;
        Ok(expired.rows_affected() > 0)
    }

    async fn renew_run(&self, run_id: &str, owner: &str, lease: Duration) -> StoreResult<Lease> {
        let row = sqlx::query(&format!(
            "WITH async_commit AS ({ASYNC_COMMIT})
             UPDATE runs SET lease_expires_at = {PG_NOW} + $3
               FROM async_commit
              WHERE id = $1 AND owner = $2 AND status = 'running'
             RETURNING cancel_requested"
        ))
        .bind(run_id)
        .bind(owner)
        .bind(lease.as_secs_f64())
        .fetch_optional(self.pool())
        .await?;
        Ok(match row {
            Some(r) => Lease::Held {
                cancel_requested: r.try_get(0)?,
            },
            None => Lease::Lost,
        })
    }

    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<()> {
        sqlx::query(&format!(
            "WITH async_commit AS ({ASYNC_COMMIT})
             UPDATE runs SET status = $2, finished_at = {PG_NOW}, last_seq = $3, error = $4
               FROM async_commit
              WHERE id = $1 AND status = 'running'"
        ))
        .bind(run_id)
        .bind(status.as_str())
        .bind(last_seq)
        .bind(error)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn request_cancel(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        sqlx::query("UPDATE runs SET cancel_requested = true WHERE id = $1 AND status = 'running'")
            .bind(run_id)
            .execute(self.pool())
            .await?;
        self.get_run(run_id).await
    }

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"))
            .bind(run_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(record_pg).transpose()
    }

    async fn active_run(&self, key: &SessionKey) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs
              WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND status = 'running'"
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(record_pg).transpose()
    }
}

#[async_trait]
impl RunStore for SqliteStore {
    async fn insert_run(&self, run: &NewRun) -> StoreResult<Insert> {
        let now = now_ts();
        // SQLite has no DML in CTEs; `WHERE EXISTS` does the session check in the same statement.
        let inserted = sqlx::query(
            "INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                               lease_expires_at, created_at, started_at)
             SELECT ?1, ?2, ?3, ?4, ?5, 'running', ?6, ?7, ?8, ?8
              WHERE EXISTS (SELECT 1 FROM sessions WHERE app_name = ?2 AND user_id = ?3 AND id = ?4)
             ON CONFLICT DO NOTHING",
        )
        .bind(&run.run_id)
        .bind(&run.key.app_name)
        .bind(&run.key.user_id)
        .bind(&run.key.session_id)
        .bind(&run.invocation_id)
        .bind(&run.owner)
        .bind(now + run.lease.as_secs_f64())
        .bind(now)
        .execute(self.writer())
        .await?
        .rows_affected()
            > 0;
        if inserted {
            return Ok(Insert::Inserted);
        }
        let session: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sessions WHERE app_name = ? AND user_id = ? AND id = ?)",
        )
        .bind(&run.key.app_name)
        .bind(&run.key.user_id)
        .bind(&run.key.session_id)
        .fetch_one(self.writer())
        .await?;
        Ok(insert_outcome(session, false))
    }

    async fn expire_run(&self, run_id: &str) -> StoreResult<bool> {
        let expired = sqlx::query(
            "UPDATE runs SET status = 'abandoned', finished_at = ?2, error = 'lease expired'
              WHERE id = ?1 AND status = 'running' AND lease_expires_at < ?2",
        )
        .bind(run_id)
        .bind(now_ts())
        .execute(self.writer())
        .await?;
        Ok(expired.rows_affected() > 0)
    }

    async fn renew_run(&self, run_id: &str, owner: &str, lease: Duration) -> StoreResult<Lease> {
        let row = sqlx::query(
            "UPDATE runs SET lease_expires_at = ?3
              WHERE id = ?1 AND owner = ?2 AND status = 'running'
             RETURNING cancel_requested",
        )
        .bind(run_id)
        .bind(owner)
        .bind(now_ts() + lease.as_secs_f64())
        .fetch_optional(self.writer())
        .await?;
        Ok(match row {
            Some(r) => Lease::Held {
                cancel_requested: r.try_get(0)?,
            },
            None => Lease::Lost,
        })
    }

    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE runs SET status = ?2, finished_at = ?3, last_seq = ?4, error = ?5
              WHERE id = ?1 AND status = 'running'",
        )
        .bind(run_id)
        .bind(status.as_str())
        .bind(now_ts())
        .bind(last_seq)
        .bind(error)
        .execute(self.writer())
        .await?;
        Ok(())
    }

    async fn request_cancel(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        sqlx::query("UPDATE runs SET cancel_requested = 1 WHERE id = ? AND status = 'running'")
            .bind(run_id)
            .execute(self.writer())
            .await?;
        self.get_run(run_id).await
    }

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"))
            .bind(run_id)
            .fetch_optional(self.writer())
            .await?;
        row.as_ref().map(record_sqlite).transpose()
    }

    async fn active_run(&self, key: &SessionKey) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs
              WHERE app_name = ? AND user_id = ? AND session_id = ? AND status = 'running'"
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(self.writer())
        .await?;
        row.as_ref().map(record_sqlite).transpose()
    }
}
