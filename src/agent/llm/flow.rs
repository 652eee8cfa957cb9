//! One turn of an LLM agent: the model ↔ tools loop.

use super::callbacks::{BeforeModel, ToolCall};
use super::history::{self, History};
use super::{instruction, LlmAgent};
use crate::agent::{
    run_agent, transfer_targets, AgentError, AgentResult, CallbackContext, InvocationContext,
};
use crate::event::{Content, Event, EventActions, FunctionCall, FunctionResponse, JsonMap, Part};
use crate::event::{CONFIRMATION_REJECTED, CONFIRMATION_REQUIRED, REQUEST_CONFIRMATION};
use crate::model::{Aggregator, LlmRequest, LlmResponse, PartialChunk};
use crate::tools::builtin::{TransferToAgent, TRANSFER_TO_AGENT};
use crate::tools::{response_object, Tool, ToolConfirmation, ToolContext};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub(super) struct Turn<'a> {
    agent: &'a LlmAgent,
    ctx: &'a InvocationContext,
    history: History,
}

/// How a round of tool calls ended.
#[derive(Default)]
struct CallsOutcome {
    transfer: Option<String>,
    escalate: bool,
    skip_summarization: bool,
    /// A long-running call is waiting for the client, or a confirmation was requested.
    waiting: bool,
}

impl<'a> Turn<'a> {
    pub(super) fn new(agent: &'a LlmAgent, ctx: &'a InvocationContext) -> Self {
        Turn {
            agent,
            ctx,
            history: History::default(),
        }
    }

    pub(super) async fn run(mut self) -> AgentResult {
        self.history
            .load(self.ctx, self.agent.include_contents)
            .await?;

        // Calls answered by the client (confirmations) or left open (resume) run first.
        if let Some(outcome) = self.pending_work().await? {
            if self.after_calls(outcome).await? {
                return Ok(());
            }
        }

        for _ in 0..self.agent.max_steps {
            self.ctx.check_cancelled()?;
            let tools = match self.tools().await {
                Ok(t) => t,
                Err(message) => {
                    return self
                        .error_event("TOOLSET_UNAVAILABLE", &message, None)
                        .await;
                }
            };
            let by_name: HashMap<String, Arc<dyn Tool>> = tools
                .iter()
                .map(|t| (t.name().to_string(), t.clone()))
                .collect();
            let request = self.request(&tools).await?;
            let event_id = crate::event::new_event_id();
            let (response, delta) = self.model_response(request, &event_id).await?;

            if let Some(code) = response.error_code.clone() {
                let message = response.error_message.clone().unwrap_or_default();
                return self
                    .error_event(&code, &message, Some((event_id, response)))
                    .await;
            }
            let calls: Vec<FunctionCall> = response.function_calls().cloned().collect();
            let mut event = self.model_event(&response, &event_id, &by_name);
            event.actions.state_delta = delta;
            if calls.is_empty() {
                if let Some(key) = &self.agent.output_key {
                    let text = final_text(&response);
                    if !text.is_empty() {
                        event
                            .actions
                            .state_delta
                            .insert(key.clone(), Value::String(text));
                    }
                }
            }
            if calls.is_empty() {
                // The final answer: committed with the run's outcome if nothing follows.
                if event.content.is_some() || !event.actions.is_default() {
                    self.ctx.emit_final(event).await?;
                }
                return Ok(());
            }
            if event.content.is_some() || !event.actions.is_default() {
                self.ctx.emit(event).await?;
            }
            let invalid: HashMap<String, String> = response.invalid_calls.iter().cloned().collect();
            let outcome = self
                .run_calls(calls, &by_name, &invalid, &HashMap::new())
                .await?;
            if self.after_calls(outcome).await? {
                return Ok(());
            }
        }
        self.error_event(
            "MAX_STEPS_EXCEEDED",
            &format!(
                "{} stopped after {} model calls without a final answer (max_steps).",
                self.agent.name, self.agent.max_steps
            ),
            None,
        )
        .await
    }

    /// Acts on a round of tool calls; true when this turn is over.
    async fn after_calls(&mut self, outcome: CallsOutcome) -> AgentResult<bool> {
        if outcome.waiting {
            // The client answers in a later run; nothing after this agent runs now.
            self.ctx.end_invocation();
            return Ok(true);
        }
        if let Some(target) = outcome.transfer {
            let Some(agent) = self.ctx.tree().find(&target).cloned() else {
                return Err(AgentError::failed(
                    "ValueError",
                    format!("Agent {target} not found in the agent tree."),
                ));
            };
            run_agent(&agent, self.ctx).await?;
            return Ok(true);
        }
        if outcome.escalate || outcome.skip_summarization {
            return Ok(true);
        }
        self.history.refresh(self.ctx).await?;
        Ok(false)
    }

    /// The agent's tools for this step: its own, its toolsets', and `transfer_to_agent` when
    /// it has somewhere to transfer to.
    async fn tools(&self) -> Result<Vec<Arc<dyn Tool>>, String> {
        let mut tools = self.agent.tools.clone();
        for set in &self.agent.toolsets {
            let more = set
                .tools(self.ctx)
                .await
                .map_err(|e| format!("toolset {} is unavailable: {e}", set.name()))?;
            tools.extend(more);
        }
        if !transfer_targets(self.ctx.tree(), &self.agent.name).is_empty()
            && !tools.iter().any(|t| t.name() == TRANSFER_TO_AGENT)
        {
            tools.push(Arc::new(TransferToAgent));
        }
        // The client's own tools never shadow the agent's: a server tool of the same name wins.
        for decl in &self.ctx.run_config().client_tools {
            if !tools.iter().any(|t| t.name() == decl.name) {
                tools.push(Arc::new(crate::tools::ClientTool(decl.clone())));
            }
        }
        Ok(tools)
    }

    async fn request(&self, tools: &[Arc<dyn Tool>]) -> AgentResult<LlmRequest> {
        let mut system = String::new();
        for part in [&self.agent.global_instruction, &self.agent.instruction] {
            if !part.is_empty() {
                if !system.is_empty() {
                    system.push_str("\n\n");
                }
                system.push_str(&instruction::render(part, self.ctx).await?);
            }
        }
        let targets = transfer_targets(self.ctx.tree(), &self.agent.name);
        if !targets.is_empty() {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&transfer_instruction(self.ctx, &self.agent.name, &targets));
        }
        Ok(LlmRequest {
            model: self.agent.model.name().to_string(),
            system_instruction: (!system.is_empty()).then_some(system),
            contents: history::contents(
                &self.history,
                &self.agent.name,
                self.ctx.branch(),
                self.agent.include_contents,
            ),
            tools: tools.iter().map(|t| t.declaration()).collect(),
            config: self.agent.generate_config.clone(),
        })
    }

    /// Callbacks, then the model (streaming partials), then after-callbacks. Returns the
    /// response and the state the callbacks wrote.
    async fn model_response(
        &self,
        mut request: LlmRequest,
        event_id: &str,
    ) -> AgentResult<(LlmResponse, JsonMap)> {
        let cb = CallbackContext::new(self.ctx);
        let plugins = self.ctx.plugins();
        let mut answered = plugins.before_model(&cb, &mut request).await?;
        if answered.is_none() {
            for f in &self.agent.llm_callbacks.before_model {
                match f(cb.clone(), std::mem::take(&mut request)).await? {
                    BeforeModel::Continue(r) => request = r,
                    BeforeModel::Respond(r) => {
                        answered = Some(r);
                        break;
                    }
                }
            }
        }
        let mut response = match answered {
            Some(r) => r,
            None => self.call_model(&request, event_id).await?,
        };
        if response.error_code.is_none() {
            plugins.after_model(&cb, &mut response).await?;
            for f in &self.agent.llm_callbacks.after_model {
                response = f(cb.clone(), response).await?;
            }
        }
        Ok((response, cb.take_delta()))
    }

    async fn call_model(&self, request: &LlmRequest, event_id: &str) -> AgentResult<LlmResponse> {
        use tracing::Instrument;
        let started = std::time::Instant::now();
        let (provider, model) = (
            self.agent.model.provider(),
            self.agent.model.name().to_string(),
        );
        // OpenTelemetry GenAI semantic conventions.
        let span = tracing::info_span!(
            "chat",
            otel.name = %format!("chat {model}"),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.system = provider,
            gen_ai.request.model = %model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let response = self
            .call_model_inner(request, event_id)
            .instrument(span.clone())
            .await;
        if let Ok(r) = &response {
            if let Some(u) = r.usage {
                span.record("gen_ai.usage.input_tokens", u.prompt_tokens);
                span.record("gen_ai.usage.output_tokens", u.candidates_tokens);
            }
            if let Some(code) = &r.error_code {
                span.record("error.type", code.as_str());
            }
            let outcome = r.error_code.clone().unwrap_or_else(|| "ok".into());
            metrics::counter!("agentd_model_calls_total", "provider" => provider, "model" => model.clone(), "outcome" => outcome)
                .increment(1);
            metrics::histogram!("agentd_model_call_duration_seconds", "provider" => provider, "model" => model.clone())
                .record(started.elapsed().as_secs_f64());
            if let Some(u) = r.usage {
                metrics::counter!("agentd_model_tokens_total", "provider" => provider, "model" => model.clone(), "direction" => "input")
                    .increment(u.prompt_tokens);
                metrics::counter!("agentd_model_tokens_total", "provider" => provider, "model" => model, "direction" => "output")
                    .increment(u.candidates_tokens);
            }
        }
        response
    }

    async fn call_model_inner(
        &self,
        request: &LlmRequest,
        event_id: &str,
    ) -> AgentResult<LlmResponse> {
        let mut stream = match self.agent.model.stream(request).await {
            Ok(s) => s,
            Err(e) => return Ok(failed(LlmResponse::default(), e)),
        };
        let mut agg = Aggregator::default();
        let streaming = self.ctx.run_config().streaming;
        while let Some(item) = stream.next().await {
            match item {
                Ok(delta) => {
                    if let Some(chunk) = agg.push(delta) {
                        if streaming {
                            let partial = self.partial(event_id, chunk).await?;
                            self.ctx.emit(partial).await?;
                        }
                    }
                }
                Err(e) => {
                    let mut partial = agg.finish();
                    // Half-streamed calls cannot be answered; keep only the text.
                    if let Some(c) = &mut partial.content {
                        c.parts.retain(|p| p.function_call.is_none());
                    }
                    return Ok(failed(partial, e));
                }
            }
        }
        Ok(agg.finish())
    }

    /// A streamed chunk as a partial event. After-model hooks see each chunk too (ADK
    /// does the same), so a redacting callback also covers what is streamed.
    async fn partial(&self, event_id: &str, chunk: PartialChunk) -> AgentResult<Event> {
        let part = match chunk {
            PartialChunk::Text(t) => Part::text(t),
            PartialChunk::Thought(t) => Part {
                text: Some(t),
                thought: Some(true),
                ..Default::default()
            },
        };
        let mut response = LlmResponse {
            content: Some(Content {
                parts: vec![part],
                role: Some("model".into()),
                extra: JsonMap::new(),
            }),
            partial: true,
            ..Default::default()
        };
        let cb = CallbackContext::new(self.ctx);
        self.ctx.plugins().after_model(&cb, &mut response).await?;
        for f in &self.agent.llm_callbacks.after_model {
            response = f(cb.clone(), response).await?;
        }
        let mut e = self.ctx.new_event();
        e.id = event_id.to_string();
        e.partial = Some(true);
        e.content = response.content;
        Ok(e)
    }

    fn model_event(
        &self,
        r: &LlmResponse,
        event_id: &str,
        tools: &HashMap<String, Arc<dyn Tool>>,
    ) -> Event {
        let mut e = self.ctx.new_event();
        e.id = event_id.to_string();
        e.content = r.content.clone();
        e.finish_reason = r.finish_reason.clone();
        e.usage_metadata = r.usage.map(|u| u.to_json());
        e.model_version = r.model_version.clone();
        let calls: Vec<&FunctionCall> = r.function_calls().collect();
        if !calls.is_empty() {
            let mut ids: Vec<String> = calls
                .iter()
                .filter(|c| tools.get(&c.name).is_some_and(|t| t.is_long_running()))
                .filter_map(|c| c.id.clone())
                .collect();
            ids.sort();
            e.long_running_tool_ids = Some(ids);
        }
        e
    }

    /// Commits an error event (`errorCode`, `errorMessage`; any text already streamed, under
    /// the same id) and ends the invocation: the run completes with the error on record.
    async fn error_event(
        &self,
        code: &str,
        message: &str,
        streamed: Option<(String, LlmResponse)>,
    ) -> AgentResult {
        tracing::warn!(agent = %self.agent.name, code, message, "LLM agent stopped with an error");
        let mut e = self.ctx.new_event();
        if let Some((id, r)) = streamed {
            e.id = id;
            e.content = r.content.filter(|c| !c.parts.is_empty());
            e.model_version = r.model_version;
        }
        e.error_code = Some(code.to_string());
        e.error_message = Some(message.to_string());
        self.ctx.emit(e).await?;
        self.ctx.end_invocation();
        Ok(())
    }

    /// Runs `calls` concurrently and commits their responses as one event.
    async fn run_calls(
        &self,
        calls: Vec<FunctionCall>,
        tools: &HashMap<String, Arc<dyn Tool>>,
        invalid: &HashMap<String, String>,
        confirmations: &HashMap<String, ToolConfirmation>,
    ) -> AgentResult<CallsOutcome> {
        self.ctx.track_open_calls(&calls).await;
        let available: Vec<&str> = {
            let mut v: Vec<&str> = tools.keys().map(String::as_str).collect();
            v.sort();
            v
        };
        let runs = calls.iter().map(|call| {
            let id = call.id.clone().unwrap_or_default();
            let tool = tools.get(&call.name).cloned();
            let error = invalid.get(&id).cloned().or_else(|| {
                tool.is_none().then(|| {
                    format!(
                        "there is no tool named {:?}; available tools: {}",
                        call.name,
                        available.join(", ")
                    )
                })
            });
            self.run_call(call.clone(), tool, error, confirmations.get(&id).cloned())
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
    /// tool left the call pending.
    async fn run_call(
        &self,
        call: FunctionCall,
        tool: Option<Arc<dyn Tool>>,
        error: Option<String>,
        confirmation: Option<ToolConfirmation>,
    ) -> AgentResult<(Option<Part>, EventActions)> {
        let id = call.id.clone().unwrap_or_default();
        let tctx = ToolContext::new(self.ctx, id.clone(), confirmation);
        let value = match (tool, error) {
            (_, Some(e)) => Some(json!({ "error": e })),
            (None, None) => Some(json!({ "error": "unknown tool" })),
            (Some(tool), None) => self.invoke(&tool, &call, &tctx).await?,
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

    async fn invoke(
        &self,
        tool: &Arc<dyn Tool>,
        call: &FunctionCall,
        tctx: &ToolContext,
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

    /// ADK's confirmation request: one long-running `adk_request_confirmation` call per
    /// call that needs approval, carrying the original call and the confirmation asked for.
    async fn request_confirmations(
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
    async fn pending_work(&mut self) -> AgentResult<Option<CallsOutcome>> {
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
    fn original_call(&self, request_id: &str) -> Option<FunctionCall> {
        self.history
            .find_call(request_id)?
            .function_calls()
            .find(|c| c.id.as_deref() == Some(request_id))
            .and_then(|c| c.args.get("originalFunctionCall"))
            .and_then(|v| serde_json::from_value::<FunctionCall>(v.clone()).ok())
    }

    /// Every confirmation answer in the history, by original call id.
    fn approvals(&self) -> HashMap<String, ToolConfirmation> {
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

fn failed(mut r: LlmResponse, e: crate::model::ModelError) -> LlmResponse {
    r.error_code = Some(e.code.to_string());
    r.error_message = Some(e.message);
    r
}

fn final_text(r: &LlmResponse) -> String {
    r.content
        .iter()
        .flat_map(|c| c.parts.iter())
        .filter(|p| p.thought != Some(true))
        .filter_map(|p| p.text.as_deref())
        .collect()
}

/// ADK's instruction for agents that can transfer.
fn transfer_instruction(
    ctx: &InvocationContext,
    name: &str,
    targets: &[Arc<dyn crate::agent::Agent>],
) -> String {
    let mut s = String::from("You have a list of other agents to transfer to:\n\n");
    for t in targets {
        s.push_str(&format!(
            "Agent name: {}\nAgent description: {}\n\n",
            t.name(),
            t.description()
        ));
    }
    s.push_str(
        "If you are the best to answer the question according to your description, you can \
         answer it.\n\nIf another agent is better for answering the question according to its \
         description, call `transfer_to_agent` function to transfer the question to that agent. \
         When transferring, do not generate any text other than the function call.\n",
    );
    if let Some(parent) = ctx.tree().parent_of(name) {
        if targets.iter().any(|t| t.name() == parent.name()) {
            s.push_str(&format!(
                "\nYour parent agent is {}. If neither the other agents nor you are best for \
                 answering the question according to the descriptions, transfer to your parent \
                 agent.\n",
                parent.name()
            ));
        }
    }
    s
}
