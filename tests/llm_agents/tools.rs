//! Tool loops: results fed back, parallel calls run concurrently, tools save and load artifacts.

use super::*;
use crate::both_backends;
use crate::common::sse_client::Msg;
use agentd::tools::ToolError;

fn call_of(event: &Value) -> Option<&Value> {
    event["content"]["parts"]
        .as_array()?
        .iter()
        .find_map(|p| p.get("functionCall"))
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
        value(r#"agentd_model_tokens_total{app="weather",model="weather",kind="output"}"#) > 0.0,
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

both_backends!(
    tools_save_artifacts_and_load_artifacts_reads_them,
    a_tool_loop_streams_commits_and_feeds_results_back,
    parallel_tool_calls_run_concurrently,
);
