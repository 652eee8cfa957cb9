//! ADK's eval models (`google.adk.evaluation`: `EvalSet`, `EvalCase`, `Invocation`, …) in
//! their two JSON forms:
//!
//! - **the file form**, what `*.evalset.json` holds and agentd stores: snake_case fields in
//!   the models' order, without nulls and without fields at their defaults (pydantic's
//!   `model_dump_json(indent=2, exclude_unset, exclude_defaults, exclude_none)`);
//! - **the wire form**, what ADK's dev server answers: camelCase fields in the same order,
//!   nulls left out and defaults filled in (`model_dump(by_alias=True, exclude_none=True)`).
//!
//! Clients may send either spelling, as pydantic accepts both. Keys inside user data
//! (function arguments and responses, session state) are never renamed, and fields a model
//! does not declare (ADK's `EvalCase` allows extras) keep their names in both forms.

mod models;

use super::doc::Doc;
use models::*;
use serde_json::{json, Value};

/// Which of the two forms to write.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    File,
    Wire,
}

/// pydantic's `to_camel` for a snake_case field name.
fn to_camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// A camelCase (or already snake_case) field name in snake_case.
fn to_snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `doc` as model `m` in `form`: fields found by either spelling, in the model's order,
/// then the fields it does not declare as they came; nulls dropped.
fn shape(doc: &Doc, m: &Model, form: Form) -> Doc {
    let Doc::Object(pairs) = doc else {
        return doc.clone();
    };
    let mut known: Vec<Option<&Doc>> = vec![None; m.fields.len()];
    let mut extra = vec![];
    for (k, v) in pairs {
        let snake = to_snake(k);
        match m.fields.iter().position(|(name, ..)| *name == snake) {
            Some(i) => known[i] = Some(v),
            None if m.extra == Extra::Ignore => {}
            None => extra.push((k.clone(), v.clone())),
        }
    }
    let mut out = vec![];
    for ((name, default, kind), value) in m.fields.iter().zip(known) {
        let value = match value {
            Some(Doc::Null) | None => match form {
                Form::Wire => default.doc(),
                Form::File => None,
            },
            Some(v) if form == Form::File && default.holds(v) => None,
            Some(v) => Some(shape_kind(v, *kind, form)),
        };
        if let Some(v) = value {
            let key = match form {
                Form::Wire if m.camel => to_camel(name),
                _ => name.to_string(),
            };
            out.push((key, v));
        }
    }
    out.extend(extra.into_iter().filter(|(_, v)| *v != Doc::Null));
    Doc::Object(out)
}

fn shape_kind(v: &Doc, kind: Kind, form: Form) -> Doc {
    match (kind, v) {
        (Kind::Plain | Kind::Opaque, v) => v.clone(),
        (Kind::Float, Doc::Number(n)) => n.as_f64().map_or(v.clone(), Doc::float),
        (Kind::Tree, v) => tree(v, form),
        (Kind::One(m), v) => shape(v, m, form),
        (Kind::List(m), Doc::Array(items)) => {
            Doc::Array(items.iter().map(|i| shape(i, m, form)).collect())
        }
        (Kind::Intermediate, v) => {
            let events = v.get("invocation_events").or(v.get("invocationEvents"));
            match events {
                Some(_) => shape(v, &INVOCATION_EVENTS, form),
                None => shape(v, &INTERMEDIATE_DATA, form),
            }
        }
        (Kind::AuthorParts, Doc::Array(items)) => Doc::Array(
            items
                .iter()
                .map(|pair| match pair {
                    Doc::Array(ap) => Doc::Array(
                        ap.iter()
                            .enumerate()
                            .map(|(i, x)| match i {
                                1 => shape_kind(x, Kind::List(&PART), form),
                                _ => x.clone(),
                            })
                            .collect(),
                    ),
                    other => other.clone(),
                })
                .collect(),
        ),
        (Kind::ByAgent, Doc::Object(agents)) => Doc::Object(
            agents
                .iter()
                .map(|(name, d)| (name.clone(), shape(d, &AGENT_DETAILS, form)))
                .collect(),
        ),
        (_, v) => v.clone(),
    }
}

/// Every key of `v` renamed for `form`, in order, nulls dropped ([`Kind::Tree`]).
fn tree(v: &Doc, form: Form) -> Doc {
    match v {
        Doc::Object(pairs) => Doc::Object(
            pairs
                .iter()
                .filter(|(_, x)| *x != Doc::Null)
                .map(|(k, x)| {
                    let snake = to_snake(k);
                    let key = match form {
                        Form::File => snake,
                        Form::Wire => to_camel(&snake),
                    };
                    (key, tree(x, form))
                })
                .collect(),
        ),
        Doc::Array(items) => Doc::Array(items.iter().map(|x| tree(x, form)).collect()),
        other => other.clone(),
    }
}

/// A case in the file form (what is stored and exported).
pub fn case_file(case: &Doc) -> Doc {
    shape(case, &EVAL_CASE, Form::File)
}

/// A case in the wire form (what ADK's dev server answers).
pub fn case_wire(case: &Doc) -> Doc {
    shape(case, &EVAL_CASE, Form::Wire)
}

/// An eval set in the file form.
pub fn set_file(set: &Doc) -> Doc {
    shape(set, &EVAL_SET, Form::File)
}

/// An eval set in the wire form.
pub fn set_wire(set: &Doc) -> Doc {
    shape(set, &EVAL_SET, Form::Wire)
}

/// A set's result (ADK's `EvalSetResult`) in the wire form, as `GET …/eval-results/{id}`
/// answers it.
pub fn set_result_wire(result: &Doc) -> Doc {
    shape(result, &EVAL_SET_RESULT, Form::Wire)
}

/// A case's result as the dev server's `RunEvalResult` (what `…/eval-sets/{set}/run` answers).
pub fn run_result_wire(case_result: &Doc) -> Doc {
    shape(case_result, &RUN_EVAL_RESULT, Form::Wire)
}

/// A `Content` in the file form (its parts in genai's field order).
pub fn content_file(content: &Doc) -> Doc {
    shape(content, &CONTENT, Form::File)
}

/// Grounding metadata in the file form.
pub fn grounding_file(grounding: &Doc) -> Doc {
    shape(grounding, &GROUNDING, Form::File)
}

/// Usage metadata in the file form.
pub fn usage_file(usage: &Doc) -> Doc {
    shape(usage, &USAGE, Form::File)
}

/// What is wrong with a document, where (`loc`, as FastAPI lists it, below `body`).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub loc: Vec<Value>,
    pub msg: String,
}

fn problem(loc: &[Value], msg: &str) -> Problem {
    Problem {
        loc: loc.to_vec(),
        msg: msg.to_string(),
    }
}

/// What is wrong with a case in the file form, as FastAPI would list it (`loc` under
/// `prefix`); empty when ADK would load it.
pub fn case_problems(case: &Doc, prefix: &[Value]) -> Vec<Problem> {
    let at = |rest: &[Value]| [prefix, rest].concat();
    let mut out = vec![];
    if !matches!(case, Doc::Object(_)) {
        return vec![problem(prefix, "an eval case must be an object")];
    }
    match case.get("eval_id") {
        Some(Doc::String(id)) if valid_id(id) => {}
        Some(Doc::String(_)) => out.push(problem(
            &at(&[json!("evalId")]),
            "an eval id must be 1 to 128 printable characters without '/'",
        )),
        _ => out.push(problem(&at(&[json!("evalId")]), "Field required")),
    }
    let conversation = case.get("conversation");
    let scenario = case.get("conversation_scenario");
    if conversation.is_some() == scenario.is_some() {
        out.push(problem(
            prefix,
            "Exactly one of conversation and conversation_scenario must be provided in an \
             EvalCase.",
        ));
    }
    match conversation {
        Some(Doc::Array(invocations)) => {
            for (i, inv) in invocations.iter().enumerate() {
                if !matches!(inv.get("user_content"), Some(Doc::Object(_))) {
                    out.push(problem(
                        &at(&[json!("conversation"), json!(i), json!("userContent")]),
                        "Field required",
                    ));
                }
            }
        }
        Some(_) => out.push(problem(
            &at(&[json!("conversation")]),
            "Input should be a valid list",
        )),
        None => {}
    }
    extra_problems(case, &EVAL_CASE, prefix, &mut out);
    out
}

/// At most this many problems are listed for one document.
const MAX_PROBLEMS: usize = 20;

/// Fields a `Forbid` model does not declare, where ADK's pydantic would refuse the document.
fn extra_problems(doc: &Doc, m: &Model, loc: &[Value], out: &mut Vec<Problem>) {
    let Doc::Object(pairs) = doc else {
        return;
    };
    for (k, v) in pairs {
        if out.len() >= MAX_PROBLEMS {
            return;
        }
        let snake = to_snake(k);
        match m.fields.iter().find(|(name, ..)| *name == snake) {
            None if m.extra == Extra::Forbid => out.push(problem(
                &[loc, &[json!(k)]].concat(),
                "Extra inputs are not permitted",
            )),
            None => {}
            Some((name, _, kind)) => {
                let at = [loc, &[json!(to_camel(name))]].concat();
                kind_extras(v, *kind, &at, out);
            }
        }
    }
}

fn kind_extras(v: &Doc, kind: Kind, loc: &[Value], out: &mut Vec<Problem>) {
    let at = |i: usize| [loc, &[json!(i)]].concat();
    match (kind, v) {
        (Kind::One(m), v) => extra_problems(v, m, loc, out),
        (Kind::List(m), Doc::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                extra_problems(item, m, &at(i), out);
            }
        }
        (Kind::Intermediate, v) => {
            let events = v.get("invocation_events").or(v.get("invocationEvents"));
            let m = match events {
                Some(_) => &INVOCATION_EVENTS,
                None => &INTERMEDIATE_DATA,
            };
            extra_problems(v, m, loc, out);
        }
        (Kind::AuthorParts, Doc::Array(items)) => {
            for (i, pair) in items.iter().enumerate() {
                if let Some(parts) = pair.as_array().and_then(|p| p.get(1)) {
                    kind_extras(
                        parts,
                        Kind::List(&PART),
                        &[at(i), vec![json!(1)]].concat(),
                        out,
                    );
                }
            }
        }
        (Kind::ByAgent, Doc::Object(agents)) => {
            for (name, details) in agents {
                extra_problems(
                    details,
                    &AGENT_DETAILS,
                    &[loc, &[json!(name)]].concat(),
                    out,
                );
            }
        }
        _ => {}
    }
}

/// An eval case id or eval set id as agentd keeps them: 1 to 128 printable characters
/// without `/` (the rule of every id; ADK's own files are named by the set's id).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && !id.chars().any(|c| c.is_control() || c == '/')
}

/// ADK's rule for a new eval set's id (`LocalEvalSetsManager._validate_id`): the id names a
/// file, so letters, digits and `_` only.
pub fn valid_set_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_form_is_camel_case_with_defaults_and_user_keys_untouched() {
        let file = Doc::parse(
            r#"{"eval_id":"c1","conversation":[{"user_content":{"parts":[{"text":"hi"}],"role":"user"},
                "intermediate_data":{"tool_uses":[{"name":"f","args":{"some_key":1}}]}}],
                "session_input":{"app_name":"a","user_id":"u","state":{"my_key":""}}}"#,
        )
        .unwrap();
        let wire = case_wire(&file).to_compact();
        assert_eq!(
            wire,
            r#"{"evalId":"c1","conversation":[{"invocationId":"","userContent":{"parts":[{"text":"hi"}],"role":"user"},"intermediateData":{"toolUses":[{"args":{"some_key":1},"name":"f"}],"toolResponses":[],"intermediateResponses":[]},"creationTimestamp":0.0}],"sessionInput":{"appName":"a","userId":"u","state":{"my_key":""}},"creationTimestamp":0.0,"finalSessionState":{}}"#
        );
        // And back: the file form drops the defaults again, fields in the models' order.
        let back = case_file(&Doc::parse(&wire).unwrap()).to_compact();
        assert_eq!(
            back,
            r#"{"eval_id":"c1","conversation":[{"user_content":{"parts":[{"text":"hi"}],"role":"user"},"intermediate_data":{"tool_uses":[{"args":{"some_key":1},"name":"f"}]}}],"session_input":{"app_name":"a","user_id":"u","state":{"my_key":""}}}"#
        );
    }

    #[test]
    fn extras_and_nulls() {
        let case =
            Doc::parse(r#"{"evalId":"c","conversation":[],"myExtra":{"aB":1},"rubrics":null}"#)
                .unwrap();
        assert_eq!(
            case_file(&case).to_compact(),
            r#"{"eval_id":"c","conversation":[],"myExtra":{"aB":1}}"#
        );
    }

    #[test]
    fn integers_in_float_fields_and_fields_adk_refuses() {
        let case = Doc::parse(
            r#"{"eval_id":"c","conversation":[{"user_content":{"parts":[]},"creation_timestamp":5,"x":1}],"mine":2}"#,
        )
        .unwrap();
        let file = case_file(&case);
        assert!(
            file.to_compact().contains(r#""creation_timestamp":5.0"#),
            "{}",
            file.to_compact()
        );
        // An Invocation forbids fields it does not declare; an EvalCase allows them.
        let problems = case_problems(&file, &[]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(
            problems[0].loc,
            vec![json!("conversation"), json!(0), json!("x")]
        );
    }

    #[test]
    fn a_set_answers_in_snake_case_its_cases_in_camel_case() {
        let set =
            Doc::parse(r#"{"eval_set_id":"s","eval_cases":[{"eval_id":"c","conversation":[]}]}"#)
                .unwrap();
        let wire = set_wire(&set).to_compact();
        assert!(
            wire.starts_with(r#"{"eval_set_id":"s","eval_cases":[{"evalId":"c""#),
            "{wire}"
        );
        assert!(wire.ends_with(r#""creation_timestamp":0.0}"#), "{wire}");
    }

    #[test]
    fn a_case_needs_an_id_and_one_conversation() {
        let case = Doc::parse(r#"{"conversation":[{}],"conversation_scenario":{}}"#).unwrap();
        let problems = case_problems(&case, &[]);
        assert_eq!(problems.len(), 3, "{problems:?}");
    }
}
