//! Every statement a session's life runs on Citus is one shard's, whichever statement the
//! code uses: a server on connections where Citus refuses any statement planned over several
//! shards (`citus.multi_task_query_log_level = error`) creates a session, runs it twice
//! (admission, the user event, the agent's events, the run's end), reads it back, lists and
//! pages sessions, events and runs, adds the session to memory and searches it, reads the
//! usage, and deletes the session: every answer is a success. Its limits: the app is an echo
//! agent (no model call, no budget), there is one user and one app (a statement keyed by a
//! list of users stays on one shard here), and a refused write that is only logged (a
//! best-effort one) fails no answer. The background scans that span every user by design are
//! refused there too and only log; the `EXPLAIN` list in `main.rs` checks their parts' plans.

use super::*;
use common::{json_with_status, TestServer};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_life_is_one_shards_statements() {
    if citus::admin_url().is_none() {
        citus::not_run("citus::a_runs_life_is_one_shards_statements");
        return;
    }
    let db = TestDb::citus().await;
    let name = db.url.rsplit('/').next().unwrap_or_default().to_string();
    let url = db.url.clone();
    // Started first: a replica's start-up reads span every user (its runs to recover).
    let s = TestServer::start_on(db, |_| {}).await;
    let mut conn = refuse_multi_shard(&url).await;
    // The server's connections are dropped: its pool opens new ones, with the setting.
    let dropped: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&name)
    .fetch_all(&mut conn)
    .await
    .expect("terminate");
    assert!(!dropped.is_empty(), "the server held no connection");
    let refused = conn.execute("SELECT count(*) FROM sessions").await;
    assert!(refused.is_ok(), "this connection predates the setting");
    let mut fresh = sqlx::PgConnection::connect(&url).await.expect("connect");
    let refused = fresh.execute("SELECT count(*) FROM sessions").await;
    assert!(
        refused.is_err(),
        "a multi-shard read ran: the check would catch nothing"
    );
    let base = "/apps/echo/users/u1/sessions";
    // The pool finds its dropped connections out (a request may get 503 meanwhile).
    let mut tries = 0;
    while s.get(base).await.status() != 200 {
        tries += 1;
        assert!(tries < 50, "the server never reconnected");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    json_with_status(
        s.post_json(&format!("{base}/s1"), json!({"state": {"k": 1}}))
            .await,
        200,
    )
    .await;
    for text in ["one", "two"] {
        let msgs = s
            .run_stream(json!({
                "appName": "echo", "userId": "u1", "sessionId": "s1",
                "newMessage": {"role": "user", "parts": [{"text": text}]},
            }))
            .await;
        let done = msgs.last().expect("a done event");
        assert_eq!(done.data["status"], "completed", "{msgs:?}");
    }
    let session = json_with_status(s.get(&format!("{base}/s1")).await, 200).await;
    assert_eq!(
        session["events"].as_array().map(Vec::len),
        Some(4),
        "{session}"
    );
    json_with_status(s.get(base).await, 200).await;
    json_with_status(
        s.get(&format!("{base}/s1/events?after=1&limit=2")).await,
        200,
    )
    .await;
    let runs = json_with_status(s.get("/apps/echo/users/u1/runs").await, 200).await;
    let run = runs["runs"][0]["runId"]
        .as_str()
        .expect("a run id")
        .to_string();
    // By its user (`/runs/{id}` alone looks in every user's shard, by design).
    json_with_status(s.get(&format!("/apps/echo/users/u1/runs/{run}")).await, 200).await;
    let page = "/apps/echo/users/u1/runs?status=completed&limit=1";
    let first = json_with_status(s.get(page).await, 200).await;
    let next = first["next"].as_str().expect("a second page").to_string();
    json_with_status(s.get(&format!("{page}&after={next}")).await, 200).await;
    let memory = s
        .client
        .patch(s.url("/apps/echo/users/u1/memory"))
        .json(&json!({"sessionId": "s1"}))
        .send()
        .await
        .unwrap();
    assert!(memory.status().is_success(), "{}", memory.status());
    json_with_status(s.get("/apps/echo/users/u1/memory?query=one").await, 200).await;
    json_with_status(s.get("/apps/echo/users/u1/usage").await, 200).await;
    assert_eq!(s.delete(&format!("{base}/s1")).await.status(), 200);
}
