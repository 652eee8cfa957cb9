//! ADK's result models in the file form (`EvalSetResult`, `EvalCaseResult` and the metric
//! results inside), built from how cases went: what `agentd eval` writes to its result file
//! and what a stored run keeps per case ([`crate::store::EvalRunStore`]). Statuses are ADK's
//! integers; [`super::shape`] gives the wire form.

use super::doc::Doc;
use super::metrics::rubric::RubricScore;
use super::metrics::{Criterion, Scored, Status};
use super::replay::CaseResult;

/// ADK's result id of a run of `set_id` started at `now`: `{app}_{set}_{timestamp}`.
pub fn result_id(app: &str, set_id: &str, now: f64) -> String {
    format!("{app}_{set_id}_{now}")
}

/// The `EvalSetResult` of `cases` (each an [`case_result`]).
pub fn set_result(id: &str, set_id: &str, cases: Vec<Doc>, created: f64) -> Doc {
    Doc::object()
        .with("eval_set_result_id", Doc::str(id))
        .with("eval_set_result_name", Doc::str(id))
        .with("eval_set_id", Doc::str(set_id))
        .with("eval_case_results", Doc::Array(cases))
        .with("creation_timestamp", Doc::float(created))
}

/// The result file: ADK's `EvalSetResult` of cases run now.
pub fn result_document(app: &str, set_id: &str, results: &[CaseResult]) -> Doc {
    let now = crate::event::now_ts();
    let cases = results.iter().map(|r| case_result(set_id, r)).collect();
    set_result(&result_id(app, set_id, now), set_id, cases, now)
}

/// One case's `EvalCaseResult`. A case that could not be run has empty metric lists, as ADK
/// writes one, and `error`.
pub fn case_result(set_id: &str, r: &CaseResult) -> Doc {
    let case = Doc::object()
        .with("eval_set_file", Doc::str(set_id))
        .with("eval_set_id", Doc::str(set_id))
        .with("eval_id", Doc::str(&r.eval_id))
        .with("final_eval_status", Doc::Number((r.status() as i64).into()));
    let (overall, per) = match &r.metrics {
        Ok(m) => (
            m.iter()
                .map(|(c, s)| {
                    let r = metric_result(&c.name, c.threshold, s.score, s.status);
                    with_rubrics(r, s.rubrics.as_ref().map(|d| d.overall.as_slice()))
                })
                .collect(),
            per_invocation(r, m),
        ),
        Err(_) => (vec![], vec![]),
    };
    let mut case = case
        .with("overall_eval_metric_results", Doc::Array(overall))
        .with("eval_metric_result_per_invocation", Doc::Array(per));
    if let Err(e) = &r.metrics {
        case.set("error", Doc::str(e));
    }
    case.with("session_id", Doc::str(&r.session_id))
        .with("user_id", Doc::str(&r.user_id))
}

fn metric_result(name: &str, threshold: f64, score: Option<f64>, status: Status) -> Doc {
    let mut m = Doc::object()
        .with("metric_name", Doc::str(name))
        .with("threshold", Doc::float(threshold));
    if let Some(score) = score {
        m.set("score", Doc::float(score));
    }
    m.with("eval_status", Doc::Number((status as i64).into()))
}

/// A rubric metric's result carries its rubrics' scores, as ADK's `details.rubric_scores`.
fn with_rubrics(result: Doc, rubrics: Option<&[RubricScore]>) -> Doc {
    match rubrics {
        Some(r) => result.with(
            "details",
            Doc::object().with(
                "rubric_scores",
                Doc::Array(r.iter().map(RubricScore::doc).collect()),
            ),
        ),
        None => result,
    }
}

/// Per invocation: the actual and expected invocations and each metric's score of the pair.
fn per_invocation(r: &CaseResult, metrics: &[(Criterion, Scored)]) -> Vec<Doc> {
    r.actual
        .iter()
        .zip(&r.expected)
        .enumerate()
        .map(|(i, (a, e))| {
            let results = metrics
                .iter()
                .map(|(c, s)| {
                    let score = s.per_invocation.get(i).copied().flatten();
                    let status = score.map_or(Status::NotEvaluated, |x| Status::of(x, c.threshold));
                    let rubrics = s
                        .rubrics
                        .as_ref()
                        .and_then(|d| d.per_invocation.get(i))
                        .and_then(|r| r.as_deref());
                    with_rubrics(metric_result(&c.name, c.threshold, score, status), rubrics)
                })
                .collect();
            Doc::object()
                .with("actual_invocation", a.clone())
                .with("expected_invocation", e.clone())
                .with("eval_metric_results", Doc::Array(results))
        })
        .collect()
}
