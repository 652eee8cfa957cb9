//! Kept spans ([`crate::telemetry::traces`]) as ADK's dev server answers them, a pure mapping:
//! `WebUiSpan` for a session's trace, and the attributes of the span that made an event.
//!
//! agentd's spans keep their own names and fields; this gives them the names and attributes
//! ADK's web UI reads (google-adk 2.13.0's bundle validates them, and drops the whole trace
//! if one span lacks what its operation needs):
//! - the run's span is ADK's `invocation`, with the session, invocation and user ids;
//! - `invoke_agent {name}` carries `gen_ai.conversation.id` (the session);
//! - a model call that made an event is `generate_content {model}` with
//!   `gcp.vertex.agent.event_id` and `gcp.vertex.agent.invocation_id`, and its request and
//!   response as `gcp.vertex.agent.llm_request` / `…llm_response` (the event's Request and
//!   Response panes);
//! - `execute_tool {name}` as it is; other spans (`admit`, `commit`, …) too.

use crate::telemetry::traces::KeptSpan;
use serde_json::{json, Map, Value};

const EVENT_ID: &str = "gcp.vertex.agent.event_id";
const INVOCATION_ID: &str = "gcp.vertex.agent.invocation_id";
const CONVERSATION_ID: &str = "gen_ai.conversation.id";

/// The span as one of ADK's `WebUiSpan`s.
pub fn web_ui_span(span: &KeptSpan) -> Value {
    let (name, attributes) = adk_view(span);
    json!({
        "name": name,
        "start_time": span.start_ns,
        "end_time": span.end_ns,
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "attributes": attributes,
        "logs": [],
    })
}

/// What `GET …/debug/trace/{event_id}` answers for the span that made the event: its
/// attributes, with `trace_id` and `span_id` (ADK's `ApiServerSpanExporter`).
pub fn event_trace(span: &KeptSpan) -> Value {
    let (_, mut attributes) = adk_view(span);
    attributes.insert("trace_id".into(), span.trace_id.into());
    attributes.insert("span_id".into(), span.span_id.into());
    Value::Object(attributes)
}

/// The event a span made, for the spans ADK keys by event: a model call or a tool's.
pub fn made_event(span: &KeptSpan) -> Option<&str> {
    match span.kind {
        "chat" | "execute_tool" => span
            .fields
            .get(EVENT_ID)
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty()),
        _ => None,
    }
}

fn adk_view(span: &KeptSpan) -> (String, Map<String, Value>) {
    let ids = &span.run;
    let mut name = span.name.clone();
    let mut a = span.fields.clone();
    let put = |a: &mut Map<String, Value>, k: &str, v: &str| {
        a.insert(k.to_string(), Value::String(v.to_string()));
    };
    match span.kind {
        "run" => {
            name = "invocation".into();
            put(&mut a, CONVERSATION_ID, &ids.session);
            put(&mut a, INVOCATION_ID, &ids.invocation);
            put(&mut a, "user.id", &ids.user);
            put(&mut a, "agentd.run_id", &ids.run);
        }
        "chat" if made_event(span).is_some() => {
            if let Some(model) = name.strip_prefix("chat ") {
                name = format!("generate_content {model}");
            }
            put(&mut a, "gen_ai.operation.name", "generate_content");
            put(&mut a, CONVERSATION_ID, &ids.session);
            put(&mut a, INVOCATION_ID, &ids.invocation);
        }
        "agent" | "chat" | "execute_tool" => {
            put(&mut a, CONVERSATION_ID, &ids.session);
            put(&mut a, INVOCATION_ID, &ids.invocation);
        }
        _ => {}
    }
    (name, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::traces::RunIds;
    use std::sync::Arc;

    fn span(kind: &'static str, name: &str, fields: Value) -> KeptSpan {
        KeptSpan {
            kind,
            name: name.into(),
            start_ns: 10,
            end_ns: 20,
            trace_id: 7,
            span_id: 8,
            parent_span_id: Some(6),
            run: Arc::new(RunIds {
                app: "a".into(),
                user: "u".into(),
                session: "s".into(),
                run: "r".into(),
                invocation: "e-1".into(),
            }),
            fields: fields.as_object().cloned().unwrap_or_default(),
        }
    }

    #[test]
    fn a_model_call_that_made_an_event_is_adks_generate_content() {
        let s = span(
            "chat",
            "chat gpt-x",
            json!({"gen_ai.operation.name": "chat", EVENT_ID: "ev1", "gen_ai.usage.input_tokens": 5}),
        );
        let w = web_ui_span(&s);
        assert_eq!(w["name"], "generate_content gpt-x");
        assert_eq!(w["attributes"]["gen_ai.operation.name"], "generate_content");
        assert_eq!(w["attributes"][EVENT_ID], "ev1");
        assert_eq!(w["attributes"][INVOCATION_ID], "e-1");
        assert_eq!(w["attributes"][CONVERSATION_ID], "s");
        assert_eq!(w["parent_span_id"], 6);
        assert_eq!(made_event(&s), Some("ev1"));
        let e = event_trace(&s);
        assert_eq!(
            (e["trace_id"].clone(), e["span_id"].clone()),
            (json!(7), json!(8))
        );
    }

    #[test]
    fn a_model_call_without_an_event_stays_a_chat() {
        // The web UI requires an event id on `generate_content` spans.
        let s = span(
            "chat",
            "chat gpt-x",
            json!({"gen_ai.operation.name": "chat"}),
        );
        let w = web_ui_span(&s);
        assert_eq!(w["name"], "chat gpt-x");
        assert_eq!(w["attributes"]["gen_ai.operation.name"], "chat");
        assert_eq!(made_event(&s), None);
    }

    #[test]
    fn the_run_is_the_invocation() {
        let w = web_ui_span(&span("run", "run", json!({})));
        assert_eq!(w["name"], "invocation");
        assert_eq!(w["attributes"][CONVERSATION_ID], "s");
        assert_eq!(w["attributes"]["user.id"], "u");
        assert_eq!(w["logs"], json!([]));
    }
}
