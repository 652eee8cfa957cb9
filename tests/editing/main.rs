//! Editing a conversation: rewind (ADK's `rewind_async` as a route). The session keeps every
//! event; the rewind event restores state and artifacts, and the model never sees the turns it
//! annulled.

#[path = "../common/mod.rs"]
mod common;

use agentd::agent::llm::LlmAgent;
use agentd::agent::PluginSet;
use common::model_server::{Reply, ScriptedModel};
use common::procs::{Apps, USER};
use common::sse_client::done_status;
use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};
use std::sync::Arc;

mod compaction;
mod forks_and_edits;
mod rewind;

fn turn(app: &str, session: &str, text: &str) -> Value {
    json!({
        "appName": app, "userId": USER, "sessionId": session, "createSession": true,
        "saveInputBlobsAsArtifacts": true,
        "newMessage": {"role": "user", "parts": [{"text": text}]},
    })
}

/// A turn through `POST /run`, read to its end: it completed.
async fn run(s: &TestServer, body: Value) {
    let msgs = s.run_stream(body).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:?}");
}

async fn session(s: &TestServer, app: &str, id: &str) -> Value {
    json_with_status(
        s.get(&format!("/apps/{app}/users/{USER}/sessions/{id}"))
            .await,
        200,
    )
    .await
}

/// The invocation ids of the session's user messages, in order.
fn turns(session: &Value) -> Vec<String> {
    session["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["author"] == "user" && e["content"].is_object())
        .map(|e| e["invocationId"].as_str().expect("invocation").to_string())
        .collect()
}
