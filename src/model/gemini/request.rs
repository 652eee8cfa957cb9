//! The `streamGenerateContent` request: ADK's contents, config and tools as Gemini takes them.

use super::schema::gemini_schema;
use super::SKIP_THOUGHT_SIGNATURE;
use crate::event::{Content, Part};
use crate::model::LlmRequest;
use base64::Engine;
use serde_json::{json, Map, Value};

/// The `streamGenerateContent` request body for `req` sent to `model`.
pub fn request_body(model: &str, req: &LlmRequest) -> Value {
    let sign_calls = needs_thought_signatures(model);
    let contents: Vec<Value> = req
        .contents
        .iter()
        .filter_map(|c| content_json(c, sign_calls))
        .collect();
    let mut body = json!({ "contents": contents });
    let obj = body.as_object_mut().expect("body is an object");
    if let Some(sys) = req.system_instruction.as_deref().filter(|s| !s.is_empty()) {
        obj.insert(
            "systemInstruction".into(),
            json!({"parts": [{"text": sys}]}),
        );
    }
    if !req.tools.is_empty() {
        let decls: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut d = json!({"name": t.name, "description": t.description});
                if let Some(p) = t.parameters.as_ref().and_then(parameters_schema) {
                    d["parameters"] = p;
                }
                d
            })
            .collect();
        obj.insert("tools".into(), json!([{ "functionDeclarations": decls }]));
    }
    let c = &req.config;
    let mut gc = Map::new();
    if let Some(t) = c.temperature {
        gc.insert("temperature".into(), t.into());
    }
    if let Some(p) = c.top_p {
        gc.insert("topP".into(), p.into());
    }
    if let Some(m) = c.max_output_tokens {
        gc.insert("maxOutputTokens".into(), m.into());
    }
    if !c.stop_sequences.is_empty() {
        gc.insert("stopSequences".into(), c.stop_sequences.clone().into());
    }
    if let Some(s) = c.seed {
        gc.insert("seed".into(), s.into());
    }
    if !gc.is_empty() {
        obj.insert("generationConfig".into(), Value::Object(gc));
    }
    body
}

/// Gemini 3 and later require a thought signature on function calls in history; 1.x and
/// 2.x models neither need nor expect one.
fn needs_thought_signatures(model: &str) -> bool {
    let m = model.trim_start_matches("models/");
    !(m.starts_with("gemini-1") || m.starts_with("gemini-2"))
}

fn content_json(content: &Content, sign_calls: bool) -> Option<Value> {
    let role = if content.role.as_deref() == Some("model") {
        "model"
    } else {
        "user"
    };
    let parts: Vec<Value> = content
        .parts
        .iter()
        .filter_map(|p| part_json(p, sign_calls))
        .collect();
    // Gemini rejects a content without parts.
    (!parts.is_empty()).then(|| json!({"role": role, "parts": parts}))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A call id worth sending: not empty and not made up by the client (`adk-…`).
fn provider_id(id: &Option<String>) -> Option<&str> {
    id.as_deref()
        .filter(|s| !s.is_empty() && !s.starts_with("adk-"))
}

fn part_json(part: &Part, sign_calls: bool) -> Option<Value> {
    let signature = part.thought_signature.as_ref().map(|s| b64(&s.0));
    let mut out = Map::new();
    if let Some(call) = &part.function_call {
        let mut fc = json!({"name": call.name, "args": call.args});
        if let Some(id) = provider_id(&call.id) {
            fc["id"] = id.into();
        }
        out.insert("functionCall".into(), fc);
        let sig = signature.or_else(|| sign_calls.then(|| SKIP_THOUGHT_SIGNATURE.to_string()));
        if let Some(sig) = sig {
            out.insert("thoughtSignature".into(), sig.into());
        }
        return Some(Value::Object(out));
    }
    if let Some(resp) = &part.function_response {
        let mut fr = json!({"name": resp.name, "response": resp.response});
        if let Some(id) = provider_id(&resp.id) {
            fr["id"] = id.into();
        }
        out.insert("functionResponse".into(), fr);
        return Some(Value::Object(out));
    }
    if part.thought == Some(true) {
        return None;
    }
    if let Some(text) = &part.text {
        out.insert("text".into(), text.clone().into());
    } else if let Some(blob) = &part.inline_data {
        out.insert(
            "inlineData".into(),
            json!({
                "mimeType": blob.mime_type.as_deref().unwrap_or("application/octet-stream"),
                "data": b64(&blob.data.0),
            }),
        );
    } else if let Some(fd) = part
        .extra
        .get("fileData")
        .or_else(|| part.extra.get("file_data"))
    {
        out.insert("fileData".into(), file_data(fd));
    } else {
        return None;
    }
    if let Some(sig) = signature {
        out.insert("thoughtSignature".into(), sig.into());
    }
    Some(Value::Object(out))
}

/// `fileData` with its keys in camelCase (ADK accepts snake_case input).
fn file_data(fd: &Value) -> Value {
    let Some(m) = fd.as_object() else {
        return fd.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        let key = match k.as_str() {
            "mime_type" => "mimeType",
            "file_uri" => "fileUri",
            "display_name" => "displayName",
            other => other,
        };
        out.insert(key.to_string(), v.clone());
    }
    Value::Object(out)
}

/// The `parameters` of a declaration: `None` for a schema without properties (Gemini
/// rejects an `OBJECT` with empty `properties`; a tool without arguments declares none).
fn parameters_schema(schema: &Value) -> Option<Value> {
    let s = gemini_schema(schema);
    let empty_object = s.get("type").and_then(Value::as_str) == Some("OBJECT")
        && s.get("properties")
            .and_then(Value::as_object)
            .is_none_or(|p| p.is_empty());
    (!empty_object).then_some(s)
}
