use super::*;
use crate::event::{Blob, Bytes64, FunctionCall, FunctionResponse};
use crate::event::{Content, Part};
use crate::model::{Delta, LlmRequest, Usage};
use crate::model::{GenerateConfig, ToolDeclaration};
use serde_json::json;

#[test]
fn history_maps_to_contents() {
    let req = LlmRequest {
        system_instruction: Some("be brief".into()),
        contents: vec![
            Content {
                parts: vec![
                    Part::text("what is this?"),
                    Part {
                        inline_data: Some(Blob {
                            data: Bytes64(vec![0xfb, 0xff]),
                            mime_type: Some("image/png".into()),
                            display_name: None,
                        }),
                        ..Default::default()
                    },
                ],
                role: Some("user".into()),
                ..Default::default()
            },
            Content {
                parts: vec![
                    Part {
                        text: Some("hmm".into()),
                        thought: Some(true),
                        ..Default::default()
                    },
                    Part {
                        function_call: Some(FunctionCall {
                            id: Some("adk-123".into()),
                            name: "look".into(),
                            args: serde_json::from_value(json!({"x": 1})).unwrap(),
                            ..Default::default()
                        }),
                        thought_signature: Some(Bytes64(b"sig".to_vec())),
                        ..Default::default()
                    },
                ],
                role: Some("model".into()),
                ..Default::default()
            },
            Content {
                parts: vec![Part {
                    function_response: Some(FunctionResponse {
                        id: Some("call-7".into()),
                        name: "look".into(),
                        response: serde_json::from_value(json!({"ok": true})).unwrap(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                role: Some("user".into()),
                ..Default::default()
            },
            // Only a thought: dropped entirely.
            Content {
                parts: vec![Part {
                    text: Some("…".into()),
                    thought: Some(true),
                    ..Default::default()
                }],
                role: Some("model".into()),
                ..Default::default()
            },
        ],
        config: GenerateConfig {
            temperature: Some(0.5),
            top_p: Some(0.8),
            max_output_tokens: Some(256),
            stop_sequences: vec!["END".into()],
            seed: Some(42),
        },
        ..Default::default()
    };
    let body = request_body("gemini-2.5-flash", &req);
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": "be brief"}]})
    );
    let contents = body["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 3);
    assert_eq!(contents[0]["parts"][1]["inlineData"]["data"], "+/8=");
    assert_eq!(
        contents[0]["parts"][1]["inlineData"]["mimeType"],
        "image/png"
    );
    assert_eq!(contents[1]["role"], "model");
    assert_eq!(contents[1]["parts"].as_array().unwrap().len(), 1);
    let call = &contents[1]["parts"][0];
    assert_eq!(
        call["functionCall"],
        json!({"name": "look", "args": {"x": 1}})
    );
    assert_eq!(call["thoughtSignature"], "c2ln");
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"],
        json!({"name": "look", "response": {"ok": true}, "id": "call-7"})
    );
    assert_eq!(
        body["generationConfig"],
        json!({"temperature": 0.5, "topP": 0.8, "maxOutputTokens": 256,
               "stopSequences": ["END"], "seed": 42})
    );
    assert!(body.get("tools").is_none());
}

#[test]
fn unsigned_calls_get_the_skip_signature_on_gemini_3() {
    let req = LlmRequest {
        contents: vec![Content {
            parts: vec![Part {
                function_call: Some(FunctionCall {
                    name: "f".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            role: Some("model".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let b3 = request_body("gemini-3-pro-preview", &req);
    assert_eq!(
        b3["contents"][0]["parts"][0]["thoughtSignature"],
        SKIP_THOUGHT_SIGNATURE
    );
    let b2 = request_body("gemini-2.5-flash", &req);
    assert!(b2["contents"][0]["parts"][0]
        .get("thoughtSignature")
        .is_none());
}

#[test]
fn schemas_reduce_to_gemini_subset() {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": false,
        "$defs": {
            "Unit": {"type": "string", "enum": ["c", "f"], "description": "unit"},
            "Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}
        },
        "properties": {
            "city": {"type": "string", "format": "hostname", "minLength": 1},
            "when": {"type": "string", "format": "date-time"},
            "unit": {"$ref": "#/$defs/Unit", "description": "which unit"},
            "days": {"type": ["integer", "null"], "format": "int32", "exclusiveMinimum": 0},
            "tag": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
            "mode": {"const": "fast"},
            "either": {"oneOf": [{"type": "string"}, {"type": "number"}]},
            "list": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a", "ghost"]}},
            "node": {"$ref": "#/$defs/Node"},
            "nums": {"enum": [1, 2]}
        },
        "required": ["city", "missing"]
    });
    let s = gemini_schema(&schema);
    assert_eq!(s["type"], "OBJECT");
    assert!(s.get("$schema").is_none() && s.get("additionalProperties").is_none());
    assert!(s.get("$defs").is_none());
    assert_eq!(s["required"], json!(["city"]));
    let p = &s["properties"];
    assert_eq!(p["city"], json!({"type": "STRING", "minLength": 1}));
    assert_eq!(p["when"]["format"], "date-time");
    assert_eq!(
        p["unit"],
        json!({"type": "STRING", "enum": ["c", "f"], "description": "which unit"})
    );
    assert_eq!(
        p["days"],
        json!({"type": "INTEGER", "format": "int32", "nullable": true})
    );
    assert_eq!(
        p["tag"],
        json!({"type": "STRING", "nullable": true, "default": null})
    );
    assert_eq!(p["mode"], json!({"type": "STRING", "enum": ["fast"]}));
    assert_eq!(
        p["either"]["anyOf"],
        json!([{"type": "STRING"}, {"type": "NUMBER"}])
    );
    assert_eq!(p["list"]["items"]["required"], json!(["a"]));
    assert_eq!(p["list"]["items"]["properties"]["a"]["type"], "BOOLEAN");
    // Recursion is cut off, not followed forever.
    assert_eq!(p["node"]["properties"]["next"]["type"], "OBJECT");
    assert_eq!(p["nums"], json!({}));

    // A tool without arguments declares no parameters.
    let req = LlmRequest {
        tools: vec![
            ToolDeclaration {
                name: "now".into(),
                description: "time".into(),
                parameters: Some(json!({"type": "object", "properties": {}})),
            },
            ToolDeclaration {
                name: "f".into(),
                description: "d".into(),
                parameters: Some(schema),
            },
        ],
        ..Default::default()
    };
    let body = request_body("gemini-2.5-flash", &req);
    let decls = &body["tools"][0]["functionDeclarations"];
    assert!(decls[0].get("parameters").is_none());
    assert_eq!(decls[1]["parameters"]["type"], "OBJECT");
}

#[test]
fn chunks_map_to_deltas() {
    let ds = chunk_deltas(&json!({
        "candidates": [{"content": {"role": "model", "parts": [
            {"text": "plan", "thought": true},
            {"text": "Hi"},
            {"functionCall": {"name": "f", "args": {"a": 1}, "id": "x1"}}
        ]}, "finishReason": "MAX_TOKENS"}],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4, "totalTokenCount": 9, "thoughtsTokenCount": 2},
        "modelVersion": "gemini-x"
    }))
    .unwrap();
    assert_eq!(
        ds,
        vec![
            Delta::ModelVersion("gemini-x".into()),
            Delta::Thought("plan".into()),
            Delta::Text("Hi".into()),
            Delta::ToolCall {
                id: Some("x1".into()),
                name: "f".into(),
                args: json!({"a": 1})
            },
            Delta::Finish("MAX_TOKENS".into()),
            Delta::Usage(Usage {
                prompt_tokens: 3,
                candidates_tokens: 4,
                total_tokens: 9,
                thoughts_tokens: Some(2),
                cached_tokens: None
            }),
        ]
    );
    let blocked = chunk_deltas(&json!({"promptFeedback": {"blockReason": "SAFETY"}})).unwrap();
    assert_eq!(blocked, vec![Delta::Finish("SAFETY".into())]);
    let err = chunk_deltas(
        &json!({"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}),
    )
    .unwrap_err();
    assert_eq!(err.code, "RATE_LIMITED");
    assert!(err.message.contains("quota"));
}
