//! Compaction: old turns replaced by a summary, again and again, never of rewound turns.

use super::*;
use crate::both_backends;

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
    compaction_replaces_old_turns_with_a_summary,
    a_long_session_keeps_being_compacted,
    a_summary_does_not_branch_a_response_chain,
    a_compaction_never_summarises_rewound_turns,
);
