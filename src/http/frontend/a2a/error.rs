//! A2A's errors: one enum, answered as a JSON-RPC error (the spec's codes) or, over
//! HTTP+JSON, as a `google.rpc.Status` with an `ErrorInfo` naming the reason — the shapes
//! every A2A SDK maps back to its own exception types.

use crate::http::error::ApiError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// The domain of A2A's `ErrorInfo` reasons.
const DOMAIN: &str = "a2a-protocol.org";

/// What an A2A call can fail with.
#[derive(Debug)]
pub enum A2aError {
    /// -32700: the body is not JSON.
    Parse(String),
    /// -32600: JSON, but not a JSON-RPC 2.0 request.
    InvalidRequest(String),
    /// -32601
    MethodNotFound(String),
    /// -32602
    InvalidParams(String),
    /// -32603: the message says what, never how (details are logged).
    Internal(String),
    /// -32001: no such task for this caller (another user's task is not found either).
    TaskNotFound(String),
    /// -32002
    TaskNotCancelable(String),
    /// -32004
    Unsupported(String),
    /// -32005
    ContentTypeNotSupported(String),
    /// -32007
    ExtendedCardNotConfigured,
    /// -32009
    VersionNotSupported(String),
    /// An agentd error that is not one of A2A's (busy session, quota, shutting down, …):
    /// sent with its own HTTP status and `code`, as a JSON-RPC server error (-32000).
    Api(ApiError),
}

impl A2aError {
    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        match self {
            A2aError::Parse(_) => -32700,
            A2aError::InvalidRequest(_) => -32600,
            A2aError::MethodNotFound(_) => -32601,
            A2aError::InvalidParams(_) => -32602,
            A2aError::Internal(_) => -32603,
            A2aError::TaskNotFound(_) => -32001,
            A2aError::TaskNotCancelable(_) => -32002,
            A2aError::Unsupported(_) => -32004,
            A2aError::ContentTypeNotSupported(_) => -32005,
            A2aError::ExtendedCardNotConfigured => -32007,
            A2aError::VersionNotSupported(_) => -32009,
            // agentd's own refusals (busy, quota, draining: 503 with Retry-After) are -32000;
            // a real failure is an internal error.
            A2aError::Api(e)
                if e.status.is_server_error() && e.status != StatusCode::SERVICE_UNAVAILABLE =>
            {
                -32603
            }
            A2aError::Api(_) => -32000,
        }
    }

    /// The HTTP status (HTTP+JSON binding) and the `ErrorInfo` reason.
    fn status_reason(&self) -> (StatusCode, &'static str, String) {
        let (status, reason) = match self {
            A2aError::Parse(_) => (StatusCode::BAD_REQUEST, "PARSE_ERROR"),
            A2aError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "INVALID_REQUEST"),
            A2aError::MethodNotFound(_) => (StatusCode::NOT_FOUND, "METHOD_NOT_FOUND"),
            A2aError::InvalidParams(_) => (StatusCode::BAD_REQUEST, "INVALID_PARAMS"),
            A2aError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR"),
            A2aError::TaskNotFound(_) => (StatusCode::NOT_FOUND, "TASK_NOT_FOUND"),
            A2aError::TaskNotCancelable(_) => (StatusCode::BAD_REQUEST, "TASK_NOT_CANCELABLE"),
            A2aError::Unsupported(_) => (StatusCode::BAD_REQUEST, "UNSUPPORTED_OPERATION"),
            A2aError::ContentTypeNotSupported(_) => {
                (StatusCode::BAD_REQUEST, "CONTENT_TYPE_NOT_SUPPORTED")
            }
            A2aError::ExtendedCardNotConfigured => (
                StatusCode::BAD_REQUEST,
                "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            ),
            A2aError::VersionNotSupported(_) => (StatusCode::BAD_REQUEST, "VERSION_NOT_SUPPORTED"),
            A2aError::Api(e) => (e.status, e.code.as_str()),
        };
        (status, reason, self.message())
    }

    pub fn message(&self) -> String {
        match self {
            A2aError::Parse(m)
            | A2aError::InvalidRequest(m)
            | A2aError::MethodNotFound(m)
            | A2aError::InvalidParams(m)
            | A2aError::Internal(m)
            | A2aError::TaskNotFound(m)
            | A2aError::TaskNotCancelable(m)
            | A2aError::Unsupported(m)
            | A2aError::ContentTypeNotSupported(m)
            | A2aError::VersionNotSupported(m) => m.clone(),
            A2aError::ExtendedCardNotConfigured => "this agent has no extended agent card".into(),
            A2aError::Api(e) => match &e.detail {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        }
    }

    /// `ErrorInfo` details: the reason every binding carries.
    fn details(&self) -> Value {
        let (_, reason, _) = self.status_reason();
        let mut metadata = serde_json::Map::new();
        if let A2aError::Api(e) = self {
            metadata.insert("agentdCode".into(), Value::String(e.code.as_str().into()));
        }
        json!([{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": DOMAIN,
            "metadata": metadata,
        }])
    }

    /// The JSON-RPC `error` object.
    pub fn rpc_error(&self) -> Value {
        json!({"code": self.code(), "message": self.message(), "data": self.details()})
    }

    /// A whole JSON-RPC error response for request `id`.
    pub fn rpc_response(&self, id: &Value) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "error": self.rpc_error()})
    }

    /// The HTTP+JSON binding's body: a `google.rpc.Status`.
    pub fn rest_body(&self) -> (StatusCode, Value) {
        let (status, _, message) = self.status_reason();
        let body = json!({"error": {
            "code": status.as_u16(),
            "status": grpc_status(status),
            "message": message,
            "details": self.details(),
        }});
        (status, body)
    }
}

/// The canonical gRPC status name for an HTTP status (google.rpc.Code's mapping).
fn grpc_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        413 | 429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        s if s >= 500 => "INTERNAL",
        _ => "FAILED_PRECONDITION",
    }
}

impl From<ApiError> for A2aError {
    fn from(e: ApiError) -> Self {
        A2aError::Api(e)
    }
}

impl From<crate::store::StoreError> for A2aError {
    fn from(e: crate::store::StoreError) -> Self {
        A2aError::Api(ApiError::from(e))
    }
}

/// Over HTTP+JSON an error is its status and a `google.rpc.Status` body.
impl IntoResponse for A2aError {
    fn into_response(self) -> Response {
        let (status, body) = self.rest_body();
        let mut response = (status, axum::Json(body)).into_response();
        if let A2aError::Api(ApiError {
            retry_after: Some(s),
            ..
        }) = &self
        {
            if let Ok(v) = axum::http::HeaderValue::from_str(&s.to_string()) {
                response.headers_mut().insert("retry-after", v);
            }
        }
        response
    }
}

pub type A2aResult<T> = Result<T, A2aError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error_code::ErrorCode;

    #[test]
    fn errors_carry_the_spec_codes_and_reasons() {
        let e = A2aError::TaskNotFound("no task t1".into());
        assert_eq!(e.code(), -32001);
        let rpc = e.rpc_response(&json!(7));
        assert_eq!(rpc["id"], 7);
        assert_eq!(rpc["error"]["data"][0]["reason"], "TASK_NOT_FOUND");
        let (status, body) = e.rest_body();
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["status"], "NOT_FOUND");
        assert_eq!(body["error"]["details"][0]["reason"], "TASK_NOT_FOUND");
        let busy = A2aError::from(ApiError::new(ErrorCode::SessionBusy, "busy"));
        assert_eq!(busy.code(), -32000);
        let draining = A2aError::from(ApiError::new(ErrorCode::ShuttingDown, "shutting down"));
        assert_eq!(
            draining.code(),
            -32000,
            "agentd's own refusal, not an internal error"
        );
        assert_eq!(A2aError::from(ApiError::internal("boom")).code(), -32603);
        assert_eq!(busy.rest_body().0, StatusCode::CONFLICT);
    }
}
