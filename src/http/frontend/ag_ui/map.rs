//! AG-UI events (the protocol of CopilotKit and other agent UIs), as a pure mapping from a
//! run's items.
//!
//! `RUN_STARTED` and a `STATE_SNAPSHOT` open the run; each agent's output is a step
//! (`STEP_STARTED`/`STEP_FINISHED` named after the agent, so a transfer shows as a new step);
//! text is `TEXT_MESSAGE_START/CONTENT/END` keyed by the event id; function calls are
//! `TOOL_CALL_START/ARGS/END` keyed by the call id, and server-side results
//! `TOOL_CALL_RESULT`; state deltas are `STATE_DELTA` (JSON Patch `add` per key). The run
//! ends with the final `STATE_SNAPSHOT`, a `MESSAGES_SNAPSHOT` and `RUN_FINISHED`, or with
//! `RUN_ERROR` alone.
//!
//! Older AG-UI clients reject any event inside an open text message or tool call (even
//! `RUN_ERROR`), so an open text message is closed before anything else is sent and each
//! tool call's three events are contiguous. No empty deltas.

use crate::event::{Event, JsonMap, Part};
use crate::http::frontend::kit::{answer_part, answer_text, response_object, Streamed};
use crate::store::RunStatus;
use crate::transcript::RunItem;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The new input of a re-sent thread: its trailing tool messages that answer `open` calls (id →
/// name), else its trailing user message unless it was `seen` (run before). What precedes
/// them was sent, and run, before.
pub fn new_input(messages: &[Value], open: &BTreeMap<String, String>, seen: bool) -> Vec<Part> {
    let mut parts: Vec<Part> = vec![];
    for m in messages.iter().rev() {
        match m.get("role").and_then(Value::as_str) {
            Some("user") => {
                let text = user_text(m);
                if !seen && !text.is_empty() && parts.is_empty() {
                    parts.push(Part::text(text));
                }
                break;
            }
            Some("tool") => {
                let call_id = m
                    .get("toolCallId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if let Some(name) = open.get(call_id) {
                    let content = m.get("content").and_then(Value::as_str).unwrap_or_default();
                    let value = serde_json::from_str(content)
                        .unwrap_or_else(|_| Value::String(content.to_string()));
                    parts.insert(0, answer_part(call_id, name, response_object(value)));
                }
            }
            _ => break,
        }
    }
    parts
}

/// The keys of the client's `state` that differ from the session's `current` one. Only the
/// session's own keys: `app:` and `user:` keys are shared with other sessions, where they may
/// have changed since this client's copy (it would write back stale values).
pub fn state_delta(current: &JsonMap, client: Option<&Value>) -> JsonMap {
    let mut delta = JsonMap::new();
    if let Some(Value::Object(client)) = client {
        for (k, v) in client {
            let shared = k.starts_with("temp:") || k.starts_with("app:") || k.starts_with("user:");
            if !shared && current.get(k) != Some(v) {
                delta.insert(k.clone(), v.clone());
            }
        }
    }
    delta
}

/// The text of an AG-UI user message (`content` string, or its text input parts).
fn user_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[derive(Debug)]
pub struct AgUiStream {
    thread_id: String,
    run_id: String,
    partials: bool,
    open_text: Option<String>,
    step: Option<String>,
    text: Streamed,
    /// `RUN_ERROR` was sent: nothing may follow it.
    ended: bool,
}

/// RFC 6901 escaping of a state key for a JSON Patch path.
fn pointer(key: &str) -> String {
    format!("/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// State as the client sees it: no `temp:` keys.
pub fn client_state(state: &JsonMap) -> JsonMap {
    let mut s = state.clone();
    crate::event::strip_temp_keys(&mut s);
    s
}

impl AgUiStream {
    pub fn new(thread_id: String, run_id: String, partials: bool) -> Self {
        AgUiStream {
            thread_id,
            run_id,
            partials,
            open_text: None,
            step: None,
            text: Streamed::default(),
            ended: false,
        }
    }

    /// The first events: `RUN_STARTED` and the state the run starts from.
    pub fn start(&self, state: &JsonMap) -> Vec<Value> {
        vec![
            json!({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}),
            json!({"type": "STATE_SNAPSHOT", "snapshot": client_state(state)}),
        ]
    }

    /// A run with nothing new to do (every message was already seen).
    pub fn empty(&self) -> Vec<Value> {
        vec![
            json!({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}),
            json!({"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id}),
        ]
    }

    /// The events for one item, except `Done`, which needs the final state: see [`Self::end`].
    pub fn item(&mut self, item: &RunItem) -> Vec<Value> {
        let mut out = vec![];
        if self.ended {
            return out;
        }
        match item {
            RunItem::Event { event, seq: None } => {
                if self.partials && event.author != "user" {
                    self.partial(event, &mut out);
                }
            }
            RunItem::Event {
                event,
                seq: Some(_),
            } => {
                if event.author != "user" {
                    self.complete(event, &mut out);
                }
            }
            RunItem::Error { kind, message } => self.error(kind, message, &mut out),
            RunItem::Done { .. } => {}
        }
        out
    }

    /// Whether the stream is over (after `RUN_ERROR`).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The last events: for a completed run, the final state and transcript (when they could
    /// be read whole) and `RUN_FINISHED`; otherwise `RUN_ERROR`.
    pub fn end(
        &mut self,
        status: RunStatus,
        state: Option<&JsonMap>,
        messages: Option<Vec<Value>>,
    ) -> Vec<Value> {
        let mut out = vec![];
        if self.ended {
            return out;
        }
        match status {
            RunStatus::Completed => {
                self.close(&mut out);
                if let Some(state) = state {
                    out.push(json!({"type": "STATE_SNAPSHOT", "snapshot": client_state(state)}));
                }
                if let Some(messages) = messages {
                    out.push(json!({"type": "MESSAGES_SNAPSHOT", "messages": messages}));
                }
                out.push(json!({"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id}));
                self.ended = true;
            }
            RunStatus::Cancelled => self.error("cancelled", "The run was cancelled.", &mut out),
            other => self.error(
                other.as_str(),
                &format!("The run ended: {}", other.as_str()),
                &mut out,
            ),
        }
        out
    }

    fn close_text(&mut self, out: &mut Vec<Value>) {
        if let Some(id) = self.open_text.take() {
            out.push(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
        }
    }

    fn close(&mut self, out: &mut Vec<Value>) {
        self.close_text(out);
        if let Some(step) = self.step.take() {
            out.push(json!({"type": "STEP_FINISHED", "stepName": step}));
        }
    }

    fn step_for(&mut self, author: &str, out: &mut Vec<Value>) {
        if self.step.as_deref() == Some(author) {
            return;
        }
        self.close(out);
        out.push(json!({"type": "STEP_STARTED", "stepName": author}));
        self.step = Some(author.to_string());
    }

    fn error(&mut self, code: &str, message: &str, out: &mut Vec<Value>) {
        self.close(out);
        out.push(json!({"type": "RUN_ERROR", "message": message, "code": code}));
        self.ended = true;
    }

    fn partial(&mut self, event: &Event, out: &mut Vec<Value>) {
        let text = answer_text(event);
        // Another message is streaming (agents running in parallel): this one is sent whole
        // when it is committed (a closed message id must not be reopened).
        if text.is_empty() || self.open_text.as_ref().is_some_and(|t| *t != event.id) {
            return;
        }
        self.step_for(&event.author, out);
        if self.open_text.as_deref() != Some(&event.id) {
            self.close_text(out);
            out.push(
                json!({"type": "TEXT_MESSAGE_START", "messageId": event.id, "role": "assistant"}),
            );
            self.open_text = Some(event.id.clone());
        }
        self.text.partial(&event.id, &text);
        out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": event.id, "delta": text}));
    }

    fn complete(&mut self, event: &Event, out: &mut Vec<Value>) {
        let id = &event.id;
        let text = answer_text(event);
        let has_output = !text.is_empty()
            || event.function_calls().next().is_some()
            || event.function_responses().next().is_some()
            || !event.actions.state_delta.is_empty();
        if has_output {
            self.step_for(&event.author, out);
        }
        if !text.is_empty() {
            let rest = self.text.rest(id, &text);
            if self.open_text.as_deref() != Some(id.as_str()) {
                self.close_text(out);
                if !rest.is_empty() {
                    out.push(
                        json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}),
                    );
                    out.push(
                        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": rest}),
                    );
                    out.push(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
                }
            } else if !rest.is_empty() {
                out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": rest}));
            }
        }
        self.close_text(out);
        for call in event.function_calls() {
            let call_id = call.id.clone().unwrap_or_default();
            out.push(json!({"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": call.name, "parentMessageId": id}));
            if !call.args.is_empty() {
                out.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": Value::Object(call.args.clone()).to_string()}));
            }
            out.push(json!({"type": "TOOL_CALL_END", "toolCallId": call_id}));
        }
        for r in event.function_responses() {
            let call_id = r.id.clone().unwrap_or_default();
            out.push(json!({
                "type": "TOOL_CALL_RESULT",
                "messageId": format!("{id}:{call_id}"),
                "toolCallId": call_id,
                "content": Value::Object(r.response.clone()).to_string(),
                "role": "tool",
            }));
        }
        let delta = client_state(&event.actions.state_delta);
        if !delta.is_empty() {
            let ops: Vec<Value> = delta
                .iter()
                .map(|(k, v)| json!({"op": "add", "path": pointer(k), "value": v}))
                .collect();
            out.push(json!({"type": "STATE_DELTA", "delta": ops}));
        }
        if event.error_code.is_some() || event.error_message.is_some() {
            let code = event.error_code.clone().unwrap_or_else(|| "error".into());
            let msg = event.error_message.clone().unwrap_or_default();
            self.error(&code, &msg, out);
        }
    }
}

/// The session's transcript as AG-UI messages (ids are event ids, so they match the streamed
/// ones): user and assistant text, assistant tool calls, and tool results.
pub fn messages(events: &[Event]) -> Vec<Value> {
    let mut out = vec![];
    // The conversation as it is now: what a rewind annulled is not in it.
    let live = crate::transcript::rewind::live(events);
    for e in events.iter().zip(live).filter(|(_, l)| *l).map(|(e, _)| e) {
        let text = answer_text(e);
        if e.author == "user" {
            if !text.is_empty() {
                out.push(json!({"id": e.id, "role": "user", "content": text}));
            }
        } else {
            let calls: Vec<Value> = e
                .function_calls()
                .map(|c| {
                    json!({"id": c.id.clone().unwrap_or_default(), "type": "function",
                           "function": {"name": c.name, "arguments": Value::Object(c.args.clone()).to_string()}})
                })
                .collect();
            if !text.is_empty() || !calls.is_empty() {
                let mut m = json!({"id": e.id, "role": "assistant"});
                if !text.is_empty() {
                    m["content"] = json!(text);
                }
                if !calls.is_empty() {
                    m["toolCalls"] = json!(calls);
                }
                out.push(m);
            }
        }
        for r in e.function_responses() {
            let call_id = r.id.clone().unwrap_or_default();
            out.push(
                json!({"id": format!("{}:{call_id}", e.id), "role": "tool", "toolCallId": call_id,
                            "content": Value::Object(r.response.clone()).to_string()}),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Content;

    fn text_event(id: &str, author: &str, text: &str, partial: bool) -> Event {
        let mut e = Event::new("inv", author).with_content(Content::text("model", text));
        e.id = id.into();
        if partial {
            e.partial = Some(true);
        }
        e
    }

    fn types(v: &[Value]) -> Vec<String> {
        v.iter()
            .map(|e| e["type"].as_str().unwrap_or("").to_string())
            .collect()
    }

    #[test]
    fn text_streams_in_one_message_and_the_run_closes_everything() {
        let mut s = AgUiStream::new("t".into(), "r".into(), true);
        let mut out = s.start(&JsonMap::new());
        for (e, seq) in [
            (text_event("e1", "a", "Hel", true), None),
            (text_event("e1", "a", "Hello", false), Some(2)),
        ] {
            out.extend(s.item(&RunItem::Event {
                event: Box::new(e),
                seq,
            }));
        }
        out.extend(s.end(RunStatus::Completed, Some(&JsonMap::new()), Some(vec![])));
        assert_eq!(
            types(&out),
            [
                "RUN_STARTED",
                "STATE_SNAPSHOT",
                "STEP_STARTED",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "STEP_FINISHED",
                "STATE_SNAPSHOT",
                "MESSAGES_SNAPSHOT",
                "RUN_FINISHED"
            ]
        );
        assert_eq!(out[5]["delta"], "lo");
    }

    #[test]
    fn an_error_closes_the_open_message_first_and_nothing_follows() {
        let mut s = AgUiStream::new("t".into(), "r".into(), true);
        let mut out = s.item(&RunItem::Event {
            event: Box::new(text_event("e1", "a", "Hi", true)),
            seq: None,
        });
        out.extend(s.item(&RunItem::Error {
            kind: "ModelError".into(),
            message: "boom".into(),
        }));
        out.extend(s.end(RunStatus::Failed, None, None));
        assert_eq!(
            types(&out),
            [
                "STEP_STARTED",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "STEP_FINISHED",
                "RUN_ERROR"
            ]
        );
    }

    #[test]
    fn parallel_agents_do_not_reopen_a_closed_message() {
        let mut s = AgUiStream::new("t".into(), "r".into(), true);
        let mut out = vec![];
        for (e, seq) in [
            (text_event("a1", "a", "A-", true), None),
            (text_event("b1", "b", "B-", true), None),
            (text_event("a1", "a", "A-more", true), None),
            (text_event("a1", "a", "A-A-more", false), Some(2)),
            (text_event("b1", "b", "B-all", false), Some(3)),
        ] {
            out.extend(s.item(&RunItem::Event {
                event: Box::new(e),
                seq,
            }));
        }
        let starts: Vec<&str> = out
            .iter()
            .filter(|e| e["type"] == "TEXT_MESSAGE_START")
            .filter_map(|e| e["messageId"].as_str())
            .collect();
        assert_eq!(starts, ["a1", "b1"], "{out:#?}");
        let b_text: String = out
            .iter()
            .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT" && e["messageId"] == "b1")
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert_eq!(b_text, "B-all");
    }

    #[test]
    fn state_keys_are_escaped_json_pointers_and_temp_keys_stay_on_the_server() {
        let mut e = text_event("e1", "a", "", false);
        e.content = None;
        e.actions.state_delta.insert("a/b~c".into(), json!(1));
        e.actions.state_delta.insert("temp:x".into(), json!(2));
        let mut s = AgUiStream::new("t".into(), "r".into(), true);
        let out = s.item(&RunItem::Event {
            event: Box::new(e),
            seq: Some(3),
        });
        assert_eq!(
            out[1]["delta"],
            json!([{"op": "add", "path": "/a~1b~0c", "value": 1}])
        );
    }
}
