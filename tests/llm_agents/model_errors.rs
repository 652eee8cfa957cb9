//! Model failures become clear error events, and a refused key is never quoted to clients.

use super::*;
use crate::both_backends;

/// Model failures: a 429 is retried; a bad key, a mid-stream error and a runaway tool loop
/// end the turn with a clear error event, and the run ends `failed` (its record says why),
/// nothing half-stored.
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
    assert_eq!(done_status(&msgs), "failed");
    let events = complete(&msgs);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["errorCode"], "UNAUTHENTICATED");
    let msg = events[0]["errorMessage"].as_str().unwrap();
    assert!(
        msg.contains("refused the credentials") && msg.contains("HTTP 401"),
        "{msg}"
    );
    // It names the variable to set.
    assert!(msg.contains("OPENAI_API_KEY"), "{msg}");
    let run_id = msgs.last().unwrap().data["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let run = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert!(
        run["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("UNAUTHENTICATED: "),
        "{run}"
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
    assert_eq!(done_status(&msgs), "failed");
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
    let msgs = s.run_stream(body("flaky", "s4", "loop")).await;
    assert_eq!(done_status(&msgs), "failed");
    let events = complete(&msgs);
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

both_backends!(
    model_errors_become_clear_error_events,
    a_refused_key_is_not_quoted_to_clients,
);
