//! Tool confirmations and long-running calls in an LLM agent's turn: asking the client to
//! approve a call (`adk_request_confirmation`), and taking up the work a client's answer
//! leaves (an approved call to run, a long-running call's result to send to the model).

use super::flow::{CallsOutcome, Turn};
use super::history::{self};
use crate::agent::{AgentError, AgentResult};
use crate::event::{Content, FunctionCall, FunctionResponse, JsonMap, Part};
use crate::event::{CONFIRMATION_REQUIRED, REQUEST_CONFIRMATION};
use crate::tools::{Tool, ToolConfirmation};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

impl<'a> Turn<'a> {
    /// ADK's confirmation request: one long-running `adk_request_confirmation` call per
    /// call that needs approval, carrying the original call and the confirmation asked for.
    pub(super) async fn request_confirmations(
        &self,
        calls: &[FunctionCall],
        requested: JsonMap,
    ) -> AgentResult {
        let mut parts = vec![];
        let mut ids = vec![];
        for (call_id, confirmation) in requested {
            let Some(original) = calls.iter().find(|c| c.id.as_deref() == Some(&call_id)) else {
                continue;
            };
            let id = format!("adk-{}", uuid::Uuid::new_v4());
            let mut args = JsonMap::new();
            args.insert(
                "originalFunctionCall".into(),
                serde_json::to_value(original).unwrap_or(Value::Null),
            );
            args.insert("toolConfirmation".into(), confirmation);
            parts.push(Part {
                function_call: Some(FunctionCall {
                    id: Some(id.clone()),
                    name: REQUEST_CONFIRMATION.into(),
                    args,
                    extra: JsonMap::new(),
                }),
                ..Default::default()
            });
            ids.push(id);
        }
        if parts.is_empty() {
            return Ok(());
        }
        ids.sort();
        let mut e = self.ctx.new_event();
        e.content = Some(Content {
            parts,
            role: Some("model".into()),
            extra: JsonMap::new(),
        });
        e.long_running_tool_ids = Some(ids);
        self.ctx.emit(e).await.map(|_| ())
    }

    /// Work left from an earlier run: confirmations the client just answered, or (with
    /// `resume`) this agent's calls that never got a response.
    pub(super) async fn pending_work(&mut self) -> AgentResult<Option<CallsOutcome>> {
        let answers: Vec<FunctionResponse> = self
            .ctx
            .user_content()
            .map(|c| {
                c.parts
                    .iter()
                    .filter_map(|p| p.function_response.clone())
                    .filter(|r| r.name == REQUEST_CONFIRMATION)
                    .collect()
            })
            .unwrap_or_default();
        // The common case: a plain new message, nothing left over. No tool listing.
        if answers.is_empty() && !self.ctx.run_config().resume {
            return Ok(None);
        }
        let tools = self
            .tools()
            .await
            .unwrap_or_else(|_| self.agent.tools.clone());
        let by_name: HashMap<String, Arc<dyn Tool>> = tools
            .iter()
            .map(|t| (t.name().to_string(), t.clone()))
            .collect();
        let latest = self.history.latest_responses();
        let awaiting_approval = |id: &str| {
            latest.get(id).is_some_and(|r| {
                r.response.get("error").and_then(Value::as_str) == Some(CONFIRMATION_REQUIRED)
            })
        };

        // Confirmations in the new message. A call already resolved (a replayed approval,
        // a double click) is not run again: one approval, one execution.
        let mut confirmed_calls = vec![];
        let mut confirmations = HashMap::new();
        for answer in answers {
            let Some(original) = answer.id.as_deref().and_then(|id| self.original_call(id)) else {
                continue;
            };
            let Some(call_id) = original.id.clone() else {
                continue;
            };
            if !awaiting_approval(&call_id) || confirmations.contains_key(&call_id) {
                tracing::info!(call = %call_id, "confirmation for a call that is already resolved; ignored");
                continue;
            }
            confirmations.insert(call_id, parse_confirmation(&answer.response));
            confirmed_calls.push(original);
        }
        if !confirmed_calls.is_empty() {
            let outcome = self
                .run_calls(confirmed_calls, &by_name, &HashMap::new(), &confirmations)
                .await?;
            return Ok(Some(outcome));
        }

        if !self.ctx.run_config().resume {
            return Ok(None);
        }
        // This agent's calls since the last user message that have no response, or only a
        // cancelled run's seal: not calls waiting for approval or for the client.
        let since = self
            .history
            .events
            .iter()
            .rposition(history::is_user_message)
            .unwrap_or(0);
        // Only calls the model made in a run of this server: events a client imported with
        // create-session may carry calls of any shape, and running them would let a client
        // execute tools with arguments of its choosing.
        let ours: HashSet<String> = self
            .ctx
            .store()
            .run_invocations(self.ctx.session_key())
            .await
            .map_err(AgentError::store)?
            .into_iter()
            .collect();
        let sealed = self.history.sealed_calls();
        let open: Vec<FunctionCall> = self.history.events[since..]
            .iter()
            .filter(|e| e.author == self.agent.name && ours.contains(&e.invocation_id))
            .flat_map(|e| e.function_calls())
            .filter(|c| c.name != REQUEST_CONFIRMATION)
            .filter(|c| !by_name.get(&c.name).is_some_and(|t| t.is_long_running()))
            .filter(|c| {
                c.id.as_ref()
                    .is_none_or(|id| !latest.contains_key(id) || sealed.contains(id))
            })
            .cloned()
            .collect();
        if open.is_empty() {
            return Ok(None);
        }
        // Calls the client approved before the interruption keep their approval.
        let approvals = self.approvals();
        tracing::info!(agent = %self.agent.name, calls = open.len(), "resuming unanswered tool calls");
        let outcome = self
            .run_calls(open, &by_name, &HashMap::new(), &approvals)
            .await?;
        Ok(Some(outcome))
    }

    /// The call an `adk_request_confirmation` call (by id) asked about.
    pub(super) fn original_call(&self, request_id: &str) -> Option<FunctionCall> {
        self.history
            .find_call(request_id)?
            .function_calls()
            .find(|c| c.id.as_deref() == Some(request_id))
            .and_then(|c| c.args.get("originalFunctionCall"))
            .and_then(|v| serde_json::from_value::<FunctionCall>(v.clone()).ok())
    }

    /// Every confirmation answer in the history, by original call id.
    pub(super) fn approvals(&self) -> HashMap<String, ToolConfirmation> {
        let mut out = HashMap::new();
        for e in self.history.events.iter().filter(|e| e.author == "user") {
            for r in e
                .function_responses()
                .filter(|r| r.name == REQUEST_CONFIRMATION)
            {
                if let Some(original) = r.id.as_deref().and_then(|id| self.original_call(id)) {
                    if let Some(id) = original.id {
                        out.insert(id, parse_confirmation(&r.response));
                    }
                }
            }
        }
        out
    }
}

/// ADK's confirmation answer: `{"confirmed": bool, "payload": …}`, possibly JSON-encoded
/// under `response` (the web UI sends it that way).
fn parse_confirmation(response: &JsonMap) -> ToolConfirmation {
    let inner: Option<JsonMap> = response
        .get("response")
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str(s).ok());
    let r = inner.as_ref().unwrap_or(response);
    ToolConfirmation {
        confirmed: r.get("confirmed").and_then(Value::as_bool).unwrap_or(false),
        payload: r.get("payload").cloned(),
    }
}
