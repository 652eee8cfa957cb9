//! `Idempotency-Key` on `POST /run`, `POST /run_sse` and session create, on both backends: a
//! repeat does the work once and answers what the first request produced.

mod common;

use common::sse_client::{read_all, Msg};
use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};

const USER: &str = "u1";

async fn server(backend: Backend) -> TestServer {
    TestServer::start(backend).await
}

fn body(session: &str, text: &str) -> Value {
    json!({"appName": "echo", "userId": USER, "sessionId": session, "createSession": true,
           "newMessage": {"role": "user", "parts": [{"text": text}]}})
}

async fn post_keyed(s: &TestServer, path: &str, key: &str, body: &Value) -> reqwest::Response {
    s.client
        .post(s.url(path))
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("POST")
}

fn committed_ids(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter(|m| m.is_event() && !m.is_partial())
        .map(|m| m.data["id"].as_str().unwrap_or("").to_string())
        .collect()
}

async fn event_count(s: &TestServer, session: &str) -> usize {
    let path = format!("/apps/echo/users/{USER}/sessions/{session}/events?limit=100");
    json_with_status(s.get(&path).await, 200).await["events"]
        .as_array()
        .map_or(0, Vec::len)
}

async fn a_repeated_run_streams_the_first_run_again(backend: Backend) {
    let s = server(backend).await;
    let first = post_keyed(&s, "/run", "k-1", &body("s1", "only once")).await;
    let run_id = first.headers()["x-agentd-run-id"]
        .to_str()
        .unwrap()
        .to_string();
    let first = read_all(first).await;
    let again = post_keyed(&s, "/run", "k-1", &body("s1", "only once")).await;
    assert_eq!(again.headers()["x-agentd-run-id"], run_id.as_str());
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again = read_all(again).await;
    assert_eq!(committed_ids(&again), committed_ids(&first));
    assert_eq!(
        again.last().unwrap().data,
        first.last().unwrap().data,
        "same done"
    );
    assert_eq!(
        event_count(&s, "s1").await,
        2,
        "one user event and one reply"
    );

    // JSON mode and ADK's /run_sse (its own key) replay too.
    let json_again = s
        .client
        .post(s.url("/run"))
        .header("Idempotency-Key", "k-1")
        .header("accept", "application/json")
        .json(&body("s1", "only once"))
        .send()
        .await
        .unwrap();
    let events = json_with_status(json_again, 200).await;
    let ids: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["id"].as_str())
        .collect();
    assert_eq!(ids, committed_ids(&first));
    let sse1 = read_all(post_keyed(&s, "/run_sse", "k-2", &body("s1", "adk")).await).await;
    let sse2 = read_all(post_keyed(&s, "/run_sse", "k-2", &body("s1", "adk")).await).await;
    assert_eq!(committed_ids(&sse2), committed_ids(&sse1));
    assert!(
        sse2.iter().all(|m| m.event == "message"),
        "ADK framing: {sse2:#?}"
    );
    assert_eq!(event_count(&s, "s1").await, 4);
}

async fn a_key_reused_with_another_body_is_refused(backend: Backend) {
    let s = server(backend).await;
    read_all(post_keyed(&s, "/run", "k", &body("s1", "first")).await).await;
    let other = post_keyed(&s, "/run", "k", &body("s1", "second")).await;
    assert_eq!(
        json_with_status(other, 422).await["code"],
        "idempotency_key_reused"
    );
    assert_eq!(event_count(&s, "s1").await, 2, "nothing ran");
    let bad = post_keyed(&s, "/run", &"x".repeat(300), &body("s1", "x")).await;
    assert_eq!(
        json_with_status(bad, 422).await["code"],
        "invalid_idempotency_key"
    );
    // A first request that failed before doing anything (its session does not exist) gave
    // its key up: a retry is evaluated again, and once the cause is gone, the retry with the
    // same key and the same body runs.
    let mut missing = body("s2", "retry me");
    missing["createSession"] = json!(false);
    let failed = post_keyed(&s, "/run", "k-fail", &missing).await;
    assert_eq!(
        json_with_status(failed, 404).await["code"],
        "session_not_found"
    );
    let failed = post_keyed(&s, "/run", "k-fail", &missing).await;
    assert_eq!(
        json_with_status(failed, 404).await["code"],
        "session_not_found",
        "still the same answer, not in_progress"
    );
    let sessions = format!("/apps/echo/users/{USER}/sessions");
    json_with_status(
        s.post_json(&sessions, json!({"sessionId": "s2"})).await,
        200,
    )
    .await;
    let retried = post_keyed(&s, "/run", "k-fail", &missing).await;
    assert!(
        retried.headers().get("idempotent-replayed").is_none(),
        "a run of its own, not a replay"
    );
    let retry_run = retried.headers()["x-agentd-run-id"]
        .to_str()
        .unwrap()
        .to_string();
    let msgs = read_all(retried).await;
    assert_eq!(msgs.last().unwrap().data["status"], "completed");
    assert_eq!(
        event_count(&s, "s2").await,
        2,
        "one user event and one reply"
    );
    // The key now stands for that run.
    let again = post_keyed(&s, "/run", "k-fail", &missing).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["x-agentd-run-id"], retry_run.as_str());
    assert_eq!(committed_ids(&read_all(again).await), committed_ids(&msgs));
    assert_eq!(event_count(&s, "s2").await, 2, "nothing ran twice");
    // Keys are scoped to the caller: another user may use the same key.
    let mut other_user = body("s1", "first");
    other_user["userId"] = json!("u2");
    let msgs = read_all(post_keyed(&s, "/run", "k", &other_user).await).await;
    assert_eq!(msgs.last().unwrap().data["status"], "completed");
}

async fn a_repeated_session_create_answers_the_same_session(backend: Backend) {
    let s = server(backend).await;
    let path = format!("/apps/echo/users/{USER}/sessions");
    let a = json_with_status(
        post_keyed(&s, &path, "c-1", &json!({"state": {"x": 1}})).await,
        200,
    )
    .await;
    let again = post_keyed(&s, &path, "c-1", &json!({"state": {"x": 1}})).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let b = json_with_status(again, 200).await;
    assert_eq!(a, b);
    let list = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "one session: {list}");
    let other = post_keyed(&s, &path, "c-1", &json!({"state": {"x": 2}})).await;
    assert_eq!(
        json_with_status(other, 422).await["code"],
        "idempotency_key_reused"
    );
}

both_backends!(
    a_repeated_run_streams_the_first_run_again,
    a_key_reused_with_another_body_is_refused,
    a_repeated_session_create_answers_the_same_session,
);
