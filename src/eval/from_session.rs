//! A session's events as an eval case's expected conversation: ADK's
//! `EvaluationGenerator.convert_events_to_eval_invocations` (what its dev server's
//! `add_session` stores), step for step, so a case agentd makes from a session is the case
//! ADK makes from it (tests/evals.rs checks the bytes against google-adk itself).

use super::doc::Doc;
use super::shape;
use crate::event::Event;

/// One invocation per invocation id, in the order the ids first appear, in the file form.
pub fn invocations(events: &[Event]) -> Vec<Doc> {
    let mut groups: Vec<(&str, Vec<&Event>)> = vec![];
    let mut place: std::collections::HashMap<&str, usize> = Default::default();
    for e in events {
        let i = *place.entry(e.invocation_id.as_str()).or_insert_with(|| {
            groups.push((e.invocation_id.as_str(), vec![]));
            groups.len() - 1
        });
        groups[i].1.push(e);
    }
    groups
        .into_iter()
        .map(|(id, of_it)| invocation(id, &of_it))
        .collect()
}

fn invocation(id: &str, events: &[&Event]) -> Doc {
    let mut user_content = Doc::object().with("parts", Doc::Array(vec![]));
    let mut timestamp = 0.0;
    let mut final_event: Option<&Event> = None;
    let mut to_add: Vec<&Event> = vec![];
    for &e in events {
        let author = match e.author.as_str() {
            "" => "agent".to_string(),
            a => a.to_lowercase(),
        };
        if author == "user" {
            if let Some(c) = &e.content {
                user_content = content(c);
                timestamp = e.timestamp;
            }
            continue;
        }
        let parts = e
            .content
            .as_ref()
            .map(|c| c.parts.as_slice())
            .unwrap_or(&[]);
        let grounded = grounding(e).is_some();
        if !parts.is_empty() {
            if is_final_response(e) {
                let final_has_text = final_event.is_some_and(has_text);
                if !final_has_text || has_text(e) {
                    final_event = Some(e);
                }
            }
            let useful = parts.iter().any(|p| {
                p.function_call.is_some()
                    || p.function_response.is_some()
                    || p.text.as_deref().is_some_and(|t| !t.is_empty())
                    || p.inline_data.is_some()
            });
            if grounded || useful {
                to_add.push(e);
            }
        } else if grounded {
            to_add.push(e);
        }
    }
    let events: Vec<Doc> = to_add
        .iter()
        .map(|&e| {
            let mut ev = Doc::object().with("author", Doc::str(&e.author));
            // The final response's text is on `final_response` already; its function calls
            // stay here, where the tool trajectory is read from.
            let is_final = final_event.is_some_and(|f| std::ptr::eq(f, e));
            if let Some(c) = &e.content {
                if !is_final || e.function_calls().next().is_some() {
                    ev.set("content", content(c));
                }
            }
            if let Some(g) = grounding(e) {
                ev.set(
                    "grounding_metadata",
                    shape::grounding_file(&g.clone().into()),
                );
            }
            if let Some(u) = &e.usage_metadata {
                ev.set("usage_metadata", shape::usage_file(&u.clone().into()));
            }
            if let Some(m) = &e.model_version {
                ev.set("model_version", Doc::str(m));
            }
            ev
        })
        .collect();
    let mut inv = Doc::object();
    if !id.is_empty() {
        inv.set("invocation_id", Doc::str(id));
    }
    inv.set("user_content", user_content);
    if let Some(c) = final_event.and_then(|e| e.content.as_ref()) {
        inv.set("final_response", content(c));
    }
    let intermediate = match events.is_empty() {
        // `invocation_events: []` is the field's default: pydantic leaves it out.
        true => Doc::object(),
        false => Doc::object().with("invocation_events", Doc::Array(events)),
    };
    inv.set("intermediate_data", intermediate);
    if timestamp != 0.0 {
        inv.set("creation_timestamp", Doc::float(timestamp));
    }
    inv
}

/// An event's content as ADK writes it: snake_case, genai's field order.
fn content(c: &crate::event::Content) -> Doc {
    let wire = serde_json::to_value(c).unwrap_or_default();
    shape::content_file(&wire.into())
}

/// The event's grounding metadata, unless absent or `null` (ADK's `None`).
fn grounding(e: &Event) -> Option<&serde_json::Value> {
    e.extra.get("groundingMetadata").filter(|g| !g.is_null())
}

fn has_text(e: &Event) -> bool {
    e.parts()
        .any(|p| p.text.as_deref().is_some_and(|t| !t.is_empty()))
}

/// ADK's `Event.is_final_response`.
fn is_final_response(e: &Event) -> bool {
    if e.actions.skip_summarization == Some(true)
        || e.long_running_tool_ids
            .as_ref()
            .is_some_and(|ids| !ids.is_empty())
    {
        return true;
    }
    let calls = e.function_calls().next().is_some();
    if e.error_code.as_deref().is_some_and(|c| !c.is_empty()) && !e.is_partial() && !calls {
        return true;
    }
    let trailing_code_result = e
        .parts()
        .last()
        .is_some_and(|p| p.extra.contains_key("codeExecutionResult"));
    !calls && e.function_responses().next().is_none() && !e.is_partial() && !trailing_code_result
}

/// The state keys an app's instructions read (`{key}`), each `""`: ADK's
/// `create_empty_state`, which `add_session` stores as the case's initial state. Sub-agents
/// first, as ADK walks the tree.
pub fn empty_state(root: &std::sync::Arc<dyn crate::invocation::Agent>) -> Doc {
    let mut state = Doc::object();
    let mut seen = std::collections::HashSet::new();
    walk(root, &mut state, &mut seen);
    state
}

fn walk(
    agent: &std::sync::Arc<dyn crate::invocation::Agent>,
    state: &mut Doc,
    seen: &mut std::collections::HashSet<String>,
) {
    if !seen.insert(agent.name().to_string()) {
        return;
    }
    for sub in agent.sub_agents() {
        walk(sub, state, seen);
    }
    for key in placeholders(agent.instruction()) {
        if state.get(&key).is_none() {
            state.set(&key, Doc::str(""));
        }
    }
}

/// Python's `re.findall(r'{([\w]+)}', text)`.
fn placeholders(text: &str) -> Vec<String> {
    let mut out = vec![];
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '{' {
            let start = i + 1;
            let mut j = start;
            while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            if j > start && j < chars.len() && chars[j] == '}' {
                out.push(chars[start..j].iter().collect());
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_found_as_python_finds_them() {
        assert_eq!(
            placeholders("Hi {name}, {a b} {{x}} {é_1} {} {open"),
            vec!["name", "x", "é_1"]
        );
    }
}
