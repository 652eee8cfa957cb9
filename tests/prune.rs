//! Retention: `agentd prune` (the real binary) deletes idle sessions with their events,
//! artifacts and memory entries, keeps recent ones, and a dry run deletes nothing.

mod common;

use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};

const USER: &str = "u1";

fn prune(url: &str, extra: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["prune", "--database-url", url, "--older-than", "30d"])
        .args(extra)
        // Every statement logged: the log goes to standard error, and the report on standard
        // output stays JSON (a slow statement's warning once landed in it).
        .env("RUST_LOG", "trace")
        .output()
        .expect("run agentd prune");
    assert!(
        out.status.success(),
        "prune failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

async fn idle_sessions_are_pruned_with_everything_they_own(backend: Backend) {
    let s = TestServer::start(backend).await;
    let base = format!("/apps/echo/users/{USER}");
    let forty_days_ago = agentd::event::now_ts() - 40.0 * 86_400.0;
    let old = json!({"sessionId": "old", "events": [{
        "author": "user", "invocationId": "e-old", "timestamp": forty_days_ago,
        "content": {"role": "user", "parts": [{"text": "remember the tulips"}]}}]});
    json_with_status(s.post_json(&format!("{base}/sessions"), old).await, 200).await;
    json_with_status(
        s.post_json(&format!("{base}/sessions"), json!({"sessionId": "new"}))
            .await,
        200,
    )
    .await;
    let artifact = json!({"filename": "notes.txt", "artifact": {"text": "hello"}});
    json_with_status(
        s.post_json(&format!("{base}/sessions/old/artifacts"), artifact)
            .await,
        200,
    )
    .await;
    json_with_status(
        s.patch_json(&format!("{base}/memory"), json!({"sessionId": "old"}))
            .await,
        200,
    )
    .await;
    let found = json_with_status(s.get(&format!("{base}/memory?query=tulips")).await, 200).await;
    assert_eq!(found["memories"].as_array().unwrap().len(), 1);

    let dry = tokio::task::spawn_blocking({
        let url = s.db.url.clone();
        move || prune(&url, &["--dry-run"])
    })
    .await
    .unwrap();
    assert_eq!(dry["dryRun"], true);
    assert_eq!(dry["sessions"], 1, "{dry}");
    assert_eq!(dry["events"], 1);
    assert_eq!(dry["artifacts"], 1);
    assert_eq!(dry["memoryEntries"], 1);
    json_with_status(s.get(&format!("{base}/sessions/old")).await, 200).await;

    let done = tokio::task::spawn_blocking({
        let url = s.db.url.clone();
        move || prune(&url, &["--batch", "1"])
    })
    .await
    .unwrap();
    assert_eq!(done["sessions"], 1, "{done}");
    assert_eq!(done["dryRun"], false);
    assert_eq!(s.get(&format!("{base}/sessions/old")).await.status(), 404);
    json_with_status(s.get(&format!("{base}/sessions/new")).await, 200).await;
    let found = json_with_status(s.get(&format!("{base}/memory?query=tulips")).await, 200).await;
    assert_eq!(found["memories"], json!([]));
    let again = tokio::task::spawn_blocking({
        let url = s.db.url.clone();
        move || prune(&url, &[])
    })
    .await
    .unwrap();
    assert_eq!(again["sessions"], 0, "nothing left to prune");
}

/// `--session-ttl`: the server prunes on its own, first when it starts, then every tenth of the
/// TTL. A session idle for 40 days goes with a 30-day TTL; a fresh one stays.
async fn the_server_prunes_by_itself_with_session_ttl(backend: Backend) {
    let db = common::TestDb::new(backend).await;
    let store = db.store().await;
    let forty_days_ago = agentd::event::now_ts() - 40.0 * 86_400.0;
    let mut old = agentd::event::Event::new("e-old", "user");
    old.timestamp = forty_days_ago;
    for (id, events) in [("old", vec![old]), ("new", vec![])] {
        store
            .create_session(agentd::store::NewSession {
                app_name: "echo".into(),
                user_id: USER.into(),
                session_id: Some(id.into()),
                events,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    drop(store);
    let s = TestServer::start_on(db, |a| {
        a.session_ttl = Some(std::time::Duration::from_secs(30 * 86_400));
    })
    .await;
    let base = format!("/apps/echo/users/{USER}/sessions");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while s.get(&format!("{base}/old")).await.status() != 404 {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle session was not pruned"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    json_with_status(s.get(&format!("{base}/new")).await, 200).await;
}

both_backends!(
    idle_sessions_are_pruned_with_everything_they_own,
    the_server_prunes_by_itself_with_session_ttl,
);
