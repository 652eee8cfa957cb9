//! The run endpoints over a real socket, on both backends: `/run_sse` framing against the
//! recorded `adk api_server` streams, agentd's `/run` (ids, `event: done`, JSON mode) and run
//! control, errors before and after the first byte, artifacts, callbacks and plugins, agent
//! selection, admission under concurrency, cancel, client disconnect, and a crashed replica.
//!
//! Streams are parsed with `eventsource-stream` over reqwest's `bytes_stream()`, and the raw
//! bytes are kept as well wherever the framing itself is what is being proved.

#[path = "../common/mod.rs"]
mod common;

use agentd::agent::{AgentResult, AgentTree, InvocationContext, PluginSet};
use agentd::apps::AppRegistry;
use agentd::event::{Content, Event};
use async_trait::async_trait;
use common::sse_client::{Msg, Sse};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod artifacts;
mod background_runs;
mod callbacks;
mod cancel_race;
mod crash;
mod errors;
mod framing;
mod run_control;
mod selection;

/// Upper bound on any single wait; only there so a broken server fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);
const USER: &str = "u1";

// ---------------------------------------------------------------------------------------
// Reading SSE
// ---------------------------------------------------------------------------------------

/// Complete (committed) agent events among `msgs`.
fn complete(msgs: &[Msg]) -> Vec<&Value> {
    msgs.iter()
        .filter(|m| m.is_event() && !m.is_partial())
        .map(|m| &m.data)
        .collect()
}

/// The concatenated text parts of an event.
fn text(event: &Value) -> String {
    event["content"]["parts"]
        .as_array()
        .map(|parts| parts.iter().filter_map(|p| p["text"].as_str()).collect())
        .unwrap_or_default()
}

fn authors<'a>(events: impl IntoIterator<Item = &'a Value>) -> Vec<String> {
    events
        .into_iter()
        .map(|e| e["author"].as_str().unwrap_or("").to_string())
        .collect()
}

/// `json` with every value string replaced by `"…"` and every number by `0`. Keys, key order,
/// nesting and spacing stay, so two events of the same shape give the same skeleton.
fn skeleton(json: &str) -> String {
    let mut out = String::new();
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let mut s = String::from('"');
                while let Some(c) = chars.next() {
                    s.push(c);
                    match c {
                        '\\' => s.extend(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
                let is_key = chars.peek() == Some(&':');
                out.push_str(if is_key { &s } else { "\"…\"" });
            }
            '-' | '0'..='9' => {
                while chars
                    .peek()
                    .is_some_and(|c| c.is_ascii_digit() || ".eE+-".contains(*c))
                {
                    chars.next();
                }
                out.push('0');
            }
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Recorded ADK streams
// ---------------------------------------------------------------------------------------

/// The messages of the recorded stream `<id>_*.sse`.
fn fixture_frames(id: &str) -> Vec<String> {
    let file = common::fixture_path(id, "sse");
    let text = std::fs::read_to_string(file).expect("fixture readable");
    text.split_terminator("\n\n").map(str::to_string).collect()
}

// ---------------------------------------------------------------------------------------
// Apps, sessions, requests
// ---------------------------------------------------------------------------------------

/// App folders in a temp dir, ADK style: `Apps::new().echo("echo_agent", "chunks: 3")`.
struct Apps(tempfile::TempDir);

impl Apps {
    fn new() -> Self {
        Apps(tempfile::tempdir().expect("temp dir"))
    }

    /// Writes `<app>/<file>`: an agent of `class` named `name`, with more YAML fields.
    fn agent(self, app: &str, file: &str, class: &str, name: &str, fields: &str) -> Self {
        let dir = self.0.path().join(app);
        std::fs::create_dir_all(&dir).expect("app dir");
        let yaml = format!("agent_class: {class}\nname: {name}\n{fields}\n");
        std::fs::write(dir.join(file), yaml).expect("agent file");
        self
    }

    /// An app whose root is an echo agent named like the app.
    fn echo(self, app: &str, settings: &str) -> Self {
        self.agent(app, "root_agent.yaml", "EchoAgent", app, settings)
    }

    /// Writes `<app>/agentd.yaml` (the app's server-side settings).
    fn settings(self, app: &str, yaml: &str) -> Self {
        std::fs::write(self.0.path().join(app).join("agentd.yaml"), yaml).expect("settings");
        self
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    async fn serve(&self, backend: Backend) -> TestServer {
        let dir = self.path().to_path_buf();
        TestServer::start_with(backend, |args| args.apps_dir = dir).await
    }
}

/// A slow echo: five chunks 200 ms apart.
const SLOW: &str = "chunks: 5\nchunk_delay_ms: 200";

fn run_body(app: &str, session: &str, text: &str) -> Value {
    json!({
        "appName": app, "userId": USER, "sessionId": session,
        "newMessage": { "role": "user", "parts": [{ "text": text }] },
    })
}

/// `body` with the fields of `extra` added.
fn with(mut body: Value, extra: Value) -> Value {
    let target = body.as_object_mut().expect("object body");
    for (k, v) in extra.as_object().expect("object extra") {
        target.insert(k.clone(), v.clone());
    }
    body
}

fn session_path(app: &str, session: &str) -> String {
    format!("/apps/{app}/users/{USER}/sessions/{session}")
}

async fn create_session(s: &TestServer, app: &str, session: &str) {
    let path = format!("/apps/{app}/users/{USER}/sessions");
    json_with_status(
        s.post_json(&path, json!({ "sessionId": session })).await,
        200,
    )
    .await;
}

async fn stored_session(s: &TestServer, app: &str, session: &str) -> Value {
    json_with_status(s.get(&session_path(app, session)).await, 200).await
}

/// The stored events with their `seq`, asserting that the seqs run 1..=n without a gap.
async fn transcript(s: &TestServer, app: &str, session: &str) -> Vec<Value> {
    let path = format!("{}/events?limit=1000", session_path(app, session));
    let page = json_with_status(s.get(&path).await, 200).await;
    let events = page["events"].as_array().expect("events").clone();
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    let expected: Vec<i64> = (1..=events.len() as i64).collect();
    assert_eq!(seqs, expected, "stored seqs are contiguous from 1");
    assert!(
        events.iter().all(|e| e.get("partial").is_none()),
        "no partial event is stored: {events:#?}"
    );
    events
}

async fn run_sse(s: &TestServer, body: Value) -> Sse {
    Sse::open(s.post_json("/run_sse", body).await).await
}

async fn run(s: &TestServer, body: Value) -> Sse {
    Sse::open(s.post_json("/run", body).await).await
}

/// Runs one turn over `/run_sse` and returns its complete events.
async fn turn(s: &TestServer, app: &str, session: &str, text: &str) -> Vec<Value> {
    let msgs = run_sse(s, run_body(app, session, text)).await.rest().await;
    complete(&msgs).into_iter().cloned().collect()
}

/// Polls `GET /runs/{id}` until the run is no longer running.
async fn finished_run(s: &TestServer, run_id: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let record = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
        if record["status"] != "running" {
            return record;
        }
        assert!(Instant::now() < deadline, "run still running: {record}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `event: done` message that must end a `/run` stream.
fn done(msgs: &[Msg]) -> &Value {
    let last = msgs.last().expect("messages");
    assert_eq!(last.event, "done", "the stream ends with event: done");
    &last.data
}

// ---------------------------------------------------------------------------------------
// Reading a `/run` to its end (`run_control`, `crash`)
// ---------------------------------------------------------------------------------------

/// Sends one `/run` and reads it to the end: `Ok(messages)` on 200, `Err((status, body))`.
async fn run_to_end(s: &TestServer, body: Value) -> Result<Vec<Msg>, (u16, Value)> {
    let resp = s.post_json("/run", body).await;
    let status = resp.status().as_u16();
    if status == 200 {
        Ok(Sse::open(resp).await.rest().await)
    } else {
        Err((status, json_with_status(resp, status).await))
    }
}
