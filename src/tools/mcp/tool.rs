//! One tool an MCP server lists, as an agent tool: its declaration, and a call with a timeout,
//! its result bounded and turned into a function response.

use super::*;

// ---------------------------------------------------------------------------------------
// One tool of the server

/// One of an MCP server's tools.
pub struct McpTool {
    pub(super) name: String,
    /// The name on the server (without the prefix).
    pub(super) mcp_name: String,
    pub(super) description: String,
    pub(super) parameters: Value,
    /// Annotated read-only or idempotent: a call may be repeated after a broken connection.
    pub(super) retry_safe: bool,
    pub(super) set: Weak<Inner>,
}

impl McpTool {
    /// The tool's name on the MCP server (without `tool_name_prefix`).
    pub fn mcp_name(&self) -> &str {
        &self.mcp_name
    }

    /// Runs one call (`tools/call`): what [`Tool::call`] does, without a [`ToolContext`].
    pub async fn execute(&self, args: &JsonMap) -> ToolResult {
        let set = self
            .set
            .upgrade()
            .ok_or_else(|| ToolError::new("the MCP toolset is closed"))?;
        let mut retried = false;
        loop {
            let (peer, generation) = set.peer().await?;
            let params =
                CallToolRequestParams::new(self.mcp_name.clone()).with_arguments(args.clone());
            let outcome = tokio::time::timeout(set.call_timeout, peer.call_tool_once(params)).await;
            let e = match outcome {
                Ok(Ok(response)) => return self.result(response),
                Ok(Err(e)) => e,
                Err(_) => {
                    return Err(ToolError(format!(
                        "the MCP tool {} did not answer within {} s",
                        self.mcp_name,
                        set.call_timeout.as_secs_f64()
                    )))
                }
            };
            if !is_transport_error(&e) {
                return Err(match e {
                    ServiceError::McpError(err) => ToolError(format!(
                        "the MCP server rejected the call: {} (code {})",
                        err.message, err.code.0
                    )),
                    other => ToolError(format!("the MCP call failed: {}", service_error(&other))),
                });
            }
            set.invalidate(generation).await;
            // Not sent at all, or safe to repeat: once more on a new connection.
            let unsent = matches!(e, ServiceError::TransportSend(_));
            if !retried && (unsent || self.retry_safe) {
                tracing::warn!(server = %set.label, tool = %self.name, error = %e, "MCP connection broke; reconnecting");
                retried = true;
                continue;
            }
            return Err(ToolError(format!(
                "the connection to the MCP server broke during the call ({}); the tool may \
                 or may not have run. The next call reconnects.",
                service_error(&e)
            )));
        }
    }

    pub(super) fn result(&self, response: CallToolResponse) -> ToolResult {
        let r: CallToolResult = match response {
            CallToolResponse::Complete(r) => r,
            CallToolResponse::InputRequired(_) => {
                return Err(ToolError::new(
                    "the MCP server asked for more input during the call (elicitation or \
                     sampling), which agentd does not support",
                ))
            }
            CallToolResponse::Task(_) => {
                return Err(ToolError::new(
                    "the MCP server made the call a task, which agentd does not support",
                ))
            }
            _ => {
                return Err(ToolError::new(
                    "the MCP server answered the call with a result agentd does not know",
                ))
            }
        };
        let mut text = content_text(&r.content);
        let truncated = text.len() > MAX_RESULT_BYTES;
        if truncated {
            let mut cut = MAX_RESULT_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        let structured = r.structured_content.filter(|v| !v.is_null());
        let structured_size = structured
            .as_ref()
            .map_or(0, |s| serde_json::to_vec(s).map_or(usize::MAX, |v| v.len()));
        if structured_size > MAX_RESULT_BYTES {
            return Err(ToolError(format!(
                "the MCP tool {} returned {structured_size} bytes of structured content; the \
                 limit is {MAX_RESULT_BYTES}",
                self.mcp_name
            )));
        }
        if r.is_error == Some(true) {
            let msg = if !text.is_empty() {
                text
            } else if let Some(s) = structured {
                s.to_string()
            } else {
                format!("the MCP tool {} failed", self.mcp_name)
            };
            return Err(ToolError(msg));
        }
        Ok(match structured {
            Some(Value::Object(m)) => Value::Object(m),
            Some(other) => json!({ "result": other }),
            None if truncated => json!({ "result": text, "truncated": true }),
            None => json!({ "result": text }),
        })
    }
}

/// The most of a tool result's text (or structured content) that is kept: it is stored in an
/// event and sent to the model with every later turn.
pub(super) const MAX_RESULT_BYTES: usize = 1024 * 1024;

/// The text of a call's contents; other kinds are described in brackets.
pub(super) fn content_text(content: &[ContentBlock]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in content {
        parts.push(match block {
            ContentBlock::Text(t) => t.text.clone(),
            ContentBlock::Image(i) => {
                format!("[image {}, {} base64 chars]", i.mime_type, i.data.len())
            }
            ContentBlock::Audio(a) => {
                format!("[audio {}, {} base64 chars]", a.mime_type, a.data.len())
            }
            ContentBlock::Resource(r) => match &r.resource {
                ResourceContents::TextResourceContents { text, .. } => text.clone(),
                ResourceContents::BlobResourceContents { uri, .. } => format!("[resource {uri}]"),
                _ => "[resource]".to_string(),
            },
            ContentBlock::ResourceLink(l) => format!("[resource link {}]", l.uri),
            _ => "[unsupported content]".to_string(),
        });
    }
    parts.join("\n")
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Option<Value> {
        Some(self.parameters.clone())
    }

    /// The server's `readOnlyHint` or `idempotentHint`.
    fn is_idempotent(&self) -> bool {
        self.retry_safe
    }

    async fn call(&self, args: JsonMap, _ctx: &ToolContext) -> ToolResult {
        self.execute(&args).await
    }
}
