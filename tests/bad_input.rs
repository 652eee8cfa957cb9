//! Input PostgreSQL cannot store (NUL characters, over-long ids) gets the same clear answer
//! on both backends, and nothing is stored: never a 500 on one and a silent write on the other.
//! A body that does not say it is JSON is refused before anything is read from it.

mod common;

use common::{json_with_status, Backend, TestServer};
use serde_json::json;

const USER: &str = "u1";

/// POSTs `body` to any intake (ADK routes, A2A, AI SDK, AG-UI, OpenAI, MCP) as the user, with
/// the `Accept` MCP needs: the status and the body as text.
async fn post_to_intake(s: &TestServer, path: &str, body: &serde_json::Value) -> (u16, String) {
    let resp = s
        .client
        .post(s.url(path))
        .header("x-agentd-user-id", USER)
        .header("accept", "application/json, text/event-stream")
        .json(body)
        .send()
        .await
        .expect("POST");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

async fn nul_characters_and_oversize_ids_are_refused_alike(backend: Backend) {
    let s = TestServer::start(backend).await;
    let base = format!("/apps/echo/users/{USER}/sessions");

    // A NUL in state: 422 naming the field; no session.
    let r = s
        .post_json(
            &base,
            json!({"sessionId": "s1", "state": {"note": "a\u{0}b"}}),
        )
        .await;
    let body = json_with_status(r, 422).await;
    assert_eq!(body["code"], "nul_character");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "state", "note"]));
    assert_eq!(s.get(&format!("{base}/s1")).await.status(), 404);

    // In a message, in a key, in PATCH: the same.
    json_with_status(s.post_json(&base, json!({"sessionId": "s1"})).await, 200).await;
    let run = json!({"appName": "echo", "userId": USER, "sessionId": "s1",
        "newMessage": {"role": "user", "parts": [{"text": "x\u{0}"}]}});
    let body = json_with_status(s.post_json("/run", run).await, 422).await;
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "newMessage", "parts", 0, "text"])
    );
    let patch = json!({"stateDelta": {"k\u{0}": 1}});
    let body = json_with_status(s.patch_json(&format!("{base}/s1"), patch).await, 422).await;
    assert_eq!(body["code"], "nul_character");
    let events = json_with_status(s.get(&format!("{base}/s1/events")).await, 200).await;
    assert_eq!(events["events"], json!([]), "nothing was stored");

    // Routes that read their own bodies (A2A's two bindings, MCP) refuse it alike: on
    // PostgreSQL they used to pass it on and fail the run with an internal error.
    let a2a_message =
        json!({"messageId": "m-nul", "role": "ROLE_USER", "parts": [{"text": "a\u{0}b"}]});
    for (path, body) in [
        (
            "/a2a/echo",
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                   "params": {"message": a2a_message.clone()}}),
        ),
        ("/a2a/echo/message:send", json!({"message": a2a_message})),
        (
            "/apps/echo/mcp",
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"message": "a\u{0}b"}}}),
        ),
    ] {
        let (status, got) = post_to_intake(&s, path, &body).await;
        assert_eq!(status, 422, "{path}: {got}");
        assert!(got.contains("nul_character"), "{path}: {got}");
    }
    let runs = json_with_status(s.get(&format!("/apps/echo/users/{USER}/runs")).await, 200).await;
    assert_eq!(runs["runs"], json!([]), "no run started");

    // A backslash followed by `u0000` is ordinary text, not a NUL.
    let fine = json!({"sessionId": "s2", "state": {"path": "C:\\u0000"}});
    json_with_status(s.post_json(&base, fine).await, 200).await;

    // NUL or an oversize id in a path, and ids that `/run` would create.
    let r = s.get("/apps/echo/users/u%00x/sessions").await;
    assert_eq!(json_with_status(r, 400).await["code"], "invalid_id");
    let long = "x".repeat(10_000);
    let r = s.get(&format!("/apps/echo/users/{long}/sessions")).await;
    assert_eq!(json_with_status(r, 400).await["code"], "invalid_id");
    for session in [long.as_str(), "", "a/b"] {
        let run = json!({"appName": "echo", "userId": USER, "sessionId": session,
            "createSession": true, "newMessage": {"role": "user", "parts": [{"text": "hi"}]}});
        let body = json_with_status(s.post_json("/run", run).await, 400).await;
        assert_eq!(body["code"], "invalid_id", "{session:?}");
    }
    let list = json_with_status(s.get(&base).await, 200).await;
    assert_eq!(list.as_array().unwrap().len(), 2, "only s1 and s2: {list}");
}

/// `customMetadata` is copied onto every event of a run: over 64 KiB it is refused, and the
/// run does not start.
async fn oversize_custom_metadata_is_refused(backend: Backend) {
    let s = TestServer::start(backend).await;
    let body = json!({"appName": "echo", "userId": USER, "sessionId": "m1", "createSession": true,
        "customMetadata": {"blob": "x".repeat(70 * 1024)},
        "newMessage": {"role": "user", "parts": [{"text": "hi"}]}});
    let b = json_with_status(s.post_json("/run", body).await, 422).await;
    assert_eq!(b["detail"][0]["loc"], json!(["body", "customMetadata"]));
    assert_eq!(
        s.get(&format!("/apps/echo/users/{USER}/sessions/m1"))
            .await
            .status(),
        404,
        "nothing was created"
    );
}

/// A body with content must be labelled JSON: `text/plain`, a form type or no `Content-Type`
/// at all is what a page on another site may send without a CORS preflight. Each is 415
/// `unsupported_content_type` on every body route, and nothing is stored; an empty body
/// still needs no type (create-session with no state, a cancel without a reason).
async fn bodies_must_be_labelled_json(backend: Backend) {
    let s = TestServer::start(backend).await;
    let base = format!("/apps/echo/users/{USER}/sessions");
    json_with_status(s.post_json(&base, json!({"sessionId": "s1"})).await, 200).await;
    let create = json!({"sessionId": "c1", "state": {"k": "v"}}).to_string();
    let run = json!({"appName": "echo", "userId": USER, "sessionId": "r1", "createSession": true,
        "newMessage": {"role": "user", "parts": [{"text": "hi"}]}})
    .to_string();
    let patch = json!({"stateDelta": {"k": 1}}).to_string();
    let s1 = format!("{base}/s1");
    let requests = [
        (reqwest::Method::POST, base.as_str(), &create),
        (reqwest::Method::POST, "/run", &run),
        (reqwest::Method::POST, "/run_sse", &run),
        (reqwest::Method::PATCH, s1.as_str(), &patch),
    ];
    let types = [
        None,
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
    ];
    for content_type in types {
        for (method, path, body) in &requests {
            let mut req = s.client.request(method.clone(), s.url(path));
            if let Some(ct) = content_type {
                req = req.header("content-type", ct);
            }
            let resp = req.body((*body).clone()).send().await.unwrap();
            let b = json_with_status(resp, 415).await;
            assert_eq!(
                b["code"], "unsupported_content_type",
                "{method} {path} with {content_type:?}"
            );
        }
    }
    for id in ["c1", "r1"] {
        assert_eq!(
            s.get(&format!("{base}/{id}")).await.status(),
            404,
            "{id} was not created"
        );
    }
    let s1_now = json_with_status(s.get(&s1).await, 200).await;
    assert_eq!(s1_now["events"], json!([]), "no PATCH reached s1");
    assert_eq!(s1_now["state"], json!({}), "no PATCH reached s1");

    // An empty body carries nothing to label.
    let resp = s.client.post(s.url(&format!("{base}/e1"))).send().await;
    json_with_status(resp.unwrap(), 200).await;
    let resp = s
        .client
        .post(s.url("/runs/no-such-run/cancel"))
        .send()
        .await;
    let b = json_with_status(resp.unwrap(), 404).await;
    assert_eq!(
        b["code"], "run_not_found",
        "the empty body was read, not refused"
    );
    // A JSON type with parameters, or a `+json` type, is JSON.
    let resp = s
        .client
        .patch(s.url(&s1))
        .header(
            "content-type",
            "application/merge-patch+json; charset=utf-8",
        )
        .body(patch.clone())
        .send()
        .await
        .unwrap();
    json_with_status(resp, 200).await;
}

/// Every intake bounds the parts of a message (422 `too_many_parts`, in its protocol's
/// shape) and the JSON values of a body (413 `body_too_complex`, before it is parsed), and
/// stores nothing for either: no session, no event, no run. A message at the limit runs.
async fn parts_and_values_are_bounded_on_every_intake(backend: Backend) {
    let s = TestServer::start_with(backend, |a| {
        a.max_message_parts = 3;
        a.max_json_values = 400;
    })
    .await;
    let base = format!("/apps/echo/users/{USER}/sessions");
    json_with_status(s.post_json(&base, json!({"sessionId": "s1"})).await, 200).await;
    let text =
        |n: usize| -> Vec<serde_json::Value> { (0..n).map(|_| json!({"text": "a"})).collect() };
    let typed = |n: usize, kind: &str| -> Vec<serde_json::Value> {
        (0..n).map(|_| json!({"type": kind, "text": "a"})).collect()
    };
    // Each intake with a message of `n` parts: (path, body, JSON-RPC binding).
    let intakes = |n: usize| {
        vec![
            (
                "/run".to_string(),
                json!({"appName": "echo", "userId": USER, "sessionId": "s1",
                "newMessage": {"role": "user", "parts": text(n)}}),
                false,
            ),
            (
                "/run_sse".to_string(),
                json!({"appName": "echo", "userId": USER, "sessionId": "s1",
                "newMessage": {"role": "user", "parts": text(n)}}),
                false,
            ),
            (
                format!("{base}/s1/runs"),
                json!({"newMessage": {"role": "user", "parts": text(n)}}),
                false,
            ),
            (
                "/a2a/echo".to_string(),
                json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": text(n)}}}),
                true,
            ),
            (
                "/a2a/echo/message:send".to_string(),
                json!({"message": {"messageId": "m2",
                "role": "ROLE_USER", "parts": text(n)}}),
                false,
            ),
            (
                "/apps/echo/chat".to_string(),
                json!({"id": "c1", "messages": [{"id": "m3",
                "role": "user", "parts": typed(n, "text")}]}),
                false,
            ),
        ]
    };
    for (path, body, rpc) in intakes(4) {
        let resp = s
            .client
            .post(s.url(&path))
            .header("x-agentd-user-id", USER)
            .json(&body)
            .send()
            .await
            .expect("POST");
        let status = resp.status().as_u16();
        let got = resp.text().await.unwrap_or_default();
        assert_eq!(status, if rpc { 200 } else { 422 }, "{path}: {got}");
        assert!(got.contains("too_many_parts"), "{path}: {got}");
    }
    // A schedule's message, and imported events, are bounded the same way.
    let schedule = json!({"cron": "0 9 * * *", "message": {"parts": text(4)}});
    let got = json_with_status(
        s.post_json(&format!("/apps/echo/users/{USER}/schedules"), schedule)
            .await,
        422,
    )
    .await;
    assert_eq!(got["code"], "too_many_parts", "{got}");
    let import = json!({"sessionId": "s2", "events": [{"author": "user",
        "content": {"role": "user", "parts": text(4)}}]});
    let got = json_with_status(s.post_json(&base, import).await, 422).await;
    assert_eq!(got["code"], "too_many_parts", "{got}");
    assert_eq!(s.get(&format!("{base}/s2")).await.status(), 404);

    // 400 values: refused before parsing, whatever the route makes of them.
    let many: Vec<serde_json::Value> = (0..500).map(|i| json!(i)).collect();
    let mut bodies = intakes(1);
    // AG-UI and OpenAI join a message's text into one part: only their values can grow.
    bodies.push((
        "/apps/echo/ag-ui".to_string(),
        json!({"threadId": "t1", "runId": "r1",
        "messages": [{"id": "m4", "role": "user", "content": typed(1, "text")}]}),
        false,
    ));
    bodies.push((
        "/v1/chat/completions".to_string(),
        json!({"model": "echo", "user": USER,
        "messages": [{"role": "user", "content": typed(1, "text")}]}),
        false,
    ));
    bodies.push((
        "/v1/responses".to_string(),
        json!({"model": "echo", "user": USER,
        "input": [{"role": "user", "content": typed(1, "input_text")}]}),
        false,
    ));
    bodies.push((
        "/mcp".to_string(),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"prompt": "x", "filler": many.clone()}}}),
        false,
    ));
    for (path, mut body, _) in bodies {
        body["filler"] = json!(many);
        let (status, got) = post_to_intake(&s, &path, &body).await;
        assert_eq!(status, 413, "{path}: {got}");
        assert!(got.contains("body_too_complex"), "{path}: {got}");
    }

    let events = json_with_status(s.get(&format!("{base}/s1/events")).await, 200).await;
    assert_eq!(events["events"], json!([]), "nothing stored");
    let runs = json_with_status(s.get(&format!("/apps/echo/users/{USER}/runs")).await, 200).await;
    assert_eq!(runs["runs"], json!([]), "no run started");
    let sessions = json_with_status(s.get(&base).await, 200).await;
    let ids: Vec<&str> = sessions
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x["id"].as_str())
        .collect();
    assert_eq!(ids, vec!["s1"], "no session made by a refused request");

    // At the limit, a message runs.
    let run = json!({"appName": "echo", "userId": USER, "sessionId": "s1",
        "newMessage": {"role": "user", "parts": text(3)}});
    let resp = s.post_json("/run", run).await;
    assert_eq!(resp.status(), 200);
    let streamed = resp.text().await.expect("body");
    assert!(
        streamed.contains("echo_agent") && !streamed.contains("error"),
        "{streamed}"
    );
}

both_backends!(
    nul_characters_and_oversize_ids_are_refused_alike,
    oversize_custom_metadata_is_refused,
    bodies_must_be_labelled_json,
    parts_and_values_are_bounded_on_every_intake,
);
