//! One eval case run as ordinary runs: a new session made from the case's `session_input`
//! (named as ADK 2.13 names its eval sessions, and kept: it is the record of what the agent
//! did), each expected invocation's user message sent in turn (the app's real agent, model and
//! tools answer), and the session's events read back as the actual conversation (ADK's
//! `EvaluationGenerator`, which replays a case the same way).

use super::doc::Doc;
use super::from_session;
use super::metrics::{self, Criteria, Status};
use crate::event::{Content, JsonMap};
use crate::runner::{OnBusy, OnDisconnect, RunRequest, Runner};
use crate::store::{NewSession, RunStatus, SessionKey, Store};
use crate::transcript::RunItem;
use std::sync::Arc;

/// The user ADK replays a case as when the case names none.
pub const DEFAULT_USER: &str = "test_user_id";
/// ADK 2.13's prefix of an eval session's id.
pub const SESSION_PREFIX: &str = "adk-eval-session-";

/// How one case went.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub eval_id: String,
    pub user_id: String,
    pub session_id: String,
    /// Per criterion, in the criteria's order; `Err` when the case could not be scored.
    pub metrics: Result<Vec<(metrics::Criterion, metrics::Scored)>, String>,
    pub expected: Vec<Doc>,
    pub actual: Vec<Doc>,
}

impl CaseResult {
    /// Failed when a metric failed or the case could not be run; not evaluated when no metric
    /// could be; else passed (a metric not evaluated beside passed ones does not fail it).
    pub fn status(&self) -> Status {
        match &self.metrics {
            Err(_) => Status::Failed,
            Ok(m) if m.iter().any(|(_, s)| s.status == Status::Failed) => Status::Failed,
            Ok(m) if m.iter().all(|(_, s)| s.status == Status::NotEvaluated) => {
                Status::NotEvaluated
            }
            Ok(_) => Status::Passed,
        }
    }
}

/// A new eval session's id, as ADK 2.13 names them.
pub fn new_session_id() -> String {
    format!("{SESSION_PREFIX}{}", uuid::Uuid::new_v4())
}

/// The user `case` (file form) is replayed as.
pub fn user_of(case: &Doc) -> String {
    case.get("session_input")
        .and_then(|i| i.get("user_id"))
        .and_then(Doc::as_str)
        .unwrap_or(DEFAULT_USER)
        .to_string()
}

/// Runs `case` (file form) of `app` in a new session `session_id` (of the case's user), and
/// scores it by `criteria`.
pub async fn run_case(
    runner: &Arc<Runner>,
    store: &Arc<dyn Store>,
    app: &str,
    case: &Doc,
    criteria: &Criteria,
    session_id: &str,
) -> CaseResult {
    let eval_id = case
        .get("eval_id")
        .and_then(Doc::as_str)
        .unwrap_or_default()
        .to_string();
    let input = case.get("session_input");
    let user_id = user_of(case);
    let session_id = session_id.to_string();
    let expected: Vec<Doc> = case
        .get("conversation")
        .and_then(Doc::as_array)
        .cloned()
        .unwrap_or_default();
    let mut result = CaseResult {
        eval_id,
        user_id: user_id.clone(),
        session_id: session_id.clone(),
        metrics: Ok(vec![]),
        expected: expected.clone(),
        actual: vec![],
    };
    let key = SessionKey::new(app, &user_id, &session_id);
    // As ADK's eval service: the case's and expected invocations' rubrics go onto the actual
    // invocations, which the rubric metrics judge by; checked before anything is run.
    let rubrics = match metrics::rubric::rubric_lists(case, &expected) {
        Ok(r) => r,
        Err(e) => {
            result.metrics = Err(e);
            return result;
        }
    };
    let replayed = replay(runner, store, &key, input, &expected)
        .await
        .map(|mut actual| {
            metrics::rubric::copy_rubrics(rubrics, &mut actual);
            actual
        });
    match replayed {
        Ok(actual) => {
            let judges = runner
                .apps()
                .get(app)
                .map(|e| e.evals.clone())
                .unwrap_or_default();
            let payer = metrics::judge::Payer {
                store: store.as_ref(),
                prices: runner.prices(),
                app,
                user: &user_id,
            };
            result.metrics = async {
                let mut scored = Vec::with_capacity(criteria.0.len());
                for c in &criteria.0 {
                    let s = metrics::score(c, &judges, &payer, &actual, &expected).await?;
                    scored.push((c.clone(), s));
                }
                Ok(scored)
            }
            .await;
            result.actual = actual;
        }
        Err(e) => result.metrics = Err(e),
    }
    result
}

async fn replay(
    runner: &Arc<Runner>,
    store: &Arc<dyn Store>,
    key: &SessionKey,
    input: Option<&Doc>,
    expected: &[Doc],
) -> Result<Vec<Doc>, String> {
    let state: JsonMap = match input.and_then(|i| i.get("state")) {
        Some(state @ Doc::Object(_)) => serde_json::to_value(state)
            .ok()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default(),
        _ => JsonMap::new(),
    };
    store
        .create_session(NewSession {
            app_name: key.app_name.clone(),
            user_id: key.user_id.clone(),
            session_id: Some(key.session_id.clone()),
            state,
            events: vec![],
        })
        .await
        .map_err(|e| format!("cannot create the eval session: {e}"))?;
    for (i, invocation) in expected.iter().enumerate() {
        let message = user_message(invocation).map_err(|e| format!("invocation {i}: {e}"))?;
        let handle = runner
            .start_run(RunRequest {
                key: key.clone(),
                new_message: Some(message),
                state_delta: None,
                run_config: Default::default(),
                on_busy: OnBusy::Enqueue,
                on_disconnect: OnDisconnect::Continue,
                create_session: false,
                max_duration: None,
                webhook: None,
                run_id: None,
                edit: None,
                api_key: None,
            })
            .await
            .map_err(|e| format!("invocation {i} did not start: {e}"))?;
        let mut items = handle.items;
        let mut error = None;
        let mut ended = None;
        while let Some(item) = items.recv().await {
            match item {
                RunItem::Error { message, .. } => error = Some(message),
                RunItem::Done { status, .. } => {
                    ended = Some(status);
                    break;
                }
                RunItem::Event { .. } => {}
            }
        }
        match ended {
            Some(RunStatus::Completed) => {}
            Some(status) => {
                return Err(format!(
                    "invocation {i} ended {}{}",
                    status.as_str(),
                    error.map(|e| format!(": {e}")).unwrap_or_default()
                ))
            }
            None => return Err(format!("invocation {i}: the run's stream ended early")),
        }
    }
    let session = store
        .get_session(key, None)
        .await
        .map_err(|e| format!("cannot read the eval session: {e}"))?
        .ok_or("the eval session is gone")?;
    Ok(from_session::invocations(&session.events))
}

/// An invocation's `user_content` as the content of a new message (the file form's
/// snake_case part fields are the aliases [`Content`]'s parts read).
fn user_message(invocation: &Doc) -> Result<Content, String> {
    let content = invocation
        .get("user_content")
        .ok_or("it has no user_content")?;
    let value = serde_json::to_value(content).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| format!("its user_content is not a Content: {e}"))
}
