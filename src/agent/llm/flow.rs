//! One turn of an LLM agent: the model ↔ tools loop.
//!
//! This file is the loop ([`Turn::run`]: build the request, call the model, run the calls,
//! repeat); beside it [`super::model_step`] (one model call, streamed), [`super::tool_calls`]
//! (running a round of function calls) and [`super::approvals`] (tool confirmations and
//! answers the client sends for long-running calls).

use super::history::{self, History};
use super::{instruction, LlmAgent};
use crate::agent::{run_agent, transfer_targets, AgentError, AgentResult, InvocationContext};
use crate::event::FunctionCall;
use crate::model::{LlmRequest, LlmResponse};
use crate::tools::builtin::{TransferToAgent, TRANSFER_TO_AGENT};
use crate::tools::Tool;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

pub(super) struct Turn<'a> {
    pub(super) agent: &'a LlmAgent,
    pub(super) ctx: &'a InvocationContext,
    pub(super) history: History,
}

/// How a round of tool calls ended.
#[derive(Default)]
pub(super) struct CallsOutcome {
    pub(super) transfer: Option<String>,
    pub(super) escalate: bool,
    pub(super) skip_summarization: bool,
    /// A long-running call is waiting for the client, or a confirmation was requested.
    pub(super) waiting: bool,
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
                        .error_event("TOOLSET_UNAVAILABLE", &message, None, true)
                        .await;
                }
            };
            let by_name: HashMap<String, Arc<dyn Tool>> = tools
                .iter()
                .map(|t| (t.name().to_string(), t.clone()))
                .collect();
            let request = self.request(&tools).await?;
            let event_id = crate::event::new_event_id();
            let (response, delta, failed) = self.model_response(request, &event_id).await?;

            if let Some(code) = response.error_code.clone() {
                let message = response.error_message.clone().unwrap_or_default();
                return self
                    .error_event(&code, &message, Some((event_id, response)), failed)
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
            let invalid: HashMap<String, Value> = response
                .invalid_calls
                .iter()
                .map(|(id, e)| (id.clone(), serde_json::json!({ "error": e })))
                .collect();
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
            true,
        )
        .await
    }

    /// Acts on a round of tool calls; true when this turn is over.
    pub(super) async fn after_calls(&mut self, outcome: CallsOutcome) -> AgentResult<bool> {
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
    pub(super) async fn tools(&self) -> Result<Vec<Arc<dyn Tool>>, String> {
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

    pub(super) async fn request(&self, tools: &[Arc<dyn Tool>]) -> AgentResult<LlmRequest> {
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
        // Tools that add to the request (ADK's `preload_memory`): a failure is the tool's, not
        // the run's, and leaves the instruction as it was.
        for tool in tools {
            match tool.instruction(self.ctx).await {
                Ok(Some(more)) => {
                    if !system.is_empty() {
                        system.push_str("\n\n");
                    }
                    system.push_str(&more);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(tool = tool.name(), error = %e, "a tool could not add to the request")
                }
            }
        }
        let mut request = LlmRequest {
            model: self.agent.model.name().to_string(),
            system_instruction: (!system.is_empty()).then_some(system),
            contents: history::contents(
                &self.history,
                &self.agent.name,
                self.ctx.branch(),
                self.agent.include_contents,
            ),
            tools: tools
                .iter()
                .filter(|t| t.is_declared())
                .map(|t| t.declaration())
                .collect(),
            config: self.agent.generate_config.clone(),
            cache: None,
        };
        if let Some(c) = self.ctx.context_cache() {
            request.cache = c.hint(cache_key(self.ctx.session_key()), &request);
        }
        Ok(request)
    }
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

/// One prompt-cache key per session, naming none of its ids (it is sent to the provider).
fn cache_key(key: &crate::store::SessionKey) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(
        format!("{}\x1f{}\x1f{}", key.app_name, key.user_id, key.session_id).as_bytes(),
    );
    format!("agentd-{}", &crate::hex(&digest)[..32])
}
