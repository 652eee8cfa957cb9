//! What prompt caching saves over a 20-turn conversation (docs/usage.md#prompt-caching).
//!
//! A fake Anthropic server that keeps a prompt cache as the Messages API documents it: the
//! prefixes a request marks end where it puts a `cache_control` breakpoint (after the system
//! prompt and tools, after a message); a request reads the longest prefix an earlier request
//! marked (`cache_read_input_tokens`), writes the rest up to its own last breakpoint
//! (`cache_creation_input_tokens`), and the rest is fresh input; a request without
//! breakpoints is all fresh input. So the reads follow from where agentd puts its breakpoints:
//! anywhere but after the last message, the next turn could not read the whole conversation.
//! Tokens are estimated at 4 bytes of JSON each. The same 20-turn session runs through
//! an app with `context_cache:` and one without; each turn's usage comes from agentd's own run
//! records, priced by `--prices`. The figures printed are the ones in docs/usage.md: they
//! measure where agentd puts its breakpoints under that documented accounting, not a
//! provider's live cache.

use super::*;
use crate::common::{json_with_status, sse_client, Backend, TestServer};
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

const TURNS: usize = 20;

#[derive(Default)]
struct Cache {
    /// Hashes of the prefixes earlier requests marked with a breakpoint.
    marked: Mutex<HashSet<u64>>,
    turn: Mutex<usize>,
}

fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "cache_control")
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        v => v.clone(),
    }
}

fn hash_of(units: &[String]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    units.hash(&mut h);
    h.finish()
}

async fn messages(State(cache): State<Arc<Cache>>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let has_mark = |v: &Value| v.to_string().contains("cache_control");
    let head = json!([strip(&body["system"]), strip(&body["tools"])]).to_string();
    let units: Vec<String> = std::iter::once(head)
        .chain(
            body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| strip(m).to_string()),
        )
        .collect();
    let tokens = |k: usize| units[..k].iter().map(|u| u.len() as u64 / 4).sum::<u64>();
    let n = units.len();
    // The prefixes this request marks: up to the system prompt and tools if either carries a
    // breakpoint, and up to each message that carries one (unit k + 1 is message k).
    let mut marks: Vec<usize> = vec![];
    if has_mark(&body["system"]) || has_mark(&body["tools"]) {
        marks.push(1);
    }
    for (i, m) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if has_mark(m) {
            marks.push(i + 2);
        }
    }
    let (fresh, write, read) = match marks.last() {
        Some(&last) => {
            let mut seen = cache.marked.lock().unwrap();
            let hit = (1..=n)
                .rev()
                .find(|&k| seen.contains(&hash_of(&units[..k])));
            let read = hit.map_or(0, tokens);
            for &k in &marks {
                seen.insert(hash_of(&units[..k]));
            }
            // Read, then written up to the last breakpoint, then fresh after it.
            let written = tokens(last).saturating_sub(read);
            (tokens(n) - read - written, written, read)
        }
        None => (tokens(n), 0, 0),
    };
    let turn = {
        let mut t = cache.turn.lock().unwrap();
        *t += 1;
        *t
    };
    let answer = format!("Noted, point {turn}. ").repeat(12);
    let events = [
        json!({"type": "message_start", "message": {"id": format!("msg_{turn}"), "type": "message",
            "role": "assistant", "model": "claude-x", "content": [], "stop_reason": null,
            "usage": {"input_tokens": fresh, "cache_creation_input_tokens": write,
                      "cache_read_input_tokens": read, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": answer}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 60}}),
        json!({"type": "message_stop"}),
    ];
    let sse: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect();
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(sse))
        .unwrap()
}

async fn anthropic_with_a_cache() -> String {
    let app = axum::Router::new()
        .route("/v1/messages", axum::routing::post(messages))
        .with_state(Arc::new(Cache::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    format!("http://{addr}")
}

/// Each turn's usage (oldest first) of a 20-turn session of `app`.
async fn twenty_turns(s: &TestServer, app: &str) -> Vec<Value> {
    for turn in 1..=TURNS {
        let text =
            format!("Turn {turn}: here is one more paragraph of the notes to keep. ").repeat(6);
        let body = json!({
            "appName": app, "userId": "u1", "sessionId": "s1",
            "newMessage": {"role": "user", "parts": [{"text": text}]},
            "streaming": true, "createSession": true,
        });
        let msgs = sse_client::read_all(s.post_json("/run", body).await).await;
        assert_eq!(sse_client::done_status(&msgs), "completed", "{msgs:#?}");
    }
    let runs = json_with_status(
        s.get(&format!("/apps/{app}/users/u1/runs?limit={TURNS}"))
            .await,
        200,
    )
    .await;
    let mut usage: Vec<Value> = runs["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["usage"].clone())
        .collect();
    usage.reverse();
    usage
}

/// The input cost of a turn, in millionths of the currency: fresh input and cache writes at
/// `input` (3 per million), cache reads at `cached_input` (0.3).
fn input_cost(u: &Value) -> f64 {
    let input = u["inputTokens"].as_f64().unwrap_or(0.0);
    let cached = u["cachedTokens"].as_f64().unwrap_or(0.0);
    (input - cached) * 3.0 + cached * 0.3
}

#[tokio::test]
async fn context_cache_makes_each_turn_read_the_conversation_so_far() {
    let mut apps = agentd::apps::AppRegistry::default();
    let instruction = "You keep a user's notes and answer from them. ".repeat(200);
    for app in ["cached", "uncached"] {
        // A provider each: both conversations get the same answers.
        let origin = anthropic_with_a_cache().await;
        let m =
            model::resolve("anthropic/claude-x", &options(format!("{origin}/v1"))).expect("model");
        let agent = agentd::agent::llm::LlmAgent::new("notes_agent", m).instruction(&instruction);
        apps.insert(
            app,
            agentd::agent::AgentTree::new(Arc::new(agent)).expect("valid tree"),
        );
    }
    apps.set_context_cache(
        "cached",
        serde_yaml_ng::from_str("ttl_seconds: 300\n").expect("context_cache"),
    );
    let prices = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        prices.path(),
        "currency: USD\nmodels:\n  claude-x: {input: 3.0, output: 15.0, cached_input: 0.3}\n",
    )
    .expect("prices");
    let path = prices.path().to_path_buf();
    let s = TestServer::start_embedded_with(
        Backend::Sqlite,
        apps,
        agentd::agent::PluginSet::default(),
        |a| a.prices = Some(path),
    )
    .await;
    let with = twenty_turns(&s, "cached").await;
    let without = twenty_turns(&s, "uncached").await;
    assert_eq!((with.len(), without.len()), (TURNS, TURNS));

    eprintln!("turn | input tokens | cached | input cost without | with (per million)");
    for (i, (w, wo)) in with.iter().zip(&without).enumerate() {
        assert_eq!(wo["cachedTokens"], 0, "no breakpoints, no cache: {wo}");
        // The same conversation both ways: the marks change only the system prompt's shape.
        let (a, b) = (w["inputTokens"].as_i64(), wo["inputTokens"].as_i64());
        assert!(
            a.zip(b).is_some_and(|(a, b)| (a - b).abs() <= 10),
            "{w} {wo}"
        );
        if i == 0 {
            assert_eq!(w["cachedTokens"], 0, "nothing to read on the first turn");
        } else {
            // Each turn reads all the previous turn sent: the breakpoint after the last
            // message is where the next turn's prefix ends.
            assert_eq!(
                w["cachedTokens"],
                with[i - 1]["inputTokens"],
                "turn {}: {w}",
                i + 1
            );
        }
        eprintln!(
            "{:>4} | {:>12} | {:>6} | {:>18.0} | {:>6.0}",
            i + 1,
            w["inputTokens"],
            w["cachedTokens"],
            input_cost(wo),
            input_cost(w)
        );
    }
    let total = |turns: &[Value]| turns.iter().map(input_cost).sum::<f64>();
    let (with_total, without_total) = (total(&with), total(&without));
    eprintln!(
        "20 turns: input cost {without_total:.0} without, {with_total:.0} with (per million)"
    );
    assert!(
        with_total < without_total / 3.0,
        "{with_total} vs {without_total}"
    );
}
