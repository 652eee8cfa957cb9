//! The frontends with API keys: the key decides the user.

use super::*;
use crate::both_backends;

async fn stored_key(s: &TestServer, user: &str, apps: Option<&[&str]>) -> String {
    let k = agentd::auth::keys::generate(
        agentd::auth::keys::KeySpec {
            user_id: user.into(),
            apps: apps.map(|a| a.iter().map(|s| s.to_string()).collect()),
            admin: false,
            name: None,
            expires_at: None,
        },
        agentd::event::now_ts(),
    )
    .expect("key");
    s.db.store()
        .await
        .insert_api_key(&k.record)
        .await
        .expect("stored");
    k.plaintext
}

/// With API keys the key decides the user: a header naming another user is ignored, another
/// user's response is not found, an app outside the key's list does not exist.
async fn frontends_with_api_keys(backend: Backend) {
    let m = ScriptedModel::start().await;
    let agent = LlmAgent::new("assistant", m.model("keyed")).instruction("Help.");
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        APP,
        agentd::agent::AgentTree::new(std::sync::Arc::new(agent)).expect("tree"),
    );
    let s = TestServer::start_embedded_with(backend, apps, PluginSet::default(), |a| {
        a.security.auth = vec![agentd::config::AuthMode::ApiKey];
    })
    .await;
    let k1 = stored_key(&s, USER, None).await;
    let k2 = stored_key(&s, "u2", None).await;
    let other_app = stored_key(&s, USER, Some(&["elsewhere"])).await;

    // The Python SDK with a key.
    m.push("keyed", Reply::text(&["Hi"]));
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients/python/openai_client.py");
    let out = clients::run_driver(
        &clients::python(),
        &[script.to_str().unwrap(), "responses"],
        &[
            ("AGENTD_URL", &s.base),
            ("AGENTD_APP", APP),
            ("AGENTD_USER", "someone-else"),
            ("AGENTD_API_KEY", &k1),
        ],
    )
    .await;
    assert!(out.get("error").is_none(), "{out}");
    assert_eq!(out["output_text"], "Hi");
    let id = out["id"].as_str().unwrap().to_string();
    let get = |key: String, path: String| {
        let c = s.client.clone();
        let url = s.url(&path);
        async move { c.get(url).bearer_auth(key).send().await.expect("GET") }
    };
    let r = json_with_status(get(k1.clone(), format!("/v1/responses/{id}")).await, 200).await;
    assert_eq!(r["status"], "completed");
    assert_eq!(
        get(k2.clone(), format!("/v1/responses/{id}"))
            .await
            .status(),
        404
    );
    // The conversation is u1's (the body's `user` did not change that).
    let run = json_with_status(
        get(
            k1.clone(),
            format!("/runs/{}", id.trim_start_matches("resp_")),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(run["userId"], USER, "{run}");

    let chat = |key: Option<&str>, user_header: Option<&str>| {
        let mut r = s.client.post(s.url(&format!("/apps/{APP}/chat"))).json(&json!({
            "id": "c1", "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
            "trigger": "submit-message"}));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        if let Some(u) = user_header {
            r = r.header("x-agentd-user-id", u);
        }
        r.send()
    };
    assert_eq!(chat(None, Some(USER)).await.expect("POST").status(), 401);
    assert_eq!(
        chat(Some(&other_app), None).await.expect("POST").status(),
        404
    );
    // A key naming another user is refused (only admin keys act for others).
    let r = chat(Some(&k2), Some(USER)).await.expect("POST");
    assert_eq!(json_with_status(r, 403).await["code"], "user_forbidden");
    m.push("keyed", Reply::text(&["Yes"]));
    let r = chat(Some(&k2), None).await.expect("POST");
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap_or_default().contains("Yes"));
    // The chat landed in u2's sessions, not in u1's.
    assert_eq!(
        get(k2.clone(), format!("/apps/{APP}/users/u2/sessions/c1"))
            .await
            .status(),
        200
    );
    assert_eq!(
        get(k1.clone(), format!("/apps/{APP}/users/{USER}/sessions/c1"))
            .await
            .status(),
        404
    );
    let models = json_with_status(get(other_app.clone(), "/v1/models".into()).await, 200).await;
    assert_eq!(
        models["data"],
        json!([]),
        "an app outside the key's list is not listed"
    );
}

both_backends!(frontends_with_api_keys);
