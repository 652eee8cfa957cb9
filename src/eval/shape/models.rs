//! The tables of ADK's eval models: each model's fields in declared order, with their
//! defaults and kinds, and what the model does with fields it does not declare.

use crate::eval::doc::Doc;

/// What a field is when it is left out.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Unset {
    /// `None`: left out of both forms.
    Absent,
    Zero,
    EmptyString,
    EmptyMap,
    EmptyList,
}

impl Unset {
    pub(super) fn doc(self) -> Option<Doc> {
        match self {
            Unset::Absent => None,
            Unset::Zero => Some(Doc::float(0.0)),
            Unset::EmptyString => Some(Doc::str("")),
            Unset::EmptyMap => Some(Doc::object()),
            Unset::EmptyList => Some(Doc::Array(vec![])),
        }
    }

    pub(super) fn holds(self, v: &Doc) -> bool {
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
pub(super) struct Model {
    pub(super) fields: &'static [(&'static str, Unset, Kind)],
    /// What becomes of fields the model does not declare (pydantic's `extra`).
    pub(super) extra: Extra,
    /// Whether the wire form spells its fields in camelCase (every model with ADK's or
    /// genai's alias generator: all but `EvalSet`, a plain pydantic model).
    pub(super) camel: bool,
}

/// pydantic's `extra`: what a model does with fields it does not declare.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Extra {
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
pub(super) enum Kind {
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

pub(super) static EVAL_SET: Model = Model {
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

pub(super) static EVAL_CASE: Model = Model {
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

pub(super) static INVOCATION: Model = Model {
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

pub(super) static INTERMEDIATE_DATA: Model = Model {
    fields: &[
        ("tool_uses", EmptyList, Kind::List(&FUNCTION_CALL)),
        ("tool_responses", EmptyList, Kind::List(&FUNCTION_RESPONSE)),
        ("intermediate_responses", EmptyList, Kind::AuthorParts),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static INVOCATION_EVENTS: Model = Model {
    fields: &[(
        "invocation_events",
        EmptyList,
        Kind::List(&INVOCATION_EVENT),
    )],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static INVOCATION_EVENT: Model = Model {
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

pub(super) static SESSION_INPUT: Model = Model {
    fields: &[
        ("app_name", Absent, Plain),
        ("user_id", Absent, Plain),
        ("session_id", Absent, Plain),
        ("state", EmptyMap, Opaque),
    ],
    extra: Extra::Allow,
    camel: true,
};

pub(super) static SCENARIO: Model = Model {
    fields: &[
        ("starting_prompt", Absent, Plain),
        ("conversation_plan", Absent, Plain),
        ("user_persona", Absent, Opaque),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static RUBRIC: Model = Model {
    fields: &[
        ("rubric_id", Absent, Plain),
        ("rubric_content", Absent, Kind::One(&RUBRIC_CONTENT)),
        ("description", Absent, Plain),
        ("type", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static RUBRIC_CONTENT: Model = Model {
    fields: &[("text_property", Absent, Plain)],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static APP_DETAILS: Model = Model {
    fields: &[("agent_details", EmptyMap, Kind::ByAgent)],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static AGENT_DETAILS: Model = Model {
    fields: &[
        ("name", Absent, Plain),
        ("instructions", EmptyString, Opaque),
        ("tool_declarations", EmptyList, Opaque),
    ],
    extra: Extra::Forbid,
    camel: true,
};

// google.genai's types, in their declared order (google-genai 2.34).

pub(super) static CONTENT: Model = Model {
    fields: &[
        ("parts", Absent, Kind::List(&PART)),
        ("role", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static PART: Model = Model {
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

pub(super) static FUNCTION_CALL: Model = Model {
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

pub(super) static PARTIAL_ARG: Model = Model {
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

pub(super) static FUNCTION_RESPONSE: Model = Model {
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

pub(super) static FUNCTION_RESPONSE_PART: Model = Model {
    fields: &[
        ("inline_data", Absent, Kind::One(&BLOB)),
        ("file_data", Absent, Kind::One(&FILE_DATA)),
        ("media_processing", Absent, Opaque),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static BLOB: Model = Model {
    fields: &[
        ("data", Absent, Plain),
        ("display_name", Absent, Plain),
        ("mime_type", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static FILE_DATA: Model = Model {
    fields: &[
        ("display_name", Absent, Plain),
        ("file_uri", Absent, Plain),
        ("mime_type", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static CODE_RESULT: Model = Model {
    fields: &[
        ("outcome", Absent, Plain),
        ("output", Absent, Plain),
        ("id", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static CODE: Model = Model {
    fields: &[
        ("code", Absent, Plain),
        ("language", Absent, Plain),
        ("id", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static VIDEO: Model = Model {
    fields: &[
        ("end_offset", Absent, Plain),
        ("fps", Absent, Plain),
        ("start_offset", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static GROUNDING: Model = Model {
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

pub(super) static GROUNDING_CHUNK: Model = Model {
    fields: &[
        ("image", Absent, Kind::Tree),
        ("maps", Absent, Kind::Tree),
        ("retrieved_context", Absent, Kind::Tree),
        ("web", Absent, Kind::One(&GROUNDING_WEB)),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static GROUNDING_WEB: Model = Model {
    fields: &[
        ("domain", Absent, Plain),
        ("title", Absent, Plain),
        ("uri", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static GROUNDING_SUPPORT: Model = Model {
    fields: &[
        ("confidence_scores", Absent, Plain),
        ("grounding_chunk_indices", Absent, Plain),
        ("segment", Absent, Kind::One(&SEGMENT)),
        ("rendered_parts", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static SEGMENT: Model = Model {
    fields: &[
        ("start_index", Absent, Plain),
        ("end_index", Absent, Plain),
        ("part_index", Absent, Plain),
        ("text", Absent, Plain),
    ],
    extra: Extra::Forbid,
    camel: true,
};

pub(super) static USAGE: Model = Model {
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

pub(super) static MODALITY_COUNT: Model = Model {
    fields: &[("modality", Absent, Plain), ("token_count", Absent, Plain)],
    extra: Extra::Forbid,
    camel: true,
};

/// `EvalSetResult` (`google.adk.evaluation.eval_result`): one run of a set.
pub(super) static EVAL_SET_RESULT: Model = Model {
    fields: &[
        ("eval_set_result_id", Absent, Plain),
        ("eval_set_result_name", Absent, Plain),
        ("eval_set_id", Absent, Plain),
        (
            "eval_case_results",
            EmptyList,
            Kind::List(&EVAL_CASE_RESULT),
        ),
        ("creation_timestamp", Zero, Kind::Float),
    ],
    extra: Extra::Ignore,
    camel: true,
};

/// `EvalCaseResult`: one case of a run.
pub(super) static EVAL_CASE_RESULT: Model = Model {
    fields: &[
        ("eval_set_file", Absent, Plain),
        ("eval_set_id", EmptyString, Plain),
        ("eval_id", EmptyString, Plain),
        ("final_eval_status", Absent, Plain),
        ("eval_metric_results", Absent, Opaque),
        (
            "overall_eval_metric_results",
            Absent,
            Kind::List(&EVAL_METRIC_RESULT),
        ),
        (
            "eval_metric_result_per_invocation",
            Absent,
            Kind::List(&EVAL_METRIC_RESULT_PER_INVOCATION),
        ),
        ("session_id", Absent, Plain),
        ("session_details", Absent, Opaque),
        ("user_id", Absent, Plain),
    ],
    extra: Extra::Ignore,
    camel: true,
};

/// The dev server's `RunEvalResult`: a case's result as `…/eval-sets/{set}/run` answers it.
pub(super) static RUN_EVAL_RESULT: Model = Model {
    fields: &[
        ("eval_set_file", Absent, Plain),
        ("eval_set_id", Absent, Plain),
        ("eval_id", Absent, Plain),
        ("final_eval_status", Absent, Plain),
        ("eval_metric_results", EmptyList, Opaque),
        (
            "overall_eval_metric_results",
            Absent,
            Kind::List(&EVAL_METRIC_RESULT),
        ),
        (
            "eval_metric_result_per_invocation",
            Absent,
            Kind::List(&EVAL_METRIC_RESULT_PER_INVOCATION),
        ),
        ("user_id", Absent, Plain),
        ("session_id", Absent, Plain),
    ],
    extra: Extra::Ignore,
    camel: true,
};

/// `EvalMetricResult`: an `EvalMetric` with its score and status.
pub(super) static EVAL_METRIC_RESULT: Model = Model {
    fields: &[
        ("metric_name", Absent, Plain),
        ("threshold", Absent, Kind::Float),
        ("criterion", Absent, Kind::Tree),
        ("custom_function_path", Absent, Plain),
        ("score", Absent, Kind::Float),
        ("eval_status", Absent, Plain),
        ("details", EmptyMap, Kind::Tree),
    ],
    extra: Extra::Ignore,
    camel: true,
};

/// `EvalMetricResultPerInvocation`: the actual and expected invocations and their scores.
pub(super) static EVAL_METRIC_RESULT_PER_INVOCATION: Model = Model {
    fields: &[
        ("actual_invocation", Absent, Kind::One(&INVOCATION)),
        ("expected_invocation", Absent, Kind::One(&INVOCATION)),
        (
            "eval_metric_results",
            EmptyList,
            Kind::List(&EVAL_METRIC_RESULT),
        ),
    ],
    extra: Extra::Ignore,
    camel: true,
};
