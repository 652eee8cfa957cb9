//! Bad requests get JSON errors and change nothing; body limits, unknown routes, request ids, CORS.

use super::*;
use crate::both_backends;

const SMALL_BODY_LIMIT: usize = 4096;

/// Every way a client can get a request to session `s1` wrong.
fn bad_requests() -> Vec<BadRequest> {
    let (get, post, put, patch) = (Method::GET, Method::POST, Method::PUT, Method::PATCH);
    let s1 = &session_path("s1");
    let art = &artifacts_path("s1");
    let memory = "/apps/echo_agent/users/u1/memory";
    let huge = "x".repeat(SMALL_BODY_LIMIT);
    let huge_delta = format!(r#"{{"stateDelta":{{"k":"{huge}"}}}}"#);
    let huge_artifact = format!(r#"{{"filename":"big","artifact":{{"text":"{huge}"}}}}"#);
    let long_id = format!(r#"{{"sessionId":"{}"}}"#, "s".repeat(200));
    let not_utf8 = &b"{\"stateDelta\":{\"k\":\"\xff\xfe\"}}"[..];
    vec![
        bad("malformed JSON", patch.clone(), s1, r#"{"stateDelta":"#).expect(422, "json_invalid"),
        bad("trailing data", patch.clone(), s1, r#"{"stateDelta":{}} x"#)
            .expect(422, "json_invalid"),
        bad("wrong type", patch.clone(), s1, r#"{"stateDelta":"k=v"}"#)
            .expect(422, "validation_error"),
        bad("array body", patch.clone(), s1, "[]").expect(422, "validation_error"),
        bad("invalid UTF-8", patch.clone(), s1, not_utf8).expect(422, "invalid_utf8"),
        bad(
            "text/plain body",
            patch.clone(),
            s1,
            r#"{"stateDelta":{"k":1}}"#,
        )
        .content_type("text/plain")
        .expect(415, "unsupported_content_type"),
        bad(
            "body without a content type",
            patch.clone(),
            s1,
            r#"{"stateDelta":{"k":1}}"#,
        )
        .content_type("")
        .expect(415, "unsupported_content_type"),
        bad(
            "artifact without a content type",
            post.clone(),
            art,
            r#"{"filename":"x.txt","artifact":{"text":"t"}}"#,
        )
        .content_type("")
        .expect(415, "unsupported_content_type"),
        bad("oversize body", patch.clone(), s1, huge_delta).expect(413, "payload_too_large"),
        bad("oversize artifact", post.clone(), art, huge_artifact).expect(413, "payload_too_large"),
        bad("malformed artifact", post.clone(), art, r#"{"filename":"#).expect(422, "json_invalid"),
        bad(
            "artifact types",
            post.clone(),
            art,
            r#"{"filename":5,"artifact":{"text":"t"}}"#,
        )
        .expect(422, "validation_error"),
        bad(
            "duplicate",
            post.clone(),
            SESSIONS,
            r#"{"sessionId":"s1","state":{"k":"x"}}"#,
        )
        .expect(409, "session_exists"),
        bad("legacy duplicate", post.clone(), s1, r#"{"k":"x"}"#).expect(409, "session_exists"),
        bad(
            "create types",
            post.clone(),
            SESSIONS,
            r#"{"sessionId":["s1"]}"#,
        )
        .expect(422, "validation_error"),
        bad("200-char id", post.clone(), SESSIONS, long_id).expect(400, "invalid_id"),
        bad("memory types", patch.clone(), memory, r#"{"sessionId":1}"#)
            .expect(422, "validation_error"),
        bad("bad limit", get.clone(), &format!("{s1}?limit=-1"), "")
            .expect(422, "validation_error"),
        bad("unknown route", get, "/apps/echo_agent/nothing", "").expect(404, "route_not_found"),
        bad("wrong method", put, s1, r#"{"k":"x"}"#).expect(405, "method_not_allowed"),
        bad(
            "undecodable id",
            Method::DELETE,
            &session_path("%FF%FE"),
            "",
        )
        .expect(400, "invalid_path"),
    ]
}

async fn bad_requests_get_json_errors_and_change_nothing(backend: Backend) {
    let s = TestServer::start_with(backend, |a| a.max_body_bytes = SMALL_BODY_LIMIT).await;
    create_session(&s, "s1", json!({"k": "v", "user:lang": "en"})).await;
    patch_state(&s, "s1", json!({"n": 1})).await;
    save_artifact(&s, "s1", "kept.txt", json!({"text": "kept"})).await;
    // The whole database, not one session: a refused request that stored something anywhere
    // (a session under a 200-character id, a memory entry) is caught.
    let before = s.db.snapshot().await;
    assert!(
        before.values().any(|rows| rows.contains("kept")),
        "the snapshot reads rows"
    );
    for case in bad_requests() {
        case.check(&s).await;
        let what = case.what;
        let after = s.db.snapshot().await;
        for (table, rows) in &before {
            assert_eq!(after.get(table), Some(rows), "{what} changed table {table}");
        }
        assert_eq!(after.len(), before.len(), "{what} changed the tables");
    }
}

async fn oversize_bodies_are_refused_with_or_without_content_length(backend: Backend) {
    let s = TestServer::start_with(backend, |a| a.max_body_bytes = SMALL_BODY_LIMIT).await;
    create_session(&s, "s1", json!({})).await;
    let chunks: Vec<Result<&'static [u8], std::io::Error>> = vec![
        Ok(br#"{"stateDelta":{"k":""#),
        Ok(&[b'x'; SMALL_BODY_LIMIT]),
        Ok(br#""}}"#),
    ];
    let chunked = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let resp = s
        .client
        .patch(s.url(&session_path("s1")))
        .header(CONTENT_TYPE, "application/json");
    let resp = resp.body(chunked).send().await.expect("send");
    assert_eq!(error_code(resp, 413).await, "payload_too_large");
    assert_eq!(get_session(&s, "s1").await["events"], json!([]));
}

async fn unknown_routes_and_wrong_methods_answer_like_fastapi(backend: Backend) {
    let s = TestServer::start(backend).await;
    assert_eq!(replay(&s, "089").await["code"], "route_not_found");
    let resp = s.client.put(s.url(SESSIONS)).send().await.unwrap();
    let allow = header(resp.headers(), "allow").map(str::to_string);
    assert_error(resp, 405, "Method Not Allowed", "method_not_allowed").await;
    let allow = allow.expect("405 carries an allow header");
    assert!(
        allow.contains("GET") && allow.contains("POST"),
        "allow: {allow}"
    );
}

async fn every_response_carries_a_request_id(backend: Backend) {
    let s = TestServer::start_with(backend, |a| a.max_body_bytes = SMALL_BODY_LIMIT).await;
    let oversize = json!({"stateDelta": {"k": "x".repeat(SMALL_BODY_LIMIT)}});
    let requests = [
        s.client.get(s.url("/health")),
        s.client.get(s.url("/nothing")),
        s.client.put(s.url(SESSIONS)),
        s.client.patch(s.url(&session_path("s1"))).json(&oversize),
        s.client.get(s.url(&session_path("missing"))),
    ];
    for req in requests {
        let resp = req.send().await.unwrap();
        let id = header(resp.headers(), "x-request-id").unwrap_or("");
        assert!(!id.is_empty(), "{} has no x-request-id", resp.url());
    }
    let resp = s
        .client
        .get(s.url("/health"))
        .header("x-request-id", "trace-42")
        .send()
        .await
        .unwrap();
    assert_eq!(header(resp.headers(), "x-request-id"), Some("trace-42"));
}

async fn cors_is_off_unless_an_origin_is_allowed(backend: Backend) {
    let closed = TestServer::start(backend).await;
    let resp = closed
        .client
        .get(closed.url("/list-apps"))
        .header("origin", "http://ui.example")
        .send()
        .await
        .unwrap();
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    drop(closed);

    let open = TestServer::start_with(backend, |a| {
        a.allow_origins = vec!["http://ui.example".into()]
    })
    .await;
    let preflight = open
        .client
        .request(Method::OPTIONS, open.url(SESSIONS))
        .header("origin", "http://ui.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert!(
        preflight.status().is_success(),
        "preflight: {}",
        preflight.status()
    );
    assert_eq!(
        header(preflight.headers(), "access-control-allow-origin"),
        Some("http://ui.example")
    );
    let allowed = header(preflight.headers(), "access-control-allow-methods").unwrap_or("");
    assert!(allowed.contains("POST"), "allow-methods: {allowed}");

    let get = |origin: &'static str| {
        open.client
            .get(open.url("/list-apps"))
            .header("origin", origin)
            .send()
    };
    let resp = get("http://ui.example").await.unwrap();
    assert_eq!(
        header(resp.headers(), "access-control-allow-origin"),
        Some("http://ui.example")
    );
    let exposed = header(resp.headers(), "access-control-expose-headers").unwrap_or("");
    assert!(
        exposed.contains("x-next-cursor"),
        "expose-headers: {exposed}"
    );
    let resp = get("http://evil.example").await.unwrap();
    assert!(resp.headers().get("access-control-allow-origin").is_none());
}

both_backends!(
    bad_requests_get_json_errors_and_change_nothing,
    oversize_bodies_are_refused_with_or_without_content_length,
    unknown_routes_and_wrong_methods_answer_like_fastapi,
    every_response_carries_a_request_id,
    cors_is_off_unless_an_origin_is_allowed,
);
