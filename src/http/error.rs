//! The one error type of the HTTP layer.
//!
//! Bodies are ADK/FastAPI-shaped (`{"detail": ...}`) plus a stable machine-readable `code`:
//! `{"detail":"Session not found","code":"session_not_found"}`. Internal failures are logged
//! with their cause and answered with a generic 500 that leaks nothing.

use crate::store::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    /// A string, or a list of validation problems (422).
    pub detail: Value,
    /// Seconds for a `Retry-After` header (503 and 429 answers).
    pub retry_after: Option<u64>,
}

/// One validation problem, FastAPI style: `{"type","loc","msg","input"?}`.
pub fn problem(kind: &str, loc: Vec<Value>, msg: impl Into<String>) -> Value {
    json!({ "type": kind, "loc": loc, "msg": msg.into() })
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            detail: Value::String(detail.into()),
            retry_after: None,
        }
    }

    pub fn not_found(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, detail)
    }

    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, detail)
    }

    /// 422 with a list of problems, as FastAPI reports body/query validation.
    pub fn validation(problems: Vec<Value>) -> Self {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "validation_error",
            detail: Value::Array(problems),
            retry_after: None,
        }
    }

    /// 503 with `Retry-After`: the request did nothing and may be repeated.
    pub fn unavailable(code: &'static str, detail: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, code, detail)
        }
    }

    /// The same error with another status (e.g. a 409 that still carries `Retry-After`).
    pub fn with_status(self, status: StatusCode) -> Self {
        ApiError { status, ..self }
    }

    pub fn session_not_found() -> Self {
        Self::not_found("session_not_found", "Session not found")
    }

    pub fn payload_too_large(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", detail)
    }

    /// Logs `cause` and answers a bare 500.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal Server Error",
        )
    }
}

/// Marks a response whose request did nothing because the database connection failed: a
/// read may be repeated once on a fresh connection (see `http::retry_reads`).
#[derive(Debug, Clone, Copy)]
pub struct DatabaseUnavailable;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "detail": self.detail, "code": self.code });
        let mut resp = (self.status, axum::Json(body)).into_response();
        if self.code == "database_unavailable" {
            resp.extensions_mut().insert(DatabaseUnavailable);
        }
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::SessionNotFound => ApiError::session_not_found(),
            StoreError::SessionExists(id) => {
                ApiError::conflict("session_exists", format!("Session already exists: {id}"))
            }
            e @ StoreError::ArtifactTooLarge { .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "artifact_too_large",
                e.to_string(),
            ),
            StoreError::InvalidArtifact(m) => ApiError::bad_request("invalid_artifact", m),
            StoreError::Conflict => ApiError::conflict(
                "write_conflict",
                "A concurrent write conflicted with this one; retry the request.",
            ),
            StoreError::Database(sqlx::Error::PoolTimedOut) => {
                tracing::warn!("database pool exhausted");
                ApiError::unavailable(
                    "database_busy",
                    "The database is busy; retry the request.",
                    1,
                )
            }
            e if e.is_unavailable() => {
                tracing::warn!(error = %e, "database unavailable");
                ApiError::unavailable(
                    "database_unavailable",
                    "The database is unavailable; retry the request.",
                    1,
                )
            }
            StoreError::DuplicateEvent(id) => ApiError::validation(vec![problem(
                "value_error",
                vec!["body".into(), "events".into()],
                format!("Event ids must be unique within a session; {id:?} appears twice."),
            )]),
            StoreError::NotOwner => {
                ApiError::conflict("session_busy", "Another run owns the session; retry later.")
            }
            other => ApiError::internal(other),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
