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
    self, anthropic, gemini, http::RetryPolicy, Aggregator, Endpoint, GenerateConfig, LlmRequest,
    LlmResponse, Model, ModelError, ModelOptions, PartialChunk, ToolDeclaration, Usage,
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

const ANTHROPIC_TEXT_AND_TOOL: &str =
    include_str!("fixtures/model_wire/anthropic_text_and_tool.sse");
const ANTHROPIC_THINKING_PARALLEL: &str =
    include_str!("fixtures/model_wire/anthropic_thinking_parallel_tools.sse");
const ANTHROPIC_ERROR: &str = include_str!("fixtures/model_wire/anthropic_error.sse");
const ANTHROPIC_TRUNCATED: &str = include_str!("fixtures/model_wire/anthropic_truncated.sse");
const GEMINI_TEXT_AND_TOOL: &str = include_str!("fixtures/model_wire/gemini_text_and_tool.sse");
const GEMINI_PARALLEL: &str = include_str!("fixtures/model_wire/gemini_parallel_calls.sse");
const GEMINI_ERROR: &str = include_str!("fixtures/model_wire/gemini_error.sse");
const GEMINI_SAFETY: &str = include_str!("fixtures/model_wire/gemini_safety.sse");

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
    }
}

// ---------------------------------------------------------------------------------------
// Anthropic
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn anthropic_streams_text_and_a_tool_call() {
    let (origin, server) = provider(vec![Reply::sse(ANTHROPIC_TEXT_AND_TOOL)]).await;
    let m = model::resolve("anthropic/claude-x", &options(format!("{origin}/v1"))).unwrap();
    let req = conversation();
    let out = call(m.as_ref(), &req).await.unwrap();
    assert!(out.error.is_none(), "{:?}", out.error);
    let r = &out.response;
    assert_eq!(
        text_of(r, false),
        "I'll look up the current weather in Paris for you."
    );
    assert_eq!(
        out.partials,
        vec![
            PartialChunk::Text("I'll look up".into()),
            PartialChunk::Text(" the current weather in Paris for you.".into()),
        ]
    );
    let calls: Vec<_> = r.function_calls().collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].id.as_deref(),
        Some("toolu_01Kq2m8XbYc4vNf7HdRt5sWz")
    );
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(
        Value::Object(calls[0].args.clone()),
        json!({"city": "Paris, FR", "unit": "celsius"})
    );
    assert!(r.invalid_calls.is_empty());
    assert_eq!(r.finish_reason.as_deref(), Some("STOP"));
    assert_eq!(
        r.usage,
        Some(Usage {
            prompt_tokens: 472,
            candidates_tokens: 89,
            total_tokens: 561,
            thoughts_tokens: None
        })
    );
    assert_eq!(
        r.model_version.as_deref(),
        Some("claude-sonnet-4-5-20250929")
    );

    // The request as it went over the wire.
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, Method::POST);
    assert_eq!(seen[0].uri.path(), "/v1/messages");
    assert_eq!(seen[0].headers["anthropic-version"], "2023-06-01");
    assert!(
        seen[0].headers.get("x-api-key").is_none(),
        "no key configured"
    );
    let body = &seen[0].body;
    assert_eq!(body, &anthropic::request_body("claude-x", &req));
    assert_eq!(body["model"], "claude-x");
    assert_eq!(body["system"], "You are a weather assistant.");
    assert_eq!(body["max_tokens"], 1024);
    assert_eq!(body["temperature"], 0.3);
    assert_eq!(body["stop_sequences"], json!(["###"]));
    assert_eq!(body["stream"], true);
    assert!(body.get("top_p").is_none() && body.get("seed").is_none());
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "Hi!"},
                {"type": "text", "text": "What's the weather in Paris?"}
            ]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01PrevCall", "name": "get_weather",
                 "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01PrevCall",
                 "content": "{\"sky\":\"clear\",\"temp_c\":21}"},
                {"type": "text", "text": "And in Tokyo, in Celsius?"}
            ]}
        ])
    );
    let tools = body["tools"].as_array().unwrap();
    assert_eq!(tools[0]["name"], "get_weather");
    assert_eq!(tools[0]["description"], "Current weather for a city.");
    // Anthropic takes full JSON schema: passed through untouched.
    assert_eq!(
        tools[0]["input_schema"],
        req.tools[0].parameters.clone().unwrap()
    );
    assert_eq!(
        tools[1]["input_schema"],
        json!({"type": "object", "properties": {}})
    );
}

#[tokio::test]
async fn anthropic_streams_thinking_and_parallel_calls_with_the_api_key() {
    let (origin, server) = provider(vec![Reply::sse(ANTHROPIC_THINKING_PARALLEL)]).await;
    let m = anthropic::AnthropicModel::new(
        "claude-opus-4-1",
        endpoint(format!("{origin}/v1"), "sk-ant-test"),
    );
    let out = call(&m, &conversation()).await.unwrap();
    assert!(out.error.is_none(), "{:?}", out.error);
    let r = &out.response;
    assert_eq!(
        text_of(r, true),
        "The user wants the time and the weather. Both tools can run at once."
    );
    assert_eq!(text_of(r, false), "Checking both.");
    assert_eq!(
        out.partials[0],
        PartialChunk::Thought("The user wants the time and the weather.".into())
    );
    let calls: Vec<_> = r.function_calls().collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[0].id.as_deref(),
        Some("toolu_01A9sD3fG5hJ7kL1zX2cV4bN")
    );
    assert_eq!(calls[0].name, "get_time");
    assert!(calls[0].args.is_empty());
    assert_eq!(
        calls[1].id.as_deref(),
        Some("toolu_01Q8wE6rT4yU2iO0pA1sD3fG")
    );
    assert_eq!(calls[1].name, "get_weather");
    assert_eq!(calls[1].args["city"], "Tokyo");
    assert_eq!(r.finish_reason.as_deref(), Some("STOP"));
    // Cached prompt tokens count as prompt tokens.
    assert_eq!(
        r.usage,
        Some(Usage {
            prompt_tokens: 1021 + 2048,
            candidates_tokens: 131,
            total_tokens: 1021 + 2048 + 131,
            thoughts_tokens: None
        })
    );
    assert_eq!(r.model_version.as_deref(), Some("claude-opus-4-1-20250805"));
    let seen = server.seen();
    assert_eq!(seen[0].headers["x-api-key"], "sk-ant-test");
    assert!(seen[0].headers.get("authorization").is_none());
    assert_eq!(seen[0].headers["x-extra"], "yes");
    assert_eq!(seen[0].body["model"], "claude-opus-4-1");
}

#[tokio::test]
async fn anthropic_error_event_mid_stream_is_a_clear_model_error() {
    let (origin, _server) = provider(vec![Reply::sse(ANTHROPIC_ERROR)]).await;
    let m = model::resolve("anthropic/claude-x", &options(format!("{origin}/v1"))).unwrap();
    let out = call(m.as_ref(), &conversation()).await.unwrap();
    assert_eq!(out.partials, vec![PartialChunk::Text("Once upon".into())]);
    let e = out
        .error
        .expect("the error event ends the stream with an error");
    assert_eq!(e.code, "MODEL_UNAVAILABLE");
    assert_eq!(
        e.message,
        "the Anthropic API reported an error mid-stream (overloaded_error): Overloaded"
    );
}

#[tokio::test]
async fn anthropic_body_cut_short_is_an_error_not_a_short_answer() {
    let (origin, _server) = provider(vec![Reply::sse(ANTHROPIC_TRUNCATED)]).await;
    let m = model::resolve("anthropic/claude-x", &options(format!("{origin}/v1"))).unwrap();
    let out = call(m.as_ref(), &conversation()).await.unwrap();
    assert_eq!(out.partials, vec![PartialChunk::Text("Half a sen".into())]);
    let e = out.error.expect("a truncated stream is reported");
    assert_eq!(e.code, "MODEL_CONNECTION");
    assert!(e.message.contains("ended before"), "{}", e.message);
}

/// A provider's redirect is not followed: reqwest strips only the standard credential headers
/// on a cross-origin redirect, so `x-api-key` (Anthropic) or `x-goog-api-key` (Gemini) would
/// travel to whatever host the redirect names. The call fails instead, and the other host
/// hears nothing.
#[tokio::test]
async fn a_provider_redirect_is_not_followed() {
    let (elsewhere, other) = provider(vec![Reply::sse(ANTHROPIC_TEXT_AND_TOOL)]).await;
    let location: &'static str = Box::leak(format!("{elsewhere}/v1/messages").into_boxed_str());
    let (origin, server) = provider(vec![Reply {
        status: 307,
        content_type: "text/plain",
        headers: vec![("location", location)],
        body: String::new(),
    }])
    .await;
    let mut opts = options(format!("{origin}/v1"));
    opts.headers
        .insert("x-api-key".into(), "sk-ant-the-real-key".into());
    let m = model::resolve("anthropic/claude-x", &opts).unwrap();
    let e = call(m.as_ref(), &conversation()).await.err();
    assert!(e.is_some(), "a redirect is an error, not an answer");
    assert_eq!(server.seen().len(), 1);
    assert!(
        other.seen().is_empty(),
        "the redirect's target got a request (and the key)"
    );
}

#[tokio::test]
async fn anthropic_401_is_unauthenticated_without_retries() {
    let (origin, server) = provider(vec![Reply::json(
        401,
        json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
    )])
    .await;
    let m = model::resolve("anthropic/claude-x", &options(format!("{origin}/v1"))).unwrap();
    let e = call(m.as_ref(), &conversation()).await.err().unwrap();
    assert_eq!(e.code, "UNAUTHENTICATED");
    assert!(e.message.contains("rejected the API key"), "{}", e.message);
    assert!(e.message.contains("HTTP 401"), "{}", e.message);
    // The provider's own text stays in the log: it can quote the key it refused.
    assert!(
        e.message.contains("refused the credentials"),
        "{}",
        e.message
    );
    assert!(!e.message.contains("invalid x-api-key"), "{}", e.message);
    assert_eq!(server.seen().len(), 1, "a bad key is not retried");
}

#[tokio::test]
async fn anthropic_429_then_200_succeeds_after_a_retry() {
    let mut limited = Reply::json(
        429,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}}),
    );
    limited.headers.push(("retry-after", "0"));
    let (origin, server) = provider(vec![limited, Reply::sse(ANTHROPIC_TEXT_AND_TOOL)]).await;
    let m = model::resolve("anthropic/claude-x", &options(format!("{origin}/v1"))).unwrap();
    let out = call(m.as_ref(), &conversation()).await.unwrap();
    assert!(out.error.is_none());
    assert_eq!(out.response.function_calls().count(), 1);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].body, seen[1].body,
        "the retry resends the same request"
    );
}

// ---------------------------------------------------------------------------------------
// Gemini
// ---------------------------------------------------------------------------------------

/// Gemini frames its SSE records with CRLF; the fixtures are stored with LF.
fn crlf(s: &str) -> String {
    s.replace('\n', "\r\n")
}

#[tokio::test]
async fn gemini_streams_thought_text_and_a_call() {
    for framing in ["lf", "crlf"] {
        let fixture = if framing == "crlf" {
            crlf(GEMINI_TEXT_AND_TOOL)
        } else {
            GEMINI_TEXT_AND_TOOL.to_string()
        };
        let (origin, server) = provider(vec![Reply::sse(&fixture)]).await;
        let m = model::resolve(
            "gemini/gemini-2.5-flash",
            &options(format!("{origin}/v1beta")),
        )
        .unwrap();
        let req = conversation();
        let out = call(m.as_ref(), &req).await.unwrap();
        assert!(out.error.is_none(), "{framing}: {:?}", out.error);
        let r = &out.response;
        assert_eq!(
            text_of(r, true),
            "**Finding the forecast**\n\nThe user asks about Paris; I should call the weather tool."
        );
        assert_eq!(text_of(r, false), "Let me check the weather in Paris.");
        assert_eq!(out.partials.len(), 2, "{framing}");
        let calls: Vec<_> = r.function_calls().collect();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            Value::Object(calls[0].args.clone()),
            json!({"city": "Paris", "unit": "celsius"})
        );
        // Gemini sent no id: ADK's client-side id.
        assert!(calls[0].id.as_deref().unwrap().starts_with("adk-"));
        assert_eq!(r.finish_reason.as_deref(), Some("STOP"));
        assert_eq!(
            r.usage,
            Some(Usage {
                prompt_tokens: 98,
                candidates_tokens: 27,
                total_tokens: 168,
                thoughts_tokens: Some(43)
            })
        );
        assert_eq!(r.model_version.as_deref(), Some("gemini-2.5-flash"));

        let seen = server.seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            seen[0].uri.path(),
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
        );
        assert_eq!(seen[0].uri.query(), Some("alt=sse"));
        assert!(seen[0].headers.get("x-goog-api-key").is_none());
        let body = &seen[0].body;
        assert_eq!(body, &gemini::request_body("gemini-2.5-flash", &req));
        assert_eq!(
            body["systemInstruction"],
            json!({"parts": [{"text": "You are a weather assistant."}]})
        );
        assert_eq!(
            body["contents"],
            json!([
                {"role": "user", "parts": [{"text": "Hi!"}]},
                {"role": "user", "parts": [{"text": "What's the weather in Paris?"}]},
                {"role": "model", "parts": [
                    {"text": "Checking."},
                    {"functionCall": {"id": "toolu_01PrevCall", "name": "get_weather",
                                      "args": {"city": "Paris"}}}
                ]},
                {"role": "user", "parts": [
                    {"functionResponse": {"id": "toolu_01PrevCall", "name": "get_weather",
                                          "response": {"temp_c": 21, "sky": "clear"}}}
                ]},
                {"role": "user", "parts": [{"text": "And in Tokyo, in Celsius?"}]}
            ])
        );
        assert_eq!(
            body["tools"],
            json!([{"functionDeclarations": [
                {"name": "get_weather", "description": "Current weather for a city.",
                 "parameters": {
                    "type": "OBJECT",
                    "properties": {
                        "city": {"type": "STRING", "description": "City name"},
                        "unit": {"type": "STRING", "enum": ["celsius", "fahrenheit"],
                                 "nullable": true}
                    },
                    "required": ["city"]
                 }},
                {"name": "get_time", "description": "The current time."}
            ]}])
        );
        assert_eq!(
            body["generationConfig"],
            json!({"temperature": 0.3, "maxOutputTokens": 1024, "stopSequences": ["###"],
                   "seed": 11})
        );
    }
}

#[tokio::test]
async fn gemini_parallel_calls_keep_order_ids_and_args() {
    let (origin, server) = provider(vec![Reply::sse(&crlf(GEMINI_PARALLEL))]).await;
    let m = gemini::GeminiModel::new(
        "gemini-2.0-flash",
        endpoint(format!("{origin}/v1beta"), "AIza-test"),
    );
    let out = call(&m, &conversation()).await.unwrap();
    assert!(out.error.is_none(), "{:?}", out.error);
    assert!(out.partials.is_empty());
    let r = &out.response;
    let calls: Vec<_> = r.function_calls().collect();
    assert_eq!(
        calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["get_weather", "get_time", "convert"]
    );
    assert_eq!(calls[0].id.as_deref(), Some("fc_7d1c2e"));
    assert_eq!(calls[0].args["city"], "Tokyo");
    assert!(calls[1].id.as_deref().unwrap().starts_with("adk-"));
    assert!(calls[1].args.is_empty());
    assert_eq!(
        Value::Object(calls[2].args.clone()),
        json!({"amount": 12.5, "from": "USD", "to": ["JPY", "EUR"], "round": true})
    );
    assert_ne!(calls[1].id, calls[2].id);
    assert!(r.invalid_calls.is_empty());
    assert_eq!(r.finish_reason.as_deref(), Some("STOP"));
    assert_eq!(r.usage.unwrap().total_tokens, 171);
    assert_eq!(r.usage.unwrap().thoughts_tokens, None);
    let seen = server.seen();
    assert_eq!(seen[0].headers["x-goog-api-key"], "AIza-test");
    assert_eq!(seen[0].headers["x-extra"], "yes");
    assert_eq!(
        seen[0].uri.path(),
        "/v1beta/models/gemini-2.0-flash:streamGenerateContent"
    );
}

#[tokio::test]
async fn gemini_error_object_mid_stream_is_a_clear_model_error() {
    let (origin, _server) = provider(vec![Reply::sse(&crlf(GEMINI_ERROR))]).await;
    let m = model::resolve(
        "gemini/gemini-2.5-pro",
        &options(format!("{origin}/v1beta")),
    )
    .unwrap();
    let out = call(m.as_ref(), &conversation()).await.unwrap();
    assert_eq!(out.partials, vec![PartialChunk::Text("The first".into())]);
    let e = out
        .error
        .expect("the error record ends the stream with an error");
    assert_eq!(e.code, "MODEL_UNAVAILABLE");
    assert_eq!(
        e.message,
        "the Gemini API reported an error mid-stream (UNAVAILABLE): The model is overloaded. \
         Please try again later."
    );
}

#[tokio::test]
async fn gemini_safety_finish_passes_through() {
    let (origin, _server) = provider(vec![Reply::sse(&crlf(GEMINI_SAFETY))]).await;
    let m = model::resolve(
        "gemini/gemini-2.5-flash",
        &options(format!("{origin}/v1beta")),
    )
    .unwrap();
    let out = call(m.as_ref(), &conversation()).await.unwrap();
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(text_of(&out.response, false), "I can't");
    assert_eq!(out.response.finish_reason.as_deref(), Some("SAFETY"));
    assert_eq!(out.response.function_calls().count(), 0);
}

#[tokio::test]
async fn gemini_bad_api_key_is_unauthenticated() {
    // Gemini answers an invalid key with 400 INVALID_ARGUMENT, a missing one with 403.
    let (origin, server) = provider(vec![
        Reply::json(
            400,
            json!({"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
                "status": "INVALID_ARGUMENT", "details": [{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                    "metadata": {"service": "generativelanguage.googleapis.com"}}]}}),
        ),
        Reply::json(
            401,
            json!({"error": {"code": 401, "message": "Request had invalid authentication credentials.",
                "status": "UNAUTHENTICATED"}}),
        ),
    ])
    .await;
    let m = model::resolve(
        "gemini/gemini-2.5-flash",
        &options(format!("{origin}/v1beta")),
    )
    .unwrap();
    let e = call(m.as_ref(), &conversation()).await.err().unwrap();
    assert_eq!(e.code, "UNAUTHENTICATED");
    assert!(e.message.contains("rejected the API key"), "{}", e.message);
    assert!(e.message.contains("API key not valid"), "{}", e.message);
    let e = call(m.as_ref(), &conversation()).await.err().unwrap();
    assert_eq!(e.code, "UNAUTHENTICATED");
    assert!(e.message.contains("HTTP 401"), "{}", e.message);
    assert_eq!(server.seen().len(), 2, "neither is retried");
}

#[tokio::test]
async fn gemini_503_and_429_then_200_succeed_after_retries() {
    let (origin, server) = provider(vec![
        Reply::json(
            503,
            json!({"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}),
        ),
        Reply::json(
            429,
            json!({"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}),
        ),
        Reply::sse(&crlf(GEMINI_PARALLEL)),
    ])
    .await;
    let m = model::resolve(
        "gemini/gemini-2.0-flash",
        &options(format!("{origin}/v1beta")),
    )
    .unwrap();
    let out = call(m.as_ref(), &conversation()).await.unwrap();
    assert!(out.error.is_none());
    assert_eq!(out.response.function_calls().count(), 3);
    assert_eq!(server.seen().len(), 3);
}

#[tokio::test]
async fn gemini_rate_limit_persisting_past_the_retries_is_reported() {
    let limited = || {
        Reply::json(
            429,
            json!({"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}),
        )
    };
    let (origin, server) = provider(vec![limited(), limited(), limited()]).await;
    let m = model::resolve(
        "gemini/gemini-2.5-flash",
        &options(format!("{origin}/v1beta")),
    )
    .unwrap();
    let e = call(m.as_ref(), &conversation()).await.err().unwrap();
    assert_eq!(e.code, "RATE_LIMITED");
    assert!(e.message.contains("after 2 retries"), "{}", e.message);
    assert!(
        e.message.contains("Resource has been exhausted"),
        "{}",
        e.message
    );
    assert_eq!(server.seen().len(), 3);
}
