//! The OpenAPI document (`GET /openapi.json`) and its page (`GET /docs`): the document covers
//! every route with the shapes the server really answers (schemathesis generates requests
//! from it and checks every response against it, on both backends), and the page works in a
//! browser with nothing fetched from anywhere but agentd.

mod common;

use common::{clients, json_with_status, Backend, TestServer};
use serde_json::{json as j, Value};
use std::collections::BTreeSet;

const METHODS: &[&str] = &["get", "post", "put", "patch", "delete", "head", "options"];

/// `(METHOD, path)` of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(*m).is_some() {
                ops.insert((m.to_uppercase(), path.clone()));
            }
        }
    }
    ops
}

/// Every `$ref` in `v`.
fn refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r.clone()),
                    _ => refs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

async fn document_covers_the_api(backend: Backend) {
    let s = TestServer::start(backend).await;
    let doc = json_with_status(s.get("/openapi.json").await, 200).await;
    assert_eq!(doc["openapi"], "3.1.0");
    let ops = operations(&doc);
    // The routes users rely on, by family: ADK's, agentd's run control, the frontends', ops.
    for (m, p) in [
        ("GET", "/list-apps"),
        ("GET", "/apps/{app}/app-info"),
        ("POST", "/apps/{app}/users/{user}/sessions"),
        ("GET", "/apps/{app}/users/{user}/sessions"),
        ("GET", "/apps/{app}/users/{user}/sessions/{session}"),
        ("POST", "/apps/{app}/users/{user}/sessions/{session}"),
        ("PATCH", "/apps/{app}/users/{user}/sessions/{session}"),
        ("DELETE", "/apps/{app}/users/{user}/sessions/{session}"),
        ("GET", "/apps/{app}/users/{user}/sessions/{session}/events"),
        ("GET", "/apps/{app}/users/{user}/sessions/{session}/stream"),
        ("POST", "/apps/{app}/users/{user}/sessions/{session}/cancel"),
        (
            "GET",
            "/apps/{app}/users/{user}/sessions/{session}/artifacts",
        ),
        (
            "POST",
            "/apps/{app}/users/{user}/sessions/{session}/artifacts",
        ),
        (
            "GET",
            "/apps/{app}/users/{user}/sessions/{session}/artifacts/{path}",
        ),
        (
            "DELETE",
            "/apps/{app}/users/{user}/sessions/{session}/artifacts/{path}",
        ),
        ("PATCH", "/apps/{app}/users/{user}/memory"),
        ("GET", "/apps/{app}/users/{user}/memory"),
        ("POST", "/run"),
        ("POST", "/run_sse"),
        ("GET", "/runs/{run_id}"),
        ("GET", "/runs/{run_id}/stream"),
        ("POST", "/runs/{run_id}/cancel"),
        ("POST", "/apps/{app}/chat"),
        ("GET", "/apps/{app}/chat/{chat_id}/stream"),
        ("POST", "/apps/{app}/chat/{chat_id}/stop"),
        ("POST", "/apps/{app}/ag-ui"),
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/{response_id}"),
        ("POST", "/v1/responses/{response_id}/cancel"),
        ("POST", "/mcp"),
        ("POST", "/apps/{app}/mcp"),
        ("GET", "/apps/{app}/users/{user}/usage"),
        ("GET", "/usage"),
        ("GET", "/apps/{app}/users/{user}/budget"),
        ("PUT", "/apps/{app}/users/{user}/budget"),
        ("DELETE", "/apps/{app}/users/{user}/budget"),
        ("GET", "/health"),
        ("GET", "/ready"),
        ("GET", "/version"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
    ] {
        assert!(
            ops.contains(&(m.to_string(), p.to_string())),
            "{m} {p} is not in the document"
        );
    }
    // Every operation answers its errors as documented, with the error body.
    for (m, p) in &ops {
        let op = &doc["paths"][p][m.to_lowercase()];
        assert!(
            op["operationId"].is_string() && op["tags"].is_array(),
            "{m} {p}"
        );
        let responses = op["responses"].as_object().expect("responses");
        assert!(
            responses.keys().any(|k| k.starts_with('2')),
            "{m} {p} documents no success"
        );
        if !matches!(p.as_str(), "/openapi.json" | "/docs" | "/version") {
            assert!(
                responses.contains_key("4XX") && responses.contains_key("5XX"),
                "{m} {p} documents no error responses"
            );
        }
    }
    // Every reference resolves, and the SSE routes say so.
    let mut all = Vec::new();
    refs(&doc, &mut all);
    for r in &all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected reference {r}"));
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "{r} does not resolve"
        );
    }
    for p in ["/run_sse", "/apps/{app}/ag-ui", "/apps/{app}/chat"] {
        assert!(
            doc["paths"][p]["post"]["responses"]["200"]["content"]
                .get("text/event-stream")
                .is_some(),
            "{p} is not documented as an event stream"
        );
    }
    assert!(doc["components"]["securitySchemes"]["apiKey"].is_object());
}

/// The document is valid OpenAPI 3.1 as `openapi-spec-validator` (the validator client
/// generators and gateways use) reads it, and every operation has an operationId of its own:
/// generators key methods on them, and a duplicate (`run` was both `POST /run` and
/// `POST /apps/{app}/ag-ui`) makes the validator reject the whole document.
async fn document_is_valid_openapi(backend: Backend) {
    let s = TestServer::start(backend).await;
    let doc = json_with_status(s.get("/openapi.json").await, 200).await;
    let mut seen = std::collections::BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if let Some(id) = item.get(*m).and_then(|op| op["operationId"].as_str()) {
                if let Some(other) = seen.insert(id.to_string(), format!("{m} {path}")) {
                    panic!("operationId {id:?} is used by {other} and {m} {path}");
                }
            }
        }
    }
    assert!(
        seen.len() >= operations(&doc).len(),
        "an operation has no operationId"
    );
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), serde_json::to_vec(&doc).expect("json")).expect("write");
    let out = tokio::process::Command::new(clients::schemathesis_python())
        .args([
            "-c",
            "import json, sys\n\
             from openapi_spec_validator import validate\n\
             validate(json.load(open(sys.argv[1])))\n\
             print('valid')",
        ])
        .arg(file.path())
        .output()
        .await
        .expect("the validator runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "valid",
        "openapi-spec-validator rejects the document:\n{stdout}\n{stderr}"
    );
}

async fn docs_page_works_offline(backend: Backend) {
    // With API keys on: the document and the page are open, the API is not.
    let s = TestServer::start_with(backend, |a| {
        a.security.auth = vec![agentd::config::AuthMode::ApiKey];
    })
    .await;
    let doc = json_with_status(s.get("/openapi.json").await, 200).await;
    assert_eq!(s.get("/list-apps").await.status(), 401);
    let page = s.get("/docs").await;
    assert_eq!(page.status(), 200);
    assert!(page
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html")));
    let html = page.text().await.expect("html");
    assert!(html.contains("/docs/swagger-ui-bundle.js") && !html.contains("https://"));

    let out = clients::node(
        "web-ui",
        "docs.mjs",
        &[],
        &[("AGENTD_URL", &s.base), ("AGENTD_OPEN", "POST /run_sse")],
    )
    .await;
    assert_eq!(out["loaded"], true, "{out}");
    assert!(
        out["title"].as_str().unwrap_or("").starts_with("agentd"),
        "{out}"
    );
    assert_eq!(
        out["operations"].as_u64(),
        Some(operations(&doc).len() as u64),
        "every operation is listed: {out}"
    );
    assert_eq!(out["opened"], true, "{out}");
    let opened = out["openedText"].as_str().unwrap_or("");
    assert!(
        opened.contains("sessionId") && opened.contains("newMessage"),
        "the request body's schema is shown: {out}"
    );
    assert_eq!(out["externalRequests"], serde_json::json!([]), "{out}");
    assert_eq!(out["failedRequests"], serde_json::json!([]), "{out}");
    assert_eq!(out["consoleErrors"], serde_json::json!([]), "{out}");
}

/// The number after `label` on a line of schemathesis' summary (`Tested: 36`,
/// `2639 generated, …`).
fn summary_number(out: &str, label: &str, before: bool) -> Option<u64> {
    out.lines().find_map(|l| {
        let l = l.trim();
        if before {
            let (n, rest) = l.split_once(' ')?;
            rest.starts_with(label).then(|| n.parse().ok()).flatten()
        } else {
            let n = l.strip_prefix(label)?.trim();
            n.split('/').next()?.parse().ok()
        }
    })
}

/// schemathesis against a live server: every operation, thousands of generated requests (about
/// half naming real apps, users and sessions, see tests/clients/schemathesis), and not one 5xx
/// or answer that contradicts the document.
async fn schemathesis_finds_nothing(backend: Backend) {
    let s = TestServer::start(backend).await;
    let doc = json_with_status(s.get("/openapi.json").await, 200).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/fuzz-api.sh");
    let run = tokio::process::Command::new(script)
        .arg(&s.base)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(600), run)
        .await
        .expect("schemathesis finishes in 10 minutes")
        .expect("scripts/fuzz-api.sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schemathesis found problems ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Every operation but the document's own URL (schemathesis leaves that one out).
    let tested = summary_number(&stdout, "Tested:", false).expect("a Tested: line");
    assert!(
        tested + 1 >= operations(&doc).len() as u64,
        "only {tested} operations tested:\n{stdout}"
    );
    let cases = summary_number(&stdout, "generated", true).expect("a test-case count");
    assert!(cases >= 1000, "only {cases} cases:\n{stdout}");
    let passed = stdout.contains(&format!("{cases} generated, {cases} passed"));
    assert!(passed, "not every case passed:\n{stdout}");
}

/// The codes the document lists for each operation (`x-error-codes` of its responses).
fn documented_codes(doc: &Value) -> Vec<(String, regex::Regex, BTreeSet<String>)> {
    let mut out = vec![];
    for (path, item) in doc["paths"].as_object().expect("paths") {
        // `{path}` (an artifact's name) may hold slashes; every other parameter is one segment.
        let pattern = path
            .split('/')
            .map(|seg| match seg {
                "{path}" => ".+".to_string(),
                s if s.starts_with('{') => "[^/]+".to_string(),
                s => regex::escape(s),
            })
            .collect::<Vec<_>>()
            .join("/");
        let re = regex::Regex::new(&format!("^{pattern}$")).expect("path pattern");
        for m in METHODS {
            let Some(op) = item.get(*m) else { continue };
            let mut codes = BTreeSet::new();
            for resp in op["responses"]
                .as_object()
                .into_iter()
                .flat_map(|r| r.values())
            {
                for c in resp["x-error-codes"].as_array().into_iter().flatten() {
                    codes.insert(c.as_str().unwrap_or_default().to_string());
                }
            }
            out.push((m.to_uppercase(), re.clone(), codes));
        }
    }
    out
}

/// Every stable error code is listed by some operation of the document, or by the router's
/// fallback for a path no operation has (`components.responses.NoSuchRoute`), and what routes
/// really answer is listed where they answer it: one real request per error, each code
/// checked against its operation's list.
async fn every_error_is_documented_where_it_is_answered(backend: Backend) {
    let s = TestServer::start(backend).await;
    let doc = json_with_status(s.get("/openapi.json").await, 200).await;
    let ops = documented_codes(&doc);
    let fallback: Vec<&str> = doc["components"]["responses"]
        [agentd::http::openapi::FALLBACK_RESPONSE]["x-error-codes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(fallback, ["route_not_found"], "the fallback's codes");
    let listed: BTreeSet<&str> = ops
        .iter()
        .flat_map(|(_, _, c)| c.iter().map(String::as_str))
        .chain(fallback)
        .collect();
    for code in agentd::error_code::ErrorCode::ALL {
        assert!(
            listed.contains(code.as_str()),
            "the document lists {code} nowhere"
        );
    }
    s.post_json(
        "/apps/echo/users/u1/sessions",
        serde_json::json!({"sessionId": "s1"}),
    )
    .await;
    let run = serde_json::json!({"appName": "echo", "userId": "u1", "sessionId": "s1",
        "newMessage": {"role": "user", "parts": [{"text": "hi"}]}});

    // An eval set for the eval probes to find.
    s.post_json(
        "/apps/echo/eval-sets",
        serde_json::json!({"evalSet": {"evalSetId": "probe"}}),
    )
    .await;
    let probes: Vec<(&str, &str, Option<Value>, &str)> = vec![
        (
            "GET",
            "/apps/echo/users/u1/sessions/missing",
            None,
            "session_not_found",
        ),
        (
            "POST",
            "/apps/echo/users/u1/sessions",
            Some(j!({"sessionId": "s1"})),
            "session_exists",
        ),
        (
            "POST",
            "/apps/echo/users/u1/sessions",
            Some(j!({"state": 3})),
            "validation_error",
        ),
        (
            "PATCH",
            "/apps/echo/users/u1/sessions/missing",
            Some(j!({"stateDelta": {}})),
            "session_not_found",
        ),
        (
            "GET",
            "/apps/echo/users/u1/sessions/s1/events?limit=-1",
            None,
            "validation_error",
        ),
        (
            "GET",
            "/apps/echo/users/u1/sessions/s1/stream?after=99",
            None,
            "after_beyond_end",
        ),
        (
            "POST",
            "/apps/echo/users/u1/sessions/s1/cancel",
            Some(j!({})),
            "no_active_run",
        ),
        (
            "GET",
            "/apps/echo/users/u1/sessions/s1/artifacts/nope",
            None,
            "artifact_not_found",
        ),
        (
            "GET",
            "/apps/echo/users/u1/sessions/s1/artifacts/nope/versions/x",
            None,
            "invalid_version",
        ),
        (
            "POST",
            "/apps/echo/users/u1/sessions/s1/fork",
            Some(j!({"beforeInvocationId": "e-1", "atSeq": 1})),
            "fork_point_ambiguous",
        ),
        (
            "POST",
            "/apps/echo/users/u1/sessions/s1/fork",
            Some(j!({"atSeq": 99})),
            "seq_out_of_range",
        ),
        (
            "POST",
            "/apps/echo/users/u1/sessions/s1/rewind",
            Some(j!({"beforeInvocationId": "e-nope"})),
            "invocation_not_found",
        ),
        (
            "POST",
            "/run",
            Some(j!({"userId": "u1", "sessionId": "s1"})),
            "app_name_required",
        ),
        (
            "POST",
            "/run",
            Some(j!({"appName": "nope", "userId": "u1", "sessionId": "s1"})),
            "app_not_found",
        ),
        (
            "POST",
            "/run",
            Some(
                j!({"appName": "echo", "userId": "u1", "sessionId": "gone", "newMessage": run["newMessage"]}),
            ),
            "session_not_found",
        ),
        (
            "POST",
            "/run",
            Some(j!({"appName": "echo", "userId": "u1", "sessionId": "s1"})),
            "new_message_required",
        ),
        (
            "POST",
            "/run",
            Some(
                j!({"appName": "echo", "userId": "u1", "sessionId": "s1", "regenerate": true, "editInvocationId": "e-1"}),
            ),
            "edit_ambiguous",
        ),
        (
            "POST",
            "/run_sse",
            Some(j!({"appName": "echo", "userId": "u/1", "sessionId": "s1"})),
            "invalid_id",
        ),
        (
            "POST",
            "/apps/echo/users/u1/sessions/s1/runs",
            Some(j!({"webhook": {"url": "ftp://x"}})),
            "webhook_url_invalid",
        ),
        ("GET", "/runs/run-nope", None, "run_not_found"),
        (
            "POST",
            "/apps/echo/users/u1/runs/run-nope/cancel",
            Some(j!({})),
            "run_not_found",
        ),
        (
            "GET",
            "/apps/echo/users/u1/runs?limit=0",
            None,
            "validation_error",
        ),
        ("GET", "/apps/echo/app-info", None, "not_llm_agent"),
        (
            "POST",
            "/apps/echo/users/u1/schedules",
            Some(j!({"cron": "61 * * * *", "message": run["newMessage"]})),
            "invalid_cron",
        ),
        (
            "GET",
            "/apps/echo/users/u1/schedules/sch-nope",
            None,
            "schedule_not_found",
        ),
        (
            "POST",
            "/apps/echo/eval-sets",
            Some(j!({"evalSet": {"evalSetId": "probe"}})),
            "eval_set_exists",
        ),
        (
            "GET",
            "/apps/echo/eval-sets/nope",
            None,
            "eval_set_not_found",
        ),
        (
            "GET",
            "/apps/echo/eval-sets/probe/eval-cases/nope",
            None,
            "eval_case_not_found",
        ),
        (
            "POST",
            "/apps/echo/eval-sets/probe/eval-cases",
            Some(j!({"evalId": "c", "conversation": [{}]})),
            "validation_error",
        ),
        (
            "GET",
            "/apps/echo/users/u1/schedules?after=zz",
            None,
            "invalid_cursor",
        ),
        (
            "PATCH",
            "/apps/echo/users/u1/memory",
            Some(j!({"sessionId": "missing"})),
            "session_not_found",
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(j!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]})),
            "app_not_found",
        ),
        ("GET", "/v1/responses/resp_nope", None, "response_not_found"),
        (
            "POST",
            "/v1/responses",
            Some(j!({"model": "echo", "input": 3})),
            "invalid_input",
        ),
        (
            "POST",
            "/apps/echo/chat",
            Some(j!({"id": "c1", "messages": []})),
            "no_new_input",
        ),
    ];
    let mut wrong = vec![];
    for (method, path, body, expected) in probes {
        let url = s.url(path);
        let req = match method {
            "GET" => s.client.get(&url),
            "POST" => s.client.post(&url),
            "PATCH" => s.client.patch(&url),
            m => panic!("{m}"),
        };
        let req = match &body {
            Some(b) => req.json(b),
            None => req,
        };
        let resp = req
            .header("x-agentd-user-id", "u1")
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap_or_default();
        let code = answer["code"].as_str().unwrap_or_default().to_string();
        if code != expected {
            wrong.push(format!(
                "{method} {path}: expected {expected}, got {status} {answer}"
            ));
            continue;
        }
        let route = path.split('?').next().unwrap_or(path);
        let op = ops
            .iter()
            .find(|(m, re, _)| m == method && re.is_match(route));
        match op {
            Some((_, _, codes)) if codes.contains(&code) => {}
            Some(_) => wrong.push(format!(
                "{method} {path} answers {code}, which its operation does not list"
            )),
            None => wrong.push(format!("{method} {path}: no operation in the document")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

both_backends!(
    every_error_is_documented_where_it_is_answered,
    document_covers_the_api,
    document_is_valid_openapi,
    docs_page_works_offline,
    schemathesis_finds_nothing
);
