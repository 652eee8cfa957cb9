//! Traces over OTLP: a real `agentd` process exports its spans (OTLP/HTTP, JSON encoding) to a
//! receiver on a local port. The caller's `traceparent` is honoured and passed on to the model
//! and to an HTTP tool; the spans carry the run's ids and the GenAI attributes.

mod common;

use axum::extract::State;
use axum::http::HeaderMap;
use common::model_server::{Reply, ScriptedModel};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[derive(Default)]
struct Received {
    /// Every request the receiver got, whatever its path or encoding.
    requests: usize,
    batches: Vec<Value>,
    tool_traceparents: Vec<Option<String>>,
}

/// The OTLP receiver (`POST /v1/traces`) and the HTTP tool's endpoint, on one local port.
async fn receiver() -> (String, Arc<Mutex<Received>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    receiver_on(vec![listener])
}

/// [`receiver`] on these listeners. Any request counts in `requests`; one that is not
/// `POST /v1/traces` with an OTLP/JSON body is answered 404 or 400.
fn receiver_on(listeners: Vec<tokio::net::TcpListener>) -> (String, Arc<Mutex<Received>>) {
    let got = Arc::new(Mutex::new(Received::default()));
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(
                |State(got): State<Arc<Mutex<Received>>>, body: axum::body::Bytes| async move {
                    let mut got = got.lock().unwrap();
                    got.requests += 1;
                    match serde_json::from_slice::<Value>(&body) {
                        Ok(v) => {
                            got.batches.push(v);
                            (axum::http::StatusCode::OK, axum::Json(json!({})))
                        }
                        Err(_) => (axum::http::StatusCode::BAD_REQUEST, axum::Json(json!({}))),
                    }
                },
            ),
        )
        .route(
            "/weather",
            axum::routing::get(
                |State(got): State<Arc<Mutex<Received>>>, headers: HeaderMap| async move {
                    got.lock().unwrap().tool_traceparents.push(
                        headers
                            .get("traceparent")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string),
                    );
                    axum::Json(json!({"temperature": 21}))
                },
            ),
        )
        .fallback(|State(got): State<Arc<Mutex<Received>>>| async move {
            got.lock().unwrap().requests += 1;
            axum::http::StatusCode::NOT_FOUND
        })
        .with_state(got.clone());
    let addr = listeners[0].local_addr().unwrap();
    for listener in listeners {
        let app = app.clone();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }
    (format!("http://{addr}"), got)
}

/// Every span received: (name, attributes as a map, trace id, parent span id).
fn spans(batches: &[Value]) -> Vec<(String, Value, String, String)> {
    let mut out = vec![];
    for b in batches {
        for rs in b["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    let mut attrs = serde_json::Map::new();
                    for a in s["attributes"].as_array().into_iter().flatten() {
                        let v = &a["value"];
                        let v = v
                            .get("stringValue")
                            .or_else(|| v.get("intValue"))
                            .or_else(|| v.get("boolValue"))
                            .or_else(|| v.get("doubleValue"))
                            .cloned()
                            .unwrap_or(Value::Null);
                        attrs.insert(a["key"].as_str().unwrap_or("").to_string(), v);
                    }
                    out.push((
                        s["name"].as_str().unwrap_or("").to_string(),
                        Value::Object(attrs),
                        s["traceId"].as_str().unwrap_or("").to_lowercase(),
                        s["parentSpanId"].as_str().unwrap_or("").to_lowercase(),
                    ));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_with_the_callers_trace() {
    let (base, got) = receiver().await;
    let m = ScriptedModel::start().await;
    m.push(
        "otel-model",
        Reply::tool_calls(&[("w1", "get_weather", "{}")]).with_usage(json!({
            "prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140,
            "prompt_tokens_details": {"cached_tokens": 60}
        })),
    );
    m.push("otel-model", Reply::text(&["It is ", "21 degrees."]));
    let apps = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(apps.path().join("weather")).unwrap();
    std::fs::write(
        apps.path().join("weather/root_agent.yaml"),
        format!(
            "name: forecaster\nmodel: openai/otel-model\nmodel_options:\n  base_url: {}\n\
             instruction: Report the weather.\ntools:\n  - name: HttpTool\n    args:\n\
             \x20     name: get_weather\n      url: {base}/weather\n\
             \x20     allow_private: [\"127.0.0.1\"]\n",
            m.base_url
        ),
    )
    .unwrap();
    let data = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .arg("serve")
        // Nothing routes here: no need to keep answering through a drain after SIGTERM.
        .args(["--drain-secs", "0"])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .arg("--database-url")
        .arg(format!("sqlite://{}/a.db", data.path().display()))
        .arg("--apps-dir")
        .arg(apps.path())
        .args(["--otlp-endpoint", &base, "--otlp-protocol", "http/json"])
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OPENAI_API_KEY", "test-key")
        .env("RUST_LOG", "agentd=warn")
        .kill_on_drop(true)
        .spawn()
        .expect("agentd starts");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(client.get(format!("{url}/health")).send().await, Ok(r) if r.status() == 200) {
        assert!(Instant::now() < deadline, "agentd never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let resp = client
        .post(format!("{url}/run"))
        .header("traceparent", format!("00-{TRACE_ID}-{PARENT}-01"))
        .json(
            &json!({"appName": "weather", "userId": "u1", "sessionId": "s1",
            "createSession": true,
            "newMessage": {"role": "user", "parts": [{"text": "Weather?"}]}}),
        )
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-agentd-run-id"]
        .to_str()
        .unwrap()
        .to_string();
    let body = resp.text().await.unwrap();
    assert!(body.contains("21 degrees"), "{body}");

    // SIGTERM: agentd drains and flushes its buffered spans before it exits.
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("agentd exits")
        .unwrap();
    assert!(status.success(), "{status}");

    let got = got.lock().unwrap();
    assert_eq!(
        got.requests,
        got.batches.len(),
        "every export is OTLP/JSON on /v1/traces"
    );
    let all = spans(&got.batches);
    let ours: Vec<_> = all.iter().filter(|(_, _, t, _)| t == TRACE_ID).collect();
    let names: Vec<&str> = ours.iter().map(|(n, _, _, _)| n.as_str()).collect();
    for expected in [
        "POST",
        "run",
        "invoke_agent forecaster",
        "chat otel-model",
        "execute_tool get_weather",
        "commit",
    ] {
        assert!(
            names.contains(&expected),
            "no {expected:?} span in {names:?}"
        );
    }
    // Every commit is in the trace: the user event's is admission's (`admit`, with its seq),
    // then the call, the tool's answer and the reply.
    let commits = names.iter().filter(|n| **n == "commit").count();
    assert_eq!(commits, 3, "{names:?}");
    // (One `admit` per attempt: the first may find no session and create it. OTLP/JSON
    // carries 64-bit integers as strings.)
    assert!(
        ours.iter()
            .any(|(n, a, _, _)| n == "admit" && a["seq"].to_string().trim_matches('"') == "1"),
        "{ours:#?}"
    );
    let http = ours.iter().find(|(n, _, _, _)| n == "POST").unwrap();
    assert_eq!(
        http.3, PARENT,
        "the request span's parent is the caller's span"
    );
    let run = ours.iter().find(|(n, _, _, _)| n == "run").unwrap();
    assert_eq!(run.1["run"], run_id);
    assert_eq!(run.1["session"], "s1");
    assert_eq!(run.1["user"], "u1");
    let chat = ours
        .iter()
        .find(|(n, _, _, _)| n == "chat otel-model")
        .unwrap();
    assert_eq!(chat.1["gen_ai.system"], "openai");
    assert_eq!(chat.1["gen_ai.request.model"], "otel-model");
    assert!(
        !chat.1["gen_ai.usage.input_tokens"].is_null(),
        "{:?}",
        chat.1
    );
    // The GenAI semantic conventions' usage: cached input is part of the input.
    let attr = |k: &str| chat.1[k].to_string().trim_matches('"').to_string();
    assert_eq!(attr("gen_ai.usage.input_tokens"), "100", "{:?}", chat.1);
    assert_eq!(attr("gen_ai.usage.output_tokens"), "40", "{:?}", chat.1);
    assert_eq!(
        attr("gen_ai.usage.cache_read.input_tokens"),
        "60",
        "{:?}",
        chat.1
    );
    let tool = ours
        .iter()
        .find(|(n, _, _, _)| n.starts_with("execute_tool"))
        .unwrap();
    assert_eq!(tool.1["gen_ai.tool.name"], "get_weather");

    // The trace goes on to the model and to the tool.
    let to_model = m.traceparents();
    assert_eq!(to_model.len(), 2);
    for tp in to_model {
        let tp = tp.expect("the model request carries a traceparent");
        assert!(tp.contains(TRACE_ID), "{tp}");
    }
    let to_tool = got.tool_traceparents.clone();
    assert_eq!(to_tool.len(), 1);
    assert!(
        to_tool[0].as_deref().unwrap_or("").contains(TRACE_ID),
        "{to_tool:?}"
    );
}

/// Without `--otlp-endpoint` (nor `OTEL_EXPORTER_OTLP_ENDPOINT`) nothing is exported, not
/// even to the OTLP default endpoint, and a `traceparent` is harmless. The collector listens
/// where an exporter with no endpoint of its own sends (`http://localhost:4318`), and only
/// after agentd's exit, which flushes whatever an exporter holds (as in the test above), is
/// the collector asked what it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoint_no_export() {
    // The OTLP/HTTP default port. IPv4 must be free; `localhost` may also resolve to ::1.
    let v4 = tokio::net::TcpListener::bind("127.0.0.1:4318")
        .await
        .unwrap_or_else(|e| {
            panic!(
                "this test listens on 127.0.0.1:4318, the OTLP default endpoint, and cannot \
                 ({e}): stop the collector (or other process) holding that port"
            )
        });
    let mut listeners = vec![v4];
    if let Ok(v6) = tokio::net::TcpListener::bind("[::1]:4318").await {
        listeners.push(v6);
    }
    let (_, got) = receiver_on(listeners);

    let data = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentd"));
    cmd.arg("serve")
        .args(["--drain-secs", "0"])
        .args(["--bind", &format!("127.0.0.1:{port}")])
        .arg("--database-url")
        .arg(format!("sqlite://{}/a.db", data.path().display()))
        .arg("--apps-dir")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config/apps"));
    // No OpenTelemetry setting from the environment this test runs in reaches agentd; the
    // only one given shortens the batch delay, as above (it names no endpoint).
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(&name);
        }
    }
    let mut child = cmd
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "agentd=warn")
        .kill_on_drop(true)
        .spawn()
        .expect("agentd starts");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(client.get(format!("{url}/health")).send().await, Ok(r) if r.status() == 200) {
        assert!(Instant::now() < deadline, "agentd never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A run (spans: request, run, agent, commits) under the caller's trace.
    let resp = client
        .post(format!("{url}/run"))
        .header("traceparent", format!("00-{TRACE_ID}-{PARENT}-01"))
        .json(
            &json!({"appName": "echo", "userId": "u1", "sessionId": "s1",
            "createSession": true,
            "newMessage": {"role": "user", "parts": [{"text": "trace me"}]}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    assert!(body.contains("event: done"), "{body}");
    assert!(body.contains("\"status\":\"completed\""), "{body}");

    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("agentd exits")
        .unwrap();
    assert!(status.success(), "{status}");

    let got = got.lock().unwrap();
    assert_eq!(
        got.requests, 0,
        "agentd exported without an endpoint: {:#?}",
        got.batches
    );
}
