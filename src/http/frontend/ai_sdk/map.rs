//! The Vercel AI SDK's UI message stream (`x-vercel-ai-ui-message-stream: v1`), as a pure
//! mapping from a run's items to chunks.
//!
//! One assistant message per user turn: `start{messageId}`; a step (`start-step` …
//! `finish-step`) per model response; text and reasoning parts keyed by the event id (the
//! id every partial chunk of one model response shares, and the id of the stored event);
//! tool calls and results keyed by the function call id; then `finish` (or `error`, or
//! `abort` for a cancelled run) and `[DONE]`. A completed run's `finish` carries the run's
//! token counts as `messageMetadata.usage`.
//!
//! Only chunk fields every client from ai 5.0 on accepts are sent (ai 5.0.0 and 6.0.0 validate
//! chunks with strict schemas, so one unknown field fails the whole chat). What only ai ≥ 6
//! understands — `tool-approval-request` and `tool-output-denied` — is sent when the client
//! said it is v6 or later; a v5 client sees a confirmation as a client-side tool call
//! (`adk_request_confirmation`) it answers with `addToolOutput({confirmed: true|false})`.

use crate::event::Event;
use crate::event::{CONFIRMATION_REJECTED, CONFIRMATION_REQUIRED, REQUEST_CONFIRMATION};
use crate::http::frontend::kit::{answer_text, thought_text, Streamed};
use crate::store::RunStatus;
use crate::transcript::RunItem;
use crate::usage::Tokens;
use serde_json::{json, Value};

/// The mapping state of one response stream.
#[derive(Debug)]
pub struct UiStream {
    message_id: String,
    /// The client understands ai 6's approval chunks.
    approvals: bool,
    /// Partial events are streamed (false on a resumed stream: it joins a model response
    /// midway, so it sends each response whole when it is committed).
    partials: bool,
    /// The model response whose step is open.
    step: Option<String>,
    step_open: bool,
    open_text: Option<String>,
    open_reasoning: Option<String>,
    text: Streamed,
    reasoning: Streamed,
    /// An `error` chunk was sent: the client stops reading there.
    errored: bool,
    /// The run's model responses' token counts, sent as the `finish` chunk's
    /// `messageMetadata.usage` (the AI SDK's `LanguageModelUsage` names).
    usage: Tokens,
}

impl UiStream {
    pub fn new(message_id: String, approvals: bool, partials: bool) -> Self {
        UiStream {
            message_id,
            approvals,
            partials,
            step: None,
            step_open: false,
            open_text: None,
            open_reasoning: None,
            text: Streamed::default(),
            reasoning: Streamed::default(),
            errored: false,
            usage: Tokens::default(),
        }
    }

    /// The first chunk.
    pub fn start(&self) -> Value {
        json!({"type": "start", "messageId": self.message_id})
    }

    /// The chunks for one item (the last item, `Done`, also closes the message).
    pub fn item(&mut self, item: &RunItem) -> Vec<Value> {
        let mut out = vec![];
        if self.errored {
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
                    if let Some(u) = &event.usage_metadata {
                        self.usage.add(Tokens::of_metadata(u));
                    }
                    self.complete(event, &mut out);
                }
            }
            RunItem::Error { kind, message } => {
                self.fail(format!("{kind}: {message}"), &mut out);
            }
            RunItem::Done { status, .. } => self.done(*status, &mut out),
        }
        out
    }

    fn close_text(&mut self, out: &mut Vec<Value>) {
        if let Some(id) = self.open_reasoning.take() {
            out.push(json!({"type": "reasoning-end", "id": id}));
        }
        if let Some(id) = self.open_text.take() {
            out.push(json!({"type": "text-end", "id": id}));
        }
    }

    /// Opens the step of model response `event_id` (closing the previous one).
    fn step_for(&mut self, event_id: &str, out: &mut Vec<Value>) {
        if self.step.as_deref() == Some(event_id) && self.step_open {
            return;
        }
        self.close_text(out);
        if self.step_open {
            out.push(json!({"type": "finish-step"}));
        }
        out.push(json!({"type": "start-step"}));
        self.step = Some(event_id.to_string());
        self.step_open = true;
    }

    /// Tool results, approvals and data parts belong to the step that is open, if any: a
    /// continuation after an approval starts with the tool's output, outside any step (an
    /// empty `start-step` would leave an empty step in the client's message).
    fn any_step(&mut self, _event_id: &str, out: &mut Vec<Value>) {
        self.close_text(out);
    }

    fn partial(&mut self, event: &Event, out: &mut Vec<Value>) {
        let thought = thought_text(event);
        let text = answer_text(event);
        if thought.is_empty() && text.is_empty() {
            return;
        }
        // Another response is streaming (agents running in parallel): this one is sent whole
        // when it is committed, so neither is split into pieces.
        let reasoning_id = format!("{}:r", event.id);
        if self.open_text.as_ref().is_some_and(|t| *t != event.id)
            || self
                .open_reasoning
                .as_ref()
                .is_some_and(|r| *r != reasoning_id)
        {
            return;
        }
        self.step_for(&event.id, out);
        if !thought.is_empty() {
            let id = format!("{}:r", event.id);
            if self.open_reasoning.as_deref() != Some(&id) {
                if let Some(t) = self.open_text.take() {
                    out.push(json!({"type": "text-end", "id": t}));
                }
                out.push(json!({"type": "reasoning-start", "id": id}));
                self.open_reasoning = Some(id.clone());
            }
            self.reasoning.partial(&event.id, &thought);
            out.push(json!({"type": "reasoning-delta", "id": id, "delta": thought}));
        }
        if !text.is_empty() {
            if self.open_text.as_deref() != Some(&event.id) {
                if let Some(r) = self.open_reasoning.take() {
                    out.push(json!({"type": "reasoning-end", "id": r}));
                }
                out.push(json!({"type": "text-start", "id": event.id}));
                self.open_text = Some(event.id.clone());
            }
            self.text.partial(&event.id, &text);
            out.push(json!({"type": "text-delta", "id": event.id, "delta": text}));
        }
    }

    fn complete(&mut self, event: &Event, out: &mut Vec<Value>) {
        let id = &event.id;
        let thought = thought_text(event);
        let text = answer_text(event);
        let calls: Vec<_> = event.function_calls().collect();
        let is_model_output = !thought.is_empty() || !text.is_empty() || !calls.is_empty();
        // A confirmation request alone joins the step of the call it is about.
        let only_confirmations =
            !calls.is_empty() && calls.iter().all(|c| c.name == REQUEST_CONFIRMATION);
        if is_model_output && !only_confirmations {
            self.step_for(id, out);
        }
        if !thought.is_empty() {
            let rid = format!("{id}:r");
            let rest = self.reasoning.rest(id, &thought);
            if self.open_reasoning.as_deref() != Some(&rid) {
                self.close_text(out);
                if !rest.is_empty() {
                    out.push(json!({"type": "reasoning-start", "id": rid}));
                    out.push(json!({"type": "reasoning-delta", "id": rid, "delta": rest}));
                    out.push(json!({"type": "reasoning-end", "id": rid}));
                }
            } else {
                if !rest.is_empty() {
                    out.push(json!({"type": "reasoning-delta", "id": rid, "delta": rest}));
                }
                self.open_reasoning = None;
                out.push(json!({"type": "reasoning-end", "id": rid}));
            }
        }
        if !text.is_empty() {
            let rest = self.text.rest(id, &text);
            if self.open_text.as_deref() != Some(id.as_str()) {
                self.close_text(out);
                if !rest.is_empty() {
                    out.push(json!({"type": "text-start", "id": id}));
                    out.push(json!({"type": "text-delta", "id": id, "delta": rest}));
                    out.push(json!({"type": "text-end", "id": id}));
                }
            } else {
                if !rest.is_empty() {
                    out.push(json!({"type": "text-delta", "id": id, "delta": rest}));
                }
                self.open_text = None;
                out.push(json!({"type": "text-end", "id": id}));
            }
        }
        self.close_text(out);
        let long: &[String] = event.long_running_tool_ids.as_deref().unwrap_or(&[]);
        for call in calls {
            let call_id = call.id.clone().unwrap_or_default();
            if call.name == REQUEST_CONFIRMATION && self.approvals {
                let original = call
                    .args
                    .get("originalFunctionCall")
                    .and_then(|c| c.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                self.any_step(id, out);
                out.push(json!({"type": "tool-approval-request", "approvalId": call_id, "toolCallId": original}));
                continue;
            }
            let mut chunk = json!({
                "type": "tool-input-available",
                "toolCallId": call_id,
                "toolName": call.name,
                "input": call.args,
            });
            // The client answers calls listed as long-running (its own tools, confirmation
            // requests); `providerExecuted` tells it the server runs the rest.
            if !long.contains(&call_id) {
                chunk["providerExecuted"] = json!(true);
            }
            self.any_step(id, out);
            out.push(chunk);
        }
        for r in event.function_responses() {
            let call_id = r.id.clone().unwrap_or_default();
            let error = r.response.get("error").and_then(Value::as_str);
            if error == Some(CONFIRMATION_REQUIRED) {
                continue; // the approval request follows
            }
            self.any_step(id, out);
            if error == Some(CONFIRMATION_REJECTED) && self.approvals {
                out.push(json!({"type": "tool-output-denied", "toolCallId": call_id}));
            } else if let (Some(e), 1) = (error, r.response.len()) {
                out.push(json!({"type": "tool-output-error", "toolCallId": call_id, "errorText": e, "providerExecuted": true}));
            } else {
                out.push(json!({"type": "tool-output-available", "toolCallId": call_id, "output": r.response, "providerExecuted": true}));
            }
        }
        let mut delta = event.actions.state_delta.clone();
        crate::event::strip_temp_keys(&mut delta);
        if !delta.is_empty() {
            self.any_step(id, out);
            out.push(json!({"type": "data-state-delta", "id": id, "data": delta}));
        }
        for (filename, version) in &event.actions.artifact_delta {
            self.any_step(id, out);
            out.push(json!({"type": "data-artifact", "id": filename, "data": {"filename": filename, "version": version}}));
        }
        // A cancelled run's seal: the run ends with `abort`, not as a failure.
        let sealed = event.error_code.as_deref() == Some(crate::runner::INVOCATION_ABORTED);
        if !sealed && (event.error_code.is_some() || event.error_message.is_some()) {
            let code = event.error_code.as_deref().unwrap_or("error");
            let msg = event.error_message.as_deref().unwrap_or("");
            self.fail(format!("{code}: {msg}"), out);
        }
    }

    fn fail(&mut self, text: String, out: &mut Vec<Value>) {
        self.close_text(out);
        out.push(json!({"type": "error", "errorText": text}));
        self.errored = true;
    }

    fn done(&mut self, status: RunStatus, out: &mut Vec<Value>) {
        self.close_text(out);
        if self.step_open {
            out.push(json!({"type": "finish-step"}));
            self.step_open = false;
        }
        match status {
            RunStatus::Completed => {
                let u = self.usage;
                out.push(json!({"type": "finish", "messageMetadata": {"usage": {
                    "inputTokens": u.input, "outputTokens": u.output, "totalTokens": u.total(),
                    "reasoningTokens": u.reasoning, "cachedInputTokens": u.cached,
                }}}))
            }
            RunStatus::Cancelled => out.push(json!({"type": "abort"})),
            other => self.fail(format!("the run ended: {}", other.as_str()), out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Content, FunctionCall, FunctionResponse, JsonMap, Part};

    fn text_event(id: &str, text: &str, partial: bool) -> Event {
        let mut e = Event::new("inv", "agent").with_content(Content::text("model", text));
        e.id = id.into();
        if partial {
            e.partial = Some(true);
        }
        e
    }

    fn types(chunks: &[Value]) -> Vec<&str> {
        chunks.iter().filter_map(|c| c["type"].as_str()).collect()
    }

    fn run(stream: &mut UiStream, items: Vec<RunItem>) -> Vec<Value> {
        let mut out = vec![stream.start()];
        for i in &items {
            out.extend(stream.item(i));
        }
        out
    }

    fn ev(e: Event, seq: Option<i64>) -> RunItem {
        RunItem::Event {
            event: Box::new(e),
            seq,
        }
    }

    fn done(status: RunStatus) -> RunItem {
        RunItem::Done {
            status,
            last_seq: None,
        }
    }

    #[test]
    fn finish_carries_the_runs_token_counts() {
        let mut s = UiStream::new("msg_1".into(), true, true);
        let mut a = text_event("e1", "Hi", false);
        a.usage_metadata = Some(json!({"promptTokenCount": 10, "candidatesTokenCount": 5,
                                       "totalTokenCount": 15}));
        let mut b = text_event("e2", "there", false);
        b.usage_metadata = Some(json!({"promptTokenCount": 20, "candidatesTokenCount": 4,
                                       "thoughtsTokenCount": 3, "cachedContentTokenCount": 8,
                                       "totalTokenCount": 27}));
        let out = run(
            &mut s,
            vec![ev(a, Some(2)), ev(b, Some(3)), done(RunStatus::Completed)],
        );
        let finish = out.iter().find(|c| c["type"] == "finish").unwrap();
        assert_eq!(
            finish["messageMetadata"]["usage"],
            json!({"inputTokens": 30, "outputTokens": 12, "totalTokens": 42,
                   "reasoningTokens": 3, "cachedInputTokens": 8})
        );
    }

    #[test]
    fn streamed_text_is_sent_once_and_closed_by_the_complete_event() {
        let mut s = UiStream::new("msg_1".into(), true, true);
        let out = run(
            &mut s,
            vec![
                ev(text_event("e1", "Hel", true), None),
                ev(text_event("e1", "lo", true), None),
                ev(text_event("e1", "Hello!", false), Some(2)),
                done(RunStatus::Completed),
            ],
        );
        assert_eq!(
            types(&out),
            [
                "start",
                "start-step",
                "text-start",
                "text-delta",
                "text-delta",
                "text-delta",
                "text-end",
                "finish-step",
                "finish"
            ]
        );
        assert_eq!(out[0]["messageId"], "msg_1");
        assert_eq!(out[5]["delta"], "!");
        assert!(out
            .iter()
            .filter(|c| c["type"] != "start")
            .all(|c| c.get("id").is_none_or(|i| i == "e1")));
    }

    #[test]
    fn a_replay_sends_each_event_whole_and_ignores_partials() {
        let mut s = UiStream::new("msg_1".into(), true, false);
        let out = run(
            &mut s,
            vec![
                ev(text_event("e1", "Hel", true), None),
                ev(text_event("e1", "Hello", false), Some(2)),
                done(RunStatus::Completed),
            ],
        );
        assert_eq!(
            types(&out),
            [
                "start",
                "start-step",
                "text-start",
                "text-delta",
                "text-end",
                "finish-step",
                "finish"
            ]
        );
        assert_eq!(out[3]["delta"], "Hello");
    }

    #[test]
    fn server_tools_are_provider_executed_and_client_tools_are_not() {
        let mut s = UiStream::new("m".into(), true, true);
        let mut call = Event::new("inv", "agent");
        call.id = "e1".into();
        call.content = Some(Content {
            parts: vec![
                Part {
                    function_call: Some(FunctionCall {
                        id: Some("c1".into()),
                        name: "weather".into(),
                        args: JsonMap::new(),
                        extra: JsonMap::new(),
                    }),
                    ..Default::default()
                },
                Part {
                    function_call: Some(FunctionCall {
                        id: Some("c2".into()),
                        name: "ask_user".into(),
                        args: JsonMap::new(),
                        extra: JsonMap::new(),
                    }),
                    ..Default::default()
                },
            ],
            role: Some("model".into()),
            extra: JsonMap::new(),
        });
        call.long_running_tool_ids = Some(vec!["c2".into()]);
        let mut resp = Event::new("inv", "agent");
        resp.id = "e2".into();
        resp.content = Some(Content {
            parts: vec![Part {
                function_response: Some(FunctionResponse {
                    id: Some("c1".into()),
                    name: "weather".into(),
                    response: crate::http::frontend::kit::response_object(json!({"t": 21})),
                    extra: JsonMap::new(),
                }),
                ..Default::default()
            }],
            role: Some("user".into()),
            extra: JsonMap::new(),
        });
        let out = run(
            &mut s,
            vec![
                ev(call, Some(2)),
                ev(resp, Some(3)),
                done(RunStatus::Completed),
            ],
        );
        assert_eq!(
            types(&out),
            [
                "start",
                "start-step",
                "tool-input-available",
                "tool-input-available",
                "tool-output-available",
                "finish-step",
                "finish"
            ]
        );
        assert_eq!(out[2]["providerExecuted"], true);
        assert!(out[3].get("providerExecuted").is_none());
        assert_eq!(out[4]["output"], json!({"t": 21}));
    }

    #[test]
    fn errors_and_cancels_end_the_message_as_the_client_expects() {
        let mut s = UiStream::new("m".into(), true, true);
        let out = run(
            &mut s,
            vec![
                ev(text_event("e1", "Hi", true), None),
                RunItem::Error {
                    kind: "ModelError".into(),
                    message: "boom".into(),
                },
                done(RunStatus::Failed),
            ],
        );
        assert_eq!(
            types(&out),
            [
                "start",
                "start-step",
                "text-start",
                "text-delta",
                "text-end",
                "error"
            ]
        );
        let mut s = UiStream::new("m".into(), true, true);
        let out = run(
            &mut s,
            vec![
                ev(text_event("e1", "Hi", true), None),
                done(RunStatus::Cancelled),
            ],
        );
        assert_eq!(
            types(&out),
            [
                "start",
                "start-step",
                "text-start",
                "text-delta",
                "text-end",
                "finish-step",
                "abort"
            ]
        );
    }
}
