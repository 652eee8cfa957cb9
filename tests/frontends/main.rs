//! The frontend protocols with their real client libraries: the `openai` Python SDK (Chat
//! Completions and Responses), npm `ai` (`useChat`'s transport and chat state) at three
//! majors, and `@ag-ui/client`'s `HttpAgent`. agentd on a real port over PostgreSQL and
//! SQLite; the agent is an LLM agent whose model is a scripted OpenAI-compatible server
//! speaking the real streaming wire format. Each client driver prints what the client saw
//! (its final messages, events, state, errors); these tests assert on that.

#[path = "../common/mod.rs"]
mod common;

use agentd::agent::llm::LlmAgent;
use agentd::agent::PluginSet;
use agentd::tools::FunctionTool;
use common::clients;
use common::model_server::{Reply, ScriptedModel};
use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};
use std::time::Duration;

mod ag_ui;
mod ai_sdk;
mod api_keys;
mod openai;
mod web_ui;
mod web_ui_trace;

const APP: &str = "shop";

/// ADK's web UI bundle, as scripts/test.sh unpacks it from the pinned google-adk wheel.
fn web_ui_bundle() -> std::path::PathBuf {
    let bundle = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/test-clients/adk-web-ui/browser");
    assert!(
        bundle.join("index.html").exists(),
        "ADK's web UI bundle is missing at {}: run ./scripts/test.sh (it downloads the pinned google-adk wheel)",
        bundle.display()
    );
    bundle
}
const USER: &str = "u1";

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct CityArgs {
    /// The city.
    city: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct AmountArgs {
    /// How much.
    amount: i64,
}

/// An LLM agent with a server tool (`get_weather`, which also writes state), a tool that
/// needs the user's approval (`transfer_money`) and one the client answers (`ask_user`),
/// over the scripted model `model`.
async fn server(backend: Backend, m: &ScriptedModel, model: &str) -> TestServer {
    let weather = FunctionTool::new(
        "get_weather",
        "Weather of a city.",
        |a: CityArgs, ctx| async move {
            ctx.set_state("last_city", json!(a.city));
            Ok(json!({"city": a.city, "temp": 21}))
        },
    );
    let transfer = FunctionTool::new(
        "transfer_money",
        "Sends money.",
        |a: AmountArgs, _ctx| async move { Ok(json!({"sent": a.amount})) },
    )
    .require_confirmation();
    let ask = FunctionTool::new(
        "ask_user",
        "Asks the user; the client answers.",
        |_a: CityArgs, _ctx| async move { Ok(Value::Null) },
    )
    .long_running();
    let agent = LlmAgent::new("assistant", m.model(model))
        .instruction("Help the user.")
        .tool(weather)
        .tool(transfer)
        .tool(ask);
    TestServer::start_agent(
        backend,
        APP,
        std::sync::Arc::new(agent),
        PluginSet::default(),
    )
    .await
}

/// Chunks of a text reply (for `Reply::Slow`).
fn text_chunks(pieces: &[&str]) -> Vec<Value> {
    match Reply::text(pieces) {
        Reply::Stream(chunks) => chunks,
        _ => unreachable!(),
    }
}
