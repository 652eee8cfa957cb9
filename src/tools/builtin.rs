//! Built-in tools: `transfer_to_agent`, `exit_loop`, `load_artifacts`, `load_memory`,
//! `preload_memory`.

use super::{Tool, ToolContext, ToolError, ToolResult};
use crate::event::JsonMap;
use crate::invocation::{transfer_targets, InvocationContext};
use async_trait::async_trait;
use serde_json::{json, Value};

pub const TRANSFER_TO_AGENT: &str = "transfer_to_agent";

/// Hands the conversation to another agent: a sub-agent, the parent, or a peer, as the
/// agent's `disallow_transfer_to_parent` / `disallow_transfer_to_peers` allow.
pub struct TransferToAgent;

#[async_trait]
impl Tool for TransferToAgent {
    fn name(&self) -> &str {
        TRANSFER_TO_AGENT
    }

    /// Control, or a read: safe to run again.
    fn is_idempotent(&self) -> bool {
        true
    }

    fn description(&self) -> &str {
        "Transfer the question to another agent. Use this when another agent is better \
         suited to answer, according to the agents' descriptions."
    }

    fn parameters(&self) -> Option<Value> {
        Some(json!({
            "type": "object",
            "properties": {"agent_name": {"type": "string", "description": "the agent to transfer to"}},
            "required": ["agent_name"],
        }))
    }

    async fn call(&self, args: JsonMap, ctx: &ToolContext) -> ToolResult {
        let target = args
            .get("agent_name")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::new("missing string argument `agent_name`"))?;
        let inv = ctx.invocation();
        let allowed: Vec<String> = transfer_targets(inv.tree(), inv.agent_name())
            .iter()
            .map(|a| a.name().to_string())
            .collect();
        if !allowed.iter().any(|a| a == target) {
            return Err(ToolError(format!(
                "cannot transfer to {target:?}; the agents you can transfer to are: {}",
                allowed.join(", ")
            )));
        }
        ctx.transfer_to_agent(target);
        Ok(json!({}))
    }
}

/// Ends the enclosing loop agent (escalates).
pub struct ExitLoop;

#[async_trait]
impl Tool for ExitLoop {
    fn name(&self) -> &str {
        "exit_loop"
    }

    /// Control, or a read: safe to run again.
    fn is_idempotent(&self) -> bool {
        true
    }

    fn description(&self) -> &str {
        "Exits the loop. Call this function only when you are instructed to do so."
    }

    async fn call(&self, _args: JsonMap, ctx: &ToolContext) -> ToolResult {
        ctx.escalate();
        ctx.skip_summarization();
        Ok(json!({}))
    }
}

/// Reads artifacts of the session (and the user's `user:` artifacts) into the conversation.
pub struct LoadArtifacts;

/// Text shown to the model for one artifact: text as is, text-like blobs decoded, other
/// blobs described (and sent inline only to models that take them via the history).
fn artifact_text(part: &crate::event::Part) -> Value {
    if let Some(t) = &part.text {
        return json!({"text": t});
    }
    if let Some(blob) = &part.inline_data {
        let mime = blob.mime_type.clone().unwrap_or_default();
        let textual = mime.starts_with("text/")
            || mime.contains("json")
            || mime.contains("xml")
            || mime.contains("yaml");
        if textual {
            return json!({"mimeType": mime, "text": String::from_utf8_lossy(&blob.data.0)});
        }
        return json!({"mimeType": mime, "sizeBytes": blob.data.0.len(), "note": "binary content not shown"});
    }
    json!({"note": "empty artifact"})
}

#[async_trait]
impl Tool for LoadArtifacts {
    fn name(&self) -> &str {
        "load_artifacts"
    }

    /// Control, or a read: safe to run again.
    fn is_idempotent(&self) -> bool {
        true
    }

    fn description(&self) -> &str {
        "Loads artifacts (files) saved in this conversation. Call it with no names to list \
         the available artifacts, then with the names you need."
    }

    fn parameters(&self) -> Option<Value> {
        Some(json!({
            "type": "object",
            "properties": {"artifact_names": {"type": "array", "items": {"type": "string"}}},
        }))
    }

    async fn call(&self, args: JsonMap, ctx: &ToolContext) -> ToolResult {
        let inv = ctx.invocation();
        let names: Vec<String> = match args.get("artifact_names") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| ToolError::new("`artifact_names` must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(ToolError::new("`artifact_names` must be a list of strings")),
        };
        if names.is_empty() {
            let available = list_artifacts(inv).await?;
            return Ok(json!({"available_artifacts": available}));
        }
        let mut out = JsonMap::new();
        for name in names {
            let part = inv
                .load_artifact(&name, None)
                .await
                .map_err(|e| ToolError(e.message()))?;
            out.insert(
                name.clone(),
                match part {
                    Some(p) => artifact_text(&p),
                    None => json!({"error": "no such artifact"}),
                },
            );
        }
        Ok(json!({"artifacts": out}))
    }
}

async fn list_artifacts(inv: &InvocationContext) -> Result<Vec<String>, ToolError> {
    let scope = crate::store::ArtifactScope::from(inv.session_key());
    inv.store()
        .list_artifact_keys(&scope)
        .await
        .map_err(|e| ToolError(format!("could not list artifacts: {e}")))
}

/// The run's user's best `limit` memories for `query` (words and meaning: [`crate::memory`]).
async fn search_memory(
    inv: &crate::invocation::InvocationContext,
    query: &str,
    limit: usize,
) -> Result<Vec<crate::store::memory::fusion::MemoryHit>, ToolError> {
    let key = inv.session_key();
    // The query's embedding is one of the run's model calls.
    let count = |model: &str, tokens| inv.record_usage(model, tokens);
    crate::memory::search(
        inv.store().as_ref(),
        inv.embedder().map(|e| e.as_ref()),
        crate::memory::charge::Charge::Run(&count),
        &key.app_name,
        &key.user_id,
        query,
        limit,
    )
    .await
    .map_err(|e| ToolError(format!("memory search failed: {e}")))
}

/// Searches the user's memory (past sessions added to the memory service) for the query.
pub struct LoadMemory;

#[async_trait]
impl Tool for LoadMemory {
    fn name(&self) -> &str {
        "load_memory"
    }

    /// Control, or a read: safe to run again.
    fn is_idempotent(&self) -> bool {
        true
    }

    fn description(&self) -> &str {
        "Loads the memory for the current user: what was said in earlier conversations that \
         matches the query."
    }

    fn parameters(&self) -> Option<Value> {
        Some(json!({
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look for"}},
            "required": ["query"],
        }))
    }

    async fn call(&self, args: JsonMap, ctx: &ToolContext) -> ToolResult {
        let query = args
            .get("query")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::new("missing string argument `query`"))?;
        let found = search_memory(ctx.invocation(), query, 10).await?;
        let memories: Vec<Value> = found
            .into_iter()
            .map(|m| json!({"author": m.entry.author, "timestamp": m.entry.timestamp, "text": m.entry.text, "sessionId": m.entry.session_id}))
            .collect();
        Ok(json!({ "memories": memories }))
    }
}

/// ADK's `preload_memory`: before each model request, the user's memories that match the
/// current message (the same hybrid search as [`LoadMemory`]) are put in the system
/// instruction, in ADK's words. The model is not told about it as a function.
pub struct PreloadMemory;

/// Memories preloaded per request.
const PRELOADED: usize = 10;

#[async_trait]
impl Tool for PreloadMemory {
    fn name(&self) -> &str {
        "preload_memory"
    }

    fn description(&self) -> &str {
        "Preloads the memory for the current user."
    }

    fn is_idempotent(&self) -> bool {
        true
    }

    fn is_declared(&self) -> bool {
        false
    }

    async fn call(&self, _args: JsonMap, _ctx: &ToolContext) -> ToolResult {
        Err(ToolError::new(
            "preload_memory is not a function; its memories are in the instruction",
        ))
    }

    async fn instruction(
        &self,
        inv: &crate::invocation::InvocationContext,
    ) -> Result<Option<String>, ToolError> {
        let Some(query) = inv
            .user_content()
            .and_then(|c| c.parts.first())
            .and_then(|p| p.text.as_deref())
            .filter(|t| !t.trim().is_empty())
        else {
            return Ok(None);
        };
        let found = search_memory(inv, query, PRELOADED).await?;
        let mut lines = vec![];
        for m in found {
            let ts = m.entry.timestamp;
            if ts > 0.0 {
                if let Some(t) = chrono::DateTime::from_timestamp(ts.trunc() as i64, 0) {
                    lines.push(format!("Time: {}", t.to_rfc3339()));
                }
            }
            let text = m
                .entry
                .content
                .parts
                .iter()
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join(" ");
            if !text.is_empty() {
                lines.push(if m.entry.author.is_empty() {
                    text
                } else {
                    format!("{}: {text}", m.entry.author)
                });
            }
        }
        if lines.is_empty() {
            return Ok(None);
        }
        Ok(Some(format!(
            "The following content is from your previous conversations with the user.\n\
             They may be useful for answering the user's current query.\n\
             <PAST_CONVERSATIONS>\n{}\n</PAST_CONVERSATIONS>\n",
            lines.join("\n")
        )))
    }
}
