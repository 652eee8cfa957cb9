//! ADK's LLM-as-judge metric `final_response_match_v2`: a judge model is asked, for each
//! invocation, whether the agent's final response is valid against the expected one; each
//! invocation is asked `num_samples` times and decided by majority (a tie is invalid), and the
//! case's score is the fraction of invocations judged valid, as google-adk 2.13's
//! `FinalResponseMatchV2Evaluator` scores it.
//!
//! What is ADK's here: the criterion's options (`judge_model_options`:
//! `judge_model`, `num_samples`, `judge_model_config`;
//! `include_intermediate_responses_in_final`), the verdict the judge answers with (a JSON
//! object whose `is_the_agent_response_valid` is `valid` or `invalid`), how that answer is
//! read ([`verdict`]), and how samples and invocations add up ([`majority`], [`overall`]).
//! The prompt is agentd's own wording of the same question ([`prompt`]).
//!
//! The judge is reached as the app says (`evals:` in its `agentd.yaml`:
//! `judge_model`, `judge_options`), like any model of the app; a criterion that names its
//! `judge_model` is judged by that one.

use super::{content_text, number, py_bool, Criterion, Scored, Status};
use crate::eval::doc::Doc;
use crate::event::Content;
use crate::model::{Delta, GenerateConfig, LlmRequest, Model};
use futures::StreamExt;
use std::sync::{Arc, OnceLock};

pub const FINAL_RESPONSE_MATCH_V2: &str = "final_response_match_v2";
/// ADK's judge when neither the criterion nor the app names one.
pub const DEFAULT_JUDGE: &str = "gemini-2.5-flash";
/// ADK's default samples per invocation.
pub const DEFAULT_SAMPLES: u32 = 5;
/// The most samples a criterion may ask for (each is a model call per invocation).
pub const MAX_SAMPLES: u32 = 10;
/// A judge's answer is read up to this many bytes; a longer one is a failed call.
const MAX_ANSWER: usize = 1 << 20;

/// A judge criterion's options.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Judge {
    /// `judge_model_options.judge_model`, when the criterion names one.
    pub model: Option<String>,
    pub num_samples: u32,
    /// `judge_model_options.judge_model_config`'s generation settings.
    pub config: GenerateConfig,
    /// Intermediate text (before tool calls) is judged with the final response.
    pub include_intermediate: bool,
}

pub use crate::apps::settings::JudgeSettings;

impl Judge {
    /// The criterion's options (the object beside its `threshold`), read as pydantic reads
    /// ADK's `LlmAsAJudgeCriterion`: camelCase or snake_case names.
    pub fn parse(name: &str, options: Option<&Doc>) -> Result<Judge, String> {
        let field =
            |o: &Doc, snake: &str, camel: &str| o.get(camel).or_else(|| o.get(snake)).cloned();
        let mut judge = Judge {
            num_samples: DEFAULT_SAMPLES,
            ..Default::default()
        };
        let Some(o) = options else {
            return Ok(judge);
        };
        if let Some(b) = field(
            o,
            "include_intermediate_responses_in_final",
            "includeIntermediateResponsesInFinal",
        ) {
            judge.include_intermediate = py_bool(&b).ok_or_else(|| {
                format!("{name}: include_intermediate_responses_in_final must be a boolean")
            })?;
        }
        let Some(j) = field(o, "judge_model_options", "judgeModelOptions") else {
            return Ok(judge);
        };
        if !matches!(j, Doc::Object(_)) {
            return Err(format!("{name}: judge_model_options must be an object"));
        }
        if let Some(m) = field(&j, "judge_model", "judgeModel") {
            match m.as_str() {
                Some(s) if !s.trim().is_empty() => judge.model = Some(s.trim().to_string()),
                _ => return Err(format!("{name}: judge_model must be a model name")),
            }
        }
        if let Some(n) = field(&j, "num_samples", "numSamples") {
            judge.num_samples = number(&n)
                .filter(|n| n.fract() == 0.0 && (1.0..=f64::from(MAX_SAMPLES)).contains(n))
                .map(|n| n as u32)
                .ok_or_else(|| {
                    format!("{name}: num_samples must be an integer from 1 to {MAX_SAMPLES}")
                })?;
        }
        if let Some(p) = field(&j, "parallelism_limit", "parallelismLimit") {
            // Accepted as ADK's field; agentd asks one sample at a time (what ADK's default
            // of 1 does), which gives the same scores.
            number(&p)
                .filter(|n| n.fract() == 0.0 && *n >= 1.0)
                .ok_or_else(|| {
                    format!("{name}: parallelism_limit must be an integer of at least 1")
                })?;
        }
        if let Some(c) = field(&j, "judge_model_config", "judgeModelConfig") {
            if !matches!(c, Doc::Null) {
                let value = serde_json::to_value(&c).map_err(|e| e.to_string())?;
                judge.config = serde_json::from_value(value).map_err(|e| {
                    format!("{name}: judge_model_config: {e} (agentd reads temperature, top_p, max_output_tokens, stop_sequences and seed)")
                })?;
            }
        }
        Ok(judge)
    }

    /// The model this criterion is judged by, for an app whose `evals:` are `settings`.
    pub(super) fn model(&self, settings: &JudgeSettings) -> Result<Arc<dyn Model>, String> {
        let spec = self
            .model
            .as_deref()
            .or(settings.judge_model.as_deref())
            .unwrap_or(DEFAULT_JUDGE);
        // The app's `judge_options` (its endpoint and key) are for the app's judge: another
        // model a criterion names is reached as any model without options is, so that the
        // app's key never goes to another provider.
        let default = crate::model::ModelOptions::default();
        let options = if self.model.is_none() || self.model == settings.judge_model {
            &settings.judge_options
        } else {
            &default
        };
        crate::model::resolve(spec, options).map_err(|e| format!("judge model {spec:?}: {e}"))
    }
}

/// Whose usage a judge's tokens add to: the case's user's, as a run's and a memory
/// extraction's do (their budgets count them).
pub struct Payer<'a> {
    pub store: &'a dyn crate::store::Store,
    pub prices: &'a crate::usage::Prices,
    pub app: &'a str,
    pub user: &'a str,
}

impl Payer<'_> {
    /// `Err` when the user's or the app's budget is spent (the judge is not called then).
    async fn within_budget(&self) -> Result<(), String> {
        match crate::store::usage::spent_budget(self.store, self.app, self.user).await {
            Ok(None) => Ok(()),
            Ok(Some(spent)) => Err(format!("the judge was not called: {spent}")),
            Err(e) => Err(format!(
                "the judge was not called: the budgets could not be read: {e}"
            )),
        }
    }

    async fn charge(&self, model: &str, u: crate::model::Usage) {
        let tokens = u.tokens();
        let call = crate::store::usage::OutsideCall {
            app: self.app,
            user: self.user,
            model,
            day: crate::usage::Window::now().today,
            input_tokens: tokens.input,
            output_tokens: tokens.output,
            cost: self.prices.cost(model, tokens),
        };
        if let Err(e) = self.store.charge_call(&call).await {
            tracing::warn!(error = %e, "could not add the judge's tokens to the user's usage");
        }
    }
}

/// Scores `actual` against `expected` invocations by asking the judge.
pub async fn score(
    c: &Criterion,
    judge: &Judge,
    settings: &JudgeSettings,
    payer: &Payer<'_>,
    actual: &[Doc],
    expected: &[Doc],
) -> Result<Scored, String> {
    let model = judge.model(settings)?;
    let mut asked = Asking::new(c, model.as_ref());
    let mut per_invocation = Vec::with_capacity(actual.len());
    for (a, e) in actual.iter().zip(expected) {
        let request = LlmRequest {
            model: model.name().to_string(),
            contents: vec![Content::text(
                "user",
                prompt(
                    &content_text(e.get("user_content")),
                    &response_text(a, judge.include_intermediate),
                    &response_text(e, judge.include_intermediate),
                ),
            )],
            config: judge.config.clone(),
            ..Default::default()
        };
        let answers = asked.samples(&request, judge.num_samples, payer).await?;
        per_invocation.push(answers.and_then(|a| {
            let verdicts: Vec<Option<f64>> = a.iter().map(|a| verdict(a)).collect();
            majority(&verdicts)
        }));
    }
    asked.done()?;
    Ok(overall(per_invocation, c.threshold))
}

/// A criterion's calls of its judge.
pub(super) struct Asking<'a> {
    criterion: &'a Criterion,
    model: &'a dyn Model,
    answered: usize,
    failed: Vec<String>,
}

impl<'a> Asking<'a> {
    pub(super) fn new(criterion: &'a Criterion, model: &'a dyn Model) -> Self {
        Asking {
            criterion,
            model,
            answered: 0,
            failed: vec![],
        }
    }

    /// The judge's `n` answers to `request`; `None` when a call failed (the invocation is then
    /// not evaluated, as in ADK, and its other samples are not asked for). `Err` when the
    /// case's user's or the app's budget is spent, checked before every call: the judge is not
    /// called, the case fails.
    pub(super) async fn samples(
        &mut self,
        request: &LlmRequest,
        n: u32,
        payer: &Payer<'_>,
    ) -> Result<Option<Vec<String>>, String> {
        let mut answers = Vec::with_capacity(n as usize);
        for _ in 0..n {
            payer.within_budget().await?;
            match ask(self.model, request).await {
                Ok((answer, usage)) => {
                    if let Some(u) = usage {
                        payer.charge(self.model.name(), u).await;
                    }
                    self.answered += 1;
                    answers.push(answer);
                }
                Err(e) => {
                    tracing::warn!(metric = %self.criterion.name, error = %e, "a judge call failed");
                    self.failed.push(e);
                    return Ok(None);
                }
            }
        }
        Ok(Some(answers))
    }

    /// `Err` when no judge call answered and one failed: a judge that cannot be reached (a
    /// wrong key, a provider down) fails the case instead of leaving it not evaluated, which
    /// beside passing metrics would let a CI run pass.
    pub(super) fn done(self) -> Result<(), String> {
        match self.failed.last() {
            Some(e) if self.answered == 0 => Err(format!(
                "{}: no call of the judge {:?} answered, the last failed with: {e}",
                self.criterion.name,
                self.model.name()
            )),
            _ => Ok(()),
        }
    }
}

/// The judge's answer text (its text parts, joined) and the tokens it took; an answer longer
/// than [`MAX_ANSWER`] is a failed call.
async fn ask(
    model: &dyn Model,
    request: &LlmRequest,
) -> Result<(String, Option<crate::model::Usage>), String> {
    let mut stream = model.stream(request).await.map_err(|e| e.message)?;
    let mut text = String::new();
    let mut usage = None;
    while let Some(delta) = stream.next().await {
        match delta.map_err(|e| e.message)? {
            Delta::Text(t) => {
                text.push_str(&t);
                if text.len() > MAX_ANSWER {
                    return Err(format!("the judge answered more than {MAX_ANSWER} bytes"));
                }
            }
            Delta::Usage(u) => usage = Some(u),
            _ => {}
        }
    }
    Ok((text, usage))
}

/// The question put to the judge, with the three texts as one JSON object (so that no text
/// can end the question early or pose as an instruction's end).
pub fn prompt(user: &str, response: &str, reference: &str) -> String {
    let inputs = serde_json::json!({
        "user_prompt": user,
        "agent_response": response,
        "reference_response": reference,
    });
    format!(
        "You rate the answers of an AI agent. Decide whether the agent's response to the user \
         is correct, comparing it with a reference response that a person wrote and checked.\n\n\
         How to decide:\n\
         - The reference may hold only the key facts. A response that holds them is valid even \
         when it says more, or says it in another form: a list or sentences, a full name or an \
         abbreviation, 1000000 or 1,000,000.\n\
         - Units count: 100 miles is not 100 km.\n\
         - Trust the reference's results of calculations, dates and data; do not redo them.\n\
         - A response that says it cannot answer, where the reference answers, is invalid.\n\
         - A response that asks the user for more, or calls a tool, is valid only where the \
         reference does the same.\n\n\
         The user's message, the agent's response and the reference response:\n{inputs}\n\n\
         Answer with one JSON object and nothing else, with assertiveness:\n\
         {{\"reasoning\": \"<a few sentences>\", \"is_the_agent_response_valid\": \"valid\" or \"invalid\"}}\n"
    )
}

/// Python's `\s` (what `str.isspace` takes), spelled out for a regex class: agentd's regex is
/// built without Unicode classes, and ADK's patterns are Python's.
pub(super) const PY_WS: &str = r"\t\n\x0B\x0C\r \x1C-\x1F\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}";

/// A judge's verdict, read as ADK reads it: `Some(1.0)` valid, `Some(0.0)` invalid, `None`
/// when the answer holds neither (ADK's `_parse_critique`).
pub fn verdict(answer: &str) -> Option<f64> {
    static VALID: OnceLock<Option<regex::Regex>> = OnceLock::new();
    static INVALID: OnceLock<Option<regex::Regex>> = OnceLock::new();
    // ADK's pattern, `\s` spelled out as Python's white space ([`PY_WS`]).
    const WS: &str = PY_WS;
    let field = |name: &str| {
        regex::Regex::new(&format!(
            r#""{name}":[{WS}]*\[*[{WS}]*"*([^"^\]^{WS}]*)"*[{WS}]*\]*[{WS}]*[,\n\}}]"#
        ))
        .ok()
    };
    let label = |re: &Option<regex::Regex>| {
        re.as_ref()
            .and_then(|re| re.captures(answer))
            .and_then(|c| c.get(1))
            .map(|m| m.as_str().trim().trim_end_matches([',', '}']).to_string())
    };
    if let Some(l) = label(VALID.get_or_init(|| field("is_the_agent_response_valid"))) {
        return match l.as_str() {
            "invalid" | "almost" | "false" | "partially_valid" | "partially valid"
            | "partially" => Some(0.0),
            "valid" | "true" => Some(1.0),
            _ => None,
        };
    }
    // A judge that named the field the other way round.
    label(INVALID.get_or_init(|| field("is_the_agent_response_invalid"))).map(|l| {
        if l == "true" || l == "invalid" {
            0.0
        } else {
            1.0
        }
    })
}

/// One invocation's samples decided by majority: valid when more say valid than invalid,
/// invalid otherwise (a tie too), not evaluated when none gave a verdict.
pub fn majority(samples: &[Option<f64>]) -> Option<f64> {
    let valid = samples.iter().filter(|s| **s == Some(1.0)).count();
    let invalid = samples.iter().filter(|s| **s == Some(0.0)).count();
    match (valid, invalid) {
        (0, 0) => None,
        (v, i) if v > i => Some(1.0),
        _ => Some(0.0),
    }
}

/// The case's score: the fraction of the evaluated invocations judged valid.
pub fn overall(per_invocation: Vec<Option<f64>>, threshold: f64) -> Scored {
    let judged: Vec<f64> = per_invocation.iter().flatten().copied().collect();
    if judged.is_empty() {
        return Scored {
            score: None,
            status: Status::NotEvaluated,
            per_invocation,
            rubrics: None,
        };
    }
    let score = judged.iter().sum::<f64>() / judged.len() as f64;
    Scored {
        score: Some(score),
        status: Status::of(score, threshold),
        per_invocation,
        rubrics: None,
    }
}

/// An invocation's final response text; with `intermediate`, the text of its intermediate
/// events (or responses) first, one per line (ADK's `get_text_from_content`).
pub(super) fn response_text(invocation: &Doc, intermediate: bool) -> String {
    let last = content_text(invocation.get("final_response"));
    if !intermediate {
        return last;
    }
    let data = invocation.get("intermediate_data");
    let mut texts: Vec<String> = vec![];
    if let Some(events) = data
        .and_then(|d| d.get("invocation_events"))
        .and_then(Doc::as_array)
    {
        texts.extend(events.iter().map(|e| content_text(e.get("content"))));
    } else if let Some(responses) = data
        .and_then(|d| d.get("intermediate_responses"))
        .and_then(Doc::as_array)
    {
        for r in responses {
            // `[author, parts]`.
            let parts = r.as_array().and_then(|pair| pair.get(1)).cloned();
            let content = parts.map(|p| Doc::object().with("parts", p));
            texts.push(content_text(content.as_ref()));
        }
    }
    texts.push(last);
    texts.retain(|t| !t.is_empty());
    texts.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_as_adk_reads_them() {
        let cases = [
            (
                r#"{"reasoning": "ok", "is_the_agent_response_valid": "valid"}"#,
                Some(1.0),
            ),
            (
                r#"{"reasoning": "no", "is_the_agent_response_valid": "invalid"}"#,
                Some(0.0),
            ),
            (
                "```json\n{\n  \"is_the_agent_response_valid\": [\"valid\"]\n}\n```",
                Some(1.0),
            ),
            (r#"{"is_the_agent_response_valid": true}"#, Some(1.0)),
            (r#"{"is_the_agent_response_valid": "almost",}"#, Some(0.0)),
            (
                r#"{"is_the_agent_response_valid": "partially_valid"}"#,
                Some(0.0),
            ),
            // Not lower case: not a label ADK knows.
            (r#"{"is_the_agent_response_valid": "Valid"}"#, None),
            (r#"{"is_the_agent_response_invalid": "true"}"#, Some(0.0)),
            (r#"{"is_the_agent_response_invalid": "false"}"#, Some(1.0)),
            ("It looks right to me.", None),
            (r#"{"is_the_agent_response_valid": "valid""#, None),
        ];
        for (answer, want) in cases {
            assert_eq!(verdict(answer), want, "{answer}");
        }
    }

    #[test]
    fn samples_are_decided_by_majority_and_a_tie_is_invalid() {
        assert_eq!(majority(&[Some(1.0), Some(1.0), Some(0.0)]), Some(1.0));
        assert_eq!(majority(&[Some(1.0), Some(0.0)]), Some(0.0));
        assert_eq!(majority(&[None, None, Some(1.0)]), Some(1.0));
        assert_eq!(majority(&[None, None]), None);
        let s = overall(vec![Some(1.0), None, Some(0.0)], 0.5);
        assert_eq!((s.score, s.status), (Some(0.5), Status::Passed));
        let none = overall(vec![None], 0.5);
        assert_eq!((none.score, none.status), (None, Status::NotEvaluated));
    }

    #[test]
    fn options_as_pydantic_reads_them() {
        let o = Doc::parse(
            r#"{"threshold": 0.5, "judgeModelOptions": {"judge_model": "openai/j", "numSamples": 3,
                "judge_model_config": {"temperature": 0.0}}, "include_intermediate_responses_in_final": "yes"}"#,
        )
        .unwrap();
        let j = Judge::parse(FINAL_RESPONSE_MATCH_V2, Some(&o)).unwrap();
        assert_eq!(j.model.as_deref(), Some("openai/j"));
        assert_eq!(j.num_samples, 3);
        assert_eq!(j.config.temperature, Some(0.0));
        assert!(j.include_intermediate);
        assert_eq!(
            Judge::parse("m", None).unwrap().num_samples,
            DEFAULT_SAMPLES
        );
        for bad in [
            r#"{"judge_model_options": {"num_samples": 0}}"#,
            r#"{"judge_model_options": {"num_samples": 11}}"#,
            r#"{"judge_model_options": {"num_samples": 1.5}}"#,
            r#"{"judge_model_options": {"judge_model": ""}}"#,
            r#"{"judge_model_options": {"judge_model_config": {"tools": []}}}"#,
            r#"{"judge_model_options": 3}"#,
        ] {
            let o = Doc::parse(bad).unwrap();
            assert!(Judge::parse("m", Some(&o)).is_err(), "{bad} is refused");
        }
    }

    #[test]
    fn intermediate_text_comes_first_when_asked_for() {
        let inv = Doc::parse(
            r#"{"final_response": {"parts": [{"text": "It is 21."}]},
                "intermediate_data": {"invocation_events": [
                  {"author": "a", "content": {"parts": [{"text": "Looking it up."}, {"function_call": {"name": "w"}}]}}]}}"#,
        )
        .unwrap();
        assert_eq!(response_text(&inv, false), "It is 21.");
        assert_eq!(response_text(&inv, true), "Looking it up.\nIt is 21.");
        let legacy = Doc::parse(
            r#"{"final_response": {"parts": [{"text": "b"}]},
                "intermediate_data": {"tool_uses": [], "intermediate_responses": [["a", [{"text": "a"}]]]}}"#,
        )
        .unwrap();
        assert_eq!(response_text(&legacy, true), "a\nb");
    }

    #[test]
    fn the_prompt_carries_the_texts_as_json() {
        let p = prompt("What \"is\" it?", "It is 21.", "21 degrees");
        assert!(p.contains(r#""user_prompt":"What \"is\" it?""#), "{p}");
        assert!(p.contains(r#""reference_response":"21 degrees""#), "{p}");
        assert!(p.contains("is_the_agent_response_valid"));
    }
}
