//! agentd's apps as remote A2A agents of other agents: an app of one agentd used by an app of
//! another (`RemoteA2aAgent`), and ADK-Python's own `RemoteA2aAgent` calling an app.

use super::*;
use crate::both_backends;

/// Two agentd processes: an app of A is a `RemoteA2aAgent` of an app of B (directly, and as a
/// transfer target). Its answer streams back as partial events and is committed with the
/// remote ids; the next turn continues the remote context; cancelling A's run cancels B's task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_uses_another_agentd_as_a_remote_a2a_agent() {
    let db_b = TestDb::postgres().await;
    let apps_b = Apps::new()
        .echo("slow", SLOW)
        .echo("long", "chunks: 100\nchunk_delay_ms: 100");
    let b = Replica::spawn(&db_b, &apps_b, "b", &[]).await;
    let db_a = TestDb::postgres().await;
    let apps_a = Apps::new().echo("desk", "sub_agents:\n  - config_path: helper.yaml");
    let remote = |name: &str, app: &str| {
        format!(
            "agent_class: RemoteA2aAgent\nname: {name}\ndescription: B's {app}\n\
             agent_card: {}/a2a/{app}/.well-known/agent-card.json\nallow_private: [\"127.0.0.1\"]\n",
            b.base
        )
    };
    for (app, file, yaml) in [
        ("front", "root_agent.yaml", remote("front", "slow")),
        (
            "front_long",
            "root_agent.yaml",
            remote("front_long", "long"),
        ),
        ("desk", "helper.yaml", remote("helper", "slow")),
    ] {
        let dir = apps_a.path().join(app);
        std::fs::create_dir_all(&dir).expect("app dir");
        std::fs::write(dir.join(file), yaml).expect("agent file");
    }
    let a = Replica::spawn(&db_a, &apps_a, "a", &[]).await;

    let run = |app: &str, session: &str, text: &str| {
        json!({"appName": app, "userId": "u1", "sessionId": session, "createSession": true,
               "streaming": true, "newMessage": {"role": "user", "parts": [{"text": text}]}})
    };
    let events = |body: String| -> Vec<Value> {
        body.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect()
    };
    let first = events(
        a.post("/run_sse", run("front", "s1", "hello"))
            .await
            .text()
            .await
            .expect("body"),
    );
    let partials: Vec<&Value> = first.iter().filter(|e| e["partial"] == true).collect();
    assert!(
        partials.len() >= 2,
        "B's chunks streamed as partial events: {first:?}"
    );
    assert!(partials.iter().all(|e| e["author"] == "front"));
    let last = first.last().expect("a final event");
    assert_eq!(last["content"]["parts"][0]["text"], "hello");
    let task = last["customMetadata"]["a2a:task_id"]
        .as_str()
        .expect("remote task id");
    let ctx = last["customMetadata"]["a2a:context_id"]
        .as_str()
        .expect("remote context")
        .to_string();
    let on_b = json_with_status(
        b.client
            .get(b.url(&format!("/a2a/slow/tasks/{task}")))
            .send()
            .await
            .expect("GET"),
        200,
    )
    .await;
    assert_eq!(on_b["status"]["state"], "TASK_STATE_COMPLETED");
    let second = events(
        a.post("/run_sse", run("front", "s1", "again"))
            .await
            .text()
            .await
            .expect("body"),
    );
    let last = second.last().expect("a final event");
    assert_eq!(last["content"]["parts"][0]["text"], "again");
    assert_eq!(
        last["customMetadata"]["a2a:context_id"],
        ctx.as_str(),
        "the same remote context"
    );

    // As a transfer target of an agent of A.
    let desk = events(
        a.post("/run_sse", run("desk", "s2", "@helper hi there"))
            .await
            .text()
            .await
            .expect("body"),
    );
    let last = desk.last().expect("a final event");
    assert_eq!(last["author"], "helper");
    assert_eq!(last["content"]["parts"][0]["text"], "@helper hi there");

    // Cancelling A's run cancels B's task.
    let started = json_with_status(
        a.post(
            "/apps/front_long/users/u1/sessions/s3/runs",
            json!({"createSession": true, "newMessage": {"role": "user", "parts": [{"text": LONG}]}}),
        )
        .await,
        202,
    )
    .await;
    let run_id = started["runId"].as_str().expect("run id").to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let b_runs = || async {
        json_with_status(b.get("/apps/long/users/a2a/runs").await, 200).await["runs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    while !b_runs().await.iter().any(|r| r["status"] == "running") {
        assert!(
            std::time::Instant::now() < deadline,
            "B's task never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let cancel = a.post(&format!("/runs/{run_id}/cancel"), json!({})).await;
    assert!(cancel.status().is_success(), "{}", cancel.status());
    loop {
        let runs = b_runs().await;
        if runs.first().is_some_and(|r| r["status"] == "cancelled") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B's task was not cancelled: {runs:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// ADK-Python's own `RemoteA2aAgent` (google-adk, its Runner and an in-memory session) calls
/// an agentd app: two turns in one ADK session continue one agentd context.
async fn adk_pythons_remote_a2a_agent_calls_an_app(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", SLOW);
    let r = Replica::spawn(&db, &apps, "a", &[]).await;
    let card = r.url("/a2a/slow/.well-known/agent-card.json");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/adk/remote_a2a.py"
    );
    let out = common::clients::run_driver(
        &common::clients::adk_python(),
        &[script],
        &[("AGENTD_CARD", card.as_str())],
    )
    .await;
    assert!(out.get("error").is_none(), "{out}");
    assert_eq!(out["texts"], json!(["hello", "hello again"]));
    let ctx = out["custom_metadata"]["a2a:context_id"]
        .as_str()
        .expect("context id");
    let session = json_with_status(
        r.get(&format!("/apps/slow/users/a2a/sessions/{ctx}")).await,
        200,
    )
    .await;
    assert_eq!(
        session["events"].as_array().map(Vec::len),
        Some(4),
        "both turns in one agentd session"
    );
}

both_backends!(adk_pythons_remote_a2a_agent_calls_an_app);
