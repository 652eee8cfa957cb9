//! LLM agents end to end: a scripted OpenAI-compatible model server on a real port (real
//! streaming wire format), agentd on a real port, real SSE parsed by a client, each test on
//! PostgreSQL and SQLite.

#[path = "../common/mod.rs"]
mod common;

use agentd::agent::llm::LlmAgent;
use agentd::agent::PluginSet;
use agentd::tools::FunctionTool;
use common::model_server::{Reply, ScriptedModel};
use common::sse_client::{complete, done_status, text_of};
use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

mod budgets;
mod model_errors;
mod tools;
mod usage;
mod workflows;
mod yaml_apps;

const USER: &str = "u1";

fn body(app: &str, session: &str, text: &str) -> Value {
    json!({
        "appName": app, "userId": USER, "sessionId": session,
        "newMessage": {"role": "user", "parts": [{"text": text}]},
        "streaming": true, "createSession": true,
    })
}

async fn session(s: &TestServer, app: &str, session: &str) -> Value {
    json_with_status(
        s.get(&format!("/apps/{app}/users/{USER}/sessions/{session}"))
            .await,
        200,
    )
    .await
}

fn responses_of(event: &Value) -> Vec<&Value> {
    event["content"]["parts"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p.get("functionResponse"))
                .collect()
        })
        .unwrap_or_default()
}

/// Messages of a recorded model request with the given role.
fn messages<'a>(request: &'a Value, role: &str) -> Vec<&'a Value> {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == role)
        .collect()
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    /// The city to look up.
    city: String,
}

fn weather_tool(calls: Arc<AtomicUsize>) -> FunctionTool {
    FunctionTool::new(
        "get_weather",
        "Current weather for a city.",
        move |a: City, ctx| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                ctx.set_state("last_city", json!(a.city));
                let forecast = if a.city == "Paris" { "sunny" } else { "rainy" };
                Ok(json!({"city": a.city, "forecast": forecast}))
            }
        },
    )
}
