//! Models: the streaming [`Model`] trait, the provider-neutral request and response types,
//! and the providers (OpenAI-compatible Chat Completions, Anthropic Messages, Google Gemini).
//!
//! A provider turns its wire stream into [`Delta`]s and nothing else; [`Aggregator`] (shared
//! by every provider) turns deltas into the text shown to the client as it streams and into
//! the one aggregated [`LlmResponse`] the LLM agent commits. That keeps the tricky parts
//! (tool-call argument accumulation, JSON repair, finish reasons) in one tested place.
//!
//! The types every provider shares and the aggregator that is their single tested path; the
//! last part of the file is its unit tests. Which provider and endpoint a spec names
//! ([`resolve`], [`endpoint()`]) lives in `endpoint.rs`.

pub mod anthropic;
pub mod embed;
mod endpoint;
pub mod gemini;
pub mod http;
pub mod openai;
pub mod repair;
pub mod trace;

pub use endpoint::{endpoint, provider_env_vars, resolve, Endpoint, ModelOptions, Provider};

use crate::event::{Content, FunctionCall, JsonMap, Part};
use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

/// One call to a model: instruction, conversation, tools and generation settings.
#[derive(Debug, Clone, Default)]
pub struct LlmRequest {
    /// The provider's model name (`gpt-4o-mini`, `claude-sonnet-4-5`, `gemini-2.5-flash`).
    pub model: String,
    pub system_instruction: Option<String>,
    /// The conversation, oldest first: `user` and `model` turns, function calls in model
    /// turns and their responses in the following user turn.
    pub contents: Vec<Content>,
    pub tools: Vec<ToolDeclaration>,
    pub config: GenerateConfig,
    /// Ask the provider to cache the prompt's stable prefix (an app's `context_cache:`).
    pub cache: Option<CacheHint>,
}

/// An app's `context_cache:` block, with ADK's `ContextCacheConfig` names (docs/usage.md).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextCache {
    /// How long the provider keeps the cache: Anthropic's `1h` from 3,600 on, else its 5
    /// minutes.
    #[serde(default = "default_cache_ttl")]
    pub ttl_seconds: u64,
    /// No caching for prompts estimated below this many tokens (4 characters a token).
    #[serde(default)]
    pub min_tokens: u64,
    /// ADK's bound on how many invocations reuse an explicit (Gemini) cache; accepted for
    /// compatibility: agentd uses the providers' prefix caching, which needs no refresh.
    #[serde(default = "default_cache_intervals")]
    pub cache_intervals: u32,
}

fn json_len(v: &JsonMap) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

fn default_cache_ttl() -> u64 {
    1800
}

fn default_cache_intervals() -> u32 {
    10
}

/// What one request asks of the provider's prompt cache.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheHint {
    /// Requests with the same key share a cache (OpenAI's `prompt_cache_key`): one per
    /// session, so a conversation's turns land on the same cache.
    pub key: String,
    pub ttl_seconds: u64,
}

impl ContextCache {
    /// The hint for a request in session `session_key` whose prompt is `req`, unless the
    /// prompt is too short to be worth caching.
    pub fn hint(&self, session_key: String, req: &LlmRequest) -> Option<CacheHint> {
        let chars: usize = req.system_instruction.as_deref().map_or(0, str::len)
            + req
                .contents
                .iter()
                .flat_map(|c| &c.parts)
                .map(|p| {
                    p.text.as_deref().map_or(0, str::len)
                        + p.function_call.as_ref().map_or(0, |f| json_len(&f.args))
                        + p.function_response
                            .as_ref()
                            .map_or(0, |r| json_len(&r.response))
                })
                .sum::<usize>()
            + req
                .tools
                .iter()
                .map(|t| {
                    t.description.len() + t.parameters.as_ref().map_or(0, |p| p.to_string().len())
                })
                .sum::<usize>();
        ((chars / 4) as u64 >= self.min_tokens).then_some(CacheHint {
            key: session_key,
            ttl_seconds: self.ttl_seconds,
        })
    }
}

/// A tool as the model sees it: a name, what it does, a JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDeclaration {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object (`None`: no arguments).
    pub parameters: Option<Value>,
}

/// Generation settings (ADK's `generate_content_config`), each optional.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GenerateConfig {
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default, alias = "topP")]
    pub top_p: Option<f64>,
    #[serde(default, alias = "maxOutputTokens", alias = "max_tokens")]
    pub max_output_tokens: Option<u32>,
    #[serde(default, alias = "stopSequences", alias = "stop")]
    pub stop_sequences: Vec<String>,
    #[serde(default)]
    pub seed: Option<i64>,
}

/// Token counts, in ADK's `usageMetadata` shape.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub candidates_tokens: u64,
    pub total_tokens: u64,
    pub thoughts_tokens: Option<u64>,
    /// The part of the prompt read from the provider's cache (`cachedContentTokenCount`).
    pub cached_tokens: Option<u64>,
}

impl Usage {
    pub fn to_json(self) -> Value {
        let mut m = JsonMap::new();
        if let Some(c) = self.cached_tokens {
            m.insert("cachedContentTokenCount".into(), c.into());
        }
        m.insert("candidatesTokenCount".into(), self.candidates_tokens.into());
        m.insert("promptTokenCount".into(), self.prompt_tokens.into());
        if let Some(t) = self.thoughts_tokens {
            m.insert("thoughtsTokenCount".into(), t.into());
        }
        m.insert("totalTokenCount".into(), self.total_tokens.into());
        Value::Object(m)
    }

    /// The counts as usage accounting normalises them ([`crate::usage::Tokens::normalise`]).
    pub fn tokens(self) -> crate::usage::Tokens {
        crate::usage::Tokens::normalise(
            self.prompt_tokens,
            self.candidates_tokens,
            self.thoughts_tokens.unwrap_or(0),
            self.cached_tokens.unwrap_or(0),
            self.total_tokens,
        )
    }
}

/// One piece of a streamed model response, provider-neutral.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Answer text.
    Text(String),
    /// Reasoning text (`thought: true` parts).
    Thought(String),
    /// A piece of a tool call streamed incrementally (OpenAI, Anthropic): the first piece of
    /// `index` carries the id and name, later ones append to the argument JSON text.
    ToolCallChunk {
        index: usize,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
    /// A whole tool call (Gemini).
    ToolCall {
        id: Option<String>,
        name: String,
        args: Value,
    },
    /// The opaque `thoughtSignature` of the tool call pushed last (Gemini 3 requires it back
    /// in the history).
    CallSignature(Vec<u8>),
    /// Why generation stopped, as ADK's `finishReason` (`STOP`, `MAX_TOKENS`, `SAFETY`, …).
    Finish(String),
    Usage(Usage),
    /// The model that actually answered (`modelVersion`).
    ModelVersion(String),
}

pub type DeltaStream = BoxStream<'static, Result<Delta, ModelError>>;

/// A model provider.
#[async_trait]
pub trait Model: Send + Sync + 'static {
    /// The model name requests go to.
    fn name(&self) -> &str;

    /// The provider, for metrics and traces (`openai`, `anthropic`, `gemini`).
    fn provider(&self) -> &'static str {
        "custom"
    }

    /// Starts a streamed generation. Errors before the first byte (after the provider's
    /// retries) come back here; errors mid-stream come as stream items.
    async fn stream(&self, request: &LlmRequest) -> Result<DeltaStream, ModelError>;

    /// The environment variable to set, when the model calls its provider's own service with
    /// no API key (a call would be refused). `None` with a key, or with another base URL (a
    /// local or self-hosted server may need none).
    fn missing_key(&self) -> Option<&str> {
        None
    }
}

/// The code of a model call not made because a budget it would be charged to is spent
/// (docs/usage.md): the run's error event says it, and `/run` answers
/// [`crate::error_code::ErrorCode::BudgetExhausted`] for it.
pub const BUDGET_EXHAUSTED: &str = "BUDGET_EXHAUSTED";

/// Why a model call failed, classified so the agent can show a clear error event.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ModelError {
    /// Stable code for `errorCode`: `UNAUTHENTICATED`, `RATE_LIMITED`, `MODEL_UNAVAILABLE`,
    /// `MODEL_TIMEOUT`, `MODEL_CONNECTION`, `MODEL_BAD_REQUEST`, `MODEL_NOT_FOUND`,
    /// `MODEL_PROTOCOL`, `MODEL_ERROR`; [`BUDGET_EXHAUSTED`] for a call not made.
    pub code: &'static str,
    pub message: String,
    /// Worth retrying (before the first byte): 429, 5xx, connection errors, timeouts.
    pub retryable: bool,
    /// The provider's `Retry-After`, when it sent one.
    pub retry_after: Option<Duration>,
}

impl ModelError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ModelError {
            code,
            message: message.into(),
            retryable: false,
            retry_after: None,
        }
    }

    pub fn protocol(message: impl Into<String>) -> Self {
        ModelError::new("MODEL_PROTOCOL", message)
    }
}

/// The aggregated result of one model call (or of a callback that answered instead).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LlmResponse {
    pub content: Option<Content>,
    /// A streamed chunk (after-model hooks see each chunk, then the aggregated response).
    pub partial: bool,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    pub model_version: Option<String>,
    /// Calls whose argument text was not valid JSON even after repair: call id → why. The
    /// agent answers these with a tool error instead of running the tool.
    pub invalid_calls: Vec<(String, String)>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
}

impl LlmResponse {
    /// A text-only response (callbacks that answer instead of the model).
    pub fn text(text: impl Into<String>) -> Self {
        LlmResponse {
            content: Some(Content::text("model", text)),
            ..Default::default()
        }
    }

    pub fn function_calls(&self) -> impl Iterator<Item = &FunctionCall> {
        self.content
            .iter()
            .flat_map(|c| c.parts.iter())
            .filter_map(|p| p.function_call.as_ref())
    }
}

/// What a partial chunk shows the client.
#[derive(Debug, Clone, PartialEq)]
pub enum PartialChunk {
    Text(String),
    Thought(String),
}

#[derive(Default)]
struct PendingCall {
    signature: Option<Vec<u8>>,
    id: Option<String>,
    name: String,
    arguments: String,
    whole: Option<Value>,
}

/// Folds a delta stream into one [`LlmResponse`]; [`Aggregator::push`] returns what should
/// be streamed to the client right away.
#[derive(Default)]
pub struct Aggregator {
    text: String,
    thought: String,
    /// Parts in arrival order of their first chunk: text and thought runs close when a
    /// call starts, so interleaving is kept.
    calls: Vec<PendingCall>,
    index_to_call: std::collections::BTreeMap<usize, usize>,
    finish: Option<String>,
    usage: Option<Usage>,
    model_version: Option<String>,
}

impl Aggregator {
    pub fn push(&mut self, delta: Delta) -> Option<PartialChunk> {
        match delta {
            Delta::Text(t) if t.is_empty() => None,
            Delta::Text(t) => {
                self.text.push_str(&t);
                Some(PartialChunk::Text(t))
            }
            Delta::Thought(t) if t.is_empty() => None,
            Delta::Thought(t) => {
                self.thought.push_str(&t);
                Some(PartialChunk::Thought(t))
            }
            Delta::ToolCallChunk {
                index,
                id,
                name,
                arguments,
            } => {
                let slot = match self.index_to_call.get(&index) {
                    Some(&i) => i,
                    None => {
                        self.calls.push(PendingCall::default());
                        self.index_to_call.insert(index, self.calls.len() - 1);
                        self.calls.len() - 1
                    }
                };
                let call = &mut self.calls[slot];
                if let Some(id) = id.filter(|s| !s.is_empty()) {
                    call.id = Some(id);
                }
                if let Some(name) = name.filter(|s| !s.is_empty()) {
                    call.name.push_str(&name);
                }
                call.arguments.push_str(&arguments);
                None
            }
            Delta::ToolCall { id, name, args } => {
                self.calls.push(PendingCall {
                    signature: None,
                    id,
                    name,
                    arguments: String::new(),
                    whole: Some(args),
                });
                None
            }
            Delta::CallSignature(sig) => {
                if let Some(call) = self.calls.last_mut() {
                    call.signature = Some(sig);
                }
                None
            }
            Delta::Finish(reason) => {
                self.finish = Some(reason);
                None
            }
            Delta::Usage(u) => {
                self.usage = Some(u);
                None
            }
            Delta::ModelVersion(v) => {
                self.model_version.get_or_insert(v);
                None
            }
        }
    }

    /// The aggregated response. Calls without an id get ADK's `adk-<uuid>`; argument text is
    /// parsed strictly, then repaired, and recorded as invalid when neither works.
    pub fn finish(self) -> LlmResponse {
        let mut parts = vec![];
        if !self.thought.is_empty() {
            parts.push(Part {
                text: Some(self.thought),
                thought: Some(true),
                ..Default::default()
            });
        }
        if !self.text.is_empty() {
            parts.push(Part::text(self.text));
        }
        let mut invalid_calls = vec![];
        for call in self.calls {
            let id = call
                .id
                .unwrap_or_else(|| format!("adk-{}", uuid::Uuid::new_v4()));
            let args = match call.whole {
                Some(Value::Object(m)) => m,
                Some(Value::Null) => JsonMap::new(),
                Some(other) => {
                    invalid_calls.push((
                        id.clone(),
                        format!("arguments must be a JSON object, got {other}"),
                    ));
                    JsonMap::new()
                }
                None => match repair::parse_arguments(&call.arguments) {
                    Ok(m) => m,
                    Err(why) => {
                        invalid_calls.push((id.clone(), why));
                        JsonMap::new()
                    }
                },
            };
            parts.push(Part {
                function_call: Some(FunctionCall {
                    id: Some(id),
                    name: call.name,
                    args,
                    extra: JsonMap::new(),
                }),
                thought_signature: call.signature.map(crate::event::Bytes64),
                ..Default::default()
            });
        }
        LlmResponse {
            partial: false,
            content: (!parts.is_empty()).then(|| Content {
                parts,
                role: Some("model".into()),
                extra: JsonMap::new(),
            }),
            finish_reason: self.finish,
            usage: self.usage,
            model_version: self.model_version,
            invalid_calls,
            error_code: None,
            error_message: None,
        }
    }
}

/// Text of a function response or tool result as a JSON string (for providers that take
/// tool results as text).
pub(crate) fn json_text(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_call_chunks_accumulate_by_index() {
        let mut a = Aggregator::default();
        for d in [
            Delta::Text("Checking ".into()),
            Delta::ToolCallChunk {
                index: 0,
                id: Some("call_1".into()),
                name: Some("get_weather".into()),
                arguments: "{\"ci".into(),
            },
            Delta::ToolCallChunk {
                index: 1,
                id: Some("call_2".into()),
                name: Some("get_time".into()),
                arguments: "".into(),
            },
            Delta::ToolCallChunk {
                index: 0,
                id: None,
                name: None,
                arguments: "ty\": \"Paris\"}".into(),
            },
            Delta::ToolCallChunk {
                index: 1,
                id: None,
                name: None,
                arguments: "{\"tz\": \"CET\"".into(),
            },
            Delta::Finish("STOP".into()),
        ] {
            a.push(d);
        }
        let r = a.finish();
        let calls: Vec<_> = r.function_calls().collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id.as_deref(), Some("call_1"));
        assert_eq!(calls[0].args["city"], "Paris");
        // Missing closing brace repaired.
        assert_eq!(calls[1].args["tz"], "CET");
        assert!(r.invalid_calls.is_empty());
        assert_eq!(r.finish_reason.as_deref(), Some("STOP"));
    }

    #[test]
    fn calls_without_ids_get_adk_ids_and_bad_json_is_reported() {
        let mut a = Aggregator::default();
        a.push(Delta::ToolCallChunk {
            index: 0,
            id: None,
            name: Some("f".into()),
            arguments: "not json at all".into(),
        });
        let r = a.finish();
        let call = r.function_calls().next().unwrap();
        assert!(call.id.as_deref().unwrap().starts_with("adk-"));
        assert_eq!(r.invalid_calls.len(), 1);
    }

    #[test]
    fn resolve_guesses_providers() {
        let o = ModelOptions::default();
        assert_eq!(resolve("openai/gpt-4o", &o).unwrap().name(), "gpt-4o");
        assert_eq!(
            resolve("claude-sonnet-4-5", &o).unwrap().name(),
            "claude-sonnet-4-5"
        );
        assert!(resolve("", &o).is_err());
        let bad = ModelOptions {
            base_url: Some("ftp://x".into()),
            ..Default::default()
        };
        assert!(resolve("gpt-4o", &bad).is_err());
    }
}
