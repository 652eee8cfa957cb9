//! Eval sets and cases (docs/evals.md), per app: agentd's API under `/apps/{app}/eval-sets`
//! (with import and export of ADK's `*.evalset.json` and `*.test.json` files), and the same
//! operations under ADK's dev-server paths (`/dev/apps/{app}/eval-sets…`, and the older
//! `eval_sets…/evals…` spellings) that ADK's web UI calls ([`dev_router`]).
//!
//! Any caller who may use the app reads its sets; writing them needs an admin key, or a
//! server without authentication (a developer's own, where the web UI runs). A case copied
//! from a session also needs the right to act as that session's user.

use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::eval::doc::Doc;
use crate::eval::{self, from_session, redact, shape, Invalid};
use crate::event::now_ts;
use crate::http::auth::{require_admin, served_app};
use crate::http::error::{problem, ApiError, ApiResult};
use crate::http::extract::{Json, Path};
use crate::http::openapi::{error_set, Errors};
use crate::http::AppState;
use crate::store::{CaseWrite, SessionKey, SetWrite};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What reading an app's eval sets answers beyond the door's codes.
    ListErrors: AppNotFound, InvalidId
);

error_set!(
    /// What creating or importing an eval set answers beyond the door's codes.
    WriteSetErrors: AppNotFound, InvalidId, AdminRequired, ValidationError, JsonInvalid,
        EvalSetExists, EvalLimitReached, EvalCaseTooLarge
);

error_set!(
    /// What reading or deleting one eval set answers beyond the door's codes.
    SetErrors: AppNotFound, InvalidId, AdminRequired, EvalSetNotFound
);

error_set!(
    /// What adding a case (directly or from a session) answers beyond the door's codes.
    AddCaseErrors: AppNotFound, InvalidId, AdminRequired, ValidationError, JsonInvalid,
        EvalSetNotFound, EvalCaseExists, EvalLimitReached, EvalCaseTooLarge, SessionNotFound
);

error_set!(
    /// What reading, replacing or deleting one case answers beyond the door's codes.
    CaseErrors: AppNotFound, InvalidId, AdminRequired, ValidationError, JsonInvalid,
        EvalSetNotFound, EvalCaseNotFound, EvalCaseTooLarge, EvalLimitReached
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_sets, create_set))
        .routes(routes!(export_set, import_set, delete_set))
        .routes(routes!(list_cases, add_case))
        .routes(routes!(add_session))
        .routes(routes!(get_case, put_case, delete_case))
}

/// ADK's dev-server paths, for its web UI: the same operations, answered as ADK answers them
/// (`null` where ADK returns nothing).
pub fn dev_router() -> axum::Router<AppState> {
    const APP: &str = "/dev/apps/{app}";
    axum::Router::new()
        .route(&format!("{APP}/eval-sets"), get(list_sets).post(create_set))
        .route(
            &format!("{APP}/eval-sets/{{set}}"),
            get(dev_get_set).delete(dev_delete_set),
        )
        .route(&format!("{APP}/eval_sets"), get(dev_list_sets_legacy))
        .route(
            &format!("{APP}/eval_sets/{{set}}"),
            post(dev_create_set_legacy),
        )
        .route(
            &format!("{APP}/eval-sets/{{set}}/add-session"),
            post(dev_add_session),
        )
        .route(
            &format!("{APP}/eval_sets/{{set}}/add_session"),
            post(dev_add_session),
        )
        .route(
            &format!("{APP}/eval_sets/{{set}}/evals"),
            get(dev_list_cases),
        )
        .route(
            &format!("{APP}/eval-sets/{{set}}/eval-cases/{{case}}"),
            get(get_case).put(dev_put_case).delete(dev_delete_case),
        )
        .route(
            &format!("{APP}/eval_sets/{{set}}/evals/{{case}}"),
            get(get_case).put(dev_put_case).delete(dev_delete_case),
        )
        .route(&format!("{APP}/metrics-info"), get(dev_metrics_info))
}

/// `GET /dev/apps/{app}/metrics-info`: the metrics a set can be scored by, as ADK lists them
/// (only those agentd computes).
async fn dev_metrics_info(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<Doc>> {
    served_app(&state, &caller, &app)?;
    Ok(axum::Json(eval::metrics::info()))
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct AppPath {
    /// The app's name.
    app: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct SetPath {
    /// The app's name.
    app: String,
    /// The eval set's id.
    set: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct CasePath {
    app: String,
    set: String,
    /// The eval case's id (`evalId`).
    case: String,
}

#[derive(Debug, serde::Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct EvalSetIds {
    eval_set_ids: Vec<String>,
}

#[derive(Debug, serde::Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct EvalCaseIds {
    eval_case_ids: Vec<String>,
}

/// ADK's `CreateEvalSetRequest`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct CreateEvalSet {
    /// An `EvalSet`: `evalSetId` (letters, digits, `_`), and optionally `name`,
    /// `description` and `evalCases`.
    #[serde(alias = "eval_set")]
    #[schema(value_type = Object)]
    eval_set: Doc,
}

/// ADK's `AddSessionToEvalSetRequest`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct AddSession {
    #[serde(alias = "eval_id")]
    eval_id: String,
    #[serde(alias = "session_id")]
    session_id: String,
    #[serde(alias = "user_id")]
    user_id: String,
}

/// The app's eval set ids, sorted.
#[utoipa::path(get, path = "/apps/{app}/eval-sets", tag = "evals", params(AppPath),
    responses((status = 200, description = "The set ids.", body = EvalSetIds), Errors, ListErrors))]
async fn list_sets(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<EvalSetIds>> {
    served_app(&state, &caller, &app)?;
    Ok(axum::Json(EvalSetIds {
        eval_set_ids: state.store.list_eval_sets(&app).await?,
    }))
}

/// Creates an eval set (ADK's `create_eval_set`): named by its id unless the body names it,
/// stamped now, with the cases the body holds (ADK's web UI sends none). Answers the set.
#[utoipa::path(post, path = "/apps/{app}/eval-sets", tag = "evals", params(AppPath),
    request_body = CreateEvalSet,
    responses((status = 200, description = "The new set.", body = Object), Errors, WriteSetErrors))]
async fn create_set(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
    Json(req): Json<CreateEvalSet>,
) -> ApiResult<axum::Json<Doc>> {
    require_admin(&caller, "Changing eval sets")?;
    served_app(&state, &caller, &app)?;
    let given = shape::set_file(&req.eval_set);
    let id = given
        .get("eval_set_id")
        .and_then(Doc::as_str)
        .unwrap_or_default()
        .to_string();
    check_set_id(&id)?;
    let now = now_ts();
    let mut set = given.clone();
    if set.get("name").is_none() {
        set.set("name", Doc::str(&id));
    }
    set.set("creation_timestamp", Doc::float(now));
    let stored = eval::store_set(&id, &set, now).map_err(invalid)?;
    create(&state, &app, &id, &stored, now).await?;
    Ok(axum::Json(shape::set_wire(&document(&stored)?)))
}

/// Stores a new set under `id`: 409 if the id is taken or the app has all the sets it may.
async fn create(
    state: &AppState,
    app: &str,
    id: &str,
    stored: &crate::store::StoredEvalSet,
    now: f64,
) -> ApiResult<()> {
    let write = state
        .store
        .put_eval_set(app, id, stored, false, eval::MAX_EVAL_SETS_PER_APP, now)
        .await?;
    written(write, id)
}

/// Exports an eval set: the `*.evalset.json` ADK would write for it, byte for byte.
#[utoipa::path(get, path = "/apps/{app}/eval-sets/{set}", tag = "evals", params(SetPath),
    responses((status = 200, description = "The set's file.", body = Object), Errors, SetErrors))]
async fn export_set(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
) -> ApiResult<Response> {
    served_app(&state, &caller, &app)?;
    check_id("eval set id", &set)?;
    let stored = state
        .store
        .eval_set(&app, &set)
        .await?
        .ok_or_else(|| set_not_found(&set))?;
    let file = document(&stored)?.to_pretty();
    Ok(([(header::CONTENT_TYPE, "application/json")], file).into_response())
}

/// Imports an eval set file, ADK's `*.evalset.json` or its older `*.test.json`, under the
/// path's id: creates the set (201) or replaces the one of that id whole (200). Answers the
/// set's case ids.
#[utoipa::path(put, path = "/apps/{app}/eval-sets/{set}", tag = "evals", params(SetPath),
    request_body(content = Object, description = "An `*.evalset.json` or `*.test.json`."),
    responses((status = 200, description = "Replaced.", body = EvalCaseIds),
        (status = 201, description = "Created.", body = EvalCaseIds), Errors, WriteSetErrors))]
async fn import_set(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
    Json(body): Json<Doc>,
) -> ApiResult<Response> {
    require_admin(&caller, "Changing eval sets")?;
    served_app(&state, &caller, &app)?;
    check_set_id(&set)?;
    let now = now_ts();
    let stored = eval::store_set(&set, &body, now).map_err(invalid)?;
    let outcome = state
        .store
        .put_eval_set(&app, &set, &stored, true, eval::MAX_EVAL_SETS_PER_APP, now)
        .await?;
    written(outcome, &set)?;
    let status = match outcome {
        SetWrite::Created => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    let ids = stored.cases.iter().map(|(id, _)| id.clone()).collect();
    Ok((status, axum::Json(EvalCaseIds { eval_case_ids: ids })).into_response())
}

/// Deletes an eval set and its cases (204).
#[utoipa::path(delete, path = "/apps/{app}/eval-sets/{set}", tag = "evals", params(SetPath),
    responses((status = 204, description = "Deleted."), Errors, SetErrors))]
async fn delete_set(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    require_admin(&caller, "Changing eval sets")?;
    served_app(&state, &caller, &app)?;
    check_id("eval set id", &set)?;
    match state.store.delete_eval_set(&app, &set).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(set_not_found(&set)),
    }
}

/// The set's case ids, sorted (as ADK lists them).
#[utoipa::path(get, path = "/apps/{app}/eval-sets/{set}/eval-cases", tag = "evals",
    params(SetPath),
    responses((status = 200, description = "The case ids.", body = EvalCaseIds), Errors, SetErrors))]
async fn list_cases(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
) -> ApiResult<axum::Json<EvalCaseIds>> {
    Ok(axum::Json(EvalCaseIds {
        eval_case_ids: case_ids(&state, &caller, &app, &set).await?,
    }))
}

async fn case_ids(
    state: &AppState,
    caller: &Caller,
    app: &str,
    set: &str,
) -> ApiResult<Vec<String>> {
    served_app(state, caller, app)?;
    check_id("eval set id", set)?;
    state
        .store
        .eval_case_ids(app, set)
        .await?
        .ok_or_else(|| set_not_found(set))
}

/// Adds a case (an ADK `EvalCase`, either spelling) at the end of the set. Answers it.
#[utoipa::path(post, path = "/apps/{app}/eval-sets/{set}/eval-cases", tag = "evals",
    params(SetPath), request_body(content = Object, description = "An `EvalCase`."),
    responses((status = 201, description = "The case as stored.", body = Object), Errors, AddCaseErrors))]
async fn add_case(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
    Json(case): Json<Doc>,
) -> ApiResult<(StatusCode, axum::Json<Doc>)> {
    require_admin(&caller, "Changing eval sets")?;
    served_app(&state, &caller, &app)?;
    check_id("eval set id", &set)?;
    let (id, text) = eval::store_case(&case, &[]).map_err(invalid)?;
    add(&state, &app, &set, &id, &text).await?;
    Ok((StatusCode::CREATED, axum::Json(wire_case(&text)?)))
}

/// Adds a case made from a session (ADK's `add_session`): its invocations become the
/// expected conversation (user messages, tool calls and responses, final responses), its
/// initial state the keys the app's instructions read. Answers the case.
#[utoipa::path(post, path = "/apps/{app}/eval-sets/{set}/add-session", tag = "evals",
    params(SetPath), request_body = AddSession,
    responses((status = 201, description = "The case as stored.", body = Object), Errors, AddCaseErrors))]
async fn add_session(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
    Json(req): Json<AddSession>,
) -> ApiResult<(StatusCode, axum::Json<Doc>)> {
    let text = session_case(&state, &caller, &app, &set, &req).await?;
    Ok((StatusCode::CREATED, axum::Json(wire_case(&text)?)))
}

async fn session_case(
    state: &AppState,
    caller: &Caller,
    app: &str,
    set: &str,
    req: &AddSession,
) -> ApiResult<String> {
    require_admin(caller, "Changing eval sets")?;
    let entry = served_app(state, caller, app)?;
    check_id("eval set id", set)?;
    check_id("evalId", &req.eval_id)?;
    check_id("sessionId", &req.session_id)?;
    check_id("userId", &req.user_id)?;
    // Another user's session is as absent as a missing one.
    if !caller.may_act_as(&req.user_id) {
        return Err(ApiError::session_not_found());
    }
    let key = SessionKey::new(app, &req.user_id, &req.session_id);
    let session = state
        .store
        .get_session(&key, None)
        .await?
        .ok_or_else(ApiError::session_not_found)?;
    let mut input = Doc::object()
        .with("app_name", Doc::str(app))
        .with("user_id", Doc::str(&req.user_id));
    if let Ok(tree) = &entry.tree {
        let empty = from_session::empty_state(tree.root());
        if !empty.is_falsy() {
            input.set("state", empty);
        }
    }
    let case = Doc::object()
        .with("eval_id", Doc::str(&req.eval_id))
        .with(
            "conversation",
            Doc::Array(from_session::invocations(&session.events)),
        )
        .with("session_input", input)
        .with("creation_timestamp", Doc::float(now_ts()));
    let (id, text) = eval::store_case(&case, &[]).map_err(invalid)?;
    add(state, app, set, &id, &text).await?;
    Ok(text)
}

/// One case, in ADK's wire form.
#[utoipa::path(get, path = "/apps/{app}/eval-sets/{set}/eval-cases/{case}", tag = "evals",
    params(CasePath),
    responses((status = 200, description = "The case.", body = Object), Errors, CaseErrors))]
async fn get_case(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set, case)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Doc>> {
    served_app(&state, &caller, &app)?;
    check_id("eval set id", &set)?;
    check_id("eval case id", &case)?;
    match state.store.eval_case(&app, &set, &case).await? {
        Ok(text) => Ok(axum::Json(wire_case(&text)?)),
        Err(missing) => Err(case_missing(missing, &set, &case)),
    }
}

/// Replaces a case in its place (ADK's `update_eval`): the body's `evalId`, if it has one,
/// must be the path's. Answers the case as stored.
#[utoipa::path(put, path = "/apps/{app}/eval-sets/{set}/eval-cases/{case}", tag = "evals",
    params(CasePath), request_body(content = Object, description = "An `EvalCase`."),
    responses((status = 200, description = "The case as stored.", body = Object), Errors, CaseErrors))]
async fn put_case(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set, case)): Path<(String, String, String)>,
    Json(body): Json<Doc>,
) -> ApiResult<axum::Json<Doc>> {
    let text = replace_case(&state, &caller, &app, &set, &case, body).await?;
    Ok(axum::Json(wire_case(&text)?))
}

async fn replace_case(
    state: &AppState,
    caller: &Caller,
    app: &str,
    set: &str,
    case: &str,
    body: Doc,
) -> ApiResult<String> {
    require_admin(caller, "Changing eval sets")?;
    served_app(state, caller, app)?;
    check_id("eval set id", set)?;
    check_id("eval case id", case)?;
    let mut file = shape::case_file(&body);
    match file.get("eval_id") {
        // An empty id is ADK's "not given" too.
        Some(Doc::String(given)) if !given.is_empty() && given != case => {
            return Err(ApiError::validation(vec![problem(
                "value_error",
                vec![json!("body"), json!("evalId")],
                "Eval id in EvalCase should match the eval id in the API route.",
            )]))
        }
        _ => file.set("eval_id", Doc::str(case)),
    }
    let (_, text) = eval::store_case(&file, &[]).map_err(invalid)?;
    match state
        .store
        .update_eval_case(app, set, case, &text, eval::MAX_EVAL_SET_BYTES)
        .await?
    {
        CaseWrite::Done => Ok(text),
        CaseWrite::Full => Err(ApiError::new(
            ErrorCode::EvalLimitReached,
            format!(
                "Eval set `{set}` would hold over {} bytes of cases.",
                eval::MAX_EVAL_SET_BYTES
            ),
        )),
        other => Err(case_missing(other, set, case)),
    }
}

/// Deletes a case (204).
#[utoipa::path(delete, path = "/apps/{app}/eval-sets/{set}/eval-cases/{case}", tag = "evals",
    params(CasePath),
    responses((status = 204, description = "Deleted."), Errors, CaseErrors))]
async fn delete_case(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set, case)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    remove_case(&state, &caller, &app, &set, &case).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn remove_case(
    state: &AppState,
    caller: &Caller,
    app: &str,
    set: &str,
    case: &str,
) -> ApiResult<()> {
    require_admin(caller, "Changing eval sets")?;
    served_app(state, caller, app)?;
    check_id("eval set id", set)?;
    check_id("eval case id", case)?;
    match state.store.delete_eval_case(app, set, case).await? {
        CaseWrite::Done => Ok(()),
        other => Err(case_missing(other, set, case)),
    }
}

// ADK's dev-server spellings.

/// `GET /dev/apps/{app}/eval_sets`: the ids as a bare list.
async fn dev_list_sets_legacy(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<Vec<String>>> {
    served_app(&state, &caller, &app)?;
    Ok(axum::Json(state.store.list_eval_sets(&app).await?))
}

/// `GET /dev/apps/{app}/eval-sets/{set}` (the web UI's `getEvalSet`): the set in the wire
/// form, without credential secrets.
async fn dev_get_set(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
) -> ApiResult<axum::Json<Doc>> {
    served_app(&state, &caller, &app)?;
    check_id("eval set id", &set)?;
    let stored = state
        .store
        .eval_set(&app, &set)
        .await?
        .ok_or_else(|| set_not_found(&set))?;
    Ok(axum::Json(redact::credential_secrets(&shape::set_wire(
        &document(&stored)?,
    ))))
}

/// `DELETE /dev/apps/{app}/eval-sets/{set}` (the web UI's `deleteEvalSet`): `null`.
async fn dev_delete_set(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
) -> ApiResult<axum::Json<Value>> {
    delete_set(state, caller, Path((app, set))).await?;
    Ok(axum::Json(Value::Null))
}

/// `POST /dev/apps/{app}/eval_sets/{set}`: an empty set of that id; `null`.
async fn dev_create_set_legacy(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
) -> ApiResult<axum::Json<Value>> {
    require_admin(&caller, "Changing eval sets")?;
    served_app(&state, &caller, &app)?;
    check_set_id(&set)?;
    let now = now_ts();
    let stored = eval::new_set(&set, now);
    create(&state, &app, &set, &stored, now).await?;
    Ok(axum::Json(Value::Null))
}

async fn dev_add_session(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
    Json(req): Json<AddSession>,
) -> ApiResult<axum::Json<Value>> {
    session_case(&state, &caller, &app, &set, &req).await?;
    Ok(axum::Json(Value::Null))
}

/// `GET /dev/apps/{app}/eval_sets/{set}/evals`: the case ids as a bare sorted list.
async fn dev_list_cases(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
) -> ApiResult<axum::Json<Vec<String>>> {
    Ok(axum::Json(case_ids(&state, &caller, &app, &set).await?))
}

async fn dev_put_case(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set, case)): Path<(String, String, String)>,
    Json(body): Json<Doc>,
) -> ApiResult<axum::Json<Value>> {
    replace_case(&state, &caller, &app, &set, &case, body).await?;
    Ok(axum::Json(Value::Null))
}

async fn dev_delete_case(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set, case)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Value>> {
    remove_case(&state, &caller, &app, &set, &case).await?;
    Ok(axum::Json(Value::Null))
}

// What every handler shares.

fn check_id(what: &str, id: &str) -> ApiResult<()> {
    crate::http::extract::validate_id(what, id)
}

/// A new set's id names ADK's file: letters, digits and `_`.
fn check_set_id(id: &str) -> ApiResult<()> {
    match shape::valid_set_id(id) {
        true => Ok(()),
        false => Err(ApiError::validation(vec![problem(
            "value_error",
            vec![json!("body"), json!("evalSetId")],
            "Invalid Eval Set ID. Eval Set ID should have the `^[a-zA-Z0-9_]+$` format \
             (at most 128 characters)",
        )])),
    }
}

async fn add(state: &AppState, app: &str, set: &str, id: &str, text: &str) -> ApiResult<()> {
    match state
        .store
        .add_eval_case(
            app,
            set,
            id,
            text,
            eval::MAX_EVAL_CASES_PER_SET,
            eval::MAX_EVAL_SET_BYTES,
        )
        .await?
    {
        CaseWrite::Done => Ok(()),
        CaseWrite::Exists => Err(ApiError::new(
            ErrorCode::EvalCaseExists,
            format!("Eval id `{id}` already exists in `{set}` eval set."),
        )),
        CaseWrite::Full => Err(ApiError::new(
            ErrorCode::EvalLimitReached,
            format!(
                "Eval set `{set}` has {} cases or {} bytes of them, as many as a set may.",
                eval::MAX_EVAL_CASES_PER_SET,
                eval::MAX_EVAL_SET_BYTES
            ),
        )),
        other => Err(case_missing(other, set, id)),
    }
}

fn written(outcome: SetWrite, set: &str) -> ApiResult<()> {
    match outcome {
        SetWrite::Created | SetWrite::Replaced => Ok(()),
        SetWrite::Exists => Err(ApiError::new(
            ErrorCode::EvalSetExists,
            format!("EvalSet {set} already exists."),
        )),
        SetWrite::Full => Err(ApiError::new(
            ErrorCode::EvalLimitReached,
            format!(
                "The app has {} eval sets, as many as it may.",
                eval::MAX_EVAL_SETS_PER_APP
            ),
        )),
    }
}

pub(super) fn set_not_found(set: &str) -> ApiError {
    ApiError::new(
        ErrorCode::EvalSetNotFound,
        format!("Eval set `{set}` not found."),
    )
}

fn case_missing(missing: CaseWrite, set: &str, case: &str) -> ApiError {
    match missing {
        CaseWrite::NoSet => set_not_found(set),
        _ => ApiError::new(
            ErrorCode::EvalCaseNotFound,
            format!("Eval case `{case}` not found in eval set `{set}`."),
        ),
    }
}

fn invalid(e: Invalid) -> ApiError {
    match e {
        Invalid::Problems(ps) => ApiError::validation(
            ps.into_iter()
                .map(|p| {
                    let mut loc = vec![json!("body")];
                    loc.extend(p.loc);
                    problem("value_error", loc, p.msg)
                })
                .collect(),
        ),
        Invalid::TooLarge(id, size) => ApiError::new(
            ErrorCode::EvalCaseTooLarge,
            format!(
                "Eval case `{id}` is {size} bytes of JSON, over the {}-byte limit.",
                eval::MAX_EVAL_CASE_BYTES
            ),
        ),
        Invalid::SetTooLarge(size) => ApiError::new(
            ErrorCode::EvalLimitReached,
            format!(
                "The set's cases come to over {size} bytes of JSON, over the {}-byte limit.",
                eval::MAX_EVAL_SET_BYTES
            ),
        ),
        Invalid::TooMany(n) => ApiError::new(
            ErrorCode::EvalLimitReached,
            format!(
                "The set has {n} cases, over the {} a set may have.",
                eval::MAX_EVAL_CASES_PER_SET
            ),
        ),
    }
}

/// A stored set as one document; unreadable stored JSON is a server fault.
fn document(stored: &crate::store::StoredEvalSet) -> ApiResult<Doc> {
    eval::set_document(stored).map_err(ApiError::internal)
}

/// A stored case as the routes answer it: the wire form, without credential secrets.
fn wire_case(text: &str) -> ApiResult<Doc> {
    Doc::parse(text)
        .map(|d| redact::credential_secrets(&shape::case_wire(&d)))
        .map_err(ApiError::internal)
}
