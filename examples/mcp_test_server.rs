//! A tiny MCP server (rmcp, the official Rust SDK) for agentd's MCP toolset tests: it speaks
//! MCP over stdio when run, and `tests/mcp_tools.rs` also hosts [`TestServer`] over
//! streamable HTTP in process.
//!
//! Tools: `add(a, b)` (structured result), `echo(text)` (text result), `fail()` (`isError`),
//! `pid()` (this process's id), `env(name)` (an environment variable or `<unset>`),
//! `sleep(ms)`.
//!
//! ```text
//! cargo run --example mcp_test_server   # then speak JSON-RPC on stdin/stdout
//! ```

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};

/// The test server's tools.
#[derive(Clone, Default)]
pub struct TestServer;

fn schema(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("schemas are objects"),
    }
}

impl TestServer {
    pub fn tools() -> Vec<Tool> {
        vec![
            Tool::new(
                "add",
                "Adds two numbers.",
                schema(json!({"type": "object",
                    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                    "required": ["a", "b"]})),
            )
            .annotate(ToolAnnotations::new().read_only(true)),
            Tool::new(
                "echo",
                "Echoes the text.",
                schema(json!({"type": "object", "properties": {"text": {"type": "string"}}})),
            ),
            Tool::new("fail", "Always fails.", schema(json!({"type": "object"}))),
            Tool::new(
                "pid",
                "The server's process id.",
                schema(json!({"type": "object"})),
            ),
            Tool::new(
                "env",
                "An environment variable of the server.",
                schema(json!({"type": "object", "properties": {"name": {"type": "string"}}})),
            ),
            Tool::new(
                "sleep",
                "Sleeps, then answers.",
                schema(json!({"type": "object", "properties": {"ms": {"type": "integer"}}})),
            ),
        ]
    }

    pub fn call(
        name: &str,
        args: &serde_json::Map<String, Value>,
    ) -> Result<CallToolResult, ErrorData> {
        let text = |s: String| CallToolResult::success(vec![ContentBlock::text(s)]);
        match name {
            "add" => {
                let n = |k: &str| {
                    args.get(k).and_then(Value::as_f64).ok_or_else(|| {
                        ErrorData::invalid_params(format!("`{k}` must be a number"), None)
                    })
                };
                Ok(CallToolResult::structured(
                    json!({"sum": n("a")? + n("b")?}),
                ))
            }
            "echo" => Ok(text(
                args.get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            )),
            "fail" => Ok(CallToolResult::error(vec![ContentBlock::text(
                "it failed on purpose",
            )])),
            "pid" => Ok(text(std::process::id().to_string())),
            "env" => {
                let var = args.get("name").and_then(Value::as_str).unwrap_or("");
                Ok(text(
                    std::env::var(var).unwrap_or_else(|_| "<unset>".into()),
                ))
            }
            other => Err(ErrorData::invalid_params(
                format!("no tool named {other}"),
                None,
            )),
        }
    }
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(Self::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        if request.name == "sleep" {
            let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            return Ok(CallToolResult::success(vec![ContentBlock::text("slept")]).into());
        }
        Self::call(&request.name, &args).map(Into::into)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    eprintln!("mcp_test_server: ready on stdio");
    let service = TestServer.serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    eprintln!("mcp_test_server: stdin closed, exiting");
    Ok(())
}
