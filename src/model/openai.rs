//! OpenAI-compatible Chat Completions (`POST {base}/chat/completions`, `stream: true`):
//! OpenAI, Azure-style proxies, Ollama, vLLM, llama.cpp server, LiteLLM, OpenRouter, Groq.
//!
//! Mapping: the system instruction becomes a `system` message; a model turn becomes an
//! `assistant` message with `tool_calls`; each function response becomes a `tool` message
//! right after it; inline images become `image_url` data URLs. Stream chunks carry text in
//! `delta.content`, reasoning in `delta.reasoning_content` (DeepSeek, vLLM, Ollama),
//! tool calls as `delta.tool_calls[{index, id?, function:{name?, arguments}}]` pieces, and
//! usage in a last chunk (`stream_options.include_usage`).

use super::http;
use super::{json_text, Delta, DeltaStream, Endpoint, LlmRequest, Model, ModelError, Usage};
use crate::event::Content;
use async_trait::async_trait;
use base64::Engine;
use serde_json::{json, Value};

pub struct OpenAiModel {
    name: String,
    endpoint: Endpoint,
}

impl OpenAiModel {
    pub fn new(name: impl Into<String>, endpoint: Endpoint) -> Self {
        OpenAiModel {
            name: name.into(),
            endpoint,
        }
    }
}

const PROVIDER: &str = "the OpenAI-compatible model server";

/// The Chat Completions request body for `req`.
pub fn request_body(model: &str, req: &LlmRequest) -> Value {
    let mut messages = vec![];
    if let Some(sys) = req.system_instruction.as_deref().filter(|s| !s.is_empty()) {
        messages.push(json!({"role": "system", "content": sys}));
    }
    for content in &req.contents {
        push_messages(&mut messages, content);
    }
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let obj = body.as_object_mut().expect("body is an object");
    // Prompt caching (an app's `context_cache:`): OpenAI caches long prompt prefixes by
    // itself; the key keeps one session's requests on one cache.
    if let Some(hint) = &req.cache {
        obj.insert("prompt_cache_key".into(), hint.key.clone().into());
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                }})
            })
            .collect();
        obj.insert("tools".into(), tools.into());
    }
    let c = &req.config;
    if let Some(t) = c.temperature {
        obj.insert("temperature".into(), t.into());
    }
    if let Some(p) = c.top_p {
        obj.insert("top_p".into(), p.into());
    }
    if let Some(m) = c.max_output_tokens {
        obj.insert("max_tokens".into(), m.into());
    }
    if !c.stop_sequences.is_empty() {
        obj.insert("stop".into(), c.stop_sequences.clone().into());
    }
    if let Some(s) = c.seed {
        obj.insert("seed".into(), s.into());
    }
    body
}

fn push_messages(messages: &mut Vec<Value>, content: &Content) {
    let role = content.role.as_deref().unwrap_or("user");
    if role == "model" {
        let text: String = content
            .parts
            .iter()
            .filter(|p| p.thought != Some(true))
            .filter_map(|p| p.text.as_deref())
            .collect();
        let calls: Vec<Value> = content
            .parts
            .iter()
            .filter_map(|p| p.function_call.as_ref())
            .map(|c| {
                json!({"id": c.id.clone().unwrap_or_default(), "type": "function",
                       "function": {"name": c.name, "arguments": json_text(&c.args)}})
            })
            .collect();
        let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { text.into() }});
        if !calls.is_empty() {
            msg["tool_calls"] = calls.into();
        }
        messages.push(msg);
        return;
    }
    // A user turn: function responses become tool messages, the rest one user message.
    let mut parts: Vec<Value> = vec![];
    for p in &content.parts {
        if let Some(r) = &p.function_response {
            messages.push(
                json!({"role": "tool", "tool_call_id": r.id.clone().unwrap_or_default(),
                                 "content": json_text(&r.response)}),
            );
        } else if let Some(t) = &p.text {
            parts.push(json!({"type": "text", "text": t}));
        } else if let Some(blob) = &p.inline_data {
            let mime = blob
                .mime_type
                .as_deref()
                .unwrap_or("application/octet-stream");
            if mime.starts_with("image/") {
                let data = base64::engine::general_purpose::STANDARD.encode(&blob.data.0);
                parts.push(json!({"type": "image_url", "image_url": {"url": format!("data:{mime};base64,{data}")}}));
            } else if mime.starts_with("text/") {
                parts.push(json!({"type": "text", "text": String::from_utf8_lossy(&blob.data.0)}));
            }
        }
    }
    if parts.is_empty() {
        return;
    }
    // Plain text as a string: the widest-supported form among compatible servers.
    let all_text = parts.iter().all(|p| p["type"] == "text");
    let content = if all_text {
        Value::String(
            parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        )
    } else {
        Value::Array(parts)
    };
    messages.push(json!({"role": "user", "content": content}));
}

/// Maps OpenAI's `finish_reason` to ADK's `finishReason`.
pub fn finish_reason(reason: &str) -> String {
    match reason {
        "stop" | "tool_calls" | "function_call" => "STOP",
        "length" => "MAX_TOKENS",
        "content_filter" => "SAFETY",
        _ => "OTHER",
    }
    .to_string()
}

/// The deltas of one `data:` chunk.
pub fn chunk_deltas(chunk: &Value) -> Result<Vec<Delta>, ModelError> {
    if let Some(err) = chunk.get("error") {
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string());
        return Err(ModelError::new(
            "MODEL_ERROR",
            format!("{PROVIDER} reported an error mid-stream: {msg}"),
        ));
    }
    let mut out = vec![];
    if let Some(m) = chunk.get("model").and_then(Value::as_str) {
        out.push(Delta::ModelVersion(m.to_string()));
    }
    if let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) {
        let delta = &choice["delta"];
        for key in ["reasoning_content", "reasoning"] {
            if let Some(t) = delta.get(key).and_then(Value::as_str) {
                out.push(Delta::Thought(t.to_string()));
            }
        }
        if let Some(t) = delta.get("content").and_then(Value::as_str) {
            out.push(Delta::Text(t.to_string()));
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (pos, c) in calls.iter().enumerate() {
                let f = &c["function"];
                out.push(Delta::ToolCallChunk {
                    index: c
                        .get("index")
                        .and_then(Value::as_u64)
                        .map_or(pos, |i| i as usize),
                    id: c.get("id").and_then(Value::as_str).map(str::to_string),
                    name: f.get("name").and_then(Value::as_str).map(str::to_string),
                    arguments: match f.get("arguments") {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Null) | None => String::new(),
                        Some(other) => other.to_string(),
                    },
                });
            }
        }
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            out.push(Delta::Finish(finish_reason(r)));
        }
    }
    if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        let thoughts = u
            .get("completion_tokens_details")
            .and_then(|d| d.get("reasoning_tokens"))
            .and_then(Value::as_u64)
            .filter(|t| *t > 0);
        out.push(Delta::Usage(Usage {
            prompt_tokens: n("prompt_tokens"),
            candidates_tokens: n("completion_tokens"),
            total_tokens: n("total_tokens"),
            thoughts_tokens: thoughts,
            cached_tokens: u
                .get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64),
        }));
    }
    Ok(out)
}

#[async_trait]
impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider(&self) -> &'static str {
        "openai"
    }

    fn missing_key(&self) -> Option<&str> {
        self.endpoint
            .keyless_default
            .then_some(self.endpoint.key_env.as_str())
    }

    async fn stream(&self, req: &LlmRequest) -> Result<DeltaStream, ModelError> {
        let body = request_body(&self.name, req);
        let url = format!("{}/chat/completions", self.endpoint.base_url);
        // Ended by `data: [DONE]`; a body that ends after a `finish_reason` without it is
        // accepted too (some compatible servers omit it).
        let decoder = http::ChunkDecoder {
            chunk: chunk_deltas,
            expected_end: "a finish_reason or [DONE]",
            end_marker: Some("[DONE]"),
            finished: false,
        };
        http::post_stream(
            PROVIDER,
            &self.endpoint,
            &url,
            &body,
            http::Auth::Bearer,
            &[],
            decoder,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{FunctionCall, FunctionResponse, Part};
    use crate::model::{Aggregator, ToolDeclaration};

    #[test]
    fn history_maps_to_chat_messages() {
        let call = Part {
            function_call: Some(FunctionCall {
                id: Some("c1".into()),
                name: "get_weather".into(),
                args: serde_json::from_value(json!({"city": "Paris"})).unwrap(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let resp = Part {
            function_response: Some(FunctionResponse {
                id: Some("c1".into()),
                name: "get_weather".into(),
                response: serde_json::from_value(json!({"t": 21})).unwrap(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let req = LlmRequest {
            model: "m".into(),
            system_instruction: Some("be brief".into()),
            contents: vec![
                Content::text("user", "weather?"),
                Content {
                    parts: vec![call],
                    role: Some("model".into()),
                    ..Default::default()
                },
                Content {
                    parts: vec![resp],
                    role: Some("user".into()),
                    ..Default::default()
                },
            ],
            tools: vec![ToolDeclaration {
                name: "get_weather".into(),
                description: "d".into(),
                parameters: None,
            }],
            config: Default::default(),
            cache: None,
        };
        let body = request_body("m", &req);
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs[0]["role"], "system");
        assert_eq!(msgs[1]["content"], "weather?");
        assert_eq!(
            msgs[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(msgs[3]["role"], "tool");
        assert_eq!(msgs[3]["tool_call_id"], "c1");
        assert_eq!(body["tools"][0]["function"]["name"], "get_weather");
        assert!(
            body.get("prompt_cache_key").is_none(),
            "no caching unless asked"
        );
        let cached = LlmRequest {
            cache: Some(crate::model::CacheHint {
                key: "agentd-k".into(),
                ttl_seconds: 300,
            }),
            ..req
        };
        assert_eq!(request_body("m", &cached)["prompt_cache_key"], "agentd-k");
    }

    #[test]
    fn chunks_aggregate() {
        let chunks = [
            json!({"model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}),
            json!({"model":"gpt-x","choices":[{"index":0,"delta":{"content":"lo"}}]}),
            json!({"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_9","type":"function","function":{"name":"f","arguments":"{\"a\""}}]}}]}),
            json!({"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}),
            json!({"model":"gpt-x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            json!({"model":"gpt-x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}),
        ];
        let mut agg = Aggregator::default();
        for c in &chunks {
            for d in chunk_deltas(c).unwrap() {
                agg.push(d);
            }
        }
        let r = agg.finish();
        let content = r.content.clone().unwrap();
        assert_eq!(content.parts[0].text.as_deref(), Some("Hello"));
        let call = r.function_calls().next().unwrap();
        assert_eq!(call.args["a"], 1);
        assert_eq!(r.finish_reason.as_deref(), Some("STOP"));
        assert_eq!(r.usage.unwrap().total_tokens, 7);
        assert_eq!(r.model_version.as_deref(), Some("gpt-x"));
        assert!(chunk_deltas(&json!({"error":{"message":"boom"}})).is_err());
    }
}
