//! ADK's eval metrics, computed as google-adk 2.13 computes them, and the criteria of an
//! eval config (`test_config.json`) that name them.
//!
//! The deterministic metrics `tool_trajectory_avg_score` ([`trajectory`]) and
//! `response_match_score` ([`rouge`]), and the LLM-as-judge `final_response_match_v2`
//! ([`judge`]) and the rubric-based ones ([`rubric`]). A config naming another metric
//! (`hallucinations_v1`, the multi-turn and efficiency ones) is refused by [`Criteria::parse`], never scored as a pass.

pub mod judge;
pub mod rouge;
pub mod rubric;
pub mod trajectory;

use super::doc::Doc;
use trajectory::MatchType;

pub const TOOL_TRAJECTORY: &str = "tool_trajectory_avg_score";
pub const RESPONSE_MATCH: &str = "response_match_score";

/// ADK's `EvalStatus`, with its integer values (what its result files hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Passed = 1,
    Failed = 2,
    NotEvaluated = 3,
}

impl Status {
    pub fn of(score: f64, threshold: f64) -> Status {
        if score >= threshold {
            Status::Passed
        } else {
            Status::Failed
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Status::Passed => "PASSED",
            Status::Failed => "FAILED",
            Status::NotEvaluated => "NOT_EVALUATED",
        }
    }
}

/// What a metric measures.
#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    ToolTrajectory {
        match_type: MatchType,
        ignore_args: bool,
    },
    ResponseMatch,
    /// `final_response_match_v2`: a judge model's verdict on each final response.
    FinalResponseMatch(judge::Judge),
    /// `rubric_based_*`: a judge model's verdicts on each invocation against rubrics.
    Rubric(rubric::RubricJudge),
}

/// One criterion: a metric and the score a case needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Criterion {
    pub name: String,
    pub metric: Metric,
    pub threshold: f64,
}

/// The criteria a set is scored by.
#[derive(Debug, Clone, PartialEq)]
pub struct Criteria(pub Vec<Criterion>);

impl Default for Criteria {
    /// ADK's defaults when no config is given: every tool call as expected, and a final
    /// response with ROUGE-1 ≥ 0.8.
    fn default() -> Self {
        Criteria(vec![
            Criterion {
                name: TOOL_TRAJECTORY.into(),
                metric: Metric::ToolTrajectory {
                    match_type: MatchType::Exact,
                    ignore_args: false,
                },
                threshold: 1.0,
            },
            Criterion {
                name: RESPONSE_MATCH.into(),
                metric: Metric::ResponseMatch,
                threshold: 0.8,
            },
        ])
    }
}

impl Criteria {
    /// ADK's `EvalConfig`: `{"criteria": {"<metric>": <threshold> | {"threshold": …, …}}}`.
    pub fn parse(config: &Doc) -> Result<Criteria, String> {
        let Some(Doc::Object(criteria)) = config.get("criteria") else {
            return Err("the eval config needs a \"criteria\" object".into());
        };
        let mut out = vec![];
        for (name, value) in criteria {
            let (threshold, options) = match value {
                Doc::Number(n) => (n.as_f64(), None),
                Doc::Object(_) => (value.get("threshold").and_then(number), Some(value)),
                _ => (None, None),
            };
            let Some(threshold) = threshold else {
                return Err(format!("criterion {name:?} needs a numeric threshold"));
            };
            let metric = match name.as_str() {
                TOOL_TRAJECTORY => {
                    // pydantic reads a criterion's fields by camelCase alias or by name, the
                    // alias first when both are given.
                    let field = |snake: &str, camel: &str| {
                        options.and_then(|o| o.get(camel).or_else(|| o.get(snake)))
                    };
                    let match_type = match field("match_type", "matchType") {
                        None => MatchType::Exact,
                        Some(m) => MatchType::parse(m).ok_or_else(|| {
                            format!("{name}: match_type must be EXACT, IN_ORDER or ANY_ORDER")
                        })?,
                    };
                    let ignore_args = match field("ignore_args", "ignoreArgs") {
                        None => false,
                        Some(b) => py_bool(b)
                            .ok_or_else(|| format!("{name}: ignore_args must be a boolean"))?,
                    };
                    Metric::ToolTrajectory {
                        match_type,
                        ignore_args,
                    }
                }
                RESPONSE_MATCH => Metric::ResponseMatch,
                judge::FINAL_RESPONSE_MATCH_V2 => {
                    Metric::FinalResponseMatch(judge::Judge::parse(name, options)?)
                }
                rubric::FINAL_RESPONSE_QUALITY_V1 => Metric::Rubric(rubric::RubricJudge::parse(
                    name,
                    rubric::Quality::FinalResponse,
                    options,
                )?),
                rubric::TOOL_USE_QUALITY_V1 => Metric::Rubric(rubric::RubricJudge::parse(
                    name,
                    rubric::Quality::ToolUse,
                    options,
                )?),
                other => {
                    return Err(format!(
                        "metric {other:?} is not available in agentd (available: {TOOL_TRAJECTORY}, {RESPONSE_MATCH}, {}, {}, {})",
                        judge::FINAL_RESPONSE_MATCH_V2,
                        rubric::FINAL_RESPONSE_QUALITY_V1,
                        rubric::TOOL_USE_QUALITY_V1,
                    ))
                }
            };
            out.push(Criterion {
                name: name.clone(),
                metric,
                threshold,
            });
        }
        if out.is_empty() {
            return Err("the eval config names no criteria".into());
        }
        Ok(Criteria(out))
    }
}

/// ADK's `MetricInfo` of each metric agentd computes, as its dev server's `metrics-info`
/// answers (the descriptions are ADK's): what the web UI offers to run a set with.
pub fn info() -> Doc {
    let interval = || {
        Doc::object().with(
            "interval",
            Doc::object()
                .with("minValue", Doc::float(0.0))
                .with("openAtMin", Doc::Bool(false))
                .with("maxValue", Doc::float(1.0))
                .with("openAtMax", Doc::Bool(false)),
        )
    };
    let metric = |name: &str, description: &str| {
        Doc::object()
            .with("metricName", Doc::str(name))
            .with("description", Doc::str(description))
            .with("metricValueInfo", interval())
            .with("requiresThreshold", Doc::Bool(true))
    };
    Doc::object().with(
        "metricsInfo",
        Doc::Array(vec![
            metric(
                TOOL_TRAJECTORY,
                "This metric compares two tool call trajectories (expected vs. actual) for the \
                 same user interaction. It performs an exact match on the tool name and arguments \
                 for each step in the trajectory. A score of 1.0 indicates a perfect match, while \
                 0.0 indicates a mismatch. Higher values are better.",
            ),
            metric(
                RESPONSE_MATCH,
                "This metric evaluates if the agent's final response matches a golden/expected \
                 final response using Rouge_1 metric. Value range for this metric is [0,1], with \
                 values closer to 1 more desirable.",
            ),
            metric(
                judge::FINAL_RESPONSE_MATCH_V2,
                "This metric evaluates if the agent's final response matches a golden/expected \
                 final response using LLM as a judge. Value range for this metric is [0,1], with \
                 values closer to 1 more desirable.",
            ),
            metric(
                rubric::FINAL_RESPONSE_QUALITY_V1,
                "This metric assess if the agent's final response against a set of rubrics \
                 using LLM as a judge. Value range for this metric is [0,1], with values closer \
                 to 1 more desirable.",
            ),
            metric(
                rubric::TOOL_USE_QUALITY_V1,
                "This metric assess if the agent's usage of tools against a set of rubrics \
                 using LLM as a judge. Value range for this metric is [0,1], with values closer \
                 to 1 more desirable.",
            ),
        ]),
    )
}

/// A boolean as pydantic reads one: `true`/`false`, 0 or 1, or a word (`"yes"`, `"off"`, …).
fn py_bool(d: &Doc) -> Option<bool> {
    match d {
        Doc::Bool(b) => Some(*b),
        Doc::Number(n) => n
            .as_f64()
            .filter(|x| *x == 0.0 || *x == 1.0)
            .map(|x| x == 1.0),
        Doc::String(s) => match s.to_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
            _ => None,
        },
        _ => None,
    }
}

fn number(d: &Doc) -> Option<f64> {
    match d {
        Doc::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// A metric's verdict on one case.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The mean of the invocations' scores; `None` when there were none.
    pub score: Option<f64>,
    pub status: Status,
    /// Per invocation, in order; `None` for one a judge could not decide.
    pub per_invocation: Vec<Option<f64>>,
    /// A rubric metric's scores of each rubric (ADK's `details.rubric_scores`).
    pub rubrics: Option<rubric::RubricDetails>,
}

/// Scores `actual` against `expected` invocations (file form, paired in order); a judge
/// metric asks the judge `judges` name (the app's `evals:`), at `payer`'s cost.
pub async fn score(
    c: &Criterion,
    judges: &judge::JudgeSettings,
    payer: &judge::Payer<'_>,
    actual: &[Doc],
    expected: &[Doc],
) -> Result<Scored, String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "the case expects {} invocations and the run made {}",
            expected.len(),
            actual.len()
        ));
    }
    let per_invocation: Vec<f64> = match &c.metric {
        Metric::FinalResponseMatch(j) => {
            return judge::score(c, j, judges, payer, actual, expected).await
        }
        Metric::Rubric(r) => {
            let (mut scored, details) = rubric::score(c, r, judges, payer, actual).await?;
            scored.rubrics = Some(details);
            return Ok(scored);
        }
        Metric::ToolTrajectory {
            match_type,
            ignore_args,
        } => actual
            .iter()
            .zip(expected)
            .map(|(a, e)| {
                if trajectory::matches(a, e, *match_type, *ignore_args) {
                    1.0
                } else {
                    0.0
                }
            })
            .collect(),
        Metric::ResponseMatch => actual
            .iter()
            .zip(expected)
            .map(|(a, e)| rouge::rouge1(&final_text(a), &final_text(e)).fmeasure)
            .collect(),
    };
    if per_invocation.is_empty() {
        return Ok(Scored {
            score: None,
            status: Status::NotEvaluated,
            per_invocation: Vec::new(),
            rubrics: None,
        });
    }
    let mean = per_invocation.iter().sum::<f64>() / per_invocation.len() as f64;
    Ok(Scored {
        score: Some(mean),
        status: Status::of(mean, c.threshold),
        per_invocation: per_invocation.into_iter().map(Some).collect(),
        rubrics: None,
    })
}

/// The text parts of an invocation's final response, one per line (ADK's
/// `_get_text_from_content`).
pub fn final_text(invocation: &Doc) -> String {
    content_text(invocation.get("final_response"))
}

/// The text parts of a content (file form), one per line; `""` when it has none.
pub fn content_text(content: Option<&Doc>) -> String {
    content
        .and_then(|c| c.get("parts"))
        .and_then(Doc::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Doc::as_str))
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_as_adk_reads_them() {
        let c = Criteria::parse(
            &Doc::parse(
                r#"{"criteria": {"tool_trajectory_avg_score": {"threshold": 0.5, "match_type": "IN_ORDER"},
                    "response_match_score": 0.7}}"#,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(c.0.len(), 2);
        assert_eq!(c.0[0].threshold, 0.5);
        assert_eq!(
            c.0[0].metric,
            Metric::ToolTrajectory {
                match_type: MatchType::InOrder,
                ignore_args: false
            }
        );
        let lax = Doc::parse(
            r#"{"criteria": {"tool_trajectory_avg_score": {"threshold": 1, "match_type": " any-order ",
                "matchType": "in order", "ignore_args": "yes"}}}"#,
        )
        .unwrap();
        assert_eq!(
            Criteria::parse(&lax).unwrap().0[0].metric,
            Metric::ToolTrajectory {
                match_type: MatchType::InOrder,
                ignore_args: true
            }
        );
        for bad in [
            r#"{"match_type": null}"#,
            r#"{"match_type": "SOMETIMES"}"#,
            r#"{"ignore_args": "banana"}"#,
        ] {
            let mut criterion = Doc::parse(bad).unwrap();
            criterion.set("threshold", Doc::float(1.0));
            let config =
                Doc::object().with("criteria", Doc::object().with(TOOL_TRAJECTORY, criterion));
            assert!(Criteria::parse(&config).is_err(), "{bad} is refused");
        }
        let rubric = Doc::parse(r#"{"criteria": {"hallucinations_v1": 0.8}}"#).unwrap();
        assert!(Criteria::parse(&rubric)
            .unwrap_err()
            .contains("not available"));
        let judge = Doc::parse(r#"{"criteria": {"final_response_match_v2": 0.8}}"#).unwrap();
        assert!(matches!(
            &Criteria::parse(&judge).unwrap().0[0].metric,
            Metric::FinalResponseMatch(j) if j.num_samples == judge::DEFAULT_SAMPLES
        ));
        assert!(Criteria::parse(&Doc::parse("{}").unwrap()).is_err());
    }
}
