//! A model call's request and response as trace text, in the shape ADK's tracing gives them
//! (`gcp.vertex.agent.llm_request` and `…llm_response`, which ADK's web UI shows for an event):
//! no inline bytes and no thought signatures, and nothing of the endpoint (keys, headers).

use super::{LlmRequest, LlmResponse};
use crate::event::Content;
use serde_json::{json, Map, Value};

/// The request as ADK's `_build_llm_request_for_trace` has it: model, config, contents.
pub fn request_json(req: &LlmRequest) -> Value {
    let mut config = Map::new();
    if let Some(s) = &req.system_instruction {
        config.insert("system_instruction".into(), s.clone().into());
    }
    let c = &req.config;
    for (key, value) in [
        ("temperature", c.temperature.map(Value::from)),
        ("top_p", c.top_p.map(Value::from)),
        ("max_output_tokens", c.max_output_tokens.map(Value::from)),
        ("seed", c.seed.map(Value::from)),
    ] {
        if let Some(v) = value {
            config.insert(key.into(), v);
        }
    }
    if !c.stop_sequences.is_empty() {
        config.insert("stop_sequences".into(), json!(c.stop_sequences));
    }
    if !req.tools.is_empty() {
        let declarations: Vec<Value> = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
            .collect();
        config.insert(
            "tools".into(),
            json!([{ "function_declarations": declarations }]),
        );
    }
    let contents: Vec<Value> = req.contents.iter().map(without_bytes).collect();
    json!({ "model": req.model, "config": config, "contents": contents })
}

/// The response as ADK's `LlmResponse.model_dump_json(exclude_none=True)` has it.
pub fn response_json(resp: &LlmResponse) -> Value {
    let mut out = Map::new();
    if let Some(c) = &resp.content {
        out.insert("content".into(), without_bytes(c));
    }
    if let Some(f) = &resp.finish_reason {
        out.insert("finish_reason".into(), f.clone().into());
    }
    if let Some(u) = resp.usage {
        out.insert("usage_metadata".into(), u.to_json());
    }
    if let Some(v) = &resp.model_version {
        out.insert("model_version".into(), v.clone().into());
    }
    if let Some(code) = &resp.error_code {
        out.insert("error_code".into(), code.clone().into());
    }
    if let Some(m) = &resp.error_message {
        out.insert("error_message".into(), m.clone().into());
    }
    Value::Object(out)
}

fn without_bytes(content: &Content) -> Value {
    let mut c = content.clone();
    c.parts.retain(|p| p.inline_data.is_none());
    for p in &mut c.parts {
        p.thought_signature = None;
    }
    serde_json::to_value(c).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Blob, Bytes64, Part};

    #[test]
    fn inline_bytes_are_left_out() {
        let mut content = Content::text("user", "look");
        content.parts.push(Part {
            inline_data: Some(Blob {
                mime_type: Some("image/png".into()),
                data: Bytes64(vec![1, 2, 3]),
                display_name: None,
            }),
            ..Default::default()
        });
        let req = LlmRequest {
            model: "m".into(),
            system_instruction: Some("Be brief.".into()),
            contents: vec![content],
            ..Default::default()
        };
        let j = request_json(&req);
        assert_eq!(j["config"]["system_instruction"], "Be brief.");
        assert_eq!(j["contents"][0]["parts"].as_array().map(Vec::len), Some(1));
        assert_eq!(j["contents"][0]["parts"][0]["text"], "look");
    }
}
