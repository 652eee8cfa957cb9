//! A round of function calls in an LLM agent's turn: each call through the before/after-tool
//! callbacks, run in parallel, answered in one event.

use super::flow::{CallsOutcome, Turn};
use crate::agent::{AgentError, AgentResult};
use crate::event::{Content, EventActions, FunctionCall, FunctionResponse, JsonMap, Part};
use crate::event::{CONFIRMATION_REJECTED, CONFIRMATION_REQUIRED};
use crate::invocation::ToolCall;
use crate::tools::{response_object, Tool, ToolConfirmation, ToolContext};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

impl<'a> Turn<'a> {
    /// Runs `calls` concurrently and commits their responses as one event. A call with an
    /// answer in `answers` (an invalid call's error, a call that must not run again) is not
    /// run: that answer is its response.
    pub(super) async fn run_calls(
        &self,
        calls: Vec<FunctionCall>,
        tools: &HashMap<String, Arc<dyn Tool>>,
        answers: &HashMap<String, Value>,
        confirmations: &HashMap<String, ToolConfirmation>,
    ) -> AgentResult<CallsOutcome> {
        self.ctx.track_open_calls(&calls).await;
        // The id of the event that will carry the responses, known before the calls run so
        // that each call's span names it (as ADK's `execute_tool` spans do).
        let response_id = crate::event::new_event_id();
        let available: Vec<&str> = {
            let mut v: Vec<&str> = tools.keys().map(String::as_str).collect();
            v.sort();
            v
        };
        let runs = calls.iter().map(|call| {
            let id = call.id.clone().unwrap_or_default();
            let tool = tools.get(&call.name).cloned();
            let answer = answers.get(&id).cloned().or_else(|| {
                tool.is_none().then(|| {
                    json!({ "error": format!(
                        "there is no tool named {:?}; available tools: {}",
                        call.name,
                        available.join(", ")
                    ) })
                })
            });
            let confirmation = confirmations.get(&id).cloned();
            self.run_call(call.clone(), tool, answer, confirmation, &response_id)
        });
        let results = futures::future::join_all(runs).await;

        let mut parts = vec![];
        let mut actions = EventActions::default();
        let mut outcome = CallsOutcome::default();
        for r in results {
            let (part, a) = r?;
            match part {
                Some(p) => parts.push(p),
                None => outcome.waiting = true,
            }
            actions.state_delta.extend(a.state_delta);
            if a.transfer_to_agent.is_some() {
                actions.transfer_to_agent = a.transfer_to_agent;
            }
            if a.escalate == Some(true) {
                actions.escalate = Some(true);
            }
            if a.skip_summarization == Some(true) {
                actions.skip_summarization = Some(true);
            }
            actions
                .requested_tool_confirmations
                .extend(a.requested_tool_confirmations);
        }
        outcome.transfer = actions.transfer_to_agent.clone();
        outcome.escalate = actions.escalate == Some(true);
        outcome.skip_summarization = actions.skip_summarization == Some(true);
        let requested = actions.requested_tool_confirmations.clone();
        if !parts.is_empty() || !actions.is_default() {
            let mut e = self.ctx.new_event();
            e.id = response_id;
            e.content = Some(Content {
                parts,
                role: Some("user".into()),
                extra: JsonMap::new(),
            });
            e.actions = actions;
            self.ctx.emit(e).await?;
        }
        if !requested.is_empty() {
            self.request_confirmations(&calls, requested).await?;
            outcome.waiting = true;
        }
        Ok(outcome)
    }

    /// One call: checks, before-callbacks (which may answer instead, even before an
    /// approval is asked for), confirmation, the tool (in its own task, so a panicking tool
    /// is an error response, not a dead run), after-callbacks. `None` when a long-running
    /// tool left the call pending. With `answer`, the call is not run: that is its response.
    pub(super) async fn run_call(
        &self,
        call: FunctionCall,
        tool: Option<Arc<dyn Tool>>,
        answer: Option<Value>,
        confirmation: Option<ToolConfirmation>,
        response_id: &str,
    ) -> AgentResult<(Option<Part>, EventActions)> {
        let id = call.id.clone().unwrap_or_default();
        let tctx = ToolContext::new(self.ctx, id.clone(), confirmation);
        let value = match (tool, answer) {
            (_, Some(v)) => Some(v),
            (None, None) => Some(json!({ "error": "unknown tool" })),
            (Some(tool), None) => self.invoke(&tool, &call, &tctx, response_id).await?,
        };
        let part = value.map(|v| Part {
            function_response: Some(FunctionResponse {
                id: Some(id),
                name: call.name.clone(),
                response: response_object(Ok(v)),
                extra: JsonMap::new(),
            }),
            ..Default::default()
        });
        Ok((part, tctx.take_actions()))
    }

    pub(super) async fn invoke(
        &self,
        tool: &Arc<dyn Tool>,
        call: &FunctionCall,
        tctx: &ToolContext,
        response_id: &str,
    ) -> AgentResult<Option<Value>> {
        let tc = ToolCall {
            name: call.name.clone(),
            args: call.args.clone(),
        };
        let plugins = self.ctx.plugins();
        let mut short = plugins.before_tool(tctx, &tc).await?;
        if short.is_none() {
            for f in &self.agent.llm_callbacks.before_tool {
                if let Some(v) = f(tc.clone(), tctx.clone()).await? {
                    short = Some(v);
                    break;
                }
            }
        }
        let confirmation = tctx.tool_confirmation();
        if short.is_none() && tool.requires_confirmation() {
            match confirmation {
                None => {
                    tctx.request_confirmation(
                        format!(
                            "Please approve or reject the tool call {}() by responding with a \
                             FunctionResponse with an expected ToolConfirmation payload.",
                            call.name
                        ),
                        None,
                    );
                    return Ok(Some(json!({ "error": CONFIRMATION_REQUIRED })));
                }
                Some(c) if !c.confirmed => {
                    return Ok(Some(json!({ "error": CONFIRMATION_REJECTED })));
                }
                Some(_) => {}
            }
        }
        let mut value = match short {
            Some(v) => v,
            None => {
                let (tool, args, t) = (tool.clone(), call.args.clone(), tctx.clone());
                let started = std::time::Instant::now();
                let span = tracing::info_span!(
                    "execute_tool",
                    otel.name = %format!("execute_tool {}", call.name),
                    gen_ai.operation.name = "execute_tool",
                    gen_ai.tool.name = %call.name,
                    gen_ai.tool.call.id = call.id.as_deref().unwrap_or(""),
                    gen_ai.agent.name = %self.ctx.agent_name(),
                    gcp.vertex.agent.event_id = response_id,
                );
                let task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
                    tracing::Instrument::instrument(async move { tool.call(args, &t).await }, span),
                ));
                let (value, outcome) = match task.await {
                    Ok(Ok(v)) => (v, "ok"),
                    Ok(Err(e)) => (json!({ "error": e.0 }), "error"),
                    Err(e) if e.is_panic() => {
                        tracing::error!(tool = %call.name, "tool panicked");
                        let msg = format!("the tool {} failed unexpectedly", call.name);
                        (json!({ "error": msg }), "error")
                    }
                    Err(_) => return Err(AgentError::Cancelled),
                };
                metrics::counter!("agentd_tool_calls_total", "tool" => call.name.clone(), "outcome" => outcome)
                    .increment(1);
                metrics::histogram!("agentd_tool_call_duration_seconds", "tool" => call.name.clone())
                    .record(started.elapsed().as_secs_f64());
                value
            }
        };
        if tool.is_long_running() && value.is_null() {
            return Ok(None);
        }
        plugins.after_tool(tctx, &tc, &mut value).await?;
        for f in &self.agent.llm_callbacks.after_tool {
            if let Some(v) = f(tc.clone(), tctx.clone(), value.clone()).await? {
                value = v;
            }
        }
        Ok(Some(value))
    }
}
