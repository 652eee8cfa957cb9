//! Human-in-the-loop and control flows of LLM agents, end to end: long-running tools answered
//! by the client in a later run, ADK's tool-confirmation round trip (approve and reject),
//! resuming tool calls an interrupted run left open, memory search through `load_memory`,
//! model/tool callbacks and plugins that short-circuit, and tool arguments the model got
//! wrong. A scripted OpenAI-compatible model server on a real port, agentd on a real port,
//! real SSE; every test on PostgreSQL and SQLite.

#[path = "../common/mod.rs"]
mod common;

use agentd::agent::llm::LlmAgent;
use agentd::agent::PluginSet;
use agentd::tools::FunctionTool;
use common::model_server::{Reply, ScriptedModel};
use common::sse_client::{complete, done_status, read_all, text_of, Msg};
use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod callbacks;
mod confirmations;
mod forged_confirmations;
mod long_running;
mod memory;
mod resume;
mod tool_arguments;

const USER: &str = "u1";

/// Upper bound on any wait; only there so a broken server fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// ADK's texts for the confirmation flow.
const CONFIRMATION_REQUIRED: &str =
    "This tool call requires confirmation, please approve or reject.";
const CONFIRMATION_REJECTED: &str = "This tool call is rejected.";
const REQUEST_CONFIRMATION: &str = "adk_request_confirmation";

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn text_body(app: &str, user: &str, session: &str, text: &str) -> Value {
    json!({
        "appName": app, "userId": user, "sessionId": session,
        "newMessage": {"role": "user", "parts": [{"text": text}]},
        "streaming": true, "createSession": true,
    })
}

/// A user message that answers function call `id` (a long-running tool's result, or a
/// confirmation).
fn answer_body(app: &str, session: &str, id: &str, name: &str, response: Value) -> Value {
    json!({
        "appName": app, "userId": USER, "sessionId": session,
        "newMessage": {"role": "user", "parts": [
            {"functionResponse": {"id": id, "name": name, "response": response}}
        ]},
        "streaming": true,
    })
}

async fn stored_events(s: &TestServer, app: &str, user: &str, session: &str) -> Vec<Value> {
    let v = json_with_status(
        s.get(&format!("/apps/{app}/users/{user}/sessions/{session}"))
            .await,
        200,
    )
    .await;
    v["events"].as_array().expect("events").clone()
}

fn parts(event: &Value) -> Vec<&Value> {
    event["content"]["parts"]
        .as_array()
        .map(|ps| ps.iter().collect())
        .unwrap_or_default()
}

fn calls_of(event: &Value) -> Vec<&Value> {
    parts(event)
        .into_iter()
        .filter_map(|p| p.get("functionCall"))
        .collect()
}

fn responses_of(event: &Value) -> Vec<&Value> {
    parts(event)
        .into_iter()
        .filter_map(|p| p.get("functionResponse"))
        .collect()
}

/// Every function response to call `id` among `events`, in order.
fn responses_to<'a>(events: &'a [Value], id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .flat_map(responses_of)
        .filter(|r| r["id"] == id)
        .collect()
}

fn long_running_ids(event: &Value) -> Vec<String> {
    event["longRunningToolIds"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn all_messages(request: &Value) -> &Vec<Value> {
    request["messages"].as_array().expect("messages")
}

/// The `tool` messages of a recorded model request answering call `id`.
fn tool_messages<'a>(request: &'a Value, id: &str) -> Vec<&'a Value> {
    all_messages(request)
        .iter()
        .filter(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .collect()
}

/// The JSON a tool message carries (its content is JSON text).
fn tool_content(message: &Value) -> Value {
    let text = message["content"].as_str().expect("tool content is text");
    serde_json::from_str(text).unwrap_or_else(|e| panic!("tool content is not JSON ({e}): {text}"))
}

/// Asserts the tool message for `id` comes right after the assistant message that made the
/// call (among that message's answers) and is the only one, and returns its JSON.
fn tool_result_after_call(request: &Value, id: &str) -> Value {
    let msgs = all_messages(request);
    let call_at = msgs
        .iter()
        .position(|m| {
            m["role"] == "assistant"
                && m["tool_calls"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["id"] == id))
        })
        .unwrap_or_else(|| panic!("no assistant message calls {id}: {msgs:#?}"));
    // The tool messages answering that assistant message follow it directly.
    let answer = msgs[call_at + 1..]
        .iter()
        .take_while(|m| m["role"] == "tool")
        .find(|m| m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("{id} is not answered right after its call: {msgs:#?}"));
    assert_eq!(tool_messages(request, id).len(), 1, "one answer: {msgs:#?}");
    tool_content(answer)
}

/// What OpenAI-compatible servers enforce: every `tool` message answers a call of the
/// assistant message right before its block of tool messages, and every call is answered
/// before the conversation goes on.
fn assert_well_formed(request: &Value) {
    let msgs = all_messages(request);
    let mut pending: Vec<String> = vec![];
    for (i, m) in msgs.iter().enumerate() {
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            let at = pending.iter().position(|p| p == id).unwrap_or_else(|| {
                panic!(
                    "message {i} answers call {id:?}, which the assistant message before it did \
                     not make (providers reject this): {msgs:#?}"
                )
            });
            pending.remove(at);
            continue;
        }
        assert!(
            pending.is_empty(),
            "calls {pending:?} are unanswered at message {i}: {msgs:#?}"
        );
        if m["role"] == "assistant" {
            pending = m["tool_calls"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .filter_map(|c| c["id"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
        }
    }
    assert!(
        pending.is_empty(),
        "calls {pending:?} are unanswered: {msgs:#?}"
    );
}

/// Every request the model server received so far is well-formed.
fn assert_requests_well_formed(m: &ScriptedModel) {
    for r in m.requests() {
        assert_well_formed(&r);
    }
}

/// The final answer (last complete event with text) of a run.
fn final_text(msgs: &[Msg]) -> String {
    complete(msgs)
        .iter()
        .rev()
        .map(text_of)
        .find(|t| !t.is_empty())
        .unwrap_or_default()
}

fn counting_tool(name: &str, calls: Arc<AtomicUsize>) -> FunctionTool {
    FunctionTool::new(name, "Deletes a file.", move |a: PathArgs, _ctx| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"deleted": a.path}))
        }
    })
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct PathArgs {
    /// The file.
    path: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct RequestArgs {
    /// What to ask for.
    request: String,
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cancel(s: &TestServer, resp: &reqwest::Response) {
    let run_id = resp
        .headers()
        .get("x-agentd-run-id")
        .expect("run id header")
        .to_str()
        .unwrap()
        .to_string();
    let r = s
        .client
        .post(s.url(&format!("/runs/{run_id}/cancel")))
        .send()
        .await
        .expect("cancel");
    assert_eq!(r.status().as_u16(), 202, "cancel accepted");
}

// ---------------------------------------------------------------------------------------
// Tool confirmation: the app and its first turn (`confirmations`, `forged_confirmations`)
// ---------------------------------------------------------------------------------------

struct ConfirmSetup {
    m: ScriptedModel,
    s: TestServer,
    /// Completed runs of the tool.
    calls: Arc<AtomicUsize>,
    /// Started runs of the tool.
    started: Arc<AtomicUsize>,
    /// While true, the tool takes minutes (until cancelled).
    slow: Arc<AtomicBool>,
    /// The id of the `adk_request_confirmation` call.
    request_id: String,
}

/// The app of the confirmation tests, before any run.
struct ConfirmApp {
    m: ScriptedModel,
    s: TestServer,
    /// Completed runs of the tool.
    calls: Arc<AtomicUsize>,
    /// Started runs of the tool.
    started: Arc<AtomicUsize>,
    /// While true, the tool takes minutes (until cancelled).
    slow: Arc<AtomicBool>,
}

/// App `confirm`: agent `ops` (model `ops-model`) with `delete_file`, a tool that requires
/// confirmation and answers `{"deleted": <path>}`.
async fn confirm_app(backend: Backend) -> ConfirmApp {
    let m = ScriptedModel::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let slow = Arc::new(AtomicBool::new(false));
    let (c, st, sl) = (calls.clone(), started.clone(), slow.clone());
    let delete = FunctionTool::new(
        "delete_file",
        "Deletes a file.",
        move |a: PathArgs, _ctx| {
            let (calls, started, slow) = (c.clone(), st.clone(), sl.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                if slow.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(120)).await;
                }
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"deleted": a.path}))
            }
        },
    )
    .require_confirmation();
    let agent = LlmAgent::new("ops", m.model("ops-model"))
        .instruction("You manage files.")
        .tool(delete);
    let s =
        TestServer::start_agent(backend, "confirm", Arc::new(agent), PluginSet::default()).await;
    ConfirmApp {
        m,
        s,
        calls,
        started,
        slow,
    }
}

/// Turn 1 of the confirmation flow: the model calls a tool that needs approval; the tool
/// does not run; the transcript has ADK's three events.
async fn confirmation_requested(backend: Backend) -> ConfirmSetup {
    let ConfirmApp {
        m,
        s,
        calls,
        started,
        slow,
    } = confirm_app(backend).await;
    m.push(
        "ops-model",
        Reply::tool_calls(&[("c1", "delete_file", r#"{"path":"/tmp/report.txt"}"#)]),
    );
    let msgs = s
        .run_stream(text_body("confirm", USER, "s1", "delete the report"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "not run before approval");
    assert_eq!(m.requests_for("ops-model").len(), 1, "model called once");

    let events = stored_events(&s, "confirm", USER, "s1").await;
    assert_eq!(
        events.len(),
        4,
        "user, call, response, confirmation request: {events:#?}"
    );
    assert_eq!(events[0]["author"], "user");

    let call = calls_of(&events[1]);
    assert_eq!(call.len(), 1);
    assert_eq!(call[0]["id"], "c1");
    assert_eq!(call[0]["name"], "delete_file");

    let resp = responses_of(&events[2]);
    assert_eq!(resp.len(), 1);
    assert_eq!(resp[0]["id"], "c1");
    assert_eq!(resp[0]["name"], "delete_file");
    assert_eq!(resp[0]["response"]["error"], CONFIRMATION_REQUIRED);
    let requested = &events[2]["actions"]["requestedToolConfirmations"];
    assert_eq!(requested["c1"]["confirmed"], false, "{requested}");
    assert!(
        requested["c1"]["hint"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "a hint for the user: {requested}"
    );

    let req_event = &events[3];
    assert_eq!(req_event["author"], "ops");
    assert_eq!(req_event["content"]["role"], "model");
    let req_call = calls_of(req_event);
    assert_eq!(req_call.len(), 1);
    assert_eq!(req_call[0]["name"], REQUEST_CONFIRMATION);
    let request_id = req_call[0]["id"].as_str().expect("id").to_string();
    assert_ne!(request_id, "c1");
    assert_eq!(long_running_ids(req_event), vec![request_id.clone()]);
    let args = &req_call[0]["args"];
    assert_eq!(args["originalFunctionCall"]["id"], "c1");
    assert_eq!(args["originalFunctionCall"]["name"], "delete_file");
    assert_eq!(
        args["originalFunctionCall"]["args"],
        json!({"path": "/tmp/report.txt"})
    );
    assert_eq!(args["toolConfirmation"]["confirmed"], false);
    assert_eq!(args["toolConfirmation"]["hint"], requested["c1"]["hint"]);

    // The client saw the same three events.
    let streamed = complete(&msgs);
    assert_eq!(streamed.len(), 3, "{streamed:#?}");
    assert_eq!(long_running_ids(&streamed[2]), vec![request_id.clone()]);
    ConfirmSetup {
        m,
        s,
        calls,
        started,
        slow,
        request_id,
    }
}
