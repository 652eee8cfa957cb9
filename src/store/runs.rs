//! Run admission and ownership, as database facts.
//!
//! - **One run per session**: admission sets `sessions.active_run` only where it is NULL.
//!   Every append on behalf of a run is fenced by `active_run` in the statement that assigns
//!   its seq (see [`super::Fence`]).
//! - **The run record**: on PostgreSQL a running run lives on its session's row and gets its
//!   one `runs` row from the statement that ends it (`postgres/run_record.rs`); SQLite keeps a
//!   `runs` row from admission on. Readers see one record either way.
//! - **Liveness per replica**: each process writes one heartbeat row every lease/3; a run is
//!   alive while its owner's heartbeat is younger than the owner's lease. No per-run writes
//!   while a run is healthy.
//! - **Dead runs**: a run whose owner stopped heartbeating is recorded `abandoned` (by the next
//!   admission on its session, or by any replica's sweeper) and its session freed in the same
//!   statement; it is left `sealed = false` until its transcript has been sealed.
//! - **Cancel** is a flag plus who/why on the row (the first request's values are kept); the
//!   owner hears of it through the notification bus at once, or on its next heartbeat.
//! - **First come, first served**: `onBusy: enqueue` takes a ticket in `run_queue`; admission of
//!   a session with live tickets goes to the smallest one only.
//!
//! The statements are per database: [`super::postgres`] (times from PostgreSQL's own clock, so
//! replicas with skewed clocks agree) and [`super::sqlite`].

use super::{SessionKey, StoreResult, StoredEvent};
use crate::event::{Event, JsonMap};
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
    /// The replica that executes it.
    pub owner: String,
    /// The run's first event will be the user's message.
    pub user_event: bool,
    /// A queue ticket older than this no longer counts (its waiter gave up long ago, but the
    /// ticket could not be removed: a database error, a crash between insert and use).
    pub queue_ttl: Duration,
    /// The user event, committed by admission itself (PostgreSQL: admission, the user event
    /// and the run's starting state are one statement and one durable commit, see
    /// [`pg_insert_run_sql`](super::postgres::pg_insert_run_sql); SQLite: one transaction). It is committed there only if the
    /// session has no dead run to seal first; otherwise the runner appends it after admission.
    /// An event with staged artifacts is never passed here.
    pub opening: Option<Event>,
    /// Its webhook targets at admission (a JSON array of `WebhookTarget`s), or `None`: the
    /// run's end writes their deliveries (see `migrations/postgres/0009_webhooks.sql`). A2A
    /// push configs may be added while it runs (`store/push.rs`).
    pub webhooks: Option<serde_json::Value>,
    /// Resumable by another replica if this one dies (`None`: a hold, or an app with
    /// `resume: never`): what the run continues with.
    pub durable: Option<Durable>,
    /// The API key that asked for the run: its spending is counted as the key's.
    pub api_key: Option<String>,
}

/// What a resumed run continues with (see docs/replicas.md, "Durable runs").
#[derive(Debug, Clone, PartialEq)]
pub struct Durable {
    /// The run's configuration as the runner stores it (`None`: all defaults).
    pub config: Option<serde_json::Value>,
    /// The run's limit: it must end this long after its first start, however often it moves.
    pub max_secs: f64,
}

/// One move of a run to another replica.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ResumeStep {
    /// The replica that stopped running it.
    pub from: String,
    /// The replica that went on with it.
    pub to: String,
    /// When (seconds since the epoch).
    pub at: f64,
    /// `replica_lost` (its replica died), `drain` (handed over by a replica shutting down) or
    /// `restart` (the same replica id, started again).
    pub reason: String,
}

/// Why a run moves to another replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeReason {
    ReplicaLost,
    Drain,
    Restart,
}

impl ResumeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeReason::ReplicaLost => "replica_lost",
            ResumeReason::Drain => "drain",
            ResumeReason::Restart => "restart",
        }
    }
}

/// A running run nobody runs: its replica died, or handed it over while draining.
#[derive(Debug, Clone, PartialEq)]
pub struct Orphan {
    pub run: RunRecord,
    /// It may be resumed (admitted durable).
    pub durable: bool,
    /// Its owner gave it up at a commit boundary (a drain).
    pub released: bool,
    /// Seconds left before its deadline (`None`: not recorded, an older admission).
    pub remaining: Option<f64>,
}

/// A run this replica took over: the record as it is now (this replica its owner, `resumes`
/// the new epoch), and what it continues with.
#[derive(Debug, Clone, PartialEq)]
pub struct TakenOver {
    pub run: RunRecord,
    pub config: Option<serde_json::Value>,
    /// Seconds left before its deadline.
    pub remaining: f64,
    /// The session's last seq when it was taken: every write of the previous owner is in it,
    /// or refused.
    pub session_seq: i64,
    /// It has webhook targets (its end wakes this replica's sender).
    pub has_webhooks: bool,
}

/// What asking to end a dead holder did (admission).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Ended `abandoned`; the session is free.
    Ended,
    /// Its owner is alive (or it already ended): nothing changed.
    Alive,
    /// Its owner is dead but the run is durable: it is to be resumed, not ended.
    Durable,
}

/// The user event committed by admission, with the session's merged state after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Opened {
    pub stored: StoredEvent,
    /// `None` when the admission statement's snapshot predates a write to the session that it
    /// then waited for (see [`pg_insert_run_sql`](super::postgres::pg_insert_run_sql)): its reading of the shared `app:`/`user:`
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
    /// How often the run moved to another replica (also the epoch its writes are fenced by).
    #[serde(skip_serializing_if = "is_zero")]
    pub resumes: i32,
    /// Each move: from, to, when and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resumed: Vec<ResumeStep>,
    /// What the run spent (so far, while it runs): tokens and cost over every model, and by
    /// model (docs/usage.md).
    #[serde(serialize_with = "crate::usage::serialize_run_usage")]
    #[schema(value_type = crate::usage::RunUsageView)]
    pub usage: Option<crate::usage::RunUsage>,
    /// The id of the API key that started the run (its spending is the key's). Not shown:
    /// it would name a service key to the end users it acts for; admins see what each key
    /// spent in `GET /usage?groupBy=key`.
    #[serde(skip)]
    pub api_key: Option<String>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

impl RunRecord {
    pub fn key(&self) -> SessionKey {
        SessionKey::new(&self.app_name, &self.user_id, &self.session_id)
    }
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

#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// The invocation ids of the session's runs on this server. Events a client imported with
    /// create-session carry other ids: their tool calls are never executed by `resume`.
    async fn run_invocations(&self, key: &SessionKey) -> StoreResult<Vec<String>>;

    /// Makes `run` the session's owner and records it as `running`, if the session exists, has
    /// no active run, and no earlier live ticket waits for it (`ticket`: the caller's own).
    /// One statement (SQLite: one transaction) that also commits `run.opening` (see
    /// [`NewRun::opening`]).
    async fn insert_run(&self, run: &NewRun, ticket: Option<i64>) -> StoreResult<Insert>;

    /// Marks the run `abandoned` (unsealed) and frees its session, if it is running, its
    /// owner's heartbeat is stale and it is not durable; a durable one is left for
    /// [`RunStore::take_over`] ([`Expired::Durable`]).
    async fn expire_run(&self, run: &RunRecord) -> StoreResult<Expired>;

    /// Records this replica as alive (one row per replica) and, when `runs` (it has runs
    /// going), returns the ids of its running runs that someone asked to cancel (the fallback
    /// for a missed notification); without runs it reads nothing else.
    async fn heartbeat(
        &self,
        replica: &str,
        lease: Duration,
        draining: bool,
        runs: bool,
    ) -> StoreResult<Vec<String>>;

    /// The ids of the running runs recorded as `replica`'s and not handed over
    /// (reconciliation, and a restarted replica's own runs).
    async fn owned_runs(&self, replica: &str) -> StoreResult<Vec<String>>;

    /// Says this replica is gone (its runs count as dead at once).
    async fn retire_replica(&self, replica: &str) -> StoreResult<()>;

    /// Running runs nobody runs: their owner (not `me`) stopped heartbeating, or handed them
    /// over while draining; with `mine`, also those recorded as `me`'s (a process with this
    /// id died and started again). Read without locks; each is then taken over or ended by a
    /// statement about that one run.
    async fn orphans(&self, me: &str, mine: bool) -> StoreResult<Vec<Orphan>>;

    /// Moves the durable run `run` (as [`RunStore::orphans`] read it, at its epoch) to `me`,
    /// if nobody runs it still (`restart`: `me` is a process that died and started again, so
    /// a run recorded as its own is nobody's): the same run and invocation, one epoch more,
    /// the move logged. `None` if another replica took it first, or it ended, or its owner
    /// came back.
    async fn take_over(
        &self,
        run: &RunRecord,
        me: &str,
        reason: ResumeReason,
        restart: bool,
    ) -> StoreResult<Option<TakenOver>>;

    /// Ends a run nobody runs that is not to be resumed: `status` with `error`, its session
    /// freed, its record and webhook deliveries written, left unsealed for its transcript to be
    /// sealed. `None` if it was not nobody's any more (as for [`RunStore::take_over`]).
    async fn expire_as(
        &self,
        run: &RunRecord,
        me: &str,
        restart: bool,
        status: RunStatus,
        error: &str,
    ) -> StoreResult<Option<RunRecord>>;

    /// A draining `me` gives its run up at a commit boundary, for a live replica to take over.
    /// False if it is no longer its to give (taken, ended, or a cancel came first).
    async fn release_run(
        &self,
        user: &str,
        run_id: &str,
        epoch: i32,
        me: &str,
    ) -> StoreResult<bool>;

    /// How many other replicas heartbeat and are not draining.
    async fn live_replicas(&self, me: &str) -> StoreResult<usize>;

    /// Whether a replica's runs may have become nobody's within the last `within_secs`: a
    /// replica's lease ran out in that time (it died, or retired: [`RunStore::retire_replica`]
    /// ends its lease), or a replica is draining (it hands its runs over) and was live then.
    /// Read from the replicas alone (on Citus a reference table, one node), so an idle
    /// deployment's sweep need not read every user's sessions to find nothing.
    async fn runs_may_be_orphaned(&self, within_secs: f64) -> StoreResult<bool>;

    /// Deletes queue tickets whose waiters are long gone and replicas gone for an hour.
    async fn sweep_housekeeping(&self, me: &str) -> StoreResult<()>;

    /// Abandoned runs of a session whose transcript still needs sealing.
    async fn unsealed_runs(&self, key: &SessionKey) -> StoreResult<Vec<RunRecord>>;

    async fn mark_sealed(&self, user: &str, run_id: &str) -> StoreResult<()>;

    /// Records the outcome and frees the session, if the run still owns it at `epoch` (an
    /// asynchronous commit on PostgreSQL: see `ASYNC_COMMIT` for why that is safe). Returns
    /// false if the run had already lost the session (it was taken over, or handed over);
    /// nothing is then changed.
    /// `completed` is refused with [`StoreError::CancelRequested`](super::StoreError) when a
    /// cancel of the run was accepted first (both statements lock the run's session row, so one
    /// of them comes first).
    async fn finish_run(
        &self,
        user: &str,
        run_id: &str,
        epoch: i32,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
    ) -> StoreResult<bool> {
        self.finish_metered(user, run_id, epoch, status, last_seq, error, None)
            .await
    }

    /// [`RunStore::finish_run`] writing the run's usage (`usage`: what its commits have not
    /// written yet, if anything) in the same statement, so the outcome's statement adds all
    /// of it to the aggregates (a failed run's last model call has no commit of its own).
    #[allow(clippy::too_many_arguments)]
    async fn finish_metered(
        &self,
        user: &str,
        run_id: &str,
        epoch: i32,
        status: RunStatus,
        last_seq: Option<i64>,
        error: Option<&str>,
        usage: Option<&crate::usage::RunUsage>,
    ) -> StoreResult<bool>;

    /// Flags a running run for cancellation (idempotent). `None` if no such run.
    async fn request_cancel(
        &self,
        user: &str,
        run_id: &str,
        req: &CancelRequest,
    ) -> StoreResult<Option<RunRecord>>;

    async fn get_run(&self, run_id: &str) -> StoreResult<Option<RunRecord>>;

    /// A run of `user`: the same row as [`RunStore::get_run`], found with its user (one shard
    /// on Citus, where a bare id has to ask every shard). Every caller that knows the user
    /// (the runner, the routes naming it) uses this one.
    async fn get_user_run(&self, user: &str, run_id: &str) -> StoreResult<Option<RunRecord>>;

    /// A user's runs in an app, newest first: at most `limit`, only `status` if given, and
    /// only those before `before` (`(created_at, run id)` of the last run of the previous
    /// page: keyset pagination, stable while runs are added).
    async fn list_runs(
        &self,
        app: &str,
        user: &str,
        status: Option<RunStatus>,
        before: Option<(f64, String)>,
        limit: u32,
    ) -> StoreResult<Vec<RunRecord>>;

    /// A session's runs, newest first, before the cursor (as for [`RunStore::list_runs`]):
    /// at most `limit`. A2A lists a context's tasks with it.
    async fn list_session_runs(
        &self,
        key: &SessionKey,
        before: Option<(f64, String)>,
        limit: u32,
    ) -> StoreResult<Vec<RunRecord>>;

    /// The run that owns the session, if any.
    async fn active_run(&self, key: &SessionKey) -> StoreResult<Option<RunRecord>>;

    /// Takes a place in the session's queue (`onBusy: enqueue`).
    async fn enqueue(&self, key: &SessionKey, owner: &str) -> StoreResult<i64>;

    /// Leaves the queue (admitted, timed out, or the client went away).
    async fn dequeue(&self, user: &str, ticket: i64) -> StoreResult<()>;
}

pub(crate) const RUN_COLUMNS: &str =
    "id, app_name, user_id, session_id, invocation_id, status, owner, cancel_requested, \
     cancelled_by, cancel_reason, created_at, started_at, finished_at, base_seq, user_event, \
     last_seq, error, sealed, resumes, resume_log, usage, key_id";

/// Reads a `runs` row; the same code for both backends' row types.
macro_rules! run_record_reader {
    ($fn_name:ident, $row:ty, $log:ty, $parse:expr, $usage:ty, $parse_usage:expr) => {
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
                resumes: r.try_get("resumes")?,
                resumed: r
                    .try_get::<Option<$log>, _>("resume_log")?
                    .map($parse)
                    .unwrap_or_default(),
                usage: r
                    .try_get::<Option<$usage>, _>("usage")?
                    .and_then($parse_usage),
                api_key: r.try_get("key_id")?,
            })
        }
    };
}

run_record_reader!(
    record_pg,
    sqlx::postgres::PgRow,
    sqlx::types::Json<Vec<ResumeStep>>,
    |j: sqlx::types::Json<Vec<ResumeStep>>| j.0,
    sqlx::types::Json<crate::usage::RunUsage>,
    |j: sqlx::types::Json<crate::usage::RunUsage>| Some(j.0)
);
run_record_reader!(
    record_sqlite,
    sqlx::sqlite::SqliteRow,
    String,
    |s: String| serde_json::from_str::<Vec<ResumeStep>>(&s).unwrap_or_default(),
    String,
    |s: String| serde_json::from_str::<crate::usage::RunUsage>(&s).ok()
);

pub(crate) fn unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}
