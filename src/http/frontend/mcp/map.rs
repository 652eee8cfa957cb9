//! The pure part of the MCP server: an app as a tool, a run's outcome as a tool result, and
//! the run id a tool call gets (so a cancel arriving at another replica finds it).

use crate::error_code::ErrorCode;
use crate::http::frontend::kit::{answer_text, waiting_calls};
use crate::store::RunStatus;
use crate::transcript::RunItem;
use rmcp::model::{CallToolResult, ContentBlock, Tool};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Whether an app's name can be a tool's name (MCP: 1 to 128 of `A-Za-z0-9_.-`).
pub fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The tool an app is: `{message, session_id?}` in; the agent's final text out, with the
/// session, run and status as structured content.
pub fn tool(app: &str, description: &str) -> Tool {
    let description = if description.is_empty() {
        format!("Runs the agentd app {app} on a message and answers its final text.")
    } else {
        description.to_string()
    };
    let mut tool = Tool::new(
        app.to_string(),
        description,
        object(json!({
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "The user's message."},
                "session_id": {"type": "string", "description":
                    "Continue this session (created on first use); without it a new one starts."}
            },
            "required": ["message"]
        })),
    );
    tool.output_schema = Some(Arc::new(object(json!({
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "session_id": {"type": "string"},
            "run_id": {"type": "string"},
            "status": {"type": "string", "description":
                "completed, input_required, failed, cancelled, timed_out, interrupted or abandoned"},
            "usage": {"type": "object", "description": "The run's token counts.", "properties": {
                "input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"},
                "cached_tokens": {"type": "integer"}, "reasoning_tokens": {"type": "integer"}}}
        },
        "required": ["text", "session_id", "run_id", "status"]
    }))));
    tool
}

/// A run's outcome as the tool's result: an error result unless it completed.
pub fn result(text: String, session_id: &str, run_id: &str, status: &str) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text.clone())]);
    r.structured_content = Some(json!({
        "text": text, "session_id": session_id, "run_id": run_id, "status": status,
    }));
    r.is_error = Some(!matches!(status, "completed" | "input_required"));
    r
}

/// The status a tool result reports.
pub fn status(status: RunStatus, waiting: bool) -> &'static str {
    match status {
        RunStatus::Completed if waiting => "input_required",
        other => other.as_str(),
    }
}

/// The run id of a tool call: derived from the client's `Mcp-Session-Id`, the caller's user
/// and the request id, so the `notifications/cancelled` naming that request finds the run on
/// any replica without any state kept between requests (and two users can never derive the
/// same id). Without a session id, a fresh one.
pub fn run_id(session: Option<&str>, user: &str, request_id: &Value) -> String {
    use sha2::Digest;
    match session {
        Some(s) if !s.is_empty() => {
            let digest =
                sha2::Sha256::digest(format!("{s}\u{1f}{user}\u{1f}{request_id}").as_bytes());
            let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
            format!("run-mcp-{hex}")
        }
        _ => format!("run-{}", uuid::Uuid::new_v4()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_run_id_is_found_again_from_its_session_and_request() {
        let a = run_id(Some("s1"), "u1", &json!(7));
        assert_eq!(a, run_id(Some("s1"), "u1", &json!(7)));
        assert_ne!(a, run_id(Some("s2"), "u1", &json!(7)));
        assert_ne!(
            a,
            run_id(Some("s1"), "u2", &json!(7)),
            "users never share an id"
        );
        assert_ne!(a, run_id(Some("s1"), "u1", &json!("7")));
        assert!(a.starts_with("run-mcp-") && a.len() == "run-mcp-".len() + 32);
        assert_ne!(run_id(None, "u1", &json!(7)), run_id(None, "u1", &json!(7)));
    }

    #[test]
    fn a_calls_result_carries_its_runs_token_counts() {
        let mut fold = CallFold::default();
        let mut e = crate::event::Event::new("inv", "agent")
            .with_content(crate::event::Content::text("model", "hi"));
        e.usage_metadata = Some(json!({"promptTokenCount": 10, "candidatesTokenCount": 5,
                                       "totalTokenCount": 15, "cachedContentTokenCount": 4}));
        fold.item(&RunItem::Event {
            event: Box::new(e),
            seq: Some(2),
        });
        fold.item(&RunItem::Done {
            status: RunStatus::Completed,
            last_seq: Some(2),
        });
        let r = serde_json::to_value(fold.result("s", "r")).unwrap();
        assert_eq!(
            r["structuredContent"]["usage"],
            json!({"input_tokens": 10, "output_tokens": 5, "cached_tokens": 4,
                   "reasoning_tokens": 0})
        );
        assert_eq!(r["structuredContent"]["text"], "hi");
    }

    #[test]
    fn tools_and_results() {
        assert!(is_tool_name("help_desk-2.v1"));
        assert!(!is_tool_name("has space") && !is_tool_name(""));
        let t = serde_json::to_value(tool("echo", "")).unwrap();
        assert_eq!(t["inputSchema"]["required"], json!(["message"]));
        assert!(t["description"].as_str().unwrap().contains("echo"));
        let ok = serde_json::to_value(result("hi".into(), "s", "r", "completed")).unwrap();
        assert_eq!(ok["structuredContent"]["run_id"], "r");
        assert_eq!(ok["isError"], false);
        let bad = serde_json::to_value(result("".into(), "s", "r", "failed")).unwrap();
        assert_eq!(bad["isError"], true);
    }
}

/// A call's arguments: its `message` and the session it names (a new one when it names
/// none); a tool result saying what is wrong otherwise.
pub fn arguments(args: &Map<String, Value>) -> Result<(String, String), CallToolResult> {
    let refuse = |text: String| CallToolResult::error(vec![ContentBlock::text(text)]);
    let Some(message) = args.get("message").and_then(Value::as_str) else {
        return Err(refuse("`message` (a string) is required".into()));
    };
    let session = match args.get("session_id") {
        None | Some(Value::Null) => uuid::Uuid::new_v4().to_string(),
        Some(Value::String(s)) => {
            if let Err(e) = crate::http::extract::validate_id("session_id", s) {
                let detail = match &e.detail {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                return Err(refuse(detail));
            }
            s.clone()
        }
        Some(_) => return Err(refuse("`session_id` must be a string".into())),
    };
    Ok((message.to_string(), session))
}

/// A call whose run did not start: the reason, and agentd's error code as structured content.
pub fn refused(detail: &str, code: ErrorCode) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(detail)]);
    r.structured_content = Some(serde_json::json!({ "code": code }));
    r
}

/// A call's run, item by item: its partial text (progress), its last answer, the calls it
/// leaves waiting for the client, its error and its end.
#[derive(Default)]
pub struct CallFold {
    /// Progress notifications sent so far.
    pub chunks: u32,
    text: String,
    waiting: std::collections::BTreeMap<String, String>,
    error: Option<String>,
    status: Option<RunStatus>,
    /// The run's model responses' token counts.
    usage: crate::usage::Tokens,
}

impl CallFold {
    /// Takes `item`: the text a progress notification carries, if any, and whether the run
    /// is over.
    pub fn item(&mut self, item: &RunItem) -> (Option<String>, bool) {
        match item {
            RunItem::Event { event, seq: None } => {
                let chunk = answer_text(event);
                if chunk.is_empty() {
                    return (None, false);
                }
                self.chunks += 1;
                (Some(chunk), false)
            }
            RunItem::Event { event, .. } => {
                if let Some(u) = &event.usage_metadata {
                    self.usage.add(crate::usage::Tokens::of_metadata(u));
                }
                if event.author != "user" {
                    let t = answer_text(event);
                    if !t.is_empty() {
                        self.text = t;
                    }
                }
                self.waiting
                    .extend(waiting_calls(std::slice::from_ref(event)));
                for r in event.function_responses() {
                    if let Some(id) = &r.id {
                        self.waiting.remove(id);
                    }
                }
                (None, false)
            }
            RunItem::Error { message, .. } => {
                self.error = Some(message.clone());
                (None, false)
            }
            RunItem::Done { status, .. } => {
                self.status = Some(*status);
                (None, true)
            }
        }
    }

    /// The tool result: the last answer (or the error), the session, the run and its status.
    pub fn result(self, session_id: &str, run_id: &str) -> CallToolResult {
        let status = status(
            self.status.unwrap_or(RunStatus::Interrupted),
            !self.waiting.is_empty(),
        );
        let text = match (self.text.is_empty(), self.error) {
            (true, Some(e)) => e,
            _ => self.text,
        };
        let mut r = result(text, session_id, run_id, status);
        if let Some(s) = r.structured_content.as_mut() {
            let u = self.usage;
            s["usage"] = json!({"input_tokens": u.input, "output_tokens": u.output,
                                "cached_tokens": u.cached, "reasoning_tokens": u.reasoning});
        }
        r
    }
}
