//! Anthropic Messages (`POST {base}/messages`, `stream: true`).
//!
//! Mapping: the system instruction becomes `system`; `model` turns become `assistant`
//! messages (text and `tool_use` blocks), everything else `user` messages (text, base64
//! `image` / `document` blocks, `tool_result` blocks). A function call always goes in an
//! assistant message and a function response in a user message, whatever the role of the
//! turn that carried it, and consecutive messages of one role are merged, since Anthropic
//! requires the roles to alternate; in a user message `tool_result` blocks come first, as
//! Anthropic requires. Thought parts are not sent back (without their signatures Anthropic
//! would reject them). `max_tokens` is required by the API: the config's or 4096. `seed`
//! has no Anthropic equivalent and is dropped.
//!
//! The stream is typed SSE (`event:` names): `message_start` (model, input tokens),
//! `content_block_start` / `_delta` / `_stop` (text, `tool_use` with `input_json_delta`
//! pieces, `thinking`), `message_delta` (stop reason, output tokens), `message_stop`,
//! `ping`, and `error` events mid-stream. Unknown events are ignored, as Anthropic asks.
//!
//! One cohesive thing, past 600 lines: request mapping and stream parsing of one wire format,
//! then their unit tests.

use super::http;
use super::{json_text, Delta, DeltaStream, Endpoint, LlmRequest, Model, ModelError, Usage};
use crate::event::Part;
use async_trait::async_trait;
use base64::Engine;
use serde_json::{json, Value};
use std::collections::BTreeSet;

pub struct AnthropicModel {
    name: String,
    endpoint: Endpoint,
}

impl AnthropicModel {
    pub fn new(name: impl Into<String>, endpoint: Endpoint) -> Self {
        AnthropicModel {
            name: name.into(),
            endpoint,
        }
    }
}

const PROVIDER: &str = "the Anthropic API";

/// The `anthropic-version` header every request carries.
pub const API_VERSION: &str = "2023-06-01";

/// `max_tokens` when the config sets none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The Messages request body for `req`.
pub fn request_body(model: &str, req: &LlmRequest) -> Value {
    let c = &req.config;
    let mut body = json!({
        "model": model,
        "max_tokens": c.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": messages(req),
        "stream": true,
    });
    let obj = body.as_object_mut().expect("body is an object");
    if let Some(sys) = req.system_instruction.as_deref().filter(|s| !s.is_empty()) {
        obj.insert("system".into(), sys.into());
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut tool = json!({
                    "name": t.name,
                    "input_schema": t
                        .parameters
                        .clone()
                        .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                });
                if !t.description.is_empty() {
                    tool["description"] = t.description.clone().into();
                }
                tool
            })
            .collect();
        obj.insert("tools".into(), tools.into());
    }
    if let Some(t) = c.temperature {
        obj.insert("temperature".into(), t.into());
    }
    if let Some(p) = c.top_p {
        obj.insert("top_p".into(), p.into());
    }
    if !c.stop_sequences.is_empty() {
        obj.insert("stop_sequences".into(), c.stop_sequences.clone().into());
    }
    if let Some(hint) = &req.cache {
        mark_cache_breakpoints(obj, hint);
    }
    body
}

/// Prompt caching (an app's `context_cache:`): `cache_control` breakpoints after the system
/// prompt, after the tools and after the last message, so each turn reads the conversation so
/// far from the cache and writes only what is new (three of the four breakpoints the API
/// allows; <https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching>).
fn mark_cache_breakpoints(
    obj: &mut serde_json::Map<String, Value>,
    hint: &crate::model::CacheHint,
) {
    let mut control = json!({"type": "ephemeral"});
    if hint.ttl_seconds >= 3600 {
        control["ttl"] = "1h".into();
    }
    if let Some(Value::String(sys)) = obj.get("system").cloned() {
        obj.insert(
            "system".into(),
            json!([{"type": "text", "text": sys, "cache_control": control.clone()}]),
        );
    }
    if let Some(tool) = obj
        .get_mut("tools")
        .and_then(Value::as_array_mut)
        .and_then(|t| t.last_mut())
    {
        tool["cache_control"] = control.clone();
    }
    if let Some(block) = obj
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .and_then(|m| m.last_mut())
        .and_then(|m| m["content"].as_array_mut())
        .and_then(|c| c.last_mut())
    {
        block["cache_control"] = control;
    }
}

/// The conversation as alternating `user` / `assistant` messages.
fn messages(req: &LlmRequest) -> Vec<Value> {
    // (role, blocks), merged as they are pushed.
    let mut out: Vec<(&'static str, Vec<Value>)> = vec![];
    let mut push = |role: &'static str, block: Value| match out.last_mut() {
        Some((r, blocks)) if *r == role => blocks.push(block),
        _ => out.push((role, vec![block])),
    };
    for content in &req.contents {
        let turn_role = if content.role.as_deref() == Some("model") {
            "assistant"
        } else {
            "user"
        };
        for part in &content.parts {
            if let Some(block) = part_block(part) {
                let role = match block["type"].as_str() {
                    Some("tool_use") => "assistant",
                    Some("tool_result") => "user",
                    _ => turn_role,
                };
                push(role, block);
            }
        }
    }
    out.into_iter()
        .map(|(role, mut blocks)| {
            if role == "user" {
                // Tool results first (stable: other blocks keep their order).
                blocks.sort_by_key(|b| b["type"] != "tool_result");
            }
            json!({"role": role, "content": blocks})
        })
        .collect()
}

/// One content block for `part`, or `None` for parts Anthropic cannot take (thoughts,
/// empty text, binary data other than images and PDFs).
fn part_block(part: &Part) -> Option<Value> {
    if let Some(call) = &part.function_call {
        return Some(json!({
            "type": "tool_use",
            "id": tool_use_id(call.id.as_deref(), &call.name),
            "name": call.name,
            "input": call.args,
        }));
    }
    if let Some(resp) = &part.function_response {
        return Some(json!({
            "type": "tool_result",
            "tool_use_id": tool_use_id(resp.id.as_deref(), &resp.name),
            "content": json_text(&resp.response),
        }));
    }
    if part.thought == Some(true) {
        return None;
    }
    if let Some(text) = &part.text {
        return (!text.is_empty()).then(|| json!({"type": "text", "text": text}));
    }
    if let Some(blob) = &part.inline_data {
        let mime = blob
            .mime_type
            .as_deref()
            .unwrap_or("application/octet-stream");
        let data = || base64::engine::general_purpose::STANDARD.encode(&blob.data.0);
        if mime.starts_with("image/") {
            return Some(json!({"type": "image", "source": {
                "type": "base64", "media_type": mime, "data": data()}}));
        }
        if mime == "application/pdf" {
            return Some(json!({"type": "document", "source": {
                "type": "base64", "media_type": mime, "data": data()}}));
        }
        if mime.starts_with("text/") {
            let text = String::from_utf8_lossy(&blob.data.0);
            return (!text.is_empty()).then(|| json!({"type": "text", "text": text}));
        }
    }
    None
}

/// A `tool_use` id Anthropic accepts (`^[a-zA-Z0-9_-]+$`). Calls always have ids (the
/// aggregator assigns `adk-<uuid>`); a missing one is derived from the function name so a
/// call and its response still pair up.
fn tool_use_id(id: Option<&str>, name: &str) -> String {
    let raw = match id.filter(|s| !s.is_empty()) {
        Some(id) => id.to_string(),
        None => format!("adk-{name}"),
    };
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Maps Anthropic's `stop_reason` to ADK's `finishReason`.
pub fn finish_reason(reason: &str) -> String {
    match reason {
        "end_turn" | "tool_use" | "stop_sequence" | "pause_turn" => "STOP",
        "max_tokens" | "model_context_window_exceeded" => "MAX_TOKENS",
        "refusal" => "SAFETY",
        _ => "OTHER",
    }
    .to_string()
}

/// Maps the `type` of an `error` event (Anthropic's error types) to a [`ModelError`] code.
fn error_code(kind: &str) -> &'static str {
    match kind {
        "overloaded_error" | "api_error" => "MODEL_UNAVAILABLE",
        "rate_limit_error" => "RATE_LIMITED",
        "authentication_error" | "permission_error" => "UNAUTHENTICATED",
        "invalid_request_error" | "request_too_large" => "MODEL_BAD_REQUEST",
        "not_found_error" => "MODEL_NOT_FOUND",
        "timeout_error" => "MODEL_TIMEOUT",
        _ => "MODEL_ERROR",
    }
}

/// Turns the events of one streamed message into [`Delta`]s. It keeps the little state the
/// mapping needs: the prompt token counts from `message_start` (the final usage arrives in
/// `message_delta`) and which content blocks are client tool calls.
#[derive(Debug, Default)]
pub struct StreamState {
    input_tokens: u64,
    cache_tokens: u64,
    cache_read_tokens: u64,
    tool_blocks: BTreeSet<usize>,
    finished: bool,
}

impl StreamState {
    /// The deltas of one SSE event. `event` is the SSE `event:` name; when the server sent
    /// none (`message`), the `type` field of `data` names the event.
    pub fn on_event(&mut self, event: &str, data: &Value) -> Result<Vec<Delta>, ModelError> {
        let kind = match event {
            "" | "message" => data.get("type").and_then(Value::as_str).unwrap_or(""),
            e => e,
        };
        let mut out = vec![];
        match kind {
            "message_start" => {
                let msg = &data["message"];
                if let Some(m) = msg.get("model").and_then(Value::as_str) {
                    out.push(Delta::ModelVersion(m.to_string()));
                }
                self.take_input_usage(&msg["usage"]);
            }
            "content_block_start" => {
                let index = block_index(data)?;
                let block = &data["content_block"];
                match block["type"].as_str() {
                    Some("text") => {
                        if let Some(t) = block["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(Delta::Text(t.to_string()));
                        }
                    }
                    Some("thinking") => {
                        if let Some(t) = block["thinking"].as_str().filter(|t| !t.is_empty()) {
                            out.push(Delta::Thought(t.to_string()));
                        }
                    }
                    Some("tool_use") => {
                        self.tool_blocks.insert(index);
                        // `input` is `{}` here and streamed as `input_json_delta`s; a proxy
                        // that sends it whole is honoured.
                        let arguments = match block.get("input") {
                            Some(Value::Object(m)) if !m.is_empty() => json_text(m),
                            _ => String::new(),
                        };
                        out.push(Delta::ToolCallChunk {
                            index,
                            id: block["id"].as_str().map(str::to_string),
                            name: block["name"].as_str().map(str::to_string),
                            arguments,
                        });
                    }
                    // redacted_thinking, server_tool_use, web search results, …
                    _ => {}
                }
            }
            "content_block_delta" => {
                let index = block_index(data)?;
                let delta = &data["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        if let Some(t) = delta["text"].as_str() {
                            out.push(Delta::Text(t.to_string()));
                        }
                    }
                    Some("thinking_delta") => {
                        if let Some(t) = delta["thinking"].as_str() {
                            out.push(Delta::Thought(t.to_string()));
                        }
                    }
                    Some("input_json_delta") if self.tool_blocks.contains(&index) => {
                        out.push(Delta::ToolCallChunk {
                            index,
                            id: None,
                            name: None,
                            arguments: delta["partial_json"].as_str().unwrap_or("").to_string(),
                        });
                    }
                    // signature_delta, citations_delta, server tool input, …
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = data["delta"]["stop_reason"].as_str() {
                    self.finished = true;
                    out.push(Delta::Finish(finish_reason(r)));
                }
                let usage = &data["usage"];
                if usage.is_object() {
                    // Newer API versions repeat the (cumulative) input counts here.
                    if usage.get("input_tokens").is_some_and(Value::is_u64) {
                        self.take_input_usage(usage);
                    }
                    let output = usage["output_tokens"].as_u64().unwrap_or(0);
                    let prompt = self.input_tokens + self.cache_tokens;
                    out.push(Delta::Usage(Usage {
                        prompt_tokens: prompt,
                        candidates_tokens: output,
                        total_tokens: prompt + output,
                        thoughts_tokens: None,
                        cached_tokens: (self.cache_read_tokens > 0)
                            .then_some(self.cache_read_tokens),
                    }));
                }
            }
            "message_stop" => self.finished = true,
            "error" => {
                let err = &data["error"];
                let kind = err["type"].as_str().unwrap_or("error");
                let msg = err["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| data.to_string());
                let code = error_code(kind);
                return Err(ModelError {
                    code,
                    message: format!("{PROVIDER} reported an error mid-stream ({kind}): {msg}"),
                    retryable: matches!(code, "MODEL_UNAVAILABLE" | "RATE_LIMITED"),
                    retry_after: None,
                });
            }
            // ping, content_block_stop, and event types added later.
            _ => {}
        }
        Ok(out)
    }

    /// Whether the message ended (`message_stop`, or a stop reason): a body that ends
    /// before that was cut off.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn take_input_usage(&mut self, usage: &Value) {
        let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
        self.input_tokens = n("input_tokens");
        // Cached prompt tokens are billed apart but are part of the prompt.
        self.cache_tokens = n("cache_creation_input_tokens") + n("cache_read_input_tokens");
        // Only reads are cheaper; a cache write is billed as (more than) input.
        self.cache_read_tokens = n("cache_read_input_tokens");
    }
}

fn block_index(data: &Value) -> Result<usize, ModelError> {
    data.get("index")
        .and_then(Value::as_u64)
        .map(|i| i as usize)
        .ok_or_else(|| {
            ModelError::protocol(format!(
                "{PROVIDER} sent a content block event without an index: {data}"
            ))
        })
}

impl http::StreamDecoder for StreamState {
    fn decode(&mut self, event: &str, data: &Value) -> Result<Vec<Delta>, ModelError> {
        self.on_event(event, data)
    }

    fn finished(&self) -> bool {
        self.is_finished()
    }

    fn expected_end(&self) -> &'static str {
        "the message was complete"
    }
}

#[async_trait]
impl Model for AnthropicModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider(&self) -> &'static str {
        "anthropic"
    }

    fn missing_key(&self) -> Option<&str> {
        self.endpoint
            .keyless_default
            .then_some(self.endpoint.key_env.as_str())
    }

    async fn stream(&self, req: &LlmRequest) -> Result<DeltaStream, ModelError> {
        let body = request_body(&self.name, req);
        let url = format!("{}/messages", self.endpoint.base_url);
        http::post_stream(
            PROVIDER,
            &self.endpoint,
            &url,
            &body,
            http::Auth::Header("x-api-key"),
            &[("anthropic-version", API_VERSION)],
            StreamState::default(),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Blob, Bytes64, Content, FunctionCall, FunctionResponse};
    use crate::model::{GenerateConfig, ToolDeclaration};

    fn call(id: &str, name: &str, args: Value) -> Part {
        Part {
            function_call: Some(FunctionCall {
                id: Some(id.into()),
                name: name.into(),
                args: serde_json::from_value(args).unwrap(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn response(id: &str, name: &str, resp: Value) -> Part {
        Part {
            function_response: Some(FunctionResponse {
                id: Some(id.into()),
                name: name.into(),
                response: serde_json::from_value(resp).unwrap(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn roles_alternate_and_tool_results_lead_user_messages() {
        let req = LlmRequest {
            contents: vec![
                Content::text("user", "hi"),
                Content::text("user", "weather in Paris?"),
                Content {
                    parts: vec![
                        Part {
                            text: Some("thinking…".into()),
                            thought: Some(true),
                            ..Default::default()
                        },
                        Part::text("Let me check."),
                        call("c1", "get_weather", json!({"city": "Paris"})),
                    ],
                    role: Some("model".into()),
                    ..Default::default()
                },
                Content {
                    parts: vec![response("c1", "get_weather", json!({"t": 21}))],
                    role: Some("user".into()),
                    ..Default::default()
                },
                Content::text("user", "and tomorrow?"),
                Content {
                    parts: vec![Part {
                        inline_data: Some(Blob {
                            data: Bytes64(vec![1, 2, 3]),
                            mime_type: Some("image/png".into()),
                            display_name: None,
                        }),
                        ..Default::default()
                    }],
                    role: Some("user".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let body = request_body("claude-x", &req);
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3, "{body:#}");
        assert_eq!(msgs[0]["role"], "user");
        assert_eq!(msgs[0]["content"].as_array().unwrap().len(), 2);
        assert_eq!(msgs[1]["role"], "assistant");
        let blocks = msgs[1]["content"].as_array().unwrap();
        assert_eq!(blocks.len(), 2, "thoughts are dropped");
        assert_eq!(blocks[1]["type"], "tool_use");
        assert_eq!(blocks[1]["input"]["city"], "Paris");
        let user = msgs[2]["content"].as_array().unwrap();
        assert_eq!(user[0]["type"], "tool_result");
        assert_eq!(user[0]["tool_use_id"], "c1");
        assert_eq!(user[0]["content"], "{\"t\":21}");
        assert_eq!(user[1]["text"], "and tomorrow?");
        assert_eq!(user[2]["type"], "image");
        assert_eq!(user[2]["source"]["data"], "AQID");
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
        assert!(body.get("system").is_none());
    }

    #[test]
    fn prompt_caching_marks_system_tools_and_the_last_message() {
        let mut req = LlmRequest {
            system_instruction: Some("be brief".into()),
            contents: vec![
                Content::text("user", "hi"),
                Content::text("model", "hello"),
                Content::text("user", "weather?"),
            ],
            tools: vec![
                ToolDeclaration {
                    name: "a".into(),
                    description: String::new(),
                    parameters: None,
                },
                ToolDeclaration {
                    name: "b".into(),
                    description: String::new(),
                    parameters: None,
                },
            ],
            ..Default::default()
        };
        let plain = request_body("claude-x", &req);
        assert_eq!(plain["system"], "be brief");
        assert!(!plain.to_string().contains("cache_control"));
        req.cache = Some(crate::model::CacheHint {
            key: "k".into(),
            ttl_seconds: 3600,
        });
        let body = request_body("claude-x", &req);
        let control = json!({"type": "ephemeral", "ttl": "1h"});
        assert_eq!(
            body["system"],
            json!([{"type": "text", "text": "be brief", "cache_control": control}])
        );
        assert!(body["tools"][0].get("cache_control").is_none());
        assert_eq!(body["tools"][1]["cache_control"], control);
        let msgs = body["messages"].as_array().unwrap();
        assert!(msgs[0]["content"][0].get("cache_control").is_none());
        assert_eq!(msgs[2]["content"][0]["cache_control"], control);
        assert_eq!(
            body.to_string().matches("cache_control").count(),
            3,
            "at most 4 allowed"
        );
        req.cache = Some(crate::model::CacheHint {
            key: "k".into(),
            ttl_seconds: 300,
        });
        let short = request_body("claude-x", &req);
        assert_eq!(
            short["tools"][1]["cache_control"],
            json!({"type": "ephemeral"})
        );
    }

    #[test]
    fn tools_and_config_map() {
        let req = LlmRequest {
            system_instruction: Some("be brief".into()),
            contents: vec![Content::text("user", "x")],
            tools: vec![
                ToolDeclaration {
                    name: "noargs".into(),
                    description: "".into(),
                    parameters: None,
                },
                ToolDeclaration {
                    name: "f".into(),
                    description: "does f".into(),
                    parameters: Some(
                        json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
                    ),
                },
            ],
            config: GenerateConfig {
                temperature: Some(0.2),
                top_p: Some(0.9),
                max_output_tokens: Some(100),
                stop_sequences: vec!["END".into()],
                seed: Some(7),
            },
            ..Default::default()
        };
        let body = request_body("claude-x", &req);
        assert_eq!(body["system"], "be brief");
        assert_eq!(
            body["tools"][0]["input_schema"],
            json!({"type": "object", "properties": {}})
        );
        assert!(body["tools"][0].get("description").is_none());
        assert_eq!(body["tools"][1]["description"], "does f");
        assert_eq!(
            body["tools"][1]["input_schema"]["properties"]["a"]["type"],
            "integer"
        );
        assert_eq!(body["temperature"], 0.2);
        assert_eq!(body["top_p"], 0.9);
        assert_eq!(body["max_tokens"], 100);
        assert_eq!(body["stop_sequences"], json!(["END"]));
        assert!(body.get("seed").is_none());
        assert_eq!(body["stream"], true);
    }

    #[test]
    fn events_map_to_deltas() {
        let mut s = StreamState::default();
        let ds = s
            .on_event(
                "message_start",
                &json!({"type":"message_start","message":{"model":"claude-x","usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}),
            )
            .unwrap();
        assert_eq!(ds, vec![Delta::ModelVersion("claude-x".into())]);
        // Input JSON of a block that is not a client tool call is ignored.
        s.on_event("content_block_start", &json!({"index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}})).unwrap();
        assert!(s
            .on_event(
                "content_block_delta",
                &json!({"index":0,"delta":{"type":"input_json_delta","partial_json":"{\"q"}})
            )
            .unwrap()
            .is_empty());
        let ds = s
            .on_event(
                "message_delta",
                &json!({"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":7}}),
            )
            .unwrap();
        assert_eq!(
            ds,
            vec![
                Delta::Finish("MAX_TOKENS".into()),
                Delta::Usage(Usage {
                    prompt_tokens: 15,
                    candidates_tokens: 7,
                    total_tokens: 22,
                    thoughts_tokens: None,
                    cached_tokens: Some(5),
                })
            ]
        );
        assert!(s.is_finished());
        assert_eq!(finish_reason("refusal"), "SAFETY");
        assert_eq!(finish_reason("tool_use"), "STOP");
        // No `event:` name: the data's type decides.
        let err = s
            .on_event(
                "message",
                &json!({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}),
            )
            .unwrap_err();
        assert_eq!(err.code, "RATE_LIMITED");
        assert!(err.message.contains("slow down"));
        assert!(s
            .on_event("ping", &json!({"type":"ping"}))
            .unwrap()
            .is_empty());
        assert!(s
            .on_event("content_block_delta", &json!({"delta":{}}))
            .is_err());
    }
}
