//! MCP toolsets: the tools of a Model Context Protocol server, over stdio (a child process)
//! or streamable HTTP, through the official Rust SDK (`rmcp`).
//!
//! ```yaml
//! tools:
//!   - name: McpToolset
//!     args:
//!       stdio_server_params: {command: npx, args: ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"], env: {K: V}}
//!       # or stdio_connection_params: {server_params: {command: …}, timeout: 30}
//!       # or streamable_http_connection_params: {url: "http://127.0.0.1:8931/mcp", headers: {Authorization: "Bearer ${TOKEN}"}}
//!       tool_filter: [read_file, list_directory]   # optional allow-list (server names)
//!       tool_name_prefix: fs                       # optional: tools become fs_read_file, …
//! ```
//!
//! The shape is ADK's `McpToolsetConfig`. Like ADK (and the MCP SDKs' stdio clients), a
//! stdio server does not inherit the daemon's whole environment, only `HOME`, `LOGNAME`,
//! `PATH`, `SHELL`, `TERM` and `USER`, plus its `env` (values may use `${VAR}`). Header
//! values may use `${VAR}` too; both are read when connecting, so an app loads without them.
//!
//! The server is connected on first use, not at load, so an app whose server is down still
//! loads; the failure becomes the step's error. The tool list is cached (until the server
//! says it changed, `tool_list_cache_ttl_seconds` passes, or the connection is replaced). A
//! broken connection is replaced once per operation: listing retries after reconnecting; a
//! call retries only when it cannot have reached the server (or the tool is annotated
//! read-only or idempotent). An MCP result becomes `structuredContent` when the server
//! sent it, else `{"result": "<text contents>"}`; `isError: true` becomes a tool error.
//!
//! Timeouts: connecting and listing take at most `timeout` of the connection params (30 s
//! when not given). A call takes at most `sse_read_timeout` over HTTP (300 s when not
//! given); over stdio, `stdio_connection_params.timeout` bounds calls too, as in ADK, and
//! `stdio_server_params` calls get 300 s. A stdio server's stderr is logged (target
//! `agentd::mcp`) and its last lines are quoted when it fails to start.

mod config;
mod session;
mod tool;

use config::*;
use session::*;
pub use tool::McpTool;

use super::egress::{EgressPolicy, McpResolver};
use super::http::{check_env_refs, expand_env};
use super::{Tool, ToolContext, ToolError, ToolResult, Toolset};
use crate::event::JsonMap;
use crate::invocation::InvocationContext;
use async_trait::async_trait;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ContentBlock, Implementation, ResourceContents,
};
use rmcp::service::{ClientInitializeError, NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

// ---------------------------------------------------------------------------------------
// The toolset

/// An MCP server's tools (see the module docs).
pub struct McpToolset {
    inner: Arc<Inner>,
}

struct Inner {
    /// `mcp:<command and args>` or `mcp:<url>`.
    label: String,
    connection: Connection,
    filter: Option<BTreeSet<String>>,
    prefix: Option<String>,
    connect_timeout: Duration,
    call_timeout: Duration,
    cache_ttl: Option<Duration>,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    session: Option<Session>,
    /// The tools of `session`, as listed at the given time.
    tools: Option<(Vec<Arc<McpTool>>, Instant)>,
    /// Counts sessions, so a failing call replaces only the session it used.
    generation: u64,
    closed: bool,
}

struct Session {
    service: RunningService<RoleClient, Handler>,
    generation: u64,
    /// Set when the server announces `notifications/tools/list_changed`.
    tools_changed: Arc<AtomicBool>,
}

impl Session {
    fn is_alive(&self) -> bool {
        !self.service.is_closed() && !self.service.peer().is_transport_closed()
    }
}

/// The client side of the connection: who we are, and list-changed notifications.
struct Handler {
    config: ClientConfig,
    tools_changed: Arc<AtomicBool>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.store(true, Ordering::Relaxed);
    }
}

impl McpToolset {
    /// Builds the toolset from its YAML `args` (as JSON). Nothing is started or connected
    /// until the tools are first listed.
    pub fn from_config(args: Value) -> Result<Self, String> {
        let c: McpToolsetConfig = super::config_args(args)?;

        let given = [
            c.stdio_server_params.is_some(),
            c.stdio_connection_params.is_some(),
            c.sse_connection_params.is_some(),
            c.streamable_http_connection_params.is_some(),
        ]
        .iter()
        .filter(|x| **x)
        .count();
        if given != 1 {
            return Err(
                "args: exactly one of stdio_server_params, stdio_connection_params, \
                 sse_connection_params, streamable_http_connection_params must be set"
                    .into(),
            );
        }
        if c.sse_connection_params.is_some() {
            return Err(
                "args.sse_connection_params: the legacy HTTP+SSE transport is not \
                 supported; use streamable_http_connection_params"
                    .into(),
            );
        }
        for (field, set) in [
            ("auth_scheme", c.auth_scheme.is_some()),
            ("auth_credential", c.auth_credential.is_some()),
            ("credential_key", c.credential_key.is_some()),
        ] {
            if set {
                return Err(format!(
                    "args.{field}: not supported; put credentials in \
                     streamable_http_connection_params.headers (with ${{VAR}}) or the stdio \
                     server's env"
                ));
            }
        }
        if c.use_mcp_resources {
            return Err("args.use_mcp_resources: MCP resources are not supported".into());
        }

        let mut connect_timeout = seconds("timeout", None, DEFAULT_CONNECT_TIMEOUT_SECS)?;
        let mut call_timeout = seconds("timeout", None, DEFAULT_CALL_TIMEOUT_SECS)?;
        let (connection, label) = if let Some(p) = c.streamable_http_connection_params {
            let field = "args.streamable_http_connection_params";
            let url = reqwest::Url::parse(&p.url).map_err(|e| format!("{field}.url: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
                return Err(format!("{field}.url: must be an http:// or https:// URL"));
            }
            let mut headers = Vec::new();
            for (name, value) in p.headers.unwrap_or_default() {
                let header = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("{field}.headers.{name}: not a valid header name"))?;
                if RESERVED_HEADERS.contains(&header.as_str()) {
                    return Err(format!(
                        "{field}.headers.{name}: set by the MCP transport itself"
                    ));
                }
                check_env_refs(&value).map_err(|e| format!("{field}.headers.{name}: {e}"))?;
                headers.push((header, name, value));
            }
            if let Some(t) = p.timeout {
                connect_timeout = seconds(&format!("{field}.timeout"), Some(t), 0.0)?;
            }
            if let Some(t) = p.sse_read_timeout {
                call_timeout = seconds(&format!("{field}.sse_read_timeout"), Some(t), 0.0)?;
            }
            let _ = p.terminate_on_close; // the session is always ended on close
                                          // The label leaves out credentials a URL may carry.
            let mut shown = url.clone();
            let _ = shown.set_username("");
            let _ = shown.set_password(None);
            shown.set_query(None);
            (
                Connection::Http {
                    url: p.url,
                    headers,
                    egress: EgressPolicy::parse(&p.allow_private)
                        .map_err(|e| format!("{field}.{e}"))?,
                },
                format!("mcp:{shown}"),
            )
        } else {
            let (params, field) = match (c.stdio_server_params, c.stdio_connection_params) {
                (Some(p), _) => (p, "args.stdio_server_params"),
                (None, Some(p)) => {
                    // As in ADK, this timeout bounds every request, tool calls included.
                    if let Some(t) = p.timeout {
                        connect_timeout =
                            seconds("args.stdio_connection_params.timeout", Some(t), 0.0)?;
                        call_timeout = connect_timeout;
                    }
                    (
                        p.server_params,
                        "args.stdio_connection_params.server_params",
                    )
                }
                (None, None) => unreachable!("one connection kind is set"),
            };
            if params.command.trim().is_empty() {
                return Err(format!("{field}.command: must not be empty"));
            }
            if let Some(enc) = &params.encoding {
                if !enc.eq_ignore_ascii_case("utf-8") && !enc.eq_ignore_ascii_case("utf8") {
                    return Err(format!("{field}.encoding: only utf-8 is supported"));
                }
            }
            let _ = params.encoding_error_handler;
            let env = params.env.unwrap_or_default();
            for (k, v) in &env {
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err(format!("{field}.env: {k:?} is not a valid variable name"));
                }
                check_env_refs(v).map_err(|e| format!("{field}.env.{k}: {e}"))?;
            }
            let mut label = format!("mcp:{}", params.command);
            for a in &params.args {
                label.push(' ');
                label.push_str(a);
            }
            if label.chars().count() > 100 {
                label = label.chars().take(99).collect::<String>() + "…";
            }
            (
                Connection::Stdio {
                    command: params.command,
                    args: params.args,
                    env,
                    cwd: params.cwd,
                },
                label,
            )
        };

        let prefix = match c.tool_name_prefix {
            None => None,
            Some(p) if p.is_empty() => None,
            Some(p) => {
                let b = p.as_bytes();
                let ok = (b[0].is_ascii_alphabetic() || b[0] == b'_')
                    && b.iter()
                        .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-');
                if !ok || p.len() > 32 {
                    return Err(format!(
                        "args.tool_name_prefix: {p:?} is not a valid tool name prefix"
                    ));
                }
                Some(p)
            }
        };
        let cache_ttl = match c.tool_list_cache_ttl_seconds {
            None => None,
            Some(t) => Some(seconds("args.tool_list_cache_ttl_seconds", Some(t), 0.0)?),
        };

        Ok(McpToolset {
            inner: Arc::new(Inner {
                label,
                connection,
                filter: c.tool_filter.map(|f| f.into_iter().collect()),
                prefix,
                connect_timeout,
                call_timeout,
                cache_ttl,
                state: tokio::sync::Mutex::new(State::default()),
            }),
        })
    }

    /// The server's tools, filtered and prefixed: what [`Toolset::tools`] returns, without
    /// needing an [`InvocationContext`]. Connects (or reconnects) as needed.
    pub async fn list_tools(&self) -> Result<Vec<Arc<dyn Tool>>, ToolError> {
        let tools = self.inner.list_tools().await?;
        Ok(tools.into_iter().map(|t| t as Arc<dyn Tool>).collect())
    }

    /// The same tools as [`McpToolset::list_tools`], as [`McpTool`]s.
    pub async fn mcp_tools(&self) -> Result<Vec<Arc<McpTool>>, ToolError> {
        self.inner.list_tools().await
    }
}

#[async_trait]
impl Toolset for McpToolset {
    fn name(&self) -> &str {
        &self.inner.label
    }

    async fn tools(&self, _ctx: &InvocationContext) -> Result<Vec<Arc<dyn Tool>>, ToolError> {
        self.list_tools().await
    }

    /// Ends the session: a stdio server has its stdin closed, then is terminated if it
    /// does not exit; an HTTP session is deleted. The toolset cannot be used afterwards.
    async fn close(&self) {
        let session = {
            let mut st = self.inner.state.lock().await;
            st.closed = true;
            st.tools = None;
            st.session.take()
        };
        if let Some(mut s) = session {
            // rmcp waits up to 3 s for the child to exit, then SIGTERM, 3 s, SIGKILL.
            let _ = s.service.close_with_timeout(Duration::from_secs(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(v: Value) -> String {
        match McpToolset::from_config(v) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }

    #[test]
    fn http_client_builds_without_system_certs_or_a_default_provider() {
        assert!(http_client(&EgressPolicy::default()).is_ok());
        assert!(rustls::crypto::CryptoProvider::get_default().is_none());
    }

    #[test]
    fn config() {
        let ok = McpToolset::from_config(json!({
            "stdio_server_params": {"command": "npx", "args": ["-y", "srv"], "env": {"K": "${HOME}"}},
            "tool_filter": ["a"], "tool_name_prefix": "fs"
        }))
        .unwrap();
        assert_eq!(ok.inner.label, "mcp:npx -y srv");
        let http = McpToolset::from_config(json!({
            "streamable_http_connection_params": {"url": "https://u:p@h.example/mcp?key=s",
                "headers": {"Authorization": "Bearer ${TOKEN}"}, "timeout": 5}
        }))
        .unwrap();
        assert_eq!(http.inner.label, "mcp:https://h.example/mcp");
        assert_eq!(http.inner.connect_timeout, Duration::from_secs(5));

        assert!(err(json!({})).contains("exactly one"));
        assert!(err(json!({"sse_connection_params": {"url": "http://x"}}))
            .starts_with("args.sse_connection_params:"));
        assert!(err(json!({"stdio_server_params": {"command": ""}}))
            .starts_with("args.stdio_server_params.command:"));
        let e = err(json!({"stdio_server_params": {"command": "x", "nope": 1}}));
        assert!(e.starts_with("args.stdio_server_params"), "{e}");
        assert!(e.contains("unknown field `nope`"), "{e}");
        assert!(
            err(json!({"streamable_http_connection_params": {"url": "ftp://x/"}}))
                .starts_with("args.streamable_http_connection_params.url:")
        );
        assert!(err(
            json!({"streamable_http_connection_params": {"url": "http://x/",
            "headers": {"Accept": "x"}}})
        )
        .contains("headers.Accept"));
        assert!(err(
            json!({"streamable_http_connection_params": {"url": "http://x/",
            "headers": {"A": "${"}}})
        )
        .contains("headers.A"));
        assert!(
            err(json!({"stdio_server_params": {"command": "x"}, "tool_name_prefix": "a b"}))
                .starts_with("args.tool_name_prefix:")
        );
        assert!(
            err(json!({"stdio_server_params": {"command": "x"}, "auth_scheme": {}}))
                .starts_with("args.auth_scheme:")
        );
    }
}
