//! Authentication and tenant isolation, on both backends: API keys (stored hashed, revoked at
//! once), JWTs from a JWKS server on a local port (with key rotation), the binding of every
//! route to the caller's user and apps, the cross-site check, rate and run limits, `app:`
//! state writes, the refusal to serve unauthenticated on a public address, and the CLI.

#[path = "../common/mod.rs"]
mod common;

use agentd::auth::keys::{generate, KeySpec};
use agentd::config::AuthMode;
use common::{json_with_status, Backend, TestDb, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

mod a2a_mcp;
mod admin;
mod browsers;
mod jwt;
mod keys;
mod limits;

/// How a request presents itself.
#[derive(Clone, Copy, Debug)]
enum Cred<'a> {
    Nothing,
    Bearer(&'a str),
    XApiKey(&'a str),
}

async fn call(
    s: &TestServer,
    method: Method,
    path: &str,
    body: Option<&Value>,
    cred: Cred<'_>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut req = s.client.request(method, s.url(path));
    req = match cred {
        Cred::Nothing => req,
        Cred::Bearer(k) => req.bearer_auth(k),
        Cred::XApiKey(k) => req.header("x-api-key", k),
    };
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        headers,
    )
}

/// Stores a key directly (as `agentd keys create` does) and returns its plaintext.
async fn key(
    db: &TestDb,
    user: &str,
    apps: Option<&[&str]>,
    admin: bool,
    expires_at: Option<f64>,
) -> String {
    let now = agentd::event::now_ts();
    let k = generate(
        KeySpec {
            user_id: user.into(),
            apps: apps.map(|a| a.iter().map(|s| s.to_string()).collect()),
            admin,
            name: None,
            expires_at,
        },
        now,
    )
    .expect("key");
    db.store()
        .await
        .insert_api_key(&k.record)
        .await
        .expect("stored");
    k.plaintext
}

async fn with_keys(backend: Backend) -> TestServer {
    TestServer::start_with(backend, |a| a.security.auth = vec![AuthMode::ApiKey]).await
}

const SESSION: &str = "/apps/echo/users/alice/sessions/s1";

/// Every route that names a user, an app or a run: (method, path, body).
fn routes(run_id: &str) -> Vec<(Method, String, Option<Value>)> {
    let run = json!({"appName": "echo", "userId": "alice", "sessionId": "s1",
        "newMessage": {"role": "user", "parts": [{"text": "hijack"}]}});
    let run_new = json!({"appName": "echo", "userId": "alice", "sessionId": "s9",
        "createSession": true, "newMessage": {"role": "user", "parts": [{"text": "x"}]}});
    vec![
        (Method::GET, "/list-apps".into(), None),
        (Method::GET, "/apps/echo/app-info".into(), None),
        (Method::GET, "/apps/echo/users/alice/sessions".into(), None),
        (
            Method::POST,
            "/apps/echo/users/alice/sessions".into(),
            Some(json!({"sessionId": "s3"})),
        ),
        (Method::GET, SESSION.into(), None),
        (
            Method::POST,
            "/apps/echo/users/alice/sessions/s2".into(),
            Some(json!({})),
        ),
        (
            Method::PATCH,
            SESSION.into(),
            Some(json!({"stateDelta": {"x": 1}})),
        ),
        (Method::DELETE, SESSION.into(), None),
        (Method::GET, format!("{SESSION}/events"), None),
        (Method::GET, format!("{SESSION}/artifacts"), None),
        (
            Method::POST,
            format!("{SESSION}/artifacts"),
            Some(json!({"filename": "evil.txt", "artifact": {"text": "x"}})),
        ),
        (Method::GET, format!("{SESSION}/artifacts/notes.txt"), None),
        (
            Method::GET,
            format!("{SESSION}/artifacts/notes.txt/versions"),
            None,
        ),
        (
            Method::DELETE,
            format!("{SESSION}/artifacts/notes.txt"),
            None,
        ),
        (
            Method::PATCH,
            "/apps/echo/users/alice/memory".into(),
            Some(json!({"sessionId": "s1"})),
        ),
        (
            Method::GET,
            "/apps/echo/users/alice/memory?query=tulips".into(),
            None,
        ),
        (Method::POST, "/run".into(), Some(run.clone())),
        (Method::POST, "/run_sse".into(), Some(run)),
        (Method::POST, "/run".into(), Some(run_new)),
        (Method::GET, format!("/runs/{run_id}"), None),
        (
            Method::POST,
            format!("/runs/{run_id}/cancel"),
            Some(json!({})),
        ),
        (Method::GET, format!("/runs/{run_id}/stream"), None),
        (Method::GET, format!("{SESSION}/stream"), None),
        (Method::POST, format!("{SESSION}/cancel"), Some(json!({}))),
    ]
}

fn now() -> i64 {
    agentd::event::now_ts() as i64
}
