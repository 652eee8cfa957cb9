//! The bounds of a user's memory on every backend: `--max-memories-per-user` (a write that
//! adds past it forgets the user's oldest, facts and sessions alike, and no other user's),
//! and an app's `memory: ttl_days:` (what was not stated or updated for that long is
//! forgotten, in that app only).

mod common;

use agentd::memory::retention::{expire, Expiring};
use agentd::store::MemoryEntry;
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::time::Duration;

async fn texts(s: &TestServer, app: &str, user: &str, query: &str) -> Vec<String> {
    let resp = s
        .get(&format!(
            "/apps/{app}/users/{user}/memory?query={query}&limit=100"
        ))
        .await;
    let mut texts: Vec<String> = json_with_status(resp, 200).await["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap().to_string())
        .collect();
    texts.sort();
    texts
}

async fn fact(s: &TestServer, user: &str, text: &str) {
    let resp = s
        .post_json(
            &format!("/apps/echo/users/{user}/memory"),
            json!({ "text": text }),
        )
        .await;
    json_with_status(resp, 201).await;
}

async fn a_user_keeps_only_the_newest_memories(backend: Backend) {
    let s = TestServer::start_with(backend, |a| a.max_memories_per_user = 3).await;
    fact(&s, "bob", "zebras of bob").await;
    for i in 0..5 {
        fact(&s, "alice", &format!("zebras fact {i}")).await;
    }
    assert_eq!(
        texts(&s, "echo", "alice", "zebras").await,
        ["zebras fact 2", "zebras fact 3", "zebras fact 4"]
    );
    assert_eq!(texts(&s, "echo", "bob", "zebras").await, ["zebras of bob"]);

    // A session added to memory counts the same: its two events (the message and the echo)
    // push out the two oldest facts.
    let msgs = s
        .run_stream(json!({
            "appName": "echo", "userId": "alice", "sessionId": "s1", "createSession": true,
            "newMessage": {"role": "user", "parts": [{"text": "zebras in a session"}]},
        }))
        .await;
    assert_eq!(msgs.last().unwrap().event, "done");
    let resp = s
        .patch_json("/apps/echo/users/alice/memory", json!({"sessionId": "s1"}))
        .await;
    assert_eq!(json_with_status(resp, 200).await, Value::Null);
    let now = texts(&s, "echo", "alice", "zebras").await;
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(now.contains(&"zebras fact 4".to_string()), "{now:?}");
    assert_eq!(
        now.iter().filter(|t| *t == "zebras in a session").count(),
        2,
        "{now:?}"
    );
    assert_eq!(texts(&s, "echo", "bob", "zebras").await, ["zebras of bob"]);
}

fn entry(id: &str, text: &str, age: Duration) -> MemoryEntry {
    MemoryEntry {
        session_id: String::new(),
        event_id: id.into(),
        author: "user".into(),
        timestamp: agentd::event::now_ts() - age.as_secs_f64(),
        text: text.into(),
        content: agentd::event::Content::text("user", text),
    }
}

async fn memories_past_the_apps_ttl_are_forgotten(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let day = Duration::from_secs(86_400);
    store
        .insert_memory("a", "u1", &entry("m-old", "old fact", day * 10))
        .await
        .unwrap();
    store
        .insert_memory("a", "u1", &entry("m-new", "new fact", day))
        .await
        .unwrap();
    store
        .insert_memory("a", "u2", &entry("m-old2", "old fact two", day * 6))
        .await
        .unwrap();
    store
        .insert_memory("b", "u1", &entry("m-old-b", "old fact of b", day * 10))
        .await
        .unwrap();
    expire(
        store.as_ref(),
        &[Expiring {
            app: "a".into(),
            ttl: day * 5,
        }],
    )
    .await;
    let alive = |app: &'static str, user: &'static str, id: &'static str| {
        let store = store.clone();
        async move { store.get_memory(app, user, id).await.unwrap().is_some() }
    };
    assert!(!alive("a", "u1", "m-old").await);
    assert!(!alive("a", "u2", "m-old2").await);
    assert!(alive("a", "u1", "m-new").await);
    assert!(
        alive("b", "u1", "m-old-b").await,
        "another app's memory expired"
    );
}

both_backends!(
    a_user_keeps_only_the_newest_memories,
    memories_past_the_apps_ttl_are_forgotten,
);
