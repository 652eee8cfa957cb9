//! Where a model is and how to reach it: the provider a spec names or implies, the base
//! URL, the key and its variable, retries and timeouts. What chat models ([`resolve`]) and
//! embedding models ([`super::embed`]) share.

use super::{anthropic, gemini, http, openai, Model};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

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
/// what chat models and embedding models ([`super::embed`]) share.
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

#[cfg(test)]
mod tests {
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
