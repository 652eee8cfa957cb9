//! Errors before the first byte are plain JSON; an agent failure ends the stream with ADK's error.

use super::*;
use crate::both_backends;

/// An ADK error message with its timestamp (the one value that differs per run) cut off.
fn without_timestamp(frame: &str) -> &str {
    let (head, ts) = frame
        .rsplit_once("\"timestamp\": ")
        .unwrap_or_else(|| panic!("no timestamp in {frame}"));
    let ts = ts.strip_suffix("}}").expect("error message ends with }}");
    assert!(ts.parse::<f64>().is_ok(), "timestamp {ts:?}");
    head
}

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

both_backends!(
    agent_failure_ends_the_stream_with_an_adk_error_message,
    errors_before_the_stream_are_plain_json,
);
