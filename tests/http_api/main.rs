//! The HTTP API over a real socket, on both backends: every route that runs no agent,
//! compared with the recorded `adk api_server` exchanges in `tests/fixtures/adk-wire/memory`
//! (ids and timestamps ignored), plus agentd's additions and its handling of bad input.

#[path = "../common/mod.rs"]
mod common;

use common::{json_with_status, Backend, TestServer};
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::Method;
use serde_json::{json, Value};

mod artifacts;
mod events;
mod middleware;
mod service;
mod sessions;

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

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

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
