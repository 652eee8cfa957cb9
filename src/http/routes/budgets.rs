//! What may be spent (docs/usage.md#budgets): budgets of a user in an app
//! (`/apps/{app}/users/{user}/budget`), of an app's users together (`/apps/{app}/budget`) and
//! of an API key (`/keys/{key}/budget`), each shown with what is spent in its windows.
//! Setting and removing one needs an admin; admission and every model call check them
//! ([`crate::runner::budgets`]).

use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::http::auth::{require_admin, served_app};
use crate::http::error::{problem, ApiError, ApiResult};
use crate::http::extract::{validate_id, Json, Path};
use crate::http::openapi::{error_set, Errors, UserPath};
use crate::http::AppState;
use crate::usage::{iso_time, Budget, Payer, Spent, Window, DAY_SECS};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `GET /apps/{app}/users/{user}/budget` answers beyond the door's codes.
    GetBudgetErrors: AppNotFound, NotFound, InvalidId
);

error_set!(
    /// What `PUT /apps/{app}/users/{user}/budget` answers beyond the door's codes.
    PutBudgetErrors: AppNotFound, NotFound, InvalidId, AdminRequired, ValidationError, JsonInvalid
);

error_set!(
    /// What `DELETE /apps/{app}/users/{user}/budget` answers beyond the door's codes.
    DeleteBudgetErrors: AppNotFound, NotFound, InvalidId, AdminRequired, BudgetNotFound
);

error_set!(
    /// What `GET /apps/{app}/budget` answers beyond the door's codes.
    GetAppBudgetErrors: AppNotFound, InvalidId, AdminRequired
);

error_set!(
    /// What `PUT /apps/{app}/budget` answers beyond the door's codes.
    PutAppBudgetErrors: AppNotFound, InvalidId, AdminRequired, ValidationError, JsonInvalid
);

error_set!(
    /// What `DELETE /apps/{app}/budget` answers beyond the door's codes.
    DeleteAppBudgetErrors: AppNotFound, InvalidId, AdminRequired, BudgetNotFound
);

error_set!(
    /// What `GET /keys/{key}/budget` answers beyond the door's codes.
    GetKeyBudgetErrors: KeyNotFound, InvalidId, AdminRequired
);

error_set!(
    /// What `PUT /keys/{key}/budget` answers beyond the door's codes.
    PutKeyBudgetErrors: KeyNotFound, InvalidId, AdminRequired, ValidationError, JsonInvalid
);

error_set!(
    /// What `DELETE /keys/{key}/budget` answers beyond the door's codes.
    DeleteKeyBudgetErrors: KeyNotFound, InvalidId, AdminRequired, BudgetNotFound
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_budget, put_budget, delete_budget))
        .routes(routes!(get_app_budget, put_app_budget, delete_app_budget))
        .routes(routes!(get_key_budget, put_key_budget, delete_key_budget))
}

/// A budget with what is spent in its windows and when they reset.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetView {
    /// Input plus output tokens per UTC day (`null`: no bound).
    tokens_per_day: Option<u64>,
    /// Cost per UTC calendar month, in the prices' currency (`null`: no bound).
    cost_per_month: Option<f64>,
    spent: Spent,
    /// When each bound's window starts again (RFC 3339, UTC).
    resets: Resets,
    /// Whether a bound is reached: runs are refused until it resets.
    exhausted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    currency: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resets {
    tokens_per_day: String,
    cost_per_month: String,
}

/// The path of an app.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct AppPath {
    /// The app's name.
    app: String,
}

/// The path of an API key.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct KeyPath {
    /// The key's id (the 16 hex digits after `agentd_`).
    key: String,
}

/// The user's budget in the app (its bounds `null` when none is set) and what is spent.
#[utoipa::path(get, path = "/apps/{app}/users/{user}/budget", tag = "usage",
    params(UserPath),
    responses((status = 200, description = "The budget.", body = BudgetView), Errors, GetBudgetErrors))]
async fn get_budget(
    state: axum::extract::State<AppState>,
    Path((app, user)): Path<(String, String)>,
) -> ApiResult<axum::Json<BudgetView>> {
    show(&state, &Payer::User { app, user }).await
}

/// Sets the user's budget in the app (admins): `tokensPerDay` and/or `costPerMonth`.
#[utoipa::path(put, path = "/apps/{app}/users/{user}/budget", tag = "usage",
    params(UserPath), request_body = Budget,
    responses((status = 200, description = "The budget as set.", body = BudgetView), Errors, PutBudgetErrors))]
async fn put_budget(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, user)): Path<(String, String)>,
    Json(budget): Json<Budget>,
) -> ApiResult<axum::Json<BudgetView>> {
    require_admin(&caller, "Setting a budget")?;
    // A budget for an app nobody runs would never apply: refused as schedules are.
    served_app(&state, &caller, &app)?;
    set(&state, &Payer::User { app, user }, budget).await
}

/// Removes the user's budget in the app (admins).
#[utoipa::path(delete, path = "/apps/{app}/users/{user}/budget", tag = "usage",
    params(UserPath),
    responses((status = 204, description = "Removed."), Errors, DeleteBudgetErrors))]
async fn delete_budget(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, user)): Path<(String, String)>,
) -> ApiResult<Response> {
    require_admin(&caller, "Removing a budget")?;
    remove(&state, &Payer::User { app, user }).await
}

/// The app's budget, every user of it together (admins), and what is spent.
#[utoipa::path(get, path = "/apps/{app}/budget", tag = "usage",
    params(AppPath),
    responses((status = 200, description = "The budget.", body = BudgetView), Errors, GetAppBudgetErrors))]
async fn get_app_budget(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<BudgetView>> {
    require_admin(&caller, "An app's budget")?;
    validate_id("app", &app)?;
    served_app(&state, &caller, &app)?;
    show(&state, &Payer::App { app }).await
}

/// Sets the app's budget (admins): `tokensPerDay` and/or `costPerMonth`, all its users together.
#[utoipa::path(put, path = "/apps/{app}/budget", tag = "usage",
    params(AppPath), request_body = Budget,
    responses((status = 200, description = "The budget as set.", body = BudgetView), Errors, PutAppBudgetErrors))]
async fn put_app_budget(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
    Json(budget): Json<Budget>,
) -> ApiResult<axum::Json<BudgetView>> {
    require_admin(&caller, "Setting a budget")?;
    validate_id("app", &app)?;
    served_app(&state, &caller, &app)?;
    set(&state, &Payer::App { app }, budget).await
}

/// Removes the app's budget (admins).
#[utoipa::path(delete, path = "/apps/{app}/budget", tag = "usage",
    params(AppPath),
    responses((status = 204, description = "Removed."), Errors, DeleteAppBudgetErrors))]
async fn delete_app_budget(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
) -> ApiResult<Response> {
    require_admin(&caller, "Removing a budget")?;
    validate_id("app", &app)?;
    remove(&state, &Payer::App { app }).await
}

/// An API key's budget, in every app it may use, and what is spent (admins, and the key
/// itself).
#[utoipa::path(get, path = "/keys/{key}/budget", tag = "usage",
    params(KeyPath),
    responses((status = 200, description = "The budget.", body = BudgetView), Errors, GetKeyBudgetErrors))]
async fn get_key_budget(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<axum::Json<BudgetView>> {
    if caller.api_key().is_none_or(|k| k.id != key) {
        require_admin(&caller, "Another key's budget")?;
    }
    let payer = key_payer(&state, &key).await?;
    show(&state, &payer).await
}

/// Sets an API key's budget (admins): `tokensPerDay` and/or `costPerMonth`.
#[utoipa::path(put, path = "/keys/{key}/budget", tag = "usage",
    params(KeyPath), request_body = Budget,
    responses((status = 200, description = "The budget as set.", body = BudgetView), Errors, PutKeyBudgetErrors))]
async fn put_key_budget(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Json(budget): Json<Budget>,
) -> ApiResult<axum::Json<BudgetView>> {
    require_admin(&caller, "Setting a budget")?;
    let payer = key_payer(&state, &key).await?;
    set(&state, &payer, budget).await
}

/// Removes an API key's budget (admins).
#[utoipa::path(delete, path = "/keys/{key}/budget", tag = "usage",
    params(KeyPath),
    responses((status = 204, description = "Removed."), Errors, DeleteKeyBudgetErrors))]
async fn delete_key_budget(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Response> {
    require_admin(&caller, "Removing a budget")?;
    let payer = key_payer(&state, &key).await?;
    remove(&state, &payer).await
}

/// The key's payer (its user is where its spending is kept); an unknown key is 404. A revoked
/// or expired key is still found: what it spent stays readable.
async fn key_payer(state: &AppState, id: &str) -> ApiResult<Payer> {
    validate_id("key", id)?;
    match state.store.find_api_key(id).await? {
        // An admin key acts for any user: its spending is every user's.
        Some(k) => Ok(Payer::Key {
            user: (!k.admin).then_some(k.user_id),
            id: k.id,
        }),
        None => Err(ApiError::new(
            ErrorCode::KeyNotFound,
            "No API key has this id",
        )),
    }
}

async fn set(state: &AppState, payer: &Payer, budget: Budget) -> ApiResult<axum::Json<BudgetView>> {
    if !budget.valid() {
        return Err(ApiError::validation(vec![problem(
            "value_error",
            vec![json!("body"), json!("costPerMonth")],
            "must be a number at or above zero",
        )]));
    }
    if budget.tokens_per_day.is_none() && budget.cost_per_month.is_none() {
        return Err(ApiError::validation(vec![problem(
            "missing",
            vec![json!("body")],
            "give `tokensPerDay`, `costPerMonth` or both (DELETE removes a budget)",
        )]));
    }
    state
        .store
        .set_budget(payer, &budget, crate::event::now_ts())
        .await?;
    state.runner.budgets_changed();
    view(state, payer, budget).await
}

async fn remove(state: &AppState, payer: &Payer) -> ApiResult<Response> {
    let deleted = state.store.delete_budget(payer).await?;
    state.runner.budgets_changed();
    match deleted {
        true => Ok(StatusCode::NO_CONTENT.into_response()),
        false => Err(ApiError::new(
            ErrorCode::BudgetNotFound,
            format!("There is no budget here ({})", payer.whose()),
        )),
    }
}

async fn show(state: &AppState, payer: &Payer) -> ApiResult<axum::Json<BudgetView>> {
    let budget = state.store.budget(payer).await?.unwrap_or_default();
    view(state, payer, budget).await
}

async fn view(
    state: &AppState,
    payer: &Payer,
    budget: Budget,
) -> ApiResult<axum::Json<BudgetView>> {
    let w = Window::now();
    let spent = state.store.spent(payer, &w).await?;
    Ok(axum::Json(BudgetView {
        tokens_per_day: budget.tokens_per_day,
        cost_per_month: budget.cost_per_month,
        spent,
        resets: Resets {
            tokens_per_day: iso_time((w.today + 1) * DAY_SECS),
            cost_per_month: iso_time(w.next_month_first * DAY_SECS),
        },
        exhausted: budget.exhausted(&spent, &w).is_some(),
        currency: state.runner.prices().currency.clone(),
    }))
}
