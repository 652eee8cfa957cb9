//! Editing a conversation: rewind (ADK's `rewind_async` as a route). The session keeps every
//! event; the rewind event restores state and artifacts, and the model never sees the turns it
//! annulled.

mod common;

use agentd::agent::llm::LlmAgent;
use agentd::agent::PluginSet;
use common::model_server::{Reply, ScriptedModel};
use common::procs::{Apps, USER};
use common::sse_client::done_status;
use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};
use std::sync::Arc;

fn turn(app: &str, session: &str, text: &str) -> Value {
    json!({
        "appName": app, "userId": USER, "sessionId": session, "createSession": true,
        "saveInputBlobsAsArtifacts": true,
        "newMessage": {"role": "user", "parts": [{"text": text}]},
    })
}

/// A turn through `POST /run`, read to its end: it completed.
async fn run(s: &TestServer, body: Value) {
    let msgs = s.run_stream(body).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:?}");
}

async fn session(s: &TestServer, app: &str, id: &str) -> Value {
    json_with_status(
        s.get(&format!("/apps/{app}/users/{USER}/sessions/{id}"))
            .await,
        200,
    )
    .await
}

/// The invocation ids of the session's user messages, in order.
fn turns(session: &Value) -> Vec<String> {
    session["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["author"] == "user" && e["content"].is_object())
        .map(|e| e["invocationId"].as_str().expect("invocation").to_string())
        .collect()
}

/// A server whose app `chat` (agent `chat_agent` on model `chat`) is compacted by model `sum`
/// every `interval` new turns (no overlap, instruction "Summarise.").
async fn compacting(backend: Backend, m: &ScriptedModel, interval: usize) -> TestServer {
    let agent = LlmAgent::new("chat_agent", m.model("chat"));
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        "chat",
        agentd::agent::AgentTree::new(Arc::new(agent)).expect("tree"),
    );
    apps.set_compaction(
        "chat",
        agentd::apps::settings::Compaction {
            policy: agentd::transcript::compaction::CompactionPolicy {
                interval: Some(interval),
                overlap: 0,
                token_threshold: None,
            },
            model: m.model("sum"),
            prompt: "Summarise.".into(),
        },
    );
    TestServer::start_embedded(backend, apps, PluginSet::default()).await
}

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

/// A fork holds the source's events before the point, the state and artifact versions as of
/// then (merged with the body's `state`), and goes on by itself; the source is unchanged.
async fn a_fork_starts_a_new_session_from_a_point(backend: Backend) {
    let apps = Apps::new().echo("echo", "chunks: 1");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = dir).await;
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        let mut body = turn("echo", "s1", text);
        if i == 1 {
            body["newMessage"]["parts"]
                .as_array_mut()
                .expect("parts")
                .push(json!({"inlineData": {"mimeType": "text/plain", "data": "aGVsbG8="}}));
            body["stateDelta"] = json!({"note": "set in two"});
        }
        run(&s, body).await;
    }
    let source = session(&s, "echo", "s1").await;
    let invocations = turns(&source);
    let events = source["events"].as_array().expect("events").clone();
    let point = events
        .iter()
        .position(|e| e["invocationId"] == invocations[1].as_str())
        .expect("the second turn");
    let fork = format!("/apps/echo/users/{USER}/sessions/s1/fork");
    let forked = json_with_status(
        s.post_json(
            &fork,
            json!({"beforeInvocationId": invocations[1], "sessionId": "f1", "state": {"extra": 1}}),
        )
        .await,
        201,
    )
    .await;
    assert_eq!(forked["id"], "f1");
    assert_eq!(forked["lastSeq"], point as i64);
    let f1 = session(&s, "echo", "f1").await;
    let copied: Vec<&Value> = f1["events"].as_array().expect("events").iter().collect();
    assert_eq!(copied.len(), point);
    for (a, b) in copied.iter().zip(&events) {
        assert_eq!(a["id"], b["id"]);
    }
    assert_eq!(f1["state"]["turns"], 1);
    assert_eq!(f1["state"]["extra"], 1);
    assert!(f1["state"].get("note").is_none(), "{f1}");
    let keys = json_with_status(
        s.get(&format!("/apps/echo/users/{USER}/sessions/f1/artifacts"))
            .await,
        200,
    )
    .await;
    assert_eq!(keys, json!([]), "the artifact came after the point");

    // The whole session, with its artifact.
    let whole = json_with_status(s.post_json(&fork, json!({"sessionId": "f2"})).await, 201).await;
    assert_eq!(whole["lastSeq"], events.len() as i64);
    let artifact = format!("artifact_{}_1", invocations[1]);
    let copy = json_with_status(
        s.get(&format!(
            "/apps/echo/users/{USER}/sessions/f2/artifacts/{artifact}"
        ))
        .await,
        200,
    )
    .await;
    assert_eq!(copy["inlineData"]["data"], "aGVsbG8=");
    assert_eq!(
        session(&s, "echo", "f2").await["state"]["note"],
        "set in two"
    );

    // The fork goes on by itself; the source is as it was.
    run(&s, turn("echo", "f1", "after the fork")).await;
    assert_eq!(session(&s, "echo", "f1").await["state"]["turns"], 2);
    let again = session(&s, "echo", "s1").await;
    assert_eq!(again["events"], source["events"]);
    assert_eq!(again["state"]["turns"], 3);

    let taken = json_with_status(s.post_json(&fork, json!({"sessionId": "f1"})).await, 409).await;
    assert_eq!(taken["code"], "session_exists");
    let both = json_with_status(
        s.post_json(&fork, json!({"atSeq": 1, "beforeInvocationId": "e-x"}))
            .await,
        400,
    )
    .await;
    assert_eq!(both["code"], "fork_point_ambiguous");
    let far = json_with_status(s.post_json(&fork, json!({"atSeq": 9999})).await, 422).await;
    assert_eq!(far["code"], "seq_out_of_range");
    let unknown = json_with_status(
        s.post_json(&fork, json!({"beforeInvocationId": "e-nope"}))
            .await,
        404,
    )
    .await;
    assert_eq!(unknown["code"], "invocation_not_found");
    let at = json_with_status(
        s.post_json(&fork, json!({"atSeq": 2, "sessionId": "f3"}))
            .await,
        201,
    )
    .await;
    assert_eq!(at["lastSeq"], 2);
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

/// `/run` with `regenerate` runs the last turn again, and with `editInvocationId` runs a new
/// message in an earlier turn's place: the model is sent the conversation before that turn,
/// and the rewind and the new user event are committed together. Refused edits (an unknown
/// turn, both fields, nothing to regenerate, a message the store refuses) leave the session
/// exactly as it was.
async fn regenerate_and_edit_rewind_and_run_in_one_commit(backend: Backend) {
    let m = ScriptedModel::start().await;
    for text in [
        "answer one",
        "answer two",
        "answer regenerated",
        "answer edited",
    ] {
        m.push("chat", Reply::text(&[text]));
    }
    let agent = LlmAgent::new("chat_agent", m.model("chat"));
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        "chat",
        agentd::agent::AgentTree::new(Arc::new(agent)).expect("tree"),
    );
    let s = TestServer::start_embedded_with(backend, apps, PluginSet::default(), |a| {
        a.max_artifact_bytes = 64
    })
    .await;
    run(&s, turn("chat", "s1", "question one")).await;
    run(&s, turn("chat", "s1", "question two")).await;
    let before = session(&s, "chat", "s1").await;
    let invocations = turns(&before);
    let count = |s: &Value| s["events"].as_array().map_or(0, Vec::len);

    // Regenerate: the last turn again, without its answer.
    let base = json!({"appName": "chat", "userId": USER, "sessionId": "s1"});
    let mut regenerate = base.clone();
    regenerate["regenerate"] = json!(true);
    run(&s, regenerate.clone()).await;
    let sent = m
        .requests_for("chat")
        .last()
        .expect("a request")
        .to_string();
    assert!(
        sent.contains("question one")
            && sent.contains("answer one")
            && sent.contains("question two"),
        "{sent}"
    );
    assert!(
        !sent.contains("answer two"),
        "the rewound answer was sent: {sent}"
    );
    let after = session(&s, "chat", "s1").await;
    let events = after["events"].as_array().expect("events");
    assert_eq!(
        count(&after),
        count(&before) + 3,
        "a rewind, the user event, the answer"
    );
    let (rewind, user) = (&events[count(&before)], &events[count(&before) + 1]);
    assert_eq!(
        rewind["actions"]["rewindBeforeInvocationId"],
        invocations[1].as_str()
    );
    assert_eq!(user["content"]["parts"][0]["text"], "question two");
    assert_ne!(user["invocationId"], invocations[1].as_str());
    assert_eq!(after["state"], before["state"], "an echo of the same turn");

    // Edit the first turn: only the new message is sent.
    let mut edit = base.clone();
    edit["editInvocationId"] = json!(invocations[0]);
    edit["newMessage"] = json!({"role": "user", "parts": [{"text": "question one, edited"}]});
    run(&s, edit).await;
    let sent = m
        .requests_for("chat")
        .last()
        .expect("a request")
        .to_string();
    assert!(sent.contains("question one, edited"), "{sent}");
    for gone in ["answer one", "question two", "answer regenerated"] {
        assert!(!sent.contains(gone), "{gone} was sent: {sent}");
    }
    assert_eq!(m.unused(), 0);

    // `?includeRewound=false`: the conversation as the model sees it, whole or the newest.
    let texts = |s: &Value| -> Vec<String> {
        s["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter_map(|e| {
                e["content"]["parts"][0]["text"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    };
    let live = session(&s, "chat", "s1?includeRewound=false").await;
    assert_eq!(texts(&live), ["question one, edited", "answer edited"]);
    assert_eq!(live["events"].as_array().map(Vec::len), Some(2), "{live}");
    let newest = session(&s, "chat", "s1?includeRewound=false&limit=3").await;
    assert_eq!(texts(&newest), ["question one, edited", "answer edited"]);
    assert_eq!(
        newest["events"].as_array().map(Vec::len),
        Some(2),
        "{newest}"
    );
    let all = session(&s, "chat", "s1?includeRewound=true").await;
    assert_eq!(all["events"], session(&s, "chat", "s1").await["events"]);
    assert_eq!(texts(&all).len(), 8, "{all}");

    // Refusals store nothing.
    let stored = session(&s, "chat", "s1").await;
    let refuse = |body: Value, status: u16, code: &'static str| {
        let s = &s;
        async move {
            let r = json_with_status(s.post_json("/run", body).await, status).await;
            assert_eq!(r["code"], code, "{r}");
        }
    };
    let mut unknown = base.clone();
    unknown["editInvocationId"] = json!("e-nope");
    unknown["newMessage"] = json!({"role": "user", "parts": [{"text": "x"}]});
    refuse(unknown, 404, "invocation_not_found").await;
    let mut both = regenerate.clone();
    both["editInvocationId"] = json!(invocations[0]);
    refuse(both, 400, "edit_ambiguous").await;
    let mut resume = regenerate.clone();
    resume["resume"] = json!(true);
    refuse(resume, 400, "edit_ambiguous").await;
    // The new message's file is over the artifact limit: the rewind is not committed either.
    let mut large = regenerate.clone();
    large["saveInputBlobsAsArtifacts"] = json!(true);
    large["newMessage"] = json!({"role": "user", "parts": [{"text": "see"},
        {"inlineData": {"mimeType": "text/plain", "data": "eHh4".repeat(40)}}]});
    refuse(large, 413, "artifact_too_large").await;
    assert_eq!(session(&s, "chat", "s1").await["events"], stored["events"]);

    // Nothing to regenerate in a session without turns.
    json_with_status(
        s.post_json(
            &format!("/apps/chat/users/{USER}/sessions/empty"),
            json!({}),
        )
        .await,
        200,
    )
    .await;
    let mut empty = regenerate.clone();
    empty["sessionId"] = json!("empty");
    refuse(empty, 404, "turn_not_found").await;
    assert_eq!(session(&s, "chat", "empty").await["events"], json!([]));
}

/// Compaction: after two turns the app's compaction model summarises them (ADK's
/// `actions.compaction` event), and the next turn sends the summary instead of those turns.
/// A summariser that fails leaves the history as it was.
async fn compaction_replaces_old_turns_with_a_summary(backend: Backend) {
    let m = ScriptedModel::start().await;
    for text in ["answer one", "answer two", "answer three"] {
        m.push("chat", Reply::text(&[text]));
    }
    m.push("sum", Reply::text(&["SUMMARY of one and two"]));
    let s = compacting(backend, &m, 2).await;
    let mut body = turn("chat", "s1", "question one");
    body["saveInputBlobsAsArtifacts"] = json!(false);
    run(&s, body).await;
    run(&s, turn("chat", "s1", "question two")).await;
    // The summary is committed in the background after the second run.
    let mut compacted = None;
    for _ in 0..100 {
        let now = session(&s, "chat", "s1").await;
        compacted = now["events"]
            .as_array()
            .expect("events")
            .iter()
            .find(|e| e["actions"]["compaction"].is_object())
            .cloned();
        if compacted.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let compacted = compacted.expect("a compaction event");
    let events = session(&s, "chat", "s1").await["events"].clone();
    let c = &compacted["actions"]["compaction"];
    assert_eq!(compacted["author"], "user");
    assert_eq!(c["startTimestamp"], events[0]["timestamp"]);
    assert_eq!(c["endTimestamp"], events[3]["timestamp"]);
    assert_eq!(
        c["compactedContent"],
        json!({"role": "model", "parts": [{"text": "SUMMARY of one and two"}]})
    );
    let asked = m
        .requests_for("sum")
        .last()
        .expect("the summariser")
        .to_string();
    assert!(
        asked.contains("Summarise.")
            && asked.contains("user: question one")
            && asked.contains("chat_agent: answer two"),
        "{asked}"
    );

    run(&s, turn("chat", "s1", "question three")).await;
    let sent = m
        .requests_for("chat")
        .last()
        .expect("a request")
        .to_string();
    assert!(
        sent.contains("SUMMARY of one and two") && sent.contains("question three"),
        "{sent}"
    );
    for gone in ["question one", "answer one", "question two", "answer two"] {
        assert!(!sent.contains(gone), "{gone} was sent: {sent}");
    }
    // Nothing was deleted.
    assert_eq!(
        session(&s, "chat", "s1").await["events"]
            .as_array()
            .map(Vec::len),
        Some(7)
    );

    // A summariser without an answer: no compaction, the next turn sends everything.
    for text in ["answer four", "answer five", "answer six"] {
        m.push("chat", Reply::text(&[text]));
    }
    let asked = m.requests_for("sum").len();
    run(&s, turn("chat", "s2", "question four")).await;
    run(&s, turn("chat", "s2", "question five")).await;
    run(&s, turn("chat", "s2", "question six")).await;
    assert!(
        m.requests_for("sum").len() > asked,
        "the summariser was asked"
    );
    let sent = m
        .requests_for("chat")
        .last()
        .expect("a request")
        .to_string();
    assert!(
        sent.contains("question four") && sent.contains("answer five"),
        "{sent}"
    );
    let s2 = session(&s, "chat", "s2").await;
    assert!(
        s2["events"]
            .as_array()
            .expect("events")
            .iter()
            .all(|e| e["actions"]["compaction"].is_null()),
        "{s2}"
    );
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
    assert_eq!(
        ours["event"]["actions"]["stateDelta"], adk["stateDelta"],
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
    assert_eq!(present(&after["state"]), present(&adk["state"]), "{adk}");
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

/// A long session keeps being compacted: the due check reads back from the newest events (a
/// session longer than one page of them once stopped compacting).
async fn a_long_session_keeps_being_compacted(backend: Backend) {
    let m = ScriptedModel::start().await;
    let turns = 130;
    for i in 0..turns {
        m.push("chat", Reply::text(&[&format!("answer {i}")]));
    }
    for i in 0..turns / 10 {
        m.push("sum", Reply::text(&[&format!("summary {i}")]));
    }
    let s = compacting(backend, &m, 10).await;
    for i in 0..turns {
        let mut body = turn("chat", "long", &format!("question {i}."));
        body["saveInputBlobsAsArtifacts"] = json!(false);
        run(&s, body).await;
    }
    let sent = m
        .requests_for("chat")
        .last()
        .expect("a request")
        .to_string();
    assert!(
        sent.contains("summary 11") && sent.contains("question 129."),
        "{sent}"
    );
    assert!(
        !sent.contains("question 105."),
        "turn 105 was not compacted: {sent}"
    );
    // Twelve summaries before the last turn (the thirteenth may be on its way).
    assert!(m.requests_for("sum").len() >= turns / 10 - 1);
}

/// OpenAI Responses on an app that compacts: a summary committed after a response does not
/// make the next `previous_response_id` a branch; a later turn does.
async fn a_summary_does_not_branch_a_response_chain(backend: Backend) {
    let m = ScriptedModel::start().await;
    for text in ["one", "two", "three"] {
        m.push("chat", Reply::text(&[text]));
    }
    for text in ["summary a", "summary b", "summary c"] {
        m.push("sum", Reply::text(&[text]));
    }
    let s = compacting(backend, &m, 1).await;
    let respond = |input: &'static str, previous: Option<String>| {
        let s = &s;
        async move {
            let r = s
                .post_json(
                    "/v1/responses",
                    json!({"model": "chat", "input": input, "user": USER,
                           "previous_response_id": previous}),
                )
                .await;
            assert_eq!(r.status(), 200);
            let session = r.headers()["x-agentd-session-id"]
                .to_str()
                .expect("session")
                .to_string();
            let body: Value = r.json().await.expect("json");
            (body["id"].as_str().expect("id").to_string(), session)
        }
    };
    let (first, session_id) = respond("q1", None).await;
    // Wait for the summary of the first turn.
    for _ in 0..100 {
        let now = session(&s, "chat", &session_id).await;
        if now["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["actions"]["compaction"].is_object()))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (second, same) = respond("q2", Some(first.clone())).await;
    assert_eq!(same, session_id, "a summary is not a later turn");
    // Naming the first response again, after the second turn: a branch.
    let (_, branch) = respond("q3", Some(first)).await;
    assert_ne!(branch, session_id);
    assert!(branch.starts_with("resp-branch-"), "{branch}");
    let _ = second;
}

/// Two agentd processes over one PostgreSQL database (replicas share a database server, as
/// in `tests/replicas.rs`): turns on A, a regenerate on B, a rewind on A and a fork on B all
/// see the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_work_across_replicas() {
    let db = common::TestDb::new(Backend::Postgres).await;
    let apps = Apps::new().echo("echo", "chunks: 1");
    let a = common::procs::Replica::spawn(&db, &apps, "a", &[]).await;
    let b = common::procs::Replica::spawn(&db, &apps, "b", &[]).await;
    let on = |r: &common::procs::Replica, body: Value| {
        let url = r.url("/run");
        let client = r.client.clone();
        async move {
            let resp = client.post(url).json(&body).send().await.expect("POST");
            let msgs = common::sse_client::read_all(resp).await;
            assert_eq!(done_status(&msgs), "completed", "{msgs:?}");
        }
    };
    on(&a, turn("echo", "x", "one")).await;
    on(&a, turn("echo", "x", "two")).await;
    let path = format!("/apps/echo/users/{USER}/sessions/x");
    let before = json_with_status(a.get(&path).await, 200).await;
    let invocations = turns(&before);
    // Regenerate on B: the rewind and the user event, then the answer.
    on(
        &b,
        json!({"appName": "echo", "userId": USER, "sessionId": "x", "regenerate": true}),
    )
    .await;
    let after = json_with_status(a.get(&path).await, 200).await;
    let events = after["events"].as_array().expect("events");
    assert_eq!(
        events.len(),
        before["events"].as_array().map_or(0, Vec::len) + 3
    );
    assert_eq!(
        events[events.len() - 3]["actions"]["rewindBeforeInvocationId"],
        invocations[1].as_str()
    );
    // A rewind on A, seen on B without the rewound turns.
    json_with_status(
        a.post(
            &format!("{path}/rewind"),
            json!({"beforeInvocationId": invocations[1]}),
        )
        .await,
        200,
    )
    .await;
    let live = json_with_status(b.get(&format!("{path}?includeRewound=false")).await, 200).await;
    let texts: Vec<&str> = live["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["author"] == "user")
        .filter_map(|e| e["content"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, ["one"], "{live}");
    // A fork on B of what A wrote.
    let forked = json_with_status(
        b.post(&format!("{path}/fork"), json!({"sessionId": "x-copy"}))
            .await,
        201,
    )
    .await;
    assert_eq!(
        forked["lastSeq"].as_i64(),
        Some(after["events"].as_array().map_or(0, Vec::len) as i64 + 1)
    );
}

/// A rewind of a turn older than what the compaction reads back still counts: the turns it
/// annulled are never summarised (the compaction finds rewinds in the database, not in its
/// window of recent events).
async fn a_compaction_never_summarises_rewound_turns(backend: Backend) {
    let m = ScriptedModel::start().await;
    let count = 101;
    for i in 0..count + 2 {
        m.push("chat", Reply::text(&[&format!("answer {i}")]));
    }
    for i in 0..60 {
        m.push("sum", Reply::text(&[&format!("summary {i}")]));
    }
    let s = compacting(backend, &m, 2).await;
    for i in 0..count {
        let mut body = turn("chat", "long", &format!("question {i}."));
        body["saveInputBlobsAsArtifacts"] = json!(false);
        run(&s, body).await;
    }
    // Back to before the fifth turn: far older than the newest page of events.
    let invocations = turns(&session(&s, "chat", "long").await);
    json_with_status(
        s.post_json(
            &format!("/apps/chat/users/{USER}/sessions/long/rewind"),
            json!({"beforeInvocationId": invocations[4], "onBusy": "enqueue"}),
        )
        .await,
        200,
    )
    .await;
    let asked = m.requests_for("sum").len();
    for text in ["after a.", "after b."] {
        let mut body = turn("chat", "long", text);
        body["saveInputBlobsAsArtifacts"] = json!(false);
        run(&s, body).await;
    }
    let sent = m
        .requests_for("chat")
        .last()
        .expect("a request")
        .to_string();
    assert!(
        !sent.contains("question 100."),
        "a rewound turn was sent: {sent}"
    );
    for summary in &m.requests_for("sum")[asked..] {
        let summary = summary.to_string();
        assert!(
            !summary.contains("question 100."),
            "a rewound turn was summarised: {summary}"
        );
    }
}

both_backends!(
    a_rewind_restores_state_and_artifacts,
    the_model_does_not_see_rewound_turns,
    a_fork_starts_a_new_session_from_a_point,
    a_rewound_transfer_does_not_keep_the_turn,
    regenerate_and_edit_rewind_and_run_in_one_commit,
    compaction_replaces_old_turns_with_a_summary,
    memory_forgets_rewound_turns,
    a_rewind_matches_adk_python,
    a_long_session_keeps_being_compacted,
    a_summary_does_not_branch_a_response_chain,
    a_compaction_never_summarises_rewound_turns,
);
