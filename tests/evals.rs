//! Eval sets in the database (docs/evals.md), on SQLite, PostgreSQL and Citus, over real
//! HTTP, checked against google-adk 2.13 itself (tests/clients/adk/eval_parity.py): a file
//! ADK wrote comes back byte for byte, a case made from a session is the case ADK makes
//! from it (its file bytes and its wire form), ADK's web UI's dev-server paths answer as
//! ADK's do, and bad input loses nothing.

mod common;

use agentd::auth::keys::{generate, KeySpec};
use agentd::config::AuthMode;
use common::clients::{adk_python, run_driver};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};

const PARITY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/adk/eval_parity.py"
);

async fn server(backend: Backend) -> TestServer {
    TestServer::start_with(backend, |a| {
        a.apps_dir =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/evals/apps")
    })
    .await
}

async fn put_text(s: &TestServer, path: &str, body: &str) -> reqwest::Response {
    s.client
        .put(s.url(path))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("PUT")
}

async fn text_with_status(resp: reqwest::Response, status: u16) -> String {
    let got = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    assert_eq!(got, status, "unexpected status {got}, body: {text}");
    text
}

/// A file ADK's own writer made is imported and exported unchanged, byte for byte; replacing
/// it is 200, reading it through ADK's dev paths works, and deleting it deletes its cases.
async fn an_adk_file_comes_back_byte_for_byte(backend: Backend) {
    let s = server(backend).await;
    let adk = run_driver(&adk_python(), &[PARITY, "adk_file"], &[]).await;
    let file = adk["file"].as_str().expect("file");
    let created = json_with_status(
        put_text(&s, "/apps/greeter/eval-sets/weather", file).await,
        201,
    )
    .await;
    assert_eq!(created, json!({"evalCaseIds": ["weather_zurich"]}));
    let exported = text_with_status(s.get("/apps/greeter/eval-sets/weather").await, 200).await;
    assert_eq!(exported, file, "the export is not the file ADK wrote");
    json_with_status(
        put_text(&s, "/apps/greeter/eval-sets/weather", file).await,
        200,
    )
    .await;

    let ids = json_with_status(s.get("/dev/apps/greeter/eval-sets").await, 200).await;
    assert_eq!(ids, json!({"evalSetIds": ["weather"]}));
    let legacy = json_with_status(s.get("/dev/apps/greeter/eval_sets").await, 200).await;
    assert_eq!(legacy, json!(["weather"]));
    let case = json_with_status(
        s.get("/dev/apps/greeter/eval_sets/weather/evals/weather_zurich")
            .await,
        200,
    )
    .await;
    // The wire form: camelCase fields, user keys as they are, defaults filled in.
    assert_eq!(
        case["sessionInput"]["state"],
        json!({"z_key": "", "a_key": 2})
    );
    assert_eq!(
        case["conversation"][0]["intermediateData"]["toolUses"][0]["args"],
        json!({"zeta": 1, "alpha": {"z": true, "a": null}})
    );
    assert_eq!(
        case["conversation"][0]["intermediateData"]["toolResponses"],
        json!([])
    );
    assert_eq!(case["finalSessionState"]["last"], "Es sind 21 °C.");

    let gone = s.delete("/apps/greeter/eval-sets/weather").await;
    assert_eq!(gone.status(), 204);
    let missing = json_with_status(s.get("/apps/greeter/eval-sets/weather").await, 404).await;
    assert_eq!(missing["code"], "eval_set_not_found");
    let none = json_with_status(s.get("/dev/apps/greeter/eval_sets").await, 200).await;
    assert_eq!(none, json!([]));

    // The metrics the web UI offers to run a set with: ADK's answer, byte for byte.
    let adk = run_driver(&adk_python(), &[PARITY, "metrics_info"], &[]).await;
    let ours = text_with_status(s.get("/dev/apps/greeter/metrics-info").await, 200).await;
    assert_eq!(ours, adk["wire"].as_str().unwrap());
    let hidden = json_with_status(s.get("/dev/apps/nowhere/metrics-info").await, 404).await;
    assert_eq!(hidden["code"], "app_not_found");
}

/// The web UI's flow (create a set, add the current session) makes the case ADK's own
/// `add_session` makes from the same session: the same file bytes, the same wire form.
async fn a_case_from_a_session_is_the_case_adk_makes(backend: Backend) {
    let s = server(backend).await;
    let events = json!([
        {"id": "ev1", "invocationId": "e-1", "author": "user", "timestamp": 1764669100.25,
         "content": {"role": "user", "parts": [{"text": "What's the weather in Zürich?"}]}},
        {"id": "ev2", "invocationId": "e-1", "author": "greeter", "timestamp": 1764669101.5,
         "content": {"role": "model", "parts": [{"functionCall":
            {"id": "call-1", "name": "get_weather", "args": {"city": "Zürich", "unit": "C"}}}]},
         "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 3, "totalTokenCount": 15},
         "modelVersion": "scripted-1"},
        {"id": "ev3", "invocationId": "e-1", "author": "greeter", "timestamp": 1764669101.75,
         "content": {"role": "user", "parts": [{"functionResponse":
            {"id": "call-1", "name": "get_weather", "response": {"temp_c": 21}}}]}},
        {"id": "ev4", "invocationId": "e-1", "author": "greeter", "timestamp": 1764669102.0,
         "content": {"role": "model", "parts": [{"text": "It is 21 °C in Zürich."}]},
         "groundingMetadata": {"webSearchQueries": ["weather zurich"],
            "groundingChunks": [{"web": {"uri": "https://example.com/zh", "title": "Zürich"}}],
            "groundingSupports": [{"groundingChunkIndices": [0],
                "segment": {"text": "It is 21 °C", "endIndex": 11, "startIndex": 0}}]}},
        {"id": "ev5", "invocationId": "e-2", "author": "user", "timestamp": 1764669200.0,
         "content": {"role": "user", "parts": [{"text": "Thanks!"}]}},
        {"id": "ev6", "invocationId": "e-2", "author": "greeter", "timestamp": 1764669201.0,
         "content": {"role": "model", "parts": [{"text": "You're welcome."}]}}
    ]);
    json_with_status(
        s.post_json(
            "/apps/greeter/users/u1/sessions",
            json!({"sessionId": "chat1", "events": events}),
        )
        .await,
        200,
    )
    .await;
    let set = json_with_status(
        s.post_json(
            "/dev/apps/greeter/eval-sets",
            // As the web UI sends it.
            json!({"eval_set": {"eval_set_id": "golden", "model_execution_mode": "live",
                "tool_execution_mode": "live", "eval_cases": []}}),
        )
        .await,
        200,
    )
    .await;
    // `EvalSet` is a plain pydantic model: ADK answers its fields in snake_case.
    assert_eq!(set["eval_set_id"], "golden");
    assert_eq!(set["name"], "golden");
    assert_eq!(set["eval_cases"], json!([]));
    assert!(set["creation_timestamp"].is_f64(), "{set}");
    assert_eq!(
        set.as_object().map(|o| o.len()),
        Some(4),
        "the web UI's own fields are dropped: {set}"
    );
    let added = json_with_status(
        s.post_json(
            "/dev/apps/greeter/eval_sets/golden/add_session",
            json!({"evalId": "weather", "sessionId": "chat1", "userId": "u1"}),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(added, Value::Null);

    let file = text_with_status(s.get("/apps/greeter/eval-sets/golden").await, 200).await;
    let ours: Value = serde_json::from_str(&file).expect("JSON");
    let case = &ours["eval_cases"][0];
    // The instruction reads {user_name} and {today}: the case starts with them empty.
    assert_eq!(
        case["session_input"]["state"],
        json!({"user_name": "", "today": ""})
    );
    let session = json_with_status(s.get("/apps/greeter/users/u1/sessions/chat1").await, 200).await;
    let input = json!({
        "session": session, "eval_id": "weather", "set_id": "golden",
        // In the order the instruction reads them (a `Value` here would sort them).
        "state_keys": ["user_name", "today"],
        "creation_timestamp": case["creation_timestamp"],
        "set_creation_timestamp": ours["creation_timestamp"],
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("in.json");
    std::fs::write(&path, input.to_string()).expect("write");
    let adk = run_driver(
        &adk_python(),
        &[PARITY, "from_session", path.to_str().expect("path")],
        &[],
    )
    .await;
    assert_eq!(
        file,
        adk["file"].as_str().expect("file"),
        "the set file differs from ADK's"
    );
    let wire = text_with_status(
        s.get("/dev/apps/greeter/eval-sets/golden/eval-cases/weather")
            .await,
        200,
    )
    .await;
    assert_eq!(
        wire,
        adk["wire_case"].as_str().expect("wire"),
        "the wire form differs from ADK's"
    );

    // The same operations under agentd's own paths.
    let ids = json_with_status(
        s.get("/apps/greeter/eval-sets/golden/eval-cases").await,
        200,
    )
    .await;
    assert_eq!(ids, json!({"evalCaseIds": ["weather"]}));
    let again = json_with_status(
        s.post_json(
            "/apps/greeter/eval-sets/golden/add-session",
            json!({"evalId": "weather", "sessionId": "chat1", "userId": "u1"}),
        )
        .await,
        409,
    )
    .await;
    assert_eq!(again["code"], "eval_case_exists");
    let missing = json_with_status(
        s.post_json(
            "/apps/greeter/eval-sets/golden/add-session",
            json!({"evalId": "other", "sessionId": "nope", "userId": "u1"}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(missing["code"], "session_not_found");
}

/// Adding, replacing and deleting cases; every mistake is a clear error that changes nothing.
async fn cases_are_edited_and_bad_input_loses_nothing(backend: Backend) {
    let s = server(backend).await;
    let conversation = json!([{"userContent": {"role": "user", "parts": [{"text": "hi"}]},
        "finalResponse": {"role": "model", "parts": [{"text": "hello"}]}}]);
    let legacy = s
        .client
        .post(s.url("/dev/apps/greeter/eval_sets/basics"))
        .send()
        .await;
    json_with_status(legacy.expect("POST"), 200).await;
    let b = "/apps/greeter/eval-sets/basics";
    for id in ["b_case", "a_case"] {
        let added = json_with_status(
            s.post_json(
                &format!("{b}/eval-cases"),
                json!({"evalId": id, "conversation": conversation}),
            )
            .await,
            201,
        )
        .await;
        assert_eq!(added["evalId"], id);
        assert_eq!(added["conversation"][0]["invocationId"], "");
    }
    let before = s.db.snapshot().await;
    let bad: Vec<(reqwest::Response, u16, &str)> = vec![
        (s.post_json(&format!("{b}/eval-cases"), json!({"evalId": "a_case", "conversation": []})).await, 409, "eval_case_exists"),
        (s.post_json(&format!("{b}/eval-cases"), json!({"evalId": "x"})).await, 422, "validation_error"),
        (s.post_json(&format!("{b}/eval-cases"), json!({"conversation": [{}]})).await, 422, "validation_error"),
        (s.post_json(&format!("{b}/eval-cases"), json!({"evalId": "x", "conversation": [{"userContent": {"parts": []}, "bogus": 1}]})).await, 422, "validation_error"),
        (put_text(&s, &format!("{b}/eval-cases/a_case"), r#"{"evalId":"other","conversation":[]}"#).await, 422, "validation_error"),
        (put_text(&s, &format!("{b}/eval-cases/nope"), r#"{"conversation":[]}"#).await, 404, "eval_case_not_found"),
        (put_text(&s, "/apps/greeter/eval-sets/nope/eval-cases/a", r#"{"conversation":[]}"#).await, 404, "eval_set_not_found"),
        (put_text(&s, b, r#"{"eval_set_id":"other","eval_cases":[]}"#).await, 422, "validation_error"),
        (put_text(&s, "/apps/greeter/eval-sets/bad-id", r#"{"eval_cases":[]}"#).await, 422, "validation_error"),
        (put_text(&s, b, r#"{"eval_cases":[{"eval_id":"d","conversation":[]},{"eval_id":"d","conversation":[]}]}"#).await, 422, "validation_error"),
        (put_text(&s, b, "{not json").await, 422, "json_invalid"),
        (s.post_json("/dev/apps/greeter/eval-sets", json!({"evalSet": {"evalSetId": "basics"}})).await, 409, "eval_set_exists"),
        (s.post_json("/apps/nope/eval-sets", json!({"evalSet": {"evalSetId": "x"}})).await, 404, "app_not_found"),
        (s.delete("/apps/greeter/eval-sets/nope").await, 404, "eval_set_not_found"),
        (s.get("/dev/apps/greeter/eval_sets/nope/evals").await, 404, "eval_set_not_found"),
    ];
    for (i, (resp, status, code)) in bad.into_iter().enumerate() {
        let body = json_with_status(resp, status).await;
        assert_eq!(body["code"], code, "probe {i}: {body}");
    }
    assert_eq!(
        s.db.snapshot().await,
        before,
        "a refused request changed stored data"
    );

    let ids = json_with_status(s.get("/dev/apps/greeter/eval_sets/basics/evals").await, 200).await;
    assert_eq!(
        ids,
        json!(["a_case", "b_case"]),
        "listed sorted, as ADK lists them"
    );
    let replaced = json_with_status(
        put_text(
            &s,
            &format!("{b}/eval-cases/b_case"),
            r#"{"conversation":[],"finalSessionState":{"done":true}}"#,
        )
        .await,
        200,
    )
    .await;
    assert_eq!(replaced["finalSessionState"], json!({"done": true}));
    let file: Value =
        serde_json::from_str(&text_with_status(s.get(b).await, 200).await).expect("JSON");
    let order: Vec<&str> = file["eval_cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| c["eval_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        order,
        ["b_case", "a_case"],
        "a replaced case keeps its place"
    );
    let deleted = json_with_status(
        s.delete("/dev/apps/greeter/eval-sets/basics/eval-cases/b_case")
            .await,
        200,
    )
    .await;
    assert_eq!(deleted, Value::Null);
    let gone = json_with_status(s.get(&format!("{b}/eval-cases/b_case")).await, 404).await;
    assert_eq!(gone["code"], "eval_case_not_found");

    // ADK's old format, converted as ADK converts it.
    let old = json!([{"name": "dice", "data": [{"query": "Roll a 17 sided die",
        "expected_tool_use": [{"tool_name": "roll_die", "tool_input": {"sides": 17}}],
        "reference": "I rolled 4."}], "initial_session": {"app_name": "greeter", "user_id": "u"}}]);
    json_with_status(
        put_text(&s, "/apps/greeter/eval-sets/dice", &old.to_string()).await,
        201,
    )
    .await;
    let case = json_with_status(
        s.get("/apps/greeter/eval-sets/dice/eval-cases/dice").await,
        200,
    )
    .await;
    let inv = &case["conversation"][0];
    assert_eq!(
        inv["userContent"],
        json!({"parts": [{"text": "Roll a 17 sided die"}], "role": "user"})
    );
    assert_eq!(inv["finalResponse"]["parts"][0]["text"], "I rolled 4.");
    assert_eq!(
        inv["intermediateData"]["toolUses"],
        json!([{"args": {"sides": 17}, "name": "roll_die"}])
    );
    assert_eq!(
        case["sessionInput"],
        json!({"appName": "greeter", "userId": "u", "state": {}})
    );
}

/// A case imported with a credential exchange in its conversation (a tool that asked for
/// OAuth credentials) is read back without the exchange's secrets, as ADK's dev server
/// answers it; the export is still the file that was imported.
async fn a_cases_credential_secrets_are_not_answered(backend: Backend) {
    let s = server(backend).await;
    let file = json!({
        "eval_set_id": "auth",
        "eval_cases": [{
            "eval_id": "oauth",
            "conversation": [{
                "invocation_id": "inv-1",
                "user_content": {"parts": [{"text": "my calendar"}], "role": "user"},
                "intermediate_data": {"invocation_events": [{
                    "author": "assistant",
                    "content": {"role": "model", "parts": [{"function_call": {
                        "name": "adk_request_credential",
                        "args": {"function_call_id": "c1", "auth_config": {
                            "auth_scheme": {"type": "oauth2"},
                            "exchanged_auth_credential": {"auth_type": "oauth2", "oauth2": {
                                "client_id": "calendar-app", "client_secret": "s3cret-value",
                                "access_token": "ya29.token-value"}}}}}}]},
                }]},
            }],
            "session_input": {"app_name": "greeter", "user_id": "u", "state": {}},
        }],
    });
    let text = serde_json::to_string_pretty(&file).unwrap();
    json_with_status(
        put_text(&s, "/apps/greeter/eval-sets/auth", &text).await,
        201,
    )
    .await;
    for path in [
        "/apps/greeter/eval-sets/auth/eval-cases/oauth",
        "/dev/apps/greeter/eval-sets/auth/eval-cases/oauth",
        "/dev/apps/greeter/eval_sets/auth/evals/oauth",
        "/dev/apps/greeter/eval-sets/auth",
    ] {
        let body = text_with_status(s.get(path).await, 200).await;
        assert!(
            !body.contains("s3cret-value") && !body.contains("ya29.token-value"),
            "{path} answers a credential secret: {body}"
        );
        assert!(
            body.contains("calendar-app"),
            "{path} lost what is not secret: {body}"
        );
    }
    let exported = text_with_status(s.get("/apps/greeter/eval-sets/auth").await, 200).await;
    assert!(
        exported.contains("s3cret-value"),
        "the export is the imported file"
    );
}

/// A key that may use the app reads its sets; writing them needs an admin key; a key of
/// another app does not see them; a case from another user's session is refused as absent.
async fn eval_sets_follow_the_door(backend: Backend) {
    let db = TestDb::new(backend).await;
    let key = |user: &str, apps: Option<Vec<String>>, admin: bool| {
        generate(
            KeySpec {
                user_id: user.into(),
                apps,
                admin,
                name: None,
                expires_at: None,
            },
            agentd::event::now_ts(),
        )
        .expect("key")
    };
    let (admin, alice, other) = (
        key("ops", None, true),
        key("alice", Some(vec!["greeter".into()]), false),
        key("carol", Some(vec!["echo".into()]), false),
    );
    let store = db.store().await;
    for k in [&admin, &alice, &other] {
        store.insert_api_key(&k.record).await.expect("stored");
    }
    let s = TestServer::start_on(db, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.apps_dir =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/evals/apps");
    })
    .await;
    let send = |method: reqwest::Method, path: &str, key: &str, body: Option<Value>| {
        let mut req = s
            .client
            .request(method, s.url(path))
            .header("x-api-key", key.to_string());
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send()
    };
    let create = json!({"evalSet": {"evalSetId": "team"}});
    let refused = json_with_status(
        send(
            reqwest::Method::POST,
            "/apps/greeter/eval-sets",
            &alice.plaintext,
            Some(create.clone()),
        )
        .await
        .expect("POST"),
        403,
    )
    .await;
    assert_eq!(refused["code"], "admin_required");
    json_with_status(
        send(
            reqwest::Method::POST,
            "/apps/greeter/eval-sets",
            &admin.plaintext,
            Some(create),
        )
        .await
        .expect("POST"),
        200,
    )
    .await;
    let seen = json_with_status(
        send(
            reqwest::Method::GET,
            "/dev/apps/greeter/eval-sets",
            &alice.plaintext,
            None,
        )
        .await
        .expect("GET"),
        200,
    )
    .await;
    assert_eq!(seen, json!({"evalSetIds": ["team"]}));
    let hidden = json_with_status(
        send(
            reqwest::Method::GET,
            "/apps/greeter/eval-sets/team",
            &other.plaintext,
            None,
        )
        .await
        .expect("GET"),
        404,
    )
    .await;
    assert_eq!(hidden["code"], "app_not_found");
    // alice's session, copied by the admin (who acts for any user): allowed.
    json_with_status(
        send(
            reqwest::Method::POST,
            "/apps/greeter/users/alice/sessions",
            &alice.plaintext,
            Some(json!({"sessionId": "a1"})),
        )
        .await
        .expect("POST"),
        200,
    )
    .await;
    json_with_status(
        send(
            reqwest::Method::POST,
            "/apps/greeter/eval-sets/team/add-session",
            &admin.plaintext,
            Some(json!({"evalId": "c1", "sessionId": "a1", "userId": "alice"})),
        )
        .await
        .expect("POST"),
        201,
    )
    .await;
}

/// Eight creates of one set at once: one is made, seven are told it exists, and the one set
/// holds what its creator sent (a lost race never overwrote it).
async fn concurrent_creates_of_one_set_make_one(backend: Backend) {
    let s = server(backend).await;
    let creates = (0..8).map(|i| {
        let body = json!({"evalSet": {"evalSetId": "race", "name": format!("by {i}")}});
        s.post_json("/apps/greeter/eval-sets", body)
    });
    let answers = futures::future::join_all(creates).await;
    let mut made = vec![];
    for (i, r) in answers.into_iter().enumerate() {
        match r.status().as_u16() {
            200 => made.push(format!("by {i}")),
            409 => {}
            other => panic!("create {i}: {other} {}", r.text().await.unwrap_or_default()),
        }
    }
    assert_eq!(made.len(), 1, "{made:?}");
    let file: Value = serde_json::from_str(
        &text_with_status(s.get("/apps/greeter/eval-sets/race").await, 200).await,
    )
    .expect("JSON");
    assert_eq!(file["name"], made[0].as_str());
}

both_backends!(
    a_cases_credential_secrets_are_not_answered,
    concurrent_creates_of_one_set_make_one,
    an_adk_file_comes_back_byte_for_byte,
    a_case_from_a_session_is_the_case_adk_makes,
    cases_are_edited_and_bad_input_loses_nothing,
    eval_sets_follow_the_door,
);
