//! The Anthropic adapter: text, thinking and tool calls, errors mid-stream, redirects, retries.

use super::*;
use agentd::model::anthropic;

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
            thoughts_tokens: None,
            cached_tokens: None,
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
    // Cached prompt tokens count as prompt tokens, and as cached (read from the cache).
    assert_eq!(
        r.usage,
        Some(Usage {
            prompt_tokens: 1021 + 2048,
            candidates_tokens: 131,
            total_tokens: 1021 + 2048 + 131,
            thoughts_tokens: None,
            cached_tokens: Some(2048),
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
    // No key was sent (its variable is unset): the message names the variable to set.
    assert!(
        e.message
            .contains("no API key was sent; set AGENTD_TEST_NO_SUCH_KEY_VARIABLE"),
        "{}",
        e.message
    );
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
