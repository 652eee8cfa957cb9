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
//! The two halves of the wire format live apart: [`request`] (with the schema reduction in
//! [`schema`]) and [`response`] (the stream's chunks and errors).

mod request;
mod response;
mod schema;
#[cfg(test)]
mod tests;

pub use request::request_body;
pub use response::chunk_deltas;
pub use schema::gemini_schema;

use super::http;
use super::{DeltaStream, Endpoint, LlmRequest, Model, ModelError};
use async_trait::async_trait;
use response::reclassify;

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

#[async_trait]
impl Model for GeminiModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider(&self) -> &'static str {
        "gemini"
    }

    fn missing_key(&self) -> Option<&str> {
        self.endpoint
            .keyless_default
            .then_some(self.endpoint.key_env.as_str())
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
            .map_err(|e| reclassify(e, &self.endpoint))
    }
}
