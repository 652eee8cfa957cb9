//! Before/after-agent callbacks.
//!
//! A before callback that returns content answers instead of the agent (its content becomes
//! the agent's event); an after callback's content is appended after the agent's events.
//! State a callback writes through [`CallbackContext::set_state`] becomes that event's
//! `stateDelta` (or a state-only event's, when the callback returns no content).

use super::{AgentResult, InvocationContext};
use crate::event::{Content, JsonMap};
use futures::future::BoxFuture;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// A before- or after-agent callback.
pub type AgentCallback =
    Arc<dyn Fn(CallbackContext) -> BoxFuture<'static, AgentResult<Option<Content>>> + Send + Sync>;

/// The callbacks of one agent, run in order.
#[derive(Clone, Default)]
pub struct AgentCallbacks {
    pub before: Vec<AgentCallback>,
    pub after: Vec<AgentCallback>,
}

impl AgentCallbacks {
    pub fn before<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(CallbackContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = AgentResult<Option<Content>>> + Send + 'static,
    {
        self.before.push(Arc::new(move |c| Box::pin(f(c))));
        self
    }

    pub fn after<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(CallbackContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = AgentResult<Option<Content>>> + Send + 'static,
    {
        self.after.push(Arc::new(move |c| Box::pin(f(c))));
        self
    }
}

/// What a callback sees: the invocation, and a state it may change.
#[derive(Clone)]
pub struct CallbackContext {
    ctx: InvocationContext,
    delta: Arc<Mutex<JsonMap>>,
}

impl CallbackContext {
    pub(crate) fn new(ctx: &InvocationContext) -> Self {
        CallbackContext {
            ctx: ctx.clone(),
            delta: Arc::new(Mutex::new(JsonMap::new())),
        }
    }

    pub fn invocation(&self) -> &InvocationContext {
        &self.ctx
    }

    pub fn agent_name(&self) -> &str {
        self.ctx.agent_name()
    }

    /// Reads state, seeing this callback's own writes first.
    pub fn state_get(&self, key: &str) -> Option<Value> {
        let delta = self.delta.lock().unwrap_or_else(|p| p.into_inner());
        delta.get(key).cloned().or_else(|| self.ctx.state_get(key))
    }

    /// Writes state; committed with the event this callback produces.
    pub fn set_state(&self, key: impl Into<String>, value: Value) {
        self.delta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.into(), value);
    }

    pub(crate) fn take_delta(&self) -> JsonMap {
        std::mem::take(&mut *self.delta.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
