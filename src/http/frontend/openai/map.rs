//! OpenAI Chat Completions chunks and Responses events, as pure mappings from a run's items.
//!
//! Both carry the agent's text and the calls the client must answer (its own `tools`,
//! confirmation requests); tool calls the agent runs on the server, state and artifacts have
//! no slot and are left out. Ids derive from the run and event ids.
//!
//! Responses: every event has a `sequence_number`, counted from 0 per response. A mapping
//! that ignores partial events (what a background response streams, see `openai.rs`) is a
//! function of the run's stored events alone, so any replica reproduces the same events with
//! the same numbers when a client resumes with `starting_after`.

use crate::event::Event;
use crate::http::frontend::kit::{answer_text, Streamed};
use crate::store::RunStatus;
use crate::transcript::RunItem;
use crate::usage::Tokens;
use serde_json::{json, Value};

/// Token counts summed over the run's model responses.
#[derive(Debug, Default, Clone, Copy)]
pub struct Usage(pub Tokens);

impl Usage {
    fn add(&mut self, event: &Event) {
        if let Some(u) = &event.usage_metadata {
            self.0.add(Tokens::of_metadata(u));
        }
    }
}

/// The run's client-resolved calls in `event`: listed as long-running.
fn client_calls(event: &Event) -> Vec<(String, String, String)> {
    let long: &[String] = event.long_running_tool_ids.as_deref().unwrap_or(&[]);
    event
        .function_calls()
        .filter_map(|c| {
            let id = c.id.clone()?;
            long.contains(&id).then(|| {
                (
                    id,
                    c.name.clone(),
                    Value::Object(c.args.clone()).to_string(),
                )
            })
        })
        .collect()
}

fn finish_reason(event: &Event) -> Option<&'static str> {
    match event.finish_reason.as_deref() {
        Some("MAX_TOKENS") => Some("length"),
        Some("SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII") => {
            Some("content_filter")
        }
        _ => None,
    }
}

fn error_of(event: &Event) -> Option<(String, String)> {
    (event.error_code.is_some() || event.error_message.is_some()).then(|| {
        (
            event.error_code.clone().unwrap_or_else(|| "error".into()),
            event.error_message.clone().unwrap_or_default(),
        )
    })
}

// ------------------------------------------------------------------ Chat Completions

/// `chat.completion.chunk`s of one run.
#[derive(Debug)]
pub struct ChatStream {
    id: String,
    created: i64,
    model: String,
    text: Streamed,
    /// The event whose partial text is being streamed.
    streaming: Option<String>,
    tool_calls: usize,
    finish: Option<&'static str>,
    usage: Usage,
    error: Option<(String, String)>,
}

impl ChatStream {
    pub fn new(id: String, created: i64, model: String) -> Self {
        ChatStream {
            id,
            created,
            model,
            text: Streamed::default(),
            streaming: None,
            tool_calls: 0,
            finish: None,
            usage: Usage::default(),
            error: None,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
        })
    }

    pub fn start(&self) -> Value {
        self.chunk(json!({"role": "assistant", "content": ""}), None)
    }

    /// The chunks for one item; `Done` is handled by [`Self::end`].
    pub fn item(&mut self, item: &RunItem) -> Vec<Value> {
        let mut out = vec![];
        if self.error.is_some() {
            return out;
        }
        match item {
            RunItem::Event { event, seq } if event.author != "user" => {
                let text = answer_text(event);
                if seq.is_none() {
                    // One response streams at a time (agents in parallel): the others are sent
                    // whole when committed, so texts never mix.
                    let other = self.streaming.as_ref().is_some_and(|id| *id != event.id);
                    if !text.is_empty() && !other {
                        self.streaming = Some(event.id.clone());
                        self.text.partial(&event.id, &text);
                        out.push(self.chunk(json!({"content": text}), None));
                    }
                    return out;
                }
                if self.streaming.as_deref() == Some(event.id.as_str()) {
                    self.streaming = None;
                }
                let rest = self.text.rest(&event.id, &text);
                if !rest.is_empty() {
                    out.push(self.chunk(json!({"content": rest}), None));
                }
                for (id, name, args) in client_calls(event) {
                    let index = self.tool_calls;
                    self.tool_calls += 1;
                    out.push(self.chunk(
                        json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                                               "function": {"name": name, "arguments": ""}}]}),
                        None,
                    ));
                    out.push(self.chunk(
                        json!({"tool_calls": [{"index": index, "function": {"arguments": args}}]}),
                        None,
                    ));
                }
                self.usage.add(event);
                if let Some(f) = finish_reason(event) {
                    self.finish = Some(f);
                }
                self.error = error_of(event);
            }
            RunItem::Error { kind, message } => self.error = Some((kind.clone(), message.clone())),
            _ => {}
        }
        out
    }

    /// The error that ended the run, as the body OpenAI clients raise on.
    pub fn error(&self) -> Option<Value> {
        self.error.as_ref().map(|(code, message)| {
            json!({"error": {"message": format!("{code}: {message}"), "type": "server_error", "code": code}})
        })
    }

    pub fn finish_reason(&self) -> &'static str {
        if self.tool_calls > 0 {
            "tool_calls"
        } else {
            self.finish.unwrap_or("stop")
        }
    }

    pub fn usage(&self) -> Value {
        let t = self.usage.0;
        json!({"prompt_tokens": t.input, "completion_tokens": t.output,
               "total_tokens": t.total(),
               "prompt_tokens_details": {"cached_tokens": t.cached},
               "completion_tokens_details": {"reasoning_tokens": t.reasoning}})
    }

    /// The closing chunks of a run that ended with `status`: the error, or the finish reason
    /// (and the usage chunk when asked for).
    pub fn end(&mut self, status: RunStatus, include_usage: bool) -> Vec<Value> {
        if self.error.is_none() && !matches!(status, RunStatus::Completed) {
            self.error = Some((
                status.as_str().into(),
                format!("the run ended: {}", status.as_str()),
            ));
        }
        if let Some(e) = self.error() {
            return vec![e];
        }
        let mut out = vec![self.chunk(json!({}), Some(self.finish_reason()))];
        if include_usage {
            let mut u = self.chunk(json!({}), None);
            u["choices"] = json!([]);
            u["usage"] = self.usage();
            out.push(u);
        }
        out
    }
}

/// A whole `chat.completion` from the chunks of a run.
pub fn chat_completion(stream: &ChatStream, chunks: &[Value]) -> Value {
    let mut content = String::new();
    let mut calls: Vec<Value> = vec![];
    for c in chunks {
        let delta = &c["choices"][0]["delta"];
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap_or(0) as usize;
            if i == calls.len() {
                calls.push(json!({"id": tc["id"], "type": "function",
                                  "function": {"name": tc["function"]["name"], "arguments": ""}}));
            } else if let Some(args) = tc["function"]["arguments"].as_str() {
                calls[i]["function"]["arguments"] = json!(args);
            }
        }
    }
    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    json!({
        "id": stream.id, "object": "chat.completion", "created": stream.created,
        "model": stream.model,
        "choices": [{"index": 0, "message": message, "finish_reason": stream.finish_reason(), "logprobs": null}],
        "usage": stream.usage(),
    })
}

// ------------------------------------------------------------------ Responses

/// What a `Response` object says about itself besides its output.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created_at: i64,
    pub model: String,
    pub background: Option<bool>,
    pub previous_response_id: Option<String>,
}

/// The Responses events of one run.
#[derive(Debug)]
pub struct ResponsesStream {
    meta: ResponseMeta,
    partials: bool,
    seq: u64,
    output: Vec<Value>,
    /// The message item being written: (event id, output index, text so far).
    open: Option<(String, usize, String)>,
    text: Streamed,
    usage: Usage,
    incomplete: Option<&'static str>,
    error: Option<(String, String)>,
}

/// A Responses status for a run status.
pub fn response_status(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Running => "in_progress",
        RunStatus::Completed => "completed",
        RunStatus::Cancelled => "cancelled",
        _ => "failed",
    }
}

impl ResponsesStream {
    pub fn new(meta: ResponseMeta, partials: bool) -> Self {
        ResponsesStream {
            meta,
            partials,
            seq: 0,
            output: vec![],
            open: None,
            text: Streamed::default(),
            usage: Usage::default(),
            incomplete: None,
            error: None,
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Value {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        body
    }

    /// The `Response` object as of now, with `status`.
    pub fn response(&self, status: &str) -> Value {
        let mut output = self.output.clone();
        if let Some((id, _, text)) = &self.open {
            output.push(message_item(id, text, "in_progress"));
        }
        let output_text: String = output
            .iter()
            .filter(|i| i["type"] == "message")
            .filter_map(|i| i["content"][0]["text"].as_str())
            .collect();
        let status = match (status, self.incomplete) {
            ("completed", Some(_)) => "incomplete",
            (s, _) => s,
        };
        json!({
            "id": self.meta.id, "object": "response", "created_at": self.meta.created_at,
            "status": status, "model": self.meta.model, "output": output,
            "output_text": output_text,
            "error": match (&self.error, status) {
                (Some((code, message)), "failed") => json!({"code": "server_error", "message": format!("{code}: {message}")}),
                (None, "failed") => json!({"code": "server_error", "message": "the run failed"}),
                _ => Value::Null,
            },
            "incomplete_details": self.incomplete.filter(|_| status == "incomplete").map(|r| json!({"reason": r})),
            "instructions": null, "tools": [], "tool_choice": "auto", "parallel_tool_calls": true,
            "metadata": {}, "temperature": null, "top_p": null,
            "background": self.meta.background,
            "previous_response_id": self.meta.previous_response_id,
            "usage": if status == "in_progress" || status == "queued" { Value::Null } else {
                json!({"input_tokens": self.usage.0.input,
                       "input_tokens_details": {"cached_tokens": self.usage.0.cached},
                       "output_tokens": self.usage.0.output,
                       "output_tokens_details": {"reasoning_tokens": self.usage.0.reasoning},
                       "total_tokens": self.usage.0.total()})
            },
        })
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<Value> {
        let r = self.response("in_progress");
        vec![
            self.event("response.created", json!({"response": r})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    fn open_message(&mut self, event_id: &str, out: &mut Vec<Value>) {
        if self.open.as_ref().is_some_and(|(id, ..)| id == event_id) {
            return;
        }
        self.close_message(out);
        let index = self.output.len();
        let item_id = format!("msg_{event_id}");
        let item = message_item(event_id, "", "in_progress");
        let mut item_empty = item.clone();
        item_empty["content"] = json!([]);
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item_empty}),
        ));
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
        ));
        self.open = Some((event_id.to_string(), index, String::new()));
    }

    fn delta(&mut self, delta: &str, out: &mut Vec<Value>) {
        if delta.is_empty() {
            return;
        }
        let Some((id, index, text)) = self.open.as_mut() else {
            return;
        };
        text.push_str(delta);
        let (item_id, index) = (format!("msg_{id}"), *index);
        out.push(self.event(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
        ));
    }

    fn close_message(&mut self, out: &mut Vec<Value>) {
        let Some((id, index, text)) = self.open.take() else {
            return;
        };
        let item_id = format!("msg_{id}");
        out.push(self.event(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": text, "annotations": [], "logprobs": []}}),
        ));
        let item = message_item(&id, &text, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
    }

    /// The events for one item; `Done` is handled by [`Self::end`].
    pub fn item(&mut self, item: &RunItem) -> Vec<Value> {
        let mut out = vec![];
        if self.error.is_some() {
            return out;
        }
        match item {
            RunItem::Event { event, seq } if event.author != "user" => {
                let text = answer_text(event);
                if seq.is_none() {
                    // Another message is streaming (agents in parallel): this one is sent
                    // whole when it is committed.
                    let other = self.open.as_ref().is_some_and(|(id, ..)| *id != event.id);
                    if self.partials && !text.is_empty() && !other {
                        self.open_message(&event.id, &mut out);
                        self.text.partial(&event.id, &text);
                        self.delta(&text, &mut out);
                    }
                    return out;
                }
                let rest = self.text.rest(&event.id, &text);
                if !rest.is_empty() {
                    self.open_message(&event.id, &mut out);
                    self.delta(&rest, &mut out);
                }
                self.close_message(&mut out);
                for (call_id, name, args) in client_calls(event) {
                    let index = self.output.len();
                    let item_id = format!("fc_{call_id}");
                    let mut item = json!({"id": item_id, "type": "function_call", "call_id": call_id,
                                          "name": name, "arguments": "", "status": "in_progress"});
                    out.push(self.event(
                        "response.output_item.added",
                        json!({"output_index": index, "item": item}),
                    ));
                    out.push(self.event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": item_id, "output_index": index, "delta": args}),
                    ));
                    out.push(self.event(
                        "response.function_call_arguments.done",
                        json!({"item_id": item_id, "output_index": index, "name": name, "arguments": args}),
                    ));
                    item["arguments"] = json!(args);
                    item["status"] = json!("completed");
                    out.push(self.event(
                        "response.output_item.done",
                        json!({"output_index": index, "item": item}),
                    ));
                    self.output.push(item);
                }
                self.usage.add(event);
                if let Some(f) = finish_reason(event) {
                    self.incomplete = Some(if f == "length" {
                        "max_output_tokens"
                    } else {
                        "content_filter"
                    });
                }
                self.error = error_of(event);
            }
            RunItem::Error { kind, message } => self.error = Some((kind.clone(), message.clone())),
            _ => {}
        }
        out
    }

    /// The terminal event of a run that ended with `status`.
    pub fn end(&mut self, status: RunStatus) -> Vec<Value> {
        let mut out = vec![];
        self.close_message(&mut out);
        let status = match status {
            // A cancelled run's transcript ends with the seal's error event: still a cancel.
            RunStatus::Cancelled => "cancelled",
            _ if self.error.is_some() => "failed",
            other => response_status(other),
        };
        let r = self.response(status);
        let kind = match r["status"].as_str() {
            Some("completed") => "response.completed",
            Some("incomplete") => "response.incomplete",
            // No event of the API names a cancel; the response it carries says `cancelled`.
            _ => "response.failed",
        };
        out.push(self.event(kind, json!({"response": r})));
        out
    }
}

fn message_item(event_id: &str, text: &str, status: &str) -> Value {
    json!({"id": format!("msg_{event_id}"), "type": "message", "role": "assistant", "status": status,
           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Content;

    fn text_event(id: &str, text: &str, partial: bool) -> Event {
        let mut e = Event::new("inv", "agent").with_content(Content::text("model", text));
        e.id = id.into();
        if partial {
            e.partial = Some(true);
        }
        e
    }

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "resp_1".into(),
            created_at: 1,
            model: "app".into(),
            background: Some(true),
            previous_response_id: None,
        }
    }

    #[test]
    fn a_replay_of_stored_events_numbers_the_events_exactly_as_the_live_stream_did() {
        let items = vec![
            RunItem::Event {
                event: Box::new(text_event("e1", "Hello", false)),
                seq: Some(2),
            },
            RunItem::Event {
                event: Box::new(text_event("e2", "again", false)),
                seq: Some(3),
            },
        ];
        let render = || {
            let mut s = ResponsesStream::new(meta(), false);
            let mut out = s.start();
            for i in &items {
                out.extend(s.item(i));
            }
            out.extend(s.end(RunStatus::Completed));
            out
        };
        let (a, b) = (render(), render());
        assert_eq!(a, b);
        let seqs: Vec<u64> = a
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (0..a.len() as u64).collect::<Vec<_>>());
        let last = a.last().unwrap();
        assert_eq!(last["type"], "response.completed");
        assert_eq!(last["response"]["output_text"], "Helloagain");
    }

    #[test]
    fn chat_chunks_stream_partials_and_add_only_the_missing_suffix() {
        let mut s = ChatStream::new("chatcmpl-1".into(), 1, "app".into());
        let mut chunks = vec![s.start()];
        chunks.extend(s.item(&RunItem::Event {
            event: Box::new(text_event("e1", "Hel", true)),
            seq: None,
        }));
        chunks.extend(s.item(&RunItem::Event {
            event: Box::new(text_event("e1", "Hello", false)),
            seq: Some(2),
        }));
        chunks.extend(s.end(RunStatus::Completed, true));
        let whole = chat_completion(&s, &chunks);
        assert_eq!(whole["choices"][0]["message"]["content"], "Hello");
        assert_eq!(
            chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
            "stop"
        );
        assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    }
}
