//! Runner plugins: cross-cutting hooks over every run of every app (logging, policy,
//! redaction, metrics). Named (unique), run in registration order.

use super::{AgentError, AgentResult, InvocationContext};
use crate::event::{Content, Event};
use async_trait::async_trait;
use std::sync::Arc;

#[async_trait]
pub trait Plugin: Send + Sync + 'static {
    fn name(&self) -> &str;

    /// Before the agent runs (after the user event is committed). Returning content ends the
    /// run early with that content as the root agent's event.
    async fn before_run(&self, _ctx: &InvocationContext) -> AgentResult<Option<Content>> {
        Ok(None)
    }

    /// Every event, partial or complete, before it is committed or streamed; may rewrite it.
    async fn on_event(&self, _ctx: &InvocationContext, _event: &mut Event) -> AgentResult {
        Ok(())
    }

    /// After the run, whatever its outcome.
    async fn after_run(&self, _ctx: &InvocationContext) {}

    /// Before an agent runs; returning content answers instead of it.
    async fn before_agent(
        &self,
        _ctx: &InvocationContext,
        _agent: &str,
    ) -> AgentResult<Option<Content>> {
        Ok(None)
    }

    /// After an agent ran; returned content is emitted as that agent's event.
    async fn after_agent(
        &self,
        _ctx: &InvocationContext,
        _agent: &str,
    ) -> AgentResult<Option<Content>> {
        Ok(None)
    }

    /// On server shutdown.
    async fn close(&self) {}
}

/// The registered plugins, in order.
#[derive(Default, Clone)]
pub struct PluginSet {
    plugins: Vec<Arc<dyn Plugin>>,
}

impl PluginSet {
    /// Fails if two plugins share a name.
    pub fn new(plugins: Vec<Arc<dyn Plugin>>) -> Result<Self, AgentError> {
        let mut seen = std::collections::HashSet::new();
        for p in &plugins {
            if !seen.insert(p.name().to_string()) {
                return Err(AgentError::failed(
                    "ValueError",
                    format!("plugin name {:?} is registered twice", p.name()),
                ));
            }
        }
        Ok(PluginSet { plugins })
    }

    pub async fn before_run(&self, ctx: &InvocationContext) -> AgentResult<Option<Content>> {
        for p in &self.plugins {
            if let Some(c) = p.before_run(ctx).await? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    pub async fn on_event(&self, ctx: &InvocationContext, event: &mut Event) -> AgentResult {
        for p in &self.plugins {
            p.on_event(ctx, event).await?;
        }
        Ok(())
    }

    pub async fn after_run(&self, ctx: &InvocationContext) {
        for p in &self.plugins {
            p.after_run(ctx).await;
        }
    }

    pub async fn before_agent(
        &self,
        ctx: &InvocationContext,
        agent: &str,
    ) -> AgentResult<Option<Content>> {
        for p in &self.plugins {
            if let Some(c) = p.before_agent(ctx, agent).await? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    pub async fn after_agent(
        &self,
        ctx: &InvocationContext,
        agent: &str,
    ) -> AgentResult<Option<Content>> {
        for p in &self.plugins {
            if let Some(c) = p.after_agent(ctx, agent).await? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    pub async fn close(&self) {
        for p in &self.plugins {
            p.close().await;
        }
    }
}
