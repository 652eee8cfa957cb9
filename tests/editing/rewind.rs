//! Rewind: state and artifacts restored, the model and memory forget the turns, as ADK-Python does.

use super::*;
use crate::both_backends;

/// Three turns, a rewind to before the second: the rewind event carries ADK's fields and the
/// state delta that restores the session's plain state (shared `app:` keys untouched), the
/// artifacts created since get a deletion marker, nothing is deleted, and the next turn
/// continues from the restored state. Unknown invocations and busy sessions are refused.
async fn a_rewind_restores_state_and_artifacts(backend: Backend) {
    let apps = Apps::new()
        .echo("echo", "chunks: 1")
        .echo("slow", "chunks: 20\nchunk_delay_ms: 100");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = dir).await;
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        let mut body = turn("echo", "s1", text);
        if i == 1 {
            // The second turn also saves a file as an artifact and sets shared state.
            body["newMessage"]["parts"]
                .as_array_mut()
                .expect("parts")
                .push(json!({"inlineData": {"mimeType": "text/plain", "data": "aGVsbG8="}}));
            body["stateDelta"] = json!({"note": "set in two", "app:shared": 2});
        }
        run(&s, body).await;
    }
    let before = session(&s, "echo", "s1").await;
    assert_eq!(before["state"]["turns"], 3);
    assert_eq!(before["state"]["note"], "set in two");
    let invocations = turns(&before);
    assert_eq!(invocations.len(), 3);
    let artifact = format!("artifact_{}_1", invocations[1]);
    let versions_path =
        format!("/apps/echo/users/{USER}/sessions/s1/artifacts/{artifact}/versions");
    assert_eq!(
        json_with_status(s.get(&versions_path).await, 200).await,
        json!([0])
    );

    let path = format!("/apps/echo/users/{USER}/sessions/s1/rewind");
    let rewound = json_with_status(
        s.post_json(&path, json!({"beforeInvocationId": invocations[1]}))
            .await,
        200,
    )
    .await;
    let event = &rewound["event"];
    assert_eq!(event["author"], "user");
    assert_eq!(
        event["actions"]["rewindBeforeInvocationId"],
        invocations[1].as_str()
    );
    assert_eq!(
        event["actions"]["stateDelta"],
        json!({"turns": 1, "note": null})
    );
    assert_eq!(
        event["actions"]["artifactDelta"],
        json!({ (artifact.clone()): 1 })
    );

    let after = session(&s, "echo", "s1").await;
    assert_eq!(after["state"]["turns"], 1);
    assert!(after["state"].get("note").is_none() || after["state"]["note"].is_null());
    assert_eq!(
        after["state"]["app:shared"], 2,
        "shared state is not the session's to restore"
    );
    assert_eq!(
        after["events"].as_array().map(Vec::len),
        before["events"].as_array().map(|e| e.len() + 1),
        "nothing deleted: one event more"
    );
    // The artifact created after the point: a new, empty version marks it deleted.
    assert_eq!(
        json_with_status(s.get(&versions_path).await, 200).await,
        json!([0, 1])
    );
    let latest = json_with_status(
        s.get(&format!(
            "/apps/echo/users/{USER}/sessions/s1/artifacts/{artifact}"
        ))
        .await,
        200,
    )
    .await;
    assert_eq!(latest["inlineData"]["data"], "");

    // The next turn goes on from the restored state.
    run(&s, turn("echo", "s1", "four")).await;
    assert_eq!(session(&s, "echo", "s1").await["state"]["turns"], 2);

    let unknown = json_with_status(
        s.post_json(&path, json!({"beforeInvocationId": "e-nope"}))
            .await,
        404,
    )
    .await;
    assert_eq!(unknown["code"], "invocation_not_found");
    let adk_name = s
        .post_json(&path, json!({"rewind_before_invocation_id": "e-nope"}))
        .await;
    assert_eq!(
        json_with_status(adk_name, 404).await["code"],
        "invocation_not_found"
    );
    let missing = json_with_status(
        s.post_json(
            &format!("/apps/echo/users/{USER}/sessions/nope/rewind"),
            json!({"beforeInvocationId": "e-1"}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(missing["code"], "session_not_found");
    let bad = json_with_status(s.post_json(&path, json!({})).await, 422).await;
    assert_eq!(bad["code"], "validation_error");

    // A session a run holds is not rewound.
    run(&s, turn("slow", "s2", "first")).await;
    let first = turns(&session(&s, "slow", "s2").await)[0].clone();
    let started = s
        .post_json(
            &format!("/apps/slow/users/{USER}/sessions/s2/runs"),
            json!({"newMessage": {"role": "user", "parts": [{"text": "second"}]}}),
        )
        .await;
    let run = json_with_status(started, 202).await;
    let busy = json_with_status(
        s.post_json(
            &format!("/apps/slow/users/{USER}/sessions/s2/rewind"),
            json!({"beforeInvocationId": first}),
        )
        .await,
        409,
    )
    .await;
    assert_eq!(busy["code"], "session_busy");
    // `onBusy: enqueue` waits for the run, then rewinds.
    let run_id = run["runId"].as_str().expect("run id");
    json_with_status(
        s.post_json(
            &format!("/apps/slow/users/{USER}/sessions/s2/rewind"),
            json!({"beforeInvocationId": first, "onBusy": "enqueue"}),
        )
        .await,
        200,
    )
    .await;
    let waited = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(waited["status"], "completed", "{waited}");
    // `onBusy: interrupt` cancels the run, then rewinds.
    let started = s
        .post_json(
            &format!("/apps/slow/users/{USER}/sessions/s2/runs"),
            json!({"newMessage": {"role": "user", "parts": [{"text": "third"}]}}),
        )
        .await;
    let run = json_with_status(started, 202).await;
    let run_id = run["runId"].as_str().expect("run id");
    let third = turns(&session(&s, "slow", "s2").await)
        .last()
        .cloned()
        .expect("the third turn");
    json_with_status(
        s.post_json(
            &format!("/apps/slow/users/{USER}/sessions/s2/rewind"),
            json!({"beforeInvocationId": third, "onBusy": "interrupt"}),
        )
        .await,
        200,
    )
    .await;
    let interrupted = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(interrupted["status"], "cancelled", "{interrupted}");
}

/// After a rewind the model is sent the conversation without the annulled turns.
async fn the_model_does_not_see_rewound_turns(backend: Backend) {
    let m = ScriptedModel::start().await;
    for text in ["first answer", "second answer", "third answer"] {
        m.push("chat", Reply::text(&[text]));
    }
    let agent = LlmAgent::new("chat_agent", m.model("chat"));
    let s = TestServer::start_agent(backend, "chat", Arc::new(agent), PluginSet::default()).await;
    let mut body = turn("chat", "s1", "first question");
    body["saveInputBlobsAsArtifacts"] = json!(false);
    run(&s, body).await;
    run(&s, turn("chat", "s1", "second question")).await;
    let invocations = turns(&session(&s, "chat", "s1").await);
    let path = format!("/apps/chat/users/{USER}/sessions/s1/rewind");
    json_with_status(
        s.post_json(&path, json!({"beforeInvocationId": invocations[1]}))
            .await,
        200,
    )
    .await;
    run(&s, turn("chat", "s1", "another question")).await;
    let sent = m.requests_for("chat");
    let last = sent.last().expect("a request").to_string();
    assert!(
        last.contains("first question") && last.contains("first answer"),
        "{last}"
    );
    assert!(last.contains("another question"), "{last}");
    assert!(
        !last.contains("second question") && !last.contains("second answer"),
        "the rewound turn was sent: {last}"
    );
}

/// The agent that answers after a rewind is chosen from the conversation as it is now: a
/// sub-agent that took the turn in a rewound invocation does not keep it.
async fn a_rewound_transfer_does_not_keep_the_turn(backend: Backend) {
    let apps = Apps::new();
    let dir = apps.path().join("relay");
    std::fs::create_dir_all(&dir).expect("app dir");
    std::fs::write(
        dir.join("root_agent.yaml"),
        "agent_class: EchoAgent\nname: relay\nchunks: 0\nsub_agents:\n  - config_path: child.yaml\n",
    )
    .expect("root");
    std::fs::write(
        dir.join("child.yaml"),
        "agent_class: EchoAgent\nname: child\nchunks: 0\n",
    )
    .expect("child");
    let path = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = path).await;
    let authors = |msgs: &[common::sse_client::Msg]| -> Vec<String> {
        common::sse_client::complete(msgs)
            .iter()
            .map(|e| e["author"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let msgs = s.run_stream(turn("relay", "s1", "hello")).await;
    assert_eq!(authors(&msgs), ["relay"]);
    let msgs = s.run_stream(turn("relay", "s1", "@child take over")).await;
    assert_eq!(authors(&msgs), ["relay", "child"]);
    let msgs = s.run_stream(turn("relay", "s1", "still you?")).await;
    assert_eq!(authors(&msgs), ["child"], "the transfer keeps the turn");
    let invocations = turns(&session(&s, "relay", "s1").await);
    let rewind = format!("/apps/relay/users/{USER}/sessions/s1/rewind");
    json_with_status(
        s.post_json(&rewind, json!({"beforeInvocationId": invocations[1]}))
            .await,
        200,
    )
    .await;
    let msgs = s.run_stream(turn("relay", "s1", "who now?")).await;
    assert_eq!(authors(&msgs), ["relay"], "the transfer was rewound");
}

/// `PATCH …/memory` for session `id` of the echo app: 200.
async fn memory_add(s: &TestServer, id: &str) {
    let r = s
        .client
        .patch(s.url(&format!("/apps/echo/users/{USER}/memory")))
        .json(&json!({"sessionId": id}))
        .send()
        .await
        .expect("PATCH");
    assert_eq!(r.status(), 200);
}

/// How many of the user's memories match `word`.
async fn memory_found(s: &TestServer, word: &str) -> usize {
    let r = json_with_status(
        s.get(&format!("/apps/echo/users/{USER}/memory?query={word}"))
            .await,
        200,
    )
    .await;
    r["memories"].as_array().map_or(0, Vec::len)
}

/// Memory honours rewinds: a rewound turn leaves memory when the session is added again
/// (also when it was added before the rewind), the turns before it stay, and later turns are
/// added as usual.
async fn memory_forgets_rewound_turns(backend: Backend) {
    let apps = Apps::new().echo("echo", "chunks: 1");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = dir).await;
    run(&s, turn("echo", "s1", "alpha")).await;
    run(&s, turn("echo", "s1", "bravo")).await;
    memory_add(&s, "s1").await;
    assert!(memory_found(&s, "alpha").await > 0);
    assert!(memory_found(&s, "bravo").await > 0);
    let invocations = turns(&session(&s, "echo", "s1").await);
    json_with_status(
        s.post_json(
            &format!("/apps/echo/users/{USER}/sessions/s1/rewind"),
            json!({"beforeInvocationId": invocations[1]}),
        )
        .await,
        200,
    )
    .await;
    run(&s, turn("echo", "s1", "charlie")).await;
    memory_add(&s, "s1").await;
    assert!(
        memory_found(&s, "alpha").await > 0,
        "the turn before the rewind stays"
    );
    assert_eq!(
        memory_found(&s, "bravo").await,
        0,
        "the rewound turn left memory"
    );
    assert!(memory_found(&s, "charlie").await > 0);
    // Added only after the rewind: the rewound turn never enters memory.
    run(&s, turn("echo", "s2", "delta")).await;
    run(&s, turn("echo", "s2", "foxtrot")).await;
    let inv = turns(&session(&s, "echo", "s2").await);
    json_with_status(
        s.post_json(
            &format!("/apps/echo/users/{USER}/sessions/s2/rewind"),
            json!({"beforeInvocationId": inv[1]}),
        )
        .await,
        200,
    )
    .await;
    memory_add(&s, "s2").await;
    assert!(memory_found(&s, "delta").await > 0);
    assert_eq!(memory_found(&s, "foxtrot").await, 0);
}

/// The same session rewound by ADK-Python's own `Runner.rewind_async` (google-adk, pinned):
/// agentd's session and artifact versions are replayed into ADK's in-memory services, both
/// rewind to before the second turn, and the state delta, artifact delta, state after and
/// latest artifact contents agree.
async fn a_rewind_matches_adk_python(backend: Backend) {
    let apps = Apps::new().echo("echo", "chunks: 1");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = dir).await;
    let base = format!("/apps/echo/users/{USER}/sessions/s1");
    json_with_status(
        // ADK's create-session body is the state itself.
        s.post_json(&base, json!({"init": 1, "keep": "x"})).await,
        200,
    )
    .await;
    let deltas = [
        json!({"k": 1, "app:a": 1, "user:b": 1, "temp:t": 1}),
        json!({"k": 2, "k2": 5, "app:a": 2, "keep": null}),
        json!({"k3": true}),
    ];
    for (i, delta) in deltas.iter().enumerate() {
        let mut body = turn("echo", "s1", &format!("turn {i}"));
        body["stateDelta"] = delta.clone();
        if i < 2 {
            body["newMessage"]["parts"]
                .as_array_mut()
                .expect("parts")
                .push(json!({"inlineData": {"mimeType": "text/plain", "data": (["dmVyc2lvbiAw", "dmVyc2lvbiAx"][i])}}));
        }
        run(&s, body).await;
    }
    let before = session(&s, "echo", "s1").await;
    let invocations = turns(&before);
    // Every artifact version, in order.
    let names = json_with_status(s.get(&format!("{base}/artifacts")).await, 200).await;
    let mut artifacts = serde_json::Map::new();
    for name in names.as_array().expect("names") {
        let name = name.as_str().expect("name");
        let versions = json_with_status(
            s.get(&format!("{base}/artifacts/{name}/versions")).await,
            200,
        )
        .await;
        let mut blobs = vec![];
        for v in versions.as_array().expect("versions") {
            let part = json_with_status(
                s.get(&format!("{base}/artifacts/{name}/versions/{v}"))
                    .await,
                200,
            )
            .await;
            blobs.push(part["inlineData"].clone());
        }
        artifacts.insert(name.to_string(), Value::Array(blobs));
    }
    let input = json!({
        "app": "echo", "user": USER, "session": "s1", "initialState": {"init": 1, "keep": "x"},
        "events": before["events"], "artifacts": artifacts, "before": invocations[1],
    });
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), input.to_string()).expect("input");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/adk/rewind_parity.py"
    );
    let adk = common::clients::run_driver(
        &common::clients::adk_python(),
        &[script],
        &[("AGENTD_PARITY_INPUT", file.path().to_str().expect("path"))],
    )
    .await;
    assert!(adk.get("error").is_none(), "{adk}");

    let ours = json_with_status(
        s.post_json(
            &format!("{base}/rewind"),
            json!({"beforeInvocationId": invocations[1]}),
        )
        .await,
        200,
    )
    .await;
    // The one deliberate difference (docs/editing.md): ADK rebuilds the state from the events'
    // deltas alone, so it nulls `init`, which the session was created with, and cannot restore
    // `keep`, created with the session and removed since; agentd starts from the state the
    // session was created with. Any other difference fails.
    let adk_delta = adk["stateDelta"].as_object().expect("ADK's delta");
    assert_eq!(adk_delta.get("init"), Some(&Value::Null), "{adk}");
    let mut expected = adk_delta.clone();
    expected.remove("init");
    expected.insert("keep".into(), json!("x"));
    assert_eq!(
        ours["event"]["actions"]["stateDelta"],
        Value::Object(expected),
        "{adk}"
    );
    assert_eq!(
        ours["event"]["actions"]["artifactDelta"], adk["artifactDelta"],
        "{adk}"
    );
    // ADK keeps removed keys as null; agentd removes them.
    let present = |state: &Value| -> Value {
        Value::Object(
            state
                .as_object()
                .expect("state")
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    };
    let after = session(&s, "echo", "s1").await;
    let mut expected = present(&adk["state"]);
    expected["init"] = json!(1);
    expected["keep"] = json!("x");
    assert_eq!(present(&after["state"]), expected, "{adk}");
    for (name, latest) in adk["artifacts"].as_object().expect("artifacts") {
        let ours = json_with_status(s.get(&format!("{base}/artifacts/{name}")).await, 200).await;
        let ours = match ours["inlineData"]["data"].as_str() {
            Some("") | None => Value::Null,
            Some(_) => ours["inlineData"].clone(),
        };
        let norm = |v: &Value| -> Value {
            if v.is_null() {
                return Value::Null;
            }
            // Base64 with or without padding, URL-safe or not: compare the bytes.
            let data = v["data"]
                .as_str()
                .unwrap_or("")
                .trim_end_matches('=')
                .replace('-', "+")
                .replace('_', "/");
            json!({"mimeType": v["mimeType"], "data": data})
        };
        assert_eq!(norm(&ours), norm(latest), "{name}: {adk}");
    }
}

/// The state a session was created with survives a rewind (ADK's `rewind_async` nulls it):
/// untouched keys stay, a key changed since gets its creation value back, and a fork before a
/// turn starts from it too.
async fn a_rewind_keeps_the_state_the_session_was_created_with(backend: Backend) {
    let apps = Apps::new().echo("echo", "chunks: 1");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = dir).await;
    let base = format!("/apps/echo/users/{USER}/sessions");
    json_with_status(
        s.post_json(
            &base,
            json!({"sessionId": "s1", "state": {"lang": "fr", "tone": "dry"}}),
        )
        .await,
        200,
    )
    .await;
    run(&s, turn("echo", "s1", "one")).await;
    let mut second = turn("echo", "s1", "two");
    second["stateDelta"] = json!({"tone": "warm", "extra": 1});
    run(&s, second).await;
    let invocations = turns(&session(&s, "echo", "s1").await);
    let rewound = json_with_status(
        s.post_json(
            &format!("{base}/s1/rewind"),
            json!({"beforeInvocationId": invocations[1]}),
        )
        .await,
        200,
    )
    .await;
    let delta = &rewound["event"]["actions"]["stateDelta"];
    assert_eq!(
        delta.get("lang"),
        None,
        "an untouched creation key is left alone: {delta}"
    );
    assert_eq!(delta["tone"], "dry", "{delta}");
    assert_eq!(delta["extra"], Value::Null, "{delta}");
    let state = session(&s, "echo", "s1").await["state"].clone();
    assert_eq!(state["lang"], "fr", "{state}");
    assert_eq!(state["tone"], "dry", "{state}");
    // A key added since is nulled, as ADK's rewind does (set to None, not removed).
    assert!(state.get("extra").is_none_or(Value::is_null), "{state}");

    // A fork before the first turn starts from the creation state.
    json_with_status(
        s.post_json(
            &format!("{base}/s1/fork"),
            json!({"sessionId": "f1", "beforeInvocationId": invocations[0]}),
        )
        .await,
        201,
    )
    .await;
    let forked = session(&s, "echo", "f1").await["state"].clone();
    assert_eq!(forked["lang"], "fr", "{forked}");
    assert_eq!(forked["tone"], "dry", "{forked}");
}

both_backends!(
    a_rewind_keeps_the_state_the_session_was_created_with,
    a_rewind_restores_state_and_artifacts,
    the_model_does_not_see_rewound_turns,
    a_rewound_transfer_does_not_keep_the_turn,
    memory_forgets_rewound_turns,
    a_rewind_matches_adk_python,
);
