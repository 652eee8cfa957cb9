//! `EchoAgent`: streams the user's text back, for demos, curl tutorials, tests and
//! benchmarks. No model, fully deterministic.
//!
//! One turn: N partial chunks of the text (optionally `chunk_delay_ms` apart), then one
//! complete event with the whole text and `stateDelta {"turns": n}`. Test hooks, all off by
//! default: `call_tool` wraps the reply in a function call/response pair, `fail_prefix`
//! makes a message starting with it fail after the first chunk, `ask_prefix` makes one end
//! with a long-running `ask_user` call (a run waiting for its user), and a message starting with
//! `@<sub_agent> ` transfers the turn to that sub-agent (as an LLM agent's
//! `transfer_to_agent` would).

use super::{run_agent, Agent, AgentCallbacks, AgentError, AgentResult, InvocationContext};
use crate::event::{Content, FunctionCall, FunctionResponse, Part};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Settings of an echo agent (the YAML fields besides `name`/`description`/`sub_agents`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoSettings {
    /// Partial chunks per reply (0: no partials).
    #[serde(default = "default_chunks")]
    pub chunks: usize,
    #[serde(default)]
    pub chunk_delay_ms: u64,
    #[serde(default)]
    pub disallow_transfer_to_parent: bool,
    /// Messages starting with this fail after one chunk (tests the error path).
    #[serde(default)]
    pub fail_prefix: Option<String>,
    /// Emit a call of this function before the reply and its response after it.
    #[serde(default)]
    pub call_tool: Option<String>,
    /// Messages starting with this end the turn with a long-running `ask_user` call and no
    /// reply: the run waits for the user, as a human-in-the-loop tool leaves it.
    #[serde(default)]
    pub ask_prefix: Option<String>,
}

fn default_chunks() -> usize {
    3
}

impl Default for EchoSettings {
    fn default() -> Self {
        EchoSettings {
            chunks: default_chunks(),
            chunk_delay_ms: 0,
            disallow_transfer_to_parent: false,
            fail_prefix: None,
            call_tool: None,
            ask_prefix: None,
        }
    }
}

pub struct EchoAgent {
    pub name: String,
    pub description: String,
    pub settings: EchoSettings,
    pub sub_agents: Vec<Arc<dyn Agent>>,
    pub callbacks: Option<AgentCallbacks>,
}

impl EchoAgent {
    pub fn new(name: impl Into<String>) -> Self {
        EchoAgent {
            name: name.into(),
            description: "Echoes the user's message.".into(),
            settings: EchoSettings::default(),
            sub_agents: vec![],
            callbacks: None,
        }
    }
}

/// Splits `text` into `n` pieces of about equal length, on character boundaries.
pub fn split_chunks(text: &str, n: usize) -> Vec<&str> {
    if n == 0 || text.is_empty() {
        return vec![];
    }
    let chars: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let n = n.min(chars.len());
    (0..n)
        .map(|k| {
            let start = chars[k * chars.len() / n];
            let end = if k + 1 == n {
                text.len()
            } else {
                chars[(k + 1) * chars.len() / n]
            };
            &text[start..end]
        })
        .collect()
}

#[async_trait]
impl Agent for EchoAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn sub_agents(&self) -> &[Arc<dyn Agent>] {
        &self.sub_agents
    }

    fn disallow_transfer_to_parent(&self) -> bool {
        self.settings.disallow_transfer_to_parent
    }

    fn callbacks(&self) -> Option<&AgentCallbacks> {
        self.callbacks.as_ref()
    }

    fn agent_class(&self) -> &str {
        "EchoAgent"
    }

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        let text = ctx.user_text();

        if let Some(rest) = text.strip_prefix('@') {
            let target = rest.split_whitespace().next().unwrap_or("");
            if let Some(child) = self.sub_agents.iter().find(|a| a.name() == target) {
                let mut transfer = ctx.new_event();
                transfer.actions.transfer_to_agent = Some(target.to_string());
                ctx.emit(transfer).await?;
                return run_agent(child, ctx).await;
            }
        }

        let call_id = format!("adk-{}", uuid::Uuid::new_v4());
        if let Some(prefix) = &self.settings.ask_prefix {
            if text.starts_with(prefix.as_str()) {
                let call = Part {
                    function_call: Some(FunctionCall {
                        id: Some(call_id.clone()),
                        name: "ask_user".into(),
                        args: serde_json::from_value(json!({ "question": text }))
                            .unwrap_or_default(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let mut ev = ctx.new_event().with_content(Content {
                    parts: vec![call],
                    role: Some("model".into()),
                    ..Default::default()
                });
                ev.long_running_tool_ids = Some(vec![call_id]);
                return ctx.emit_final(ev).await;
            }
        }
        if let Some(tool) = &self.settings.call_tool {
            let call = Part {
                function_call: Some(FunctionCall {
                    id: Some(call_id.clone()),
                    name: tool.clone(),
                    args: serde_json::from_value(json!({ "text": text })).unwrap_or_default(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let mut ev = ctx.new_event().with_content(Content {
                parts: vec![call],
                role: Some("model".into()),
                ..Default::default()
            });
            ev.long_running_tool_ids = Some(vec![]);
            ctx.emit(ev).await?;
        }

        let delay = Duration::from_millis(self.settings.chunk_delay_ms);
        for chunk in split_chunks(&text, self.settings.chunks) {
            let mut ev = ctx.new_event().with_content(Content::text("model", chunk));
            ev.partial = Some(true);
            ctx.emit(ev).await?;
            if let Some(prefix) = &self.settings.fail_prefix {
                if text.starts_with(prefix.as_str()) {
                    return Err(AgentError::failed(
                        "RuntimeError",
                        format!("deliberate failure from {}", self.name),
                    ));
                }
            }
            if !delay.is_zero() {
                ctx.sleep(delay).await?;
            }
        }

        if let Some(tool) = &self.settings.call_tool {
            let resp = Part {
                function_response: Some(FunctionResponse {
                    id: Some(call_id),
                    name: tool.clone(),
                    response: serde_json::from_value(json!({ "result": "echoed" }))
                        .unwrap_or_default(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            ctx.emit(ctx.new_event().with_content(Content {
                parts: vec![resp],
                role: Some("user".into()),
                ..Default::default()
            }))
            .await?;
        }

        let turns = ctx.state_get("turns").and_then(|v| v.as_i64()).unwrap_or(0) + 1;
        let mut reply = ctx.new_event().with_content(Content::text("model", text));
        reply
            .actions
            .state_delta
            .insert("turns".into(), json!(turns));
        ctx.emit_final(reply).await
    }
}

#[cfg(test)]
mod tests {
    use super::split_chunks;

    #[test]
    fn chunks_cover_the_text_exactly() {
        let text = "Hello, wörld! ✓";
        for n in 1..20 {
            let parts = split_chunks(text, n);
            assert_eq!(parts.concat(), text);
            assert!(parts.len() <= n);
        }
        assert!(split_chunks("", 3).is_empty());
        assert!(split_chunks("abc", 0).is_empty());
        assert_eq!(split_chunks("abcdef", 3), vec!["ab", "cd", "ef"]);
    }
}
