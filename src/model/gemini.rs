//! Google Gemini (`POST {base}/models/{model}:streamGenerateContent?alt=sse`).
//!
//! ADK's own wire model is Gemini's, so the mapping is close to the identity: `user` and
//! `model` turns with `text`, `inlineData`, `fileData`, `functionCall` and
//! `functionResponse` parts; the system instruction becomes `systemInstruction`; tools one
//! `functionDeclarations` list; the config `generationConfig`. Thought parts are not sent
//! back. Client-made call ids (`adk-…`) are not sent, as ADK does not send them either.
//!
//! Function-call parts carry their `thoughtSignature` when the history kept one. The
//! aggregated response does not keep signatures, so for Gemini 3 and later (which reject
//! unsigned function calls in history) an unsigned call gets the validator-skipping value
//! Google documents for replayed history, `skip_thought_signature_validator`.
//!
//! Tool schemas are reduced to the OpenAPI subset Gemini's `parameters` accepts (see
//! [`gemini_schema`]).
//!
//! Every SSE `data:` is a whole `GenerateContentResponse`: `candidates[0].content.parts`
//! (text, `thought: true` text, whole `functionCall`s), `candidates[0].finishReason` (passed
//! through), cumulative `usageMetadata`, `modelVersion`, or an `error` object.
//!
//! One cohesive thing, past 600 lines: the request mapping and the stream parser are the two
//! halves of one wire format; the rest of the file is their unit tests.

use super::http;
use super::{Delta, DeltaStream, Endpoint, LlmRequest, Model, ModelError, Usage};
use crate::event::{Content, JsonMap, Part};
use async_trait::async_trait;
use base64::Engine;
use serde_json::{json, Map, Value};

pub struct GeminiModel {
    name: String,
    endpoint: Endpoint,
}

impl GeminiModel {
    pub fn new(name: impl Into<String>, endpoint: Endpoint) -> Self {
        GeminiModel {
            name: name.into(),
            endpoint,
        }
    }
}

const PROVIDER: &str = "the Gemini API";

/// The thought signature Google documents for function calls replayed without their own
/// (history from another model, or calls whose signature was not kept).
pub const SKIP_THOUGHT_SIGNATURE: &str = "skip_thought_signature_validator";

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

/// How deep `$ref`s are inlined before a (recursive) reference is cut off.
const MAX_REF_DEPTH: usize = 6;

/// Reduces a JSON schema to the OpenAPI 3.0 subset Gemini's `Schema` accepts, best-effort:
///
/// - kept: `type` (upper-cased), `format` (only the ones Gemini knows: `enum` and
///   `date-time` for strings, `int32` / `int64` / `float` / `double` for numbers),
///   `title`, `description`, `nullable`, `enum` (strings only), `properties`, `required`
///   (only names that are properties), `items`, `anyOf`, `minItems` / `maxItems`,
///   `minProperties` / `maxProperties`, `minLength` / `maxLength`, `pattern`, `minimum` /
///   `maximum`, `default`, `example`, `propertyOrdering`;
/// - rewritten: local `$ref`s (`#/$defs/…`, `#/definitions/…`) are inlined (a recursive
///   reference becomes a plain `OBJECT` after a few levels); `type: [T, "null"]` becomes
///   `type: T, nullable: true`; a `null` branch of `anyOf`/`oneOf` becomes `nullable`;
///   `oneOf` becomes `anyOf`; a single-branch `anyOf` is inlined; `const` becomes a
///   one-value `enum`; `allOf` branches are merged into the schema;
/// - dropped: everything else (`$schema`, `$id`, `$defs`, `additionalProperties`,
///   `patternProperties`, `exclusiveMinimum`, `examples`, `not`, `if`/`then`, …).
pub fn gemini_schema(schema: &Value) -> Value {
    let defs = Defs {
        defs: schema.get("$defs").and_then(Value::as_object),
        definitions: schema.get("definitions").and_then(Value::as_object),
    };
    convert(schema, &defs, 0)
}

struct Defs<'a> {
    defs: Option<&'a JsonMap>,
    definitions: Option<&'a JsonMap>,
}

impl Defs<'_> {
    fn resolve(&self, reference: &str) -> Option<&Value> {
        if let Some(name) = reference.strip_prefix("#/$defs/") {
            return self.defs?.get(name);
        }
        if let Some(name) = reference.strip_prefix("#/definitions/") {
            return self.definitions?.get(name);
        }
        None
    }
}

fn convert(schema: &Value, defs: &Defs, depth: usize) -> Value {
    let Some(src) = schema.as_object() else {
        // `true` / `{}`-like schemas: anything goes, which Gemini cannot say; leave it open.
        return json!({});
    };
    // Inline a reference; siblings of `$ref` (descriptions, mostly) override the target's.
    if let Some(r) = src.get("$ref").and_then(Value::as_str) {
        let mut merged = match defs.resolve(r) {
            Some(target) if depth < MAX_REF_DEPTH => convert(target, defs, depth + 1)
                .as_object()
                .cloned()
                .unwrap_or_default(),
            _ => json!({"type": "OBJECT"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        };
        let mut rest = src.clone();
        rest.remove("$ref");
        if let Value::Object(extra) = convert(&Value::Object(rest), defs, depth) {
            merged.extend(extra);
        }
        return Value::Object(merged);
    }
    let mut src = src.clone();
    // allOf: merge the branches into the schema itself.
    if let Some(Value::Array(branches)) = src.remove("allOf") {
        for b in &branches {
            let b = match b
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| defs.resolve(r))
            {
                Some(target) => target,
                None => b,
            };
            let Some(b) = b.as_object() else { continue };
            for (k, v) in b {
                match (k.as_str(), src.get_mut(k)) {
                    ("properties", Some(Value::Object(props))) => {
                        if let Some(more) = v.as_object() {
                            props.extend(more.clone());
                        }
                    }
                    ("required", Some(Value::Array(req))) => {
                        if let Some(more) = v.as_array() {
                            req.extend(more.iter().cloned());
                        }
                    }
                    (_, Some(_)) => {}
                    (_, None) => {
                        src.insert(k.clone(), v.clone());
                    }
                }
            }
        }
    }
    let mut out = Map::new();
    let mut nullable = src.get("nullable").and_then(Value::as_bool) == Some(true);
    // type: "string" | ["string", "null"]
    let mut ty: Option<String> = match src.get("type") {
        Some(Value::String(t)) => Some(t.clone()),
        Some(Value::Array(ts)) => {
            let names: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            if names.contains(&"null") {
                nullable = true;
            }
            names.into_iter().find(|t| *t != "null").map(str::to_string)
        }
        _ => None,
    };
    if ty.as_deref() == Some("null") {
        nullable = true;
        ty = None;
    }
    // anyOf / oneOf, with a null branch folded into `nullable`.
    let alternatives = src
        .get("anyOf")
        .or_else(|| src.get("oneOf"))
        .and_then(Value::as_array);
    if let Some(alts) = alternatives {
        let mut branches = vec![];
        for a in alts {
            if a.get("type").and_then(Value::as_str) == Some("null") {
                nullable = true;
            } else {
                branches.push(convert(a, defs, depth));
            }
        }
        if branches.len() == 1 {
            if let Value::Object(only) = branches.remove(0) {
                out.extend(only);
            }
        } else if !branches.is_empty() {
            out.insert("anyOf".into(), branches.into());
        }
    }
    if let Some(t) = &ty {
        out.insert("type".into(), t.to_ascii_uppercase().into());
    }
    let ty_upper = out
        .get("type")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_default();
    for (k, v) in &src {
        match k.as_str() {
            "title" | "description" | "pattern" | "default" | "example" | "propertyOrdering"
            | "minItems" | "maxItems" | "minProperties" | "maxProperties" | "minLength"
            | "maxLength" | "minimum" | "maximum" => {
                out.insert(k.clone(), v.clone());
            }
            "format" => {
                let known = match ty_upper.as_str() {
                    "STRING" => ["enum", "date-time"].contains(&v.as_str().unwrap_or("")),
                    "NUMBER" | "INTEGER" => {
                        ["int32", "int64", "float", "double"].contains(&v.as_str().unwrap_or(""))
                    }
                    _ => false,
                };
                if known {
                    out.insert(k.clone(), v.clone());
                }
            }
            "enum" => {
                if let Some(vals) = v.as_array().filter(|a| a.iter().all(Value::is_string)) {
                    out.insert("enum".into(), vals.clone().into());
                    out.entry("type").or_insert_with(|| "STRING".into());
                }
            }
            "const" if v.is_string() => {
                out.insert("enum".into(), json!([v]));
                out.entry("type").or_insert_with(|| "STRING".into());
            }
            "items" => {
                out.insert("items".into(), convert(v, defs, depth));
            }
            "properties" => {
                if let Some(props) = v.as_object() {
                    let props: Map<String, Value> = props
                        .iter()
                        .map(|(name, s)| (name.clone(), convert(s, defs, depth)))
                        .collect();
                    out.insert("properties".into(), props.into());
                }
            }
            _ => {}
        }
    }
    if let Some(req) = src.get("required").and_then(Value::as_array) {
        let props = out.get("properties").and_then(Value::as_object);
        let mut seen = std::collections::BTreeSet::new();
        let req: Vec<Value> = req
            .iter()
            .filter_map(Value::as_str)
            .filter(|name| props.is_some_and(|p| p.contains_key(*name)))
            .filter(|name| seen.insert(name.to_string()))
            .map(Value::from)
            .collect();
        if !req.is_empty() {
            out.insert("required".into(), req.into());
        }
    }
    if !out.contains_key("type") && out.contains_key("properties") {
        out.insert("type".into(), "OBJECT".into());
    }
    if nullable {
        out.insert("nullable".into(), true.into());
    }
    Value::Object(out)
}

/// Maps a `google.rpc` status (`error.status`) to a [`ModelError`] code.
fn error_code(status: &str, http_code: u64) -> &'static str {
    match status {
        "RESOURCE_EXHAUSTED" => "RATE_LIMITED",
        "UNAVAILABLE" | "INTERNAL" => "MODEL_UNAVAILABLE",
        "DEADLINE_EXCEEDED" => "MODEL_TIMEOUT",
        "UNAUTHENTICATED" | "PERMISSION_DENIED" => "UNAUTHENTICATED",
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => "MODEL_BAD_REQUEST",
        "NOT_FOUND" => "MODEL_NOT_FOUND",
        _ => match http_code {
            429 => "RATE_LIMITED",
            401 | 403 => "UNAUTHENTICATED",
            500..=599 => "MODEL_UNAVAILABLE",
            _ => "MODEL_ERROR",
        },
    }
}

/// The deltas of one streamed `GenerateContentResponse`.
pub fn chunk_deltas(chunk: &Value) -> Result<Vec<Delta>, ModelError> {
    if let Some(err) = chunk.get("error") {
        let status = err.get("status").and_then(Value::as_str).unwrap_or("");
        let http_code = err.get("code").and_then(Value::as_u64).unwrap_or(0);
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string());
        let code = error_code(status, http_code);
        let label = if status.is_empty() {
            String::new()
        } else {
            format!(" ({status})")
        };
        return Err(ModelError {
            code,
            message: format!("{PROVIDER} reported an error mid-stream{label}: {msg}"),
            retryable: matches!(code, "MODEL_UNAVAILABLE" | "RATE_LIMITED" | "MODEL_TIMEOUT"),
            retry_after: None,
        });
    }
    let mut out = vec![];
    if let Some(v) = chunk.get("modelVersion").and_then(Value::as_str) {
        out.push(Delta::ModelVersion(v.to_string()));
    }
    let candidate = chunk.get("candidates").and_then(|c| c.get(0));
    if let Some(cand) = candidate {
        let parts = cand
            .get("content")
            .and_then(|c| c.get("parts"))
            .and_then(Value::as_array);
        for p in parts.into_iter().flatten() {
            if let Some(call) = p.get("functionCall") {
                out.push(Delta::ToolCall {
                    id: call
                        .get("id")
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string),
                    name: call
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    args: call.get("args").cloned().unwrap_or_else(|| json!({})),
                });
                if let Some(sig) = p
                    .get("thoughtSignature")
                    .and_then(Value::as_str)
                    .and_then(crate::event::decode_base64_any)
                {
                    out.push(Delta::CallSignature(sig));
                }
            } else if let Some(t) = p.get("text").and_then(Value::as_str) {
                if p.get("thought").and_then(Value::as_bool) == Some(true) {
                    out.push(Delta::Thought(t.to_string()));
                } else {
                    out.push(Delta::Text(t.to_string()));
                }
            }
            // executableCode, codeExecutionResult, inlineData (generated images), … are
            // not represented in a delta.
        }
        if let Some(r) = cand.get("finishReason").and_then(Value::as_str) {
            out.push(Delta::Finish(r.to_string()));
        }
    } else if let Some(reason) = chunk
        .get("promptFeedback")
        .and_then(|f| f.get("blockReason"))
        .and_then(Value::as_str)
    {
        // The prompt itself was blocked: no candidates, only the reason.
        out.push(Delta::Finish(reason.to_string()));
    }
    if let Some(u) = chunk.get("usageMetadata").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64);
        let prompt = n("promptTokenCount").unwrap_or(0);
        let candidates = n("candidatesTokenCount").unwrap_or(0);
        let thoughts = n("thoughtsTokenCount");
        out.push(Delta::Usage(Usage {
            prompt_tokens: prompt,
            candidates_tokens: candidates,
            total_tokens: n("totalTokenCount")
                .unwrap_or(prompt + candidates + thoughts.unwrap_or(0)),
            thoughts_tokens: thoughts,
        }));
    }
    Ok(out)
}

/// Gemini answers a bad API key with 400 `INVALID_ARGUMENT` ("API key not valid"), which
/// [`http::status_error`] files as a bad request; it is an authentication problem.
fn reclassify(err: ModelError) -> ModelError {
    if err.code == "MODEL_BAD_REQUEST" && err.message.contains("API key") {
        return ModelError {
            code: "UNAUTHENTICATED",
            message: err.message.replacen(
                "rejected the request",
                "rejected the API key (check GEMINI_API_KEY / GOOGLE_API_KEY, or the \
                 variable named by model_options.api_key_env)",
                1,
            ),
            ..err
        };
    }
    err
}

#[async_trait]
impl Model for GeminiModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider(&self) -> &'static str {
        "gemini"
    }

    async fn stream(&self, req: &LlmRequest) -> Result<DeltaStream, ModelError> {
        let model = self.name.trim_start_matches("models/");
        let body = request_body(model, req);
        let url = format!(
            "{}/models/{model}:streamGenerateContent?alt=sse",
            self.endpoint.base_url
        );
        // Each message is a whole `GenerateContentResponse`; the last carries a finishReason.
        let decoder = http::ChunkDecoder {
            chunk: chunk_deltas,
            expected_end: "a finishReason",
            end_marker: None,
            finished: false,
        };
        let auth = http::Auth::Header("x-goog-api-key");
        http::post_stream(PROVIDER, &self.endpoint, &url, &body, auth, &[], decoder)
            .await
            .map_err(reclassify)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Blob, Bytes64, FunctionCall, FunctionResponse};
    use crate::model::{GenerateConfig, ToolDeclaration};

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
                    thoughts_tokens: Some(2)
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
}
