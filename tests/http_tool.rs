//! `HttpTool` (YAML `HttpTool` declarations) against a real HTTP server on 127.0.0.1.

use agentd::tools::http::HttpTool;
use agentd::tools::Tool;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What every echo route answers: how the request arrived.
fn echo(
    method: &str,
    path: &str,
    query: Option<String>,
    headers: &HeaderMap,
    body: Value,
) -> Value {
    let header = |n: &str| {
        headers
            .get(n)
            .map(|v| Value::String(v.to_str().unwrap_or("").to_string()))
            .unwrap_or(Value::Null)
    };
    json!({
        "method": method,
        "path": path,
        "query": query,
        "authorization": header("authorization"),
        "x_api_key": header("x-api-key"),
        "content_type": header("content-type"),
        "body": body,
    })
}

/// The test API; the counter counts requests that reached it.
async fn server() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route(
            "/weather/{city}",
            get(
                |Path(city): Path<String>, RawQuery(q): RawQuery, h: HeaderMap| async move {
                    Json(echo("GET", &city, q, &h, Value::Null))
                },
            )
            .delete(
                |Path(city): Path<String>, RawQuery(q): RawQuery, h: HeaderMap| async move {
                    Json(echo("DELETE", &city, q, &h, Value::Null))
                },
            ),
        )
        .route(
            "/items/{id}",
            axum::routing::post(
                |Path(id): Path<String>,
                 RawQuery(q): RawQuery,
                 h: HeaderMap,
                 Json(b): Json<Value>| async move { Json(echo("POST", &id, q, &h, b)) },
            )
            .put(
                |Path(id): Path<String>,
                 RawQuery(q): RawQuery,
                 h: HeaderMap,
                 Json(b): Json<Value>| async move { Json(echo("PUT", &id, q, &h, b)) },
            ),
        )
        .route("/list", get(|| async { Json(json!([1, 2, 3])) }))
        .route("/text", get(|| async { "plain words" }))
        .route("/big", get(|| async { "é".repeat(5000) }))
        .route(
            "/image",
            get(|| async {
                (
                    [("content-type", "image/png")],
                    vec![0x89u8, b'P', b'N', b'G'],
                )
            }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "no such thing here") }),
        )
        .route(
            "/broken",
            get(|| async {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Json(json!({"error": "database down"})),
                )
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route(
            "/empty",
            get(|| async { StatusCode::NO_CONTENT.into_response() }),
        )
        .layer(axum::middleware::from_fn_with_state(
            hits.clone(),
            |State(hits): State<Arc<AtomicUsize>>,
             req: axum::extract::Request,
             next: axum::middleware::Next| async move {
                hits.fetch_add(1, Ordering::SeqCst);
                next.run(req).await
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://127.0.0.1:{port}"), hits)
}

/// A tool allowed to reach the test server on 127.0.0.1 (tools reach only public addresses
/// unless `allow_private` says otherwise).
fn tool(mut config: Value) -> HttpTool {
    if config.get("allow_private").is_none() {
        config["allow_private"] = json!(["127.0.0.1"]);
    }
    HttpTool::from_config(config).expect("valid config")
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

fn weather_params() -> Value {
    json!({"type": "object",
        "properties": {"city": {"type": "string"}, "units": {"type": "string"},
                       "days": {"type": "integer"}, "tags": {"type": "array"}},
        "required": ["city"]})
}

#[tokio::test]
async fn get_with_placeholder_and_query() {
    let (base, _) = server().await;
    let t = tool(json!({
        "name": "get_weather", "description": "Current weather for a city.",
        "url": format!("{base}/weather/{{city}}?fixed=1"),
        "parameters": weather_params(),
    }));
    assert_eq!(t.name(), "get_weather");
    let decl = t.declaration();
    assert_eq!(decl.description, "Current weather for a city.");
    assert_eq!(decl.parameters.unwrap()["required"], json!(["city"]));

    let out = t
        .execute(&args(
            json!({"city": "São Paulo/Centro", "units": "metric", "days": 3,
                               "tags": ["a", "b c"]}),
        ))
        .await
        .expect("call");
    assert_eq!(out["method"], "GET");
    // The whole value is one path segment, escaped on the wire and decoded by the server.
    assert_eq!(out["path"], "São Paulo/Centro");
    assert_eq!(out["query"], "fixed=1&days=3&tags=a&tags=b+c&units=metric");
    assert_eq!(out["body"], Value::Null);

    // DELETE also sends its arguments in the query string.
    let del = tool(json!({"name": "forget", "method": "delete",
        "url": format!("{base}/weather/{{city}}"), "parameters": weather_params()}));
    let out = del
        .execute(&args(json!({"city": "Oslo", "units": "si"})))
        .await
        .unwrap();
    assert_eq!(out["method"], "DELETE");
    assert_eq!(out["query"], "units=si");
}

#[tokio::test]
async fn bad_arguments_send_nothing() {
    let (base, hits) = server().await;
    let t = tool(
        json!({"name": "w", "url": format!("{base}/weather/{{city}}"),
        "parameters": weather_params()}),
    );

    let e = t.execute(&args(json!({"units": "x"}))).await.unwrap_err();
    assert_eq!(e.0, "missing required argument `city`");
    let e = t.execute(&args(json!({"city": null}))).await.unwrap_err();
    assert_eq!(e.0, "missing required argument `city`");
    let e = t
        .execute(&args(json!({"city": "x", "admin": true})))
        .await
        .unwrap_err();
    assert!(e.0.starts_with("unknown argument `admin`"), "{e}");
    let e = t.execute(&args(json!({"city": ".."}))).await.unwrap_err();
    assert!(e.0.contains("may not be `..`"), "{e}");
    let e = t
        .execute(&args(json!({"city": {"a": 1}})))
        .await
        .unwrap_err();
    assert!(e.0.contains("must be a string, number or boolean"), "{e}");

    // A placeholder is required even when `required` does not list it.
    let t = tool(
        json!({"name": "w", "url": format!("{base}/weather/{{units}}"),
        "parameters": weather_params()}),
    );
    let e = t.execute(&args(json!({"city": "x"}))).await.unwrap_err();
    assert_eq!(e.0, "missing required argument `units`");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn post_and_put_send_a_json_body() {
    let (base, _) = server().await;
    let params = json!({"type": "object", "properties": {
        "id": {"type": "string"}, "title": {"type": "string"}, "done": {"type": "boolean"},
        "meta": {"type": "object"}}});
    let post = tool(json!({"name": "create_item", "method": "POST",
        "url": format!("{base}/items/{{id}}"), "parameters": params}));
    let out = post
        .execute(&args(
            json!({"id": "a1", "title": "Write tests", "done": false,
                               "meta": {"k": [1, 2]}}),
        ))
        .await
        .expect("post");
    assert_eq!(out["method"], "POST");
    assert_eq!(out["path"], "a1");
    assert_eq!(out["query"], Value::Null);
    assert_eq!(out["content_type"], "application/json");
    assert_eq!(
        out["body"],
        json!({"title": "Write tests", "done": false, "meta": {"k": [1, 2]}})
    );

    let put = tool(json!({"name": "update_item", "method": "PUT",
        "url": format!("{base}/items/{{id}}"), "parameters": params}));
    let out = put.execute(&args(json!({"id": "a1"}))).await.expect("put");
    assert_eq!(out["method"], "PUT");
    assert_eq!(out["body"], json!({}));
}

#[tokio::test]
async fn env_vars_in_headers_and_url() {
    let (base, hits) = server().await;
    std::env::set_var("AGENTD_HTTP_TOOL_TEST_TOKEN", "s3cret-token");
    std::env::set_var("AGENTD_HTTP_TOOL_TEST_KEY", "k3y");
    let t = tool(json!({
        "name": "w",
        "url": format!("{base}/weather/{{city}}?key=${{AGENTD_HTTP_TOOL_TEST_KEY}}"),
        "headers": {"Authorization": "Bearer ${AGENTD_HTTP_TOOL_TEST_TOKEN}",
                    "X-Api-Key": "plain"},
        "parameters": weather_params(),
    }));
    let out = t
        .execute(&args(json!({"city": "Rome"})))
        .await
        .expect("call");
    assert_eq!(out["authorization"], "Bearer s3cret-token");
    assert_eq!(out["x_api_key"], "plain");
    assert_eq!(out["query"], "key=k3y");

    // An error shows the URL with ${VAR} unexpanded and no header values.
    let missing = tool(json!({
        "name": "m",
        "url": format!("{base}/missing?key=${{AGENTD_HTTP_TOOL_TEST_KEY}}"),
        "headers": {"Authorization": "Bearer ${AGENTD_HTTP_TOOL_TEST_TOKEN}"},
    }));
    let e = missing.execute(&Map::new()).await.unwrap_err();
    assert!(e.0.contains("key=${AGENTD_HTTP_TOOL_TEST_KEY}"), "{e}");
    assert!(!e.0.contains("k3y") && !e.0.contains("s3cret"), "{e}");

    // A variable that is not set: the tool loads, a call names the variable and sends nothing.
    let before = hits.load(Ordering::SeqCst);
    let unset = tool(json!({
        "name": "u", "url": format!("{base}/text"),
        "headers": {"Authorization": "Bearer ${AGENTD_HTTP_TOOL_TEST_NEVER_SET}"},
    }));
    let e = unset.execute(&Map::new()).await.unwrap_err();
    assert_eq!(
        e.0,
        "environment variable AGENTD_HTTP_TOOL_TEST_NEVER_SET is not set (HTTP tool u needs \
         it for args.headers.Authorization)"
    );
    assert_eq!(hits.load(Ordering::SeqCst), before);
}

#[tokio::test]
async fn error_statuses_are_tool_errors() {
    let (base, _) = server().await;
    let e = tool(json!({"name": "m", "url": format!("{base}/missing")}))
        .execute(&Map::new())
        .await
        .unwrap_err();
    assert_eq!(
        e.0,
        format!("HTTP 404 from GET {base}/missing: no such thing here")
    );

    let e = tool(json!({"name": "b", "url": format!("{base}/broken")}))
        .execute(&Map::new())
        .await
        .unwrap_err();
    assert_eq!(
        e.0,
        format!(r#"HTTP 500 from GET {base}/broken: {{"error":"database down"}}"#)
    );

    // Nothing listening.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = tool(json!({"name": "d", "url": format!("http://127.0.0.1:{port}/x")}))
        .execute(&Map::new())
        .await
        .unwrap_err();
    assert!(
        e.0.starts_with(&format!("GET http://127.0.0.1:{port}/x could not connect")),
        "{e}"
    );
}

#[tokio::test]
async fn response_shapes() {
    let (base, _) = server().await;
    let call = |path: &str, extra: Value| {
        let mut config = json!({"name": "r", "url": format!("{base}{path}")});
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            config[k] = v;
        }
        async move { tool(config).execute(&Map::new()).await }
    };

    assert_eq!(
        call("/list", json!({})).await.unwrap(),
        json!({"result": [1, 2, 3]})
    );
    assert_eq!(
        call("/text", json!({})).await.unwrap(),
        json!({"status": 200, "body": "plain words"})
    );
    assert_eq!(
        call("/empty", json!({})).await.unwrap(),
        json!({"status": 204, "body": ""})
    );
    let image = call("/image", json!({})).await.unwrap();
    assert_eq!(image["content_type"], "image/png");
    assert_eq!(image["size_bytes"], 4);

    // Cut at max_response_bytes, never inside a character.
    let big = call("/big", json!({"max_response_bytes": 101}))
        .await
        .unwrap();
    assert_eq!(big["truncated"], true);
    assert_eq!(big["body"].as_str().unwrap(), "é".repeat(50));
}

#[tokio::test]
async fn timeout_is_a_tool_error() {
    let (base, _) = server().await;
    let t = tool(json!({"name": "slow", "url": format!("{base}/slow"), "timeout_secs": 0.3}));
    let started = std::time::Instant::now();
    let e = t.execute(&Map::new()).await.unwrap_err();
    assert_eq!(e.0, format!("GET {base}/slow timed out after 0.3 s"));
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn config_is_checked_at_load() {
    let e = HttpTool::from_config(json!({"name": "x"})).unwrap_err();
    assert_eq!(e, "args: missing field `url`");
    let e = HttpTool::from_config(json!({"name": "x", "url": "https://h/{a}"})).unwrap_err();
    assert_eq!(
        e,
        "args.url: placeholder {a} is not declared in args.parameters.properties"
    );
    let e = HttpTool::from_config(json!({"name": "x", "url": "https://h/", "method": "HEAD"}))
        .unwrap_err();
    assert!(e.starts_with("args.method:"), "{e}");
    let e = HttpTool::from_config(json!({"name": "9x", "url": "https://h/"})).unwrap_err();
    assert!(e.starts_with("args.name:"), "{e}");
    let e = HttpTool::from_config(json!({"name": "x", "url": "file:///etc/passwd"})).unwrap_err();
    assert!(e.starts_with("args.url:"), "{e}");
    let e = HttpTool::from_config(json!({"name": "x", "url": "https://h/",
        "headers": {"A": "${UNCLOSED"}}))
    .unwrap_err();
    assert!(e.starts_with("args.headers.A:"), "{e}");
}

/// Server-side request forgery: by default a tool reaches public addresses only. Loopback (by
/// IP or by a name that resolves to it) and the cloud metadata address are refused, nothing
/// is sent, and the error (what the model sees) says the target is not public and how to
/// allow it, without naming what a host resolved to.
#[tokio::test]
async fn private_targets_are_refused_unless_allow_listed() {
    let (base, hits) = server().await;
    let port = base.rsplit(':').next().unwrap().to_string();
    let targets = [
        (format!("http://127.0.0.1:{port}/weather/x"), "loopback"),
        (format!("http://localhost:{port}/weather/x"), "loopback"),
        (format!("http://[::1]:{port}/weather/x"), "loopback"),
        (
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "link-local",
        ),
        ("http://10.0.0.1:81/".to_string(), "private"),
    ];
    for (url, rule) in targets {
        let t = HttpTool::from_config(json!({"name": "t", "url": url})).expect("config");
        let e = t.execute(&Map::new()).await.unwrap_err();
        // The refusal says that the target is not public, not what the host resolved to nor
        // which kind of address that is (that would map internal names): those go to the log.
        assert!(e.0.contains("not a public address"), "{url}: {e}");
        if url.contains("localhost") {
            assert!(
                !e.0.contains("127.0.0.1") && !e.0.contains(rule),
                "{url}: {e}"
            );
        }
        assert!(
            e.0.contains("allow_private"),
            "{url}: the error says how to allow it: {e}"
        );
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "nothing reached the local server"
    );

    // Allow-listed by address, and by host name: the call goes through.
    for allow in [
        json!(["127.0.0.1"]),
        json!(["localhost"]),
        json!(["127.0.0.0/8"]),
    ] {
        let host = if allow[0] == "localhost" {
            "localhost"
        } else {
            "127.0.0.1"
        };
        let t = HttpTool::from_config(json!({"name": "t",
            "url": format!("http://{host}:{port}/weather/x"), "allow_private": allow}))
        .expect("config");
        t.execute(&Map::new()).await.expect("allowed target");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 3);

    let e = HttpTool::from_config(json!({"name": "t", "url": "http://h/",
        "allow_private": ["10.0.0.0/40"]}))
    .unwrap_err();
    assert!(e.contains("allow_private"), "{e}");
}
