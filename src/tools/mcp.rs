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

use super::egress::{EgressPolicy, McpResolver};
use super::http::{check_env_refs, expand_env};
use super::{Tool, ToolContext, ToolError, ToolResult, Toolset};
use crate::agent::InvocationContext;
use crate::event::JsonMap;
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

const DEFAULT_CONNECT_TIMEOUT_SECS: f64 = 30.0;
const DEFAULT_CALL_TIMEOUT_SECS: f64 = 300.0;
/// The environment a stdio server inherits (the MCP SDKs' `get_default_environment`).
const INHERITED_ENV: &[&str] = &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];
/// Tool names agentd gives a meaning of its own; a server's tool may not take them.
const RESERVED_NAMES: &[&str] = &[
    "transfer_to_agent",
    "exit_loop",
    "load_artifacts",
    "load_memory",
];
/// Headers the streamable HTTP transport sets itself.
const RESERVED_HEADERS: &[&str] = &["accept", "mcp-session-id", "last-event-id", "content-type"];
/// How many of a stdio server's last stderr lines a connection error quotes.
const STDERR_TAIL_LINES: usize = 10;

// ---------------------------------------------------------------------------------------
// Config (ADK's McpToolsetConfig)

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpToolsetConfig {
    #[serde(default)]
    stdio_server_params: Option<StdioServerParams>,
    #[serde(default)]
    stdio_connection_params: Option<StdioConnectionParams>,
    #[serde(default)]
    sse_connection_params: Option<Value>,
    #[serde(default)]
    streamable_http_connection_params: Option<HttpConnectionParams>,
    #[serde(default)]
    tool_filter: Option<Vec<String>>,
    #[serde(default)]
    tool_name_prefix: Option<String>,
    #[serde(default)]
    tool_list_cache_ttl_seconds: Option<f64>,
    #[serde(default)]
    auth_scheme: Option<Value>,
    #[serde(default)]
    auth_credential: Option<Value>,
    #[serde(default)]
    credential_key: Option<Value>,
    #[serde(default)]
    use_mcp_resources: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct StdioServerParams {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    encoding: Option<String>,
    #[serde(default)]
    encoding_error_handler: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StdioConnectionParams {
    server_params: StdioServerParams,
    #[serde(default)]
    timeout: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpConnectionParams {
    url: String,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    sse_read_timeout: Option<f64>,
    #[serde(default)]
    terminate_on_close: Option<bool>,
    /// agentd: non-public addresses the server may be at (see `tools::egress`).
    #[serde(default)]
    allow_private: Vec<String>,
}

/// How to reach the server.
#[derive(Debug, Clone)]
enum Connection {
    Stdio {
        command: String,
        args: Vec<String>,
        /// Values may hold `${VAR}`, filled in when connecting.
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    Http {
        url: String,
        /// Values may hold `${VAR}`, filled in when connecting.
        headers: Vec<(HeaderName, String, String)>,
        egress: EgressPolicy,
    },
}

fn seconds(field: &str, v: Option<f64>, default: f64) -> Result<Duration, String> {
    let secs = v.unwrap_or(default);
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{field}: {secs} is not a positive number of seconds"))
}

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

impl Inner {
    async fn list_tools(self: &Arc<Self>) -> Result<Vec<Arc<McpTool>>, ToolError> {
        let mut st = self.state.lock().await;
        if st.closed {
            return Err(ToolError::new("the MCP toolset is closed"));
        }
        let alive = st.session.as_ref().is_some_and(Session::is_alive);
        let changed = st
            .session
            .as_ref()
            .is_some_and(|s| s.tools_changed.swap(false, Ordering::Relaxed));
        if let (true, false, Some((tools, at))) = (alive, changed, &st.tools) {
            if self.cache_ttl.is_none_or(|ttl| at.elapsed() < ttl) {
                return Ok(tools.clone());
            }
        }
        st.tools = None;

        let mut reconnected = false;
        loop {
            if !st.session.as_ref().is_some_and(Session::is_alive) {
                self.replace_session(&mut st).await?;
                reconnected = true;
            }
            let peer = st.session.as_ref().map(|s| s.service.peer().clone());
            let Some(peer) = peer else {
                return Err(ToolError::new("no MCP session"));
            };
            let listed = tokio::time::timeout(self.connect_timeout, peer.list_all_tools()).await;
            match listed {
                Ok(Ok(listed)) => {
                    let tools = self.build_tools(listed);
                    st.tools = Some((tools.clone(), Instant::now()));
                    return Ok(tools);
                }
                Ok(Err(e)) if is_transport_error(&e) && !reconnected => {
                    tracing::warn!(server = %self.label, error = %e, "MCP connection broke; reconnecting");
                    Self::drop_session(&mut st);
                }
                Ok(Err(e)) => {
                    if is_transport_error(&e) {
                        Self::drop_session(&mut st);
                    }
                    return Err(ToolError(format!(
                        "listing the MCP server's tools failed: {}",
                        service_error(&e)
                    )));
                }
                Err(_) => {
                    Self::drop_session(&mut st);
                    return Err(ToolError(format!(
                        "the MCP server did not list its tools within {} s",
                        self.connect_timeout.as_secs_f64()
                    )));
                }
            }
        }
    }

    /// Wraps the listed MCP tools: filter (by the server's names), prefix, skip reserved
    /// names, sort by name (a stable order keeps model prompt caches warm).
    fn build_tools(self: &Arc<Self>, listed: Vec<rmcp::model::Tool>) -> Vec<Arc<McpTool>> {
        let mut tools = Vec::new();
        for t in listed {
            let mcp_name = t.name.to_string();
            if let Some(filter) = &self.filter {
                if !filter.contains(&mcp_name) {
                    continue;
                }
            }
            let name = match &self.prefix {
                Some(p) if p.ends_with('_') => format!("{p}{mcp_name}"),
                Some(p) => format!("{p}_{mcp_name}"),
                None => mcp_name.clone(),
            };
            if RESERVED_NAMES.contains(&name.as_str()) {
                tracing::warn!(server = %self.label, tool = %name, "skipping MCP tool: the name is reserved");
                continue;
            }
            let description = t
                .description
                .as_deref()
                .map(str::to_string)
                .or(t.title.clone())
                .unwrap_or_default();
            let retry_safe = t
                .annotations
                .as_ref()
                .is_some_and(|a| a.read_only_hint == Some(true) || a.idempotent_hint == Some(true));
            tools.push(Arc::new(McpTool {
                name,
                mcp_name,
                description,
                parameters: Value::Object((*t.input_schema).clone()),
                retry_safe,
                set: Arc::downgrade(self),
            }));
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// A live session's peer (connecting if there is none) and the session's generation.
    async fn peer(self: &Arc<Self>) -> Result<(Peer<RoleClient>, u64), ToolError> {
        let mut st = self.state.lock().await;
        if st.closed {
            return Err(ToolError::new("the MCP toolset is closed"));
        }
        if !st.session.as_ref().is_some_and(Session::is_alive) {
            self.replace_session(&mut st).await?;
        }
        match &st.session {
            Some(s) => Ok((s.service.peer().clone(), s.generation)),
            None => Err(ToolError::new("no MCP session")),
        }
    }

    /// Drops the session a failed call used, unless it was already replaced.
    async fn invalidate(&self, generation: u64) {
        let mut st = self.state.lock().await;
        if st
            .session
            .as_ref()
            .is_some_and(|s| s.generation == generation)
        {
            Self::drop_session(&mut st);
        }
    }

    fn drop_session(st: &mut State) {
        st.tools = None;
        if let Some(mut s) = st.session.take() {
            tokio::spawn(async move {
                let _ = s.service.close_with_timeout(Duration::from_secs(10)).await;
            });
        }
    }

    /// Ends the current session, if any, and connects a new one.
    async fn replace_session(&self, st: &mut State) -> Result<(), ToolError> {
        Self::drop_session(st);
        st.generation += 1;
        let session = self.connect(st.generation).await?;
        st.session = Some(session);
        Ok(())
    }

    async fn connect(&self, generation: u64) -> Result<Session, ToolError> {
        let tools_changed = Arc::new(AtomicBool::new(false));
        let handler = Handler {
            config: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("agentd", env!("CARGO_PKG_VERSION")),
            ),
            tools_changed: tools_changed.clone(),
        };
        let secs = self.connect_timeout.as_secs_f64();
        let service = match &self.connection {
            Connection::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).env_clear().kill_on_drop(true);
                for k in INHERITED_ENV {
                    if let Some(v) = std::env::var_os(k) {
                        cmd.env(k, v);
                    }
                }
                for (k, v) in env {
                    let v =
                        expand_env(v, &format!("the MCP server's env.{k}")).map_err(ToolError)?;
                    cmd.env(k, v);
                }
                if let Some(dir) = cwd {
                    cmd.current_dir(dir);
                }
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| ToolError(format!("cannot start `{command}`: {e}")))?;
                let tail = Arc::new(StdMutex::new(VecDeque::new()));
                if let Some(stderr) = stderr {
                    tokio::spawn(forward_stderr(stderr, self.label.clone(), tail.clone()));
                }
                match tokio::time::timeout(self.connect_timeout, handler.serve(transport)).await {
                    Ok(Ok(service)) => service,
                    Ok(Err(e)) => {
                        // Give the stderr reader a moment to catch the server's last words.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        return Err(ToolError(format!(
                            "the MCP server `{command}` did not start: {}{}",
                            init_error(&e),
                            stderr_note(&tail)
                        )));
                    }
                    Err(_) => {
                        return Err(ToolError(format!(
                            "the MCP server `{command}` did not initialize within {secs} s{}",
                            stderr_note(&tail)
                        )))
                    }
                }
            }
            Connection::Http {
                url,
                headers,
                egress,
            } => {
                if let Ok(parsed) = reqwest::Url::parse(url) {
                    egress
                        .check_url(&parsed)
                        .map_err(|e| ToolError(format!("cannot connect to the MCP server: {e}")))?;
                }
                let client = http_client(egress)?;
                let mut map = HashMap::new();
                for (name, configured, template) in headers {
                    let field = format!("streamable_http_connection_params.headers.{configured}");
                    let value = expand_env(template, &field).map_err(ToolError)?;
                    let mut value = HeaderValue::from_str(&value)
                        .map_err(|_| ToolError(format!("{field} is not a valid header value")))?;
                    value.set_sensitive(true);
                    map.insert(name.clone(), value);
                }
                let config =
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(map);
                let transport = StreamableHttpClientTransport::with_client(client, config);
                match tokio::time::timeout(self.connect_timeout, handler.serve(transport)).await {
                    Ok(Ok(service)) => service,
                    Ok(Err(e)) => {
                        return Err(ToolError(format!(
                            "cannot connect to the MCP server at {}: {}",
                            self.label.trim_start_matches("mcp:"),
                            init_error(&e)
                        )))
                    }
                    Err(_) => {
                        return Err(ToolError(format!(
                            "the MCP server at {} did not answer within {secs} s",
                            self.label.trim_start_matches("mcp:")
                        )))
                    }
                }
            }
        };
        tracing::info!(server = %self.label, "MCP server connected");
        Ok(Session {
            service,
            generation,
            tools_changed,
        })
    }
}

/// The HTTP client of a streamable HTTP connection (rmcp's reqwest 0.13); its resolver drops
/// addresses `egress` refuses. Its TLS is rustls with ring and the webpki roots, as agentd's other client:
/// preconfigured, because reqwest 0.13 would otherwise want a process-wide crypto provider and
/// the system's CA store (and panic inside rmcp without them). No redirects are followed (a
/// redirect could carry the session id and headers elsewhere); no idle connections are
/// pooled (rmcp's own default, against delayed-ACK stalls).
fn http_client(egress: &EgressPolicy) -> Result<mcp_reqwest::Client, ToolError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ToolError(format!("cannot build the MCP HTTP client: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    mcp_reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(mcp_reqwest::redirect::Policy::none())
        // A proxy from the environment would resolve the target itself, around the rule.
        .no_proxy()
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(10))
        .dns_resolver(Arc::new(McpResolver(egress.clone())))
        .user_agent(concat!("agentd/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ToolError(format!("cannot build the MCP HTTP client: {e}")))
}

/// Logs a stdio server's stderr and keeps its last lines for connection errors.
async fn forward_stderr(
    stderr: tokio::process::ChildStderr,
    label: String,
    tail: Arc<StdMutex<VecDeque<String>>>,
) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "agentd::mcp", server = %label, "{line}");
        let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
        if t.len() == STDERR_TAIL_LINES {
            t.pop_front();
        }
        t.push_back(line.chars().take(300).collect());
    }
}

fn stderr_note(tail: &StdMutex<VecDeque<String>>) -> String {
    let t = tail.lock().unwrap_or_else(|p| p.into_inner());
    if t.is_empty() {
        String::new()
    } else {
        let lines: Vec<&str> = t.iter().map(String::as_str).collect();
        format!(" (server stderr: {})", lines.join(" | "))
    }
}

/// An error and its causes, each once.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// What went wrong while initializing, without rmcp's transport type names.
fn init_error(e: &ClientInitializeError) -> String {
    match e {
        ClientInitializeError::TransportError { error, context } => {
            format!("{} ({context})", error_chain(&*error.error))
        }
        other => other.to_string(),
    }
}

/// What went wrong with a request, without rmcp's transport type names.
fn service_error(e: &ServiceError) -> String {
    match e {
        ServiceError::TransportSend(t) => error_chain(&*t.error),
        ServiceError::TransportClosed => "the connection is closed".into(),
        other => other.to_string(),
    }
}

fn is_transport_error(e: &ServiceError) -> bool {
    matches!(
        e,
        ServiceError::TransportSend(_) | ServiceError::TransportClosed
    )
}

// ---------------------------------------------------------------------------------------
// One tool of the server

/// One of an MCP server's tools.
pub struct McpTool {
    name: String,
    /// The name on the server (without the prefix).
    mcp_name: String,
    description: String,
    parameters: Value,
    /// Annotated read-only or idempotent: a call may be repeated after a broken connection.
    retry_safe: bool,
    set: Weak<Inner>,
}

impl McpTool {
    /// The tool's name on the MCP server (without `tool_name_prefix`).
    pub fn mcp_name(&self) -> &str {
        &self.mcp_name
    }

    /// Runs one call (`tools/call`): what [`Tool::call`] does, without a [`ToolContext`].
    pub async fn execute(&self, args: &JsonMap) -> ToolResult {
        let set = self
            .set
            .upgrade()
            .ok_or_else(|| ToolError::new("the MCP toolset is closed"))?;
        let mut retried = false;
        loop {
            let (peer, generation) = set.peer().await?;
            let params =
                CallToolRequestParams::new(self.mcp_name.clone()).with_arguments(args.clone());
            let outcome = tokio::time::timeout(set.call_timeout, peer.call_tool_once(params)).await;
            let e = match outcome {
                Ok(Ok(response)) => return self.result(response),
                Ok(Err(e)) => e,
                Err(_) => {
                    return Err(ToolError(format!(
                        "the MCP tool {} did not answer within {} s",
                        self.mcp_name,
                        set.call_timeout.as_secs_f64()
                    )))
                }
            };
            if !is_transport_error(&e) {
                return Err(match e {
                    ServiceError::McpError(err) => ToolError(format!(
                        "the MCP server rejected the call: {} (code {})",
                        err.message, err.code.0
                    )),
                    other => ToolError(format!("the MCP call failed: {}", service_error(&other))),
                });
            }
            set.invalidate(generation).await;
            // Not sent at all, or safe to repeat: once more on a new connection.
            let unsent = matches!(e, ServiceError::TransportSend(_));
            if !retried && (unsent || self.retry_safe) {
                tracing::warn!(server = %set.label, tool = %self.name, error = %e, "MCP connection broke; reconnecting");
                retried = true;
                continue;
            }
            return Err(ToolError(format!(
                "the connection to the MCP server broke during the call ({}); the tool may \
                 or may not have run. The next call reconnects.",
                service_error(&e)
            )));
        }
    }

    fn result(&self, response: CallToolResponse) -> ToolResult {
        let r: CallToolResult = match response {
            CallToolResponse::Complete(r) => r,
            CallToolResponse::InputRequired(_) => {
                return Err(ToolError::new(
                    "the MCP server asked for more input during the call (elicitation or \
                     sampling), which agentd does not support",
                ))
            }
            CallToolResponse::Task(_) => {
                return Err(ToolError::new(
                    "the MCP server made the call a task, which agentd does not support",
                ))
            }
            _ => {
                return Err(ToolError::new(
                    "the MCP server answered the call with a result agentd does not know",
                ))
            }
        };
        let mut text = content_text(&r.content);
        let truncated = text.len() > MAX_RESULT_BYTES;
        if truncated {
            let mut cut = MAX_RESULT_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        let structured = r.structured_content.filter(|v| !v.is_null());
        let structured_size = structured
            .as_ref()
            .map_or(0, |s| serde_json::to_vec(s).map_or(usize::MAX, |v| v.len()));
        if structured_size > MAX_RESULT_BYTES {
            return Err(ToolError(format!(
                "the MCP tool {} returned {structured_size} bytes of structured content; the \
                 limit is {MAX_RESULT_BYTES}",
                self.mcp_name
            )));
        }
        if r.is_error == Some(true) {
            let msg = if !text.is_empty() {
                text
            } else if let Some(s) = structured {
                s.to_string()
            } else {
                format!("the MCP tool {} failed", self.mcp_name)
            };
            return Err(ToolError(msg));
        }
        Ok(match structured {
            Some(Value::Object(m)) => Value::Object(m),
            Some(other) => json!({ "result": other }),
            None if truncated => json!({ "result": text, "truncated": true }),
            None => json!({ "result": text }),
        })
    }
}

/// The most of a tool result's text (or structured content) that is kept: it is stored in an
/// event and sent to the model with every later turn.
const MAX_RESULT_BYTES: usize = 1024 * 1024;

/// The text of a call's contents; other kinds are described in brackets.
fn content_text(content: &[ContentBlock]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in content {
        parts.push(match block {
            ContentBlock::Text(t) => t.text.clone(),
            ContentBlock::Image(i) => {
                format!("[image {}, {} base64 chars]", i.mime_type, i.data.len())
            }
            ContentBlock::Audio(a) => {
                format!("[audio {}, {} base64 chars]", a.mime_type, a.data.len())
            }
            ContentBlock::Resource(r) => match &r.resource {
                ResourceContents::TextResourceContents { text, .. } => text.clone(),
                ResourceContents::BlobResourceContents { uri, .. } => format!("[resource {uri}]"),
                _ => "[resource]".to_string(),
            },
            ContentBlock::ResourceLink(l) => format!("[resource link {}]", l.uri),
            _ => "[unsupported content]".to_string(),
        });
    }
    parts.join("\n")
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Option<Value> {
        Some(self.parameters.clone())
    }

    async fn call(&self, args: JsonMap, _ctx: &ToolContext) -> ToolResult {
        self.execute(&args).await
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
