//! What the code running inside one invocation shares: the [`Agent`] trait and the
//! [`AgentTree`], the [`InvocationContext`] (what an agent sees: state, artifacts, `emit`),
//! the [`ToolContext`] a tool call sees, callbacks, runner plugins and [`AgentError`].
//!
//! Agents (`crate::agent`) and tools (`crate::tools`) both build on these and neither needs
//! the other's internals: an LLM agent holds tools, a tool (`transfer_to_agent`) reads the
//! tree, and both live above this folder (as in ADK, where agents and tools share their
//! contexts from below).

mod agent;
mod callbacks;
mod context;
mod error;
mod plugin;
mod tool_context;

pub use agent::{transfer_targets, Agent, AgentTree, TreeError};
pub use callbacks::{AgentCallback, AgentCallbacks, CallbackContext};
pub(crate) use context::ContextParts;
pub use context::{InvocationContext, RunConfig};
pub use error::{AgentError, AgentResult};
pub use plugin::{Plugin, PluginSet};
pub use tool_context::{ToolCall, ToolConfirmation, ToolContext};
