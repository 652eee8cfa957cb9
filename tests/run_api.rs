//! The run endpoints over a real socket, on both backends: `/run_sse` framing against the
//! recorded `adk api_server` streams, agentd's `/run` (ids, `event: done`, JSON mode) and run
//! control, errors before and after the first byte, artifacts, callbacks and plugins, agent
//! selection, admission under concurrency, cancel, client disconnect, and a crashed replica.
//!
//! Streams are parsed with `eventsource-stream` over reqwest's `bytes_stream()`, and the raw
//! bytes are kept as well wherever the framing itself is what is being proved.

mod common;

use agentd::agent::{
    Agent, AgentCallbacks, AgentResult, AgentTree, CallbackContext, InvocationContext, Plugin,
    PluginSet,
};
use agentd::apps::AppRegistry;
use agentd::event::{decode_base64_any, Content, Event, Part};
use async_trait::async_trait;
use base64::Engine;
use common::sse_client::{Msg, Sse};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// An ADK error message with its timestamp (the one value that differs per run) cut off.
fn without_timestamp(frame: &str) -> &str {
    let (head, ts) = frame
        .rsplit_once("\"timestamp\": ")
        .unwrap_or_else(|| panic!("no timestamp in {frame}"));
    let ts = ts.strip_suffix("}}").expect("error message ends with }}");
    assert!(ts.parse::<f64>().is_ok(), "timestamp {ts:?}");
    head
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

/// The message just before `event: done`, which a cancelled run's stream ends with.
fn aborted_then_done(msgs: &[Msg]) -> &Msg {
    assert!(msgs.len() >= 2, "{msgs:#?}");
    &msgs[msgs.len() - 2]
}

fn assert_aborted(event: &Value, author: &str) {
    assert_eq!(event["errorCode"], "INVOCATION_ABORTED", "{event}");
    assert_eq!(event["errorMessage"], "Invocation was aborted by client.");
    assert_eq!(event["author"], author);
}

// ---------------------------------------------------------------------------------------
// /run_sse framing and storage
// ---------------------------------------------------------------------------------------

async fn run_sse_framing_is_byte_exact_adk(backend: Backend) {
    let apps = Apps::new().echo("echo_agent", "chunks: 3");
    let s = apps.serve(backend).await;
    create_session(&s, "echo_agent", "s1").await;
    let mut sse = run_sse(&s, run_body("echo_agent", "s1", "Hello, world")).await;
    let msgs = sse.rest().await;

    assert_eq!(
        sse.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert_eq!(sse.header("transfer-encoding"), Some("chunked"));
    for absent in [
        "content-length",
        "cache-control",
        "x-accel-buffering",
        "content-encoding",
    ] {
        assert_eq!(sse.header(absent), None, "{absent}");
    }

    // ADK's shapes (fixture 031): a partial chunk, and the final event minus the state keys
    // ADK's echo agent writes and ours does not.
    let adk = fixture_frames("031");
    let partial_shape = skeleton(&adk[0]);
    let final_shape = skeleton(&adk[3]).replace(
        r#","last_input":"…","app:total_turns":0,"user:name":"…""#,
        "",
    );
    let frames = sse.frames();
    assert_eq!(frames.len(), 4, "three chunks and the reply: {frames:#?}");
    assert_eq!(msgs.len(), frames.len());
    for (i, (frame, msg)) in frames.iter().zip(&msgs).enumerate() {
        let json = frame
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("message {i} is not one data line: {frame:?}"));
        assert!(!json.contains('\n'), "one line per message: {frame:?}");
        assert_eq!((msg.event.as_str(), msg.id.as_str()), ("message", ""));
        assert_eq!(serde_json::from_str::<Value>(json).unwrap(), msg.data);
        let shape = if i < 3 { &partial_shape } else { &final_shape };
        assert_eq!(&skeleton(frame), shape, "message {i} differs from ADK's");
    }

    let events: Vec<&Value> = msgs.iter().map(|m| &m.data).collect();
    let partials: Vec<String> = events[..3].iter().map(|e| text(e)).collect();
    assert_eq!(partials, ["Hell", "o, w", "orld"]);
    assert!(events[..3].iter().all(|e| e["partial"] == true));
    let reply = events[3];
    assert!(
        reply.get("partial").is_none(),
        "complete events carry no partial key"
    );
    assert_eq!(text(reply), "Hello, world");
    assert_eq!(reply["actions"]["stateDelta"], json!({ "turns": 1 }));
    let invocation = reply["invocationId"].as_str().unwrap();
    assert!(invocation.starts_with("e-"), "{invocation}");
    for e in &events {
        assert_eq!(e["invocationId"], invocation);
        assert_eq!(e["author"], "echo_agent", "the user event is not streamed");
        assert_eq!(e["nodeInfo"], json!({ "path": "" }));
        for map in [
            "stateDelta",
            "artifactDelta",
            "requestedAuthConfigs",
            "requestedToolConfirmations",
        ] {
            assert!(e["actions"][map].is_object(), "actions.{map} in {e}");
        }
    }
    let ids: HashSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids.len(),
        4,
        "a custom agent's chunks have ids of their own"
    );
}

async fn partial_events_are_streamed_but_never_stored(backend: Backend) {
    let apps = Apps::new().echo("echo_agent", "chunks: 3");
    let s = apps.serve(backend).await;
    create_session(&s, "echo_agent", "s1").await;
    let mut streamed = vec![];
    for message in ["first message", "second message"] {
        let msgs = run_sse(&s, run_body("echo_agent", "s1", message))
            .await
            .rest()
            .await;
        assert_eq!(msgs.iter().filter(|m| m.is_partial()).count(), 3);
        streamed.extend(complete(&msgs).into_iter().cloned());
    }

    let session = stored_session(&s, "echo_agent", "s1").await;
    let stored = session["events"].as_array().unwrap();
    assert_eq!(stored.len(), 4, "user, reply, user, reply: {stored:#?}");
    for (turn, message) in ["first message", "second message"].iter().enumerate() {
        let (user, reply) = (&stored[2 * turn], &stored[2 * turn + 1]);
        assert_eq!(user["author"], "user");
        assert_eq!(user["content"]["role"], "user");
        assert_eq!(text(user), *message);
        assert_eq!(user["invocationId"], reply["invocationId"]);
        assert_eq!(
            reply, &streamed[turn],
            "what the client got is what is stored"
        );
    }
    assert_eq!(session["state"]["turns"], 2);

    let events = transcript(&s, "echo_agent", "s1").await;
    assert_eq!(events.len(), 4);
    assert_eq!(events[0]["author"], "user", "the user event comes first");
}

// ---------------------------------------------------------------------------------------
// /run and run records
// ---------------------------------------------------------------------------------------

async fn run_streams_seq_ids_and_ends_with_done(backend: Backend) {
    let apps = Apps::new().echo("echo_agent", "chunks: 3\ncall_tool: lookup");
    let s = apps.serve(backend).await;
    create_session(&s, "echo_agent", "s1").await;
    let mut sse = run(&s, run_body("echo_agent", "s1", "hello")).await;
    let msgs = sse.rest().await;
    let run_id = sse.run_id();
    assert!(run_id.starts_with("run-"), "{run_id}");
    assert_eq!(
        sse.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert_eq!(sse.header("cache-control"), Some("no-cache"));

    // Raw framing: committed events have `id: <seq>`, partials none, `event: done` last.
    let frames = sse.frames();
    let (last, events) = frames.split_last().unwrap();
    let mut ids = vec![];
    for frame in events {
        let data = match frame.strip_prefix("id: ") {
            Some(rest) => {
                let (id, data) = rest.split_once('\n').expect("id line, then data");
                ids.push(id.parse::<i64>().expect("numeric id"));
                let data = data.strip_prefix("data: ").expect("data line");
                assert!(
                    !data.contains("\"partial\""),
                    "only committed events have ids"
                );
                data
            }
            None => {
                let data = frame.strip_prefix("data: ").expect("a bare data line");
                assert!(data.contains("\"partial\":true"), "{frame}");
                data
            }
        };
        assert!(!data.contains('\n'));
    }
    // The user event is seq 1 (not streamed); call, response and reply follow.
    assert_eq!(ids, [2, 3, 4]);
    assert!(last.starts_with("event: done\ndata: "), "{last:?}");

    // The same stream as an SSE client parses it.
    let committed: Vec<&Msg> = msgs
        .iter()
        .filter(|m| m.is_event() && !m.is_partial())
        .collect();
    let parsed_ids: Vec<&str> = committed.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(parsed_ids, ["2", "3", "4"]);
    assert_eq!(msgs.iter().filter(|m| m.is_partial()).count(), 3);
    let finish = done(&msgs);
    assert_eq!(finish["status"], "completed");
    assert_eq!(finish["lastSeq"], 4);
    assert_eq!(finish["runId"], run_id.as_str());
    assert_eq!(finish["invocationId"], committed[0].data["invocationId"]);

    let record = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(record["status"], "completed");
    assert_eq!(record["lastSeq"], 4);
    assert_eq!(record["invocationId"], finish["invocationId"]);
    assert_eq!(
        (&record["appName"], &record["userId"], &record["sessionId"]),
        (&json!("echo_agent"), &json!(USER), &json!("s1"))
    );
    assert_eq!(record["cancelRequested"], false);
    let at = |k: &str| {
        record[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} in {record}"))
    };
    assert!(at("createdAt") <= at("startedAt") && at("startedAt") <= at("finishedAt"));

    let missing = s.get("/runs/run-nope").await;
    let body = json_with_status(missing, 404).await;
    assert_eq!(
        body,
        json!({ "detail": "Run not found", "code": "run_not_found" })
    );
}

async fn run_answers_the_adk_json_array_when_asked(backend: Backend) {
    let apps = Apps::new().echo("echo_agent", "chunks: 3");
    let s = apps.serve(backend).await;
    create_session(&s, "echo_agent", "s1").await;
    let resp = s
        .client
        .post(s.url("/run"))
        .header("accept", "application/json")
        .json(&run_body("echo_agent", "s1", "Hello, world"))
        .send()
        .await
        .unwrap();
    assert!(resp.headers().contains_key("x-agentd-run-id"));
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert_eq!(content_type, "application/json");
    let events = json_with_status(resp, 200).await;
    let events = events.as_array().expect("a JSON array of events");
    let partials: Vec<String> = events
        .iter()
        .filter(|e| e["partial"] == true)
        .map(text)
        .collect();
    assert_eq!(partials, ["Hell", "o, w", "orld"], "partials included");
    assert_eq!(events.len(), 4);
    assert_eq!(text(&events[3]), "Hello, world");

    let stored = transcript(&s, "echo_agent", "s1").await;
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1]["id"], events[3]["id"]);
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

async fn agent_failure_ends_the_stream_with_an_adk_error_message(backend: Backend) {
    let apps = Apps::new().echo("echo_agent", "chunks: 1\nfail_prefix: error");
    let s = apps.serve(backend).await;
    create_session(&s, "echo_agent", "s1").await;
    let mut sse = run_sse(&s, run_body("echo_agent", "s1", "error please")).await;
    let msgs = sse.rest().await;

    let adk = fixture_frames("080");
    let frames = sse.frames();
    assert_eq!(frames.len(), 2, "one partial, then the error: {frames:#?}");
    assert_eq!(skeleton(&frames[0]), skeleton(&adk[0]));
    assert_eq!(text(&msgs[0].data), "error please");
    // Python json.dumps spacing, exactly as ADK writes it (the agent has ADK's name).
    assert_eq!(without_timestamp(&frames[1]), without_timestamp(&adk[1]));
    assert_eq!(
        msgs[1].data["error"],
        "RuntimeError: deliberate failure from echo_agent"
    );
    assert_eq!(msgs[1].data["error_details"]["error_type"], "RuntimeError");

    let record = finished_run(&s, &sse.run_id()).await;
    assert_eq!(record["status"], "failed");
    assert!(record["error"].as_str().unwrap().contains("RuntimeError"));
    let stored = transcript(&s, "echo_agent", "s1").await;
    assert_eq!(stored.len(), 1, "the user event stays: {stored:#?}");
    assert_eq!(text(&stored[0]), "error please");

    // agentd's /run reports the same failure as `event: error`, then `event: done`.
    let msgs = run(&s, run_body("echo_agent", "s1", "error again"))
        .await
        .rest()
        .await;
    let kinds: Vec<&str> = msgs.iter().map(|m| m.event.as_str()).collect();
    assert_eq!(kinds, ["message", "error", "done"]);
    assert_eq!(msgs[1].data["code"], "run_failed");
    assert_eq!(msgs[1].data["errorType"], "RuntimeError");
    assert_eq!(done(&msgs)["status"], "failed");
}

/// Posts `body` and expects a JSON error (no event stream) with `status`.
async fn json_error(s: &TestServer, endpoint: &str, body: Value, status: u16) -> Value {
    let resp = s.post_json(endpoint, body).await;
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert_eq!(content_type, "application/json", "{endpoint}");
    json_with_status(resp, status).await
}

async fn errors_before_the_stream_are_plain_json(backend: Backend) {
    let apps = Apps::new().echo("echo_agent", "chunks: 1");
    let s = apps.serve(backend).await;
    create_session(&s, "echo_agent", "s1").await;
    let good = run_body("echo_agent", "s1", "hi");
    let mut no_app = good.clone();
    no_app.as_object_mut().unwrap().remove("appName");
    let cases = [
        (
            with(good.clone(), json!({ "appName": "no_such_app" })),
            404,
            "Agent not found: 'no_such_app'. No matching directory or module exists in '",
        ),
        (
            with(good.clone(), json!({ "sessionId": "ghost" })),
            404,
            "Session not found: ghost",
        ),
        (
            no_app,
            400,
            "app_name is required when ADK_DEFAULT_APP_NAME is not set",
        ),
    ];
    for endpoint in ["/run_sse", "/run"] {
        for (body, status, detail) in &cases {
            let error = json_error(&s, endpoint, body.clone(), *status).await;
            let got = error["detail"].as_str().unwrap_or_default();
            assert!(got.starts_with(detail), "{endpoint}: {error}");
        }
        let malformed = s
            .client
            .post(s.url(endpoint))
            .header("content-type", "application/json")
            .body(r#"{"appName":"echo_agent","userId":"#)
            .send()
            .await
            .unwrap();
        let malformed = json_with_status(malformed, 422).await;
        assert_eq!(malformed["detail"][0]["type"], "json_invalid");
    }
    assert_eq!(
        transcript(&s, "echo_agent", "s1").await.len(),
        0,
        "nothing ran"
    );

    // `createSession: true` creates the session instead of answering 404.
    let create = with(
        run_body("echo_agent", "fresh", "hi"),
        json!({ "createSession": true }),
    );
    let msgs = run_sse(&s, create).await.rest().await;
    assert_eq!(complete(&msgs).len(), 1);
    assert_eq!(
        stored_session(&s, "echo_agent", "fresh").await["events"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // No message: ADK answers 200 and reports it in the stream (fixture 078).
    let mut sse = run_sse(&s, with(good, json!({ "newMessage": null }))).await;
    let msgs = sse.rest().await;
    let frames = sse.frames();
    assert_eq!(frames.len(), 1);
    assert_eq!(
        without_timestamp(&frames[0]),
        without_timestamp(&fixture_frames("078")[0])
    );
    assert!(msgs[0].data["error"]
        .as_str()
        .unwrap()
        .starts_with("ValueError: "));
    assert_eq!(transcript(&s, "echo_agent", "s1").await.len(), 0);
}

// ---------------------------------------------------------------------------------------
// Artifacts
// ---------------------------------------------------------------------------------------

/// Saves `report.txt`, then says so.
struct Reporter;

#[async_trait]
impl Agent for Reporter {
    fn name(&self) -> &str {
        "reporter"
    }

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        ctx.save_artifact("report.txt", Part::text("quarterly numbers"));
        ctx.emit(
            ctx.new_event()
                .with_content(Content::text("model", "report saved")),
        )
        .await?;
        Ok(())
    }
}

async fn run_sse_splits_an_event_with_content_and_an_artifact_delta(backend: Backend) {
    let mut apps = AppRegistry::default();
    apps.insert("reports", AgentTree::new(Arc::new(Reporter)).unwrap());
    let s = TestServer::start_embedded(backend, apps, PluginSet::default()).await;
    create_session(&s, "reports", "s1").await;
    let msgs = run_sse(&s, run_body("reports", "s1", "go"))
        .await
        .rest()
        .await;

    assert_eq!(msgs.len(), 2, "{msgs:#?}");
    let (first, second) = (&msgs[0].data, &msgs[1].data);
    assert_eq!(first["id"], second["id"], "both halves share the event id");
    assert_eq!(text(first), "report saved");
    assert_eq!(first["actions"]["artifactDelta"], json!({}));
    assert!(second.get("content").is_none(), "{second}");
    assert_eq!(
        second["actions"]["artifactDelta"],
        json!({ "report.txt": 0 })
    );

    let stored = stored_session(&s, "reports", "s1").await;
    let events = stored["events"].as_array().unwrap();
    assert_eq!(
        events.len(),
        2,
        "user event and ONE agent event: {events:#?}"
    );
    assert_eq!(events[1]["id"], first["id"]);
    assert_eq!(text(&events[1]), "report saved");
    assert_eq!(
        events[1]["actions"]["artifactDelta"],
        json!({ "report.txt": 0 })
    );

    let path = format!("{}/artifacts/report.txt", session_path("reports", "s1"));
    let artifact = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(artifact, json!({ "text": "quarterly numbers" }));

    // agentd's /run sends the event whole.
    let msgs = run(&s, run_body("reports", "s1", "again"))
        .await
        .rest()
        .await;
    let events = complete(&msgs);
    assert_eq!(events.len(), 1);
    assert_eq!(text(events[0]), "report saved");
    assert_eq!(
        events[0]["actions"]["artifactDelta"],
        json!({ "report.txt": 1 })
    );
}

async fn input_blobs_are_saved_as_artifacts(backend: Backend) {
    let apps = Apps::new().echo("echo_agent", "chunks: 0");
    let s = apps.serve(backend).await;
    create_session(&s, "echo_agent", "s1").await;
    let bytes = b"\x00\xffblob bytes".to_vec();
    let body = json!({
        "appName": "echo_agent", "userId": USER, "sessionId": "s1",
        "saveInputBlobsAsArtifacts": true,
        "newMessage": { "role": "user", "parts": [
            { "text": "see attached. " },
            { "inlineData": {
                "mimeType": "application/octet-stream",
                "data": base64::engine::general_purpose::URL_SAFE.encode(&bytes),
            } },
        ] },
    });
    let reply = run_sse(&s, body).await.rest().await;
    let reply = complete(&reply)[0];
    let invocation = reply["invocationId"].as_str().unwrap();
    let filename = format!("artifact_{invocation}_1");
    let placeholder = format!("Uploaded file: {filename}. It is saved into artifacts");
    assert_eq!(text(reply), format!("see attached. {placeholder}"));

    let stored = transcript(&s, "echo_agent", "s1").await;
    assert_eq!(
        stored[0]["content"]["parts"],
        json!([{ "text": "see attached. " }, { "text": placeholder }]),
        "the stored user event has the placeholder, not the blob"
    );

    let path = format!("{}/artifacts/{filename}", session_path("echo_agent", "s1"));
    let artifact = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(
        artifact["inlineData"]["mimeType"],
        "application/octet-stream"
    );
    let data = artifact["inlineData"]["data"].as_str().unwrap();
    assert_eq!(decode_base64_any(data).expect("base64"), bytes);
}

/// A message the store refuses is a client error before the stream starts: 413 JSON, nothing
/// stored, and the session is free for the next run at once.
async fn an_oversize_input_blob_is_refused_before_the_stream(backend: Backend) {
    let dir = Apps::new().echo("echo_agent", "chunks: 0");
    let path = dir.path().to_path_buf();
    let s = TestServer::start_with(backend, |args| {
        args.apps_dir = path;
        args.max_artifact_bytes = 16;
    })
    .await;
    create_session(&s, "echo_agent", "s1").await;
    let before = json_with_status(s.get(&session_path("echo_agent", "s1")).await, 200).await;
    let body = json!({
        "appName": "echo_agent", "userId": USER, "sessionId": "s1",
        "saveInputBlobsAsArtifacts": true,
        "newMessage": { "role": "user", "parts": [{ "inlineData": {
            "mimeType": "application/octet-stream",
            "data": base64::engine::general_purpose::URL_SAFE.encode([7u8; 64]),
        } }] },
    });
    let refused = s.post_json("/run_sse", body).await;
    let error = json_with_status(refused, 413).await;
    assert_eq!(error["code"], "artifact_too_large");

    let after = json_with_status(s.get(&session_path("echo_agent", "s1")).await, 200).await;
    assert_eq!(after, before, "the refused run stored nothing");
    let artifacts = json_with_status(
        s.get(&format!("{}/artifacts", session_path("echo_agent", "s1")))
            .await,
        200,
    )
    .await;
    assert_eq!(artifacts, json!([]));

    let reply = run_sse(&s, run_body("echo_agent", "s1", "next"))
        .await
        .rest()
        .await;
    assert_eq!(
        text(complete(&reply)[0]),
        "next",
        "the session is not left busy"
    );
}

// ---------------------------------------------------------------------------------------
// Callbacks and plugins
// ---------------------------------------------------------------------------------------

/// Answers every run whose message is `closed?` itself, before any agent runs.
struct Gate;

#[async_trait]
impl Plugin for Gate {
    fn name(&self) -> &str {
        "gate"
    }

    async fn before_run(&self, ctx: &InvocationContext) -> AgentResult<Option<Content>> {
        Ok((ctx.user_text() == "closed?").then(|| Content::text("model", "We are closed.")))
    }
}

/// Stamps every agent event with `customMetadata.audited`.
struct Audit;

#[async_trait]
impl Plugin for Audit {
    fn name(&self) -> &str {
        "audit"
    }

    async fn on_event(&self, _ctx: &InvocationContext, event: &mut Event) -> AgentResult {
        event
            .custom_metadata
            .get_or_insert_with(Default::default)
            .insert("audited".into(), json!(true));
        Ok(())
    }
}

/// `intercepted`: a before callback answers instead of the echo agent.
/// `signed`: an after callback appends a signature.
async fn callback_server(backend: Backend) -> TestServer {
    let echo = |name: &str, callbacks: AgentCallbacks| {
        let mut agent = agentd::agent::echo::EchoAgent::new(name);
        agent.callbacks = Some(callbacks);
        AgentTree::new(Arc::new(agent)).unwrap()
    };
    let before = AgentCallbacks::default().before(|cb: CallbackContext| async move {
        cb.set_state("checked", json!(true));
        Ok(Some(Content::text("model", "intercepted by callback")))
    });
    let after = AgentCallbacks::default().after(|cb: CallbackContext| async move {
        cb.set_state("signed", json!(true));
        Ok(Some(Content::text("model", "-- signed")))
    });
    let mut apps = AppRegistry::default();
    apps.insert("intercepted", echo("intercepted", before));
    apps.insert("signed", echo("signed", after));
    let plugins = PluginSet::new(vec![Arc::new(Gate), Arc::new(Audit)]).unwrap();
    TestServer::start_embedded(backend, apps, plugins).await
}

async fn before_agent_callback_answers_instead_of_the_agent(backend: Backend) {
    let s = callback_server(backend).await;
    create_session(&s, "intercepted", "s1").await;
    let msgs = run_sse(&s, run_body("intercepted", "s1", "echo me"))
        .await
        .rest()
        .await;
    assert_eq!(msgs.len(), 1, "the agent never ran: {msgs:#?}");
    let event = &msgs[0].data;
    assert_eq!(text(event), "intercepted by callback");
    assert_eq!(event["author"], "intercepted");
    assert_eq!(event["actions"]["stateDelta"], json!({ "checked": true }));

    let session = stored_session(&s, "intercepted", "s1").await;
    assert_eq!(session["state"]["checked"], true);
    let events = session["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(&events[1], event);
}

async fn after_agent_callback_appends_an_event(backend: Backend) {
    let s = callback_server(backend).await;
    create_session(&s, "signed", "s1").await;
    let events = turn(&s, "signed", "s1", "hello").await;
    let texts: Vec<String> = events.iter().map(text).collect();
    assert_eq!(texts, ["hello", "-- signed"]);
    assert_eq!(
        events[1]["actions"]["stateDelta"],
        json!({ "signed": true })
    );
    let stored = transcript(&s, "signed", "s1").await;
    let stored_texts: Vec<String> = stored.iter().map(text).collect();
    assert_eq!(stored_texts, ["hello", "hello", "-- signed"]);
}

async fn plugin_before_run_ends_the_run_early(backend: Backend) {
    let s = callback_server(backend).await;
    create_session(&s, "signed", "s1").await;
    let msgs = run_sse(&s, run_body("signed", "s1", "closed?"))
        .await
        .rest()
        .await;
    assert_eq!(msgs.len(), 1, "no agent, no callback: {msgs:#?}");
    assert_eq!(text(&msgs[0].data), "We are closed.");
    assert_eq!(msgs[0].data["author"], "signed", "the root agent's event");
    let stored = transcript(&s, "signed", "s1").await;
    assert_eq!(stored.len(), 2);
    assert_eq!(text(&stored[1]), "We are closed.");
}

async fn plugin_on_event_rewrites_streamed_and_stored_events(backend: Backend) {
    let s = callback_server(backend).await;
    create_session(&s, "signed", "s1").await;
    let msgs = run_sse(&s, run_body("signed", "s1", "hello"))
        .await
        .rest()
        .await;
    assert!(msgs.iter().any(Msg::is_partial));
    for m in &msgs {
        assert_eq!(
            m.data["customMetadata"],
            json!({ "audited": true }),
            "{m:?}"
        );
    }
    let stored = transcript(&s, "signed", "s1").await;
    assert!(
        stored[0].get("customMetadata").is_none(),
        "the user event is not an agent's"
    );
    assert_eq!(stored.len(), 3);
    for e in &stored[1..] {
        assert_eq!(e["customMetadata"], json!({ "audited": true }));
    }
}

// ---------------------------------------------------------------------------------------
// Agent selection
// ---------------------------------------------------------------------------------------

/// `relay` (echo) with sub-agents `child` and `other`; `strict` the same with a `child` that
/// disallows transfer back to its parent; `pipeline` a sequence of `first` and `second`.
fn selection_apps() -> Apps {
    let sub_agents = |files: [&str; 2]| {
        let refs: String = files.map(|f| format!("  - config_path: {f}\n")).concat();
        format!("sub_agents:\n{refs}")
    };
    let mut apps = Apps::new();
    for (app, child) in [
        ("relay", ""),
        ("strict", "disallow_transfer_to_parent: true"),
    ] {
        let root = format!("chunks: 0\n{}", sub_agents(["child.yaml", "other.yaml"]));
        apps = apps
            .agent(app, "root_agent.yaml", "EchoAgent", app, &root)
            .agent(
                app,
                "child.yaml",
                "EchoAgent",
                "child",
                &format!("chunks: 0\n{child}"),
            )
            .agent(app, "other.yaml", "EchoAgent", "other", "chunks: 0");
    }
    let steps = sub_agents(["first.yaml", "second.yaml"]);
    apps.agent(
        "pipeline",
        "root_agent.yaml",
        "SequentialAgent",
        "pipeline",
        &steps,
    )
    .agent("pipeline", "first.yaml", "EchoAgent", "first", "chunks: 0")
    .agent(
        "pipeline",
        "second.yaml",
        "EchoAgent",
        "second",
        "chunks: 0",
    )
}

async fn turn_authors(s: &TestServer, app: &str, text: &str) -> Vec<String> {
    authors(&turn(s, app, "s1", text).await)
}

async fn a_transfer_keeps_the_conversation_with_the_agent_that_spoke_last(backend: Backend) {
    let apps = selection_apps();
    let s = apps.serve(backend).await;
    create_session(&s, "relay", "s1").await;
    let first = turn(&s, "relay", "s1", "@child hi").await;
    assert_eq!(authors(&first), ["relay", "child"]);
    assert_eq!(first[0]["actions"]["transferToAgent"], "child");
    assert_eq!(text(&first[1]), "@child hi");
    assert_eq!(turn_authors(&s, "relay", "and now?").await, ["child"]);
    assert_eq!(turn_authors(&s, "relay", "still you?").await, ["child"]);
}

/// Selection reads the newest events: a transfer after a long conversation with the root
/// (more than a page of history) still keeps the next turn at the sub-agent.
async fn selection_looks_at_the_newest_events_of_a_long_session(backend: Backend) {
    let apps = selection_apps();
    let s = apps.serve(backend).await;
    create_session(&s, "relay", "s1").await;
    for i in 0..30 {
        assert_eq!(
            turn_authors(&s, "relay", &format!("turn {i}")).await,
            ["relay"]
        );
    }
    assert_eq!(
        turn_authors(&s, "relay", "@child hi").await,
        ["relay", "child"]
    );
    assert_eq!(turn_authors(&s, "relay", "and now?").await, ["child"]);
}

async fn an_agent_that_disallows_transfer_to_parent_hands_the_next_turn_to_the_root(
    backend: Backend,
) {
    let apps = selection_apps();
    let s = apps.serve(backend).await;
    create_session(&s, "strict", "s1").await;
    assert_eq!(
        turn_authors(&s, "strict", "@child hi").await,
        ["strict", "child"]
    );
    assert_eq!(turn_authors(&s, "strict", "and now?").await, ["strict"]);
}

async fn a_workflow_turn_starts_again_at_the_root(backend: Backend) {
    let apps = selection_apps();
    let s = apps.serve(backend).await;
    create_session(&s, "pipeline", "s1").await;
    for message in ["one", "two"] {
        assert_eq!(
            turn_authors(&s, "pipeline", message).await,
            ["first", "second"]
        );
    }
}

// ---------------------------------------------------------------------------------------
// Admission: one run per session
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

async fn concurrent_runs_on_one_session_admit_one_and_reject_the_rest(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let outcomes = futures::future::join_all(
        (0..20).map(|i| run_to_end(&s, run_body("slow", "s1", &format!("message {i}")))),
    )
    .await;

    let mut winners = vec![];
    for outcome in outcomes {
        match outcome {
            Ok(msgs) => winners.push(msgs),
            Err((status, body)) => {
                assert_eq!(status, 409, "{body}");
                assert_eq!(body["code"], "session_busy", "{body}");
            }
        }
    }
    assert_eq!(winners.len(), 1, "exactly one run is admitted");
    let winner = &winners[0];
    assert_eq!(done(winner)["status"], "completed");

    let stored = transcript(&s, "slow", "s1").await;
    assert_eq!(stored.len(), 2, "one run's events only: {stored:#?}");
    let invocation = &complete(winner)[0]["invocationId"];
    assert!(stored.iter().all(|e| &e["invocationId"] == invocation));
    assert_eq!(text(&stored[0]), text(&stored[1]));
}

async fn enqueued_runs_on_one_session_all_complete_one_after_another(backend: Backend) {
    let apps = Apps::new().echo("quick", "chunks: 5\nchunk_delay_ms: 20");
    let s = apps.serve(backend).await;
    create_session(&s, "quick", "s1").await;
    let outcomes = futures::future::join_all((0..20).map(|i| {
        let body = run_body("quick", "s1", &format!("message {i}"));
        run_to_end(&s, with(body, json!({ "onBusy": "enqueue" })))
    }))
    .await;
    for outcome in outcomes {
        let msgs = outcome.unwrap_or_else(|(status, body)| panic!("{status}: {body}"));
        assert_eq!(done(&msgs)["status"], "completed");
    }

    let stored = transcript(&s, "quick", "s1").await;
    assert_eq!(stored.len(), 40, "20 turns of user event and reply");
    let mut messages = BTreeSet::new();
    for (n, pair) in stored.chunks(2).enumerate() {
        let (user, reply) = (&pair[0], &pair[1]);
        assert_eq!(user["author"], "user", "turn {n}: {pair:#?}");
        assert_eq!(reply["author"], "quick");
        assert_eq!(
            user["invocationId"], reply["invocationId"],
            "turn {n} is contiguous"
        );
        assert_eq!(text(user), text(reply));
        assert_eq!(reply["actions"]["stateDelta"]["turns"], n + 1);
        messages.insert(text(user));
    }
    assert_eq!(messages.len(), 20, "every request ran once");
    // A waiting request's user event is stamped when it is committed, not when it arrived:
    // the transcript's timestamps never go backwards.
    let stamps: Vec<f64> = stored
        .iter()
        .map(|e| e["timestamp"].as_f64().unwrap())
        .collect();
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "timestamps in commit order: {stamps:?}"
    );
}

async fn interrupt_cancels_the_running_run_and_starts_the_new_one(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let mut first = run(&s, run_body("slow", "s1", "first")).await;
    first.until(Msg::is_partial).await;

    let second = with(
        run_body("slow", "s1", "second"),
        json!({ "onBusy": "interrupt" }),
    );
    let mut second = run(&s, second).await;
    let first_msgs = first.rest().await;
    assert_aborted(&aborted_then_done(&first_msgs).data, "slow");
    assert_eq!(done(&first_msgs)["status"], "cancelled");
    assert_eq!(done(&second.rest().await)["status"], "completed");
    assert_eq!(
        finished_run(&s, &first.run_id()).await["status"],
        "cancelled"
    );

    let stored = transcript(&s, "slow", "s1").await;
    let texts: Vec<String> = stored.iter().map(text).collect();
    assert_eq!(texts, ["first", "", "second", "second"]);
    assert_aborted(&stored[1], "slow");
}

// ---------------------------------------------------------------------------------------
// Cancel and disconnect
// ---------------------------------------------------------------------------------------

async fn cancel_seals_the_transcript_and_frees_the_session(backend: Backend) {
    let apps = Apps::new().echo("slow", &format!("{SLOW}\ncall_tool: lookup"));
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let mut sse = run(&s, run_body("slow", "s1", "take your time")).await;
    let run_id = sse.run_id();
    let mut msgs = sse.until(Msg::is_partial).await;
    let call_id = msgs[0].data["content"]["parts"][0]["functionCall"]["id"].clone();
    assert!(call_id.is_string(), "{:?}", msgs[0]);

    let resp = s
        .post_json(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    let accepted = json_with_status(resp, 202).await;
    assert_eq!(accepted["runId"], run_id.as_str());
    assert_eq!(accepted["cancelRequested"], true);
    msgs.extend(sse.rest().await);

    let finish = done(&msgs);
    assert_eq!(finish["status"], "cancelled");
    let abort = aborted_then_done(&msgs);
    assert_aborted(&abort.data, "slow");
    assert_eq!(
        finish["lastSeq"].to_string(),
        abort.id,
        "lastSeq is the last id"
    );
    let events = complete(&msgs);
    let sealed_call = events[events.len() - 2];
    let response = &sealed_call["content"]["parts"][0]["functionResponse"];
    assert_eq!(response["id"], call_id, "the open call is answered");
    assert!(response["response"]["error"].is_string(), "{response}");

    let stored = transcript(&s, "slow", "s1").await;
    assert_eq!(
        stored.len(),
        4,
        "user, call, error response, abort: {stored:#?}"
    );
    assert_eq!(stored[2]["id"], sealed_call["id"]);
    assert_aborted(stored.last().unwrap(), "slow");
    assert_eq!(finished_run(&s, &run_id).await["status"], "cancelled");

    // The session takes a new run at once; the old run cannot be cancelled again.
    let next = run_to_end(&s, run_body("slow", "s1", "again"))
        .await
        .unwrap();
    assert_eq!(done(&next)["status"], "completed");
    let resp = s
        .post_json(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(json_with_status(resp, 409).await["code"], "run_not_active");
    let resp = s.post_json("/runs/run-nope/cancel", json!({})).await;
    assert_eq!(json_with_status(resp, 404).await["code"], "run_not_found");
}

async fn a_client_disconnect_cancels_the_run_and_seals_the_transcript(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let mut sse = run_sse(&s, run_body("slow", "s1", "are you there?")).await;
    let run_id = sse.run_id();
    sse.until(Msg::is_partial).await;
    drop(sse);

    assert_eq!(finished_run(&s, &run_id).await["status"], "cancelled");
    let stored = transcript(&s, "slow", "s1").await;
    assert_eq!(stored.len(), 2, "{stored:#?}");
    assert_aborted(&stored[1], "slow");
}

async fn with_on_disconnect_continue_the_run_completes_without_its_client(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let body = with(
        run_body("slow", "s1", "finish anyway"),
        json!({ "onDisconnect": "continue" }),
    );
    let mut sse = run_sse(&s, body).await;
    let run_id = sse.run_id();
    sse.until(Msg::is_partial).await;
    drop(sse);

    assert_eq!(finished_run(&s, &run_id).await["status"], "completed");
    let stored = transcript(&s, "slow", "s1").await;
    let texts: Vec<String> = stored.iter().map(text).collect();
    assert_eq!(texts, ["finish anyway", "finish anyway"]);
}

// ---------------------------------------------------------------------------------------
// Background runs
// ---------------------------------------------------------------------------------------

/// A run started without a client: 202 with the run and its links once admitted, it completes
/// alone, `wait` returns it ended, and its stream replays the whole run to `done`.
async fn a_background_run_completes_alone_and_replays(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let path = format!("{}/runs", session_path("slow", "s1"));
    let resp = s
        .post_json(
            &path,
            json!({"newMessage": {"role": "user", "parts": [{"text": "later"}]}}),
        )
        .await;
    assert_eq!(
        resp.headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        resp.headers()
            .get("x-agentd-run-id")
            .and_then(|v| v.to_str().ok())
            .map(|id| format!("/apps/slow/users/{USER}/runs/{id}"))
    );
    let started = json_with_status(resp, 202).await;
    let run_id = started["runId"].as_str().expect("runId").to_string();
    assert!(started["invocationId"].as_str().is_some(), "{started}");
    // The links name the run under its user (one shard on Citus); the bare forms work too.
    let at = format!("/apps/slow/users/{USER}/runs/{run_id}");
    assert_eq!(started["links"]["wait"], format!("{at}/wait"));
    assert_eq!(started["links"]["stream"], format!("{at}/stream"));
    let early = json_with_status(s.get(&at).await, 200).await;
    assert_eq!(early["runId"], run_id.as_str(), "{early}");
    // Another user's path, or another app's, does not find it.
    let other = s
        .get(&format!("/apps/slow/users/someone-else/runs/{run_id}"))
        .await;
    assert_eq!(other.status(), 404);
    let other = s
        .get(&format!("/apps/echo/users/{USER}/runs/{run_id}"))
        .await;
    assert_eq!(other.status(), 404);
    let user_wait = json_with_status(
        s.post_json(&format!("{at}/wait?wait=30"), json!({})).await,
        200,
    )
    .await;
    assert_eq!(user_wait["status"], "completed", "{user_wait}");
    let user_stream = Sse::open(s.get(&format!("{at}/stream")).await)
        .await
        .rest()
        .await;
    assert_eq!(done(&user_stream)["status"], "completed");

    // Nobody reads it; it ends on its own, and the long poll answers when it does.
    let waited = json_with_status(
        s.post_json(&format!("/runs/{run_id}/wait?wait=30"), json!({}))
            .await,
        200,
    )
    .await;
    assert_eq!(waited["status"], "completed", "{waited}");
    let polled = json_with_status(s.get(&format!("/runs/{run_id}?wait=5")).await, 200).await;
    assert_eq!(polled["status"], "completed");
    let msgs = Sse::open(s.get(&format!("/runs/{run_id}/stream")).await)
        .await
        .rest()
        .await;
    assert_eq!(done(&msgs)["status"], "completed");
    let replayed: Vec<String> = complete(&msgs).into_iter().map(text).collect();
    assert_eq!(replayed, ["later"], "the reply, replayed from the database");
    let stored: Vec<String> = transcript(&s, "slow", "s1")
        .await
        .iter()
        .map(text)
        .collect();
    assert_eq!(stored, ["later", "later"]);

    // `"background": true` on /run does the same.
    let resp = s
        .post_json(
            "/run",
            with(
                run_body("slow", "s1", "also later"),
                json!({"background": true}),
            ),
        )
        .await;
    let started = json_with_status(resp, 202).await;
    let second = started["runId"].as_str().unwrap().to_string();
    let waited = json_with_status(
        s.post_json(&format!("/runs/{second}/wait"), json!({}))
            .await,
        200,
    )
    .await;
    assert_eq!(waited["status"], "completed");
}

/// A background request is refused exactly as `/run` refuses it, before anything starts:
/// a busy session (409), a missing session (404), a body naming another session (422).
async fn a_background_run_is_refused_like_run(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let path = format!("{}/runs", session_path("slow", "s1"));
    let msg = json!({"newMessage": {"role": "user", "parts": [{"text": "one"}]}});
    let first = json_with_status(s.post_json(&path, msg.clone()).await, 202).await;
    let busy = json_with_status(s.post_json(&path, msg.clone()).await, 409).await;
    assert_eq!(busy["code"], "session_busy", "{busy}");
    let ghost = format!("{}/runs", session_path("slow", "ghost"));
    let missing = json_with_status(s.post_json(&ghost, msg.clone()).await, 404).await;
    assert_eq!(missing["code"], "session_not_found");
    let other = with(msg.clone(), json!({"sessionId": "s2"}));
    let bad = json_with_status(s.post_json(&path, other).await, 422).await;
    assert_eq!(bad["code"], "validation_error");
    let run_id = first["runId"].as_str().unwrap();
    assert_eq!(finished_run(&s, run_id).await["status"], "completed");
    let stored: Vec<String> = transcript(&s, "slow", "s1")
        .await
        .iter()
        .map(text)
        .collect();
    assert_eq!(
        stored,
        ["one", "one"],
        "only the admitted run wrote anything"
    );
    let unknown = json_with_status(s.post_json("/runs/run-nope/wait", json!({})).await, 404).await;
    assert_eq!(unknown["code"], "run_not_found");
}

/// A user's runs, newest first, a page at a time with a cursor, filtered by status.
async fn a_users_runs_are_listed_newest_first(backend: Backend) {
    let apps = Apps::new().echo("e", "chunks: 1");
    let s = apps.serve(backend).await;
    create_session(&s, "e", "s1").await;
    let mut ids = vec![];
    for i in 0..3 {
        let msgs = run(&s, run_body("e", "s1", &format!("m{i}")))
            .await
            .rest()
            .await;
        ids.push(done(&msgs)["runId"].as_str().unwrap().to_string());
    }
    ids.reverse();
    let listing = format!("/apps/e/users/{USER}/runs");
    let page = json_with_status(s.get(&format!("{listing}?limit=2")).await, 200).await;
    let got: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[0].as_str(), ids[1].as_str()]);
    let next = page["next"].as_str().expect("a next cursor").to_string();
    let page = json_with_status(s.get(&format!("{listing}?limit=2&after={next}")).await, 200).await;
    let got: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[2].as_str()]);
    assert!(page.get("next").is_none(), "{page}");
    let done_runs =
        json_with_status(s.get(&format!("{listing}?status=completed")).await, 200).await;
    assert_eq!(done_runs["runs"].as_array().unwrap().len(), 3);
    let running = json_with_status(s.get(&format!("{listing}?status=running")).await, 200).await;
    assert!(running["runs"].as_array().unwrap().is_empty());
    let other_user = json_with_status(s.get("/apps/e/users/someone-else/runs").await, 200).await;
    assert!(other_user["runs"].as_array().unwrap().is_empty());
    for bad in [
        "?status=finished",
        "?after=not-a-cursor",
        "?limit=0",
        "?limit=201",
    ] {
        let b = json_with_status(s.get(&format!("{listing}{bad}")).await, 422).await;
        assert_eq!(b["code"], "validation_error", "{bad}: {b}");
    }
}

/// A run is found by its id, bare and under its user, at every moment from its admission to
/// its end: on PostgreSQL a running run lives on its session row and moves into `runs` as it
/// ends, and no reader may fall between the two (on Citus the bare lookup reads every shard,
/// each in a snapshot of its own). Running, it is listed first, and as `running`.
async fn a_run_is_found_by_its_id_at_every_moment(backend: Backend) {
    let apps = Apps::new()
        .echo("e", "chunks: 3\nchunk_delay_ms: 10")
        .echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "e", "s1").await;
    for i in 0..20 {
        let mut sse = run_sse(&s, run_body("e", "s1", &format!("m{i}"))).await;
        let id = sse.run_id();
        // Both lookups, alternately, until the run reads ended; it must have read `running`
        // first (the run takes 30 ms), so the reads spanned its end.
        let poll = async {
            let mut running = 0;
            loop {
                for path in [
                    format!("/runs/{id}"),
                    format!("/apps/e/users/{USER}/runs/{id}"),
                ] {
                    let record = json_with_status(s.get(&path).await, 200).await;
                    if record["status"] != "running" {
                        assert_eq!(record["status"], "completed", "{record}");
                        return running;
                    }
                    running += 1;
                }
            }
        };
        let (running, _) = tokio::join!(poll, sse.rest());
        assert!(running > 0, "run {i} was never read while running");
    }

    create_session(&s, "slow", "s2").await;
    let mut sse = run_sse(&s, run_body("slow", "s2", "still going")).await;
    let id = sse.run_id();
    sse.until(Msg::is_partial).await;
    let listing = format!("/apps/slow/users/{USER}/runs");
    let running = json_with_status(s.get(&format!("{listing}?status=running")).await, 200).await;
    let running = running["runs"].as_array().unwrap();
    assert_eq!(running.len(), 1, "{running:?}");
    assert_eq!(
        (running[0]["runId"].as_str(), running[0]["status"].as_str()),
        (Some(id.as_str()), Some("running"))
    );
    let session_runs = json_with_status(s.get(&listing).await, 200).await;
    assert_eq!(
        session_runs["runs"][0]["runId"],
        id.as_str(),
        "newest first"
    );
    let run = json_with_status(s.get(&format!("{listing}/{id}")).await, 200).await;
    assert_eq!(run["sessionId"], "s2");
    sse.rest().await;
}

/// A run id names one run, ever: admission refuses an id that a running run has on another
/// session, or that an ended run had, and refusing it changes nothing (the session stays
/// free, the first run's record stays as it was). Schedules re-fire a tick with its run id
/// and MCP derives a run id from the request id, both counting on this.
async fn a_run_id_names_one_run(backend: Backend) {
    use agentd::store::{Insert, NewRun, NewSession, RunStatus, SessionKey};
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    for id in ["a", "b", "c"] {
        store
            .create_session(NewSession {
                app_name: "e".into(),
                user_id: USER.into(),
                session_id: Some(id.into()),
                state: Default::default(),
                events: vec![],
            })
            .await
            .unwrap();
    }
    let run = |session: &str| NewRun {
        run_id: "run-once".into(),
        key: SessionKey::new("e", USER, session),
        invocation_id: format!("e-{session}"),
        owner: "replica-1".into(),
        user_event: false,
        queue_ttl: Duration::from_secs(60),
        opening: None,
        webhooks: None,
    };
    let first = store.insert_run(&run("a"), None).await.unwrap();
    assert!(matches!(first, Insert::Inserted { .. }), "{first:?}");
    let refused =
        |r: &agentd::store::StoreResult<Insert>| !matches!(r, Ok(Insert::Inserted { .. }));
    let while_running = store.insert_run(&run("b"), None).await;
    assert!(refused(&while_running), "{while_running:?}");
    let free = |s: &str| SessionKey::new("e", USER, s);
    assert!(store.active_run(&free("b")).await.unwrap().is_none());
    assert!(store
        .finish_run(USER, "run-once", RunStatus::Completed, Some(0), None)
        .await
        .unwrap());
    let ended = store.insert_run(&run("c"), None).await;
    assert!(refused(&ended), "{ended:?}");
    assert!(store.active_run(&free("c")).await.unwrap().is_none());
    let record = store.get_user_run(USER, "run-once").await.unwrap().unwrap();
    assert_eq!(
        (record.session_id.as_str(), record.status),
        ("a", RunStatus::Completed)
    );
}

// ---------------------------------------------------------------------------------------
// A crashed replica
// ---------------------------------------------------------------------------------------

async fn a_killed_replica_leaves_only_complete_events_and_its_lease_expires(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", "chunks: 50\nchunk_delay_ms: 100\ncall_tool: lookup");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let bind = format!("127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .arg("serve")
        .args(["--bind", &bind, "--database-url", &db.url])
        .arg("--apps-dir")
        .arg(apps.path())
        .args(["--run-lease-secs", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn agentd");

    let child_url = |path: &str| format!("http://{bind}{path}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + PATIENCE;
    while !matches!(client.get(child_url("/health")).send().await, Ok(r) if r.status() == 200) {
        assert!(Instant::now() < deadline, "the child server never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let create = client
        .post(child_url(&format!("/apps/slow/users/{USER}/sessions")))
        .json(&json!({ "sessionId": "s1" }))
        .send()
        .await
        .unwrap();
    json_with_status(create, 200).await;
    let resp = client
        .post(child_url("/run"))
        .json(&run_body("slow", "s1", "crash during this"))
        .send()
        .await
        .unwrap();
    let mut sse = Sse::open(resp).await;
    let run_id = sse.run_id();
    for _ in 0..3 {
        sse.until(Msg::is_partial).await;
    }
    child.start_kill().expect("kill -9");
    child.wait().await.expect("child exits");

    let dir = apps.path().to_path_buf();
    let s = TestServer::start_on(db, |args| args.apps_dir = dir).await;
    let stored = transcript(&s, "slow", "s1").await;
    for e in &stored {
        serde_json::from_value::<Event>(e.clone()).expect("every stored event is whole");
    }
    assert_eq!(authors(&stored), ["user", "slow"]);
    assert!(stored[1]["content"]["parts"][0]["functionCall"].is_object());
    let record = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(
        record["status"], "running",
        "nobody has noticed the death yet"
    );

    // Busy until the dead run's 1 s lease runs out; then the session is taken over.
    let deadline = Instant::now() + PATIENCE;
    let msgs = loop {
        match run_to_end(&s, run_body("slow", "s1", "x")).await {
            Ok(msgs) => break msgs,
            Err((409, body)) if body["code"] == "session_busy" => {}
            Err((status, body)) => panic!("{status}: {body}"),
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done(&msgs)["status"], "completed");
    let record = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(record["status"], "abandoned");
}

both_backends!(
    selection_looks_at_the_newest_events_of_a_long_session,
    a_run_is_found_by_its_id_at_every_moment,
    a_run_id_names_one_run,
    run_sse_framing_is_byte_exact_adk,
    partial_events_are_streamed_but_never_stored,
    run_streams_seq_ids_and_ends_with_done,
    run_answers_the_adk_json_array_when_asked,
    agent_failure_ends_the_stream_with_an_adk_error_message,
    errors_before_the_stream_are_plain_json,
    run_sse_splits_an_event_with_content_and_an_artifact_delta,
    input_blobs_are_saved_as_artifacts,
    an_oversize_input_blob_is_refused_before_the_stream,
    before_agent_callback_answers_instead_of_the_agent,
    after_agent_callback_appends_an_event,
    plugin_before_run_ends_the_run_early,
    plugin_on_event_rewrites_streamed_and_stored_events,
    a_transfer_keeps_the_conversation_with_the_agent_that_spoke_last,
    an_agent_that_disallows_transfer_to_parent_hands_the_next_turn_to_the_root,
    a_workflow_turn_starts_again_at_the_root,
    concurrent_runs_on_one_session_admit_one_and_reject_the_rest,
    enqueued_runs_on_one_session_all_complete_one_after_another,
    interrupt_cancels_the_running_run_and_starts_the_new_one,
    cancel_seals_the_transcript_and_frees_the_session,
    a_client_disconnect_cancels_the_run_and_seals_the_transcript,
    with_on_disconnect_continue_the_run_completes_without_its_client,
    a_background_run_completes_alone_and_replays,
    a_background_run_is_refused_like_run,
    a_users_runs_are_listed_newest_first,
    a_killed_replica_leaves_only_complete_events_and_its_lease_expires,
);
