//! Workflow agents: run sub-agents in sequence, in parallel, or in a loop.

use super::{run_agent, Agent, AgentCallbacks, AgentResult, InvocationContext};
use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What every workflow agent has.
pub struct WorkflowParts {
    pub name: String,
    pub description: String,
    pub sub_agents: Vec<Arc<dyn Agent>>,
    pub callbacks: Option<AgentCallbacks>,
}

macro_rules! workflow_common {
    ($class:literal) => {
        fn name(&self) -> &str {
            &self.parts.name
        }
        fn description(&self) -> &str {
            &self.parts.description
        }
        fn sub_agents(&self) -> &[Arc<dyn Agent>] {
            &self.parts.sub_agents
        }
        fn callbacks(&self) -> Option<&AgentCallbacks> {
            self.parts.callbacks.as_ref()
        }
        fn agent_class(&self) -> &str {
            $class
        }
        /// A workflow does not keep a conversation: the next turn starts at the root again.
        fn disallow_transfer_to_parent(&self) -> bool {
            true
        }
    };
}

/// Runs each sub-agent once, in order.
pub struct SequentialAgent {
    pub parts: WorkflowParts,
}

#[async_trait]
impl Agent for SequentialAgent {
    workflow_common!("SequentialAgent");

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        for child in &self.parts.sub_agents {
            run_agent(child, ctx).await?;
            if ctx.is_ended() {
                break;
            }
        }
        Ok(())
    }
}

/// Runs every sub-agent at once, each on its own branch (`parent.child`); their events
/// interleave as they come. The first error stops the others.
pub struct ParallelAgent {
    pub parts: WorkflowParts,
}

#[async_trait]
impl Agent for ParallelAgent {
    workflow_common!("ParallelAgent");

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        let runs = self.parts.sub_agents.iter().map(|child| {
            let branch = match ctx.branch() {
                Some(b) => format!("{b}.{}", child.name()),
                None => format!("{}.{}", self.parts.name, child.name()),
            };
            let child_ctx = ctx.with_branch(branch);
            async move { run_agent(child, &child_ctx).await }
        });
        futures::future::try_join_all(runs).await.map(|_| ())
    }
}

/// Runs its sub-agents in order, repeatedly, until one escalates (`actions.escalate`), the
/// invocation ends, or `max_iterations` rounds are done.
pub struct LoopAgent {
    pub parts: WorkflowParts,
    pub max_iterations: Option<u32>,
}

#[async_trait]
impl Agent for LoopAgent {
    workflow_common!("LoopAgent");

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        let escalated = Arc::new(AtomicBool::new(false));
        let loop_ctx = ctx.with_escalation(escalated.clone());
        let mut round = 0u32;
        while self.max_iterations.is_none_or(|max| round < max) {
            for child in &self.parts.sub_agents {
                run_agent(child, &loop_ctx).await?;
                if escalated.load(Ordering::SeqCst) || ctx.is_ended() {
                    return Ok(());
                }
            }
            round += 1;
            ctx.check_cancelled()?;
        }
        Ok(())
    }
}
