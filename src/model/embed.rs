//! Embedding models: text in, one vector per text out, from OpenAI-compatible
//! `/v1/embeddings` (OpenAI, llama.cpp, vLLM, Ollama, LiteLLM, …) or Gemini's
//! `batchEmbedContents`. Memory search ([`crate::memory`]) uses them.
//!
//! The same endpoint rules as chat models ([`super::endpoint()`]): the base URL and key come from
//! `embedding_options` or the provider's environment variables, redirects are not followed,
//! calls are retried with backoff before the first byte, and the key never reaches a log. A
//! response is read whole but bounded, and checked: one vector per text, each of the
//! configured size, every value finite.

use super::http::{self, Auth};
use super::{Endpoint, ModelError, ModelOptions, Provider};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// Most texts sent in one request (OpenAI accepts 2,048, Gemini 100).
pub const MAX_BATCH: usize = 64;

/// Longest text embedded, in bytes (cut at a character boundary): about 2,000 tokens, within
/// every provider's input limit. The full text stays searchable by its words.
pub const MAX_EMBED_TEXT_BYTES: usize = 8 * 1024;

/// Largest vector size accepted: pgvector's HNSW index takes `vector` columns up to 2,000.
pub const MAX_DIMENSIONS: u32 = 2000;

/// Largest response body read: a full batch of the largest vectors written as JSON numbers.
const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// What a text is embedded for: providers that distinguish (Gemini's `taskType`) embed a
/// stored memory and a search query differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Document,
    Query,
}

/// The vectors of one call, in the order of the texts, and the tokens the provider counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub tokens: u64,
}

/// An embedding model.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// `model/dimensions`: vectors of different spaces are never compared, so a change of
    /// model or size re-embeds what was stored.
    fn space(&self) -> String;

    /// The model's name, as usage and `--prices` know it (what its calls are charged as).
    fn model(&self) -> &str;

    /// The size of every vector this model returns.
    fn dimensions(&self) -> u32;

    /// The longest one [`Self::embed`] can take, retries included: how long a claim on the
    /// memories being embedded must last.
    fn longest_call(&self) -> std::time::Duration {
        std::time::Duration::from_secs(300)
    }

    /// One vector per text (at most [`MAX_BATCH`] texts).
    async fn embed(&self, texts: &[String], purpose: Purpose) -> Result<Embeddings, ModelError>;
}

/// Builds the embedding model for `spec` (`openai/text-embedding-3-small`,
/// `gemini/text-embedding-004`, or a bare name for an OpenAI-compatible server) returning
/// vectors of `dimensions` values.
pub fn resolve(
    spec: &str,
    options: &ModelOptions,
    dimensions: u32,
) -> Result<Arc<dyn Embedder>, String> {
    if dimensions == 0 || dimensions > MAX_DIMENSIONS {
        return Err(format!(
            "dimensions must be between 1 and {MAX_DIMENSIONS}, got {dimensions}"
        ));
    }
    let (provider, name, endpoint) = super::endpoint(spec, options)?;
    let model = HttpEmbedder {
        provider,
        name: name.to_string(),
        endpoint,
        dimensions,
    };
    match provider {
        Provider::Openai | Provider::Gemini => Ok(Arc::new(model)),
        Provider::Anthropic => Err(format!(
            "{spec}: Anthropic has no embedding API; use an OpenAI-compatible or Gemini model"
        )),
    }
}

struct HttpEmbedder {
    provider: Provider,
    name: String,
    endpoint: Endpoint,
    dimensions: u32,
}

#[derive(Deserialize)]
struct OpenAiResponse {
    data: Vec<OpenAiVector>,
    #[serde(default)]
    usage: Option<OpenAiUsage>,
}

#[derive(Deserialize)]
struct OpenAiVector {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    #[serde(default)]
    total_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct GeminiResponse {
    embeddings: Vec<GeminiVector>,
}

#[derive(Deserialize)]
struct GeminiVector {
    values: Vec<f32>,
}

fn protocol(provider: &str, message: String) -> ModelError {
    ModelError {
        code: "MODEL_PROTOCOL",
        message: format!("{provider}: {message}"),
        retryable: false,
        retry_after: None,
    }
}

/// A text as sent: at most [`MAX_EMBED_TEXT_BYTES`], cut at a character boundary.
fn clip(text: &str) -> &str {
    if text.len() <= MAX_EMBED_TEXT_BYTES {
        return text;
    }
    let mut end = MAX_EMBED_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl HttpEmbedder {
    async fn openai(&self, texts: &[String]) -> Result<Embeddings, ModelError> {
        const P: &str = "OpenAI-compatible embeddings";
        let url = format!("{}/embeddings", self.endpoint.base_url);
        let body = json!({
            "model": self.name,
            "input": texts.iter().map(|t| clip(t)).collect::<Vec<_>>(),
            "dimensions": self.dimensions,
            "encoding_format": "float",
        });
        let resp = http::post(P, &self.endpoint, &url, &body, Auth::Bearer, &[]).await?;
        let mut out: OpenAiResponse =
            http::bounded_json(P, resp, MAX_RESPONSE_BYTES, self.endpoint.timeout).await?;
        if out.data.iter().all(|v| v.index.is_some()) {
            out.data.sort_by_key(|v| v.index);
        }
        let tokens = out
            .usage
            .and_then(|u| u.total_tokens.or(u.prompt_tokens))
            .unwrap_or(0);
        Ok(Embeddings {
            vectors: out.data.into_iter().map(|v| v.embedding).collect(),
            tokens,
        })
    }

    async fn gemini(&self, texts: &[String], purpose: Purpose) -> Result<Embeddings, ModelError> {
        const P: &str = "Gemini embeddings";
        let url = format!(
            "{}/models/{}:batchEmbedContents",
            self.endpoint.base_url, self.name
        );
        let task = match purpose {
            Purpose::Document => "RETRIEVAL_DOCUMENT",
            Purpose::Query => "RETRIEVAL_QUERY",
        };
        let requests: Vec<_> = texts
            .iter()
            .map(|t| {
                json!({
                    "model": format!("models/{}", self.name),
                    "content": {"parts": [{"text": clip(t)}]},
                    "taskType": task,
                    "outputDimensionality": self.dimensions,
                })
            })
            .collect();
        let body = json!({ "requests": requests });
        let auth = Auth::Header("x-goog-api-key");
        let resp = http::post(P, &self.endpoint, &url, &body, auth, &[]).await?;
        let out: GeminiResponse =
            http::bounded_json(P, resp, MAX_RESPONSE_BYTES, self.endpoint.timeout).await?;
        // Gemini does not count an embedding's tokens; estimated as 4 characters a token.
        let tokens = texts.iter().map(|t| clip(t).len() as u64 / 4 + 1).sum();
        Ok(Embeddings {
            vectors: out.embeddings.into_iter().map(|v| v.values).collect(),
            tokens,
        })
    }
}

#[async_trait]
impl Embedder for HttpEmbedder {
    fn space(&self) -> String {
        format!("{}/{}", self.name, self.dimensions)
    }

    fn model(&self) -> &str {
        &self.name
    }

    fn dimensions(&self) -> u32 {
        self.dimensions
    }

    fn longest_call(&self) -> std::time::Duration {
        // Each attempt: the answer's start and its body, each within the timeout; between
        // attempts, a backoff of at most 30 s.
        let attempts = self.endpoint.retry.max_retries + 1;
        (self.endpoint.timeout * 2 + std::time::Duration::from_secs(30)) * attempts
    }

    async fn embed(&self, texts: &[String], purpose: Purpose) -> Result<Embeddings, ModelError> {
        if texts.is_empty() {
            return Ok(Embeddings::default());
        }
        if texts.len() > MAX_BATCH {
            return Err(protocol(
                "embeddings",
                format!("{} texts in one call; at most {MAX_BATCH}", texts.len()),
            ));
        }
        let out = match self.provider {
            Provider::Gemini => self.gemini(texts, purpose).await?,
            _ => self.openai(texts).await?,
        };
        check(out, texts.len(), self.dimensions)
    }
}

/// `out` when it holds `count` vectors of `dimensions` finite values.
fn check(out: Embeddings, count: usize, dimensions: u32) -> Result<Embeddings, ModelError> {
    if out.vectors.len() != count {
        return Err(protocol(
            "embeddings",
            format!("{} vectors for {count} texts", out.vectors.len()),
        ));
    }
    for v in &out.vectors {
        if v.len() != dimensions as usize {
            return Err(protocol(
                "embeddings",
                format!(
                    "a vector of {} values where `dimensions: {dimensions}` was configured",
                    v.len()
                ),
            ));
        }
        if v.iter().any(|x| !x.is_finite()) {
            return Err(protocol(
                "embeddings",
                "a vector value is not finite".into(),
            ));
        }
        if v.iter().all(|x| *x == 0.0) {
            // No direction, so no distance to anything: this text cannot be embedded (the
            // model's refusal, as a 400 would be).
            return Err(ModelError {
                code: "MODEL_BAD_REQUEST",
                message: "embeddings: a vector of zeros for a text".into(),
                retryable: false,
                retry_after: None,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_must_match_the_texts_and_the_size() {
        let ok = Embeddings {
            vectors: vec![vec![0.0, 1.0], vec![1.0, 0.0]],
            tokens: 3,
        };
        assert_eq!(check(ok.clone(), 2, 2).unwrap(), ok);
        assert!(check(ok.clone(), 3, 2)
            .unwrap_err()
            .message
            .contains("2 vectors for 3 texts"));
        assert!(check(ok, 2, 3)
            .unwrap_err()
            .message
            .contains("dimensions: 3"));
        let nan = Embeddings {
            vectors: vec![vec![f32::NAN]],
            tokens: 0,
        };
        assert!(check(nan, 1, 1).is_err());
        let zeros = Embeddings {
            vectors: vec![vec![0.0, 0.0]],
            tokens: 0,
        };
        assert!(check(zeros, 1, 2).unwrap_err().message.contains("zeros"));
    }

    #[test]
    fn long_texts_are_clipped_at_a_char_boundary() {
        let long = "é".repeat(MAX_EMBED_TEXT_BYTES);
        let c = clip(&long);
        assert!(c.len() <= MAX_EMBED_TEXT_BYTES && c.len() >= MAX_EMBED_TEXT_BYTES - 1);
        assert_eq!(clip("short"), "short");
    }

    #[test]
    fn sizes_out_of_range_and_anthropic_are_refused() {
        let o = ModelOptions::default();
        assert!(resolve("openai/text-embedding-3-small", &o, 0).is_err());
        assert!(resolve("openai/text-embedding-3-small", &o, MAX_DIMENSIONS + 1).is_err());
        assert!(resolve("anthropic/claude-x", &o, 8).is_err());
        let e = resolve("gemini/text-embedding-004", &o, 768).unwrap();
        assert_eq!(e.space(), "text-embedding-004/768");
        assert_eq!(e.dimensions(), 768);
    }
}
