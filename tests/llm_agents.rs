//! LLM agents end to end: a scripted OpenAI-compatible model server on a real port (real
//! streaming wire format), agentd on a real port, real SSE parsed by a client, each test on
//! PostgreSQL and SQLite.

mod common;

use agentd::agent::llm::{IncludeContents, LlmAgent};
use agentd::agent::workflow::{LoopAgent, SequentialAgent, WorkflowParts};
use agentd::agent::PluginSet;
use agentd::tools::builtin::ExitLoop;
use agentd::tools::{FunctionTool, ToolError};
use common::model_server::{Reply, ScriptedModel};
use common::sse_client::{complete, done_status, text_of, Msg};
use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

fn call_of(event: &Value) -> Option<&Value> {
    event["content"]["parts"]
        .as_array()?
        .iter()
        .find_map(|p| p.get("functionCall"))
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

/// Two tool rounds, then a streamed answer: every complete event is stored in order, the
/// partials share the final event's id, tool results go back to the model, the instruction
/// is filled from state and the answer lands in `output_key`.
async fn a_tool_loop_streams_commits_and_feeds_results_back(backend: Backend) {
    let m = ScriptedModel::start().await;
    m.push(
        "weather",
        Reply::tool_calls(&[("call_1", "get_weather", r#"{"city": "Paris"}"#)]),
    )
    .push(
        "weather",
        Reply::tool_calls(&[("call_2", "get_weather", r#"{"city": "Rome"}"#)]),
    )
    .push(
        "weather",
        Reply::text(&["Paris is ", "sunny, Rome ", "rainy."]),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = LlmAgent::new("weather_agent", m.model("weather"))
        .instruction("You help {user:name}.{nickname?} Answer briefly.")
        .tool(weather_tool(calls.clone()))
        .output_key("answer");
    let s =
        TestServer::start_agent(backend, "weather", Arc::new(agent), PluginSet::default()).await;

    let mut b = body("weather", "s1", "Weather in Paris and Rome?");
    b["stateDelta"] = json!({"user:name": "Ada"});
    let msgs = s.run_stream(b).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let events = complete(&msgs);
    assert_eq!(
        events.len(),
        5,
        "call, response, call, response, answer: {events:#?}"
    );
    assert_eq!(
        call_of(&events[0]).unwrap()["args"],
        json!({"city": "Paris"})
    );
    assert_eq!(call_of(&events[0]).unwrap()["id"], "call_1");
    assert_eq!(events[0]["longRunningToolIds"], json!([]));
    let r1 = responses_of(&events[1]);
    assert_eq!(r1[0]["id"], "call_1");
    assert_eq!(r1[0]["response"]["forecast"], "sunny");
    assert_eq!(events[1]["content"]["role"], "user");
    assert_eq!(events[1]["author"], "weather_agent");
    assert_eq!(events[1]["actions"]["stateDelta"]["last_city"], "Paris");
    assert_eq!(call_of(&events[2]).unwrap()["args"]["city"], "Rome");
    let answer = &events[4];
    assert_eq!(text_of(answer), "Paris is sunny, Rome rainy.");
    assert_eq!(answer["finishReason"], "STOP");
    assert_eq!(answer["modelVersion"], "scripted-1");
    assert_eq!(answer["usageMetadata"]["totalTokenCount"], 15);
    assert_eq!(
        answer["actions"]["stateDelta"]["answer"],
        "Paris is sunny, Rome rainy."
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Model and tool calls are in the Prometheus metrics (bounded labels: provider, model and
    // tool names from the configuration).
    let metrics = s.get("/metrics").await.text().await.unwrap();
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        value(r#"agentd_model_calls_total{provider="openai",model="weather",outcome="ok"}"#) >= 3.0,
        "{metrics}"
    );
    assert!(
        value(r#"agentd_model_tokens_total{provider="openai",model="weather",direction="output"}"#)
            > 0.0,
        "{metrics}"
    );
    assert!(
        value(r#"agentd_tool_calls_total{tool="get_weather",outcome="ok"}"#) >= 2.0,
        "{metrics}"
    );
    assert!(metrics.contains(
        "agentd_model_call_duration_seconds_bucket{provider=\"openai\",model=\"weather\""
    ));

    // Partials: streamed, same id as the final event, text adding up to it.
    let partials: Vec<&Msg> = msgs.iter().filter(|m| m.is_partial()).collect();
    assert_eq!(partials.len(), 3, "{msgs:#?}");
    assert!(partials.iter().all(|p| p.data["id"] == answer["id"]));
    let streamed: String = partials.iter().map(|p| text_of(&p.data)).collect();
    assert_eq!(streamed, text_of(answer));

    // What the model saw.
    let reqs = m.requests_for("weather");
    assert_eq!(reqs.len(), 3);
    let system = messages(&reqs[0], "system");
    assert_eq!(system[0]["content"], "You help Ada. Answer briefly.");
    assert_eq!(reqs[0]["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(
        reqs[0]["tools"][0]["function"]["parameters"]["properties"]["city"]["type"],
        "string"
    );
    assert_eq!(reqs[0]["stream"], true);
    let tool_msgs = messages(&reqs[2], "tool");
    assert_eq!(tool_msgs.len(), 2);
    assert_eq!(tool_msgs[0]["tool_call_id"], "call_1");
    assert!(tool_msgs[0]["content"].as_str().unwrap().contains("sunny"));
    let assistant = messages(&reqs[2], "assistant");
    assert_eq!(assistant[0]["tool_calls"][0]["id"], "call_1");
    assert_eq!(m.unused(), 0);

    // The store has exactly what the client saw as complete, after the user event.
    let stored = session(&s, "weather", "s1").await;
    let stored_events = stored["events"].as_array().unwrap();
    assert_eq!(stored_events.len(), 6);
    assert_eq!(stored_events[0]["author"], "user");
    for (got, want) in stored_events[1..].iter().zip(&events) {
        assert_eq!(got["id"], want["id"]);
    }
    assert_eq!(stored["state"]["answer"], "Paris is sunny, Rome rainy.");
    assert_eq!(stored["state"]["last_city"], "Rome");

    // Next turn: the history includes the whole first turn.
    m.push("weather", Reply::text(&["You asked about two cities."]));
    let msgs = s.run_stream(body("weather", "s1", "What did I ask?")).await;
    assert_eq!(done_status(&msgs), "completed");
    let reqs = m.requests_for("weather");
    let users = messages(&reqs[3], "user");
    assert_eq!(users.len(), 2);
    assert_eq!(users[1]["content"], "What did I ask?");
}

/// Two calls in one model turn run at the same time (each waits for the other).
async fn parallel_tool_calls_run_concurrently(backend: Backend) {
    let m = ScriptedModel::start().await;
    m.push(
        "par",
        Reply::tool_calls(&[
            ("c1", "meet", r#"{"who": "a"}"#),
            ("c2", "meet", r#"{"who": "b"}"#),
        ]),
    )
    .push("par", Reply::text(&["both met"]));
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let tool = FunctionTool::raw(
        "meet",
        "Waits for a partner call.",
        None,
        move |args, _ctx| {
            let barrier = barrier.clone();
            async move {
                tokio::time::timeout(std::time::Duration::from_secs(10), barrier.wait())
                    .await
                    .map_err(|_| ToolError::new("ran alone: calls were not concurrent"))?;
                Ok(json!({"met": args["who"]}))
            }
        },
    );
    let agent = LlmAgent::new("par_agent", m.model("par")).tool(tool);
    let s = TestServer::start_agent(backend, "par", Arc::new(agent), PluginSet::default()).await;
    let msgs = s.run_stream(body("par", "s1", "go")).await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    assert_eq!(events.len(), 3, "{events:#?}");
    let responses = responses_of(&events[1]);
    assert_eq!(responses.len(), 2, "both responses in one event");
    assert_eq!(responses[0]["id"], "c1");
    assert_eq!(responses[0]["response"]["met"], "a");
    assert_eq!(responses[1]["id"], "c2");
    assert_eq!(responses[1]["response"]["met"], "b");
    let reqs = m.requests_for("par");
    let tool_msgs = messages(&reqs[1], "tool");
    assert_eq!(tool_msgs.len(), 2);
}

/// `transfer_to_agent` hands the turn to a sub-agent, which answers in the same run and
/// keeps the conversation on the next turn.
async fn transfer_to_a_sub_agent_keeps_the_next_turn(backend: Backend) {
    let m = ScriptedModel::start().await;
    let billing =
        LlmAgent::new("billing", m.model("billing")).description("Handles invoices and payments.");
    let support =
        LlmAgent::new("support", m.model("support")).description("Fixes technical problems.");
    let coordinator = LlmAgent::new("coordinator", m.model("coord"))
        .instruction("Route the user.")
        .sub_agent(Arc::new(billing))
        .sub_agent(Arc::new(support));
    m.push(
        "coord",
        Reply::tool_calls(&[("t1", "transfer_to_agent", r#"{"agent_name": "nobody"}"#)]),
    )
    .push(
        "coord",
        Reply::tool_calls(&[("t2", "transfer_to_agent", r#"{"agent_name": "billing"}"#)]),
    )
    .push("billing", Reply::text(&["Billing here."]))
    .push("billing", Reply::text(&["Still billing."]));
    let s =
        TestServer::start_agent(backend, "desk", Arc::new(coordinator), PluginSet::default()).await;

    let msgs = s
        .run_stream(body("desk", "s1", "My invoice is wrong"))
        .await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    let authors: Vec<&str> = events
        .iter()
        .map(|e| e["author"].as_str().unwrap())
        .collect();
    assert_eq!(
        authors,
        [
            "coordinator",
            "coordinator",
            "coordinator",
            "coordinator",
            "billing"
        ],
        "{events:#?}"
    );
    // A transfer to an unknown agent is an error the model sees, naming the valid targets.
    let bad = responses_of(&events[1])[0]["response"]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(bad.contains("billing") && bad.contains("support"), "{bad}");
    assert_eq!(events[3]["actions"]["transferToAgent"], "billing");
    assert_eq!(text_of(&events[4]), "Billing here.");

    // The coordinator was told whom it can transfer to; billing sees the routing as context
    // and may go back to its parent or to its peer.
    let coord_req = &m.requests_for("coord")[0];
    let system = messages(coord_req, "system")[0]["content"]
        .as_str()
        .unwrap();
    assert!(system.starts_with("Route the user."));
    assert!(system.contains("Agent name: billing") && system.contains("Agent name: support"));
    let billing_req = &m.requests_for("billing")[0];
    let billing_system = messages(billing_req, "system")[0]["content"]
        .as_str()
        .unwrap();
    assert!(billing_system.contains("Agent name: coordinator"));
    assert!(billing_system.contains("Agent name: support"));
    let context: Vec<String> = messages(billing_req, "user")
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        context.iter().any(|c| c.contains("For context:")
            && c.contains("[coordinator] called tool `transfer_to_agent`")),
        "{context:#?}"
    );
    assert!(
        messages(billing_req, "tool").is_empty(),
        "other agents' calls are context"
    );

    // Next turn: billing answers directly.
    let msgs = s.run_stream(body("desk", "s1", "And the refund?")).await;
    let events = complete(&msgs);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["author"], "billing");
    assert_eq!(text_of(&events[0]), "Still billing.");
    assert_eq!(
        m.requests_for("coord").len(),
        2,
        "the coordinator was not asked again"
    );
    assert_eq!(m.unused(), 0);
}

/// A sequential pipeline passes state between LLM agents (`output_key` → `{draft}`); a loop
/// of an LLM agent stops when it calls `exit_loop`.
async fn sequential_and_loop_workflows_of_llm_agents(backend: Backend) {
    let m = ScriptedModel::start().await;
    let writer = LlmAgent::new("writer", m.model("writer"))
        .instruction("Write a draft.")
        .output_key("draft");
    let reviewer = LlmAgent::new("reviewer", m.model("reviewer")).instruction("Review: {draft}");
    let pipeline = SequentialAgent {
        parts: WorkflowParts {
            name: "pipeline".into(),
            description: String::new(),
            sub_agents: vec![Arc::new(writer), Arc::new(reviewer)],
            callbacks: None,
        },
    };
    m.push("writer", Reply::text(&["A ", "draft."]))
        .push("reviewer", Reply::text(&["Looks good."]));
    let s =
        TestServer::start_agent(backend, "pipe", Arc::new(pipeline), PluginSet::default()).await;
    let msgs = s.run_stream(body("pipe", "s1", "Write about cats")).await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    let authors: Vec<&str> = events
        .iter()
        .map(|e| e["author"].as_str().unwrap())
        .collect();
    assert_eq!(authors, ["writer", "reviewer"]);
    let review_req = &m.requests_for("reviewer")[0];
    assert_eq!(
        messages(review_req, "system")[0]["content"],
        "Review: A draft."
    );
    // The reviewer sees the writer's draft as context.
    let users: Vec<String> = messages(review_req, "user")
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        users.iter().any(|u| u.contains("[writer] said: A draft.")),
        "{users:#?}"
    );

    let worker = LlmAgent::new("worker", m.model("worker"))
        .instruction("Improve until done, then call exit_loop.")
        .tool(ExitLoop);
    let looped = LoopAgent {
        parts: WorkflowParts {
            name: "refine".into(),
            description: String::new(),
            sub_agents: vec![Arc::new(worker)],
            callbacks: None,
        },
        max_iterations: Some(5),
    };
    m.push("worker", Reply::text(&["round one"]))
        .push("worker", Reply::tool_calls(&[("x1", "exit_loop", "{}")]));
    let s2 = TestServer::start_agent(backend, "loop", Arc::new(looped), PluginSet::default()).await;
    let msgs = s2.run_stream(body("loop", "s1", "go")).await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    assert_eq!(
        events.len(),
        3,
        "text, exit_loop call, its response: {events:#?}"
    );
    assert_eq!(events[2]["actions"]["escalate"], true);
    assert_eq!(events[2]["actions"]["skipSummarization"], true);
    assert_eq!(
        m.requests_for("worker").len(),
        2,
        "the loop stopped at exit_loop"
    );
    assert_eq!(m.unused(), 0);
}

/// Model failures: a 429 is retried; a bad key, a mid-stream error and a runaway tool loop
/// end the turn with a clear error event (the run itself completes, nothing half-stored).
async fn model_errors_become_clear_error_events(backend: Backend) {
    let m = ScriptedModel::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = LlmAgent::new("a", m.model("flaky"))
        .tool(weather_tool(calls.clone()))
        .max_steps(2);
    let s = TestServer::start_agent(backend, "flaky", Arc::new(agent), PluginSet::default()).await;

    m.push("flaky", Reply::status(429, "slow down"))
        .push("flaky", Reply::text(&["fine now"]));
    let events = complete(&s.run_stream(body("flaky", "s1", "hi")).await);
    assert_eq!(events.len(), 1);
    assert_eq!(text_of(&events[0]), "fine now");

    m.push(
        "flaky",
        Reply::status(401, "Incorrect API key provided: sk-***"),
    );
    let msgs = s.run_stream(body("flaky", "s2", "hi")).await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["errorCode"], "UNAUTHENTICATED");
    let msg = events[0]["errorMessage"].as_str().unwrap();
    assert!(
        msg.contains("refused the credentials") && msg.contains("HTTP 401"),
        "{msg}"
    );
    assert!(
        !msg.contains("Incorrect API key"),
        "the provider's own words stay in the log: {msg}"
    );

    m.push(
        "flaky",
        Reply::StreamThenError(
            match Reply::text(&["Half an ans"]) {
                Reply::Stream(mut c) => {
                    c.truncate(2);
                    c
                }
                _ => unreachable!(),
            },
            "upstream overloaded".into(),
        ),
    );
    let msgs = s.run_stream(body("flaky", "s3", "hi")).await;
    let events = complete(&msgs);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["errorCode"], "MODEL_ERROR");
    assert!(events[0]["errorMessage"]
        .as_str()
        .unwrap()
        .contains("upstream overloaded"));
    let partial = msgs
        .iter()
        .find(|m| m.is_partial())
        .expect("a partial was streamed");
    assert_eq!(
        partial.data["id"], events[0]["id"],
        "the error event replaces the partial row"
    );

    // max_steps: the model keeps calling tools.
    m.push(
        "flaky",
        Reply::tool_calls(&[("k1", "get_weather", r#"{"city":"Oslo"}"#)]),
    )
    .push(
        "flaky",
        Reply::tool_calls(&[("k2", "get_weather", r#"{"city":"Oslo"}"#)]),
    );
    let events = complete(&s.run_stream(body("flaky", "s4", "loop")).await);
    let last = events.last().unwrap();
    assert_eq!(last["errorCode"], "MAX_STEPS_EXCEEDED", "{events:#?}");
    assert_eq!(m.unused(), 0);

    // Every session's stored events are whole: no partial, ids unique.
    let stored = session(&s, "flaky", "s3").await;
    assert_eq!(stored["events"].as_array().unwrap().len(), 2);
}

/// A provider that refuses the key may quote it back (OpenAI names its last characters):
/// the run's error event says the provider refused the credentials and quotes none of it, on
/// agentd's stream and ADK's, in the stored session and in the run's record.
async fn a_refused_key_is_not_quoted_to_clients(backend: Backend) {
    let m = ScriptedModel::start().await;
    let agent = LlmAgent::new("a", m.model("keyed"));
    let s = TestServer::start_agent(backend, "keyed", Arc::new(agent), PluginSet::default()).await;
    let refusal = json!({"error": {
        "message": "Incorrect API key provided: sk-abc...WXYZ. You can find your API key at \
                    https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error", "code": "invalid_api_key"}});

    m.push("keyed", Reply::Status(401, refusal.clone()));
    let resp = s.post_json("/run", body("keyed", "s1", "hi")).await;
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-agentd-run-id"]
        .to_str()
        .unwrap()
        .to_string();
    let stream = resp.text().await.unwrap();
    assert!(stream.contains("refused the credentials"), "{stream}");
    assert!(stream.contains("UNAUTHENTICATED"), "{stream}");
    assert!(
        !stream.contains("WXYZ") && !stream.contains("sk-abc"),
        "{stream}"
    );
    let stored = session(&s, "keyed", "s1").await;
    let error = stored["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["errorCode"].is_string())
        .cloned()
        .unwrap_or_else(|| panic!("an error event is stored: {stored:#}"));
    assert_eq!(error["errorCode"], "UNAUTHENTICATED");
    let msg = error["errorMessage"].as_str().unwrap_or_default();
    assert!(
        msg.contains("refused the credentials") && msg.contains("HTTP 401"),
        "{msg}"
    );
    assert!(!stored.to_string().contains("WXYZ"), "{stored:#}");
    let record = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert!(!record.to_string().contains("WXYZ"), "{record:#}");

    // 403 alike, on ADK's stream.
    m.push("keyed", Reply::Status(403, refusal));
    let resp = s.post_json("/run_sse", body("keyed", "s2", "hi")).await;
    assert_eq!(resp.status(), 200);
    let stream = resp.text().await.unwrap();
    assert!(
        stream.contains("refused the credentials") && stream.contains("HTTP 403"),
        "{stream}"
    );
    assert!(!stream.contains("WXYZ"), "{stream}");
    let stored = session(&s, "keyed", "s2").await;
    assert!(!stored.to_string().contains("WXYZ"), "{stored:#}");
    assert_eq!(m.unused(), 0);
    assert_eq!(
        m.requests_for("keyed").len(),
        2,
        "a refused key is not retried"
    );
}

/// A tool's artifact is committed with its response event (`artifactDelta`), and the
/// `load_artifacts` tool lists and reads it back for the model.
async fn tools_save_artifacts_and_load_artifacts_reads_them(backend: Backend) {
    let m = ScriptedModel::start().await;
    m.push(
        "art",
        Reply::tool_calls(&[("w1", "write_note", r#"{"text": "buy milk"}"#)]),
    )
    .push("art", Reply::tool_calls(&[("l1", "load_artifacts", "{}")]))
    .push(
        "art",
        Reply::tool_calls(&[(
            "l2",
            "load_artifacts",
            r#"{"artifact_names": ["note.txt", "nope.txt"]}"#,
        )]),
    )
    .push("art", Reply::text(&["Your note says buy milk."]));
    let writer = FunctionTool::raw(
        "write_note",
        "Saves a note.",
        None,
        |args, ctx| async move {
            let text = args["text"].as_str().unwrap_or_default().to_string();
            ctx.save_artifact("note.txt", agentd::event::Part::text(text));
            Ok(json!({"saved": "note.txt"}))
        },
    );
    let agent = LlmAgent::new("notes", m.model("art"))
        .tool(writer)
        .tool(agentd::tools::builtin::LoadArtifacts);
    let s = TestServer::start_agent(backend, "notes", Arc::new(agent), PluginSet::default()).await;
    let events = complete(&s.run_stream(body("notes", "s1", "note: buy milk")).await);
    assert_eq!(events.len(), 7, "{events:#?}");
    assert_eq!(
        events[1]["actions"]["artifactDelta"],
        json!({"note.txt": 0})
    );
    let listed = &responses_of(&events[3])[0]["response"];
    assert_eq!(listed["available_artifacts"], json!(["note.txt"]));
    let read = &responses_of(&events[5])[0]["response"]["artifacts"];
    assert_eq!(read["note.txt"]["text"], "buy milk");
    assert_eq!(read["nope.txt"]["error"], "no such artifact");
    let stored = json_with_status(
        s.get(&format!(
            "/apps/notes/users/{USER}/sessions/s1/artifacts/note.txt"
        ))
        .await,
        200,
    )
    .await;
    assert_eq!(stored["text"], "buy milk");
}

fn write(dir: &std::path::Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Apps declared in YAML under `--apps-dir`: loaded, listed, described, run over `POST /run`;
/// a broken file is a clear error naming the file and the field and takes nothing else down.
async fn a_yaml_declared_app_runs_end_to_end(backend: Backend) {
    let m = ScriptedModel::start().await;
    // The invoice API the billing agent's HTTP tool calls.
    let api = axum::Router::new().route(
        "/invoices/{id}",
        axum::routing::get(
            |axum::extract::Path(id): axum::extract::Path<String>| async move {
                axum::Json(json!({"invoice": id, "status": "paid", "amount_eur": 42}))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, api).await });
    let dir = tempfile::tempdir().unwrap();
    let opts = format!(
        "model_options:\n  base_url: {}\n  retry_backoff_ms: 5\n",
        m.base_url
    );
    write(
        dir.path(),
        "desk/root_agent.yaml",
        &format!(
            "agent_class: LlmAgent\nname: coordinator\nmodel: openai/yaml-coord\n{opts}\
             description: Routes requests.\ninstruction: Route {{topic?}} requests.\n\
             generate_content_config:\n  temperature: 0.1\n  max_output_tokens: 64\n  stop_sequences: [END]\n\
             sub_agents:\n  - config_path: billing.yaml\n"
        ),
    );
    write(
        dir.path(),
        "desk/billing.yaml",
        &format!(
            "name: billing\nmodel: openai/yaml-billing\n{opts}description: Invoices.\n\
             instruction: You do billing.\noutput_key: last_billing_answer\ntools:\n  - name: exit_loop\n\
             \x20 - name: HttpTool\n    args:\n      name: lookup_invoice\n      description: Finds an invoice.\n\
             \x20     url: http://{api_addr}/invoices/{{id}}\n\
             \x20     allow_private: [\"127.0.0.1\"]\n\
             \x20     parameters: {{type: object, properties: {{id: {{type: string}}}}, required: [id]}}\n"
        ),
    );
    write(
        dir.path(),
        "broken/root_agent.yaml",
        "name: b\nmodel: openai/x\ntools:\n  - name: google_search\n",
    );
    let apps_dir = dir.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = apps_dir).await;

    let apps = json_with_status(s.get("/list-apps").await, 200).await;
    assert_eq!(apps, json!(["broken", "desk"]));
    let detailed = json_with_status(s.get("/list-apps?detailed=true").await, 200).await;
    let broken = &detailed["apps"][0];
    let error = broken["error"].as_str().unwrap();
    assert!(
        error.contains("broken/root_agent.yaml")
            && error.contains("tools[0]")
            && error.contains("google_search"),
        "{error}"
    );
    let info = json_with_status(s.get("/apps/desk/app-info").await, 200).await;
    assert_eq!(info["rootAgentName"], "coordinator");
    assert_eq!(
        info["agents"]["coordinator"]["sub_agents"],
        json!(["billing"])
    );
    assert_eq!(
        info["agents"]["billing"]["tools"][0]["functionDeclarations"][0]["name"],
        "exit_loop"
    );
    let bad_run = s.post_json("/run", body("broken", "s1", "hi")).await;
    let err = json_with_status(bad_run, 500).await;
    assert_eq!(err["code"], "app_load_failed");

    m.push(
        "yaml-coord",
        Reply::tool_calls(&[("t1", "transfer_to_agent", r#"{"agent_name":"billing"}"#)]),
    )
    .push(
        "yaml-billing",
        Reply::tool_calls(&[("h1", "lookup_invoice", r#"{"id": "INV-7"}"#)]),
    )
    .push("yaml-billing", Reply::text(&["Your invoice ", "is fixed."]));
    let mut b = body("desk", "s1", "invoice problem");
    b["stateDelta"] = json!({"topic": "support"});
    let msgs = s.run_stream(b).await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    assert_eq!(events.last().unwrap()["author"], "billing");
    let looked_up = events
        .iter()
        .flat_map(responses_of)
        .find(|r| r["name"] == "lookup_invoice")
        .expect("the HTTP tool answered");
    assert_eq!(
        looked_up["response"],
        json!({"invoice": "INV-7", "status": "paid", "amount_eur": 42})
    );
    assert_eq!(text_of(events.last().unwrap()), "Your invoice is fixed.");
    let req = &m.requests_for("yaml-coord")[0];
    assert_eq!(
        messages(req, "system")[0]["content"]
            .as_str()
            .unwrap()
            .lines()
            .next(),
        Some("Route support requests.")
    );
    assert_eq!(req["temperature"], 0.1);
    assert_eq!(req["max_tokens"], 64);
    assert_eq!(req["stop"], json!(["END"]));
    let stored = session(&s, "desk", "s1").await;
    assert_eq!(
        stored["state"]["last_billing_answer"],
        "Your invoice is fixed."
    );
}

/// The shipped example apps load (no model key is needed to load them).
#[tokio::test]
async fn the_shipped_example_apps_load() {
    let s = TestServer::start(Backend::Sqlite).await;
    let detailed = json_with_status(s.get("/list-apps?detailed=true").await, 200).await;
    for app in detailed["apps"].as_array().unwrap() {
        assert!(
            app.get("error").is_none(),
            "example app failed to load: {app:#}"
        );
    }
    let names: Vec<&str> = detailed["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    for expected in ["assistant", "echo", "helpdesk", "pipeline"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let info = json_with_status(s.get("/apps/helpdesk/app-info").await, 200).await;
    assert_eq!(
        info["agents"]["coordinator"]["sub_agents"],
        json!(["billing", "tech_support"])
    );
    let info = json_with_status(s.get("/apps/assistant/app-info").await, 200).await;
    let tools = &info["agents"]["assistant"]["tools"][0]["functionDeclarations"];
    assert_eq!(tools[0]["name"], "get_current_weather");
    assert_eq!(tools[1]["name"], "load_memory");
}

/// `include_contents: none`: the model sees the current turn only (the latest user message,
/// then this turn's tool round), never the earlier turns of the session.
async fn an_include_contents_none_agent_sees_only_the_current_turn(backend: Backend) {
    let m = ScriptedModel::start().await;
    m.push("turn", Reply::text(&["Noted: ", "blue."]))
        .push(
            "turn",
            Reply::tool_calls(&[("call_1", "get_weather", r#"{"city": "Paris"}"#)]),
        )
        .push("turn", Reply::text(&["Sunny."]));
    let mut agent = LlmAgent::new("forgetful", m.model("turn"))
        .tool(weather_tool(Arc::new(AtomicUsize::new(0))));
    agent.include_contents = IncludeContents::None;
    let s = TestServer::start_agent(backend, "turn", Arc::new(agent), PluginSet::default()).await;

    let first = s.run_stream(body("turn", "s1", "My colour is blue.")).await;
    assert_eq!(done_status(&first), "completed", "{first:#?}");
    let mut b = body("turn", "s1", "Weather in Paris?");
    b["createSession"] = json!(false);
    let second = s.run_stream(b).await;
    assert_eq!(done_status(&second), "completed", "{second:#?}");
    assert_eq!(text_of(complete(&second).last().unwrap()), "Sunny.");

    let requests = m.requests_for("turn");
    assert_eq!(requests.len(), 3);
    for (i, req) in requests[1..].iter().enumerate() {
        let text = req["messages"].to_string();
        assert!(text.contains("Weather in Paris?"), "request {i}: {text}");
        assert!(
            !text.contains("My colour is blue.") && !text.contains("Noted: blue."),
            "an earlier turn reached the model: {text}"
        );
    }
    // The second step of the turn carries its tool round.
    let tool = messages(&requests[2], "tool");
    assert_eq!(tool.len(), 1, "{:#}", requests[2]);
    assert!(tool[0]["content"].as_str().unwrap().contains("sunny"));
    // The session keeps every turn.
    assert_eq!(
        session(&s, "turn", "s1").await["events"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
}

both_backends!(
    an_include_contents_none_agent_sees_only_the_current_turn,
    tools_save_artifacts_and_load_artifacts_reads_them,
    a_yaml_declared_app_runs_end_to_end,
    a_tool_loop_streams_commits_and_feeds_results_back,
    parallel_tool_calls_run_concurrently,
    transfer_to_a_sub_agent_keeps_the_next_turn,
    sequential_and_loop_workflows_of_llm_agents,
    model_errors_become_clear_error_events,
    a_refused_key_is_not_quoted_to_clients,
);
