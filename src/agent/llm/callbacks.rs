//! Model and tool callbacks of an LLM agent. Each may short-circuit: a before-model
//! callback that returns a response answers instead of the model, a before-tool callback
//! that returns a result answers instead of the tool; after-callbacks may replace what came
//! back. Runner plugins get the same four hooks (see [`crate::agent::Plugin`]) and run first.

use crate::invocation::{AgentResult, CallbackContext, ToolCall};

use crate::model::{LlmRequest, LlmResponse};
use crate::tools::ToolContext;
use futures::future::BoxFuture;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;

/// What a before-model hook decided.
pub enum BeforeModel {
    /// Call the model with this (possibly edited) request.
    Continue(LlmRequest),
    /// Do not call the model; use this response.
    Respond(LlmResponse),
}

pub type BeforeModelCallback = Arc<
    dyn Fn(CallbackContext, LlmRequest) -> BoxFuture<'static, AgentResult<BeforeModel>>
        + Send
        + Sync,
>;
pub type AfterModelCallback = Arc<
    dyn Fn(CallbackContext, LlmResponse) -> BoxFuture<'static, AgentResult<LlmResponse>>
        + Send
        + Sync,
>;

pub type BeforeToolCallback = Arc<
    dyn Fn(ToolCall, ToolContext) -> BoxFuture<'static, AgentResult<Option<Value>>> + Send + Sync,
>;
pub type AfterToolCallback = Arc<
    dyn Fn(ToolCall, ToolContext, Value) -> BoxFuture<'static, AgentResult<Option<Value>>>
        + Send
        + Sync,
>;

/// An LLM agent's model and tool callbacks, run in order.
#[derive(Clone, Default)]
pub struct LlmCallbacks {
    pub before_model: Vec<BeforeModelCallback>,
    pub after_model: Vec<AfterModelCallback>,
    pub before_tool: Vec<BeforeToolCallback>,
    pub after_tool: Vec<AfterToolCallback>,
}

impl LlmCallbacks {
    pub fn before_model<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(CallbackContext, LlmRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AgentResult<BeforeModel>> + Send + 'static,
    {
        self.before_model
            .push(Arc::new(move |c, r| Box::pin(f(c, r))));
        self
    }

    pub fn after_model<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(CallbackContext, LlmResponse) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AgentResult<LlmResponse>> + Send + 'static,
    {
        self.after_model
            .push(Arc::new(move |c, r| Box::pin(f(c, r))));
        self
    }

    pub fn before_tool<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(ToolCall, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AgentResult<Option<Value>>> + Send + 'static,
    {
        self.before_tool
            .push(Arc::new(move |c, t| Box::pin(f(c, t))));
        self
    }

    pub fn after_tool<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(ToolCall, ToolContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AgentResult<Option<Value>>> + Send + 'static,
    {
        self.after_tool
            .push(Arc::new(move |c, t, v| Box::pin(f(c, t, v))));
        self
    }
}
