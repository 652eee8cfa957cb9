//! Usage from the Anthropic and Gemini wire formats summed end to end (docs/usage.md): an
//! agentd server on a real port runs an app whose model is the provider's adapter pointed at
//! the fake provider, and the run records, the user's report and the prices add up exactly;
//! Anthropic's requests carry the `cache_control` breakpoints the app's `context_cache:` asks
//! for. (The OpenAI-compatible format's sums are in tests/llm_agents/usage.rs.)

use super::*;
use crate::common::{json_with_status, sse_client, Backend, TestServer};

/// A cache-reading answer: Anthropic reports fresh input, cache writes and cache reads apart.
const ANTHROPIC_CACHED_TEXT: &str = "event: message_start
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":500,\"output_tokens\":1}}}

event: content_block_start
data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}

event: content_block_delta
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Sunny.\"}}

event: content_block_stop
data: {\"type\":\"content_block_stop\",\"index\":0}

event: message_delta
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}

event: message_stop
data: {\"type\":\"message_stop\"}

";

/// A cache-reading answer in Gemini's `alt=sse` records.
const GEMINI_CACHED_TEXT: &str = "data: {\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\"Sunny.\"}]},\"finishReason\":\"STOP\",\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":530,\"candidatesTokenCount\":7,\"totalTokenCount\":537,\"cachedContentTokenCount\":500},\"modelVersion\":\"gemini-x\"}

";

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Place {
    /// The city to look up.
    #[serde(default)]
    city: String,
}

fn weather() -> agentd::tools::FunctionTool {
    agentd::tools::FunctionTool::new(
        "get_weather",
        "Current weather for a city.",
        |p: Place, _ctx| async move { Ok(json!({"city": p.city, "forecast": "sunny"})) },
    )
}

/// Runs two turns (a tool call then a cached answer, streamed; then a cached answer, not
/// streamed) of `model` against `replies`, and returns the user's report and the runs.
async fn two_runs(
    backend: Backend,
    model: &str,
    base: &str,
    replies: Vec<Reply>,
) -> (Value, Value, Vec<Seen>) {
    let (origin, provider) = provider(replies).await;
    let m = model::resolve(model, &options(format!("{origin}{base}"))).expect("model");
    let agent = agentd::agent::llm::LlmAgent::new("weather_agent", m)
        .instruction("Be brief.")
        .tool(weather());
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        "weather",
        agentd::agent::AgentTree::new(Arc::new(agent)).expect("valid tree"),
    );
    apps.set_context_cache(
        "weather",
        serde_yaml_ng::from_str("ttl_seconds: 300\n").expect("context_cache"),
    );
    let prices = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        prices.path(),
        "currency: USD\nmodels:\n  claude-x: {input: 3.0, output: 15.0, cached_input: 0.3}\n  \
         gemini-x: {input: 1.0, output: 4.0, cached_input: 0.25}\n",
    )
    .expect("prices");
    let path = prices.path().to_path_buf();
    let s =
        TestServer::start_embedded_with(backend, apps, agentd::agent::PluginSet::default(), |a| {
            a.prices = Some(path)
        })
        .await;
    for (session, streaming) in [("s1", true), ("s2", false)] {
        let body = json!({
            "appName": "weather", "userId": "u1", "sessionId": session,
            "newMessage": {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            "streaming": streaming, "createSession": true,
        });
        let msgs = sse_client::read_all(s.post_json("/run", body).await).await;
        assert_eq!(sse_client::done_status(&msgs), "completed", "{msgs:#?}");
    }
    let report = json_with_status(
        s.get("/apps/weather/users/u1/usage?groupBy=session").await,
        200,
    )
    .await;
    let runs = json_with_status(s.get("/apps/weather/users/u1/runs").await, 200).await;
    (report, runs, provider.seen())
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|v| (v - want).abs() < 1e-12)
}

/// Anthropic: input is fresh + cache writes + cache reads; only reads are cached input.
async fn anthropic_usage_adds_up(backend: Backend) {
    let replies = vec![
        Reply::sse(ANTHROPIC_TEXT_AND_TOOL),
        Reply::sse(ANTHROPIC_CACHED_TEXT),
        Reply::sse(ANTHROPIC_CACHED_TEXT),
    ];
    let (report, runs, seen) = two_runs(backend, "anthropic/claude-x", "/v1", replies).await;
    let t = &report["total"];
    assert_eq!(t["inputTokens"], 472 + 630 + 630, "{report}");
    assert_eq!(t["outputTokens"], 89 + 7 + 7, "{report}");
    assert_eq!(t["cachedTokens"], 1000, "{report}");
    assert_eq!(t["modelCalls"], 3, "{report}");
    assert_eq!(t["runs"], 2, "{report}");
    // (732 fresh × 3 + 1000 cached × 0.3 + 103 output × 15) per million.
    assert!(close(&t["cost"], 4041e-6), "{report}");
    let s1 = &report["usage"][0];
    assert_eq!(
        (s1["key"].clone(), s1["inputTokens"].clone()),
        (json!("s1"), json!(1102))
    );
    let newest = &runs["runs"][0]["usage"];
    assert_eq!(newest["inputTokens"], 630, "{runs}");
    assert_eq!(newest["byModel"]["claude-x"]["cachedTokens"], 500, "{runs}");

    // The app's context_cache: breakpoints on the system prompt, the tools and the history.
    assert_eq!(seen.len(), 3);
    for req in &seen {
        let body = &req.body;
        assert_eq!(
            body["system"][0]["cache_control"]["type"], "ephemeral",
            "{body}"
        );
        let tools = body["tools"].as_array().expect("tools");
        assert!(
            tools.last().is_some_and(|t| t["cache_control"].is_object()),
            "{body}"
        );
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .expect("messages");
        let blocks = last["content"].as_array().expect("blocks");
        assert!(
            blocks
                .last()
                .is_some_and(|b| b["cache_control"].is_object()),
            "{body}"
        );
    }
}

/// Gemini: thoughts are output (total − prompt) and reasoning; cached content is cached input.
async fn gemini_usage_adds_up(backend: Backend) {
    let replies = vec![
        Reply::sse(GEMINI_TEXT_AND_TOOL),
        Reply::sse(GEMINI_CACHED_TEXT),
        Reply::sse(GEMINI_CACHED_TEXT),
    ];
    let (report, runs, _) = two_runs(backend, "gemini/gemini-x", "/v1beta", replies).await;
    let t = &report["total"];
    assert_eq!(t["inputTokens"], 98 + 530 + 530, "{report}");
    assert_eq!(t["outputTokens"], 70 + 7 + 7, "{report}");
    assert_eq!(t["cachedTokens"], 1000, "{report}");
    assert_eq!(t["reasoningTokens"], 43, "{report}");
    assert_eq!(t["modelCalls"], 3, "{report}");
    // (158 fresh × 1 + 1000 cached × 0.25 + 84 output × 4) per million.
    assert!(close(&t["cost"], 744e-6), "{report}");
    let oldest = &runs["runs"][1]["usage"];
    assert_eq!(oldest["inputTokens"], 628, "{runs}");
    assert_eq!(oldest["reasoningTokens"], 43, "{runs}");
}

crate::both_backends!(anthropic_usage_adds_up, gemini_usage_adds_up);
