//! Run admission and ownership, as database facts.
//!
//! - **One run per session**: admission sets `sessions.active_run` only where it is NULL (and
//!   inserts the `runs` row in the same statement); the partial unique index on running runs
//!   stays as a second guard. Every append on behalf of a run is fenced by `active_run` in the
//!   statement that assigns its seq (see [`super::Fence`]).
//! - **Liveness per replica**: each process writes one heartbeat row every lease/3; a run is
//!   alive while its owner's heartbeat is younger than the owner's lease. No per-run writes
//!   while a run is healthy.
//! - **Dead runs**: a run whose owner stopped heartbeating is marked `abandoned` (by the next
//!   admission on its session, or by any replica's sweeper) and its session freed in the same
//!   statement; it is left `sealed = false` until its transcript has been sealed.
//! - **Cancel** is a flag plus who/why on the row (the first request's values are kept); the
//!   owner hears of it through the notification bus at once, or on its next heartbeat.
//! - **First come, first served**: `onBusy: enqueue` takes a ticket in `run_queue`; admission of
//!   a session with live tickets goes to the smallest one only.
//!
//! PostgreSQL computes times with its own clock, so replicas with skewed clocks agree.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::{SessionKey, StoreError, StoreResult, StoredEvent};
use crate::event::{now_ts, Event, JsonMap, SplitState};
use async_trait::async_trait;
use serde::Serialize;
use sqlx::types::Json;
use sqlx::Row;
use std::time::Duration;

/// A run about to start.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: String,
    pub key: SessionKey,
    pub invocation_id: String,
    /// The replica that executes it.
    pub owner: String,
    /// The run's first event will be the user's message.
    pub user_event: bool,
    /// A queue ticket older than this no longer counts (its waiter gave up long ago, but the
    /// ticket could not be removed: a database error, a crash between insert and use).
    pub queue_ttl: Duration,
    /// The user event, committed by admission itself (PostgreSQL: admission, the user event
    /// and the run's starting state are one statement and one durable commit, see
    /// [`pg_insert_run_sql`]; SQLite: one transaction). It is committed there only if the
    /// session has no dead run to seal first; otherwise the runner appends it after admission.
    /// An event with staged artifacts is never passed here.
    pub opening: Option<Event>,
}

/// The user event committed by admission, with the session's merged state after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Opened {
    pub stored: StoredEvent,
    /// `None` when the admission statement's snapshot predates a write to the session that it
    /// then waited for (see [`pg_insert_run_sql`]): its reading of the shared `app:`/`user:`
    /// state may miss that write, so the runner reads the state again.
    pub state: Option<JsonMap>,
}

/// How a run ended. `Abandoned`: its process died (stopped heartbeating). `Interrupted`: the
/// replica was shut down (drained) before the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
    TimedOut,
    Interrupted,
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
            RunStatus::Interrupted => "interrupted",
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
            "interrupted" => RunStatus::Interrupted,
            _ => RunStatus::Abandoned,
        }
    }
}

/// A row of `runs`, as `GET /runs/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub run_id: String,
    pub app_name: String,
    pub user_id: String,
    pub session_id: String,
    pub invocation_id: String,
    pub status: RunStatus,
    /// The replica that executes (or executed) the run.
    pub owner: String,
    pub cancel_requested: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    pub created_at: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<f64>,
    /// The session's last seq before the run: its events have larger seqs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_seq: Option<i64>,
    #[serde(skip)]
    pub user_event: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip)]
    pub sealed: bool,
}

impl RunRecord {
    pub fn key(&self) -> SessionKey {
        SessionKey::new(&self.app_name, &self.user_id, &self.session_id)
    }
}

/// The result of trying to admit a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The run owns the session; its events come after `base_seq`. `unsealed`: a dead run of
    /// the session still needs its transcript sealed (the new run does it first).
    Acquired {
        base_seq: i64,
        unsealed: bool,
        /// The user event, if admission committed it (see [`NewRun::opening`]).
        opened: Option<Box<Opened>>,
    },
    /// Another live run holds the session (`None`: earlier queued requests come first).
    Busy(Option<Box<RunRecord>>),
    /// The session does not exist (nothing was written).
    NoSession,
}

/// What one attempt to take a session did.
#[derive(Debug, Clone, PartialEq)]
pub enum Insert {
    Inserted {
        base_seq: i64,
        unsealed: bool,
        opened: Option<Box<Opened>>,
    },
    /// A run holds the session, or an earlier ticket waits for it.
    Occupied,
    NoSession,
}

/// Why a run is cancelled, and by whom (kept on the row; the first request wins).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CancelRequest {
    pub by: Option<String>,
    pub reason: Option<String>,
}

/// Same SQL on both backends (SQLite binds `$N` by position).
pub const RUN_INVOCATIONS: &str =
    "SELECT invocation_id FROM runs WHERE app_name = $1 AND user_id = $2 AND session_id = $3";

#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// The invocation ids of the session's runs on this server. Events a client imported with
    /// create-session carry other ids: their tool calls are never executed by `resume`.
    async fn run_invocations(&self, key: &SessionKey) -> StoreResult<Vec<String>>;

    /// Makes `run` the session's owner and inserts it as `running`, if the session exists, has
    /// no active run, and no earlier live ticket waits for it (`ticket`: the caller's own).
    /// One statement (SQLite: one transaction) that also commits `run.opening` (see
    /// [`NewRun::opening`]).
    async fn insert_run(&self, run: &NewRun, ticket: Option<i64>) -> StoreResult<Insert>;

    /// Marks the run `abandoned` (unsealed) and frees its session, if it is running and its
    /// owner's heartbeat is stale. Returns whether it did.
    async fn expire_run(&self, run: &RunRecord) -> StoreResult<bool>;

    /// Admits `run`: takes the session unless a live run holds it. A holder whose replica
    /// stopped heartbeating is marked `abandoned` and the claim is retried. One round trip when
    /// the session is free.
    async fn claim_run(&self, run: &NewRun, ticket: Option<i64>) -> StoreResult<Claim> {
        for _ in 0..5 {
            match self.insert_run(run, ticket).await? {
                Insert::Inserted {
                    base_seq,
                    unsealed,
                    opened,
                } => {
                    return Ok(Claim::Acquired {
                        base_seq,
                        unsealed,
                        opened,
                    })
                }
                Insert::NoSession => return Ok(Claim::NoSession),
                Insert::Occupied => {}
            }
            let Some(active) = self.active_run(&run.key).await? else {
                return Ok(Claim::Busy(None)); // queued requests come first, or it just ended
            };
            if !self.expire_run(&active).await? {
                return Ok(Claim::Busy(Some(Box::new(active))));
            }
            tracing::warn!(run = %active.run_id, owner = %active.owner, "took over a session whose replica stopped heartbeating");
        }
        Err(StoreError::Conflict)
    }

    /// Records this replica as alive (one row per replica) and returns the ids of its running
    /// runs that someone asked to cancel (the fallback for a missed notification).
    async fn heartbeat(
        &self,
        replica: &str,
        lease: Duration,
        draining: bool,
    ) -> StoreResult<Vec<String>>;

    /// The ids of the running runs recorded as `replica`'s (reconciliation).
    async fn owned_runs(&self, replica: &str) -> StoreResult<Vec<String>>;

    /// Says this replica is gone (its runs count as dead at once).
    async fn retire_replica(&self, replica: &str) -> StoreResult<()>;

    /// Marks the running runs of replicas whose heartbeat is stale `abandoned` and frees their
    /// sessions; returns them (each still to be sealed). Never touches `me`'s runs.
    async fn sweep(&self, me: &str) -> StoreResult<Vec<RunRecord>>;

    /// Abandoned runs of a session whose transcript still needs sealing.
    async fn unsealed_runs(&self, key: &SessionKey) -> StoreResult<Vec<RunRecord>>;

    async fn mark_sealed(&self, run_id: &str) -> StoreResult<()>;

    /// Records the outcome and frees the session, if the run still owns it (an asynchronous
    /// commit on PostgreSQL: see `ASYNC_COMMIT` for why that is safe). Returns false if the run
    /// had already lost the session (it was taken over); nothing is then changed.
    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<bool>;

    /// Flags a running run for cancellation (idempotent). `None` if no such run.
    async fn request_cancel(
        &self,
        run_id: &str,
        req: &CancelRequest,
    ) -> StoreResult<Option<RunRecord>>;

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>>;

    /// The run that owns the session, if any.
    async fn active_run(&self, key: &SessionKey) -> StoreResult<Option<RunRecord>>;

    /// Takes a place in the session's queue (`onBusy: enqueue`).
    async fn enqueue(&self, key: &SessionKey, owner: &str) -> StoreResult<i64>;

    /// Leaves the queue (admitted, timed out, or the client went away).
    async fn dequeue(&self, ticket: i64) -> StoreResult<()>;
}

const RUN_COLUMNS: &str =
    "id, app_name, user_id, session_id, invocation_id, status, owner, cancel_requested, \
     cancelled_by, cancel_reason, created_at, started_at, finished_at, base_seq, user_event, \
     last_seq, error, sealed";

/// Reads a `runs` row; the same code for both backends' row types.
macro_rules! run_record_reader {
    ($fn_name:ident, $row:ty) => {
        pub(crate) fn $fn_name(r: &$row) -> StoreResult<RunRecord> {
            Ok(RunRecord {
                run_id: r.try_get("id")?,
                app_name: r.try_get("app_name")?,
                user_id: r.try_get("user_id")?,
                session_id: r.try_get("session_id")?,
                invocation_id: r.try_get("invocation_id")?,
                status: RunStatus::parse(r.try_get::<&str, _>("status")?),
                owner: r.try_get("owner")?,
                cancel_requested: r.try_get("cancel_requested")?,
                cancelled_by: r.try_get("cancelled_by")?,
                cancel_reason: r.try_get("cancel_reason")?,
                created_at: r.try_get("created_at")?,
                started_at: r.try_get("started_at")?,
                finished_at: r.try_get("finished_at")?,
                base_seq: r.try_get("base_seq")?,
                user_event: r.try_get("user_event")?,
                last_seq: r.try_get("last_seq")?,
                error: r.try_get("error")?,
                sealed: r.try_get("sealed")?,
            })
        }
    };
}

run_record_reader!(record_pg, sqlx::postgres::PgRow);
run_record_reader!(record_sqlite, sqlx::sqlite::SqliteRow);

/// PostgreSQL's clock, as epoch seconds.
pub(crate) const PG_NOW: &str = "extract(epoch from clock_timestamp())::double precision";

/// Makes the statement's own (implicit) transaction commit without waiting for its WAL to
/// reach disk (`SET LOCAL synchronous_commit = off`, inside the one statement, so it costs no
/// round trip). Used where losing the write in a database crash is harmless:
///
/// - Admission without its user event (a resume; a user event with staged artifacts, which
///   the runner appends right after): the run id is revealed to no one until the run's user
///   event, if any, is committed synchronously, and that flush covers the earlier admission
///   record too (WAL is flushed in order). So no client can act on an admission that a crash
///   could undo; a crash before that flush simply means the run never started. Admission
///   that carries the user event is that event's durable commit.
/// - Heartbeats: losing one only makes the replica look older by one period.
/// - Finishing a run (`finish_run`) when its outcome did not ride on its last event (a
///   completed run whose final response was held back commits both in one synchronous
///   statement, [`super::Fence::RunEnd`]; this is the rest: failures, cancels, agents that
///   end with something else): every event of the run is already durable (each was
///   committed synchronously before any client saw it), and `event: done` repeats nothing that
///   is not. The window is a PostgreSQL crash within the few hundred milliseconds before the
///   WAL writer (or any later synchronous commit) flushes the record: the run row then reads
///   `running` and its session stays owned. That is repaired without a client's help: if the
///   replica lives, its reconciliation (every sweep, 2/3 of the lease) finds a running run of
///   its own with no task and finishes it (`failed`, "outcome lost"); if it died too, any
///   replica's sweeper abandons and seals it. No event is lost or duplicated either way; what
///   can differ is the recorded status of that one run. A synchronous outcome cost 15% of
///   the runs/s at 8 clients (`agentd-bench runs`, README "Performance").
const ASYNC_COMMIT: &str = "SELECT set_config('synchronous_commit', 'off', true)";

/// A live ticket: its waiter's replica is heartbeating.
const PG_LIVE_TICKET: &str = "EXISTS (SELECT 1 FROM replicas r WHERE r.id = q.owner
                                AND r.heartbeat_at > extract(epoch from clock_timestamp())::double precision - r.lease_secs)";

/// The owner of a `runs` row is dead: no fresh heartbeat. A row written by a replica of an
/// older version (before per-replica heartbeats) carries a per-run lease that its owner
/// renews: while that lease runs, the run is alive (a rolling upgrade must not abandon it).
const PG_OWNER_DEAD: &str = "runs.lease_expires_at < extract(epoch from clock_timestamp())::double precision
                             AND NOT EXISTS (SELECT 1 FROM replicas p WHERE p.id = runs.owner
                               AND p.heartbeat_at > extract(epoch from clock_timestamp())::double precision - p.lease_secs)";

/// SQLite's form of [`PG_OWNER_DEAD`]; `?2` is now.
const SQLITE_OWNER_DEAD: &str = "runs.lease_expires_at < ?2
                                 AND NOT EXISTS (SELECT 1 FROM replicas p WHERE p.id = runs.owner
                                   AND p.heartbeat_at > ?2 - p.lease_secs)";

fn unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

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
             ), snap AS (
                 SELECT last_seq FROM sessions WHERE app_name = $2 AND user_id = $3 AND id = $4
             ), dead AS (
                 SELECT EXISTS (SELECT 1 FROM runs WHERE app_name = $2 AND user_id = $3
                                   AND session_id = $4 AND NOT sealed) AS unsealed
             ), s AS (
                 UPDATE sessions
                    SET active_run = $1,
                        state = CASE WHEN o.with_event THEN state || $11::jsonb ELSE state END,
                        update_time = CASE WHEN o.with_event THEN $14 ELSE update_time END,
                        last_seq = last_seq + CASE WHEN o.with_event THEN 1 ELSE 0 END
                   FROM (SELECT $10 AND NOT d.unsealed AS with_event FROM dead d) o
                  WHERE app_name = $2 AND user_id = $3 AND id = $4 AND active_run IS NULL
                    AND ((SELECT first FROM q) IS NULL OR (SELECT first FROM q) = $8)
                 RETURNING sessions.last_seq, sessions.state, o.with_event
             ), ins AS (
                 INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                                   lease_expires_at, created_at, started_at, base_seq, user_event)
                 SELECT $1, $2, $3, $4, $5, 'running', $6, 0, {PG_NOW}, {PG_NOW},
                        s.last_seq - CASE WHEN s.with_event THEN 1 ELSE 0 END, $7 FROM s
                 RETURNING base_seq
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
                 SELECT $2, $3, $4, s.last_seq, $15, $16, $17, $14, $18::jsonb FROM s WHERE s.with_event
                 RETURNING seq
             )
             SELECT EXISTS (SELECT 1 FROM sessions WHERE app_name = $2 AND user_id = $3 AND id = $4)
                        AS session,
                    (SELECT base_seq FROM ins) AS base_seq,
                    d.unsealed,
                    (SELECT seq FROM e) AS seq,
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

#[async_trait]
impl RunStore for PgStore {
    async fn run_invocations(&self, key: &SessionKey) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(RUN_INVOCATIONS)
            .bind(&key.app_name)
            .bind(&key.user_id)
            .bind(&key.session_id)
            .fetch_all(self.pool())
            .await?)
    }

    async fn insert_run(&self, run: &NewRun, ticket: Option<i64>) -> StoreResult<Insert> {
        let opening = run.opening.clone().map(|mut e| {
            super::prepare_event(&mut e);
            e
        });
        let split = opening
            .as_ref()
            .map(|e| SplitState::split(&e.actions.state_delta))
            .unwrap_or_default();
        let empty = Event::new("", "");
        let event = opening.as_ref().unwrap_or(&empty);
        let q = sqlx::query(pg_insert_run_sql())
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
        let row = super::postgres::bind_event(q, event, &split)
            .fetch_one(self.pool())
            .await;
        let row = match row {
            // A running row without a session owner (written before migration 0003).
            Err(sqlx::Error::Database(db))
                if db.constraint() == Some("runs_one_active_per_session") =>
            {
                return Ok(Insert::Occupied)
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
        let opened = match (opening, seq) {
            (Some(event), Some(seq)) => {
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

    async fn expire_run(&self, run: &RunRecord) -> StoreResult<bool> {
        let run_id = run.run_id.as_str();
        let n: i64 = sqlx::query_scalar(&format!(
            "WITH r AS (
                 UPDATE runs SET status = 'abandoned', finished_at = {PG_NOW}, sealed = false,
                        error = 'its replica stopped heartbeating'
                  WHERE id = $1 AND status = 'running' AND {PG_OWNER_DEAD}
                 RETURNING app_name, user_id, session_id, id
             ), s AS (
                 UPDATE sessions SET active_run = NULL FROM r
                  WHERE sessions.app_name = r.app_name AND sessions.user_id = r.user_id
                    AND sessions.id = r.session_id AND sessions.active_run = r.id
             )
             SELECT count(*) FROM r"
        ))
        .bind(run_id)
        .fetch_one(self.pool())
        .await?;
        if n > 0 {
            return Ok(true);
        }
        // A session pointing at a run that is no longer running (cannot happen through these
        // statements; repaired rather than left busy for ever).
        let healed = sqlx::query(
            "UPDATE sessions SET active_run = NULL
              WHERE app_name = $2 AND user_id = $3 AND id = $4 AND active_run = $1
                AND NOT EXISTS (SELECT 1 FROM runs WHERE id = $1 AND status = 'running')",
        )
        .bind(run_id)
        .bind(&run.app_name)
        .bind(&run.user_id)
        .bind(&run.session_id)
        .execute(self.pool())
        .await?;
        Ok(healed.rows_affected() > 0)
    }

    async fn heartbeat(
        &self,
        replica: &str,
        lease: Duration,
        draining: bool,
    ) -> StoreResult<Vec<String>> {
        let rows = sqlx::query(&format!(
            "WITH async_commit AS ({ASYNC_COMMIT}), h AS (
                 INSERT INTO replicas (id, heartbeat_at, lease_secs, started_at, draining)
                 SELECT $1, {PG_NOW}, $2, {PG_NOW}, $3 FROM async_commit
                 ON CONFLICT (id) DO UPDATE
                    SET heartbeat_at = EXCLUDED.heartbeat_at, lease_secs = EXCLUDED.lease_secs,
                        draining = EXCLUDED.draining
             )
             SELECT id FROM runs WHERE owner = $1 AND status = 'running' AND cancel_requested"
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
        Ok(
            sqlx::query_scalar("SELECT id FROM runs WHERE owner = $1 AND status = 'running'")
                .bind(replica)
                .fetch_all(self.pool())
                .await?,
        )
    }

    async fn retire_replica(&self, replica: &str) -> StoreResult<()> {
        sqlx::query("UPDATE replicas SET heartbeat_at = 0 WHERE id = $1")
            .bind(replica)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn sweep(&self, me: &str) -> StoreResult<Vec<RunRecord>> {
        let rows = sqlx::query(&format!(
            "WITH dead AS (
                 UPDATE runs SET status = 'abandoned', finished_at = {PG_NOW}, sealed = false,
                        error = 'its replica stopped heartbeating'
                  WHERE status = 'running' AND owner <> $1 AND {PG_OWNER_DEAD}
                 RETURNING {RUN_COLUMNS}
             ), s AS (
                 UPDATE sessions SET active_run = NULL FROM dead
                  WHERE sessions.app_name = dead.app_name AND sessions.user_id = dead.user_id
                    AND sessions.id = dead.session_id AND sessions.active_run = dead.id
             )
             SELECT {RUN_COLUMNS} FROM dead"
        ))
        .bind(me)
        .fetch_all(self.pool())
        .await?;
        // Tickets whose waiters are long gone.
        sqlx::query(&format!(
            "DELETE FROM run_queue WHERE created_at < {PG_NOW} - 3600"
        ))
        .execute(self.pool())
        .await?;
        // Replicas gone for an hour are forgotten (their runs were swept long ago).
        sqlx::query(&format!(
            "DELETE FROM replicas WHERE heartbeat_at < {PG_NOW} - 3600 AND id <> $1"
        ))
        .bind(me)
        .execute(self.pool())
        .await?;
        rows.iter().map(record_pg).collect()
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

    async fn mark_sealed(&self, run_id: &str) -> StoreResult<()> {
        sqlx::query("UPDATE runs SET sealed = true WHERE id = $1")
            .bind(run_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let n: i64 = sqlx::query_scalar(&format!(
            "WITH async_commit AS ({ASYNC_COMMIT}), r AS (
                 UPDATE runs SET status = $2, finished_at = {PG_NOW}, last_seq = $3, error = $4
                   FROM async_commit
                  WHERE id = $1 AND status = 'running'
                 RETURNING app_name, user_id, session_id, id
             ), s AS (
                 UPDATE sessions SET active_run = NULL FROM r
                  WHERE sessions.app_name = r.app_name AND sessions.user_id = r.user_id
                    AND sessions.id = r.session_id AND sessions.active_run = r.id
             )
             SELECT count(*) FROM r"
        ))
        .bind(run_id)
        .bind(status.as_str())
        .bind(last_seq)
        .bind(error)
        .fetch_one(self.pool())
        .await?;
        Ok(n > 0)
    }

    async fn request_cancel(
        &self,
        run_id: &str,
        req: &CancelRequest,
    ) -> StoreResult<Option<RunRecord>> {
        sqlx::query(
            "UPDATE runs SET cancel_requested = true,
                    cancelled_by = COALESCE(cancelled_by, $2),
                    cancel_reason = COALESCE(cancel_reason, $3)
              WHERE id = $1 AND status = 'running'",
        )
        .bind(run_id)
        .bind(&req.by)
        .bind(&req.reason)
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
              WHERE id = (SELECT active_run FROM sessions
                           WHERE app_name = $1 AND user_id = $2 AND id = $3)
             UNION ALL
             SELECT {RUN_COLUMNS} FROM runs
              WHERE app_name = $1 AND user_id = $2 AND session_id = $3 AND status = 'running'
             LIMIT 1"
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(record_pg).transpose()
    }

    async fn enqueue(&self, key: &SessionKey, owner: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(&format!(
            "INSERT INTO run_queue (app_name, user_id, session_id, owner, created_at)
             VALUES ($1, $2, $3, $4, {PG_NOW}) RETURNING ticket"
        ))
        .bind(&key.app_name)
        .bind(&key.user_id)
        .bind(&key.session_id)
        .bind(owner)
        .fetch_one(self.pool())
        .await?)
    }

    async fn dequeue(&self, ticket: i64) -> StoreResult<()> {
        sqlx::query("DELETE FROM run_queue WHERE ticket = $1")
            .bind(ticket)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

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
        let inserted = sqlx::query(
            "INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                               lease_expires_at, created_at, started_at, base_seq, user_event)
             VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, 0, ?7, ?7, ?8, ?9)",
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
                let fence = super::Fence::Run(&run.run_id);
                let stored =
                    SqliteStore::append_in(&mut tx, &run.key, event.clone(), &[], fence).await?;
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

    async fn expire_run(&self, run: &RunRecord) -> StoreResult<bool> {
        let run_id = run.run_id.as_str();
        let now = now_ts();
        let mut tx = self.begin().await?;
        let dead = sqlx::query(&format!(
            "UPDATE runs SET status = 'abandoned', finished_at = ?2, sealed = 0,
                    error = 'its replica stopped heartbeating'
              WHERE id = ?1 AND status = 'running' AND {SQLITE_OWNER_DEAD}"
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
        Ok(dead || freed)
    }

    async fn heartbeat(
        &self,
        replica: &str,
        lease: Duration,
        draining: bool,
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
        Ok(sqlx::query_scalar(
            "SELECT id FROM runs WHERE owner = ? AND status = 'running' AND cancel_requested",
        )
        .bind(replica)
        .fetch_all(&self.reader)
        .await?)
    }

    async fn owned_runs(&self, replica: &str) -> StoreResult<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM runs WHERE owner = ? AND status = 'running'")
                .bind(replica)
                .fetch_all(self.writer())
                .await?,
        )
    }

    async fn retire_replica(&self, replica: &str) -> StoreResult<()> {
        sqlx::query("UPDATE replicas SET heartbeat_at = 0 WHERE id = ?")
            .bind(replica)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn sweep(&self, me: &str) -> StoreResult<Vec<RunRecord>> {
        let now = now_ts();
        let mut tx = self.begin().await?;
        let rows = sqlx::query(&format!(
            "UPDATE runs SET status = 'abandoned', finished_at = ?2, sealed = 0,
                    error = 'its replica stopped heartbeating'
              WHERE status = 'running' AND owner <> ?1 AND {SQLITE_OWNER_DEAD}
             RETURNING {RUN_COLUMNS}"
        ))
        .bind(me)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        let dead = rows
            .iter()
            .map(record_sqlite)
            .collect::<StoreResult<Vec<_>>>()?;
        for run in &dead {
            sqlx::query(
                "UPDATE sessions SET active_run = NULL
                  WHERE app_name = ? AND user_id = ? AND id = ? AND active_run = ?",
            )
            .bind(&run.app_name)
            .bind(&run.user_id)
            .bind(&run.session_id)
            .bind(&run.run_id)
            .execute(&mut *tx)
            .await?;
        }
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
        Ok(dead)
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

    async fn mark_sealed(&self, run_id: &str) -> StoreResult<()> {
        sqlx::query("UPDATE runs SET sealed = 1 WHERE id = ?")
            .bind(run_id)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let mut tx = self.begin().await?;
        let done = Self::finish_in(&mut tx, run_id, status, last_seq, error).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn request_cancel(
        &self,
        run_id: &str,
        req: &CancelRequest,
    ) -> StoreResult<Option<RunRecord>> {
        sqlx::query(
            "UPDATE runs SET cancel_requested = 1,
                    cancelled_by = COALESCE(cancelled_by, ?2),
                    cancel_reason = COALESCE(cancel_reason, ?3)
              WHERE id = ?1 AND status = 'running'",
        )
        .bind(run_id)
        .bind(&req.by)
        .bind(&req.reason)
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

    async fn dequeue(&self, ticket: i64) -> StoreResult<()> {
        sqlx::query("DELETE FROM run_queue WHERE ticket = ?")
            .bind(ticket)
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
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        let key = sqlx::query(
            "UPDATE runs SET status = ?2, finished_at = ?3, last_seq = ?4, error = ?5
              WHERE id = ?1 AND status = 'running'
             RETURNING app_name, user_id, session_id",
        )
        .bind(run_id)
        .bind(status.as_str())
        .bind(now_ts())
        .bind(last_seq)
        .bind(error)
        .fetch_optional(&mut **tx)
        .await?;
        let done = key.is_some();
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
