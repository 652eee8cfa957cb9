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
    // `long` answers a message of 100 characters or more in ten seconds: a call to cancel.
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
        // A message of 120 characters: `long` streams 100 chunks of it over ten seconds, so
        // the run is working when the cancel comes (the echo splits no finer than a character).
        let prompt = "x".repeat(120);
        let cancelled = mcp(
            "cancel",
            &[
                ("AGENTD_MCP_URL", long.as_str()),
                ("AGENTD_TOOL", "long"),
                ("AGENTD_PROMPT", prompt.as_str()),
            ],
        )
        .await;
        assert!(
            cancelled.get("error").is_none(),
            "cancel at {long}: {cancelled}"
        );
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
        "params": {"name": "slow", "arguments": {"message": "long work ".repeat(12)}}});
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
    // JSON that is not a JSON-RPC message: a JSON-RPC invalid request (rmcp alone said 415).
    for body in [json!({}), json!(5), json!({"jsonrpc": "2.0", "id": 5})] {
        let resp = rpc(body.clone()).await.expect("POST");
        assert_eq!(resp.status(), 400, "{body}");
        let refused: Value = resp.json().await.expect("JSON");
        assert_eq!(refused["error"]["code"], -32600, "{body}: {refused}");
    }
    // A message rmcp cannot read (params of the wrong type): 400 `invalid_mcp_request`, not
    // "not labelled JSON" (rmcp's 415).
    let unreadable = rpc(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": 5}))
        .await
        .expect("POST");
    assert_eq!(unreadable.status(), 400);
    let unreadable: Value = unreadable.json().await.expect("JSON");
    assert_eq!(unreadable["code"], "invalid_mcp_request", "{unreadable}");
    // What the transport refuses is JSON with a stable code, like every route (rmcp's own
    // answers were plain text): a method it does not serve, an Accept without SSE, a
    // protocol version it does not speak; an app that is not served is a 404.
    let get = r
        .client
        .get(r.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .send()
        .await
        .expect("GET");
    assert_eq!(get.status(), 405);
    assert_eq!(get.headers()["allow"], "POST");
    let code = |v: Value| v["code"].as_str().unwrap_or_default().to_string();
    assert_eq!(code(get.json().await.expect("JSON")), "method_not_allowed");
    let list = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list"});
    let bare = |path: &str, accept: &str, version: &str| {
        r.client
            .post(r.url(path))
            .header("accept", accept)
            .header("mcp-protocol-version", version)
            .json(&list)
            .send()
    };
    let both = "application/json, text/event-stream";
    let plain_json = bare("/mcp", "application/json", "2025-11-25")
        .await
        .expect("POST");
    assert_eq!(plain_json.status(), 406);
    assert_eq!(
        code(plain_json.json().await.expect("JSON")),
        "not_acceptable"
    );
    let old = bare("/mcp", both, "1999-01-01").await.expect("POST");
    assert_eq!(old.status(), 400);
    let old: Value = old.json().await.expect("JSON");
    assert_eq!(code(old.clone()), "invalid_mcp_request", "{old}");
    assert!(
        old["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("1999-01-01"),
        "{old}"
    );
    let nowhere = bare("/apps/nope/mcp", both, "2025-11-25")
        .await
        .expect("POST");
    assert_eq!(nowhere.status(), 404);
    assert_eq!(code(nowhere.json().await.expect("JSON")), "app_not_found");
    assert!(runs(&r, "slow").await.is_empty(), "nothing ran");
    // A request id used twice in one session: the second call is refused, the first kept.
    let twice = |id: u64| {
        post(
            &r,
            "/mcp",
            "s1",
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "slow", "arguments": {"message": "once"}}}),
        )
        .send()
    };
    let first: Value = twice(42).await.expect("POST").json().await.expect("JSON");
    assert_eq!(first["result"]["isError"], false, "{first}");
    let again: Value = twice(42).await.expect("POST").json().await.expect("JSON");
    assert_eq!(again["result"]["isError"], true, "{again}");
    assert_eq!(runs(&r, "slow").await.len(), 1);
}

/// The official TypeScript SDK (`@modelcontextprotocol/sdk`): list, call, progress, and an
/// aborted call (it sends `notifications/cancelled`) that stops the run.
async fn the_typescript_sdk_uses_apps_as_tools(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new()
        .echo("slow", SLOW)
        .echo("long", "chunks: 100\nchunk_delay_ms: 100");
    let r = Replica::spawn(&db, &apps, "a", &[]).await;
    let url = r.url("/mcp");
    let node = |scenario: &'static str, tool: &'static str| {
        let url = url.clone();
        async move {
            let env = [("AGENTD_MCP_URL", url.as_str()), ("AGENTD_TOOL", tool)];
            let out = common::clients::node("node", "mcp.mjs", &[scenario], &env).await;
            assert!(out.get("error").is_none(), "{scenario}: {out}");
            out
        }
    };
    let called = node("call", "slow").await;
    assert_eq!(called["tools"], json!(["long", "slow"]));
    assert_eq!(called["text"], "hello");
    assert_eq!(
        (called["isError"].clone(), called["status"].clone()),
        (json!(false), json!("completed"))
    );
    assert!(
        called["sessionId"].is_string(),
        "an Mcp-Session-Id was issued"
    );
    let progress = node("progress", "slow").await;
    assert!(
        progress["progress"].as_u64().unwrap_or(0) >= 2,
        "{progress}"
    );
    assert_eq!(progress["progressText"], "hello");
    let cancelled = node("cancel", "long").await;
    assert_eq!(cancelled["aborted"], "McpError");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let last = runs(&r, "long")
            .await
            .first()
            .cloned()
            .unwrap_or(Value::Null);
        if last["status"] == "cancelled" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the aborted call's run goes on: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The scenarios of the MCP conformance kit that apply to a server of tools (the others
/// call the kit's own reference tools, resources and prompts, or need logging, sampling or
/// elicitation). The resource, prompt and completion listings check how a server without
/// them answers.
const CONFORMANCE: &[&str] = &[
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
    "completion-complete",
    "resources-list",
    "prompts-list",
];

/// `conformance server --url …/mcp --scenario S` for every applicable scenario: each passes
/// all its checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_conformance_kit_passes() {
    let db = TestDb::sqlite().await;
    let apps = Apps::new().echo("slow", SLOW);
    let r = Replica::spawn(&db, &apps, "a", &[]).await;
    let dir = common::clients::node_project("mcp-conformance");
    let node = dir.join("node_modules/.bin/node");
    let kit = dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let url = r.url("/mcp");
    for scenario in CONFORMANCE {
        let out = tokio::time::timeout(
            Duration::from_secs(120),
            tokio::process::Command::new(&node)
                .arg(&kit)
                .args(["server", "--url", &url, "--scenario", scenario])
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the kit finished")
        .expect("the kit ran");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("Passed: "))
            .unwrap_or_else(|| panic!("{scenario}: no result line:\n{text}"));
        // "Passed: 2/2, 0 failed, 0 warnings"
        let nums: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        assert!(
            nums.len() >= 3 && nums[0] == nums[1] && nums[1] >= 1 && nums[2] == 0,
            "{scenario}: {line}\n{text}"
        );
    }
}

both_backends!(
    the_python_sdk_uses_apps_as_tools,
    the_typescript_sdk_uses_apps_as_tools,
    bad_input_is_refused_and_stores_nothing,
);
