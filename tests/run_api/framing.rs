//! `/run_sse` framing against the recorded ADK streams, and `/run`'s ids, `done` and JSON mode.

use super::*;
use crate::both_backends;
use std::collections::HashSet;

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

both_backends!(
    run_sse_framing_is_byte_exact_adk,
    partial_events_are_streamed_but_never_stored,
    run_streams_seq_ids_and_ends_with_done,
    run_answers_the_adk_json_array_when_asked,
);
