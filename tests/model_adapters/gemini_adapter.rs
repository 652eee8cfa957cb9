//! The Gemini adapter: thoughts, text and calls in order, errors, safety finishes, retries.

use super::*;
use agentd::model::gemini;

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
                thoughts_tokens: Some(43),
                cached_tokens: None,
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
    assert!(
        e.message.contains("refused the credentials"),
        "{}",
        e.message
    );
    assert!(
        e.message
            .contains("no API key was sent; set AGENTD_TEST_NO_SUCH_KEY_VARIABLE"),
        "{}",
        e.message
    );
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
