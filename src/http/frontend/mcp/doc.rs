//! The MCP routes in the OpenAPI document. rmcp's service answers them behind an `any` route
//! ([`super::routes`]), which utoipa cannot see; these declarations describe them, so a
//! client finds them in `/openapi.json` and `scripts/fuzz-api.sh` sends them bad input as it
//! does every other route.

use crate::http::openapi::{error_set, EventStream};
use serde_json::Value;
use utoipa::{IntoResponses, OpenApi, ToSchema};

error_set!(
    /// What `POST /mcp` answers beyond the door's codes. A body that is not one JSON-RPC
    /// message is a 400 with a JSON-RPC error (`-32700` parse error, `-32600` invalid request);
    /// what rmcp refuses is agentd's `{"detail", "code"}`.
    McpErrors as "McpErrorBody": InvalidMcpRequest, BodyUnreadable, NotAcceptable, OriginForbidden, UnsupportedContentType, BodyTooComplex, NulCharacter
);

error_set!(
    /// What `POST /apps/{app}/mcp` answers beyond the door's codes: `/mcp`'s, and an app that
    /// is not served (or not the caller's).
    McpAppErrors as "McpErrorBody": AppNotFound, InvalidMcpRequest, BodyUnreadable, NotAcceptable, OriginForbidden, UnsupportedContentType, BodyTooComplex, NulCharacter
);

/// An MCP error: a JSON-RPC error response (`{"jsonrpc", "id", "error": {"code", "message"}}`)
/// for a body that is not one JSON-RPC message, else agentd's `{"detail", "code"}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct McpErrorBody(serde_json::Map<String, Value>);

/// MCP's errors by class, each an [`McpErrorBody`].
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum McpErrorClasses {
    /// The request was refused and changed nothing; `code` (or the JSON-RPC error) says why.
    #[response(status = "4XX")]
    Client(#[to_schema] serde_json::Map<String, Value>),
    /// The server could not do it (503 with `Retry-After` is safe to repeat).
    #[response(status = "5XX")]
    Server(#[to_schema] serde_json::Map<String, Value>),
}

#[derive(OpenApi)]
#[openapi(
    paths(mcp, app_mcp),
    components(schemas(McpErrorBody)),
    tags((name = "mcp", description = "The Model Context Protocol (streamable HTTP, stateless): every app a tool."))
)]
pub struct McpDoc;

/// MCP's streamable HTTP transport, stateless: one JSON-RPC message per POST, answered on its
/// own (any replica serves any request). Every served app the caller may use is a tool.
/// `GET` and `DELETE` (no server-initiated stream, no session to end) answer 405.
#[utoipa::path(post, path = "/mcp", tag = "mcp",
    params(("accept" = Option<String>, Header,
        description = "Must take both `application/json` and `text/event-stream`, else 406.")),
    request_body(content = Object,
        description = "One JSON-RPC 2.0 message (`initialize`, `tools/list`, `tools/call`, a notification such as `notifications/cancelled`); no batch."),
    responses(
        (status = 200, description = "A JSON-RPC response (errors too), or progress notifications and then the response as SSE.",
            content((Object = "application/json"), (EventStream = "text/event-stream"))),
        (status = 202, description = "A notification, accepted."),
        McpErrorClasses, McpErrors))]
#[allow(dead_code)]
fn mcp() {}

/// `/mcp` with one app: its only tool is that app.
#[utoipa::path(post, path = "/apps/{app}/mcp", tag = "mcp",
    params(("app" = String, Path),
        ("accept" = Option<String>, Header,
        description = "Must take both `application/json` and `text/event-stream`, else 406.")),
    request_body(content = Object,
        description = "One JSON-RPC 2.0 message; no batch."),
    responses(
        (status = 200, description = "A JSON-RPC response (errors too), or progress notifications and then the response as SSE.",
            content((Object = "application/json"), (EventStream = "text/event-stream"))),
        (status = 202, description = "A notification, accepted."),
        McpErrorClasses, McpAppErrors))]
#[allow(dead_code)]
fn app_mcp() {}
