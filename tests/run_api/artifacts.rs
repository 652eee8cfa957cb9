//! Artifacts in runs: an artifact delta gets an event of its own; input blobs become artifacts.

use super::*;
use crate::both_backends;
use agentd::agent::Agent;
use agentd::event::{decode_base64_any, Part};
use base64::Engine;

/// Saves `report.txt`, then says so.
struct Reporter;

#[async_trait]
impl Agent for Reporter {
    fn name(&self) -> &str {
        "reporter"
    }

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        ctx.save_artifact("report.txt", Part::text("quarterly numbers"));
        ctx.emit(
            ctx.new_event()
                .with_content(Content::text("model", "report saved")),
        )
        .await?;
        Ok(())
    }
}

async fn run_sse_splits_an_event_with_content_and_an_artifact_delta(backend: Backend) {
    let mut apps = AppRegistry::default();
    apps.insert("reports", AgentTree::new(Arc::new(Reporter)).unwrap());
    let s = TestServer::start_embedded(backend, apps, PluginSet::default()).await;
    create_session(&s, "reports", "s1").await;
    let msgs = run_sse(&s, run_body("reports", "s1", "go"))
        .await
        .rest()
        .await;

    assert_eq!(msgs.len(), 2, "{msgs:#?}");
    let (first, second) = (&msgs[0].data, &msgs[1].data);
    assert_eq!(first["id"], second["id"], "both halves share the event id");
    assert_eq!(text(first), "report saved");
    assert_eq!(first["actions"]["artifactDelta"], json!({}));
    assert!(second.get("content").is_none(), "{second}");
    assert_eq!(
        second["actions"]["artifactDelta"],
        json!({ "report.txt": 0 })
    );

    let stored = stored_session(&s, "reports", "s1").await;
    let events = stored["events"].as_array().unwrap();
    assert_eq!(
        events.len(),
        2,
        "user event and ONE agent event: {events:#?}"
    );
    assert_eq!(events[1]["id"], first["id"]);
    assert_eq!(text(&events[1]), "report saved");
    assert_eq!(
        events[1]["actions"]["artifactDelta"],
        json!({ "report.txt": 0 })
    );

    let path = format!("{}/artifacts/report.txt", session_path("reports", "s1"));
    let artifact = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(artifact, json!({ "text": "quarterly numbers" }));

    // agentd's /run sends the event whole.
    let msgs = run(&s, run_body("reports", "s1", "again"))
        .await
        .rest()
        .await;
    let events = complete(&msgs);
    assert_eq!(events.len(), 1);
    assert_eq!(text(events[0]), "report saved");
    assert_eq!(
        events[0]["actions"]["artifactDelta"],
        json!({ "report.txt": 1 })
    );
}

async fn input_blobs_are_saved_as_artifacts(backend: Backend) {
    let apps = Apps::new().echo("echo_agent", "chunks: 0");
    let s = apps.serve(backend).await;
    create_session(&s, "echo_agent", "s1").await;
    let bytes = b"\x00\xffblob bytes".to_vec();
    let body = json!({
        "appName": "echo_agent", "userId": USER, "sessionId": "s1",
        "saveInputBlobsAsArtifacts": true,
        "newMessage": { "role": "user", "parts": [
            { "text": "see attached. " },
            { "inlineData": {
                "mimeType": "application/octet-stream",
                "data": base64::engine::general_purpose::URL_SAFE.encode(&bytes),
            } },
        ] },
    });
    let reply = run_sse(&s, body).await.rest().await;
    let reply = complete(&reply)[0];
    let invocation = reply["invocationId"].as_str().unwrap();
    let filename = format!("artifact_{invocation}_1");
    let placeholder = format!("Uploaded file: {filename}. It is saved into artifacts");
    assert_eq!(text(reply), format!("see attached. {placeholder}"));

    let stored = transcript(&s, "echo_agent", "s1").await;
    assert_eq!(
        stored[0]["content"]["parts"],
        json!([{ "text": "see attached. " }, { "text": placeholder }]),
        "the stored user event has the placeholder, not the blob"
    );

    let path = format!("{}/artifacts/{filename}", session_path("echo_agent", "s1"));
    let artifact = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(
        artifact["inlineData"]["mimeType"],
        "application/octet-stream"
    );
    let data = artifact["inlineData"]["data"].as_str().unwrap();
    assert_eq!(decode_base64_any(data).expect("base64"), bytes);
}

/// A message the store refuses is a client error before the stream starts: 413 JSON, nothing
/// stored, and the session is free for the next run at once.
async fn an_oversize_input_blob_is_refused_before_the_stream(backend: Backend) {
    let dir = Apps::new().echo("echo_agent", "chunks: 0");
    let path = dir.path().to_path_buf();
    let s = TestServer::start_with(backend, |args| {
        args.apps_dir = path;
        args.max_artifact_bytes = 16;
    })
    .await;
    create_session(&s, "echo_agent", "s1").await;
    let before = json_with_status(s.get(&session_path("echo_agent", "s1")).await, 200).await;
    let body = json!({
        "appName": "echo_agent", "userId": USER, "sessionId": "s1",
        "saveInputBlobsAsArtifacts": true,
        "newMessage": { "role": "user", "parts": [{ "inlineData": {
            "mimeType": "application/octet-stream",
            "data": base64::engine::general_purpose::URL_SAFE.encode([7u8; 64]),
        } }] },
    });
    let refused = s.post_json("/run_sse", body).await;
    let error = json_with_status(refused, 413).await;
    assert_eq!(error["code"], "artifact_too_large");

    let after = json_with_status(s.get(&session_path("echo_agent", "s1")).await, 200).await;
    assert_eq!(after, before, "the refused run stored nothing");
    let artifacts = json_with_status(
        s.get(&format!("{}/artifacts", session_path("echo_agent", "s1")))
            .await,
        200,
    )
    .await;
    assert_eq!(artifacts, json!([]));

    let reply = run_sse(&s, run_body("echo_agent", "s1", "next"))
        .await
        .rest()
        .await;
    assert_eq!(
        text(complete(&reply)[0]),
        "next",
        "the session is not left busy"
    );
}

both_backends!(
    run_sse_splits_an_event_with_content_and_an_artifact_delta,
    input_blobs_are_saved_as_artifacts,
    an_oversize_input_blob_is_refused_before_the_stream,
);
