//! Eval sets and their cases (docs/evals.md), per app: a set's head (its `*.evalset.json`
//! without the cases) in `eval_sets`, one row per case in `eval_cases`, in the order they
//! were added. Both hold JSON as text, in ADK's file form: `jsonb` would reorder the keys,
//! and an exported file must be the file that was imported.
//!
//! On Citus both tables are distributed by `app_name` and colocated, so every statement
//! here, and every transaction, runs on the one worker that holds the app's sets.
//!
//! The SQL is the same on both backends, so one macro writes both implementations.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::StoreResult;
use async_trait::async_trait;
use sqlx::Row;

/// A stored eval set: its head and its cases (id, file-form JSON), in order.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvalSet {
    pub head: String,
    pub cases: Vec<(String, String)>,
}

/// How writing a set went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetWrite {
    Created,
    Replaced,
    /// Creating only, and the id is taken: nothing was written.
    Exists,
    /// The app has as many sets as it may: nothing was written.
    Full,
}

/// How a case's read or write went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseWrite {
    Done,
    NoSet,
    NoCase,
    /// Adding, and the case id is taken in the set.
    Exists,
    /// The set has as many cases as it may.
    Full,
}

#[async_trait]
pub trait EvalStore: Send + Sync + 'static {
    /// The app's set ids, sorted.
    async fn list_eval_sets(&self, app: &str) -> StoreResult<Vec<String>>;
    async fn eval_set(&self, app: &str, set: &str) -> StoreResult<Option<StoredEvalSet>>;
    /// The set's case ids, sorted by their bytes; `None` when there is no such set.
    async fn eval_case_ids(&self, app: &str, set: &str) -> StoreResult<Option<Vec<String>>>;
    /// Writes a set with its cases: creates it (unless the app has `max_sets`), or, with
    /// `replace`, replaces one of that id whole (its creation time kept).
    async fn put_eval_set(
        &self,
        app: &str,
        set: &str,
        stored: &StoredEvalSet,
        replace: bool,
        max_sets: usize,
        now: f64,
    ) -> StoreResult<SetWrite>;
    /// Deletes a set and its cases; false when there was none.
    async fn delete_eval_set(&self, app: &str, set: &str) -> StoreResult<bool>;
    /// One case's JSON; `Err` says whether the set or the case is missing.
    async fn eval_case(
        &self,
        app: &str,
        set: &str,
        case: &str,
    ) -> StoreResult<Result<String, CaseWrite>>;
    /// Adds a case at the end of the set, unless it holds `max_cases`, or its cases would
    /// come to over `max_bytes`.
    async fn add_eval_case(
        &self,
        app: &str,
        set: &str,
        case: &str,
        body: &str,
        max_cases: usize,
        max_bytes: usize,
    ) -> StoreResult<CaseWrite>;
    /// Replaces a case in its place, unless the set's cases would come to over `max_bytes`.
    async fn update_eval_case(
        &self,
        app: &str,
        set: &str,
        case: &str,
        body: &str,
        max_bytes: usize,
    ) -> StoreResult<CaseWrite>;
    async fn delete_eval_case(&self, app: &str, set: &str, case: &str) -> StoreResult<CaseWrite>;
}

const SET_EXISTS: &str =
    "SELECT created_at FROM eval_sets WHERE app_name = $1 AND eval_set_id = $2";
const INSERT_CASE: &str = "INSERT INTO eval_cases (app_name, eval_set_id, eval_id, position, body)
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (app_name, eval_set_id, eval_id) DO NOTHING";

macro_rules! eval_store {
    ($store:ty, $db:ty, $writer:ident, $reader:ident, $begin:literal, $lock:literal,
     $snapshot:literal, $app_lock:literal) => {
        impl $store {
            /// The set's creation time, `None` if there is no such set; its row locked until
            /// the transaction ends (PostgreSQL; SQLite has one writer), so that writes to
            /// one set queue and what they counted holds until they commit.
            async fn locked_set_created(
                tx: &mut sqlx::Transaction<'_, $db>,
                app: &str,
                set: &str,
            ) -> StoreResult<Option<f64>> {
                Ok(sqlx::query_scalar(concat!(
                    "SELECT created_at FROM eval_sets WHERE app_name = $1 AND eval_set_id = $2",
                    $lock
                ))
                .bind(app)
                .bind(set)
                .fetch_optional(&mut **tx)
                .await?)
            }
        }

        #[async_trait]
        impl EvalStore for $store {
            async fn list_eval_sets(&self, app: &str) -> StoreResult<Vec<String>> {
                let mut ids: Vec<String> =
                    sqlx::query_scalar("SELECT eval_set_id FROM eval_sets WHERE app_name = $1")
                        .bind(app)
                        .fetch_all(&self.$reader)
                        .await?;
                // By bytes, as Python's `sorted` (a PostgreSQL collation would sort otherwise).
                ids.sort();
                Ok(ids)
            }

            async fn eval_case_ids(
                &self,
                app: &str,
                set: &str,
            ) -> StoreResult<Option<Vec<String>>> {
                let mut tx = self.$reader.begin_with($snapshot).await?;
                let found: Option<f64> = sqlx::query_scalar(SET_EXISTS)
                    .bind(app)
                    .bind(set)
                    .fetch_optional(&mut *tx)
                    .await?;
                if found.is_none() {
                    return Ok(None);
                }
                let mut ids: Vec<String> = sqlx::query_scalar(
                    "SELECT eval_id FROM eval_cases WHERE app_name = $1 AND eval_set_id = $2",
                )
                .bind(app)
                .bind(set)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                ids.sort();
                Ok(Some(ids))
            }

            async fn eval_set(
                &self,
                app: &str,
                set: &str,
            ) -> StoreResult<Option<StoredEvalSet>> {
                // One snapshot: the head and the cases of one moment.
                let mut tx = self.$reader.begin_with($snapshot).await?;
                let head: Option<String> = sqlx::query_scalar(
                    "SELECT head FROM eval_sets WHERE app_name = $1 AND eval_set_id = $2",
                )
                .bind(app)
                .bind(set)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(head) = head else {
                    return Ok(None);
                };
                let rows = sqlx::query(
                    "SELECT eval_id, body FROM eval_cases WHERE app_name = $1 AND eval_set_id = $2
                      ORDER BY position, eval_id",
                )
                .bind(app)
                .bind(set)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                let cases = rows
                    .iter()
                    .map(|r| Ok((r.try_get("eval_id")?, r.try_get("body")?)))
                    .collect::<Result<_, sqlx::Error>>()?;
                Ok(Some(StoredEvalSet { head, cases }))
            }

            async fn put_eval_set(
                &self,
                app: &str,
                set: &str,
                stored: &StoredEvalSet,
                replace: bool,
                max_sets: usize,
                now: f64,
            ) -> StoreResult<SetWrite> {
                let mut tx = self.$writer.begin_with($begin).await?;
                // Writes of one app's sets queue (PostgreSQL; SQLite has one writer): the
                // count of its sets, and whether the id is taken, hold until the commit.
                sqlx::query($app_lock).bind(app).execute(&mut *tx).await?;
                let created: Option<f64> = Self::locked_set_created(&mut tx, app, set).await?;
                let outcome = match created {
                    Some(_) if !replace => return Ok(SetWrite::Exists),
                    Some(_) => SetWrite::Replaced,
                    None => {
                        let sets: i64 =
                            sqlx::query_scalar("SELECT COUNT(*) FROM eval_sets WHERE app_name = $1")
                                .bind(app)
                                .fetch_one(&mut *tx)
                                .await?;
                        if sets as usize >= max_sets {
                            return Ok(SetWrite::Full);
                        }
                        SetWrite::Created
                    }
                };
                sqlx::query(
                    "INSERT INTO eval_sets (app_name, eval_set_id, head, created_at)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (app_name, eval_set_id) DO UPDATE SET head = excluded.head",
                )
                .bind(app)
                .bind(set)
                .bind(&stored.head)
                .bind(created.unwrap_or(now))
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM eval_cases WHERE app_name = $1 AND eval_set_id = $2")
                    .bind(app)
                    .bind(set)
                    .execute(&mut *tx)
                    .await?;
                for (i, (id, body)) in stored.cases.iter().enumerate() {
                    sqlx::query(INSERT_CASE)
                        .bind(app)
                        .bind(set)
                        .bind(id)
                        .bind(i as i64 + 1)
                        .bind(body)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(outcome)
            }

            async fn delete_eval_set(&self, app: &str, set: &str) -> StoreResult<bool> {
                let mut tx = self.$writer.begin_with($begin).await?;
                // The set's row first: an add to it, which locks that row, waits, then finds
                // no set, and leaves no case behind.
                let gone = sqlx::query(
                    "DELETE FROM eval_sets WHERE app_name = $1 AND eval_set_id = $2",
                )
                .bind(app)
                .bind(set)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                sqlx::query("DELETE FROM eval_cases WHERE app_name = $1 AND eval_set_id = $2")
                    .bind(app)
                    .bind(set)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(gone > 0)
            }

            async fn eval_case(
                &self,
                app: &str,
                set: &str,
                case: &str,
            ) -> StoreResult<Result<String, CaseWrite>> {
                let row = sqlx::query(
                    "SELECT s.eval_set_id, c.body FROM eval_sets s
                       LEFT JOIN eval_cases c ON c.app_name = s.app_name
                            AND c.eval_set_id = s.eval_set_id AND c.eval_id = $3
                      WHERE s.app_name = $1 AND s.eval_set_id = $2",
                )
                .bind(app)
                .bind(set)
                .bind(case)
                .fetch_optional(&self.$reader)
                .await?;
                Ok(match row {
                    None => Err(CaseWrite::NoSet),
                    Some(r) => match r.try_get::<Option<String>, _>("body")? {
                        Some(body) => Ok(body),
                        None => Err(CaseWrite::NoCase),
                    },
                })
            }

            async fn add_eval_case(
                &self,
                app: &str,
                set: &str,
                case: &str,
                body: &str,
                max_cases: usize,
                max_bytes: usize,
            ) -> StoreResult<CaseWrite> {
                let mut tx = self.$writer.begin_with($begin).await?;
                let found: Option<f64> = Self::locked_set_created(&mut tx, app, set).await?;
                if found.is_none() {
                    return Ok(CaseWrite::NoSet);
                }
                let row = sqlx::query(
                    "SELECT COUNT(*) AS n, COALESCE(MAX(position), 0) AS last,
                            COALESCE(SUM(LENGTH(body)), 0) AS bytes
                       FROM eval_cases WHERE app_name = $1 AND eval_set_id = $2",
                )
                .bind(app)
                .bind(set)
                .fetch_one(&mut *tx)
                .await?;
                let (n, last, bytes): (i64, i64, i64) =
                    (row.try_get("n")?, row.try_get("last")?, row.try_get("bytes")?);
                // Sizes as in `update_eval_case`.
                if n as usize >= max_cases || bytes as usize + body.len() > max_bytes {
                    return Ok(CaseWrite::Full);
                }
                let added = sqlx::query(INSERT_CASE)
                    .bind(app)
                    .bind(set)
                    .bind(case)
                    .bind(last + 1)
                    .bind(body)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if added == 0 {
                    return Ok(CaseWrite::Exists);
                }
                tx.commit().await?;
                Ok(CaseWrite::Done)
            }

            async fn update_eval_case(
                &self,
                app: &str,
                set: &str,
                case: &str,
                body: &str,
                max_bytes: usize,
            ) -> StoreResult<CaseWrite> {
                let mut tx = self.$writer.begin_with($begin).await?;
                let found: Option<f64> = Self::locked_set_created(&mut tx, app, set).await?;
                if found.is_none() {
                    return Ok(CaseWrite::NoSet);
                }
                // The stored cases' size in characters (LENGTH on both backends), the new
                // one's in bytes: a bound in characters, so at most 4 bytes of UTF-8 each.
                let others: i64 = sqlx::query_scalar(
                    "SELECT COALESCE(SUM(LENGTH(body)), 0) FROM eval_cases
                      WHERE app_name = $1 AND eval_set_id = $2 AND eval_id <> $3",
                )
                .bind(app)
                .bind(set)
                .bind(case)
                .fetch_one(&mut *tx)
                .await?;
                if others as usize + body.len() > max_bytes {
                    return Ok(CaseWrite::Full);
                }
                let changed = sqlx::query(
                    "UPDATE eval_cases SET body = $4
                      WHERE app_name = $1 AND eval_set_id = $2 AND eval_id = $3",
                )
                .bind(app)
                .bind(set)
                .bind(case)
                .bind(body)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(if changed > 0 { CaseWrite::Done } else { CaseWrite::NoCase })
            }

            async fn delete_eval_case(
                &self,
                app: &str,
                set: &str,
                case: &str,
            ) -> StoreResult<CaseWrite> {
                let mut tx = self.$writer.begin_with($begin).await?;
                let found: Option<f64> = sqlx::query_scalar(SET_EXISTS)
                    .bind(app)
                    .bind(set)
                    .fetch_optional(&mut *tx)
                    .await?;
                if found.is_none() {
                    return Ok(CaseWrite::NoSet);
                }
                let gone = sqlx::query(
                    "DELETE FROM eval_cases WHERE app_name = $1 AND eval_set_id = $2 AND eval_id = $3",
                )
                .bind(app)
                .bind(set)
                .bind(case)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(if gone > 0 { CaseWrite::Done } else { CaseWrite::NoCase })
            }
        }
    };
}

eval_store!(
    PgStore,
    sqlx::Postgres,
    pool,
    pool,
    "BEGIN",
    " FOR UPDATE",
    "BEGIN ISOLATION LEVEL REPEATABLE READ",
    "SELECT pg_advisory_xact_lock(hashtext('agentd_eval_sets:' || $1))"
);
eval_store!(
    SqliteStore,
    sqlx::Sqlite,
    writer,
    reader,
    "BEGIN IMMEDIATE",
    "",
    "BEGIN",
    "SELECT $1"
);
