//! What one tool call sees ([`ToolContext`]): the invocation, the call's own state and
//! actions, and the confirmation flow; and a call as callbacks and plugins see it
//! ([`ToolCall`]).

use super::InvocationContext;
use crate::event::{EventActions, JsonMap, Part};
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// A tool call as callbacks see it.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub name: String,
    pub args: JsonMap,
}

/// The client's answer to a confirmation request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolConfirmation {
    pub confirmed: bool,
    pub payload: Option<Value>,
}

/// What one tool call sees and may change: state, artifacts, transfer/escalation, and the
/// confirmation flow. Its changes become the actions of the function-response event.
#[derive(Clone)]
pub struct ToolContext {
    ctx: InvocationContext,
    function_call_id: String,
    actions: Arc<Mutex<EventActions>>,
    confirmation: Option<ToolConfirmation>,
}

impl ToolContext {
    pub(crate) fn new(
        ctx: &InvocationContext,
        function_call_id: impl Into<String>,
        confirmation: Option<ToolConfirmation>,
    ) -> Self {
        ToolContext {
            ctx: ctx.clone(),
            function_call_id: function_call_id.into(),
            actions: Arc::new(Mutex::new(EventActions::default())),
            confirmation,
        }
    }

    fn actions(&self) -> std::sync::MutexGuard<'_, EventActions> {
        self.actions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn invocation(&self) -> &InvocationContext {
        &self.ctx
    }

    pub fn agent_name(&self) -> &str {
        self.ctx.agent_name()
    }

    pub fn function_call_id(&self) -> &str {
        &self.function_call_id
    }

    /// Reads state, seeing this call's own writes first.
    pub fn state_get(&self, key: &str) -> Option<Value> {
        let own = self.actions().state_delta.get(key).cloned();
        own.or_else(|| self.ctx.state_get(key))
    }

    /// Writes state; committed with the function-response event.
    pub fn set_state(&self, key: impl Into<String>, value: Value) {
        self.actions().state_delta.insert(key.into(), value);
    }

    /// Hands the conversation to another agent after this step.
    pub fn transfer_to_agent(&self, agent: impl Into<String>) {
        self.actions().transfer_to_agent = Some(agent.into());
    }

    /// Ends the enclosing loop agent (and this agent's turn).
    pub fn escalate(&self) {
        self.actions().escalate = Some(true);
    }

    /// The model is not called again with this tool's result.
    pub fn skip_summarization(&self) {
        self.actions().skip_summarization = Some(true);
    }

    /// Saves an artifact, committed with the function-response event.
    pub fn save_artifact(&self, filename: impl Into<String>, part: Part) {
        self.ctx.save_artifact(filename, part);
    }

    /// The client's approval or rejection, when this call was confirmed.
    pub fn tool_confirmation(&self) -> Option<&ToolConfirmation> {
        self.confirmation.as_ref()
    }

    /// Asks the client to approve this call; the call's response tells the model it waits.
    pub fn request_confirmation(&self, hint: impl Into<String>, payload: Option<Value>) {
        let mut conf = JsonMap::new();
        conf.insert("hint".into(), Value::String(hint.into()));
        conf.insert("confirmed".into(), Value::Bool(false));
        if let Some(p) = payload {
            conf.insert("payload".into(), p);
        }
        self.actions()
            .requested_tool_confirmations
            .insert(self.function_call_id.clone(), Value::Object(conf));
    }

    pub(crate) fn take_actions(&self) -> EventActions {
        std::mem::take(&mut *self.actions())
    }
}
