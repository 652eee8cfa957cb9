//! The HTTP API over a real socket, on both backends: every route that runs no agent,
//! compared with the recorded `adk api_server` exchanges in `tests/fixtures/adk-wire/memory`
//! (ids and timestamps ignored), plus agentd's additions and its handling of bad input.

mod common;

use common::{json_with_status, Backend, TestServer};
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::Method;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------
// Recorded fixtures
// ---------------------------------------------------------------------------------------

/// Values that differ on every run; their keys are compared, their values are not.
const VOLATILE: &[&str] = &[
    "id",
    "timestamp",
    "lastUpdateTime",
    "createTime",
    "canonicalUri",
    "invocationId",
];

/// One recorded exchange: the request ADK got and the answer it gave.
struct Fixture {
    name: String,
    method: Method,
    path: String,
    content_type: Option<String>,
    body: String,
    status: u16,
    response: Value,
}

/// Loads the fixture whose file name starts with `id` (`"018"` → `018_patch_session_state.txt`).
fn fixture(id: &str) -> Fixture {
    let file = common::fixture_path(id, "txt");
    let text = std::fs::read_to_string(&file).expect("fixture readable");
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let (_, rest) = text.split_once("### REQUEST\n").expect("### REQUEST");
    let (request, response) = rest.split_once("### RESPONSE\n").expect("### RESPONSE");

    let (req_head, req_body) = request.split_once("\n\n").unwrap_or((request, ""));
    let mut lines = req_head.lines();
    let mut request_line = lines.next().expect("request line").split(' ');
    let method = request_line
        .next()
        .expect("method")
        .parse()
        .expect("method");
    let path = request_line.next().expect("path").to_string();
    let content_type = lines
        .filter_map(|l| l.split_once(": "))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.to_string());

    let (resp_head, resp_body) = response.split_once("\n\n").expect("response body");
    let status = resp_head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let response = serde_json::from_str(resp_body.trim())
        .unwrap_or_else(|_| Value::String(resp_body.trim().to_string()));
    Fixture {
        name,
        method,
        path,
        content_type,
        body: req_body.trim_end_matches('\n').to_string(),
        status,
        response,
    }
}

/// `v` with every volatile value replaced by a marker, and FastAPI's echo of the offending
/// input (`input`, `ctx`) dropped from validation problems.
fn normalized(v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            let is_problem = map.contains_key("loc") && map.contains_key("type");
            map.iter()
                .filter(|(k, _)| !(is_problem && (*k == "input" || *k == "ctx")))
                .map(|(k, v)| {
                    let v = if VOLATILE.contains(&k.as_str()) && !v.is_null() {
                        json!("<volatile>")
                    } else {
                        normalized(v)
                    };
                    (k.clone(), v)
                })
                .collect()
        }
        Value::Array(items) => items.iter().map(normalized).collect(),
        other => other.clone(),
    }
}

fn assert_same_shape(actual: &Value, expected: &Value, what: &str) {
    let (a, e) = (normalized(actual), normalized(expected));
    assert!(
        a == e,
        "{what}: agentd's body differs from ADK's\n agentd: {}\n    ADK: {}",
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&e).unwrap(),
    );
}

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

/// Sends a fixture's request to agentd and asserts that the answer has ADK's status and
/// body shape. Error bodies must carry agentd's extra `code`, which is not compared here
/// (callers assert its value). Returns agentd's body.
async fn replay(s: &TestServer, id: &str) -> Value {
    replay_adjusted(s, id, |_| {}).await
}

/// [`replay`] after `adjust` edits ADK's expected body, for a documented agentd deviation
/// or for state that ADK's agent runs (not replayed here) had produced.
async fn replay_adjusted(s: &TestServer, id: &str, adjust: impl FnOnce(&mut Value)) -> Value {
    let fx = fixture(id);
    let mut req = s.client.request(fx.method.clone(), s.url(&fx.path));
    if let Some(ct) = &fx.content_type {
        req = req.header(CONTENT_TYPE, ct);
    }
    if !fx.body.is_empty() {
        req = req.body(fx.body.clone());
    }
    let body = json_with_status(req.send().await.expect("send"), fx.status).await;
    let mut expected = fx.response.clone();
    adjust(&mut expected);
    let mut compared = body.clone();
    if fx.status >= 400 {
        let code = compared.as_object_mut().and_then(|o| o.remove("code"));
        assert!(
            code.as_ref()
                .is_some_and(|c| c.as_str().is_some_and(|c| !c.is_empty())),
            "{}: error body has no `code`: {body}",
            fx.name
        );
    }
    assert_same_shape(&compared, &expected, &fx.name);
    body
}

// ---------------------------------------------------------------------------------------
// Small request helpers
// ---------------------------------------------------------------------------------------

const SESSIONS: &str = "/apps/echo_agent/users/u1/sessions";

fn session_path(id: &str) -> String {
    format!("{SESSIONS}/{id}")
}

fn artifacts_path(session: &str) -> String {
    format!("{}/artifacts", session_path(session))
}

/// Asserts an agentd error: status, `{"detail": detail, "code": code}` and nothing else.
async fn assert_error(resp: reqwest::Response, status: u16, detail: &str, code: &str) {
    let body = json_with_status(resp, status).await;
    assert_eq!(body, json!({ "detail": detail, "code": code }));
}

/// The `code` of an error answer, after asserting its status.
async fn error_code(resp: reqwest::Response, status: u16) -> String {
    let body = json_with_status(resp, status).await;
    body["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no code: {body}"))
        .to_string()
}

/// Asserts a 422 validation error whose first problem is at `loc`; returns the body.
async fn assert_validation(resp: reqwest::Response, code: &str, loc: Value) -> Value {
    let body = json_with_status(resp, 422).await;
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["detail"][0]["loc"], loc, "{body}");
    assert!(body["detail"][0]["msg"].is_string(), "{body}");
    body
}

/// GET `path`, expecting 200 and JSON.
async fn get_json(s: &TestServer, path: String) -> Value {
    json_with_status(s.get(&path).await, 200).await
}

async fn create_session(s: &TestServer, id: &str, state: Value) -> Value {
    let body = json!({ "sessionId": id, "state": state });
    json_with_status(s.post_json(SESSIONS, body).await, 200).await
}

async fn get_session(s: &TestServer, id: &str) -> Value {
    json_with_status(s.get(&session_path(id)).await, 200).await
}

async fn patch_state(s: &TestServer, id: &str, delta: Value) -> Value {
    let body = json!({ "stateDelta": delta });
    json_with_status(s.patch_json(&session_path(id), body).await, 200).await
}

async fn save_artifact(s: &TestServer, session: &str, filename: &str, part: Value) -> Value {
    let body = json!({ "filename": filename, "artifact": part });
    json_with_status(s.post_json(&artifacts_path(session), body).await, 200).await
}

async fn list_artifacts(s: &TestServer, session: &str) -> Value {
    json_with_status(s.get(&artifacts_path(session)).await, 200).await
}

fn text_blob(text: &str) -> Value {
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD.encode(text);
    json!({ "inlineData": { "mimeType": "text/plain", "data": data } })
}

fn ids(sessions: &Value) -> Vec<&str> {
    sessions
        .as_array()
        .expect("a list of sessions")
        .iter()
        .map(|s| s["id"].as_str().expect("session id"))
        .collect()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

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

// ---------------------------------------------------------------------------------------
// Service routes
// ---------------------------------------------------------------------------------------

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
    // ADK names the apps directory's full path; agentd names the app relative to it, so a
    // client learns nothing of the server's disk.
    let body = replay_adjusted(&s, "007", |v| {
        let detail = v["detail"].as_str().unwrap().replace("<AGENTS_DIR>/", "");
        v["detail"] = json!(detail);
    })
    .await;
    assert_eq!(body["code"], "app_not_found");
    assert!(
        !body.to_string().contains(&dir.display().to_string()),
        "{body}"
    );

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

// ---------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------

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

async fn get_session_limit_returns_newest_events(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({})).await;
    for n in 0..5 {
        patch_state(&s, "s1", json!({ "n": n })).await;
    }
    let full = get_session(&s, "s1").await;
    assert_eq!(full["events"].as_array().unwrap().len(), 5);
    let resp = s.get(&format!("{}?limit=2", session_path("s1"))).await;
    let recent = json_with_status(resp, 200).await;
    let deltas: Vec<&Value> = recent["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["actions"]["stateDelta"]["n"])
        .collect();
    assert_eq!(deltas, [&json!(3), &json!(4)]);
    assert_eq!(recent["state"], json!({"n": 4}));
    assert_eq!(recent["events"][1], full["events"][4]);

    // A huge limit is read as the page maximum (1000), not as "load the whole session at
    // once": a session of 1,005 events answers its newest 1,000.
    let events: Vec<Value> = (0..1_005)
        .map(|i| {
            json!({"author": "user", "invocationId": "e-imported",
                   "content": {"role": "user", "parts": [{"text": format!("m{i}")}]}})
        })
        .collect();
    json_with_status(
        s.post_json(SESSIONS, json!({"sessionId": "big", "events": events}))
            .await,
        200,
    )
    .await;
    let resp = s
        .get(&format!("{}?limit=4294967295", session_path("big")))
        .await;
    let capped = json_with_status(resp, 200).await;
    let got = capped["events"].as_array().unwrap();
    assert_eq!(got.len(), 1_000);
    assert_eq!(got[0]["content"]["parts"][0]["text"], "m5");
    assert_eq!(got[999]["content"]["parts"][0]["text"], "m1004");
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

async fn list_events_pages_by_seq(backend: Backend) {
    let s = TestServer::start(backend).await;
    create_session(&s, "s1", json!({})).await;
    for n in 1..=5 {
        patch_state(&s, "s1", json!({ "n": n })).await;
    }
    let events = |query: &str| get_json(&s, format!("{}/events{query}", session_path("s1")));
    let seqs = |page: &Value| -> Vec<i64> {
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_i64().unwrap())
            .collect()
    };

    let all = events("").await;
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5]);
    assert_eq!(all["hasMore"], false);
    assert!(
        all.get("nextAfter").is_none() && all.get("nextBefore").is_none(),
        "{all}"
    );
    let stored = get_session(&s, "s1").await;
    for (paged, stored) in all["events"]
        .as_array()
        .unwrap()
        .iter()
        .zip(stored["events"].as_array().unwrap())
    {
        let mut paged = paged.clone();
        paged.as_object_mut().unwrap().remove("seq");
        assert_eq!(
            &paged, stored,
            "an event page carries the stored events plus seq"
        );
    }

    let first = events("?limit=2").await;
    assert_eq!(
        (seqs(&first), &first["hasMore"], &first["nextAfter"]),
        (vec![1, 2], &json!(true), &json!(2))
    );
    let middle = events("?limit=2&after=2").await;
    assert_eq!(
        (seqs(&middle), &middle["nextAfter"]),
        (vec![3, 4], &json!(4))
    );
    let last = events("?limit=2&after=4").await;
    assert_eq!((seqs(&last), &last["hasMore"]), (vec![5], &json!(false)));
    assert!(last.get("nextAfter").is_none());

    let newest = events("?limit=2&before=6").await;
    assert_eq!(
        (seqs(&newest), &newest["hasMore"], &newest["nextBefore"]),
        (vec![4, 5], &json!(true), &json!(4))
    );
    let older = events("?limit=2&before=4").await;
    assert_eq!(
        (seqs(&older), &older["nextBefore"]),
        (vec![2, 3], &json!(2))
    );
    let oldest = events("?limit=2&before=2").await;
    assert_eq!(
        (seqs(&oldest), &oldest["hasMore"]),
        (vec![1], &json!(false))
    );
    assert!(oldest.get("nextBefore").is_none());

    let missing = s.get(&format!("{}/events", session_path("nope"))).await;
    assert_error(missing, 404, "Session not found", "session_not_found").await;
    let zero = s
        .get(&format!("{}/events?limit=0", session_path("s1")))
        .await;
    assert_validation(zero, "validation_error", json!(["query", "limit"])).await;
    let bad = s
        .get(&format!("{}/events?after=abc", session_path("s1")))
        .await;
    assert_validation(bad, "validation_error", json!(["query", "after"])).await;
}

// ---------------------------------------------------------------------------------------
// Artifacts
// ---------------------------------------------------------------------------------------

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
    for id in [
        "059", "060", "061", "062", "063", "064", "065", "114", "115",
    ] {
        replay(&s, id).await;
    }
}

async fn artifact_versions_are_addressable_every_way(backend: Backend) {
    let s = TestServer::start(backend).await;
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

// ---------------------------------------------------------------------------------------
// Bad input, errors and middleware
// ---------------------------------------------------------------------------------------

const SMALL_BODY_LIMIT: usize = 4096;

/// A request that must be refused with `status` and `code`.
struct BadRequest {
    what: &'static str,
    method: Method,
    path: String,
    content_type: &'static str,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
}

/// A JSON request `what` that is expected to fail; see [`BadRequest::expect`].
fn bad(what: &'static str, method: Method, path: &str, body: impl Into<Vec<u8>>) -> BadRequest {
    BadRequest {
        what,
        method,
        path: path.to_string(),
        content_type: "application/json",
        body: body.into(),
        status: 0,
        code: "",
    }
}

impl BadRequest {
    fn expect(self, status: u16, code: &'static str) -> Self {
        BadRequest {
            status,
            code,
            ..self
        }
    }

    fn content_type(self, content_type: &'static str) -> Self {
        BadRequest {
            content_type,
            ..self
        }
    }

    /// Sends it (with no `Content-Type` when that is empty); asserts a JSON error body with
    /// the expected status and code.
    async fn check(&self, s: &TestServer) {
        let mut req = s.client.request(self.method.clone(), s.url(&self.path));
        if !self.content_type.is_empty() {
            req = req.header(CONTENT_TYPE, self.content_type);
        }
        let req = req.body(self.body.clone());
        let resp = req.send().await.expect("send");
        let content_type = header(resp.headers(), "content-type")
            .unwrap_or("")
            .to_string();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let what = self.what;
        assert_eq!(status, self.status, "{what}: {text}");
        assert!(
            content_type.starts_with("application/json"),
            "{what}: {content_type}"
        );
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
        assert_eq!(body["code"], self.code, "{what}: {body}");
        assert!(
            body["detail"].is_string() || body["detail"].is_array(),
            "{what}: {body}"
        );
    }
}

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
    let session = get_session(&s, "s1").await;
    let artifacts = list_artifacts(&s, "s1").await;

    for case in bad_requests() {
        case.check(&s).await;
        let what = case.what;
        assert_eq!(
            get_session(&s, "s1").await,
            session,
            "{what} changed the session"
        );
        assert_eq!(
            list_artifacts(&s, "s1").await,
            artifacts,
            "{what} changed artifacts"
        );
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

/// A whole session is streamed page by page (500 events a read): 1,234 events come back
/// complete, in order, as one JSON document equal to the paged event listing.
async fn a_big_session_comes_back_whole(backend: Backend) {
    let s = TestServer::start(backend).await;
    let events: Vec<Value> = (0..1_234)
        .map(|i| {
            json!({"id": format!("ev-{i}"), "author": if i % 2 == 0 { "user" } else { "a" },
                "invocationId": "e-1", "timestamp": 1_700_000_000.0 + f64::from(i),
                "content": {"role": "user", "parts": [{"text": format!("message {i}")}]}})
        })
        .collect();
    json_with_status(
        s.post_json(
            SESSIONS,
            json!({"sessionId": "big", "state": {"k": "v"}, "events": events}),
        )
        .await,
        200,
    )
    .await;
    let session = get_session(&s, "big").await;
    assert_eq!(session["id"], "big");
    assert_eq!(session["state"], json!({"k": "v"}));
    let got = session["events"].as_array().unwrap();
    assert_eq!(got.len(), 1_234);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e["id"], format!("ev-{i}"));
    }
    assert!(session["lastUpdateTime"].as_f64().unwrap() > 0.0);
    // As a browser asks for it: gzip-encoded, whole. (The encoder polls the body once more
    // after its end; that used to panic the streamed body and cut the connection without an
    // answer.)
    let resp = s
        .client
        .get(s.url(&session_path("big")))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .expect("GET with gzip");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    let zipped = resp.bytes().await.expect("gzip body");
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&zipped[..]), &mut plain)
        .expect("valid gzip");
    assert_eq!(
        serde_json::from_slice::<Value>(&plain).expect("JSON"),
        session
    );
    let limited = json_with_status(
        s.get(&format!("{}?limit=3", session_path("big"))).await,
        200,
    )
    .await;
    assert_eq!(limited["events"].as_array().unwrap().len(), 3);
    // PATCH answers the same document, with the new event last.
    let patched = json_with_status(
        s.patch_json(
            &session_path("big"),
            json!({"stateDelta": {"k": "w", "temp:t": 1}}),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(patched["events"].as_array().unwrap().len(), 1_235);
    assert_eq!(patched["state"], json!({"k": "w", "temp:t": 1}));
}

both_backends!(
    a_big_session_comes_back_whole,
    health_and_version_answer,
    list_apps_and_app_info_match_adk,
    update_memory_matches_adk,
    session_routes_match_adk,
    create_session_by_path_takes_bare_state_or_nothing,
    create_session_rejects_events_it_cannot_restore,
    invalid_session_ids_are_rejected,
    get_session_limit_returns_newest_events,
    list_sessions_merges_shared_state_in_adk_order,
    list_sessions_paginates_with_a_cursor,
    delete_session_removes_it_and_its_artifacts_but_not_user_artifacts,
    patch_session_appends_a_synthetic_user_event,
    concurrent_writes_to_one_session_never_fail_with_500,
    list_events_pages_by_seq,
    artifact_routes_match_adk,
    artifact_versions_are_addressable_every_way,
    bad_artifact_saves_are_rejected_and_store_nothing,
    bad_requests_get_json_errors_and_change_nothing,
    oversize_bodies_are_refused_with_or_without_content_length,
    unknown_routes_and_wrong_methods_answer_like_fastapi,
    every_response_carries_a_request_id,
    cors_is_off_unless_an_origin_is_allowed,
);
