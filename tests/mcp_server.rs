//! agentd as an MCP server, end to end: the official Python `mcp` SDK
//! (`streamable_http_client`, pinned in `tests/clients/python/requirements.txt`) lists, calls,
//! follows progress and cancels over `/mcp` and `/apps/{app}/mcp` on both backends against a
//! real `agentd`; a cancel sent to another replica stops the call's run; bad input gets
//! JSON-RPC errors or error results and stores nothing.

mod common;

use common::clients::mcp;
use common::procs::{Apps, Replica};
use common::{json_with_status, Backend, TestDb};
use serde_json::{json, Value};
use std::time::Duration;

const SLOW: &str = "description: Echoes slowly\nchunks: 5\nchunk_delay_ms: 80";

async fn driver(scenario: &str, url: &str, tool: &str) -> Value {
    let out = mcp(scenario, &[("AGENTD_MCP_URL", url), ("AGENTD_TOOL", tool)]).await;
    assert!(out.get("error").is_none(), "{scenario} at {url}: {out}");
    out
}

/// The user's runs of `app`, newest first (the MCP user is `mcp` without authentication).
async fn runs(r: &Replica, app: &str) -> Vec<Value> {
    let v = json_with_status(r.get(&format!("/apps/{app}/users/mcp/runs")).await, 200).await;
    v["runs"].as_array().cloned().unwrap_or_default()
}

async fn the_python_sdk_uses_apps_as_tools(backend: Backend) {
    let db = TestDb::new(backend).await;
    // `long` answers in ten seconds: a call to cancel.
    let apps = Apps::new()
        .echo("slow", SLOW)
        .echo("long", "chunks: 100\nchunk_delay_ms: 100");
    let r = Replica::spawn(&db, &apps, "a", &[]).await;
    let all = r.url("/mcp");
    let one = r.url("/apps/slow/mcp");

    let listed = driver("list", &all, "slow").await;
    assert_eq!(listed["server"], "agentd");
    assert_eq!(listed["tools"], json!(["long", "slow"]));
    assert_eq!(listed["required"], json!(["message"]));
    assert_eq!(listed["has_output_schema"], true);
    assert_eq!(driver("list", &one, "slow").await["tools"], json!(["slow"]));

    for (url, long) in [(&all, all.clone()), (&one, r.url("/apps/long/mcp"))] {
        let called = driver("call", url, "slow").await;
        assert_eq!(called["text"], "hello");
        assert_eq!(
            (called["is_error"].clone(), called["status"].clone()),
            (json!(false), json!("completed"))
        );
        assert_eq!(called["again_text"], "hello again");
        assert_eq!(
            called["again_session_same"], true,
            "session_id continues the session"
        );
        assert_eq!(called["pinged"], true);
        // The tool's session is an agentd session of the MCP user, its run a run.
        let session = called["session_id"].as_str().expect("session id");
        let stored = json_with_status(
            r.get(&format!("/apps/slow/users/mcp/sessions/{session}"))
                .await,
            200,
        )
        .await;
        assert_eq!(stored["events"].as_array().map(Vec::len), Some(4));

        let progress = driver("progress", url, "slow").await;
        assert!(
            progress["progress"].as_u64().unwrap_or(0) >= 2,
            "{progress}"
        );
        assert_eq!(progress["progress_text"], "hello", "the chunks, in order");
        assert_eq!(progress["increasing"], true);
        assert_eq!(progress["text"], "hello");

        let before = runs(&r, "long").await.len();
        let cancelled = driver("cancel", &long, "long").await;
        assert_eq!(cancelled["cancelled"], true);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let last = loop {
            let all_runs = runs(&r, "long").await;
            let last = all_runs.first().cloned().unwrap_or(Value::Null);
            if all_runs.len() > before && last["status"] != "running" {
                break last;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the call's run never ended"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            last["status"], "cancelled",
            "the SDK's cancel stopped the run: {last}"
        );

        let errors = driver("errors", url, "slow").await;
        assert_eq!(errors["unknown_tool"], "MCPError");
        assert_eq!(errors["missing_message"], true);
    }
    // /apps/{app}/mcp serves that app only.
    let out = mcp(
        "call",
        &[("AGENTD_MCP_URL", one.as_str()), ("AGENTD_TOOL", "long")],
    )
    .await;
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("long"),
        "{out}"
    );
}

fn post(r: &Replica, path: &str, session: &str, body: Value) -> reqwest::RequestBuilder {
    r.client
        .post(r.url(path))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", session)
        .json(&body)
}

/// A call running on replica A is cancelled by a `notifications/cancelled` sent to replica
/// B: stateless, nothing sticky.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_sent_to_another_replica_stops_the_call() {
    let db = TestDb::postgres().await;
    let apps = Apps::new().echo("slow", "chunks: 100\nchunk_delay_ms: 100");
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"message": "a long one"}}});
    let pending = tokio::spawn(post(&a, "/mcp", "client-1", call).send());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !runs(&a, "slow")
        .await
        .iter()
        .any(|r| r["status"] == "running")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another client's cancel of the same request id does nothing.
    let cancel = |session: &str| {
        post(
            &b,
            "/mcp",
            session,
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 7, "reason": "changed my mind"}}),
        )
        .send()
    };
    assert_eq!(cancel("client-2").await.expect("POST").status(), 202);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs(&a, "slow").await[0]["status"], "running");
    assert_eq!(cancel("client-1").await.expect("POST").status(), 202);
    let answer = pending.await.expect("join").expect("the call answered");
    let body: Value = answer.json().await.expect("JSON");
    assert_eq!(
        body["result"]["structuredContent"]["status"], "cancelled",
        "{body}"
    );
    assert_eq!(body["result"]["isError"], true);
    let run = &runs(&a, "slow").await[0];
    assert_eq!(
        (run["cancelledBy"].clone(), run["cancelReason"].clone()),
        (json!("mcp"), json!("changed my mind"))
    );
}

async fn bad_input_is_refused_and_stores_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", SLOW);
    let r = Replica::spawn(&db, &apps, "a", &["--max-body-bytes", "65536"]).await;
    let rpc = |body: Value| post(&r, "/mcp", "s1", body).send();
    let call = |args: Value| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "slow", "arguments": args}})
    };
    // Malformed JSON-RPC, an unknown method, an unknown tool: JSON-RPC errors.
    let resp = r
        .client
        .post(r.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("POST");
    assert!(resp.status().is_client_error(), "{}", resp.status());
    let unknown: Value = rpc(json!({"jsonrpc": "2.0", "id": 2, "method": "frobnicate"}))
        .await
        .expect("POST")
        .json()
        .await
        .expect("JSON");
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    let tool: Value = rpc(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "nope", "arguments": {"message": "x"}}}))
    .await
    .expect("POST")
    .json()
    .await
    .expect("JSON");
    assert_eq!(tool["error"]["code"], -32602, "{tool}");
    // Bad arguments: an error result the model can read.
    for args in [
        json!({}),
        json!({"message": 5}),
        json!({"message": "x", "session_id": "a/b"}),
        json!({"message": "x", "session_id": 9}),
    ] {
        let res: Value = rpc(call(args.clone()))
            .await
            .expect("POST")
            .json()
            .await
            .expect("JSON");
        assert_eq!(res["result"]["isError"], true, "{args}: {res}");
    }
    // A huge message: the body limit.
    let huge = rpc(call(json!({"message": "x".repeat(100_000)})))
        .await
        .expect("POST");
    assert_eq!(huge.status(), 413);
    // A page elsewhere cannot drive it (Origin is checked, as the spec asks).
    let cross = post(
        &r,
        "/mcp",
        "s1",
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}),
    )
    .header("origin", "https://evil.example")
    .send()
    .await
    .expect("POST");
    assert_eq!(cross.status(), 403);
    assert!(runs(&r, "slow").await.is_empty(), "nothing ran");
}

both_backends!(
    the_python_sdk_uses_apps_as_tools,
    bad_input_is_refused_and_stores_nothing,
);
