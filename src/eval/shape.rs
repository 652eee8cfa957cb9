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

use super::doc::Doc;
use serde_json::{json, Value};

/// What a field is when it is left out.
#[derive(Clone, Copy, PartialEq)]
enum Unset {
    /// `None`: left out of both forms.
    Absent,
    Zero,
    EmptyString,
    EmptyMap,
    EmptyList,
}

impl Unset {
    fn doc(self) -> Option<Doc> {
        match self {
            Unset::Absent => None,
            Unset::Zero => Some(Doc::float(0.0)),
            Unset::EmptyString => Some(Doc::str("")),
            Unset::EmptyMap => Some(Doc::object()),
            Unset::EmptyList => Some(Doc::Array(vec![])),
        }
    }

    fn holds(self, v: &Doc) -> bool {
        match (self, v) {
            (Unset::Zero, Doc::Number(n)) => n.as_f64() == Some(0.0),
            (Unset::EmptyString, Doc::String(s)) => s.is_empty(),
            (Unset::EmptyMap, Doc::Object(o)) => o.is_empty(),
            (Unset::EmptyList, Doc::Array(a)) => a.is_empty(),
            _ => false,
        }
    }
}

/// A model: its fields in declared order, each with its default and what it holds.
struct Model {
    fields: &'static [(&'static str, Unset, Kind)],
    /// What becomes of fields the model does not declare (pydantic's `extra`).
    extra: Extra,
    /// Whether the wire form spells its fields in camelCase (every model with ADK's or
    /// genai's alias generator: all but `EvalSet`, a plain pydantic model).
    camel: bool,
}

/// pydantic's `extra`: what a model does with fields it does not declare.
#[derive(Clone, Copy, PartialEq)]
enum Extra {
    /// Kept, in both forms (`EvalCase`, `SessionInput`).
    Allow,
    /// Dropped (`EvalSet`, and `InvocationEvent`, which the web UI's editor sends with
    /// fields of its own).
    Ignore,
    /// Refused: ADK would not load the file ([`case_problems`] lists them).
    Forbid,
}

/// What a field's value is.
#[derive(Clone, Copy)]
enum Kind {
    /// A string, number or flag.
    Plain,
    /// A float: an integer given is written as pydantic writes the float (`5` as `5.0`).
    Float,
    /// User data: keys are never renamed, nothing inside is reordered.
    Opaque,
    /// genai models this table does not list field by field (inside grounding metadata):
    /// every key renamed, in the order given, nulls dropped; no user data inside.
    Tree,
    One(&'static Model),
    List(&'static Model),
    /// `Invocation.intermediate_data`: `InvocationEvents` when it has `invocation_events`,
    /// else `IntermediateData` (pydantic's choice for the union).
    Intermediate,
    /// `IntermediateData.intermediate_responses`: `[author, [Part, …]]` pairs.
    AuthorParts,
    /// `AppDetails.agent_details`: agent name → `AgentDetails`.
    ByAgent,
}

use Kind::{Opaque, Plain};
use Unset::{Absent, EmptyList, EmptyMap, EmptyString, Zero};

static EVAL_SET: Model = Model {
    fields: &[
        ("eval_set_id", Absent, Plain),
        ("name", Absent, Plain),
        ("description", Absent, Plain),
        ("eval_cases", Absent, Kind::List(&EVAL_CASE)),
        ("creation_timestamp", Zero, Kind::Float),
    ],
    extra: Extra::Ignore,
    camel: false,
};

static EVAL_CASE: Model = Model {
    fields: &[
        ("eval_id", Absent, Plain),
        ("conversation", Absent, Kind::List(&INVOCATION)),
        ("conversation_scenario", Absent, Kind::One(&SCENARIO)),
        ("session_input", Absent, Kind::One(&SESSION_INPUT)),
        ("creation_timestamp", Zero, Kind::Float),
        ("rubrics", Absent, Kind::List(&RUBRIC)),
        ("final_session_state", EmptyMap, Opaque),
    ],
    extra: Extra::Allow,
    camel: true,
};

static INVOCATION: Model = Model {
    fields: &[
        ("invocation_id", EmptyString, Plain),
        ("user_content", Absent, Kind::One(&CONTENT)),
        ("final_response", Absent, Kind::One(&CONTENT)),
        ("intermediate_data", Absent, Kind::Intermediate),
        ("creation_timestamp", Zero, Kind::Float),
        ("duration", Absent, Kind::Float),
        ("model_duration", Absent, Kind::Float),
        ("tool_duration", Absent, Kind::Float),
        ("rubrics", Absent, Kind::List(&RUBRIC)),
        ("app_details", Absent, Kind::One(&APP_DETAILS)),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static INTERMEDIATE_DATA: Model = Model {
    fields: &[
        ("tool_uses", EmptyList, Kind::List(&FUNCTION_CALL)),
        ("tool_responses", EmptyList, Kind::List(&FUNCTION_RESPONSE)),
        ("intermediate_responses", EmptyList, Kind::AuthorParts),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static INVOCATION_EVENTS: Model = Model {
    fields: &[(
        "invocation_events",
        EmptyList,
        Kind::List(&INVOCATION_EVENT),
    )],
    extra: Extra::Forbid,
    camel: true,
};

static INVOCATION_EVENT: Model = Model {
    fields: &[
        ("author", Absent, Plain),
        ("content", Absent, Kind::One(&CONTENT)),
        ("grounding_metadata", Absent, Kind::One(&GROUNDING)),
        ("usage_metadata", Absent, Kind::One(&USAGE)),
        ("model_version", Absent, Plain),
    ],
    extra: Extra::Ignore,
    camel: true,
};

static SESSION_INPUT: Model = Model {
    fields: &[
        ("app_name", Absent, Plain),
        ("user_id", Absent, Plain),
        ("session_id", Absent, Plain),
        ("state", EmptyMap, Opaque),
    ],
    extra: Extra::Allow,
    camel: true,
};

static SCENARIO: Model = Model {
    fields: &[
        ("starting_prompt", Absent, Plain),
        ("conversation_plan", Absent, Plain),
        ("user_persona", Absent, Opaque),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static RUBRIC: Model = Model {
    fields: &[
        ("rubric_id", Absent, Plain),
        ("rubric_content", Absent, Kind::One(&RUBRIC_CONTENT)),
        ("description", Absent, Plain),
        ("type", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static RUBRIC_CONTENT: Model = Model {
    fields: &[("text_property", Absent, Plain)],
    extra: Extra::Forbid,
    camel: true,
};

static APP_DETAILS: Model = Model {
    fields: &[("agent_details", EmptyMap, Kind::ByAgent)],
    extra: Extra::Forbid,
    camel: true,
};

static AGENT_DETAILS: Model = Model {
    fields: &[
        ("name", Absent, Plain),
        ("instructions", EmptyString, Opaque),
        ("tool_declarations", EmptyList, Opaque),
    ],
    extra: Extra::Forbid,
    camel: true,
};

// google.genai's types, in their declared order (google-genai 2.34).

static CONTENT: Model = Model {
    fields: &[
        ("parts", Absent, Kind::List(&PART)),
        ("role", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static PART: Model = Model {
    fields: &[
        ("media_resolution", Absent, Opaque),
        ("code_execution_result", Absent, Kind::One(&CODE_RESULT)),
        ("executable_code", Absent, Kind::One(&CODE)),
        ("file_data", Absent, Kind::One(&FILE_DATA)),
        ("function_call", Absent, Kind::One(&FUNCTION_CALL)),
        ("function_response", Absent, Kind::One(&FUNCTION_RESPONSE)),
        ("inline_data", Absent, Kind::One(&BLOB)),
        ("text", Absent, Plain),
        ("thought", Absent, Plain),
        ("thought_signature", Absent, Plain),
        ("video_metadata", Absent, Kind::One(&VIDEO)),
        ("tool_call", Absent, Opaque),
        ("tool_response", Absent, Opaque),
        ("part_metadata", Absent, Opaque),
        ("audio_transcription", Absent, Opaque),
        ("media_processing", Absent, Opaque),
        ("speech_metadata", Absent, Opaque),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static FUNCTION_CALL: Model = Model {
    fields: &[
        ("id", Absent, Plain),
        ("args", Absent, Opaque),
        ("name", Absent, Plain),
        ("partial_args", Absent, Kind::List(&PARTIAL_ARG)),
        ("will_continue", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static PARTIAL_ARG: Model = Model {
    fields: &[
        ("bool_value", Absent, Plain),
        ("json_path", Absent, Plain),
        ("null_value", Absent, Plain),
        ("number_value", Absent, Plain),
        ("string_value", Absent, Plain),
        ("will_continue", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static FUNCTION_RESPONSE: Model = Model {
    fields: &[
        ("will_continue", Absent, Plain),
        ("scheduling", Absent, Plain),
        ("parts", Absent, Kind::List(&FUNCTION_RESPONSE_PART)),
        ("id", Absent, Plain),
        ("name", Absent, Plain),
        ("response", Absent, Opaque),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static FUNCTION_RESPONSE_PART: Model = Model {
    fields: &[
        ("inline_data", Absent, Kind::One(&BLOB)),
        ("file_data", Absent, Kind::One(&FILE_DATA)),
        ("media_processing", Absent, Opaque),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static BLOB: Model = Model {
    fields: &[
        ("data", Absent, Plain),
        ("display_name", Absent, Plain),
        ("mime_type", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static FILE_DATA: Model = Model {
    fields: &[
        ("display_name", Absent, Plain),
        ("file_uri", Absent, Plain),
        ("mime_type", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static CODE_RESULT: Model = Model {
    fields: &[
        ("outcome", Absent, Plain),
        ("output", Absent, Plain),
        ("id", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static CODE: Model = Model {
    fields: &[
        ("code", Absent, Plain),
        ("language", Absent, Plain),
        ("id", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static VIDEO: Model = Model {
    fields: &[
        ("end_offset", Absent, Plain),
        ("fps", Absent, Plain),
        ("start_offset", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static GROUNDING: Model = Model {
    fields: &[
        ("image_search_queries", Absent, Plain),
        ("grounding_chunks", Absent, Kind::List(&GROUNDING_CHUNK)),
        ("grounding_supports", Absent, Kind::List(&GROUNDING_SUPPORT)),
        ("retrieval_metadata", Absent, Kind::Tree),
        ("search_entry_point", Absent, Kind::Tree),
        ("web_search_queries", Absent, Plain),
        ("google_maps_widget_context_token", Absent, Plain),
        ("retrieval_queries", Absent, Plain),
        ("source_flagging_uris", Absent, Kind::Tree),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static GROUNDING_CHUNK: Model = Model {
    fields: &[
        ("image", Absent, Kind::Tree),
        ("maps", Absent, Kind::Tree),
        ("retrieved_context", Absent, Kind::Tree),
        ("web", Absent, Kind::One(&GROUNDING_WEB)),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static GROUNDING_WEB: Model = Model {
    fields: &[
        ("domain", Absent, Plain),
        ("title", Absent, Plain),
        ("uri", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static GROUNDING_SUPPORT: Model = Model {
    fields: &[
        ("confidence_scores", Absent, Plain),
        ("grounding_chunk_indices", Absent, Plain),
        ("segment", Absent, Kind::One(&SEGMENT)),
        ("rendered_parts", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static SEGMENT: Model = Model {
    fields: &[
        ("start_index", Absent, Plain),
        ("end_index", Absent, Plain),
        ("part_index", Absent, Plain),
        ("text", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static USAGE: Model = Model {
    fields: &[
        ("cache_tokens_details", Absent, Kind::List(&MODALITY_COUNT)),
        ("cached_content_token_count", Absent, Plain),
        ("candidates_token_count", Absent, Plain),
        (
            "candidates_tokens_details",
            Absent,
            Kind::List(&MODALITY_COUNT),
        ),
        ("prompt_token_count", Absent, Plain),
        ("prompt_tokens_details", Absent, Kind::List(&MODALITY_COUNT)),
        ("thoughts_token_count", Absent, Plain),
        ("tool_use_prompt_token_count", Absent, Plain),
        (
            "tool_use_prompt_tokens_details",
            Absent,
            Kind::List(&MODALITY_COUNT),
        ),
        ("total_token_count", Absent, Plain),
        ("traffic_type", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

static MODALITY_COUNT: Model = Model {
    fields: &[("modality", Absent, Plain), ("token_count", Absent, Plain)],
    extra: Extra::Forbid,
    camel: true,
};

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
