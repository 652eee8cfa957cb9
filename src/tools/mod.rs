//! Tools an LLM agent can call: the [`Tool`] trait, the [`ToolContext`] a call sees, function
//! tools built from Rust closures ([`FunctionTool`], JSON schema derived from the argument
//! type), toolsets that list their tools at run time ([`Toolset`], e.g. MCP servers), and
//! the built-ins (`transfer_to_agent`, `exit_loop`, `load_artifacts`, `load_memory`,
//! HTTP tools declared in config).

pub mod builtin;
pub mod egress;
pub mod function;
pub mod http;
pub mod mcp;

pub use function::FunctionTool;

pub use crate::invocation::{ToolConfirmation, ToolContext};

use crate::event::JsonMap;
use crate::invocation::InvocationContext;
use crate::model::ToolDeclaration;
use async_trait::async_trait;
use serde_json::Value;
use std::sync::Arc;

/// A failed tool call. The message goes back to the model as `{"error": message}` so it
/// can correct itself; it is not an error of the run.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    pub fn new(message: impl Into<String>) -> Self {
        ToolError(message.into())
    }
}

pub type ToolResult = Result<Value, ToolError>;

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    fn name(&self) -> &str;

    fn description(&self) -> &str;

    /// JSON schema of the arguments object; `None` for a tool without arguments.
    fn parameters(&self) -> Option<Value> {
        None
    }

    /// What the model is told about this tool.
    fn declaration(&self) -> ToolDeclaration {
        ToolDeclaration {
            name: self.name().to_string(),
            description: self.description().to_string(),
            parameters: self.parameters(),
        }
    }

    /// A long-running tool may answer `Value::Null` ("pending"): the run then ends with the
    /// call open (ADK `longRunningToolIds`), and a later `/run` carrying the call's
    /// `functionResponse` resumes the conversation.
    fn is_long_running(&self) -> bool {
        false
    }

    /// When true, a call first asks the client for approval (ADK
    /// `requestedToolConfirmations`) and runs only after it is approved.
    fn requires_confirmation(&self) -> bool {
        false
    }

    /// Whether a call may be made again without harm (it reads, or writes the same thing
    /// twice). A call that was in flight when its replica stopped is run again on the replica
    /// that takes the run over only if this says so; otherwise the model is told its effect is
    /// unknown (docs/replicas.md, "Durable runs"). Defaults to false: at most once.
    fn is_idempotent(&self) -> bool {
        false
    }

    /// Runs the tool. The returned JSON becomes the `functionResponse.response` (objects as
    /// they are, anything else as `{"result": value}`).
    async fn call(&self, args: JsonMap, ctx: &ToolContext) -> ToolResult;

    /// Whether the model is told about this tool as a function it may call. A tool that only
    /// adds to the request ([`Tool::instruction`], as ADK's `preload_memory`) says no.
    fn is_declared(&self) -> bool {
        true
    }

    /// Text this tool adds to the system instruction of each model request of its agent (ADK's
    /// tools that process the request); none by default.
    async fn instruction(&self, _ctx: &InvocationContext) -> Result<Option<String>, ToolError> {
        Ok(None)
    }
}

/// A group of tools discovered at run time (an MCP server's tools).
#[async_trait]
pub trait Toolset: Send + Sync + 'static {
    fn name(&self) -> &str;

    /// The tools, as of now. Called once per model step, so implementations cache.
    async fn tools(&self, ctx: &InvocationContext) -> Result<Vec<Arc<dyn Tool>>, ToolError>;

    /// Releases connections and child processes (server shutdown).
    async fn close(&self) {}
}

/// A tool the client declared with its request and resolves itself: the model may call it,
/// the call stays open (ADK `longRunningToolIds`) and the run ends; the client's next
/// request carries the result as a `functionResponse`.
pub struct ClientTool(pub ToolDeclaration);

#[async_trait]
impl Tool for ClientTool {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn description(&self) -> &str {
        &self.0.description
    }

    fn parameters(&self) -> Option<Value> {
        self.0.parameters.clone()
    }

    fn is_long_running(&self) -> bool {
        true
    }

    async fn call(&self, _args: JsonMap, _ctx: &ToolContext) -> ToolResult {
        Ok(Value::Null)
    }
}

/// Wraps a tool so that every call needs the client's approval first.
pub struct RequireConfirmation(pub Arc<dyn Tool>);

#[async_trait]
impl Tool for RequireConfirmation {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn description(&self) -> &str {
        self.0.description()
    }

    fn parameters(&self) -> Option<Value> {
        self.0.parameters()
    }

    fn declaration(&self) -> ToolDeclaration {
        self.0.declaration()
    }

    fn is_long_running(&self) -> bool {
        self.0.is_long_running()
    }

    fn requires_confirmation(&self) -> bool {
        true
    }

    fn is_idempotent(&self) -> bool {
        self.0.is_idempotent()
    }

    async fn call(&self, args: JsonMap, ctx: &ToolContext) -> ToolResult {
        self.0.call(args, ctx).await
    }
}

/// Reads a tool's YAML `args` (as JSON) into its config type; errors name the field
/// (`args.url: invalid type …`).
pub(crate) fn config_args<T: serde::de::DeserializeOwned>(args: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(args).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            format!("args: {}", e.inner())
        } else {
            format!("args.{path}: {}", e.inner())
        }
    })
}

/// The `functionResponse.response` object for a tool's result.
pub fn response_object(result: ToolResult) -> JsonMap {
    match result {
        Ok(Value::Object(m)) => m,
        Ok(other) => {
            let mut m = JsonMap::new();
            m.insert("result".into(), other);
            m
        }
        Err(e) => {
            let mut m = JsonMap::new();
            m.insert("error".into(), Value::String(e.0));
            m
        }
    }
}
