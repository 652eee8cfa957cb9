//! MCP toolsets against real MCP servers built with rmcp (the official Rust SDK): the
//! `mcp_test_server` example as a stdio child process, and the same server hosted over
//! streamable HTTP on 127.0.0.1 in this process.

#[allow(dead_code)]
#[path = "../examples/mcp_test_server.rs"]
mod test_server;

use agentd::tools::mcp::{McpTool, McpToolset};
use agentd::tools::{Tool, Toolset};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The `mcp_test_server` example, built on first use (`cargo test --test mcp_tools` does not
/// build examples; the nested build is a no-op once it is up to date).
fn server_exe() -> &'static str {
    static EXE: OnceLock<String> = OnceLock::new();
    EXE.get_or_init(|| {
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "--example",
            "mcp_test_server",
            "--message-format=json-render-diagnostics",
            "--manifest-path",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        // What `cargo test` sets for this process is not the nested build's business: a
        // build script that reads e.g. CARGO_MANIFEST_DIR would see it changed and rebuild
        // (ring, then everything above it), here and again in the next outer build.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key == "CARGO_MANIFEST_DIR"
                || key == "CARGO_MANIFEST_PATH"
                || key == "CARGO_CRATE_NAME"
                || key == "CARGO_PRIMARY_PACKAGE"
                || key == "CARGO_TARGET_TMPDIR"
                || key == "OUT_DIR"
                || key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_BIN_")
            {
                cmd.env_remove(&*key);
            }
        }
        let out = cmd
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run cargo");
        assert!(
            out.status.success(),
            "building the mcp_test_server example failed"
        );
        let exe = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| {
                m["reason"] == "compiler-artifact" && m["target"]["name"] == "mcp_test_server"
            })
            .find_map(|m| m["executable"].as_str().map(str::to_string))
            .expect("cargo names the example's executable");
        assert!(PathBuf::from(&exe).exists(), "{exe} missing");
        exe
    })
}

fn stdio_set(extra: Value) -> McpToolset {
    let mut args = json!({"stdio_server_params": {"command": server_exe()}});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        args[k] = v;
    }
    McpToolset::from_config(args).expect("config")
}

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("object")
}

async fn tool(set: &McpToolset, name: &str) -> Arc<McpTool> {
    set.mcp_tools()
        .await
        .expect("list tools")
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no tool {name}"))
}

/// The error of listing the tools (which must fail).
async fn list_err(set: &McpToolset) -> agentd::tools::ToolError {
    match set.list_tools().await {
        Ok(tools) => panic!("listed {} tools", tools.len()),
        Err(e) => e,
    }
}

async fn pid_of(set: &McpToolset) -> u32 {
    let out = tool(set, "pid")
        .await
        .execute(&Map::new())
        .await
        .expect("pid");
    out["result"]
        .as_str()
        .expect("text")
        .parse()
        .expect("a pid")
}

/// Whether the process has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_ended(pid: u32) -> bool {
    for _ in 0..100 {
        if ended(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn stdio_lists_and_calls_tools() {
    let set = stdio_set(json!({}));
    assert!(set.name().starts_with("mcp:") && set.name().contains("mcp_test_server"));

    let tools = set.list_tools().await.expect("list");
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(names, ["add", "echo", "env", "fail", "pid", "sleep"]);
    let add = tools[0].declaration();
    assert_eq!(add.description, "Adds two numbers.");
    let params = add.parameters.expect("schema");
    assert_eq!(params["properties"]["a"]["type"], "number");
    assert_eq!(params["required"], json!(["a", "b"]));

    // structuredContent is the result as it is.
    let sum = tool(&set, "add")
        .await
        .execute(&obj(json!({"a": 2, "b": 3.5})))
        .await
        .expect("add");
    assert_eq!(sum, json!({"sum": 5.5}));

    // Text contents become {"result": text}.
    let echoed = tool(&set, "echo")
        .await
        .execute(&obj(json!({"text": "héllo"})))
        .await
        .expect("echo");
    assert_eq!(echoed, json!({"result": "héllo"}));

    // isError: true is a tool error carrying the text.
    let failed = tool(&set, "fail").await.execute(&Map::new()).await;
    assert_eq!(failed.unwrap_err().0, "it failed on purpose");

    // A JSON-RPC error (bad arguments) is a tool error too, not a broken connection.
    let bad = tool(&set, "add")
        .await
        .execute(&obj(json!({"a": 1})))
        .await
        .unwrap_err();
    assert!(bad.0.contains("`b` must be a number"), "{bad}");
    assert_eq!(pid_of(&set).await, pid_of(&set).await, "one server process");

    set.close().await;
}

#[tokio::test]
async fn stdio_filter_and_prefix() {
    let set =
        stdio_set(json!({"tool_filter": ["add", "fail", "nope"], "tool_name_prefix": "calc"}));
    let tools = set.mcp_tools().await.expect("list");
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(names, ["calc_add", "calc_fail"]);
    assert_eq!(tools[0].mcp_name(), "add");
    assert_eq!(tools[0].declaration().name, "calc_add");
    let sum = tools[0]
        .execute(&obj(json!({"a": 1, "b": 1})))
        .await
        .expect("calc_add");
    assert_eq!(sum, json!({"sum": 2.0}));
    set.close().await;

    // A prefix that already ends in `_` is not doubled.
    let set = stdio_set(json!({"tool_filter": ["echo"], "tool_name_prefix": "t_"}));
    let tools = set.list_tools().await.expect("list");
    assert_eq!(tools[0].name(), "t_echo");
    set.close().await;
}

#[tokio::test]
async fn stdio_env_is_explicit() {
    std::env::set_var("AGENTD_MCP_TEST_PARENT_ONLY", "secret");
    std::env::set_var("AGENTD_MCP_TEST_SOURCE", "from-parent");
    let set = McpToolset::from_config(json!({
        "stdio_server_params": {"command": server_exe(),
            "env": {"GIVEN": "value ${AGENTD_MCP_TEST_SOURCE}"}}
    }))
    .unwrap();
    let env = tool(&set, "env").await;
    let get = |name: &'static str| {
        let env = env.clone();
        async move {
            env.execute(&obj(json!({"name": name}))).await.expect("env")["result"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    assert_eq!(get("GIVEN").await, "value from-parent");
    assert_eq!(get("AGENTD_MCP_TEST_PARENT_ONLY").await, "<unset>");
    assert_ne!(get("PATH").await, "<unset>");
    set.close().await;

    // A missing variable fails the connection with its name, not at load.
    let set = McpToolset::from_config(json!({
        "stdio_server_params": {"command": server_exe(),
            "env": {"K": "${AGENTD_MCP_TEST_NEVER_SET}"}}
    }))
    .expect("loads without the variable");
    let e = list_err(&set).await;
    eprintln!("{}", e);
    assert!(e.0.contains("AGENTD_MCP_TEST_NEVER_SET"), "{e}");
}

#[tokio::test]
async fn stdio_close_ends_the_server() {
    let set = stdio_set(json!({}));
    let pid = pid_of(&set).await;
    assert!(!ended(pid));
    set.close().await;
    assert!(
        wait_ended(pid).await,
        "server {pid} still running after close()"
    );
    let e = list_err(&set).await;
    eprintln!("{}", e);
    assert!(e.0.contains("closed"), "{e}");
}

#[tokio::test]
async fn stdio_reconnects_after_the_server_dies() {
    let set = stdio_set(json!({}));
    let add = tool(&set, "add").await;
    let pid = pid_of(&set).await;
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    assert!(wait_ended(pid).await);

    // A tool listed before the crash works on the new connection (`add` is read-only,
    // so even a call that raced the crash may be repeated).
    let sum = add
        .execute(&obj(json!({"a": 1, "b": 2})))
        .await
        .expect("add after crash");
    assert_eq!(sum, json!({"sum": 3.0}));
    let new_pid = pid_of(&set).await;
    assert_ne!(new_pid, pid);
    assert_eq!(set.list_tools().await.expect("relist").len(), 6);
    set.close().await;
    assert!(wait_ended(new_pid).await);
}

#[tokio::test]
async fn stdio_server_that_cannot_start() {
    // Loading never starts anything; the failure shows when the tools are listed.
    let set = McpToolset::from_config(json!({
        "stdio_server_params": {"command": "/nonexistent/agentd-mcp-server"}
    }))
    .unwrap();
    let e = list_err(&set).await;
    eprintln!("{}", e);
    assert!(
        e.0.contains("cannot start `/nonexistent/agentd-mcp-server`"),
        "{e}"
    );

    // A server that dies at once: its stderr is quoted.
    let set = McpToolset::from_config(json!({
        "stdio_connection_params": {
            "server_params": {"command": "sh", "args": ["-c", "echo 'no config found' >&2; exit 3"]},
            "timeout": 10
        }
    }))
    .unwrap();
    let e = list_err(&set).await;
    eprintln!("{}", e);
    assert!(
        e.0.contains("did not start") && e.0.contains("no config found"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------
// Streamable HTTP

const TOKEN_VAR: &str = "AGENTD_MCP_TEST_HTTP_TOKEN";
const TOKEN: &str = "t0ken-for-tests";

/// The test server over streamable HTTP at `http://127.0.0.1:<port>/mcp`, behind a bearer
/// token check.
async fn http_server() -> String {
    let service = StreamableHttpService::new(
        || Ok(test_server::TestServer),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(
            |req: axum::extract::Request, next: axum::middleware::Next| async move {
                let ok = req
                    .headers()
                    .get("authorization")
                    .is_some_and(|v| v.as_bytes() == format!("Bearer {TOKEN}").as_bytes());
                if ok {
                    next.run(req).await
                } else {
                    axum::http::StatusCode::UNAUTHORIZED.into_response()
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://127.0.0.1:{port}/mcp")
}

use axum::response::IntoResponse;

fn http_set(url: &str, extra: Value) -> McpToolset {
    let mut args = json!({"streamable_http_connection_params": {
        "url": url, "headers": {"Authorization": format!("Bearer ${{{TOKEN_VAR}}}")},
        "allow_private": ["127.0.0.1"]
    }});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        if k == "sse_read_timeout" {
            args["streamable_http_connection_params"][k] = v;
        } else {
            args[k] = v;
        }
    }
    McpToolset::from_config(args).expect("config")
}

#[tokio::test]
async fn http_lists_and_calls_tools() {
    std::env::set_var(TOKEN_VAR, TOKEN);
    let url = http_server().await;
    let set = http_set(&url, json!({"tool_name_prefix": "srv"}));
    assert_eq!(set.name(), format!("mcp:{url}"));

    let tools = set.mcp_tools().await.expect("list");
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(
        names,
        [
            "srv_add",
            "srv_echo",
            "srv_env",
            "srv_fail",
            "srv_pid",
            "srv_sleep"
        ]
    );
    let sum = tools[0]
        .execute(&obj(json!({"a": 40, "b": 2})))
        .await
        .expect("add");
    assert_eq!(sum, json!({"sum": 42.0}));
    let echoed = tools[1]
        .execute(&obj(json!({"text": "over http"})))
        .await
        .expect("echo");
    assert_eq!(echoed, json!({"result": "over http"}));
    let failed = tools[3].execute(&Map::new()).await.unwrap_err();
    eprintln!("{}", failed);
    assert_eq!(failed.0, "it failed on purpose");

    set.close().await;
    assert!(list_err(&set).await.0.contains("closed"));
}

#[tokio::test]
async fn http_auth_and_failures() {
    std::env::set_var(TOKEN_VAR, TOKEN);
    let url = http_server().await;

    // A wrong token: the server's 401 is a clear error.
    let set = McpToolset::from_config(json!({"streamable_http_connection_params": {
        "url": url, "headers": {"Authorization": "Bearer wrong"},
        "allow_private": ["127.0.0.1"]}}))
    .unwrap();
    let e = list_err(&set).await;
    eprintln!("{}", e);
    assert!(e.0.contains("cannot connect to the MCP server"), "{e}");
    assert!(
        !e.0.contains("wrong"),
        "header values stay out of errors: {e}"
    );

    // A header variable that is not set: named, and nothing is sent.
    let set = McpToolset::from_config(json!({"streamable_http_connection_params": {
        "url": url, "headers": {"Authorization": "Bearer ${AGENTD_MCP_TEST_UNSET_TOKEN}"},
        "allow_private": ["127.0.0.1"]}}))
    .expect("loads without the variable");
    let e = list_err(&set).await;
    eprintln!("{}", e);
    assert!(e.0.contains("AGENTD_MCP_TEST_UNSET_TOKEN"), "{e}");

    // Nothing listening: the app loaded; listing fails with the URL.
    let dead = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        format!("http://127.0.0.1:{port}/mcp")
    };
    let set = McpToolset::from_config(json!({"streamable_http_connection_params": {
        "url": dead, "timeout": 5, "allow_private": ["127.0.0.1"]}}))
    .unwrap();
    let e = list_err(&set).await;
    eprintln!("{}", e);
    assert!(e.0.contains(&dead), "{e}");

    // A call slower than sse_read_timeout is a tool error.
    let set = http_set(&url, json!({"sse_read_timeout": 0.5}));
    let sleep = tool(&set, "sleep").await;
    let e = sleep.execute(&obj(json!({"ms": 3000}))).await.unwrap_err();
    eprintln!("{}", e);
    assert!(e.0.contains("did not answer within 0.5 s"), "{e}");
    // The connection still works afterwards.
    let ok = tool(&set, "sleep")
        .await
        .execute(&obj(json!({"ms": 1})))
        .await
        .expect("sleep");
    assert_eq!(ok, json!({"result": "slept"}));
    set.close().await;
}

/// A tool result is stored in an event and sent to the model with every later turn: text
/// over 1 MiB is cut and marked.
#[tokio::test]
async fn oversize_results_are_cut() {
    std::env::set_var(TOKEN_VAR, TOKEN);
    let url = http_server().await;
    let set = http_set(&url, json!({}));
    let tools = set.mcp_tools().await.expect("list");
    let echo = tools
        .iter()
        .find(|t| t.name() == "echo")
        .expect("echo tool");
    let big = "é".repeat(1024 * 1024);
    let out = echo
        .execute(&obj(json!({ "text": big })))
        .await
        .expect("echo");
    assert_eq!(out["truncated"], true);
    let text = out["result"].as_str().unwrap();
    assert!(
        text.len() <= 1024 * 1024 && text.len() > 1024 * 1024 - 4,
        "{}",
        text.len()
    );
    set.close().await;
}
