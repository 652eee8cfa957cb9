//! The stream's side: each SSE message a whole `GenerateContentResponse`, turned into deltas,
//! and Gemini's errors turned into [`ModelError`]s.

use super::PROVIDER;
use crate::model::{Delta, ModelError, Usage};
use serde_json::{json, Value};

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
            cached_tokens: n("cachedContentTokenCount"),
        }));
    }
    Ok(out)
}

/// Gemini answers a bad API key with 400 `INVALID_ARGUMENT` ("API key not valid"), which
/// [`http::status_error`] files as a bad request; it is an authentication problem.
pub(super) fn reclassify(err: ModelError, ep: &crate::model::Endpoint) -> ModelError {
    if err.code == "MODEL_BAD_REQUEST" && err.message.contains("API key") {
        let refused = ModelError {
            code: "UNAUTHENTICATED",
            message: err
                .message
                .replacen("rejected the request", "refused the credentials", 1),
            ..err
        };
        return crate::model::http::name_the_key(refused, ep);
    }
    err
}
