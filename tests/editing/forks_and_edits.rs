//! Forks, regenerate and edit (a rewind and a run in one commit), and edits across replicas.

use super::*;
use crate::both_backends;

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

/// Two agentd processes over one PostgreSQL database (replicas share a database server, as
/// in `tests/replicas/`): turns on A, a regenerate on B, a rewind on A and a fork on B all
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

both_backends!(
    a_fork_starts_a_new_session_from_a_point,
    regenerate_and_edit_rewind_and_run_in_one_commit,
);
