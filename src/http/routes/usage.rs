//! What users spent (docs/usage.md): a user's usage report
//! (`GET /apps/{app}/users/{user}/usage`) and everyone's for admins (`GET /usage`). What they
//! may spend is in [`super::budgets`].

use crate::auth::Caller;
use crate::http::error::{problem, ApiError, ApiResult};
use crate::http::extract::{validate_id, Path, Query};
use crate::http::openapi::{error_set, Errors, UserPath};
use crate::http::AppState;
use crate::store::usage::MAX_USAGE_GROUPS;
use crate::store::{GroupBy, UsageQuery, UsageRow};
use crate::usage::{date_day, Window};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `GET /apps/{app}/users/{user}/usage` answers beyond the door's codes.
    UserUsageErrors: AppNotFound, NotFound, InvalidId, ValidationError
);

error_set!(
    /// What `GET /usage` answers beyond the door's codes.
    AllUsageErrors: AdminRequired, ValidationError, InvalidId
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(user_usage))
        .routes(routes!(all_usage))
}

/// The longest period one report covers.
pub const MAX_REPORT_DAYS: i64 = 366;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// First day (`YYYY-MM-DD`, UTC); the current month's first by default.
    from: Option<String>,
    /// Last day, included (`YYYY-MM-DD`, UTC); today by default.
    to: Option<String>,
    /// `day`, `model` or `session` for a user; `user`, `app`, `model`, `day` or `key` (the
    /// API key the runs were charged to; runs without a key are not in it) for admins.
    #[param(inline)]
    group_by: Option<GroupBy>,
    /// Admins' report only: one app.
    app: Option<String>,
}

/// A usage report: one entry per group, and their total.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    usage: Vec<UsageRow>,
    total: UsageRow,
    from: String,
    to: String,
    /// The prices' currency, when the server has prices.
    #[serde(skip_serializing_if = "Option::is_none")]
    currency: Option<String>,
    /// More groups than one report holds: the rest are left out (and out of `total`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

/// A user's usage in an app by day, model or session.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/usage", tag = "usage",
    params(UserPath, UsageParams),
    responses((status = 200, description = "The report.", body = UsageReport), Errors, UserUsageErrors))]
async fn user_usage(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
    Query(q): Query<UsageParams>,
) -> ApiResult<axum::Json<UsageReport>> {
    if q.app.is_some() {
        return Err(invalid("app", "`app` is the path's here"));
    }
    let group_by = q.group_by.unwrap_or(GroupBy::Day);
    if !matches!(group_by, GroupBy::Day | GroupBy::Model | GroupBy::Session) {
        return Err(invalid(
            "groupBy",
            "a user's report groups by day, model or session",
        ));
    }
    report(&state, Some(app), Some(user), &q, group_by).await
}

/// Everyone's usage by user, app, model or day (admins).
#[utoipa::path(get, path = "/usage", tag = "usage",
    params(UsageParams),
    responses((status = 200, description = "The report.", body = UsageReport), Errors, AllUsageErrors))]
async fn all_usage(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Query(q): Query<UsageParams>,
) -> ApiResult<axum::Json<UsageReport>> {
    crate::http::auth::require_admin(&caller, "Everyone's usage")?;
    if let Some(app) = &q.app {
        validate_id("app", app)?;
    }
    let group_by = q.group_by.unwrap_or(GroupBy::User);
    if group_by == GroupBy::Session {
        return Err(invalid(
            "groupBy",
            "everyone's report groups by user, app, model, day or key",
        ));
    }
    report(&state, q.app.clone(), None, &q, group_by).await
}

async fn report(
    state: &AppState,
    app: Option<String>,
    user: Option<String>,
    q: &UsageParams,
    group_by: GroupBy,
) -> ApiResult<axum::Json<UsageReport>> {
    let w = Window::now();
    let from_day = match &q.from {
        Some(d) => parse_day("from", d)?,
        None => w.month_first,
    };
    let to_day = match &q.to {
        Some(d) => parse_day("to", d)?,
        None => w.today,
    };
    if to_day < from_day {
        return Err(invalid("to", "`to` is before `from`"));
    }
    if to_day - from_day >= MAX_REPORT_DAYS {
        return Err(invalid(
            "to",
            format!("one report covers at most {MAX_REPORT_DAYS} days"),
        ));
    }
    let query = UsageQuery {
        app,
        user,
        from_day,
        to_day,
        group_by,
    };
    let mut usage = state.store.usage_report(&query).await?;
    let truncated = usage.len() as i64 > MAX_USAGE_GROUPS;
    usage.truncate(MAX_USAGE_GROUPS as usize);
    let mut total = UsageRow {
        key: "total".into(),
        cost: Some(0.0),
        ..UsageRow::default()
    };
    // Runs by model count a run once per model it called: the total counts runs once.
    for row in &usage {
        total.add(row);
    }
    if group_by == GroupBy::Model {
        total.runs = runs_in(state, &query).await?;
    }
    Ok(axum::Json(UsageReport {
        usage,
        total,
        from: crate::usage::day_date(from_day).to_string(),
        to: crate::usage::day_date(to_day).to_string(),
        currency: state.runner.prices().currency.clone(),
        truncated,
    }))
}

/// Runs in a report's period, counted once each (by day, not by model).
async fn runs_in(state: &AppState, q: &UsageQuery) -> ApiResult<u64> {
    let by_day = UsageQuery {
        group_by: GroupBy::Day,
        ..q.clone()
    };
    let rows = state.store.usage_report(&by_day).await?;
    Ok(rows.iter().map(|r| r.runs).sum())
}

fn parse_day(field: &str, s: &str) -> ApiResult<i64> {
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map(date_day)
        .map_err(|_| invalid(field, format!("`{s}` is not a date (YYYY-MM-DD)")))
}

fn invalid(field: &str, msg: impl Into<String>) -> ApiError {
    ApiError::validation(vec![problem(
        "query_invalid",
        vec![json!("query"), json!(field)],
        msg,
    )])
}
