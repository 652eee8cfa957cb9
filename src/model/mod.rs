//! Models: the streaming [`Model`] trait, the provider-neutral request and response types,
//! and the providers (OpenAI-compatible Chat Completions, Anthropic Messages, Google Gemini).
//!
//! A provider turns its wire stream into [`Delta`]s and nothing else; [`Aggregator`] (shared
//! by every provider) turns deltas into the text shown to the client as it streams and into
//! the one aggregated [`LlmResponse`] the LLM agent commits. That keeps the tricky parts
//! (tool-call argument accumulation, JSON repair, finish reasons) in one tested place.
//!
//! One cohesive thing, past 600 lines: the types every provider shares and the aggregator
//! that is their single tested path; the last part of the file is its unit tests.

pub mod anthropic;
pub mod embed;
pub mod gemini;
pub mod http;
pub mod openai;
pub mod repair;
pub mod trace;

use crate::event::{Content, FunctionCall, JsonMap, Part};
use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
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

/// Which wire protocol a model speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// OpenAI-compatible Chat Completions (OpenAI, Ollama, vLLM, llama.cpp, LiteLLM, …).
    Openai,
    Anthropic,
    Gemini,
}

/// Where and how to reach a model (`model_options` in an agent's YAML; every field optional).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelOptions {
    /// Overrides the provider guessed from the model name.
    #[serde(default)]
    pub provider: Option<Provider>,
    /// API base URL (default: the provider's, or `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL` /
    /// `GEMINI_BASE_URL`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key (default: `OPENAI_API_KEY`,
    /// `ANTHROPIC_API_KEY`, `GEMINI_API_KEY` then `GOOGLE_API_KEY`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Seconds to wait for the response to start (default 60).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Seconds a started stream may stay silent (default 120).
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    /// Retries on 429/5xx/connection errors before the first byte (default 3).
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// First retry delay in milliseconds; doubles each time (default 500).
    #[serde(default)]
    pub retry_backoff_ms: Option<u64>,
    /// Extra request headers.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
}

/// Resolved connection settings shared by the providers. Its `Debug` shows neither the API
/// key nor header values (they may carry credentials).
#[derive(Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub api_key: Option<String>,
    /// Where the key comes from (`OPENAI_API_KEY`, or the variable `api_key_env` names): what
    /// a refusal of the credentials tells the operator to set.
    pub key_env: String,
    /// No key, and the provider's own service (not a base URL of the operator's): every call
    /// would be refused.
    pub keyless_default: bool,
    pub headers: Vec<(String, String)>,
    pub retry: http::RetryPolicy,
    pub timeout: Duration,
    pub idle_timeout: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(k, _)| (k.as_str(), "<redacted>"))
                    .collect::<Vec<_>>(),
            )
            .field("retry", &self.retry)
            .field("timeout", &self.timeout)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

#[cfg(test)]
mod endpoint_tests {
    #[test]
    fn a_refused_key_names_the_variable_to_set() {
        let refused = || crate::model::ModelError {
            code: "UNAUTHENTICATED",
            message: "openai refused the credentials (HTTP 401): see the log".into(),
            retryable: false,
            retry_after: None,
        };
        let unset = super::Endpoint {
            base_url: "http://127.0.0.1:9".into(),
            api_key: None,
            key_env: "AGENTD_TEST_NEVER_SET_KEY (model_options.api_key_env)".into(),
            keyless_default: false,
            headers: vec![],
            retry: crate::model::http::RetryPolicy {
                max_retries: 0,
                backoff: std::time::Duration::ZERO,
            },
            timeout: std::time::Duration::from_secs(1),
            idle_timeout: std::time::Duration::from_secs(1),
        };
        let msg = crate::model::http::name_the_key(refused(), &unset).message;
        assert!(
            msg.starts_with("openai refused the credentials (HTTP 401): no API key was sent")
                && msg.contains("set AGENTD_TEST_NEVER_SET_KEY"),
            "{msg}"
        );
        let sent = super::Endpoint {
            api_key: Some("sk-x".into()),
            key_env: "OPENAI_API_KEY".into(),
            ..unset
        };
        let msg = crate::model::http::name_the_key(refused(), &sent).message;
        assert!(msg.ends_with("check the key in OPENAI_API_KEY"), "{msg}");
        assert!(!msg.contains("sk-x"), "{msg}");
    }

    #[test]
    fn an_endpoint_debug_hides_its_key_and_header_values() {
        let ep = super::Endpoint {
            base_url: "https://api.example".into(),
            api_key: Some("sk-very-secret".into()),
            key_env: "OPENAI_API_KEY".into(),
            keyless_default: false,
            headers: vec![("x-auth".into(), "token-secret".into())],
            retry: crate::model::http::RetryPolicy {
                max_retries: 0,
                backoff: std::time::Duration::ZERO,
            },
            timeout: std::time::Duration::from_secs(1),
            idle_timeout: std::time::Duration::from_secs(1),
        };
        let text = format!("{ep:?}");
        assert!(
            !text.contains("very-secret") && !text.contains("token-secret"),
            "{text}"
        );
        assert!(text.contains("x-auth") && text.contains("api.example"));
    }
}

/// Builds the model for `spec`: `provider/model` (`openai/gpt-4o-mini`,
/// `anthropic/claude-sonnet-4-5`, `gemini/gemini-2.5-flash`) or a bare name, whose provider
/// is guessed (`claude-*` Anthropic, `gemini-*` Gemini, anything else OpenAI-compatible).
/// A missing API key is not an error here (local servers need none); the provider's 401
/// becomes a clear error event at run time.
pub fn resolve(spec: &str, options: &ModelOptions) -> Result<Arc<dyn Model>, String> {
    let (provider, name, endpoint) = endpoint(spec, options)?;
    Ok(match provider {
        Provider::Openai => Arc::new(openai::OpenAiModel::new(name, endpoint)),
        Provider::Anthropic => Arc::new(anthropic::AnthropicModel::new(name, endpoint)),
        Provider::Gemini => Arc::new(gemini::GeminiModel::new(name, endpoint)),
    })
}

/// The provider, the provider's model name and the endpoint for `spec` (see [`resolve`]):
/// what chat models and embedding models ([`embed`]) share.
pub fn endpoint<'a>(
    spec: &'a str,
    options: &ModelOptions,
) -> Result<(Provider, &'a str, Endpoint), String> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err("the model name is empty".into());
    }
    let (prefix, name) = match spec.split_once('/') {
        Some((p @ ("openai" | "anthropic" | "gemini" | "google"), rest)) => (Some(p), rest),
        _ => (None, spec),
    };
    let provider = options.provider.unwrap_or(match prefix {
        Some("openai") => Provider::Openai,
        Some("anthropic") => Provider::Anthropic,
        Some("gemini" | "google") => Provider::Gemini,
        _ if name.starts_with("claude") => Provider::Anthropic,
        _ if name.starts_with("gemini") => Provider::Gemini,
        _ => Provider::Openai,
    });
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (default_base, base_env, key_envs) = provider_env(provider);
    let base_url = options
        .base_url
        .clone()
        .or_else(|| env(base_env))
        .unwrap_or_else(|| default_base.to_string())
        .trim_end_matches('/')
        .to_string();
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        return Err(format!(
            "model_options.base_url {base_url:?} must start with http:// or https://"
        ));
    }
    let api_key = match &options.api_key_env {
        Some(var) => env(var),
        None => key_envs.iter().find_map(|k| env(k)),
    };
    let key_env = match &options.api_key_env {
        Some(var) => format!("{var} (model_options.api_key_env)"),
        None => key_envs.join(" or "),
    };
    let keyless_default = api_key.is_none() && base_url == default_base;
    let endpoint = Endpoint {
        base_url,
        api_key,
        key_env,
        keyless_default,
        headers: options
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        retry: http::RetryPolicy {
            max_retries: options.max_retries.unwrap_or(3),
            backoff: Duration::from_millis(options.retry_backoff_ms.unwrap_or(500)),
        },
        timeout: Duration::from_secs(options.timeout_secs.unwrap_or(60)),
        idle_timeout: Duration::from_secs(options.idle_timeout_secs.unwrap_or(120)),
    };
    Ok((provider, name, endpoint))
}

/// A provider's own service, the variable that points elsewhere, and the variables its key is
/// read from (the first set wins).
fn provider_env(provider: Provider) -> (&'static str, &'static str, &'static [&'static str]) {
    match provider {
        Provider::Openai => (
            "https://api.openai.com/v1",
            "OPENAI_BASE_URL",
            &["OPENAI_API_KEY"],
        ),
        Provider::Anthropic => (
            "https://api.anthropic.com/v1",
            "ANTHROPIC_BASE_URL",
            &["ANTHROPIC_API_KEY"],
        ),
        Provider::Gemini => (
            "https://generativelanguage.googleapis.com/v1beta",
            "GEMINI_BASE_URL",
            &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        ),
    }
}

/// Every environment variable the providers read (docs/configuration.md lists them).
pub fn provider_env_vars() -> Vec<&'static str> {
    [Provider::Openai, Provider::Anthropic, Provider::Gemini]
        .into_iter()
        .flat_map(|p| {
            let (_, base, keys) = provider_env(p);
            std::iter::once(base).chain(keys.iter().copied())
        })
        .collect()
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
