//! The [`Agent`] trait and the validated [`AgentTree`] every run walks, with ADK's rules for
//! which agent may hand the conversation to which ([`transfer_targets`]). Tools read these
//! too (`transfer_to_agent`), so they live below both.

use super::{AgentCallbacks, AgentResult, InvocationContext};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Arc;

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

    /// The environment variables an agent of this tree needs set to reach its model (an LLM
    /// agent whose provider would refuse every call for want of a key): named at start-up.
    fn missing_keys(&self) -> Vec<String> {
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
