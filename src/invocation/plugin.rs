//! Runner plugins: cross-cutting hooks over every run of every app (logging, policy,
//! redaction, metrics). Named (unique), run in registration order.

use super::{AgentError, AgentResult, CallbackContext, InvocationContext, ToolCall, ToolContext};
use crate::event::{Content, Event};
use crate::model::{LlmRequest, LlmResponse};
use async_trait::async_trait;
use serde_json::Value;
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

    /// Before an LLM agent calls its model; may edit the request, or answer instead.
    async fn before_model(
        &self,
        _ctx: &CallbackContext,
        _request: &mut LlmRequest,
    ) -> AgentResult<Option<LlmResponse>> {
        Ok(None)
    }

    /// After a model answered (aggregated response); may edit it.
    async fn after_model(
        &self,
        _ctx: &CallbackContext,
        _response: &mut LlmResponse,
    ) -> AgentResult {
        Ok(())
    }

    /// Before a tool runs; returning a result answers instead of the tool.
    async fn before_tool(
        &self,
        _ctx: &ToolContext,
        _call: &ToolCall,
    ) -> AgentResult<Option<Value>> {
        Ok(None)
    }

    /// After a tool ran; may edit its result.
    async fn after_tool(
        &self,
        _ctx: &ToolContext,
        _call: &ToolCall,
        _result: &mut Value,
    ) -> AgentResult {
        Ok(())
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

    /// Appends a plugin (the server adds its own, e.g. memory auto-ingest); fails if the name
    /// is taken.
    pub fn push(&mut self, plugin: Arc<dyn Plugin>) -> Result<(), AgentError> {
        if self.plugins.iter().any(|p| p.name() == plugin.name()) {
            return Err(AgentError::failed(
                "ValueError",
                format!("plugin name {:?} is registered twice", plugin.name()),
            ));
        }
        self.plugins.push(plugin);
        Ok(())
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

    pub async fn before_model(
        &self,
        ctx: &CallbackContext,
        request: &mut LlmRequest,
    ) -> AgentResult<Option<LlmResponse>> {
        for p in &self.plugins {
            if let Some(r) = p.before_model(ctx, request).await? {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    pub async fn after_model(
        &self,
        ctx: &CallbackContext,
        response: &mut LlmResponse,
    ) -> AgentResult {
        for p in &self.plugins {
            p.after_model(ctx, response).await?;
        }
        Ok(())
    }

    pub async fn before_tool(
        &self,
        ctx: &ToolContext,
        call: &ToolCall,
    ) -> AgentResult<Option<Value>> {
        for p in &self.plugins {
            if let Some(v) = p.before_tool(ctx, call).await? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    pub async fn after_tool(
        &self,
        ctx: &ToolContext,
        call: &ToolCall,
        result: &mut Value,
    ) -> AgentResult {
        for p in &self.plugins {
            p.after_tool(ctx, call, result).await?;
        }
        Ok(())
    }

    pub async fn close(&self) {
        for p in &self.plugins {
            p.close().await;
        }
    }
}
