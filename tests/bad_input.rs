//! Input PostgreSQL cannot store (NUL characters, over-long ids) gets the same clear answer
//! on both backends, and nothing is stored: never a 500 on one and a silent write on the other.
//! A body that does not say it is JSON is refused before anything is read from it.

mod common;

use common::{json_with_status, Backend, TestServer};
use serde_json::json;

const USER: &str = "u1";

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

both_backends!(
    nul_characters_and_oversize_ids_are_refused_alike,
    oversize_custom_metadata_is_refused,
    bodies_must_be_labelled_json,
);
