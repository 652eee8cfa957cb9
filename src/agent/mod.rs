//! Agents: the [`Agent`] trait, the validated [`AgentTree`], the base wrapper [`run_agent`]
//! every agent runs through (plugins and before/after callbacks), and the built-in agents.
//!
//! An agent does its work in `run` and reports it with [`InvocationContext::emit`]. `emit`
//! returns only once the event is handled: a partial event has been handed to the client,
//! a complete one is committed to the database (and then handed to the client). So when
//! `emit` returns, later reads of session state already see the event's delta, and the
//! agent cannot outrun a slow client (back-pressure).

pub mod callbacks;
pub mod context;
pub mod echo;
pub mod llm;
pub mod memory_ingest;
pub mod plugin;
pub mod remote_a2a;
pub mod workflow;

pub use callbacks::{AgentCallbacks, CallbackContext};
pub use context::{InvocationContext, RunConfig};
pub use plugin::{Plugin, PluginSet};

use crate::event::Content;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Arc;

/// Why an agent stopped early.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// The run was cancelled (client disconnect, cancel request, timeout, shutdown).
    #[error("invocation cancelled")]
    Cancelled,
    /// The agent (or a callback, plugin, model or tool) failed. `kind` names the error class
    /// the way ADK's SSE error does (`RuntimeError: …`).
    #[error("{kind}: {message}")]
    Failed { kind: String, message: String },
    /// A complete event could not be committed; the run stops.
    #[error("CommitError: {0}")]
    Commit(String),
}

impl From<crate::run::CommitError> for AgentError {
    fn from(e: crate::run::CommitError) -> Self {
        AgentError::Commit(e.0)
    }
}

impl AgentError {
    /// A store error as the client may see it: what the request can act on (a missing
    /// session, an oversize artifact) in words, a database failure only as a generic sentence
    /// (the detail goes to the log, never into an event, an SSE error or `GET /runs`).
    pub fn store(e: crate::store::StoreError) -> Self {
        use crate::store::StoreError as E;
        match e {
            E::Database(_) | E::Migrate(_) | E::Corrupt(_) => {
                tracing::error!(error = %e, "store error during a run");
                AgentError::failed("StoreError", "a database error interrupted the run")
            }
            other => AgentError::failed("StoreError", other.to_string()),
        }
    }

    pub fn failed(kind: impl Into<String>, message: impl Into<String>) -> Self {
        AgentError::Failed {
            kind: kind.into(),
            message: message.into(),
        }
    }

    /// The error class ADK puts in `error_details.error_type`.
    pub fn kind(&self) -> &str {
        match self {
            AgentError::Cancelled => "CancelledError",
            AgentError::Failed { kind, .. } => kind,
            AgentError::Commit(_) => "CommitError",
        }
    }

    pub fn message(&self) -> String {
        match self {
            AgentError::Cancelled => "invocation cancelled".into(),
            AgentError::Failed { message, .. } => message.clone(),
            AgentError::Commit(m) => m.clone(),
        }
    }
}

pub type AgentResult<T = ()> = Result<T, AgentError>;

/// An agent: an LLM agent, a workflow over sub-agents, or custom code.
#[async_trait]
pub trait Agent: Send + Sync + 'static {
    /// Unique in its tree; never `user`.
    fn name(&self) -> &str;

    fn description(&self) -> &str {
        ""
    }

    fn sub_agents(&self) -> &[Arc<dyn Agent>] {
        &[]
    }

    /// When true, a conversation that this agent answered last goes back to the root on the
    /// next turn instead of staying here.
    fn disallow_transfer_to_parent(&self) -> bool {
        false
    }

    /// When true, an LLM agent may not transfer the conversation to its siblings.
    fn disallow_transfer_to_peers(&self) -> bool {
        false
    }

    /// Before/after callbacks the base wrapper runs around [`Agent::run`].
    fn callbacks(&self) -> Option<&AgentCallbacks> {
        None
    }

    /// The instruction shown by `app-info` (LLM agents).
    fn instruction(&self) -> &str {
        ""
    }

    /// The tools shown by `app-info` (LLM agents; toolsets are listed at run time only).
    fn tool_declarations(&self) -> Vec<crate::model::ToolDeclaration> {
        vec![]
    }

    /// The ADK class name shown by `app-info` (`LlmAgent`, `SequentialAgent`, …).
    fn agent_class(&self) -> &str {
        "BaseAgent"
    }

    /// Does the work, reporting events through `ctx.emit`.
    async fn run(&self, ctx: &InvocationContext) -> AgentResult;
}

/// A validated agent tree: unique names (never `user`), with a parent map built once.
pub struct AgentTree {
    root: Arc<dyn Agent>,
    by_name: HashMap<String, Arc<dyn Agent>>,
    parent: HashMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("agent name {0:?} is used twice in one tree; names must be unique")]
    Duplicate(String),
    #[error("agent name {0:?} is invalid: it must be non-empty and must not be \"user\"")]
    InvalidName(String),
}

impl AgentTree {
    pub fn new(root: Arc<dyn Agent>) -> Result<Self, TreeError> {
        let mut tree = AgentTree {
            root: root.clone(),
            by_name: HashMap::new(),
            parent: HashMap::new(),
        };
        tree.add(&root, None)?;
        Ok(tree)
    }

    fn add(&mut self, agent: &Arc<dyn Agent>, parent: Option<&str>) -> Result<(), TreeError> {
        let name = agent.name();
        if name.is_empty() || name == "user" {
            return Err(TreeError::InvalidName(name.to_string()));
        }
        if self
            .by_name
            .insert(name.to_string(), agent.clone())
            .is_some()
        {
            return Err(TreeError::Duplicate(name.to_string()));
        }
        if let Some(p) = parent {
            self.parent.insert(name.to_string(), p.to_string());
        }
        for child in agent.sub_agents() {
            self.add(child, Some(name))?;
        }
        Ok(())
    }

    pub fn root(&self) -> &Arc<dyn Agent> {
        &self.root
    }

    pub fn find(&self, name: &str) -> Option<&Arc<dyn Agent>> {
        self.by_name.get(name)
    }

    pub fn parent_of(&self, name: &str) -> Option<&Arc<dyn Agent>> {
        self.parent.get(name).and_then(|p| self.by_name.get(p))
    }

    /// True when `name` and every ancestor allow a conversation to stay with it.
    /// Every agent of the tree, root first.
    pub fn agents(&self) -> impl Iterator<Item = &Arc<dyn Agent>> {
        let mut out = vec![&self.root];
        let mut i = 0;
        while i < out.len() {
            out.extend(out[i].sub_agents().iter());
            i += 1;
        }
        out.into_iter()
    }

    pub fn may_keep_turn(&self, name: &str) -> bool {
        let mut current = self.find(name);
        while let Some(agent) = current {
            if agent.disallow_transfer_to_parent() {
                return false;
            }
            current = self.parent_of(agent.name());
        }
        true
    }
}

/// The agents `name` may hand the conversation to (ADK's rules): its sub-agents; its parent
/// unless it disallows that; its peers unless it disallows that. Parent and peers only when
/// the parent is an LLM agent (a workflow decides its own order).
pub fn transfer_targets(tree: &AgentTree, name: &str) -> Vec<Arc<dyn Agent>> {
    let Some(agent) = tree.find(name) else {
        return vec![];
    };
    let mut targets: Vec<Arc<dyn Agent>> = agent.sub_agents().to_vec();
    if let Some(parent) = tree.parent_of(name) {
        if parent.agent_class() == "LlmAgent" {
            if !agent.disallow_transfer_to_parent() {
                targets.push(parent.clone());
            }
            if !agent.disallow_transfer_to_peers() {
                targets.extend(
                    parent
                        .sub_agents()
                        .iter()
                        .filter(|p| p.name() != name)
                        .cloned(),
                );
            }
        }
    }
    targets
}

/// Runs `agent` through the base wrapper: plugin and callback hooks before (either may
/// answer instead of the agent), the agent itself, then the after hooks. State written by
/// callbacks becomes the `stateDelta` of the event they produce (or of a state-only event).
pub async fn run_agent(agent: &Arc<dyn Agent>, parent: &InvocationContext) -> AgentResult {
    let span = tracing::info_span!(
        "agent",
        otel.name = %format!("invoke_agent {}", agent.name()),
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = agent.name(),
    );
    tracing::Instrument::instrument(run_agent_inner(agent, parent), span).await
}

async fn run_agent_inner(agent: &Arc<dyn Agent>, parent: &InvocationContext) -> AgentResult {
    let ctx = parent.for_agent(agent.name());
    if ctx.is_ended() {
        return Ok(());
    }
    ctx.check_cancelled()?;

    // Before: plugins first, then the agent's own callbacks, in order.
    if let Some(content) = ctx.plugins().before_agent(&ctx, agent.name()).await? {
        return emit_callback_event(&ctx, Some(content), Default::default()).await;
    }
    if let Some(cbs) = agent.callbacks() {
        for cb in &cbs.before {
            let cb_ctx = CallbackContext::new(&ctx);
            let out = cb(cb_ctx.clone()).await?;
            let delta = cb_ctx.take_delta();
            if out.is_some() {
                return emit_callback_event(&ctx, out, delta).await;
            }
            if !delta.is_empty() {
                emit_callback_event(&ctx, None, delta).await?;
            }
        }
    }

    agent.run(&ctx).await?;
    ctx.flush_artifacts().await?;

    if ctx.is_ended() {
        return Ok(());
    }
    if let Some(cbs) = agent.callbacks() {
        for cb in &cbs.after {
            let cb_ctx = CallbackContext::new(&ctx);
            let out = cb(cb_ctx.clone()).await?;
            let delta = cb_ctx.take_delta();
            if out.is_some() || !delta.is_empty() {
                emit_callback_event(&ctx, out, delta).await?;
            }
        }
    }
    if let Some(content) = ctx.plugins().after_agent(&ctx, agent.name()).await? {
        emit_callback_event(&ctx, Some(content), Default::default()).await?;
    }
    Ok(())
}

async fn emit_callback_event(
    ctx: &InvocationContext,
    content: Option<Content>,
    delta: crate::event::JsonMap,
) -> AgentResult {
    let mut event = ctx.new_event();
    event.content = content;
    event.actions.state_delta = delta;
    ctx.emit(event).await.map(|_| ())
}
