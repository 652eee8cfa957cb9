//! Runs of stored eval sets and their results (migrations/postgres/0023_eval_runs.sql says how
//! the rows live; [`crate::eval::worker`] runs the cases). A run is created whole with its
//! cases in one transaction; each case is then claimed, renewed and finished by one attempt
//! at a time, every write after the claim fenced by that attempt in the same statement.
//!
//! Every statement names one app but the worker's read of the cases due, so on Citus each
//! runs on the worker that holds the app's sets. The SQL is the same on both backends.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::StoreResult;
use async_trait::async_trait;
use sqlx::Row;

/// A run to create: the set's cases as they are now (id, file-form JSON), in order.
pub struct NewEvalRun<'a> {
    pub app: &'a str,
    pub run_id: &'a str,
    pub set_id: &'a str,
    /// ADK's `EvalConfig` as JSON, `{"criteria": {…}}`.
    pub criteria: &'a str,
    pub cases: &'a [(String, String)],
    pub now: f64,
}

/// How creating a run went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunCreate {
    Created,
    /// The id is taken (two runs of one set in the same microsecond): nothing was written.
    Exists,
    /// The app has `max_running` runs in flight: nothing was written.
    Busy,
}

/// A case due: waiting, or claimed by an attempt whose lease ran out.
#[derive(Debug, Clone, PartialEq)]
pub struct DueEvalCase {
    pub app: String,
    pub run_id: String,
    pub eval_id: String,
    pub due_at: f64,
    /// Attempts so far (claims).
    pub attempts: i32,
    /// The session of the last attempt, if one got that far: its run may still be going.
    pub session: Option<(String, String)>,
}

/// A claimed case: what its attempt runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedEvalCase {
    pub set_id: String,
    /// The case's file form.
    pub body: String,
    /// The run's eval config.
    pub criteria: String,
    /// This attempt's number: every later write names it.
    pub attempt: i32,
}

/// Identifies one case of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalCaseKey {
    pub app: String,
    pub run_id: String,
    pub eval_id: String,
}

/// A stored run with its cases, in the set's order.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvalRun {
    pub set_id: String,
    pub criteria: String,
    pub created_at: f64,
    pub cancelled: bool,
    /// Cases not yet finished (nor cancelled).
    pub open_cases: i64,
    pub cases: Vec<StoredEvalRunCase>,
}

/// One case of a stored run.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvalRunCase {
    pub eval_id: String,
    pub attempts: i32,
    /// ADK's `EvalCaseResult` in the file form, once the case finished.
    pub result: Option<String>,
    pub finished_at: Option<f64>,
}

#[async_trait]
pub trait EvalRunStore: Send + Sync + 'static {
    /// Creates a run and its cases, all due now, unless the app has `max_running` runs not
    /// yet finished. The app's oldest finished runs beyond `max_stored` go in the same
    /// transaction, so an app keeps a bounded history.
    async fn create_eval_run(
        &self,
        run: &NewEvalRun<'_>,
        max_running: usize,
        max_stored: usize,
    ) -> StoreResult<RunCreate>;

    /// Up to `limit` cases (of any app) due by `now`, soonest first: the one read that spans
    /// every app (on Citus every shard; the worker takes a turn for it).
    async fn due_eval_cases(&self, now: f64, limit: usize) -> StoreResult<Vec<DueEvalCase>>;

    /// The earliest time a case is due (a claim's end counts: its case is due again then);
    /// `None` when no case waits or runs. Read after a look that found nothing due, for the
    /// workers' quiet ([`super::turns`]).
    async fn next_eval_case_at(&self) -> StoreResult<Option<f64>>;

    /// Claims `due` until `until` while it is still as read, counting the attempt; `None`
    /// when another replica took it first, or it finished or was cancelled since.
    async fn claim_eval_case(
        &self,
        due: &DueEvalCase,
        until: f64,
    ) -> StoreResult<Option<ClaimedEvalCase>>;

    /// Moves the lease of `attempt` on to `until`, and records the attempt's session when
    /// given; false when the case is no longer that attempt's (cancelled, deleted, or claimed
    /// again after the lease ran out).
    async fn renew_eval_case(
        &self,
        key: &EvalCaseKey,
        attempt: i32,
        until: f64,
        session: Option<(&str, &str)>,
    ) -> StoreResult<bool>;

    /// Writes the case's result and ends it, while it is still `attempt`'s; whether it was.
    async fn finish_eval_case(
        &self,
        key: &EvalCaseKey,
        attempt: i32,
        result: &str,
        now: f64,
    ) -> StoreResult<bool>;

    /// Cancels the run's cases not yet finished; `None` when there is no such run, else
    /// whether anything was left to cancel.
    async fn cancel_eval_run(&self, app: &str, run_id: &str) -> StoreResult<Option<bool>>;

    async fn eval_run(&self, app: &str, run_id: &str) -> StoreResult<Option<StoredEvalRun>>;

    /// The app's run ids, sorted by their bytes.
    async fn list_eval_runs(&self, app: &str) -> StoreResult<Vec<String>>;

    /// Deletes a run and its results (a case in flight stops at its next renewal); false
    /// when there was none.
    async fn delete_eval_run(&self, app: &str, run_id: &str) -> StoreResult<bool>;
}

const DUE: &str = "SELECT app_name, eval_run_id, eval_id, due_at, attempts, user_id, session_id
   FROM eval_run_cases WHERE due_at <= $1 ORDER BY due_at LIMIT $2";

const CLAIM: &str = "UPDATE eval_run_cases SET due_at = $5, attempts = attempts + 1
  WHERE app_name = $1 AND eval_run_id = $2 AND eval_id = $3 AND due_at = $4
  RETURNING body, attempts";

const RENEW: &str = "UPDATE eval_run_cases
    SET due_at = $5, user_id = COALESCE($6, user_id), session_id = COALESCE($7, session_id)
  WHERE app_name = $1 AND eval_run_id = $2 AND eval_id = $3 AND attempts = $4
    AND due_at IS NOT NULL";

const FINISH: &str = "UPDATE eval_run_cases SET due_at = NULL, result = $5, finished_at = $6
  WHERE app_name = $1 AND eval_run_id = $2 AND eval_id = $3 AND attempts = $4
    AND due_at IS NOT NULL";

macro_rules! eval_run_store {
    ($store:ty, $writer:ident, $reader:ident, $begin:literal, $snapshot:literal,
     $app_lock:literal) => {
        #[async_trait]
        impl EvalRunStore for $store {
            async fn create_eval_run(
                &self,
                run: &NewEvalRun<'_>,
                max_running: usize,
                max_stored: usize,
            ) -> StoreResult<RunCreate> {
                let mut tx = self.$writer.begin_with($begin).await?;
                // Runs of one app are created one at a time (PostgreSQL; SQLite has one
                // writer): the count of those in flight holds until the commit.
                sqlx::query($app_lock).bind(run.app).execute(&mut *tx).await?;
                let running: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM eval_runs WHERE app_name = $1 AND open_cases > 0",
                )
                .bind(run.app)
                .fetch_one(&mut *tx)
                .await?;
                if running as usize >= max_running {
                    return Ok(RunCreate::Busy);
                }
                let added = sqlx::query(
                    "INSERT INTO eval_runs
                        (app_name, eval_run_id, eval_set_id, criteria, created_at, open_cases)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (app_name, eval_run_id) DO NOTHING",
                )
                .bind(run.app)
                .bind(run.run_id)
                .bind(run.set_id)
                .bind(run.criteria)
                .bind(run.now)
                .bind(run.cases.len() as i64)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if added == 0 {
                    return Ok(RunCreate::Exists);
                }
                for (i, (id, body)) in run.cases.iter().enumerate() {
                    sqlx::query(
                        "INSERT INTO eval_run_cases
                            (app_name, eval_run_id, eval_id, position, body, due_at)
                         VALUES ($1, $2, $3, $4, $5, $6)",
                    )
                    .bind(run.app)
                    .bind(run.run_id)
                    .bind(id)
                    .bind(i as i64 + 1)
                    .bind(body)
                    .bind(run.now)
                    .execute(&mut *tx)
                    .await?;
                }
                // The history's bound: finished runs past the newest `max_stored` go (a
                // hundred at a time: each creation takes the few a bound that held left).
                let old: Vec<String> = sqlx::query_scalar(
                    "SELECT eval_run_id FROM eval_runs WHERE app_name = $1 AND open_cases = 0
                      ORDER BY created_at DESC, eval_run_id DESC LIMIT 100 OFFSET $2",
                )
                .bind(run.app)
                .bind(max_stored.min(i64::MAX as usize) as i64)
                .fetch_all(&mut *tx)
                .await?;
                for id in old {
                    Self::delete_run_rows(&mut tx, run.app, &id).await?;
                }
                tx.commit().await?;
                // Its cases are due now: the other replicas' workers may help at their next
                // turn, quiet or not (this replica's own is woken by the route).
                super::turns::wake_after_write(self, super::turns::kind::EVALS).await;
                Ok(RunCreate::Created)
            }

            async fn next_eval_case_at(&self) -> StoreResult<Option<f64>> {
                Ok(sqlx::query_scalar("SELECT min(due_at) FROM eval_run_cases WHERE due_at IS NOT NULL")
                    .fetch_one(&self.$reader)
                    .await?)
            }

            async fn due_eval_cases(
                &self,
                now: f64,
                limit: usize,
            ) -> StoreResult<Vec<DueEvalCase>> {
                let rows = sqlx::query(DUE)
                    .bind(now)
                    .bind(limit.min(i64::MAX as usize) as i64)
                    .fetch_all(&self.$reader)
                    .await?;
                rows.iter()
                    .map(|r| {
                        let user: Option<String> = r.try_get("user_id")?;
                        let session: Option<String> = r.try_get("session_id")?;
                        Ok(DueEvalCase {
                            app: r.try_get("app_name")?,
                            run_id: r.try_get("eval_run_id")?,
                            eval_id: r.try_get("eval_id")?,
                            due_at: r.try_get("due_at")?,
                            attempts: r.try_get("attempts")?,
                            session: user.zip(session),
                        })
                    })
                    .collect::<Result<_, sqlx::Error>>()
                    .map_err(Into::into)
            }

            async fn claim_eval_case(
                &self,
                due: &DueEvalCase,
                until: f64,
            ) -> StoreResult<Option<ClaimedEvalCase>> {
                let claimed: Option<(String, i32)> = sqlx::query_as(CLAIM)
                    .bind(&due.app)
                    .bind(&due.run_id)
                    .bind(&due.eval_id)
                    .bind(due.due_at)
                    .bind(until)
                    .fetch_optional(&self.$writer)
                    .await?;
                let Some((body, attempt)) = claimed else {
                    return Ok(None);
                };
                let run: Option<(String, String)> = sqlx::query_as(
                    "SELECT eval_set_id, criteria FROM eval_runs
                      WHERE app_name = $1 AND eval_run_id = $2",
                )
                .bind(&due.app)
                .bind(&due.run_id)
                .fetch_optional(&self.$reader)
                .await?;
                // The run was deleted between the two statements: its case rows went with it.
                Ok(run.map(|(set_id, criteria)| ClaimedEvalCase {
                    set_id,
                    body,
                    criteria,
                    attempt,
                }))
            }

            async fn renew_eval_case(
                &self,
                key: &EvalCaseKey,
                attempt: i32,
                until: f64,
                session: Option<(&str, &str)>,
            ) -> StoreResult<bool> {
                let n = sqlx::query(RENEW)
                    .bind(&key.app)
                    .bind(&key.run_id)
                    .bind(&key.eval_id)
                    .bind(attempt)
                    .bind(until)
                    .bind(session.map(|s| s.0))
                    .bind(session.map(|s| s.1))
                    .execute(&self.$writer)
                    .await?
                    .rows_affected();
                Ok(n == 1)
            }

            async fn finish_eval_case(
                &self,
                key: &EvalCaseKey,
                attempt: i32,
                result: &str,
                now: f64,
            ) -> StoreResult<bool> {
                let mut tx = self.$writer.begin_with($begin).await?;
                let n = sqlx::query(FINISH)
                    .bind(&key.app)
                    .bind(&key.run_id)
                    .bind(&key.eval_id)
                    .bind(attempt)
                    .bind(result)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if n == 1 {
                    sqlx::query(
                        "UPDATE eval_runs SET open_cases = open_cases - 1
                          WHERE app_name = $1 AND eval_run_id = $2 AND open_cases > 0",
                    )
                    .bind(&key.app)
                    .bind(&key.run_id)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(n == 1)
            }

            async fn cancel_eval_run(&self, app: &str, run_id: &str) -> StoreResult<Option<bool>> {
                let mut tx = self.$writer.begin_with($begin).await?;
                // The run's row first: a finish, which updates it after its case, waits
                // (PostgreSQL) and then finds its case cancelled.
                let found: Option<i32> = sqlx::query_scalar(
                    "UPDATE eval_runs SET cancelled = (cancelled OR open_cases > 0), open_cases = 0
                      WHERE app_name = $1 AND eval_run_id = $2
                      RETURNING 1",
                )
                .bind(app)
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(_) = found else {
                    return Ok(None);
                };
                let cancelled = sqlx::query(
                    "UPDATE eval_run_cases SET due_at = NULL
                      WHERE app_name = $1 AND eval_run_id = $2 AND due_at IS NOT NULL",
                )
                .bind(app)
                .bind(run_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(Some(cancelled > 0))
            }

            async fn eval_run(
                &self,
                app: &str,
                run_id: &str,
            ) -> StoreResult<Option<StoredEvalRun>> {
                // One snapshot: the run and its cases of one moment.
                let mut tx = self.$reader.begin_with($snapshot).await?;
                let head = sqlx::query(
                    "SELECT eval_set_id, criteria, created_at, cancelled, open_cases
                       FROM eval_runs WHERE app_name = $1 AND eval_run_id = $2",
                )
                .bind(app)
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(head) = head else {
                    return Ok(None);
                };
                let rows = sqlx::query(
                    "SELECT eval_id, attempts, result, finished_at FROM eval_run_cases
                      WHERE app_name = $1 AND eval_run_id = $2 ORDER BY position",
                )
                .bind(app)
                .bind(run_id)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                let cases = rows
                    .iter()
                    .map(|r| {
                        Ok(StoredEvalRunCase {
                            eval_id: r.try_get("eval_id")?,
                            attempts: r.try_get("attempts")?,
                            result: r.try_get("result")?,
                            finished_at: r.try_get("finished_at")?,
                        })
                    })
                    .collect::<Result<_, sqlx::Error>>()?;
                Ok(Some(StoredEvalRun {
                    set_id: head.try_get("eval_set_id")?,
                    criteria: head.try_get("criteria")?,
                    created_at: head.try_get("created_at")?,
                    cancelled: head.try_get("cancelled")?,
                    open_cases: head.try_get("open_cases")?,
                    cases,
                }))
            }

            async fn list_eval_runs(&self, app: &str) -> StoreResult<Vec<String>> {
                let mut ids: Vec<String> =
                    sqlx::query_scalar("SELECT eval_run_id FROM eval_runs WHERE app_name = $1")
                        .bind(app)
                        .fetch_all(&self.$reader)
                        .await?;
                // By bytes, as Python's `sorted` (a PostgreSQL collation would sort otherwise).
                ids.sort();
                Ok(ids)
            }

            async fn delete_eval_run(&self, app: &str, run_id: &str) -> StoreResult<bool> {
                let mut tx = self.$writer.begin_with($begin).await?;
                let gone = Self::delete_run_rows(&mut tx, app, run_id).await?;
                tx.commit().await?;
                Ok(gone)
            }
        }
    };
}

/// The run's rows, both tables, in the caller's transaction; whether there was a run.
macro_rules! delete_run_rows {
    ($store:ty, $db:ty) => {
        impl $store {
            async fn delete_run_rows(
                tx: &mut sqlx::Transaction<'_, $db>,
                app: &str,
                run_id: &str,
            ) -> StoreResult<bool> {
                let gone =
                    sqlx::query("DELETE FROM eval_runs WHERE app_name = $1 AND eval_run_id = $2")
                        .bind(app)
                        .bind(run_id)
                        .execute(&mut **tx)
                        .await?
                        .rows_affected();
                sqlx::query("DELETE FROM eval_run_cases WHERE app_name = $1 AND eval_run_id = $2")
                    .bind(app)
                    .bind(run_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(gone > 0)
            }
        }
    };
}

delete_run_rows!(PgStore, sqlx::Postgres);
delete_run_rows!(SqliteStore, sqlx::Sqlite);

eval_run_store!(
    PgStore,
    pool,
    pool,
    "BEGIN",
    "BEGIN ISOLATION LEVEL REPEATABLE READ",
    "SELECT pg_advisory_xact_lock(hashtext('agentd_eval_runs:' || $1))"
);
eval_run_store!(
    SqliteStore,
    writer,
    reader,
    "BEGIN IMMEDIATE",
    "BEGIN",
    "SELECT $1"
);
