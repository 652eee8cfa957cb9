//! ADK's rubric-based LLM-as-judge metrics, `rubric_based_final_response_quality_v1` and
//! `rubric_based_tool_use_quality_v1`: a judge model is asked, for each invocation, whether
//! the agent's answer (or its tool use) has each of a list of properties (the rubrics), and
//! answers a verdict per rubric; as google-adk 2.13's `RubricBasedEvaluator` scores them:
//!
//! - the rubrics of an invocation are the criterion's, then the case's and the expected
//!   invocation's of the metric's type (`FINAL_RESPONSE_QUALITY`, `TOOL_USE_QUALITY`),
//!   copied onto the actual invocation as ADK's eval service copies them; a rubric id given
//!   twice, or no rubric at all, fails the case;
//! - each invocation is asked `num_samples` times; per rubric the majority of the verdicts
//!   decides (a tie is a no), and the invocation's score is the mean of its rubrics'; an
//!   invocation with a failed judge call is not evaluated;
//! - the case's score is the mean of every rubric score of every invocation, and each
//!   rubric's own mean is reported beside it (`details.rubric_scores`).
//!
//! The judge's answer is read as ADK reads it ([`parse`]): blocks of `ID:`, `Property:`,
//! `Rationale:` and `Verdict:` lines, a rubric found by its id, else by its text. The
//! prompts are agentd's own wording ([`prompt`]).

use super::judge::{response_text, Asking, Judge, JudgeSettings, Payer, PY_WS};
use super::{content_text, Criterion, Scored, Status};
use crate::eval::doc::Doc;
use crate::event::Content;
use crate::model::LlmRequest;
use std::sync::OnceLock;

pub const FINAL_RESPONSE_QUALITY_V1: &str = "rubric_based_final_response_quality_v1";
pub const TOOL_USE_QUALITY_V1: &str = "rubric_based_tool_use_quality_v1";

/// The most rubrics one invocation is judged by (each is a block of the judge's answer).
pub const MAX_RUBRICS: usize = 50;

/// What a rubric metric judges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quality {
    FinalResponse,
    ToolUse,
}

impl Quality {
    /// The rubric `type` of the case's and invocations' rubrics this metric takes.
    fn rubric_type(self) -> &'static str {
        match self {
            Quality::FinalResponse => "FINAL_RESPONSE_QUALITY",
            Quality::ToolUse => "TOOL_USE_QUALITY",
        }
    }
}

/// One rubric: a property the answer should have.
#[derive(Debug, Clone, PartialEq)]
pub struct Rubric {
    pub id: String,
    pub text: String,
    pub kind: Option<String>,
}

impl Rubric {
    /// ADK's `Rubric` (file form, or camelCase as pydantic also reads it).
    fn parse(d: &Doc) -> Result<Rubric, String> {
        let field =
            |o: &Doc, snake: &str, camel: &str| o.get(camel).or_else(|| o.get(snake)).cloned();
        let id = field(d, "rubric_id", "rubricId")
            .and_then(|i| i.as_str().map(str::to_string))
            .ok_or("a rubric needs a rubric_id")?;
        let text = field(d, "rubric_content", "rubricContent")
            .and_then(|c| field(&c, "text_property", "textProperty"))
            .and_then(|t| t.as_str().map(str::to_string))
            .unwrap_or_default();
        let kind = d.get("type").and_then(Doc::as_str).map(str::to_string);
        Ok(Rubric { id, text, kind })
    }
}

/// A rubric criterion's options: the judge's and the criterion's own rubrics.
#[derive(Debug, Clone, PartialEq)]
pub struct RubricJudge {
    pub quality: Quality,
    pub judge: Judge,
    pub rubrics: Vec<Rubric>,
}

impl RubricJudge {
    pub fn parse(
        name: &str,
        quality: Quality,
        options: Option<&Doc>,
    ) -> Result<RubricJudge, String> {
        let judge = Judge::parse(name, options)?;
        let rubrics = match options.and_then(|o| o.get("rubrics")) {
            None | Some(Doc::Null) => vec![],
            Some(Doc::Array(list)) => list
                .iter()
                .map(Rubric::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{name}: {e}"))?,
            Some(_) => return Err(format!("{name}: rubrics must be a list")),
        };
        if rubrics.len() > MAX_RUBRICS {
            return Err(format!("{name}: at most {MAX_RUBRICS} rubrics"));
        }
        if let Some(twice) = rubrics
            .iter()
            .enumerate()
            .find(|(i, r)| rubrics[..*i].iter().any(|o| o.id == r.id))
        {
            return Err(format!("{name}: rubric {:?} is given twice", twice.1.id));
        }
        Ok(RubricJudge {
            quality,
            judge,
            rubrics,
        })
    }

    /// The rubrics `actual` is judged by: the criterion's, then the invocation's (copied from
    /// the case and the expected invocation) of this metric's type.
    fn effective(&self, actual: &Doc) -> Result<Vec<Rubric>, String> {
        let mut out = self.rubrics.clone();
        let own = actual.get("rubrics").and_then(Doc::as_array);
        for r in own.into_iter().flatten() {
            let r = Rubric::parse(r)?;
            if r.kind.as_deref() == Some(self.quality.rubric_type()) {
                if out.iter().any(|o| o.id == r.id) {
                    return Err(format!(
                        "rubric {:?} of the invocation is also the criterion's",
                        r.id
                    ));
                }
                out.push(r);
            }
        }
        if out.is_empty() {
            return Err(
                "the metric needs rubrics (the criterion's, the case's or an invocation's)".into(),
            );
        }
        if out.len() > MAX_RUBRICS {
            return Err(format!("at most {MAX_RUBRICS} rubrics an invocation"));
        }
        Ok(out)
    }
}

/// The rubrics each invocation of `case` gets from the case and from its expected invocation
/// (ADK's eval service copies them onto the actual invocations before its evaluators run):
/// the case's, then the expected invocation's. Checked before the case is replayed: a rubric
/// id given twice, or more than [`MAX_RUBRICS`] for one invocation, is an error.
pub fn rubric_lists(case: &Doc, expected: &[Doc]) -> Result<Vec<Vec<Doc>>, String> {
    let list = |d: Option<&Doc>| -> Vec<Doc> {
        d.and_then(|d| d.get("rubrics"))
            .and_then(Doc::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let of_case = list(Some(case));
    expected
        .iter()
        .map(|e| {
            let all: Vec<Doc> = of_case.iter().cloned().chain(list(Some(e))).collect();
            if all.len() > MAX_RUBRICS {
                return Err(format!("at most {MAX_RUBRICS} rubrics an invocation"));
            }
            let mut ids = std::collections::HashSet::new();
            for r in &all {
                let id = r
                    .get("rubric_id")
                    .or_else(|| r.get("rubricId"))
                    .map(Doc::to_compact)
                    .unwrap_or_default();
                if !ids.insert(id.clone()) {
                    return Err(format!("rubric {id} is given twice"));
                }
            }
            Ok(all)
        })
        .collect()
}

/// Puts `lists` (from [`rubric_lists`]) onto the actual invocations, in order.
pub fn copy_rubrics(lists: Vec<Vec<Doc>>, actual: &mut [Doc]) {
    for (a, list) in actual.iter_mut().zip(lists) {
        if !list.is_empty() {
            a.set("rubrics", Doc::Array(list));
        }
    }
}

/// A rubric's score in one sample, one invocation or the case.
#[derive(Debug, Clone, PartialEq)]
pub struct RubricScore {
    pub id: String,
    pub rationale: Option<String>,
    pub score: Option<f64>,
}

impl RubricScore {
    /// ADK's `RubricScore` (file form).
    pub fn doc(&self) -> Doc {
        let mut d = Doc::object().with("rubric_id", Doc::str(&self.id));
        d.set(
            "rationale",
            self.rationale.as_deref().map_or(Doc::Null, Doc::str),
        );
        d.set("score", self.score.map_or(Doc::Null, Doc::float));
        d
    }
}

/// The rubric scores of a judged case: per invocation (`None`: not evaluated), and per rubric
/// over the case.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RubricDetails {
    pub per_invocation: Vec<Option<Vec<RubricScore>>>,
    pub overall: Vec<RubricScore>,
}

/// One block of the judge's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub id: Option<String>,
    pub property: String,
    pub rationale: String,
    pub score: Option<f64>,
}

fn re(
    cell: &'static OnceLock<Option<regex::Regex>>,
    pattern: &str,
) -> Option<&'static regex::Regex> {
    cell.get_or_init(|| regex::Regex::new(pattern).ok())
        .as_ref()
}

/// The judge's answer read as ADK's `DefaultAutoRaterResponseParser` reads it: every
/// `Property:` line, `Rationale:` and `Verdict:` (a verdict holding "yes" is 1, else one
/// holding "no" is 0, else no score), each property with the `ID:` line just before it. When
/// the three counts differ nothing is read (a partial answer would leave a rubric out).
pub fn parse(answer: &str) -> Vec<Verdict> {
    static ID: OnceLock<Option<regex::Regex>> = OnceLock::new();
    static PROPERTY: OnceLock<Option<regex::Regex>> = OnceLock::new();
    static RATIONALE: OnceLock<Option<regex::Regex>> = OnceLock::new();
    static VERDICT: OnceLock<Option<regex::Regex>> = OnceLock::new();
    let (Some(id), Some(property), Some(rationale), Some(verdict)) = (
        // ADK's patterns, `\s` spelled out ([`PY_WS`]).
        re(&ID, &format!(r"(?m)^[{PY_WS}]*ID: (.*)$")),
        re(&PROPERTY, &format!(r"(?m)^[{PY_WS}]*Property: (.*)$")),
        re(&RATIONALE, r"Rationale: (.*)"),
        re(&VERDICT, r"Verdict: (.*)"),
    ) else {
        return vec![];
    };
    let group = |c: regex::Captures<'_>| {
        c.get(1)
            .map(|m| (c.get(0).map_or(0, |m| m.start()), m.as_str().to_string()))
    };
    let properties: Vec<(usize, String)> =
        property.captures_iter(answer).filter_map(group).collect();
    let ids: Vec<(usize, String)> = id.captures_iter(answer).filter_map(group).collect();
    let rationales: Vec<String> = rationale
        .captures_iter(answer)
        .filter_map(group)
        .map(|g| g.1)
        .collect();
    let scores: Vec<Option<f64>> = verdict
        .captures_iter(answer)
        .filter_map(group)
        .map(|(_, v)| {
            let v = v.to_lowercase();
            if v.contains("yes") {
                Some(1.0)
            } else if v.contains("no") {
                Some(0.0)
            } else {
                None
            }
        })
        .collect();
    if properties.len() != rationales.len() || rationales.len() != scores.len() {
        return vec![];
    }
    properties
        .iter()
        .enumerate()
        .zip(rationales.into_iter().zip(scores))
        .map(|((i, (start, text)), (rationale, score))| {
            let previous = if i > 0 {
                Some(properties[i - 1].0)
            } else {
                None
            };
            let id = ids
                .iter()
                .rfind(|(at, _)| previous.is_none_or(|p| p < *at) && at < start)
                .map(|(_, id)| id.trim().to_string())
                .filter(|id| !id.is_empty());
            Verdict {
                id,
                property: text.trim().to_string(),
                rationale: rationale.trim().to_string(),
                score,
            }
        })
        .collect()
}

/// A rubric's text as ADK compares it with what the judge echoed: NFKC, typographic quotes
/// and dashes made plain, white space collapsed, markdown decoration stripped, lower case.
pub fn normalise(text: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    let plain: String = text
        .nfkc()
        .map(|c| match c {
            '\u{2018}' | '\u{2019}' => '\'',
            '\u{201c}' | '\u{201d}' => '"',
            '\u{2013}' | '\u{2014}' => '-',
            c => c,
        })
        .collect();
    let collapsed = plain.split_whitespace().collect::<Vec<_>>().join(" ");
    let decoration = [' ', '*', '_', '`', '#', '>', '-', '\u{2022}', '"', '\''];
    collapsed.trim_matches(&decoration[..]).to_lowercase()
}

/// One sample's rubric scores: each verdict matched to a rubric by its id, else by its text;
/// a verdict of no rubric is left out.
pub fn sample_scores(verdicts: &[Verdict], rubrics: &[Rubric]) -> Vec<RubricScore> {
    verdicts
        .iter()
        .filter_map(|v| {
            let by_id = v.id.as_ref().and_then(|id| rubrics.iter().find(|r| &r.id == id));
            let rubric = by_id.or_else(|| {
                // ADK's map of texts keeps the last rubric of a text.
                let text = normalise(&v.property);
                rubrics.iter().rev().find(|r| normalise(&r.text) == text)
            });
            match rubric {
                Some(r) => Some(RubricScore {
                    id: r.id.clone(),
                    rationale: Some(v.rationale.clone()),
                    score: v.score,
                }),
                None => {
                    tracing::debug!(property = %v.property, "the judge rated a property that is not a rubric of the metric");
                    None
                }
            }
        })
        .collect()
}

/// The mean of the scores that are there; `None` when none is.
fn mean(scores: &[RubricScore]) -> Option<f64> {
    let s: Vec<f64> = scores.iter().filter_map(|r| r.score).collect();
    (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64)
}

/// One invocation's samples decided per rubric by majority (ADK's
/// `MajorityVotePerInvocationResultsAggregator`): a yes when more samples say yes than no,
/// else a no (a tie too), else the rubric's first unscored verdict; rubrics in the order the
/// samples first rated them.
pub fn majority(samples: &[Vec<RubricScore>]) -> Vec<RubricScore> {
    let mut order: Vec<&str> = vec![];
    for s in samples.iter().flatten() {
        if !order.contains(&s.id.as_str()) {
            order.push(&s.id);
        }
    }
    order
        .into_iter()
        .filter_map(|id| {
            let of = || samples.iter().flatten().filter(move |s| s.id == id);
            let yes: Vec<&RubricScore> = of().filter(|s| s.score == Some(1.0)).collect();
            let no: Vec<&RubricScore> = of()
                .filter(|s| s.score.is_some() && s.score != Some(1.0))
                .collect();
            let pick = if yes.is_empty() && no.is_empty() {
                of().next()
            } else if yes.len() > no.len() {
                yes.first().copied()
            } else {
                no.first().copied()
            };
            pick.cloned()
        })
        .collect()
}

/// The case's score and each rubric's (ADK's `MeanInvocationResultsSummarizer`): the mean of
/// every rubric score of the evaluated invocations, and per rubric the mean of its own.
pub fn overall(
    per_invocation: Vec<Option<Vec<RubricScore>>>,
    threshold: f64,
) -> (Scored, RubricDetails) {
    let all: Vec<RubricScore> = per_invocation.iter().flatten().flatten().cloned().collect();
    let mut ids: Vec<&str> = vec![];
    for s in &all {
        if !ids.contains(&s.id.as_str()) {
            ids.push(&s.id);
        }
    }
    let by_rubric = ids
        .iter()
        .map(|id| {
            let own: Vec<RubricScore> = all.iter().filter(|s| s.id == *id).cloned().collect();
            RubricScore {
                id: id.to_string(),
                rationale: Some(
                    "The mean of this rubric's scores over the case's invocations.".into(),
                ),
                score: mean(&own),
            }
        })
        .collect();
    let scores: Vec<Option<f64>> = per_invocation
        .iter()
        .map(|i| i.as_ref().and_then(|s| mean(s)))
        .collect();
    let score = if per_invocation.is_empty() {
        None
    } else {
        mean(&all)
    };
    let scored = Scored {
        score,
        status: score.map_or(Status::NotEvaluated, |s| Status::of(s, threshold)),
        per_invocation: scores,
        rubrics: None,
    };
    (
        scored,
        RubricDetails {
            per_invocation,
            overall: by_rubric,
        },
    )
}

/// Scores `actual` (with its rubrics copied on, [`copy_rubrics`]) by asking the judge.
pub async fn score(
    c: &Criterion,
    metric: &RubricJudge,
    settings: &JudgeSettings,
    payer: &Payer<'_>,
    actual: &[Doc],
) -> Result<(Scored, RubricDetails), String> {
    let mut prompts = Vec::with_capacity(actual.len());
    for a in actual {
        let rubrics = metric
            .effective(a)
            .map_err(|e| format!("{}: {e}", c.name))?;
        prompts.push((
            prompt(
                metric.quality,
                a,
                &rubrics,
                metric.judge.include_intermediate,
            ),
            rubrics,
        ));
    }
    let model = metric.judge.model(settings)?;
    let mut asked = Asking::new(c, model.as_ref());
    let mut per_invocation = Vec::with_capacity(actual.len());
    for (text, rubrics) in prompts {
        let request = LlmRequest {
            model: model.name().to_string(),
            contents: vec![Content::text("user", text)],
            config: metric.judge.config.clone(),
            ..Default::default()
        };
        let answers = asked
            .samples(&request, metric.judge.num_samples, payer)
            .await?;
        per_invocation.push(answers.map(|answers| {
            let samples: Vec<Vec<RubricScore>> = answers
                .iter()
                .map(|a| sample_scores(&parse(a), &rubrics))
                .collect();
            majority(&samples)
        }));
    }
    asked.done()?;
    Ok(overall(per_invocation, c.threshold))
}

/// The tool calls of an invocation with their responses, in order (ADK's
/// `get_all_tool_calls_with_responses`), as JSON for the judge.
fn steps(invocation: &Doc) -> serde_json::Value {
    let data = invocation.get("intermediate_data");
    let parts: Vec<&Doc> = data
        .and_then(|d| d.get("invocation_events"))
        .and_then(Doc::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("content")?.get("parts")?.as_array())
        .flatten()
        .collect();
    let json = |d: Option<&Doc>| {
        d.and_then(|d| serde_json::to_value(d).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    let mut calls: Vec<(Option<&Doc>, serde_json::Value)> = parts
        .iter()
        .filter_map(|p| p.get("function_call").filter(|c| !matches!(c, Doc::Null)))
        .map(|c| (c.get("id"), json(Some(c))))
        .collect();
    if calls.is_empty() {
        if let Some(uses) = data
            .and_then(|d| d.get("tool_uses"))
            .and_then(Doc::as_array)
        {
            calls = uses.iter().map(|c| (c.get("id"), json(Some(c)))).collect();
        }
    }
    let responses: Vec<&Doc> = parts
        .iter()
        .filter_map(|p| {
            p.get("function_response")
                .filter(|r| !matches!(r, Doc::Null))
        })
        .chain(
            data.and_then(|d| d.get("tool_responses"))
                .and_then(Doc::as_array)
                .into_iter()
                .flatten(),
        )
        .collect();
    let steps: Vec<serde_json::Value> = calls
        .into_iter()
        .enumerate()
        .map(|(i, (id, call))| {
            let response = id
                .filter(|id| !matches!(id, Doc::Null))
                .and_then(|id| responses.iter().find(|r| r.get("id") == Some(id)))
                .map(|r| json(Some(r)));
            serde_json::json!({"step": i, "tool_call": call, "tool_response": response.unwrap_or(serde_json::Value::Null)})
        })
        .collect();
    serde_json::Value::Array(steps)
}

/// The question put to the judge: what to rate, the invocation as one JSON object (so that
/// no text of it can pose as the question's end), the rubrics with their ids, and the answer
/// format [`parse`] reads.
pub fn prompt(
    quality: Quality,
    actual: &Doc,
    rubrics: &[Rubric],
    include_intermediate: bool,
) -> String {
    let user = content_text(actual.get("user_content"));
    let (task, inputs) = match quality {
        Quality::FinalResponse => (
            "Rate the final answer an AI agent gave its user. Judge only the properties listed \
             below, each on its own. The user's message and the results of the agent's tool \
             calls are the trusted facts; the agent's own words are not. A property whose \
             condition does not apply to this answer is fulfilled.",
            serde_json::json!({
                "user_prompt": user,
                "tool_calls_and_responses": steps(actual),
                "final_answer": response_text(actual, include_intermediate),
            }),
        ),
        Quality::ToolUse => (
            "Rate how an AI agent used its tools to answer its user: which tools it called, in \
             which order, with which arguments. Judge only the properties listed below, each on \
             its own. A property whose condition does not apply is fulfilled.",
            serde_json::json!({
                "user_prompt": user,
                "tool_calls_and_responses": steps(actual),
            }),
        ),
    };
    let properties: Vec<String> = rubrics
        .iter()
        .map(|r| format!("*  [id: {}] {}", r.id, r.text))
        .collect();
    format!(
        "{task}\n\nThe agent's turn:\n{inputs}\n\nThe properties:\n{}\n\n\
         For every property, answer with these lines, in this order, and nothing else between \
         the blocks:\n\
         ID: <the id in the property's [id: …] tag, as written>\n\
         Property: <the property's text after the tag, word for word>\n\
         Rationale: <why, in one or two sentences on one line>\n\
         Verdict: <yes or no>\n",
        properties.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rubric(id: &str, text: &str) -> Rubric {
        Rubric {
            id: id.into(),
            text: text.into(),
            kind: None,
        }
    }

    #[test]
    fn answers_are_read_as_adk_reads_them() {
        let answer = "ID: r1\nProperty: The answer is short.\nEvidence: n/a\nRationale: It is.\nVerdict: yes\n\n\
                      Property: **The answer names the city.**\nRationale: It does not.\nVerdict: No\n\n\
                      ID: r3\nProperty: Polite\nRationale: Unclear\nVerdict: maybe\n";
        let v = parse(answer);
        assert_eq!(v.len(), 3);
        assert_eq!((v[0].id.as_deref(), v[0].score), (Some("r1"), Some(1.0)));
        // No ID line right before it: the earlier block's id is not taken.
        assert_eq!((v[1].id.as_deref(), v[1].score), (None, Some(0.0)));
        assert_eq!((v[2].id.as_deref(), v[2].score), (Some("r3"), None));
        // A rationale left out: nothing is read.
        assert!(parse("Property: a\nVerdict: yes\n").is_empty());
        let rubrics = [
            rubric("r1", "The answer is short."),
            rubric("r2", "The answer names the “city”."),
        ];
        let v = parse("Property: The answer names the \"city\".\nRationale: x\nVerdict: yes\nID: r9\nProperty: unknown\nRationale: y\nVerdict: no\n");
        let s = sample_scores(&v, &rubrics);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].id.as_str(), s[0].score), ("r2", Some(1.0)));
    }

    #[test]
    fn rubrics_are_decided_by_majority_and_averaged() {
        let s = |id: &str, score: Option<f64>| RubricScore {
            id: id.into(),
            rationale: None,
            score,
        };
        let m = majority(&[
            vec![s("a", Some(1.0)), s("b", Some(0.0))],
            vec![s("a", Some(1.0)), s("b", Some(1.0))],
            vec![s("a", Some(0.0)), s("c", None)],
        ]);
        assert_eq!(m, [s("a", Some(1.0)), s("b", Some(0.0)), s("c", None)]);
        let (scored, details) = overall(vec![Some(m), None, Some(vec![s("a", Some(0.0))])], 0.5);
        // a: 1, 0; b: 0 → 1/3 of the scores are yes.
        assert!((scored.score.unwrap() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(scored.status, Status::Failed);
        assert_eq!(scored.per_invocation, [Some(0.5), None, Some(0.0)]);
        assert_eq!(
            details.overall.iter().map(|r| r.score).collect::<Vec<_>>(),
            [Some(0.5), Some(0.0), None]
        );
    }

    #[test]
    fn case_and_invocation_rubrics_are_copied_and_filtered_by_type() {
        let case = Doc::parse(r#"{"rubrics": [{"rubric_id": "c1", "rubric_content": {"text_property": "Short"}, "type": "FINAL_RESPONSE_QUALITY"}]}"#).unwrap();
        let expected = [Doc::parse(r#"{"rubrics": [{"rubric_id": "t1", "rubric_content": {"text_property": "Calls w"}, "type": "TOOL_USE_QUALITY"}]}"#).unwrap()];
        let mut actual = [Doc::object()];
        copy_rubrics(rubric_lists(&case, &expected).unwrap(), &mut actual);
        let o = Doc::parse(
            r#"{"rubrics": [{"rubric_id": "k", "rubricContent": {"textProperty": "Kind"}}]}"#,
        )
        .unwrap();
        let final_q = RubricJudge::parse("m", Quality::FinalResponse, Some(&o)).unwrap();
        let ids: Vec<String> = final_q
            .effective(&actual[0])
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, ["k", "c1"]);
        let tool_q = RubricJudge::parse("m", Quality::ToolUse, None).unwrap();
        let ids: Vec<String> = tool_q
            .effective(&actual[0])
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, ["t1"]);
        assert!(RubricJudge::parse("m", Quality::ToolUse, None)
            .unwrap()
            .effective(&Doc::object())
            .is_err());
        let twice = [Doc::parse(
            r#"{"rubrics": [{"rubric_id": "c1", "rubric_content": {"text_property": "x"}}]}"#,
        )
        .unwrap()];
        assert!(rubric_lists(&case, &twice).is_err());
        let dup = Doc::parse(r#"{"rubrics": [{"rubric_id": "k", "rubric_content": {"text_property": "a"}},
                                            {"rubric_id": "k", "rubric_content": {"text_property": "b"}}]}"#).unwrap();
        assert!(RubricJudge::parse("m", Quality::FinalResponse, Some(&dup)).is_err());
        // Indented with a no-break space, as Python's `\s` takes it.
        assert_eq!(
            parse("\u{a0}Property: p\nRationale: r\nVerdict: yes\n").len(),
            1
        );
    }
}
