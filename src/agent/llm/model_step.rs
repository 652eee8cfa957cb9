//! One model call of an LLM agent's turn: the request through the before/after-model
//! callbacks, the streamed response as partial events, and the complete event.

use super::callbacks::BeforeModel;
use super::flow::Turn;
use crate::agent::{AgentResult, CallbackContext};
use crate::event::{Content, Event, FunctionCall, JsonMap, Part};
use crate::model::{Aggregator, LlmRequest, LlmResponse, PartialChunk};
use crate::tools::Tool;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;

impl<'a> Turn<'a> {
    /// Callbacks, then the model (streaming partials), then after-callbacks. Returns the
    /// response, the state the callbacks wrote, and whether the model call failed (its error
    /// is then in the response's `errorCode`; a callback that answers with an error code, or
    /// a finish reason the model gave, is no failed call).
    pub(super) async fn model_response(
        &self,
        mut request: LlmRequest,
        event_id: &str,
    ) -> AgentResult<(LlmResponse, JsonMap, bool)> {
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
        let (mut response, failed) = match answered {
            Some(r) => (r, false),
            None => self.call_model(&request, event_id).await?,
        };
        if response.error_code.is_none() {
            plugins.after_model(&cb, &mut response).await?;
            for f in &self.agent.llm_callbacks.after_model {
                response = f(cb.clone(), response).await?;
            }
        }
        Ok((response, cb.take_delta(), failed))
    }

    /// The model's response, and whether the call failed (the response then carries the
    /// error and whatever streamed before it).
    pub(super) async fn call_model(
        &self,
        request: &LlmRequest,
        event_id: &str,
    ) -> AgentResult<(LlmResponse, bool)> {
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
            gen_ai.agent.name = %self.ctx.agent_name(),
            gcp.vertex.agent.event_id = event_id,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.usage.cache_read.input_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        // A run whose budget (its user's, app's or key's) is spent makes no further call: it
        // fails with `BUDGET_EXHAUSTED` (docs/usage.md).
        if let Err(spent) = self.ctx.check_budget().await {
            let e = crate::model::ModelError {
                code: crate::model::BUDGET_EXHAUSTED,
                message: format!(
                    "{} is spent; it resets at {}.",
                    upper_first(spent.payer.whose()),
                    crate::usage::iso_time(spent.reset)
                ),
                retryable: false,
                retry_after: None,
            };
            return Ok((failed(LlmResponse::default(), e), true));
        }
        use crate::telemetry::traces::annotate;
        annotate(&span, "gcp.vertex.agent.llm_request", || {
            crate::model::trace::request_json(request)
        });
        let response = self
            .call_model_inner(request, event_id)
            .instrument(span.clone())
            .await;
        if let Ok((r, _)) = &response {
            annotate(&span, "gcp.vertex.agent.llm_response", || {
                crate::model::trace::response_json(r)
            });
            if let Some(u) = r.usage {
                span.record("gen_ai.usage.input_tokens", u.prompt_tokens);
                span.record("gen_ai.usage.output_tokens", u.candidates_tokens);
                // Part of the input tokens, as the semantic conventions count them.
                if let Some(cached) = u.cached_tokens {
                    span.record("gen_ai.usage.cache_read.input_tokens", cached);
                }
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
                self.ctx.record_usage(&model, u.tokens());
            }
        }
        response
    }

    pub(super) async fn call_model_inner(
        &self,
        request: &LlmRequest,
        event_id: &str,
    ) -> AgentResult<(LlmResponse, bool)> {
        let mut stream = match self.agent.model.stream(request).await {
            Ok(s) => s,
            Err(e) => return Ok((failed(LlmResponse::default(), e), true)),
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
                    return Ok((failed(partial, e), true));
                }
            }
        }
        Ok((agg.finish(), false))
    }

    /// A streamed chunk as a partial event. After-model hooks see each chunk too (ADK
    /// does the same), so a redacting callback also covers what is streamed.
    pub(super) async fn partial(&self, event_id: &str, chunk: PartialChunk) -> AgentResult<Event> {
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

    pub(super) fn model_event(
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
    /// the same id) and ends the invocation. `fails`: the run fails with it (a model call or a
    /// toolset that failed, a loop that never answered); otherwise (a callback answered with
    /// an error code, as ADK allows) the run completes with the error on record.
    pub(super) async fn error_event(
        &self,
        code: &str,
        message: &str,
        streamed: Option<(String, LlmResponse)>,
        fails: bool,
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
        match fails {
            true => Err(crate::agent::AgentError::failed(code, message)),
            false => Ok(()),
        }
    }
}

fn failed(mut r: LlmResponse, e: crate::model::ModelError) -> LlmResponse {
    r.error_code = Some(e.code.to_string());
    r.error_message = Some(e.message);
    r
}

/// "the app's budget" → "The app's budget".
fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}
