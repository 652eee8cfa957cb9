//! The service routes (health, version, apps, memory) answer as ADK's do.

use super::*;
use crate::both_backends;

/// An apps directory like the one the fixtures were recorded with: `echo_agent` (not an
/// LlmAgent) and `llm_fake` (root agent `weather_agent`). agentd has no `LlmAgent` yet, so
/// `weather_agent` is an `EchoAgent` with the recorded name and description.
fn fixture_apps_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let apps = [
        (
            "echo_agent",
            "name: echo_agent\nagent_class: EchoAgent\n\
             description: Deterministic echo agent (no LLM).\n",
        ),
        (
            "llm_fake",
            "name: weather_agent\nagent_class: EchoAgent\n\
             description: LlmAgent with a scripted fake model.\n",
        ),
    ];
    for (app, yaml) in apps {
        std::fs::create_dir(dir.path().join(app)).expect("app dir");
        std::fs::write(dir.path().join(app).join("root_agent.yaml"), yaml).expect("yaml");
    }
    dir
}

async fn health_and_version_answer(backend: Backend) {
    let s = TestServer::start(backend).await;
    replay(&s, "001").await;
    let version = json_with_status(s.get("/version").await, 200).await;
    let keys: Vec<&String> = version.as_object().unwrap().keys().collect();
    let expected = fixture("002").response;
    assert_eq!(
        keys,
        expected.as_object().unwrap().keys().collect::<Vec<_>>()
    );
    assert_eq!(version["language"], "rust");
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));
}

async fn list_apps_and_app_info_match_adk(backend: Backend) {
    let apps = fixture_apps_dir();
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, |a| a.apps_dir = dir.clone()).await;
    let yaml_language = |v: &mut Value| {
        for app in v["apps"].as_array_mut().into_iter().flatten() {
            app["language"] = json!("yaml");
        }
    };
    replay(&s, "003").await;
    replay_adjusted(&s, "004", yaml_language).await;
    let body = replay(&s, "005").await;
    assert_eq!(body["code"], "not_llm_agent");
    // Fixture 006 (app-info of an LlmAgent) waits for agentd's LlmAgent.
    // ADK names the apps directory's full path in its sentence; agentd names the app relative
    // to it, then, to help, the apps it serves. The directory they come from is shown only
    // without authentication (a developer's own server, as this one is); tests/auth's
    // `internals_are_shown_to_admins_only` checks that a deployed server never shows it.
    let shown = dir.display().to_string();
    let body = replay_adjusted(&s, "007", |v| {
        let detail = v["detail"].as_str().unwrap().replace("<AGENTS_DIR>/", "");
        v["detail"] = json!(format!(
            "{detail} Served apps: echo_agent, llm_fake (from {shown})."
        ));
    })
    .await;
    assert_eq!(body["code"], "app_not_found");

    let plain = json_with_status(
        s.get("/list-apps?detailed=false&relative_path=./").await,
        200,
    )
    .await;
    assert_eq!(plain, json!(["echo_agent", "llm_fake"]));
    let bad = s.get("/list-apps?detailed=maybe").await;
    assert_validation(bad, "validation_error", json!(["query", "detailed"])).await;
}

/// Memory itself is tested in tests/memory.rs; here the exchanges match ADK's.
async fn update_memory_matches_adk(backend: Backend) {
    let s = TestServer::start(backend).await;
    let body = replay(&s, "117").await;
    assert_eq!(body["code"], "session_not_found");
    create_session(&s, "s1", json!({})).await;
    assert_eq!(replay(&s, "116").await, Value::Null);
    let resp = s
        .patch_json("/apps/echo_agent/users/u1/memory", json!({}))
        .await;
    assert_validation(resp, "validation_error", json!(["body", "sessionId"])).await;
}

both_backends!(
    health_and_version_answer,
    list_apps_and_app_info_match_adk,
    update_memory_matches_adk,
);
