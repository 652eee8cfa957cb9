//! The MCP routes: `POST/GET/DELETE /mcp` and `/apps/{app}/mcp`, served by `rmcp`'s
//! streamable HTTP service in stateless mode behind agentd's own door (authentication, the
//! DNS-rebinding and cross-site checks, the body limit).
//!
//! Stateless: every POST is answered on its own (JSON, or SSE when progress notifications
//! come first), so any replica serves any request. An `Mcp-Session-Id` is still issued on
//! the first answer: it holds no state, but names the client, so a `notifications/cancelled`
//! (which names only a request id) finds the call's run on any replica
//! ([`super::map::run_id`]).

use super::tools::{AgentTools, OneApp};
use crate::config::ServeArgs;
use crate::error_code::ErrorCode;
use crate::http::error::ApiError;
use crate::http::AppState;
use axum::extract::{Path, Request, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::sync::Arc;
use tower::ServiceExt;

type Service = StreamableHttpService<AgentTools, NeverSessionManager>;

/// The MCP routes, for [`crate::http::router`] to put behind the door.
pub fn router(state: &AppState, args: &ServeArgs) -> Router<AppState> {
    let tools = AgentTools {
        state: state.clone(),
    };
    // The door already checks Host (DNS rebinding) and cross-site requests; Origin is checked
    // here ([`origin_allowed`]), and the body limit is agentd's.
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts()
        .disable_allowed_origins();
    config.max_request_body_bytes = args.max_body_bytes;
    let limit = args.max_body_bytes;
    let factory = tools.clone();
    let mcp = Mcp {
        service: Arc::new(StreamableHttpService::new(
            move || Ok(factory.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        )),
        tools: Arc::new(tools),
        limit,
        json: state.json,
        origins: Arc::new(args.allow_origins.clone()),
    };
    let all = mcp.clone();
    Router::new()
        .route("/mcp", any(move |req: Request| all.clone().serve(req)))
        .route(
            "/apps/{app}/mcp",
            any(
                move |State(_): State<AppState>, Path(app): Path<String>, mut req: Request| {
                    let mcp = mcp.clone();
                    async move {
                        req.extensions_mut().insert(OneApp(app));
                        mcp.serve(req).await
                    }
                },
            ),
        )
}

#[derive(Clone)]
struct Mcp {
    service: Arc<Service>,
    tools: Arc<AgentTools>,
    limit: usize,
    /// `--max-json-values`.
    json: crate::http::json_shape::JsonLimits,
    /// `--allow-origin`.
    origins: Arc<Vec<String>>,
}

impl Mcp {
    async fn serve(self, req: Request) -> Response {
        let host = req
            .headers()
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok());
        if let Some(origin) = req.headers().get(axum::http::header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            if !origin_allowed(origin, host, &self.origins) {
                return ApiError::new(
                    ErrorCode::OriginForbidden,
                    "MCP requests from a page of another origin need --allow-origin",
                )
                .into_response();
            }
        }
        // `/apps/{app}/mcp` of an app that is not served (or not the caller's) is a 404, as on
        // every route under /apps/{app}, not a server with no tools. After the Origin check, so
        // a foreign page learns nothing about which apps exist.
        if let Some(OneApp(app)) = req.extensions().get::<OneApp>() {
            let allowed = req
                .extensions()
                .get::<crate::auth::Caller>()
                .is_none_or(|c| c.may_use_app(app));
            if self.tools.state.apps.get(app).is_none() || !allowed {
                return ApiError::app_not_found(app).into_response();
            }
        }
        let issue = req.method() == axum::http::Method::POST
            && !req.headers().contains_key("mcp-session-id");
        let req = if req.method() == axum::http::Method::POST {
            let (parts, body) = req.into_parts();
            let bytes = match axum::body::to_bytes(body, self.limit).await {
                Ok(b) => b,
                Err(e) => return body_error(&e, self.limit).into_response(),
            };
            if let Err(refused) = check_message(&parts.headers, &bytes, self.json) {
                return *refused;
            }
            if let Some((id, reason)) = cancellation(&bytes) {
                self.tools.cancel_call(&parts, &id, reason).await;
                return axum::http::StatusCode::ACCEPTED.into_response();
            }
            Request::from_parts(parts, axum::body::Body::from(bytes))
        } else {
            req
        };
        proxy(&self.service, req, issue).await
    }
}

/// Whether a browser page of `origin` may call (the MCP spec asks servers to check Origin,
/// against DNS rebinding and cross-site use): the server's own origin (the `Host` it was
/// reached at), or one `--allow-origin` names (`*`: any).
pub fn origin_allowed(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    if allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/') == origin)
    {
        return true;
    }
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h))
}

/// Why a body could not be read: over the limit (413), or cut, slow or broken (400).
fn body_error(e: &axum::Error, limit: usize) -> crate::http::error::ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return ApiError::payload_too_large(format!(
                "the body is over {limit} bytes (--max-body-bytes)"
            ));
        }
        source = s.source();
    }
    ApiError::new(
        ErrorCode::BodyUnreadable,
        format!("could not read the body: {e}"),
    )
}

/// The request id (and reason) of a `notifications/cancelled`, if that is what `body` is.
fn cancellation(body: &[u8]) -> Option<(serde_json::Value, Option<String>)> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if v.get("method")? != "notifications/cancelled" || v.get("id").is_some() {
        return None;
    }
    let params = v.get("params")?;
    let reason = params
        .get("reason")
        .and_then(|r| r.as_str())
        .map(str::to_string);
    Some((params.get("requestId")?.clone(), reason))
}

async fn proxy(service: &Arc<Service>, req: Request, issue: bool) -> Response {
    let mut response = match (**service).clone().oneshot(req).await {
        Ok(r) => r.map(axum::body::Body::new).into_response(),
        Err(never) => match never {},
    };
    if response.status().is_client_error() && !is_json(&response) {
        return plain_refusal(response).await;
    }
    if issue && response.status().is_success() {
        if let Ok(v) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()) {
            response.headers_mut().insert("mcp-session-id", v);
        }
    }
    response
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// rmcp's own refusals are plain text (`Method Not Allowed`, `Not Acceptable: …`,
/// `Bad Request: Unsupported MCP-Protocol-Version: …`): answered as every route answers, JSON
/// with a stable code, its words kept as the detail and its `Allow` header kept. rmcp's 415
/// ("fail to deserialize request body") comes after agentd checked the label, so it means a
/// message rmcp cannot read (`invalid_mcp_request`), not an unlabelled body.
async fn plain_refusal(response: Response) -> Response {
    let (parts, body) = response.into_parts();
    // rmcp's messages are one line; more is not read.
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let code = match parts.status {
        axum::http::StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        axum::http::StatusCode::NOT_ACCEPTABLE => ErrorCode::NotAcceptable,
        axum::http::StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        _ => ErrorCode::InvalidMcpRequest,
    };
    let mut out = ApiError::new(code, text).into_response();
    if let Some(allow) = parts.headers.get(axum::http::header::ALLOW) {
        out.headers_mut()
            .insert(axum::http::header::ALLOW, allow.clone());
    }
    out
}

/// What every MCP POST must be before rmcp reads it: labelled JSON (415, as every route), one
/// well-formed JSON-RPC message (400 with JSON-RPC's parse error, -32700), not a batch (400,
/// -32600: MCP's streamable HTTP carries one message per request).
fn check_message(
    headers: &axum::http::HeaderMap,
    bytes: &[u8],
    json: crate::http::json_shape::JsonLimits,
) -> Result<(), Box<Response>> {
    crate::http::extract::require_json(headers, bytes, json)
        .map_err(|e| Box::new(e.into_response()))?;
    let refuse = |code: i32, message: &str| {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": null,
            "error": {"code": code, "message": message}});
        Box::new((axum::http::StatusCode::BAD_REQUEST, axum::Json(body)).into_response())
    };
    if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err() {
        return Err(refuse(
            -32700,
            "Parse error: the body is not one well-formed JSON value",
        ));
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(refuse(-32600, "Invalid Request: batches are not supported"));
    }
    if !is_message(bytes) {
        return Err(refuse(
            -32600,
            "Invalid Request: not a JSON-RPC 2.0 request, notification or response",
        ));
    }
    Ok(())
}

/// Whether `bytes` is shaped as one JSON-RPC 2.0 message: `"jsonrpc": "2.0"` and a `method`
/// (a request or notification), or an `id` with a `result` or an `error` (a response). rmcp
/// answers anything else 415, which names the wrong fault.
fn is_message(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape {
        jsonrpc: Option<serde_json::Value>,
        method: Option<serde_json::Value>,
        id: Option<serde_json::Value>,
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    let Ok(m) = serde_json::from_slice::<Shape>(bytes) else {
        return false;
    };
    // JSON-RPC ids are strings or numbers (rmcp takes whole numbers).
    let id_ok =
        m.id.as_ref()
            .is_none_or(|v| v.is_string() || v.is_i64() || v.is_u64());
    m.jsonrpc.as_ref().and_then(|v| v.as_str()) == Some("2.0")
        && id_ok
        && (m.method.as_ref().is_some_and(|v| v.is_string())
            || (m.id.is_some() && (m.result.is_some() || m.error.is_some())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_rpc_messages_pass() {
        for ok in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        ] {
            assert!(is_message(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "{}",
            "5",
            r#""x""#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#,
        ] {
            assert!(!is_message(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn origins_are_the_servers_own_or_allowed() {
        let none: Vec<String> = vec![];
        assert!(origin_allowed(
            "http://127.0.0.1:8000",
            Some("127.0.0.1:8000"),
            &none
        ));
        assert!(!origin_allowed(
            "http://127.0.0.1:9999",
            Some("127.0.0.1:8000"),
            &none
        ));
        assert!(!origin_allowed(
            "https://evil.example",
            Some("127.0.0.1:8000"),
            &none
        ));
        assert!(!origin_allowed("null", Some("127.0.0.1:8000"), &none));
        let app = vec!["https://app.example.com".to_string()];
        assert!(origin_allowed(
            "https://app.example.com",
            Some("api.example.com"),
            &app
        ));
        assert!(origin_allowed(
            "https://x.example",
            None,
            &["*".to_string()]
        ));
    }
}
