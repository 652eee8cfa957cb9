//! What every HTTP model provider shares: one connection-pooled client, retries with
//! backoff before the first byte, HTTP status → [`ModelError`] mapping (a bad API key is a
//! sentence, not a stack trace), and Server-Sent Events parsing with an idle timeout
//! (`eventsource-stream`, a maintained parser; never a hand-rolled line splitter).

use super::{Delta, DeltaStream, Endpoint, ModelError};
use eventsource_stream::Eventsource;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::Duration;

/// Retries on 429, 5xx and connection errors, before any response byte was read.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_retries: u32,
    /// First delay; doubles per attempt, capped at 30 s, or the server's `Retry-After`.
    pub backoff: Duration,
}

/// The process-wide client: pooled keep-alive connections to each provider.
///
/// Redirects are not followed: providers' APIs do not redirect, and reqwest strips only the
/// standard credential headers on a cross-origin redirect, not `x-api-key` or
/// `x-goog-api-key`, so following one could hand the key to another host. A redirect is an
/// error the run reports.
pub fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .user_agent(concat!("agentd/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_else(|_| {
                // Still never following a redirect (see above).
                reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .unwrap_or_default()
            })
    })
}

/// Sends the request built by `build` until it gets a 2xx response, retrying what is worth
/// retrying. `provider` names the service in error messages.
pub async fn send_with_retry(
    provider: &str,
    policy: RetryPolicy,
    timeout: Duration,
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, ModelError> {
    let mut attempt = 0u32;
    loop {
        let result = match tokio::time::timeout(timeout, build().send()).await {
            Err(_) => Err(ModelError {
                code: "MODEL_TIMEOUT",
                message: format!(
                    "{provider} did not start answering within {} s",
                    timeout.as_secs_f64()
                ),
                retryable: true,
                retry_after: None,
            }),
            Ok(Err(e)) => Err(transport_error(provider, &e)),
            Ok(Ok(resp)) if resp.status().is_success() => return Ok(resp),
            Ok(Ok(resp)) => Err(status_error(provider, resp).await),
        };
        let err = match result {
            Ok(r) => return Ok(r),
            Err(e) => e,
        };
        if !err.retryable || attempt >= policy.max_retries {
            if attempt > 0 && err.retryable {
                return Err(ModelError {
                    message: format!("{} (after {} retries)", err.message, attempt),
                    ..err
                });
            }
            return Err(err);
        }
        let backoff = policy
            .backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(Duration::from_secs(30));
        let delay = err
            .retry_after
            .map_or(backoff, |d| d.min(Duration::from_secs(60)));
        tracing::warn!(provider, attempt = attempt + 1, delay_ms = delay.as_millis() as u64, error = %err.message, "model call failed; retrying");
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

fn transport_error(provider: &str, e: &reqwest::Error) -> ModelError {
    let (code, what) = if e.is_timeout() {
        ("MODEL_TIMEOUT", "timed out")
    } else if e.is_connect() {
        ("MODEL_CONNECTION", "could not connect")
    } else {
        ("MODEL_CONNECTION", "request failed")
    };
    let mut source = String::new();
    let mut cur: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = cur {
        source = s.to_string();
        cur = s.source();
    }
    ModelError {
        code,
        message: format!(
            "{provider}: {what}: {}",
            if source.is_empty() {
                e.to_string()
            } else {
                source
            }
        ),
        retryable: true,
        retry_after: None,
    }
}

/// The most of a provider's error body that is read (the message is near the start).
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// A response body as text, reading at most `max` bytes.
async fn bounded_text(mut resp: reqwest::Response, max: usize) -> String {
    let mut buf = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = max - buf.len();
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= max {
            break;
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Maps an error status to a clear error, quoting the provider's own message, except where
/// that message may describe the credentials.
///
/// The error's message becomes the run's error event, which every client of the session
/// reads: on 401 and 403 a provider talks about the key it was sent (OpenAI names its last
/// characters: "Incorrect API key provided: sk-abc...WXYZ"), so the message there is
/// agentd's own sentence and the provider's goes to the server log only. Other statuses
/// keep the provider's message, with anything shaped like a key masked
/// ([`redact_credentials`]).
pub async fn status_error(provider: &str, resp: reqwest::Response) -> ModelError {
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let body = bounded_text(resp, MAX_ERROR_BODY_BYTES).await;
    let mut detail = redact_credentials(&provider_message(&body));
    if matches!(status.as_u16(), 401 | 403) {
        tracing::warn!(
            provider,
            status = status.as_u16(),
            detail = %detail,
            "the model provider refused the credentials"
        );
        detail = "the provider's own message is in agentd's log".into();
    }
    let (code, retryable, what) = match status.as_u16() {
        401 | 403 => ("UNAUTHENTICATED", false, "refused the credentials"),
        404 => (
            "MODEL_NOT_FOUND",
            false,
            "does not know this model or route",
        ),
        408 => ("MODEL_TIMEOUT", true, "timed out"),
        429 => ("RATE_LIMITED", true, "is rate limiting requests"),
        400..=499 => ("MODEL_BAD_REQUEST", false, "rejected the request"),
        // Not followed (see `client`), and asking again gets the same redirect.
        300..=399 => (
            "MODEL_REDIRECTED",
            false,
            "answered with a redirect, not followed",
        ),
        _ => ("MODEL_UNAVAILABLE", true, "failed"),
    };
    ModelError {
        code,
        message: format!("{provider} {what} (HTTP {}): {detail}", status.as_u16()),
        retryable,
        retry_after,
    }
}

/// A refusal of the credentials, saying which variable to set: none was sent (the variable is
/// unset), or the one sent was refused.
pub fn name_the_key(mut e: ModelError, ep: &Endpoint) -> ModelError {
    if e.code != "UNAUTHENTICATED" {
        return e;
    }
    let head = e.message.split(':').next().unwrap_or_default().to_string();
    e.message = match &ep.api_key {
        None => format!(
            "{head}: no API key was sent; set {} (or point the model's base URL at a server that \
             needs none)",
            ep.key_env
        ),
        Some(_) => format!("{head}: check the key in {}", ep.key_env),
    };
    e
}

/// The human part of a provider's error body (`{"error":{"message":…}}` and friends).
pub fn provider_message(body: &str) -> String {
    let from_json = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let e = v.get("error").unwrap_or(&v);
            e.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
                .or_else(|| e.as_str().map(str::to_string))
        });
    let msg = from_json.unwrap_or_else(|| body.trim().to_string());
    let msg: String = msg.chars().take(500).collect();
    if msg.is_empty() {
        "no details".into()
    } else {
        msg
    }
}

/// Prefixes of API keys and tokens (OpenAI and most OpenAI-compatible servers, Anthropic,
/// Google, Groq, xAI, Hugging Face, agentd's own keys, JWTs), which also start the masked
/// form some providers quote (`sk-abc...WXYZ`).
const KEY_PREFIXES: &[&str] = &[
    "sk-", "sk_", "AIza", "gsk_", "xai-", "hf_", "agentd_", "eyJ",
];

/// `text` with every word that looks like a credential (one that starts with a key prefix,
/// or follows `Bearer`) replaced by `[redacted]`: what a provider quotes back must reach no
/// event, error or log line, masked or not. A word is a run of letters, digits and
/// `-_.*~+/` (the characters of keys, of their masked forms and of JWTs), so a key inside
/// `key=sk-…` or `"sk-…"` is found too.
pub fn redact_credentials(text: &str) -> String {
    let in_word = |c: char| c.is_alphanumeric() || "-_.*~+/".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut after_bearer = false;
    let mut rest = text;
    while !rest.is_empty() {
        let gap = rest.find(in_word).unwrap_or(rest.len());
        out.push_str(&rest[..gap]);
        rest = &rest[gap..];
        let len = rest.find(|c: char| !in_word(c)).unwrap_or(rest.len());
        let (token, tail) = rest.split_at(len);
        rest = tail;
        // A sentence's full stop is not part of the key.
        let word = token.trim_end_matches('.');
        let secret = (after_bearer && !word.is_empty())
            || KEY_PREFIXES
                .iter()
                .any(|p| word.len() > p.len() && word.starts_with(p));
        after_bearer = word.eq_ignore_ascii_case("bearer");
        if secret {
            out.push_str("[redacted]");
            out.push_str(&token[word.len()..]);
        } else {
            out.push_str(token);
        }
    }
    out
}

/// One SSE message of a response body.
pub struct SseMessage {
    pub event: String,
    pub data: String,
}

/// The response body as SSE messages; a stream silent for `idle` ends with a timeout error.
pub fn sse_messages(
    provider: &'static str,
    resp: reqwest::Response,
    idle: Duration,
) -> impl Stream<Item = Result<SseMessage, ModelError>> + Send + 'static {
    let events = resp.bytes_stream().eventsource();
    futures::stream::unfold(Some(Box::pin(events)), move |state| async move {
        let mut events = state?;
        match tokio::time::timeout(idle, events.next()).await {
            Err(_) => Some((
                Err(ModelError::new(
                    "MODEL_TIMEOUT",
                    format!(
                        "{provider} sent nothing for {} s mid-stream",
                        idle.as_secs_f64()
                    ),
                )),
                None,
            )),
            Ok(None) => None,
            Ok(Some(Ok(ev))) => Some((
                Ok(SseMessage {
                    event: ev.event,
                    data: ev.data,
                }),
                Some(events),
            )),
            Ok(Some(Err(e))) => Some((
                Err(ModelError::new(
                    "MODEL_CONNECTION",
                    format!("{provider} stream broke: {e}"),
                )),
                None,
            )),
        }
    })
}

/// A provider's stream format: each SSE message's JSON data becomes deltas.
pub trait StreamDecoder: Send + 'static {
    /// The deltas of one message (`event` is its SSE event name, `data` its parsed JSON).
    fn decode(&mut self, event: &str, data: &serde_json::Value) -> Result<Vec<Delta>, ModelError>;

    /// True once the provider signalled a proper end; a body that ends before is an error,
    /// not a short answer.
    fn finished(&self) -> bool;

    /// What was missing when the body ended early (`"the message was complete"`).
    fn expected_end(&self) -> &'static str;

    /// Non-JSON messages that are skipped rather than failing the stream.
    fn skip(&self, event: &str, data: &str) -> bool {
        event == "ping" || data.trim().is_empty()
    }

    /// A message that ends the stream successfully (OpenAI's `[DONE]`).
    fn is_end(&self, _data: &str) -> bool {
        false
    }
}

/// Feeds SSE messages through `decoder`: deltas in order, the first error ends the stream.
pub fn decode_stream(
    provider: &'static str,
    messages: BoxStream<'static, Result<SseMessage, ModelError>>,
    decoder: impl StreamDecoder,
) -> DeltaStream {
    struct Run<D> {
        messages: BoxStream<'static, Result<SseMessage, ModelError>>,
        decoder: D,
        pending: VecDeque<Delta>,
        done: bool,
    }
    let run = Run {
        messages,
        decoder,
        pending: VecDeque::new(),
        done: false,
    };
    futures::stream::unfold(run, move |mut run| async move {
        loop {
            if let Some(d) = run.pending.pop_front() {
                return Some((Ok(d), run));
            }
            if run.done {
                return None;
            }
            let error = match run.messages.next().await {
                None if run.decoder.finished() => return None,
                None => ModelError::new(
                    "MODEL_CONNECTION",
                    format!(
                        "{provider} stream ended before {}",
                        run.decoder.expected_end()
                    ),
                ),
                Some(Err(e)) => e,
                Some(Ok(m)) if run.decoder.is_end(&m.data) => return None,
                Some(Ok(m)) if run.decoder.skip(&m.event, &m.data) => continue,
                Some(Ok(m)) => match serde_json::from_str::<serde_json::Value>(&m.data) {
                    Err(e) => ModelError::protocol(format!(
                        "{provider} sent a message that is not JSON ({e})"
                    )),
                    Ok(value) => match run.decoder.decode(&m.event, &value) {
                        Ok(ds) => {
                            run.pending.extend(ds);
                            continue;
                        }
                        Err(e) => e,
                    },
                },
            };
            run.done = true;
            return Some((Err(error), run));
        }
    })
    .boxed()
}

/// A stream of self-contained chunks (OpenAI, Gemini): each message maps to deltas by
/// `chunk`, and the stream is complete once a finish reason arrived (or `end_marker`).
pub struct ChunkDecoder {
    pub chunk: fn(&serde_json::Value) -> Result<Vec<Delta>, ModelError>,
    pub expected_end: &'static str,
    pub end_marker: Option<&'static str>,
    pub finished: bool,
}

impl StreamDecoder for ChunkDecoder {
    fn decode(&mut self, _event: &str, data: &serde_json::Value) -> Result<Vec<Delta>, ModelError> {
        let ds = (self.chunk)(data)?;
        self.finished |= ds.iter().any(|d| matches!(d, Delta::Finish(_)));
        Ok(ds)
    }

    fn finished(&self) -> bool {
        self.finished
    }

    fn expected_end(&self) -> &'static str {
        self.expected_end
    }

    fn is_end(&self, data: &str) -> bool {
        self.end_marker.is_some_and(|m| data.trim() == m)
    }
}

/// How a provider takes its API key.
#[derive(Debug, Clone, Copy)]
pub enum Auth {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// The key in this header.
    Header(&'static str),
}

/// POSTs `body` to `url` for a streamed answer (retrying before the first byte, see
/// [`send_with_retry`]) and decodes the SSE body with `decoder`.
pub async fn post_stream(
    provider: &'static str,
    ep: &Endpoint,
    url: &str,
    body: &serde_json::Value,
    auth: Auth,
    extra_headers: &[(&str, &str)],
    decoder: impl StreamDecoder,
) -> Result<DeltaStream, ModelError> {
    let mut headers = vec![("accept", "text/event-stream")];
    headers.extend_from_slice(extra_headers);
    let resp = post(provider, ep, url, body, auth, &headers).await?;
    Ok(decode_stream(
        provider,
        sse_messages(provider, resp, ep.idle_timeout).boxed(),
        decoder,
    ))
}

/// POSTs `body` to `url` with the endpoint's key and headers, retrying before the first byte
/// (see [`send_with_retry`]): the response of a 2xx status.
pub async fn post(
    provider: &'static str,
    ep: &Endpoint,
    url: &str,
    body: &serde_json::Value,
    auth: Auth,
    extra_headers: &[(&str, &str)],
) -> Result<reqwest::Response, ModelError> {
    send_with_retry(provider, ep.retry, ep.timeout, || {
        let mut rb = client().post(url).json(body);
        for (k, v) in extra_headers {
            rb = rb.header(*k, *v);
        }
        if let Some(key) = &ep.api_key {
            rb = match auth {
                Auth::Bearer => rb.bearer_auth(key),
                Auth::Header(name) => rb.header(name, key),
            };
        }
        for (k, v) in &ep.headers {
            rb = rb.header(k, v);
        }
        // The model call's span continues in the provider's traces.
        let mut trace = reqwest::header::HeaderMap::new();
        crate::telemetry::inject_trace(&mut trace);
        rb.headers(trace)
    })
    .await
    .map_err(|e| name_the_key(e, ep))
}

/// A whole JSON response body of at most `max` bytes: a longer or malformed body is an
/// error naming the provider, never a partial value.
pub async fn bounded_json<T: serde::de::DeserializeOwned>(
    provider: &str,
    mut resp: reqwest::Response,
    max: usize,
    timeout: Duration,
) -> Result<T, ModelError> {
    let read = async {
        let mut buf = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| transport_error(provider, &e))?
        {
            if buf.len() + chunk.len() > max {
                return Err(ModelError {
                    code: "MODEL_PROTOCOL",
                    message: format!("{provider}: the response is larger than {max} bytes"),
                    retryable: false,
                    retry_after: None,
                });
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    };
    let buf = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| ModelError {
            code: "MODEL_TIMEOUT",
            message: format!(
                "{provider}: the response did not arrive within {} s",
                timeout.as_secs_f64()
            ),
            retryable: true,
            retry_after: None,
        })??;
    serde_json::from_slice(&buf).map_err(|e| ModelError {
        code: "MODEL_PROTOCOL",
        message: format!("{provider}: the response is not what was expected: {e}"),
        retryable: false,
        retry_after: None,
    })
}

#[cfg(test)]
mod tests {
    use super::redact_credentials;

    #[test]
    fn key_shaped_words_are_redacted() {
        assert_eq!(
            redact_credentials("Incorrect API key provided: sk-abc...WXYZ. You can find it."),
            "Incorrect API key provided: [redacted]. You can find it."
        );
        assert_eq!(
            redact_credentials(r#"bad key="AIzaSyExample", header Bearer abc.def-ghi"#),
            r#"bad key="[redacted]", header Bearer [redacted]"#
        );
        assert_eq!(redact_credentials("sk-*** and sk-"), "[redacted] and sk-");
        // Ordinary messages, model names and URLs are left alone.
        let plain = "API key not valid. Please pass a valid API key. Model \
                     claude-3-5-sonnet-20241022 at https://api.example/v1/tasks-1: over 8192 tokens";
        assert_eq!(redact_credentials(plain), plain);
        assert_eq!(redact_credentials(""), "");
    }
}
