//! Agents: the base wrapper [`run_agent`] every agent runs through (plugins and before/after
//! callbacks) and the built-in agents (LLM, workflow, echo, remote A2A). The [`Agent`] trait,
//! the [`AgentTree`] and the [`InvocationContext`] live below agents and tools alike, in
//! [`crate::invocation`].
//!
//! An agent does its work in `run` and reports it with [`InvocationContext::emit`]. `emit`
//! returns only once the event is handled: a partial event has been handed to the client,
//! a complete one is committed to the database (and then handed to the client). So when
//! `emit` returns, later reads of session state already see the event's delta, and the
//! agent cannot outrun a slow client (back-pressure).

pub mod echo;
pub mod llm;
pub mod memory_ingest;
pub mod remote_a2a;
pub mod workflow;

// The shared vocabulary lives below agents and tools (`crate::invocation`); agents' users
// find it here too.
pub use crate::invocation::{
    transfer_targets, Agent, AgentCallback, AgentCallbacks, AgentError, AgentResult, AgentTree,
    CallbackContext, InvocationContext, Plugin, PluginSet, RunConfig, TreeError,
};

use crate::event::Content;
use std::sync::Arc;

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
