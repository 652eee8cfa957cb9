//! An MCP toolset's YAML configuration (ADK's `McpToolset` args): a stdio child process or a
//! streamable HTTP server, with timeouts and a tool filter, validated when the app loads.

use super::*;

pub(super) const DEFAULT_CONNECT_TIMEOUT_SECS: f64 = 30.0;
pub(super) const DEFAULT_CALL_TIMEOUT_SECS: f64 = 300.0;
/// The environment a stdio server inherits (the MCP SDKs' `get_default_environment`).
pub(super) const INHERITED_ENV: &[&str] = &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];
/// Tool names agentd gives a meaning of its own; a server's tool may not take them.
pub(super) const RESERVED_NAMES: &[&str] = &[
    "transfer_to_agent",
    "exit_loop",
    "load_artifacts",
    "load_memory",
];
/// Headers the streamable HTTP transport sets itself.
pub(super) const RESERVED_HEADERS: &[&str] =
    &["accept", "mcp-session-id", "last-event-id", "content-type"];
/// How many of a stdio server's last stderr lines a connection error quotes.
pub(super) const STDERR_TAIL_LINES: usize = 10;

// ---------------------------------------------------------------------------------------
// Config (ADK's McpToolsetConfig)

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct McpToolsetConfig {
    #[serde(default)]
    pub(super) stdio_server_params: Option<StdioServerParams>,
    #[serde(default)]
    pub(super) stdio_connection_params: Option<StdioConnectionParams>,
    #[serde(default)]
    pub(super) sse_connection_params: Option<Value>,
    #[serde(default)]
    pub(super) streamable_http_connection_params: Option<HttpConnectionParams>,
    #[serde(default)]
    pub(super) tool_filter: Option<Vec<String>>,
    #[serde(default)]
    pub(super) tool_name_prefix: Option<String>,
    #[serde(default)]
    pub(super) tool_list_cache_ttl_seconds: Option<f64>,
    #[serde(default)]
    pub(super) auth_scheme: Option<Value>,
    #[serde(default)]
    pub(super) auth_credential: Option<Value>,
    #[serde(default)]
    pub(super) credential_key: Option<Value>,
    #[serde(default)]
    pub(super) use_mcp_resources: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StdioServerParams {
    pub(super) command: String,
    #[serde(default)]
    pub(super) args: Vec<String>,
    #[serde(default)]
    pub(super) env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(super) cwd: Option<String>,
    #[serde(default)]
    pub(super) encoding: Option<String>,
    #[serde(default)]
    pub(super) encoding_error_handler: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StdioConnectionParams {
    pub(super) server_params: StdioServerParams,
    #[serde(default)]
    pub(super) timeout: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HttpConnectionParams {
    pub(super) url: String,
    #[serde(default)]
    pub(super) headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(super) timeout: Option<f64>,
    #[serde(default)]
    pub(super) sse_read_timeout: Option<f64>,
    #[serde(default)]
    pub(super) terminate_on_close: Option<bool>,
    /// agentd: non-public addresses the server may be at (see `tools::egress`).
    #[serde(default)]
    pub(super) allow_private: Vec<String>,
}

/// How to reach the server.
#[derive(Debug, Clone)]
pub(super) enum Connection {
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

pub(super) fn seconds(field: &str, v: Option<f64>, default: f64) -> Result<Duration, String> {
    let secs = v.unwrap_or(default);
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{field}: {secs} is not a positive number of seconds"))
}
