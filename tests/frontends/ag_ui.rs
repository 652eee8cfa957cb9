//! `@ag-ui/client`'s `HttpAgent`: runs, a re-sent thread, edit and regenerate.

use super::*;
use crate::both_backends;

async fn ag_ui(s: &TestServer, scenario: &str, thread: &str) -> Value {
    clients::node(
        "node",
        "ag-ui.mjs",
        &[scenario],
        &[
            ("AGENTD_URL", &s.base),
            ("AGENTD_APP", APP),
            ("AGENTD_USER", USER),
            ("AGENTD_THREAD_ID", thread),
        ],
    )
    .await
}

fn event_types(out: &Value) -> Vec<String> {
    out["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str().map(str::to_string))
        .collect()
}

async fn ag_ui_runs(backend: Backend) {
    let m = ScriptedModel::start().await;
    let s = server(backend, &m, "agui").await;

    m.push("agui", Reply::text(&["Hel", "lo"]));
    let out = ag_ui(&s, "text", "t-text").await;
    assert!(out["error"].is_null(), "{out}");
    let types = event_types(&out);
    assert_eq!(types.first().map(String::as_str), Some("RUN_STARTED"));
    assert_eq!(types.last().map(String::as_str), Some("RUN_FINISHED"));
    assert!(
        types.contains(&"TEXT_MESSAGE_CONTENT".to_string()),
        "{types:?}"
    );
    let msgs = out["messages"].to_string();
    assert!(
        msgs.contains("\"content\":\"Hello\"") && msgs.contains("\"role\":\"user\""),
        "{msgs}"
    );

    // A server tool: the call, its result and the state it wrote reach the client's state.
    m.push(
        "agui",
        Reply::tool_calls(&[("c1", "get_weather", r#"{"city":"Paris"}"#)]),
    );
    m.push("agui", Reply::text(&["Sunny"]));
    let out = ag_ui(&s, "tool", "t-tool").await;
    assert!(out["error"].is_null(), "{out}");
    let types = event_types(&out);
    for t in [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STATE_DELTA",
        "STATE_SNAPSHOT",
        "STEP_STARTED",
        "MESSAGES_SNAPSHOT",
    ] {
        assert!(types.iter().any(|x| x == t), "{t} missing: {types:?}");
    }
    assert_eq!(out["state"]["last_city"], "Paris", "{out}");

    // A model failure ends the run with RUN_ERROR, nothing after it.
    m.push("agui", Reply::status(400, "the prompt is not allowed"));
    let out = ag_ui(&s, "error", "t-error").await;
    assert!(
        out["error"].as_str().unwrap_or("").contains("not allowed"),
        "{out}"
    );
    assert_eq!(
        event_types(&out).last().map(String::as_str),
        Some("RUN_ERROR")
    );

    // A frontend tool: offered to the model, answered by the client in the next run.
    m.push(
        "agui",
        Reply::tool_calls(&[("c7", "confirm_booking", r#"{"when":"now"}"#)]),
    );
    m.push("agui", Reply::text(&["Booked"]));
    let out = ag_ui(&s, "client-tool", "t-client").await;
    assert!(out["error"].is_null(), "{out}");
    assert_eq!(out["runs"].as_array().map(Vec::len), Some(2), "{out}");
    let reqs = m.requests_for("agui");
    assert!(reqs[reqs.len() - 2]["tools"]
        .to_string()
        .contains("confirm_booking"));
    let answered = reqs[reqs.len() - 1]["messages"].to_string();
    assert!(
        answered.contains("c7") && answered.contains("ok"),
        "{answered}"
    );
    assert!(out["messages"].to_string().contains("Booked"), "{out}");
    assert_eq!(m.unused(), 0);
}

/// AG-UI clients re-send the whole thread: a message already run (its id is the event id the
/// transcript snapshot gave it) is not run again, and only the session's own state keys are
/// taken from the client's state.
async fn ag_ui_resent_thread(backend: Backend) {
    let m = ScriptedModel::start().await;
    let s = server(backend, &m, "agui-2").await;
    let post = |body: Value| {
        s.client
            .post(s.url(&format!("/apps/{APP}/ag-ui")))
            .header("x-agentd-user-id", USER)
            .json(&body)
            .send()
    };
    let events = |text: String| -> Vec<Value> {
        text.split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect()
    };
    m.push("agui-2", Reply::text(&["One"]));
    let first = post(
        json!({"threadId": "t1", "runId": "r1", "tools": [], "context": [],
        "state": {"mood": "happy", "user:name": "stale"},
        "messages": [{"id": "m1", "role": "user", "content": "hello"}]}),
    )
    .await
    .expect("POST");
    let first = events(first.text().await.expect("body"));
    let snapshot = first
        .iter()
        .find(|e| e["type"] == "MESSAGES_SNAPSHOT")
        .unwrap_or_else(|| panic!("{first:#?}"));
    let thread = snapshot["messages"].clone();
    assert_eq!(thread.as_array().map(Vec::len), Some(2), "{thread}");
    let state = first
        .iter()
        .rev()
        .find(|e| e["type"] == "STATE_SNAPSHOT")
        .unwrap();
    assert_eq!(
        state["snapshot"],
        json!({"mood": "happy"}),
        "user: keys are not the client's to write"
    );
    // The same thread again, nothing new: nothing runs.
    let again = post(json!({"threadId": "t1", "runId": "r2", "messages": thread}))
        .await
        .expect("POST");
    let again = events(again.text().await.expect("body"));
    let types: Vec<&str> = again.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["RUN_STARTED", "RUN_FINISHED"]);
    assert_eq!(again[0]["runId"], "r2");
    assert_eq!(
        m.requests_for("agui-2").len(),
        1,
        "the model was asked once"
    );
}

/// `@ag-ui/client` re-sends a thread that leaves the stored one — the second question edited,
/// or its answer dropped to regenerate it: the session goes back to before that turn and runs
/// the trailing user message there; the model is not sent the replaced turn, and the closing
/// snapshot is the conversation as it is now.
async fn ag_ui_edit_and_regenerate(backend: Backend) {
    let m = ScriptedModel::start().await;
    let s = server(backend, &m, "agui-3").await;
    for scenario in ["edit", "regenerate"] {
        for text in ["answer one", "answer two", "answer three"] {
            m.push("agui-3", Reply::text(&[text]));
        }
        let thread = format!("{scenario}-thread");
        let out = ag_ui(&s, scenario, &thread).await;
        assert_eq!(out["error"], Value::Null, "{scenario}: {out}");
        let sent = m
            .requests_for("agui-3")
            .last()
            .expect("a request")
            .to_string();
        assert!(!sent.contains("answer two"), "{scenario}: {sent}");
        let expected = if scenario == "edit" {
            "second question, edited"
        } else {
            "second question"
        };
        assert!(
            sent.contains("answer one") && sent.contains(expected),
            "{sent}"
        );
        // The closing snapshot is the conversation as it is now, and the client took it.
        let snapshot = out["rawEvents"]
            .as_array()
            .expect("events")
            .iter()
            .rev()
            .find(|e| e["type"] == "MESSAGES_SNAPSHOT")
            .unwrap_or_else(|| panic!("{scenario}: no snapshot: {out}"));
        let contents = |messages: &Value| -> Vec<String> {
            messages
                .as_array()
                .expect("messages")
                .iter()
                .filter_map(|m| m["content"].as_str().map(str::to_string))
                .collect()
        };
        assert_eq!(
            contents(&snapshot["messages"]),
            ["hello", "answer one", expected, "answer three"],
            "{scenario}: {out}"
        );
        let mut held = contents(&out["messages"]);
        held.sort();
        let mut now = contents(&snapshot["messages"]);
        now.sort();
        assert_eq!(held, now, "{scenario}: {out}");
        let session = json_with_status(
            s.get(&format!(
                "/apps/{APP}/users/{USER}/sessions/{thread}?includeRewound=false"
            ))
            .await,
            200,
        )
        .await;
        let live: Vec<&str> = session["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter_map(|e| e["content"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(live, ["hello", "answer one", expected, "answer three"]);
    }
    assert_eq!(m.unused(), 0);
}

both_backends!(ag_ui_runs, ag_ui_resent_thread, ag_ui_edit_and_regenerate);
