//! The Anthropic and Gemini adapters against recorded wire-format streams.
//!
//! Each fixture under `tests/fixtures/model_wire/` is a provider's streamed response body
//! exactly as it comes over the wire (Anthropic's typed `event:` + `data:` SSE, Gemini's
//! `alt=sse` `data:` records). A tiny axum server on 127.0.0.1:0 serves it, cut into small
//! pieces that split lines and events, and the test drives the real code path:
//! `model::resolve` → `Model::stream` (reqwest, retries, eventsource parsing) → the provider
//! mapping → `Aggregator`. Request bodies are checked as the server received them.

use agentd::event::{Content, FunctionCall, FunctionResponse, Part};
use agentd::model::{
    self, http::RetryPolicy, Aggregator, Endpoint, GenerateConfig, LlmRequest, LlmResponse, Model,
    ModelError, ModelOptions, PartialChunk, ToolDeclaration, Usage,
};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "../common/mod.rs"]
mod common;

mod anthropic_adapter;
mod gemini_adapter;
mod prompt_cache;
mod usage_sums;

const ANTHROPIC_TEXT_AND_TOOL: &str =
    include_str!("../fixtures/model_wire/anthropic_text_and_tool.sse");
const ANTHROPIC_THINKING_PARALLEL: &str =
    include_str!("../fixtures/model_wire/anthropic_thinking_parallel_tools.sse");
const ANTHROPIC_ERROR: &str = include_str!("../fixtures/model_wire/anthropic_error.sse");
const ANTHROPIC_TRUNCATED: &str = include_str!("../fixtures/model_wire/anthropic_truncated.sse");
const GEMINI_TEXT_AND_TOOL: &str = include_str!("../fixtures/model_wire/gemini_text_and_tool.sse");
const GEMINI_PARALLEL: &str = include_str!("../fixtures/model_wire/gemini_parallel_calls.sse");
const GEMINI_ERROR: &str = include_str!("../fixtures/model_wire/gemini_error.sse");
const GEMINI_SAFETY: &str = include_str!("../fixtures/model_wire/gemini_safety.sse");

/// Upper bound on one model call; only there so a broken adapter fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------
// The fake provider
// ---------------------------------------------------------------------------------------

/// One canned HTTP response.
struct Reply {
    status: u16,
    content_type: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: String,
}

impl Reply {
    fn sse(body: &str) -> Reply {
        Reply {
            status: 200,
            content_type: "text/event-stream",
            headers: vec![],
            body: body.to_string(),
        }
    }

    fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            headers: vec![],
            body: body.to_string(),
        }
    }
}

/// A request as the fake provider received it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Value,
}

#[derive(Default)]
struct Provider {
    replies: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<Seen>>,
}

impl Provider {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Bytes per body piece: small and odd, so lines and events straddle reads.
const PIECE: usize = 23;

async fn answer(
    State(p): State<Arc<Provider>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    p.seen.lock().unwrap().push(Seen {
        method,
        uri,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    let reply = p.replies.lock().unwrap().pop_front();
    let Some(reply) = reply else {
        return Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Body::from("the test server ran out of replies"))
            .unwrap();
    };
    let bytes = reply.body.into_bytes();
    let pieces: Vec<Result<Bytes, std::convert::Infallible>> = bytes
        .chunks(PIECE)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    // A short pause between pieces so they leave as separate writes.
    let stream = futures::stream::iter(pieces).then(|piece| async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        piece
    });
    let mut rb = Response::builder()
        .status(reply.status)
        .header("content-type", reply.content_type);
    for (k, v) in reply.headers {
        rb = rb.header(k, v);
    }
    rb.body(Body::from_stream(stream)).unwrap()
}

/// Starts a fake provider answering with `replies`, in order; returns its origin.
async fn provider(replies: Vec<Reply>) -> (String, Arc<Provider>) {
    let state = Arc::new(Provider {
        replies: Mutex::new(replies.into()),
        seen: Mutex::default(),
    });
    let app = axum::Router::new()
        .fallback(answer)
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}"), state)
}

fn options(base_url: String) -> ModelOptions {
    ModelOptions {
        base_url: Some(base_url),
        // Never pick up a developer's real key from the environment.
        api_key_env: Some("AGENTD_TEST_NO_SUCH_KEY_VARIABLE".into()),
        max_retries: Some(2),
        retry_backoff_ms: Some(5),
        timeout_secs: Some(10),
        idle_timeout_secs: Some(10),
        ..Default::default()
    }
}

fn endpoint(base_url: String, key: &str) -> Endpoint {
    Endpoint {
        base_url,
        api_key: Some(key.to_string()),
        key_env: "TEST_KEY".into(),
        keyless_default: false,
        headers: vec![("x-extra".into(), "yes".into())],
        retry: RetryPolicy {
            max_retries: 0,
            backoff: Duration::from_millis(5),
        },
        timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
    }
}

/// What a call produced: the streamed partial chunks, the aggregate of every delta that
/// arrived, and the error that ended the stream, if one did.
struct Outcome {
    partials: Vec<PartialChunk>,
    response: LlmResponse,
    error: Option<ModelError>,
}

async fn call(model: &dyn Model, req: &LlmRequest) -> Result<Outcome, ModelError> {
    let mut stream = tokio::time::timeout(PATIENCE, model.stream(req))
        .await
        .expect("the call started in time")?;
    let mut agg = Aggregator::default();
    let mut partials = vec![];
    let mut error = None;
    while let Some(item) = tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("the stream kept moving")
    {
        match item {
            Ok(delta) => partials.extend(agg.push(delta)),
            Err(e) => {
                assert!(error.is_none(), "the stream goes on after an error: {e}");
                error = Some(e);
            }
        }
    }
    Ok(Outcome {
        partials,
        response: agg.finish(),
        error,
    })
}

fn text_of(r: &LlmResponse, thought: bool) -> String {
    r.content
        .iter()
        .flat_map(|c| c.parts.iter())
        .filter(|p| (p.thought == Some(true)) == thought)
        .filter_map(|p| p.text.clone())
        .collect()
}

/// A conversation exercising every mapping: system, merged user turns, a model turn with a
/// thought, text and a call, the function response, images, tools and generation settings.
fn conversation() -> LlmRequest {
    LlmRequest {
        model: String::new(),
        system_instruction: Some("You are a weather assistant.".into()),
        contents: vec![
            Content::text("user", "Hi!"),
            Content::text("user", "What's the weather in Paris?"),
            Content {
                parts: vec![
                    Part {
                        text: Some("I need the weather tool.".into()),
                        thought: Some(true),
                        ..Default::default()
                    },
                    Part::text("Checking."),
                    Part {
                        function_call: Some(FunctionCall {
                            id: Some("toolu_01PrevCall".into()),
                            name: "get_weather".into(),
                            args: serde_json::from_value(json!({"city": "Paris"})).unwrap(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
                role: Some("model".into()),
                ..Default::default()
            },
            Content {
                parts: vec![Part {
                    function_response: Some(FunctionResponse {
                        id: Some("toolu_01PrevCall".into()),
                        name: "get_weather".into(),
                        response: serde_json::from_value(json!({"temp_c": 21, "sky": "clear"}))
                            .unwrap(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                role: Some("user".into()),
                ..Default::default()
            },
            Content::text("user", "And in Tokyo, in Celsius?"),
        ],
        tools: vec![
            ToolDeclaration {
                name: "get_weather".into(),
                description: "Current weather for a city.".into(),
                parameters: Some(json!({
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "city": {"type": "string", "description": "City name"},
                        "unit": {"anyOf": [{"$ref": "#/$defs/Unit"}, {"type": "null"}]}
                    },
                    "required": ["city"],
                    "$defs": {"Unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}
                })),
            },
            ToolDeclaration {
                name: "get_time".into(),
                description: "The current time.".into(),
                parameters: None,
            },
        ],
        config: GenerateConfig {
            temperature: Some(0.3),
            top_p: None,
            max_output_tokens: Some(1024),
            stop_sequences: vec!["###".into()],
            seed: Some(11),
        },
        cache: None,
    }
}
