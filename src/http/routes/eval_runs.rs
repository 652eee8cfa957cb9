//! Runs of stored eval sets and their results (docs/evals.md#running-a-stored-set): agentd's
//! API under `/apps/{app}/eval-sets/{set}/runs` and `/apps/{app}/eval-runs`, which answers at
//! once and lets the run go on without the caller, and ADK's dev-server routes
//! (`…/eval-sets/{set}/run`, `…/eval-results`, and the older `run_eval`, `eval_results`
//! spellings) that ADK's web UI calls, which answer when the run has ended ([`dev_router`]).
//!
//! Either way the run is stored first and its cases are run by the replicas' eval workers
//! ([`crate::eval::worker`]): a caller that goes away, or a replica that dies, loses nothing.
//! Starting, cancelling and deleting a run needs an admin key (its cases run the app's
//! model as the cases' users), or a server without authentication; any caller who may use
//! the app reads the results.

use super::evals::set_not_found;
use crate::auth::Caller;
use crate::error_code::ErrorCode;
use crate::eval::doc::Doc;
use crate::eval::metrics::Criteria;
use crate::eval::{self, redact, result, shape};
use crate::event::now_ts;
use crate::http::auth::{require_admin, served_app};
use crate::http::error::{ApiError, ApiResult};
use crate::http::extract::{Json, Path};
use crate::http::openapi::{error_set, Errors};
use crate::http::AppState;
use crate::store::{NewEvalRun, RunCreate, StoredEvalRun};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What starting a run answers beyond the door's codes.
    StartErrors: AppNotFound, InvalidId, AdminRequired, JsonInvalid, EvalSetNotFound,
        EvalCaseNotFound, EvalSetEmpty, InvalidEvalCriteria, TooManyEvalRuns
);

error_set!(
    /// What reading an app's runs answers beyond the door's codes.
    ListErrors: AppNotFound
);

error_set!(
    /// What reading, cancelling or deleting one run answers beyond the door's codes.
    RunErrors: AppNotFound, InvalidId, AdminRequired, EvalRunNotFound
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(start_eval_run))
        .routes(routes!(list_eval_runs))
        .routes(routes!(get_eval_run, delete_eval_run))
        .routes(routes!(cancel_eval_run))
}

/// ADK's dev-server paths, for its web UI, answered as ADK answers them.
pub fn dev_router() -> axum::Router<AppState> {
    const APP: &str = "/dev/apps/{app}";
    axum::Router::new()
        .route(&format!("{APP}/eval-sets/{{set}}/run"), post(dev_run))
        .route(
            &format!("{APP}/eval_sets/{{set}}/run_eval"),
            post(dev_run_legacy),
        )
        .route(&format!("{APP}/eval-results"), get(dev_list))
        .route(&format!("{APP}/eval_results"), get(dev_list_legacy))
        .route(&format!("{APP}/eval-results/{{run}}"), get(dev_get))
        .route(&format!("{APP}/eval_results/{{run}}"), get(dev_get))
}

/// How often a dev-server run's caller looks whether the run has ended.
const WAIT_POLL: Duration = Duration::from_millis(250);

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
struct AppPath {
    /// The app's name.
    app: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct RunPath {
    app: String,
    /// The run's id (ADK's eval result id, `{app}_{set}_{timestamp}`).
    run: String,
}

/// What to run: ADK's `RunEvalRequest` (the cases, and the metrics with their thresholds),
/// or an `EvalConfig`'s `criteria` as `test_config.json` holds them. Neither (`{}`): ADK's
/// default criteria.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RunRequest {
    /// The cases to run, in the set's order; none: all of them.
    #[serde(default, alias = "eval_case_ids")]
    eval_case_ids: Vec<String>,
    /// ADK's older name of `evalCaseIds`.
    #[serde(default, alias = "eval_ids")]
    eval_ids: Vec<String>,
    /// ADK's `EvalMetric`s: `{"metricName", "threshold", "criterion"?}`.
    #[serde(default, alias = "eval_metrics")]
    #[schema(value_type = Vec<Object>)]
    eval_metrics: Vec<Doc>,
    /// An `EvalConfig`'s `criteria`: `{"<metric>": <threshold> | {"threshold": …, …}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    criteria: Option<Doc>,
    /// Not supported: a run with it is refused rather than run otherwise.
    #[serde(default, alias = "user_simulator_config")]
    #[schema(value_type = Option<Object>)]
    user_simulator_config: Option<Value>,
    /// Not supported (agentd's runs are not live).
    #[serde(default, alias = "live_model_config")]
    #[schema(value_type = Option<Object>)]
    live_model_config: Option<Value>,
}

/// A run: how far it is, and the results of the cases that finished.
#[derive(Debug, serde::Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RunView {
    eval_run_id: String,
    eval_set_id: String,
    /// `running`, `done` or `cancelled`.
    status: &'static str,
    created_at: f64,
    cases: usize,
    finished_cases: usize,
    passed_cases: usize,
    /// The eval config the cases are scored by.
    #[schema(value_type = Object)]
    criteria: Doc,
    /// ADK's `EvalSetResult` of the finished cases, in the file form `adk eval` and
    /// `agentd eval` write; a case that could not be scored has `error`.
    #[schema(value_type = Object)]
    result: Doc,
}

#[derive(Debug, serde::Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RunIds {
    eval_run_ids: Vec<String>,
}

/// Starts a run of the set (202): its cases as they are now are stored with the run and run
/// by the replicas in new sessions; the answer says where to read it.
#[utoipa::path(post, path = "/apps/{app}/eval-sets/{set}/runs", tag = "evals", params(SetPath),
    request_body = RunRequest,
    responses((status = 202, description = "Started.", body = RunView), Errors, StartErrors))]
async fn start_eval_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
    Json(req): Json<RunRequest>,
) -> ApiResult<Response> {
    let id = create(&state, &caller, &app, &set, &req).await?;
    let view = view(&id, &read(&state, &app, &id).await?)?;
    let location = format!("/apps/{app}/eval-runs/{id}");
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        axum::Json(view),
    )
        .into_response())
}

/// The app's run ids, sorted.
#[utoipa::path(get, path = "/apps/{app}/eval-runs", tag = "evals", params(AppPath),
    responses((status = 200, description = "The run ids.", body = RunIds), Errors, ListErrors))]
async fn list_eval_runs(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<RunIds>> {
    served_app(&state, &caller, &app)?;
    Ok(axum::Json(RunIds {
        eval_run_ids: state.store.list_eval_runs(&app).await?,
    }))
}

/// One run: its status and the results so far.
#[utoipa::path(get, path = "/apps/{app}/eval-runs/{run}", tag = "evals", params(RunPath),
    responses((status = 200, description = "The run.", body = RunView), Errors, RunErrors))]
async fn get_eval_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, run)): Path<(String, String)>,
) -> ApiResult<axum::Json<RunView>> {
    served_app(&state, &caller, &app)?;
    check_id(&run)?;
    Ok(axum::Json(view(&run, &read(&state, &app, &run).await?)?))
}

/// Cancels a run: the cases not yet finished stop (their runs are cancelled) and are left
/// without a result. Answers the run; cancelling one that ended changes nothing.
#[utoipa::path(post, path = "/apps/{app}/eval-runs/{run}/cancel", tag = "evals", params(RunPath),
    responses((status = 200, description = "The run.", body = RunView), Errors, RunErrors))]
async fn cancel_eval_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, run)): Path<(String, String)>,
) -> ApiResult<axum::Json<RunView>> {
    require_admin(&caller, "Running evals")?;
    served_app(&state, &caller, &app)?;
    check_id(&run)?;
    if state.store.cancel_eval_run(&app, &run).await?.is_none() {
        return Err(run_not_found(&run));
    }
    Ok(axum::Json(view(&run, &read(&state, &app, &run).await?)?))
}

/// Deletes a run and its results (204); a run in flight stops first.
#[utoipa::path(delete, path = "/apps/{app}/eval-runs/{run}", tag = "evals", params(RunPath),
    responses((status = 204, description = "Deleted."), Errors, RunErrors))]
async fn delete_eval_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, run)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    require_admin(&caller, "Running evals")?;
    served_app(&state, &caller, &app)?;
    check_id(&run)?;
    match state.store.delete_eval_run(&app, &run).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(run_not_found(&run)),
    }
}

/// `POST /dev/apps/{app}/eval-sets/{set}/run`: ADK's `RunEvalResponse` once the run ended.
async fn dev_run(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
    Json(req): Json<RunRequest>,
) -> ApiResult<axum::Json<Value>> {
    let results = run_and_wait(&state, &caller, &app, &set, &req).await?;
    Ok(axum::Json(json!({ "runEvalResults": results })))
}

/// `POST /dev/apps/{app}/eval_sets/{set}/run_eval`: the results as a bare list.
async fn dev_run_legacy(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, set)): Path<(String, String)>,
    Json(req): Json<RunRequest>,
) -> ApiResult<axum::Json<Vec<Doc>>> {
    Ok(axum::Json(
        run_and_wait(&state, &caller, &app, &set, &req).await?,
    ))
}

async fn dev_list(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    served_app(&state, &caller, &app)?;
    let ids = state.store.list_eval_runs(&app).await?;
    Ok(axum::Json(json!({ "evalResultIds": ids })))
}

async fn dev_list_legacy(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path(app): Path<String>,
) -> ApiResult<axum::Json<Vec<String>>> {
    served_app(&state, &caller, &app)?;
    Ok(axum::Json(state.store.list_eval_runs(&app).await?))
}

/// `GET /dev/apps/{app}/eval-results/{run}`: the run's `EvalSetResult` in the wire form.
async fn dev_get(
    state: axum::extract::State<AppState>,
    caller: Caller,
    Path((app, run)): Path<(String, String)>,
) -> ApiResult<axum::Json<Doc>> {
    served_app(&state, &caller, &app)?;
    check_id(&run)?;
    let stored = read(&state, &app, &run).await?;
    // `set_result` has taken the credential secrets out already.
    Ok(axum::Json(shape::set_result_wire(&set_result(
        &run, &stored,
    )?)))
}

// What every handler shares.

/// Starts the run the dev server's caller asked for, waits for its end (the run goes on if
/// the caller leaves), and answers its cases' results as ADK's `RunEvalResult`s.
async fn run_and_wait(
    state: &AppState,
    caller: &Caller,
    app: &str,
    set: &str,
    req: &RunRequest,
) -> ApiResult<Vec<Doc>> {
    let id = create(state, caller, app, set, req).await?;
    let stored = loop {
        let stored = read(state, app, &id).await?;
        if stored.open_cases == 0 {
            break stored;
        }
        tokio::time::sleep(WAIT_POLL).await;
    };
    results(&stored)?
        .iter()
        .map(|r| Ok(redact::credential_secrets(&shape::run_result_wire(r))))
        .collect()
}

/// Checks the request, stores the run with the set's cases, and wakes this replica's worker;
/// the run's id.
async fn create(
    state: &AppState,
    caller: &Caller,
    app: &str,
    set: &str,
    req: &RunRequest,
) -> ApiResult<String> {
    require_admin(caller, "Running evals")?;
    let entry = served_app(state, caller, app)?;
    if let Err(e) = &entry.tree {
        return Err(ApiError::new(
            ErrorCode::AppLoadFailed,
            format!("App {app:?} does not load: {e}"),
        ));
    }
    crate::http::extract::validate_id("eval set id", set)?;
    let config = config_of(req)?;
    let stored = state
        .store
        .eval_set(app, set)
        .await?
        .ok_or_else(|| set_not_found(set))?;
    let cases = chosen_cases(stored.cases, req, set)?;
    let criteria = config.to_compact();
    // Two runs of one set started in the same microsecond share a timestamp: the second
    // takes the next one.
    for _ in 0..3 {
        let now = now_ts();
        let id = result::result_id(app, set, now);
        let run = NewEvalRun {
            app,
            run_id: &id,
            set_id: set,
            criteria: &criteria,
            cases: &cases,
            now,
        };
        match state
            .store
            .create_eval_run(
                &run,
                eval::MAX_RUNNING_EVAL_RUNS_PER_APP,
                eval::MAX_STORED_EVAL_RUNS_PER_APP,
            )
            .await?
        {
            RunCreate::Created => {
                state.eval_wake.notify_one();
                tracing::info!(app, eval_set = set, eval_run = %id, cases = cases.len(), "eval run started");
                return Ok(id);
            }
            RunCreate::Busy => {
                return Err(ApiError::new(
                    ErrorCode::TooManyEvalRuns,
                    format!(
                        "App {app:?} has {} eval runs in flight, as many as it may: wait for one to end, or cancel one.",
                        eval::MAX_RUNNING_EVAL_RUNS_PER_APP
                    ),
                ))
            }
            RunCreate::Exists => tokio::time::sleep(Duration::from_micros(10)).await,
        }
    }
    Err(ApiError::internal("no free eval run id after three tries"))
}

/// The cases of the set the request names (`evalCaseIds`, or ADK's older `evalIds`; none:
/// all of them), each of which must be in the set, and at least one.
fn chosen_cases(
    stored: Vec<(String, String)>,
    req: &RunRequest,
    set: &str,
) -> ApiResult<Vec<(String, String)>> {
    let wanted = match req.eval_case_ids.is_empty() {
        true => &req.eval_ids,
        false => &req.eval_case_ids,
    };
    if let Some(missing) = wanted
        .iter()
        .find(|id| !stored.iter().any(|(c, _)| c == *id))
    {
        return Err(ApiError::new(
            ErrorCode::EvalCaseNotFound,
            format!("Eval case `{missing}` not found in eval set `{set}`."),
        ));
    }
    let cases: Vec<(String, String)> = stored
        .into_iter()
        .filter(|(id, _)| wanted.is_empty() || wanted.contains(id))
        .collect();
    if cases.is_empty() {
        return Err(ApiError::new(
            ErrorCode::EvalSetEmpty,
            format!("Eval set `{set}` has no cases to run."),
        ));
    }
    Ok(cases)
}

/// The request's eval config, `{"criteria": {…}}`, checked as a run would read it.
fn config_of(req: &RunRequest) -> ApiResult<Doc> {
    let refuse = |detail: String| ApiError::new(ErrorCode::InvalidEvalCriteria, detail);
    if req
        .user_simulator_config
        .as_ref()
        .is_some_and(|v| !v.is_null())
    {
        return Err(refuse(
            "userSimulatorConfig is not supported: agentd replays each case's conversation".into(),
        ));
    }
    if req.live_model_config.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(refuse(
            "liveModelConfig is not supported: agentd's eval runs are not live".into(),
        ));
    }
    let config = match (&req.criteria, req.eval_metrics.is_empty()) {
        (Some(_), false) => return Err(refuse("give criteria or evalMetrics, not both".into())),
        (Some(criteria), true) => Doc::object().with("criteria", criteria.clone()),
        (None, false) => {
            let mut criteria = Doc::object();
            for (i, m) in req.eval_metrics.iter().enumerate() {
                let name = m
                    .get("metricName")
                    .or_else(|| m.get("metric_name"))
                    .and_then(Doc::as_str)
                    .ok_or_else(|| refuse(format!("evalMetrics[{i}] has no metricName")))?;
                let threshold = m.get("threshold").filter(|t| !matches!(t, Doc::Null));
                let value = match (m.get("criterion"), threshold) {
                    (Some(c @ Doc::Object(_)), t) => {
                        let mut c = c.clone();
                        if let (None, Some(t)) = (c.get("threshold"), t) {
                            c.set("threshold", t.clone());
                        }
                        c
                    }
                    (_, Some(t)) => t.clone(),
                    (_, None) => {
                        return Err(refuse(format!(
                            "evalMetrics[{i}] ({name}) has no threshold"
                        )))
                    }
                };
                criteria.set(name, value);
            }
            Doc::object().with("criteria", criteria)
        }
        (None, true) => return Ok(default_config()),
    };
    Criteria::parse(&config).map_err(refuse)?;
    Ok(config)
}

/// ADK's default criteria as an eval config.
fn default_config() -> Doc {
    let mut criteria = Doc::object();
    for c in Criteria::default().0 {
        criteria.set(&c.name, Doc::float(c.threshold));
    }
    Doc::object().with("criteria", criteria)
}

async fn read(state: &AppState, app: &str, run: &str) -> ApiResult<StoredEvalRun> {
    state
        .store
        .eval_run(app, run)
        .await?
        .ok_or_else(|| run_not_found(run))
}

/// The finished cases' results, in the set's order; unreadable stored JSON is a server fault.
fn results(stored: &StoredEvalRun) -> ApiResult<Vec<Doc>> {
    stored
        .cases
        .iter()
        .filter_map(|c| c.result.as_deref())
        .map(|r| Doc::parse(r).map_err(ApiError::internal))
        .collect()
}

/// The run's `EvalSetResult` (file form), without credential secrets: a case's expected
/// conversation is copied into its result, and an imported case may hold them.
fn set_result(id: &str, stored: &StoredEvalRun) -> ApiResult<Doc> {
    let result = result::set_result(id, &stored.set_id, results(stored)?, stored.created_at);
    Ok(redact::credential_secrets(&result))
}

fn view(id: &str, stored: &StoredEvalRun) -> ApiResult<RunView> {
    let result = set_result(id, stored)?;
    let passed = result
        .get("eval_case_results")
        .and_then(Doc::as_array)
        .map_or(0, |cases| {
            cases
                .iter()
                .filter(|c| {
                    matches!(c.get("final_eval_status"), Some(Doc::Number(n))
                        if n.as_i64() == Some(eval::metrics::Status::Passed as i64))
                })
                .count()
        });
    Ok(RunView {
        eval_run_id: id.to_string(),
        eval_set_id: stored.set_id.clone(),
        status: match (stored.open_cases > 0, stored.cancelled) {
            (true, _) => "running",
            (false, true) => "cancelled",
            (false, false) => "done",
        },
        created_at: stored.created_at,
        cases: stored.cases.len(),
        finished_cases: stored.cases.iter().filter(|c| c.result.is_some()).count(),
        passed_cases: passed,
        criteria: Doc::parse(&stored.criteria).map_err(ApiError::internal)?,
        result,
    })
}

/// A run's id is `{app}_{set}_{timestamp}`, each id up to 128 bytes: longer than other ids.
fn check_id(run: &str) -> ApiResult<()> {
    if run.is_empty() || run.len() > 300 || run.chars().any(|c| c.is_control() || c == '/') {
        return Err(ApiError::new(
            ErrorCode::InvalidId,
            "eval run id must be 1 to 300 printable characters without '/'",
        ));
    }
    Ok(())
}

fn run_not_found(run: &str) -> ApiError {
    ApiError::new(
        ErrorCode::EvalRunNotFound,
        format!("Eval result `{run}` not found."),
    )
}
