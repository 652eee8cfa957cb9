//! The artifact routes match ADK; every version is addressable; bad saves store nothing.

use super::*;
use crate::both_backends;

fn text_blob(text: &str) -> Value {
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD.encode(text);
    json!({ "inlineData": { "mimeType": "text/plain", "data": data } })
}

/// Replays ADK's artifact exchanges in recorded order. `reply.txt`'s three versions were
/// saved by agent runs in the recording; here they are saved through the route first.
async fn artifact_routes_match_adk(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({})).await;
    for text in ["echo: hi there", "echo: second", "echo: third via run"] {
        save_artifact(&s, "s1", "reply.txt", text_blob(text)).await;
    }
    for id in (40..=52).map(|n| format!("{n:03}")) {
        replay(&s, &id).await;
    }
    assert_eq!(replay(&s, "053").await["code"], "artifact_not_found");
    assert_eq!(replay(&s, "054").await["code"], "invalid_version");
    assert_eq!(
        replay(&s, "055").await["code"],
        "artifact_version_not_found"
    );
    for id in ["056", "057"] {
        replay(&s, id).await;
    }
    assert_eq!(replay(&s, "058").await["code"], "validation_error");
    for id in ["059", "060"] {
        replay(&s, id).await;
    }
    // A deliberate difference: ADK saves an artifact to a session that does not exist (061
    // answers 200); agentd refuses, stores nothing (docs/api.md).
    let fx = fixture("061");
    let resp = s
        .client
        .request(fx.method.clone(), s.url(&fx.path))
        .header(CONTENT_TYPE, "application/json")
        .body(fx.body.clone())
        .send()
        .await
        .expect("send");
    assert_error(resp, 404, "Session not found", "session_not_found").await;
    for id in ["062", "063", "064", "065", "114", "115"] {
        replay(&s, id).await;
    }
}

/// An artifact cannot be saved to a session that does not exist, or no longer does: 404
/// `session_not_found`, nothing stored (a session made again under the id has no artifact).
async fn artifacts_of_a_missing_or_deleted_session_are_refused(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({})).await;
    save_artifact(&s, "s1", "kept.txt", json!({"text": "kept"})).await;
    save_artifact(&s, "s1", "user:mine.txt", json!({"text": "mine"})).await;
    let deleted = s.delete(&session_path("s1")).await;
    assert_eq!(deleted.status(), 200);
    for (session, name) in [
        ("s1", "late.txt"),
        ("never", "a.txt"),
        ("never", "user:x.txt"),
    ] {
        let resp = s
            .post_json(
                &artifacts_path(session),
                json!({"filename": name, "artifact": {"text": "x"}}),
            )
            .await;
        assert_error(resp, 404, "Session not found", "session_not_found").await;
    }
    create_session(&s, "s1", json!({})).await;
    assert_eq!(list_artifacts(&s, "s1").await, json!(["user:mine.txt"]));
}

async fn artifact_versions_are_addressable_every_way(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({})).await;
    let base = format!("{}/notes/hello.json", artifacts_path("s1"));
    let v0 = save_artifact(&s, "s1", "notes/hello.json", json!({"text": "zero"})).await;
    assert_eq!(v0["version"], 0);
    assert_eq!(v0["mimeType"], "text/plain");
    assert_eq!(v0["customMetadata"], json!({}));
    let v1 = save_artifact(
        &s,
        "s1",
        "notes/hello.json",
        json!({"inlineData": {"mimeType": "application/octet-stream", "data": "+/+/AA=="}}),
    )
    .await;
    assert_eq!(v1["version"], 1);

    let load = |suffix: &str| get_json(&s, format!("{base}{suffix}"));
    let latest =
        json!({"inlineData": {"mimeType": "application/octet-stream", "data": "-_-_AA=="}});
    assert_eq!(load("").await, latest);
    assert_eq!(load("/versions/latest").await, latest);
    assert_eq!(load("/versions/1").await, latest);
    assert_eq!(load("?version=0").await, json!({"text": "zero"}));
    assert_eq!(load("/versions/0").await, json!({"text": "zero"}));
    assert_eq!(load("/versions").await, json!([0, 1]));
    let metadata = load("/versions/metadata").await;
    assert_eq!(metadata.as_array().map(Vec::len), Some(2));
    assert_same_shape(&metadata[0], &v0, "versions/metadata[0]");
    assert_same_shape(&metadata[1], &v1, "versions/metadata[1]");
    assert_eq!(load("/versions/latest/metadata").await, v1);
    assert_eq!(load("/versions/0/metadata").await, v0);

    let missing = s.get(&format!("{base}/versions/7")).await;
    assert_error(missing, 404, "Artifact not found", "artifact_not_found").await;
    let missing = s.get(&format!("{base}?version=7")).await;
    assert_error(missing, 404, "Artifact not found", "artifact_not_found").await;
    let missing = s.get(&format!("{base}/versions/7/metadata")).await;
    assert_error(
        missing,
        404,
        "Artifact version not found",
        "artifact_version_not_found",
    )
    .await;
    for bad in ["/versions/abc", "/versions/abc/metadata"] {
        let resp = s.get(&format!("{base}{bad}")).await;
        assert_error(resp, 422, "Invalid version ID", "invalid_version").await;
    }
    let bad_query = s.get(&format!("{base}?version=abc")).await;
    assert_validation(bad_query, "validation_error", json!(["query", "version"])).await;

    let deleted = s.delete(&base).await;
    assert_eq!(json_with_status(deleted, 200).await, Value::Null);
    assert_eq!(load("/versions").await, json!([]));
    assert_eq!(list_artifacts(&s, "s1").await, json!([]));
}

async fn bad_artifact_saves_are_rejected_and_store_nothing(backend: Backend) {
    let s = TestServer::start_with(backend, |a| a.max_artifact_bytes = 16).await;
    create_session(&s, "s1", json!({})).await;
    save_artifact(&s, "s1", "kept.txt", json!({"text": "small"})).await;
    let path = artifacts_path("s1");

    let resp = s.post_json(&path, json!({"filename": "x"})).await;
    assert_validation(resp, "validation_error", json!(["body", "artifact"])).await;
    let resp = s
        .post_json(&path, json!({"filename": "x", "artifact": {}}))
        .await;
    assert_eq!(error_code(resp, 400).await, "invalid_artifact");
    let resp = s
        .post_json(&path, json!({"filename": "", "artifact": {"text": "t"}}))
        .await;
    assert_eq!(error_code(resp, 400).await, "invalid_artifact");
    let resp = s
        .post_json(
            &path,
            json!({"filename": "a/versions/1", "artifact": {"text": "t"}}),
        )
        .await;
    assert_eq!(error_code(resp, 400).await, "invalid_artifact");
    let resp = s
        .post_json(
            &path,
            json!({"filename": "big.txt", "artifact": {"text": "x".repeat(17)}}),
        )
        .await;
    assert_eq!(error_code(resp, 413).await, "artifact_too_large");
    let resp = s
        .post_json(
            &path,
            json!({"filename": "bin", "artifact": {"inlineData": {"data": "not base64!"}}}),
        )
        .await;
    assert_validation(
        resp,
        "validation_error",
        json!(["body", "artifact", "inlineData", "data"]),
    )
    .await;

    assert_eq!(list_artifacts(&s, "s1").await, json!(["kept.txt"]));
}

both_backends!(
    artifacts_of_a_missing_or_deleted_session_are_refused,
    artifact_routes_match_adk,
    artifact_versions_are_addressable_every_way,
    bad_artifact_saves_are_rejected_and_store_nothing,
);
