//! `LlmAgent`: an agent whose turns are model calls with a function-calling loop.
//!
//! One turn ([`flow`]): render the instruction from state, build the conversation from the
//! session ([`history`]), call the model (streaming its text as partial events that share
//! the final event's id), commit the aggregated model event, run the requested tools
//! concurrently, commit their responses, and call the model again, until it answers without
//! tool calls, `max_steps` is reached, a tool transfers the conversation or escalates, or a
//! call waits for the client (long-running tools, confirmations).

mod approvals;
mod callbacks;
mod flow;
pub mod history;
pub mod instruction;
mod model_step;
mod tool_calls;

pub use crate::invocation::ToolCall;
pub use callbacks::{
    AfterModelCallback, AfterToolCallback, BeforeModel, BeforeModelCallback, BeforeToolCallback,
    LlmCallbacks,
};
pub use history::IncludeContents;

use super::{Agent, AgentCallbacks, AgentResult, InvocationContext};
use crate::model::{GenerateConfig, Model};
use crate::tools::{Tool, Toolset};
use async_trait::async_trait;
use std::sync::Arc;

/// Default bound on model calls per agent turn.
pub const DEFAULT_MAX_STEPS: u32 = 25;

pub struct LlmAgent {
    pub name: String,
    pub description: String,
    pub model: Arc<dyn Model>,
    /// The agent's instruction; `{state_key}` placeholders are filled per turn.
    pub instruction: String,
    /// Prepended to every agent's instruction in the tree (read from the root agent).
    pub global_instruction: String,
    pub tools: Vec<Arc<dyn Tool>>,
    pub toolsets: Vec<Arc<dyn Toolset>>,
    pub sub_agents: Vec<Arc<dyn Agent>>,
    /// The final answer's text is saved to this state key.
    pub output_key: Option<String>,
    pub generate_config: GenerateConfig,
    pub disallow_transfer_to_parent: bool,
    pub disallow_transfer_to_peers: bool,
    pub include_contents: IncludeContents,
    /// Model calls per turn before the agent stops with a `MAX_STEPS` error event.
    pub max_steps: u32,
    pub callbacks: Option<AgentCallbacks>,
    pub llm_callbacks: LlmCallbacks,
}

impl LlmAgent {
    pub fn new(name: impl Into<String>, model: Arc<dyn Model>) -> Self {
        LlmAgent {
            name: name.into(),
            description: String::new(),
            model,
            instruction: String::new(),
            global_instruction: String::new(),
            tools: vec![],
            toolsets: vec![],
            sub_agents: vec![],
            output_key: None,
            generate_config: GenerateConfig::default(),
            disallow_transfer_to_parent: false,
            disallow_transfer_to_peers: false,
            include_contents: IncludeContents::Default,
            max_steps: DEFAULT_MAX_STEPS,
            callbacks: None,
            llm_callbacks: LlmCallbacks::default(),
        }
    }

    pub fn description(mut self, d: impl Into<String>) -> Self {
        self.description = d.into();
        self
    }

    pub fn instruction(mut self, i: impl Into<String>) -> Self {
        self.instruction = i.into();
        self
    }

    pub fn tool(mut self, t: impl Tool) -> Self {
        self.tools.push(Arc::new(t));
        self
    }

    pub fn toolset(mut self, t: Arc<dyn Toolset>) -> Self {
        self.toolsets.push(t);
        self
    }

    pub fn sub_agent(mut self, a: Arc<dyn Agent>) -> Self {
        self.sub_agents.push(a);
        self
    }

    pub fn output_key(mut self, k: impl Into<String>) -> Self {
        self.output_key = Some(k.into());
        self
    }

    pub fn llm_callbacks(mut self, c: LlmCallbacks) -> Self {
        self.llm_callbacks = c;
        self
    }

    pub fn max_steps(mut self, n: u32) -> Self {
        self.max_steps = n.max(1);
        self
    }
}

#[async_trait]
impl Agent for LlmAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn missing_keys(&self) -> Vec<String> {
        self.model
            .missing_key()
            .map(str::to_string)
            .into_iter()
            .collect()
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn sub_agents(&self) -> &[Arc<dyn Agent>] {
        &self.sub_agents
    }

    fn disallow_transfer_to_parent(&self) -> bool {
        self.disallow_transfer_to_parent
    }

    fn disallow_transfer_to_peers(&self) -> bool {
        self.disallow_transfer_to_peers
    }

    fn callbacks(&self) -> Option<&AgentCallbacks> {
        self.callbacks.as_ref()
    }

    fn agent_class(&self) -> &str {
        "LlmAgent"
    }

    fn instruction(&self) -> &str {
        &self.instruction
    }

    fn tool_declarations(&self) -> Vec<crate::model::ToolDeclaration> {
        self.tools.iter().map(|t| t.declaration()).collect()
    }

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        flow::Turn::new(self, ctx).run().await
    }
}
