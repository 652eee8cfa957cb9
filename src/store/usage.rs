//! Usage and budgets in the database (docs/usage.md): the daily aggregates the statement that
//! ends a run writes (`usage_daily`, and `usage_keys` for a run an API key started), reports
//! over them, and the budgets admission and every model call check (`budgets` rows for users
//! and apps, the key's own row for a key).
//!
//! The SQL is the same on both backends where it can be (SQLite binds `$N` by position too),
//! so one macro writes both implementations; the JSON of a run's usage is read with each
//! backend's own functions.

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::{StoreError, StoreResult};
use crate::usage::{day_date, Budget, Exhausted, Limit, Payer, RunUsage, Spent, Window};
use async_trait::async_trait;
use sqlx::Row;
use std::collections::BTreeMap;

/// The notification channel a budget's change is announced on (PostgreSQL).
pub const BUDGETS_CHANNEL: &str = "agentd_budgets";

/// The most groups one report returns (a month of one user by session can hold more: the
/// report says it is cut).
pub const MAX_USAGE_GROUPS: i64 = 1_000;

/// How a usage report groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    Day,
    Model,
    Session,
    User,
    App,
    /// The API key the runs were charged to (runs started without a key are not in it).
    Key,
}

/// What a report covers: an app and a user (or every one: admins), days `from..=to`.
#[derive(Debug, Clone)]
pub struct UsageQuery {
    pub app: Option<String>,
    pub user: Option<String>,
    pub from_day: i64,
    pub to_day: i64,
    pub group_by: GroupBy,
}

/// One group of a report.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    /// The day (`YYYY-MM-DD`), model, session, user, app or API key.
    pub key: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    pub reasoning_tokens: u64,
    pub model_calls: u64,
    /// Runs that ended in the period having called a model (by model: that model).
    pub runs: u64,
    /// `null` when part of it was spent on a model without a price.
    pub cost: Option<f64>,
}

impl UsageRow {
    /// Adds `other` into `self` (a report's total).
    pub fn add(&mut self, other: &UsageRow) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_tokens += other.cached_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.model_calls += other.model_calls;
        self.runs += other.runs;
        self.cost = match (self.cost, other.cost) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
    }
}

#[async_trait]
pub trait UsageStore: Send + Sync + 'static {
    /// A report: at most [`MAX_USAGE_GROUPS`] + 1 groups, ordered by key.
    async fn usage_report(&self, q: &UsageQuery) -> StoreResult<Vec<UsageRow>>;
    async fn budget(&self, payer: &Payer) -> StoreResult<Option<Budget>>;
    async fn set_budget(&self, payer: &Payer, budget: &Budget, at: f64) -> StoreResult<()>;
    /// False when there was none.
    async fn delete_budget(&self, payer: &Payer) -> StoreResult<bool>;
    /// What the payer spent in `w`'s windows: ended runs' aggregates and what its running
    /// runs have committed so far, in one read.
    async fn spent(&self, payer: &Payer, w: &Window) -> StoreResult<Spent>;
    /// Adds one model call made outside any run (memory extraction) to the user's
    /// `usage_daily` row of `model` on `day`: its tokens, one call, its cost (or one unpriced
    /// call), no run. So the user's reports show it and their budgets count it.
    async fn charge_call(&self, call: &OutsideCall<'_>) -> StoreResult<()>;
}

/// A model call made for a user outside any run ([`UsageStore::charge_call`]).
#[derive(Debug, Clone, Copy)]
pub struct OutsideCall<'a> {
    pub app: &'a str,
    pub user: &'a str,
    pub model: &'a str,
    /// Days since 1970-01-01, UTC.
    pub day: i64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// What it cost at the operator's prices; `None` when the model has no price.
    pub cost: Option<f64>,
}

/// A report over `usage_daily` grouped by `key` (a column or expression). Parameters: $1 from
/// day, $2 to day, $3 app, $4 user, $5 limit. The '' model's rows count runs; the others
/// count tokens (and, grouped by model, the runs that called it).
pub fn daily_sql(key: &str, q: &UsageQuery) -> String {
    let by_model = q.group_by == GroupBy::Model;
    let runs_from = if by_model {
        "model <> ''"
    } else {
        "model = ''"
    };
    // A user's report names the user in the statement itself: one shard on Citus.
    let app = if q.app.is_some() {
        "app_name = $3"
    } else {
        "$3 IS NULL"
    };
    let user = if q.user.is_some() {
        "user_id = $4"
    } else {
        "$4 IS NULL"
    };
    format!(
        "SELECT CAST({key} AS TEXT) AS key,
                CAST(COALESCE(sum(input_tokens) FILTER (WHERE model <> ''), 0) AS BIGINT) AS input_tokens,
                CAST(COALESCE(sum(output_tokens) FILTER (WHERE model <> ''), 0) AS BIGINT) AS output_tokens,
                CAST(COALESCE(sum(cached_tokens) FILTER (WHERE model <> ''), 0) AS BIGINT) AS cached_tokens,
                CAST(COALESCE(sum(reasoning_tokens) FILTER (WHERE model <> ''), 0) AS BIGINT) AS reasoning_tokens,
                CAST(COALESCE(sum(model_calls) FILTER (WHERE model <> ''), 0) AS BIGINT) AS model_calls,
                CAST(COALESCE(sum(runs) FILTER (WHERE {runs_from}), 0) AS BIGINT) AS runs,
                CASE WHEN COALESCE(sum(unpriced_calls), 0) > 0 THEN NULL
                     ELSE CAST(COALESCE(sum(cost) FILTER (WHERE model <> ''), 0) AS DOUBLE PRECISION) END AS cost
           FROM usage_daily
          WHERE day >= $1 AND day <= $2 AND {app} AND {user} {models}
          GROUP BY 1 ORDER BY 1 LIMIT $5",
        models = if by_model { "AND model <> ''" } else { "" },
    )
}

/// A user's budget in an app ($1 app, $2 user), or an app's (user '').
pub const BUDGET_SQL: &str = "SELECT tokens_per_day, cost_per_month FROM budgets
  WHERE app_name = $1 AND user_id = $2";

/// A user's report by session, from the ended runs' own records. Parameters as
/// [`daily_sql`]'s.
pub const PG_BY_SESSION: &str = "SELECT r.session_id AS key,
        CAST(COALESCE(sum((m.value->>'inputTokens')::bigint), 0) AS BIGINT) AS input_tokens,
        CAST(COALESCE(sum((m.value->>'outputTokens')::bigint), 0) AS BIGINT) AS output_tokens,
        CAST(COALESCE(sum((m.value->>'cachedTokens')::bigint), 0) AS BIGINT) AS cached_tokens,
        CAST(COALESCE(sum((m.value->>'reasoningTokens')::bigint), 0) AS BIGINT) AS reasoning_tokens,
        CAST(COALESCE(sum((m.value->>'modelCalls')::bigint), 0) AS BIGINT) AS model_calls,
        CAST(count(DISTINCT r.id) AS BIGINT) AS runs,
        CASE WHEN COALESCE(sum((m.value->>'unpricedCalls')::bigint), 0) > 0 THEN NULL
             ELSE COALESCE(sum((m.value->>'pricedCost')::double precision), 0) END AS cost
   FROM runs r CROSS JOIN LATERAL jsonb_each(r.usage) m
  WHERE r.app_name = $3 AND r.user_id = $4 AND r.usage IS NOT NULL
    AND r.finished_at >= $1 * 86400.0 AND r.finished_at < ($2 + 1) * 86400.0
  GROUP BY r.session_id ORDER BY 1 LIMIT $5";

const SQLITE_BY_SESSION: &str = "SELECT r.session_id AS key,
        CAST(COALESCE(sum(json_extract(m.value, '$.inputTokens')), 0) AS BIGINT) AS input_tokens,
        CAST(COALESCE(sum(json_extract(m.value, '$.outputTokens')), 0) AS BIGINT) AS output_tokens,
        CAST(COALESCE(sum(json_extract(m.value, '$.cachedTokens')), 0) AS BIGINT) AS cached_tokens,
        CAST(COALESCE(sum(json_extract(m.value, '$.reasoningTokens')), 0) AS BIGINT) AS reasoning_tokens,
        CAST(COALESCE(sum(json_extract(m.value, '$.modelCalls')), 0) AS BIGINT) AS model_calls,
        CAST(count(DISTINCT r.id) AS BIGINT) AS runs,
        CASE WHEN COALESCE(sum(json_extract(m.value, '$.unpricedCalls')), 0) > 0 THEN NULL
             ELSE CAST(COALESCE(sum(json_extract(m.value, '$.pricedCost')), 0) AS REAL) END AS cost
   FROM runs r, json_each(r.usage) m
  WHERE r.app_name = $3 AND r.user_id = $4 AND r.usage IS NOT NULL AND r.status <> 'running'
    AND r.finished_at >= $1 * 86400.0 AND r.finished_at < ($2 + 1) * 86400.0
  GROUP BY r.session_id ORDER BY 1 LIMIT $5";

/// What a payer spent: $1 app, $2 user, $3 key ([`Payer::columns`]; every one is named so
/// that both backends bind the same three), $4 today, $5 the month's first day. The running
/// runs' usage comes back as one JSON array. A user's spending, and a key's that acts as one
/// user, is read where the user's rows are (one shard on Citus); an app's and an admin key's
/// are every user's (docs/usage.md#budgets).
pub fn spent_sql(payer: &Payer, postgres: bool) -> String {
    // PostgreSQL keeps a running run on its session row, with the key written for that run.
    // The running runs of an app or an admin key are read from an index of running runs only
    // (`active_run >= ''` is true of every one): never every session of the app. The app is
    // named through an expression no index has, for the same reason (and, in `usage_daily`,
    // the one `usage_daily_by_app` has).
    let pg_key = "run_key = $3 AND run_key_run = active_run";
    let all_running = match postgres {
        true => " AND active_run >= ''",
        false => "",
    };
    let (table, filter, running) = match payer {
        Payer::User { .. } => (
            "usage_daily",
            "app_name = $1 AND user_id = $2 AND $3 = '' AND model <> ''",
            "app_name = $1 AND user_id = $2 AND $3 = ''".to_string(),
        ),
        Payer::App { .. } => (
            "usage_daily",
            "(app_name || '/') = ($1 || '/') AND $2 = '' AND $3 = '' AND model <> ''",
            format!("(app_name || '/') = ($1 || '/') AND $2 = '' AND $3 = ''{all_running}"),
        ),
        Payer::Key { user: Some(_), .. } => (
            "usage_keys",
            "$1 = '' AND user_id = $2 AND key_id = $3",
            match postgres {
                true => format!("$1 = '' AND user_id = $2 AND {pg_key}"),
                false => "$1 = '' AND user_id = $2 AND key_id = $3".to_string(),
            },
        ),
        Payer::Key { user: None, .. } => (
            "usage_keys",
            "$1 = '' AND $2 = '' AND key_id = $3",
            match postgres {
                true => format!("$1 = '' AND $2 = '' AND {pg_key}{all_running}"),
                false => "$1 = '' AND $2 = '' AND key_id = $3".to_string(),
            },
        ),
    };
    let (cost_type, running_usage) = match postgres {
        true => (
            "DOUBLE PRECISION",
            format!(
                "SELECT CAST(jsonb_agg(run_usage) AS TEXT) FROM sessions
                  WHERE {running} AND active_run IS NOT NULL AND run_usage IS NOT NULL"
            ),
        ),
        false => (
            "REAL",
            format!(
                "SELECT json_group_array(json(usage)) FROM runs
                  WHERE {running} AND status = 'running' AND usage IS NOT NULL"
            ),
        ),
    };
    format!(
        "SELECT
    CAST(COALESCE((SELECT sum(input_tokens + output_tokens) FROM {table}
                    WHERE {filter} AND day = $4), 0) AS BIGINT) AS tokens_today,
    CAST(COALESCE((SELECT sum(cost) FROM {table}
                    WHERE {filter} AND day >= $5 AND day <= $4), 0) AS {cost_type})
        AS cost_this_month,
    ({running_usage}) AS running"
    )
}

/// Everyone's report by the API key the runs were charged to (runs without a key are not in
/// it). Parameters as [`daily_sql`]'s ($4, the user, is NULL: admins only).
pub fn by_key_sql(q: &UsageQuery) -> String {
    let app = match q.app.is_some() {
        true => "app_name = $3",
        false => "$3 IS NULL",
    };
    format!(
        "SELECT key_id AS key,
                CAST(COALESCE(sum(input_tokens), 0) AS BIGINT) AS input_tokens,
                CAST(COALESCE(sum(output_tokens), 0) AS BIGINT) AS output_tokens,
                CAST(COALESCE(sum(cached_tokens), 0) AS BIGINT) AS cached_tokens,
                CAST(COALESCE(sum(reasoning_tokens), 0) AS BIGINT) AS reasoning_tokens,
                CAST(COALESCE(sum(model_calls), 0) AS BIGINT) AS model_calls,
                CAST(COALESCE(sum(runs), 0) AS BIGINT) AS runs,
                CASE WHEN COALESCE(sum(unpriced_calls), 0) > 0 THEN NULL
                     ELSE CAST(COALESCE(sum(cost), 0) AS DOUBLE PRECISION) END AS cost
           FROM usage_keys
          WHERE day >= $1 AND day <= $2 AND {app} AND ($4 IS NULL OR user_id = $4)
          GROUP BY 1 ORDER BY 1 LIMIT $5"
    )
}

/// A key's budget, on its row: $1 the key.
pub const KEY_BUDGET_SQL: &str =
    "SELECT budget_tokens_per_day AS tokens_per_day, budget_cost_per_month AS cost_per_month
       FROM api_keys WHERE id = $1 AND (budget_tokens_per_day IS NOT NULL
                                        OR budget_cost_per_month IS NOT NULL)";

fn read_row<R: Row>(row: &R, by_day: bool) -> StoreResult<UsageRow>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    f64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let n = |c: &str| -> StoreResult<u64> { Ok(row.try_get::<i64, _>(c)?.max(0) as u64) };
    let key: String = row.try_get("key")?;
    Ok(UsageRow {
        key: match by_day {
            true => key
                .parse::<i64>()
                .map(|d| day_date(d).to_string())
                .unwrap_or(key),
            false => key,
        },
        input_tokens: n("input_tokens")?,
        output_tokens: n("output_tokens")?,
        cached_tokens: n("cached_tokens")?,
        reasoning_tokens: n("reasoning_tokens")?,
        model_calls: n("model_calls")?,
        runs: n("runs")?,
        cost: row.try_get("cost")?,
    })
}

/// The spending of the running runs (their usage as one JSON array) added to the aggregates'.
fn with_running(mut spent: Spent, running: Option<String>) -> Spent {
    let runs: Vec<Option<RunUsage>> = running
        .and_then(|r| serde_json::from_str(&r).ok())
        .unwrap_or_default();
    for u in runs.into_iter().flatten() {
        let t = u.totals();
        spent.tokens_today = spent
            .tokens_today
            .saturating_add(t.input_tokens + t.output_tokens);
        spent.cost_this_month += u.priced_cost();
    }
    spent
}

macro_rules! usage_store {
    ($store:ty, $writer:ident, $reader:ident, $by_session:expr, $postgres:expr) => {
        #[async_trait]
        impl UsageStore for $store {
            async fn usage_report(&self, q: &UsageQuery) -> StoreResult<Vec<UsageRow>> {
                let sql = match q.group_by {
                    GroupBy::Session => $by_session.to_string(),
                    GroupBy::Day => daily_sql("day", q),
                    GroupBy::Model => daily_sql("model", q),
                    GroupBy::User => daily_sql("user_id", q),
                    GroupBy::App => daily_sql("app_name", q),
                    GroupBy::Key => by_key_sql(q),
                };
                let rows = sqlx::query(&sql)
                    .bind(q.from_day)
                    .bind(q.to_day)
                    .bind(&q.app)
                    .bind(&q.user)
                    .bind(MAX_USAGE_GROUPS + 1)
                    .fetch_all(&self.$reader)
                    .await?;
                rows.iter()
                    .map(|r| read_row(r, q.group_by == GroupBy::Day))
                    .collect()
            }

            async fn budget(&self, payer: &Payer) -> StoreResult<Option<Budget>> {
                let (app, user, key) = payer.columns();
                let row = match payer {
                    Payer::Key { .. } => sqlx::query(KEY_BUDGET_SQL).bind(key),
                    _ => sqlx::query(BUDGET_SQL).bind(app).bind(user),
                }
                .fetch_optional(&self.$reader)
                .await?;
                row.map(|r| {
                    Ok(Budget {
                        tokens_per_day: r
                            .try_get::<Option<i64>, _>("tokens_per_day")?
                            .map(|t| t.max(0) as u64),
                        cost_per_month: r.try_get("cost_per_month")?,
                    })
                })
                .transpose()
            }

            async fn set_budget(&self, payer: &Payer, budget: &Budget, at: f64) -> StoreResult<()> {
                let (app, user, key) = payer.columns();
                let tokens = budget.tokens_per_day.map(|t| t.min(i64::MAX as u64) as i64);
                match payer {
                    Payer::Key { .. } => sqlx::query(
                        "UPDATE api_keys SET budget_tokens_per_day = $2, budget_cost_per_month = $3
                          WHERE id = $1",
                    )
                    .bind(key)
                    .bind(tokens)
                    .bind(budget.cost_per_month),
                    _ => sqlx::query(
                        "INSERT INTO budgets (app_name, user_id, tokens_per_day, cost_per_month,
                                              update_time)
                         VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (app_name, user_id) DO UPDATE
                            SET tokens_per_day = excluded.tokens_per_day,
                                cost_per_month = excluded.cost_per_month,
                                update_time = excluded.update_time",
                    )
                    .bind(app)
                    .bind(user)
                    .bind(tokens)
                    .bind(budget.cost_per_month)
                    .bind(at),
                }
                .execute(&self.$writer)
                .await?;
                self.budget_changed().await;
                Ok(())
            }

            async fn delete_budget(&self, payer: &Payer) -> StoreResult<bool> {
                let (app, user, key) = payer.columns();
                let done = match payer {
                    Payer::Key { .. } => sqlx::query(
                        "UPDATE api_keys SET budget_tokens_per_day = NULL, budget_cost_per_month = NULL
                          WHERE id = $1 AND (budget_tokens_per_day IS NOT NULL
                                             OR budget_cost_per_month IS NOT NULL)",
                    )
                    .bind(key),
                    _ => sqlx::query("DELETE FROM budgets WHERE app_name = $1 AND user_id = $2")
                        .bind(app)
                        .bind(user),
                }
                .execute(&self.$writer)
                .await?;
                self.budget_changed().await;
                Ok(done.rows_affected() > 0)
            }

            async fn spent(&self, payer: &Payer, w: &Window) -> StoreResult<Spent> {
                let (app, user, key) = payer.columns();
                let row = sqlx::query(&spent_sql(payer, $postgres))
                    .bind(app)
                    .bind(user)
                    .bind(key)
                    .bind(w.today)
                    .bind(w.month_first)
                    .fetch_one(&self.$reader)
                    .await?;
                let spent = Spent {
                    tokens_today: row.try_get::<i64, _>("tokens_today")?.max(0) as u64,
                    cost_this_month: row.try_get("cost_this_month")?,
                };
                Ok(with_running(spent, row.try_get("running")?))
            }

            async fn charge_call(&self, call: &OutsideCall<'_>) -> StoreResult<()> {
                sqlx::query(
                    "INSERT INTO usage_daily AS t (app_name, user_id, day, model, input_tokens,
                                                   output_tokens, model_calls, cost,
                                                   unpriced_calls)
                     VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8)
                     ON CONFLICT (app_name, user_id, day, model) DO UPDATE
                        SET input_tokens = t.input_tokens + excluded.input_tokens,
                            output_tokens = t.output_tokens + excluded.output_tokens,
                            model_calls = t.model_calls + 1,
                            cost = t.cost + excluded.cost,
                            unpriced_calls = t.unpriced_calls + excluded.unpriced_calls",
                )
                .bind(call.app)
                .bind(call.user)
                .bind(call.day)
                .bind(call.model)
                .bind(call.input_tokens.min(i64::MAX as u64) as i64)
                .bind(call.output_tokens.min(i64::MAX as u64) as i64)
                .bind(call.cost.unwrap_or(0.0))
                .bind(i64::from(call.cost.is_none()))
                .execute(&self.$writer)
                .await?;
                Ok(())
            }
        }
    };
}

impl PgStore {
    /// Tells every replica that a budget changed (they read it again: the runner's budget
    /// cache listens on this channel). On the coordinator, after the write: a notification
    /// from a Citus worker would reach nobody. A lost one is covered by the cache's age limit.
    async fn budget_changed(&self) {
        if let Err(e) = sqlx::query("SELECT pg_notify($1, '')")
            .bind(BUDGETS_CHANNEL)
            .execute(self.pool())
            .await
        {
            tracing::warn!(error = %e, "could not announce a budget change; replicas see it within their cache's age limit");
        }
    }
}

impl SqliteStore {
    /// One process: the runner marks its own cache stale.
    async fn budget_changed(&self) {}
}

usage_store!(PgStore, pool, pool, PG_BY_SESSION, true);
usage_store!(SqliteStore, writer, reader, SQLITE_BY_SESSION, false);

/// Whether any of `limits` is spent: what the database says each payer spent now, plus
/// `unsaved` (tokens, cost) the run has not committed yet. When several are, the one that
/// resets last (spending is allowed again only when every one has reset). The one check
/// admission and every model call make; no read when there are no limits.
pub async fn exhausted(
    store: &dyn UsageStore,
    limits: &[Limit],
    unsaved: (u64, f64),
) -> StoreResult<Option<Exhausted>> {
    let w = Window::now();
    let mut worst: Option<Exhausted> = None;
    for limit in limits {
        let mut spent = store.spent(&limit.payer, &w).await?;
        spent.tokens_today = spent.tokens_today.saturating_add(unsaved.0);
        spent.cost_this_month += unsaved.1;
        if let Some(reset) = limit.budget.exhausted(&spent, &w) {
            if worst.as_ref().is_none_or(|e| reset > e.reset) {
                worst = Some(Exhausted {
                    payer: limit.payer.clone(),
                    reset,
                });
            }
        }
    }
    Ok(worst)
}

/// The budget (the user's in `app`, or the app's) that is spent, and until when; `None` when
/// a model may be called for `user` outside a run (memory's calls, an eval's judge). Two
/// budget reads, and one of spending per budget set: such calls are rarer than a run's
/// admissions, so they are not cached as those are.
pub async fn spent_budget(
    store: &dyn super::Store,
    app: &str,
    user: &str,
) -> StoreResult<Option<Exhausted>> {
    Ok(spent_budgets(store, app, [user]).await?.remove(user))
}

/// [`spent_budget`] for several users of one app (the embedder's batch): the app's budget,
/// and its spending when set, read once, then each user's. Each user whose budget or the
/// app's is spent, with the one that resets last (the user's on a tie).
pub async fn spent_budgets<'a>(
    store: &dyn super::Store,
    app: &str,
    users: impl IntoIterator<Item = &'a str>,
) -> StoreResult<BTreeMap<String, Exhausted>> {
    let limit = |payer: Payer| async move {
        Ok::<_, StoreError>(
            store
                .budget(&payer)
                .await?
                .map(|budget| Limit { payer, budget }),
        )
    };
    let app_limit = limit(Payer::App {
        app: app.to_string(),
    })
    .await?;
    let app_spent = exhausted(store, app_limit.as_slice(), (0, 0.0)).await?;
    let mut spent = BTreeMap::new();
    for user in users {
        let user_limit = limit(Payer::User {
            app: app.to_string(),
            user: user.to_string(),
        })
        .await?;
        let user_spent = exhausted(store, user_limit.as_slice(), (0, 0.0)).await?;
        // As `exhausted` picks: the later reset, the first (the user's) on a tie.
        let worst = user_spent
            .into_iter()
            .chain(app_spent.clone())
            .reduce(|w, e| if e.reset > w.reset { e } else { w });
        if let Some(worst) = worst {
            spent.insert(user.to_string(), worst);
        }
    }
    Ok(spent)
}

/// Seconds until `reset` (a Unix time), at least one.
pub fn retry_after(reset: i64, now: f64) -> u64 {
    ((reset as f64 - now).ceil() as i64).max(1) as u64
}
