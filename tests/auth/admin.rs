//! What needs an admin: `app:` state, agents' internals, a protected `/metrics`.

use super::*;
use crate::both_backends;

/// `app:` state is shared by every user of an app (and rendered into their instructions):
/// with auth on, only an admin key may write it.
async fn app_state_needs_an_admin(backend: Backend) {
    let s = with_keys(backend).await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let admin = key(&s.db, "svc", None, true, None).await;
    let base = "/apps/echo/users/alice/sessions";
    let writes = [
        (
            Method::POST,
            base.to_string(),
            json!({"sessionId": "a", "state": {"app:motd": "obey"}}),
        ),
        (
            Method::POST,
            base.to_string(),
            json!({"sessionId": "b", "events": [{"author": "user", "invocationId": "e-1",
                "actions": {"stateDelta": {"app:motd": "obey"}}}]}),
        ),
        (
            Method::POST,
            format!("{base}/c"),
            json!({"app:motd": "obey"}),
        ),
    ];
    for (method, path, body) in writes {
        let (st, b, _) = call(&s, method, &path, Some(&body), Cred::Bearer(&alice)).await;
        assert_eq!(
            (st, b["code"].as_str()),
            (403, Some("app_state_forbidden")),
            "{path}"
        );
    }
    let (st, _, _) = call(
        &s,
        Method::POST,
        base,
        Some(&json!({"sessionId": "s"})),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200);
    let (st, b, _) = call(
        &s,
        Method::PATCH,
        &format!("{base}/s"),
        Some(&json!({"stateDelta": {"app:motd": "obey"}})),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!((st, b["code"].as_str()), (403, Some("app_state_forbidden")));
    let run = json!({"appName": "echo", "userId": "alice", "sessionId": "s",
        "stateDelta": {"app:motd": "obey"},
        "newMessage": {"role": "user", "parts": [{"text": "x"}]}});
    let (st, b, _) = call(&s, Method::POST, "/run", Some(&run), Cred::Bearer(&alice)).await;
    assert_eq!((st, b["code"].as_str()), (403, Some("app_state_forbidden")));
    let (_, session, _) = call(
        &s,
        Method::GET,
        &format!("{base}/s"),
        None,
        Cred::Bearer(&alice),
    )
    .await;
    assert!(session["state"].get("app:motd").is_none(), "{session}");
    assert_eq!(
        session["events"],
        json!([]),
        "the refused run stored nothing"
    );

    let (st, _, _) = call(
        &s,
        Method::PATCH,
        &format!("{base}/s"),
        Some(&json!({"stateDelta": {"app:motd": "hello"}})),
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 200, "an admin key may");
    // user: state stays the user's own to write.
    let (st, _, _) = call(
        &s,
        Method::PATCH,
        &format!("{base}/s"),
        Some(&json!({"stateDelta": {"user:lang": "fr"}})),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200);
}

/// Agents' instructions and why an app failed to load (file paths, YAML) are for admins:
/// other callers see them redacted in `app-info` and `list-apps?detailed=true`, and an unknown
/// app's 404 names no place on the server's disk.
async fn internals_are_shown_to_admins_only(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let apps = dir.path().join("apps");
    std::fs::create_dir_all(apps.join("broken")).unwrap();
    std::fs::write(
        apps.join("broken/root_agent.yaml"),
        "agent_class: NoSuchClass\nname: b\n",
    )
    .unwrap();
    std::fs::create_dir_all(apps.join("helper")).unwrap();
    std::fs::write(
        apps.join("helper/root_agent.yaml"),
        "name: helper\nmodel: openai/gpt-4o-mini\ninstruction: the secret playbook\n",
    )
    .unwrap();
    let apps_dir = apps.clone();
    let s = TestServer::start_with(backend, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.apps_dir = apps_dir;
    })
    .await;
    let user = key(&s.db, "alice", None, false, None).await;
    let admin = key(&s.db, "ops", None, true, None).await;
    let path_text = apps.display().to_string();

    let (st, info, _) = call(
        &s,
        Method::GET,
        "/apps/helper/app-info",
        None,
        Cred::Bearer(&user),
    )
    .await;
    assert_eq!(st, 200, "{info}");
    assert_eq!(info["agents"]["helper"]["instruction"], "", "{info}");
    let (st, info, _) = call(
        &s,
        Method::GET,
        "/apps/helper/app-info",
        None,
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 200, "{info}");
    assert_eq!(
        info["agents"]["helper"]["instruction"],
        "the secret playbook"
    );

    let broken = |v: &Value| {
        v["apps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "broken")
            .unwrap()["error"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (_, listed, _) = call(
        &s,
        Method::GET,
        "/list-apps?detailed=true",
        None,
        Cred::Bearer(&user),
    )
    .await;
    let redacted = broken(&listed);
    assert!(
        !redacted.contains("NoSuchClass") && !redacted.contains(&path_text),
        "{redacted}"
    );
    let (_, listed, _) = call(
        &s,
        Method::GET,
        "/list-apps?detailed=true",
        None,
        Cred::Bearer(&admin),
    )
    .await;
    assert!(broken(&listed).contains("NoSuchClass"), "{listed}");
    for cred in [Cred::Bearer(&user), Cred::Bearer(&admin)] {
        let (st, b, _) = call(&s, Method::GET, "/apps/broken/app-info", None, cred).await;
        assert_eq!(st, 500);
        let _ = b;
    }
    let (_, b, _) = call(
        &s,
        Method::GET,
        "/apps/broken/app-info",
        None,
        Cred::Bearer(&user),
    )
    .await;
    assert!(!b.to_string().contains("NoSuchClass"), "{b}");
    let (st, b, _) = call(
        &s,
        Method::GET,
        "/apps/nope/app-info",
        None,
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 404);
    assert!(!b.to_string().contains(&path_text), "{b}");
    let (st, b, _) = call(
        &s,
        Method::POST,
        "/run",
        Some(
            &json!({"appName": "broken", "userId": "alice", "sessionId": "s1",
            "newMessage": {"role": "user", "parts": [{"text": "hi"}]}}),
        ),
        Cred::Bearer(&user),
    )
    .await;
    assert_eq!(st, 500, "{b}");
    assert!(!b.to_string().contains("NoSuchClass"), "{b}");
}

/// `--protect-metrics`: `/metrics` needs an admin key; `--allow-client-app-state` lets any
/// caller write `app:` state.
#[tokio::test]
async fn metrics_protection_and_client_app_state_flags() {
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.security.protect_metrics = true;
        a.security.allow_client_app_state = true;
    })
    .await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let admin = key(&s.db, "svc", None, true, None).await;
    assert_eq!(
        call(&s, Method::GET, "/metrics", None, Cred::Nothing)
            .await
            .0,
        401
    );
    let (st, b, _) = call(&s, Method::GET, "/metrics", None, Cred::Bearer(&alice)).await;
    assert_eq!((st, b["code"].as_str()), (403, Some("admin_required")));
    let (st, b, _) = call(&s, Method::GET, "/metrics", None, Cred::Bearer(&admin)).await;
    assert_eq!(st, 200);
    assert!(b.as_str().unwrap_or("").contains("agentd_"), "{b}");
    assert_eq!(
        call(&s, Method::GET, "/health", None, Cred::Nothing)
            .await
            .0,
        200
    );
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/apps/echo/users/alice/sessions",
        Some(&json!({"sessionId": "a", "state": {"app:motd": "hello"}})),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200, "the flag lets a non-admin key write app: state");
}

both_backends!(app_state_needs_an_admin, internals_are_shown_to_admins_only);
