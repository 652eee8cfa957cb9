//! Tool confirmations and long-running calls in an LLM agent's turn: asking the client to
//! approve a call (`adk_request_confirmation`), and taking up the work a client's answer
//! leaves (an approved call to run, a long-running call's result to send to the model).
//!
//! A client writes into the session too (its new message, events it imports), so a client can
//! write anything a confirmation round trip is made of: the request, the original call, the
//! placeholder response. Only its answer is taken from it; everything that decides which tool
//! runs with which arguments is taken from events this agent wrote in a run of this session
//! ([`history::written_by`]).

use super::flow::{CallsOutcome, Turn};
use super::history;
use crate::agent::{AgentError, AgentResult};
use crate::event::REQUEST_CONFIRMATION;
use crate::event::{Content, FunctionCall, FunctionResponse, JsonMap, Part};
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
    ///
    /// Both run tools without asking the model, so both act only on what this server wrote:
    /// a confirmation request, the call it asks about and the "requires confirmation"
    /// placeholder must be events this agent wrote in a run of this session
    /// ([`history::written_by`]). The client writes the answer and nothing else: a forged
    /// request in its new message (or beside events it imported) would otherwise name any
    /// server tool with arguments of its choosing and skip `require_confirmation`.
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
        // The common case: a plain new message, nothing left over. No tool listing, no
        // reading of the session's runs.
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
        let ours = self.server_runs().await?;
        let awaiting = self.history.awaiting_approval(&self.agent.name, &ours);

        // Confirmations in the new message. A call already resolved (a replayed approval,
        // a double click) is not run again: one approval, one execution.
        let mut confirmed_calls = vec![];
        let mut confirmations = HashMap::new();
        for answer in answers {
            let Some(original) = answer
                .id
                .as_deref()
                .and_then(|id| self.original_call(id, &ours))
            else {
                tracing::info!(
                    agent = %self.agent.name,
                    request = answer.id.as_deref().unwrap_or_default(),
                    "confirmation answer for a request this agent did not make in a run of this session; ignored"
                );
                continue;
            };
            let Some(call_id) = original.id.clone() else {
                continue;
            };
            if !awaiting.contains(&call_id) || confirmations.contains_key(&call_id) {
                tracing::info!(call = %call_id, "confirmation for a call that is not waiting for approval; ignored");
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
            .rposition(crate::transcript::rewind::is_user_turn)
            .unwrap_or(0);
        // Only calls the model made in a run of this server: events a client imported with
        // create-session may carry calls of any shape, and running them would let a client
        // execute tools with arguments of its choosing.
        let latest = self.history.latest_responses();
        let sealed = self.history.sealed_calls();
        let open: Vec<FunctionCall> = self.history.events[since..]
            .iter()
            .filter(|e| history::written_by(e, &self.agent.name, &ours))
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
            return Ok(self.waiting_since(since).then(|| CallsOutcome {
                waiting: true,
                ..Default::default()
            }));
        }
        // Calls the client approved before the interruption keep their approval (only
        // approvals of requests this agent made here: see `original_call`).
        let approvals = self.approvals(&ours);
        let answers = match self.ctx.run_config().takeover {
            true => interrupted_answers(&open, &by_name),
            false => HashMap::new(),
        };
        tracing::info!(agent = %self.agent.name, calls = open.len(), repeated = open.len() - answers.len(), "resuming unanswered tool calls");
        let outcome = self.run_calls(open, &by_name, &answers, &approvals).await?;
        Ok(Some(outcome))
    }

    /// A taken-over turn that had already stopped to wait (a confirmation requested, a
    /// long-running call left open) when its replica died: it waits still.
    fn waiting_since(&self, since: usize) -> bool {
        if !self.ctx.run_config().takeover {
            return false;
        }
        let latest = self.history.latest_responses();
        self.history.events[since..]
            .iter()
            .filter(|e| e.author == self.agent.name)
            .any(|e| {
                let long: &[String] = e.long_running_tool_ids.as_deref().unwrap_or(&[]);
                e.function_calls().any(|c| {
                    let open = c.id.as_ref().is_some_and(|id| !latest.contains_key(id));
                    open && (c.name == REQUEST_CONFIRMATION
                        || c.id.as_ref().is_some_and(|id| long.contains(id)))
                })
            })
    }

    /// The invocation ids of this session's runs on this server: what tells an event the
    /// server wrote from one a client imported (see [`history::written_by`]).
    async fn server_runs(&self) -> AgentResult<HashSet<String>> {
        Ok(self
            .ctx
            .store()
            .run_invocations(self.ctx.session_key())
            .await
            .map_err(AgentError::store)?
            .into_iter()
            .collect())
    }

    /// The call the confirmation request `request_id` asked about, if that request is one this
    /// agent wrote in a run of this session (`ours`: the runs' invocation ids).
    ///
    /// The request must be an `adk_request_confirmation` call in an event this agent wrote here
    /// ([`history::written_by`]: not the client's new message, not imported events) and listed
    /// in that event's `longRunningToolIds`, as [`Turn::request_confirmations`] writes it; a call
    /// of that name that the model itself made (its events list only long-running tools) is not
    /// a request. The original call, with its arguments, is taken from that request only, and
    /// must be the newest call of that id this agent made here, with the same tool and
    /// arguments: a provider that reuses call ids across turns cannot make an old approval
    /// (of other arguments) count for a newer call.
    pub(super) fn original_call(
        &self,
        request_id: &str,
        ours: &HashSet<String>,
    ) -> Option<FunctionCall> {
        let agent = self.agent.name.as_str();
        let request = self
            .history
            .events
            .iter()
            .rev()
            .filter(|e| history::written_by(e, agent, ours))
            .filter(|e| {
                e.long_running_tool_ids
                    .as_ref()
                    .is_some_and(|ids| ids.iter().any(|id| id == request_id))
            })
            .flat_map(|e| e.function_calls())
            .find(|c| c.name == REQUEST_CONFIRMATION && c.id.as_deref() == Some(request_id))?;
        let original = request
            .args
            .get("originalFunctionCall")
            .and_then(|v| serde_json::from_value::<FunctionCall>(v.clone()).ok())?;
        let call_id = original.id.as_deref()?;
        let made = self
            .history
            .events
            .iter()
            .rev()
            .filter(|e| history::written_by(e, agent, ours))
            .flat_map(|e| e.function_calls())
            .find(|c| c.name != REQUEST_CONFIRMATION && c.id.as_deref() == Some(call_id))?;
        let same = made.name == original.name && made.args == original.args;
        same.then_some(original)
    }

    /// Every confirmation answer in the history, by original call id: the client's answers
    /// (events authored `user`) to requests this agent made here (see `original_call`).
    pub(super) fn approvals(&self, ours: &HashSet<String>) -> HashMap<String, ToolConfirmation> {
        let mut out = HashMap::new();
        for e in self.history.events.iter().filter(|e| e.author == "user") {
            for r in e
                .function_responses()
                .filter(|r| r.name == REQUEST_CONFIRMATION)
            {
                if let Some(original) = r.id.as_deref().and_then(|id| self.original_call(id, ours))
                {
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

/// What a run taken over from a replica that stopped answers, instead of running it again, for
/// each open call whose tool is not safe to repeat (or is gone): the model is told the effect
/// is unknown, and nothing runs a second time. Idempotent tools' calls are left out: they run
/// again.
pub(super) fn interrupted_answers(
    open: &[FunctionCall],
    tools: &HashMap<String, Arc<dyn Tool>>,
) -> HashMap<String, serde_json::Value> {
    let mut answers = HashMap::new();
    for call in open {
        let tool = call.name.clone();
        if tools.get(&call.name).is_some_and(|t| t.is_idempotent()) {
            metrics::counter!("agentd_tool_calls_repeated_total", "tool" => tool).increment(1);
            continue;
        }
        metrics::counter!("agentd_tool_calls_interrupted_total", "tool" => tool).increment(1);
        if let Some(id) = &call.id {
            answers.insert(id.clone(), crate::event::interrupted_response());
        }
    }
    answers
}
