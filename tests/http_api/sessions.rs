//! The session routes match ADK: create, list with a cursor, delete, patch, concurrent writes.

use super::*;
use crate::both_backends;

/// Two epoch timestamps naming the same instant: bit-equal floats, as ADK gives them.
fn assert_same_instant(a: &Value, b: &Value) {
    let (x, y) = (
        a.as_f64().expect("a timestamp"),
        b.as_f64().expect("a timestamp"),
    );
    assert_eq!(
        x.to_bits(),
        y.to_bits(),
        "{x} and {y} are different instants"
    );
}

fn ids(sessions: &Value) -> Vec<&str> {
    sessions
        .as_array()
        .expect("a list of sessions")
        .iter()
        .map(|s| s["id"].as_str().expect("session id"))
        .collect()
}

/// Replays ADK's session exchanges in recorded order, so state and listing order match.
async fn session_routes_match_adk(backend: Backend) {
    let s = TestServer::start(backend).await;
    replay(&s, "010").await;
    replay(&s, "011").await;
    let dup = replay(&s, "012").await;
    assert_eq!(
        dup,
        json!({"detail": "Session already exists: s1", "code": "session_exists"})
    );
    replay(&s, "013").await;
    replay(&s, "014").await;
    replay(&s, "015").await;
    let missing = replay(&s, "016").await;
    assert_eq!(
        missing,
        json!({"detail": "Session not found", "code": "session_not_found"})
    );
    replay(&s, "017").await;
    replay(&s, "018").await;
    assert_eq!(replay(&s, "019").await["code"], "session_not_found");
    assert_eq!(replay(&s, "020").await["code"], "validation_error");
    replay(&s, "021").await;

    // Fixture 111's app:/user: state came partly from agent runs that are not replayed.
    let restored = replay_adjusted(&s, "111", |v| {
        v["state"] = json!({"a": 1, "app:theme": "light", "user:lang": "fr"});
    })
    .await;
    assert_eq!(restored["events"][0]["timestamp"], json!(1700000000.5));
    assert_eq!(restored["events"][1]["invocationId"], "e-old");
    assert_same_instant(
        &restored["lastUpdateTime"],
        &restored["events"][1]["timestamp"],
    );
    let stored = get_session(&s, "restored").await;
    assert_same_shape(&stored, &restored, "GET after restore");
    assert_eq!(stored["events"][1]["id"], restored["events"][1]["id"]);
    assert_eq!(replay(&s, "112").await["code"], "invalid_initial_event");
    assert_eq!(replay(&s, "113").await["code"], "options_unsupported");
    for rejected in ["bad_restore", "opt"] {
        assert_eq!(s.get(&session_path(rejected)).await.status(), 404);
    }

    replay(&s, "118").await;
    replay(&s, "119").await;
    replay(&s, "120").await;
    replay(&s, "121").await;
    replay(&s, "122").await;
    replay(&s, "123").await;
}

async fn create_session_by_path_takes_bare_state_or_nothing(backend: Backend) {
    let s = TestServer::start(backend).await;
    let with_state = json_with_status(
        s.post_json(&session_path("legacy"), json!({"a": 1})).await,
        200,
    )
    .await;
    assert_eq!(with_state["id"], "legacy");
    assert_eq!(with_state["state"], json!({"a": 1}));
    let resp = s
        .client
        .post(s.url(&session_path("bare")))
        .send()
        .await
        .unwrap();
    let bare = json_with_status(resp, 200).await;
    assert_eq!(
        (bare["id"].as_str(), &bare["state"], &bare["events"]),
        (Some("bare"), &json!({}), &json!([]))
    );
    let again = s.post_json(&session_path("legacy"), json!({})).await;
    assert_error(
        again,
        409,
        "Session already exists: legacy",
        "session_exists",
    )
    .await;
    let resp = s
        .client
        .post(s.url(&session_path(&"x".repeat(200))))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(resp, 400).await, "invalid_id");
}

async fn create_session_rejects_events_it_cannot_restore(backend: Backend) {
    let s = TestServer::start(backend).await;
    let call = |name: &str| json!({"parts": [{"functionCall": {"name": name, "args": {}}}]});
    let cases = [
        (
            json!({"author": "u", "actions": {"escalate": true}}),
            "event actions",
        ),
        (
            json!({"author": "u", "longRunningToolIds": ["t1"]}),
            "long running tool ids",
        ),
        (
            json!({"author": "a", "content": call("transfer_to_agent")}),
            "internal function",
        ),
        (json!({"author": "a", "partial": true}), "cannot be partial"),
    ];
    for (event, why) in cases {
        let ok = json!({"author": "user", "content": {"parts": [{"text": "fine"}]}});
        let body = json!({"sessionId": "r", "events": [ok, event]});
        let err = json_with_status(s.post_json(SESSIONS, body).await, 400).await;
        assert_eq!(err["code"], "invalid_initial_event", "{err}");
        let detail = err["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("Session initialization event 1 cannot"),
            "{detail}"
        );
        assert!(detail.contains(why), "{detail}");
    }
    assert_eq!(s.get(&session_path("r")).await.status(), 404);
    // A call to an ordinary tool restores fine, snake_case fields included.
    let event = json!({"author": "a", "invocation_id": "e-1", "content": call("get_weather")});
    let body = json!({"session_id": "r", "events": [event]});
    let restored = json_with_status(s.post_json(SESSIONS, body).await, 200).await;
    assert_eq!(restored["events"][0]["invocationId"], "e-1");
    assert_eq!(restored["events"][0]["nodeInfo"], json!({"path": ""}));
}

async fn invalid_session_ids_are_rejected(backend: Backend) {
    let s = TestServer::start(backend).await;
    for bad in [
        "x".repeat(200),
        String::new(),
        "a/b".into(),
        "tab\there".into(),
    ] {
        let resp = s.post_json(SESSIONS, json!({ "sessionId": bad })).await;
        assert_eq!(error_code(resp, 400).await, "invalid_id", "{bad:?}");
    }
    let long_app = format!("/apps/{}/users/u1/sessions", "a".repeat(200));
    let resp = s.client.post(s.url(&long_app)).send().await.unwrap();
    assert_eq!(error_code(resp, 400).await, "invalid_id");
    let undecodable = s.get(&session_path("%FF")).await;
    assert_eq!(error_code(undecodable, 400).await, "invalid_path");
    assert_eq!(
        json_with_status(s.get(SESSIONS).await, 200).await,
        json!([])
    );
}

async fn list_sessions_merges_shared_state_in_adk_order(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "b", json!({"k": "b"})).await;
    create_session(&s, "a", json!({"app:theme": "dark"})).await;
    create_session(&s, "c", json!({"user:lang": "en"})).await;
    let list = json_with_status(s.get(SESSIONS).await, 200).await;
    assert_eq!(ids(&list), ["b", "a", "c"], "oldest update first");
    for session in list.as_array().unwrap() {
        assert_eq!(session["events"], json!([]));
        assert_eq!(session["state"]["app:theme"], "dark");
        assert_eq!(session["state"]["user:lang"], "en");
    }
    assert_eq!(list[0]["state"]["k"], "b");
    // A PATCH moves a session to the end.
    patch_state(&s, "b", json!({"k": "b2"})).await;
    let list = json_with_status(s.get(SESSIONS).await, 200).await;
    assert_eq!(ids(&list), ["a", "c", "b"]);

    // Another user shares app: state, not user: state.
    let other = "/apps/echo_agent/users/u2/sessions";
    json_with_status(s.post_json(other, json!({"sessionId": "o"})).await, 200).await;
    let theirs = json_with_status(s.get(other).await, 200).await;
    assert_eq!(theirs[0]["state"], json!({"app:theme": "dark"}));
}

async fn list_sessions_paginates_with_a_cursor(backend: Backend) {
    let s = TestServer::start(backend).await;
    for i in 0..5 {
        create_session(&s, &format!("s{i}"), json!({})).await;
    }
    let all = json_with_status(s.get(SESSIONS).await, 200).await;
    let mut seen = Vec::new();
    let mut path = format!("{SESSIONS}?limit=2");
    loop {
        let resp = s.get(&path).await;
        let next = header(resp.headers(), "x-next-cursor").map(str::to_string);
        let page = json_with_status(resp, 200).await;
        assert!(page.as_array().unwrap().len() <= 2);
        seen.extend(ids(&page).into_iter().map(str::to_string));
        match next {
            Some(cursor) => path = format!("{SESSIONS}?limit=2&cursor={cursor}"),
            None => break,
        }
        assert!(seen.len() <= 5, "pagination does not end: {seen:?}");
    }
    assert_eq!(seen, ids(&all), "every session exactly once, in ADK order");

    let first = s.get(&format!("{SESSIONS}?limit=2")).await;
    let link = header(first.headers(), "link")
        .expect("Link header")
        .to_string();
    assert!(link.ends_with("; rel=\"next\""), "{link}");
    let full_page = s.get(&format!("{SESSIONS}?limit=5")).await;
    assert!(full_page.headers().get("x-next-cursor").is_none());

    let bad = s.get(&format!("{SESSIONS}?cursor=not-a-cursor")).await;
    assert_validation(bad, "validation_error", json!(["query", "cursor"])).await;
    let zero = s.get(&format!("{SESSIONS}?limit=0")).await;
    assert_validation(zero, "validation_error", json!(["query", "limit"])).await;
}

async fn delete_session_removes_it_and_its_artifacts_but_not_user_artifacts(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({"k": 1})).await;
    create_session(&s, "s2", json!({})).await;
    save_artifact(&s, "s1", "mine.txt", json!({"text": "session scoped"})).await;
    save_artifact(&s, "s1", "user:profile.txt", json!({"text": "user scoped"})).await;
    save_artifact(&s, "s2", "other.txt", json!({"text": "another session"})).await;

    let resp = s.delete(&session_path("s1")).await;
    assert_eq!(json_with_status(resp, 200).await, Value::Null);
    assert_error(
        s.get(&session_path("s1")).await,
        404,
        "Session not found",
        "session_not_found",
    )
    .await;
    assert_eq!(list_artifacts(&s, "s1").await, json!(["user:profile.txt"]));
    let missing = s.get(&format!("{}/mine.txt", artifacts_path("s1"))).await;
    assert_error(missing, 404, "Artifact not found", "artifact_not_found").await;
    assert_eq!(
        list_artifacts(&s, "s2").await,
        json!(["other.txt", "user:profile.txt"])
    );
    assert_eq!(
        ids(&json_with_status(s.get(SESSIONS).await, 200).await),
        ["s2"]
    );

    let again = s.delete(&session_path("s1")).await;
    assert_eq!(json_with_status(again, 200).await, Value::Null);
}

async fn patch_session_appends_a_synthetic_user_event(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({"k": "v"})).await;
    let patched = patch_state(&s, "s1", json!({"k": "v2", "temp:x": 1, "user:lang": "fr"})).await;
    assert_eq!(
        patched["state"],
        json!({"k": "v2", "temp:x": 1, "user:lang": "fr"})
    );
    let event = &patched["events"][0];
    assert_eq!(event["author"], "user");
    assert!(
        event["invocationId"].as_str().unwrap().starts_with("p-"),
        "{event}"
    );
    assert_eq!(
        event["actions"]["stateDelta"],
        json!({"k": "v2", "user:lang": "fr"})
    );
    assert_eq!(event["nodeInfo"], json!({"path": ""}));
    assert_same_instant(&patched["lastUpdateTime"], &event["timestamp"]);

    let after = get_session(&s, "s1").await;
    assert_eq!(
        after["state"],
        json!({"k": "v2", "user:lang": "fr"}),
        "temp: keys are not stored"
    );
    assert_eq!(after["events"], patched["events"]);

    let resp = s
        .patch_json(&session_path("nope"), json!({"stateDelta": {"k": 1}}))
        .await;
    assert_error(resp, 404, "Session not found", "session_not_found").await;
    let resp = s
        .patch_json(&session_path("s1"), json!({"state": {"k": 1}}))
        .await;
    let body = assert_validation(resp, "validation_error", json!(["body", "stateDelta"])).await;
    assert_eq!(body["detail"][0]["type"], "missing");
    assert_eq!(get_session(&s, "s1").await, after);
}

async fn concurrent_writes_to_one_session_never_fail_with_500(backend: Backend) {
    let s = TestServer::start(backend).await;
    let creates = (0..8).map(|_| s.post_json(SESSIONS, json!({"sessionId": "s1"})));
    let statuses: Vec<u16> = futures::future::join_all(creates)
        .await
        .iter()
        .map(|r| r.status().as_u16())
        .collect();
    assert_eq!(
        statuses.iter().filter(|&&c| c == 200).count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|&c| c == 200 || c == 409),
        "{statuses:?}"
    );

    let path = session_path("s1");
    let patches = (0..8).map(|n| s.patch_json(&path, json!({"stateDelta": {"n": n}})));
    let mut applied = 0;
    for resp in futures::future::join_all(patches).await {
        match resp.status().as_u16() {
            200 => applied += 1,
            // A lost optimistic-concurrency race is the client's to retry, never a 500.
            409 => assert_eq!(error_code(resp, 409).await, "write_conflict"),
            other => panic!(
                "concurrent PATCH answered {other}: {}",
                resp.text().await.unwrap()
            ),
        }
    }
    let session = get_session(&s, "s1").await;
    assert_eq!(session["events"].as_array().unwrap().len(), applied);
    assert!(applied >= 1);
}

both_backends!(
    session_routes_match_adk,
    create_session_by_path_takes_bare_state_or_nothing,
    create_session_rejects_events_it_cannot_restore,
    invalid_session_ids_are_rejected,
    list_sessions_merges_shared_state_in_adk_order,
    list_sessions_paginates_with_a_cursor,
    delete_session_removes_it_and_its_artifacts_but_not_user_artifacts,
    patch_session_appends_a_synthetic_user_event,
    concurrent_writes_to_one_session_never_fail_with_500,
);
