//! The one error type of the HTTP layer, [`ApiError`]: a stable [`ErrorCode`] (the closed
//! table in [`crate::error_code`] gives its status and `Retry-After`) and a detail.
//!
//! Bodies are ADK/FastAPI-shaped (`{"detail": ...}`) plus the stable machine-readable `code`:
//! `{"detail":"Session not found","code":"session_not_found"}`. Internal failures are logged
//! with their cause and answered with a generic 500 that leaks nothing. The other wires render
//! the same error their own way: OpenAI's `{error}` (`frontend::openai`), JSON-RPC and
//! `google.rpc.Status` (`frontend::a2a::error`), MCP's `ErrorData` (`frontend::mcp`).

use crate::error_code::{ErrorCode, Retry};
use crate::runner::{RewindError, RunError};
use crate::store::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Debug)]
pub struct ApiError {
    /// The status the answer goes out with: the code's, but for the one override
    /// [`ApiError::with_status`] allows.
    pub status: StatusCode,
    pub code: ErrorCode,
    /// A string, or a list of validation problems (422).
    pub detail: Value,
    /// Seconds for a `Retry-After` header (the table says which codes carry one).
    pub retry_after: Option<u64>,
}

/// One validation problem, FastAPI style: `{"type","loc","msg","input"?}`.
pub fn problem(kind: &str, loc: Vec<Value>, msg: impl Into<String>) -> Value {
    json!({ "type": kind, "loc": loc, "msg": msg.into() })
}

impl ApiError {
    /// An answer with `code`: its status and `Retry-After` from the table.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self::with_detail(code, Value::String(detail.into()))
    }

    fn with_detail(code: ErrorCode, detail: Value) -> Self {
        ApiError {
            status: StatusCode::from_u16(code.status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            detail,
            retry_after: match code.retry() {
                Retry::After(secs) => Some(secs),
                // The caller sets the wait it computed ([`ApiError::retry_after`]).
                Retry::Computed => Some(1),
                Retry::No => None,
            },
        }
    }

    /// `code` with a list of problems (422), as FastAPI reports body/query validation.
    pub fn problems(code: ErrorCode, problems: Vec<Value>) -> Self {
        Self::with_detail(code, Value::Array(problems))
    }

    /// `validation_error` with its problems.
    pub fn validation(problems: Vec<Value>) -> Self {
        Self::problems(ErrorCode::ValidationError, problems)
    }

    /// One problem whose `type` is the code itself, at `loc` (webhook and schedule checks).
    pub fn problem(code: ErrorCode, loc: Vec<Value>, msg: impl Into<String>) -> Self {
        Self::problems(code, vec![problem(code.as_str(), loc, msg)])
    }

    /// The wait a [`Retry::Computed`] code's answer carries.
    pub fn retry_after(self, secs: u64) -> Self {
        ApiError {
            retry_after: Some(secs),
            ..self
        }
    }

    /// The same error with another status. One use: the OpenAI routes answer a message they
    /// cannot use with 400 (`invalid_message`, 422 elsewhere), as OpenAI does.
    pub fn with_status(self, status: StatusCode) -> Self {
        ApiError { status, ..self }
    }

    pub fn session_not_found() -> Self {
        Self::new(ErrorCode::SessionNotFound, "Session not found")
    }

    pub fn payload_too_large(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, detail)
    }

    /// ADK's "agent not found", without the apps directory's place on disk (ADK names its full
    /// path; the app's name relative to the apps directory says as much to a client). An app
    /// the caller may not use is answered with the same words.
    pub fn app_not_found(app: &str) -> Self {
        Self::new(
            ErrorCode::AppNotFound,
            format!("Agent not found: '{app}'. No matching directory or module exists in '{app}'."),
        )
    }

    /// Logs `cause` and answers a bare 500.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(ErrorCode::Internal, "Internal Server Error")
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
        if self.code == ErrorCode::DatabaseUnavailable {
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
            StoreError::SessionExists(id) => ApiError::new(
                ErrorCode::SessionExists,
                format!("Session already exists: {id}"),
            ),
            e @ StoreError::ArtifactTooLarge { .. } => {
                ApiError::new(ErrorCode::ArtifactTooLarge, e.to_string())
            }
            StoreError::InvalidArtifact(m) => ApiError::new(ErrorCode::InvalidArtifact, m),
            e @ StoreError::TooManyParts { .. } => {
                ApiError::new(ErrorCode::TooManyParts, e.to_string())
            }
            StoreError::Conflict => ApiError::new(
                ErrorCode::WriteConflict,
                "A concurrent write conflicted with this one; retry the request.",
            ),
            StoreError::Database(sqlx::Error::PoolTimedOut) => {
                tracing::warn!("database pool exhausted");
                ApiError::new(
                    ErrorCode::DatabaseBusy,
                    "The database is busy; retry the request.",
                )
            }
            e if e.is_unavailable() => {
                tracing::warn!(error = %e, "database unavailable");
                ApiError::new(
                    ErrorCode::DatabaseUnavailable,
                    "The database is unavailable; retry the request.",
                )
            }
            StoreError::DuplicateEvent(id) => ApiError::validation(vec![problem(
                "value_error",
                vec!["body".into(), "events".into()],
                format!("Event ids must be unique within a session; {id:?} appears twice."),
            )]),
            StoreError::CancelRequested => ApiError::new(
                ErrorCode::RunCancelled,
                "A cancel of the session's run came first; nothing was changed.",
            ),
            StoreError::NotOwner => ApiError::new(
                ErrorCode::SessionBusy,
                "Another run owns the session; retry later.",
            ),
            other => ApiError::internal(other),
        }
    }
}

impl From<crate::memory::extract::ExtractError> for ApiError {
    fn from(e: crate::memory::extract::ExtractError) -> Self {
        use crate::memory::extract::ExtractError;
        match e {
            ExtractError::Store(e) => e.into(),
            ExtractError::BudgetExhausted(spent) => {
                let now = crate::event::now_ts();
                ApiError::new(ErrorCode::BudgetExhausted, spent.to_string())
                    .retry_after(crate::store::usage::retry_after(spent.reset, now))
            }
            e => {
                tracing::warn!(error = %e, "memory extraction failed");
                // The model's own message may name its server: the code and the kind only.
                let kind = match &e {
                    ExtractError::Model(m) => m.code,
                    ExtractError::Timeout(_) => "MODEL_TIMEOUT",
                    _ => "MODEL_PROTOCOL",
                };
                ApiError::new(
                    ErrorCode::MemoryExtractionFailed,
                    format!("The app's extraction model failed ({kind}); the events it did not cover wait for the next add: retry later."),
                )
            }
        }
    }
}

/// What a caller who may not see the server's internals reads instead of a load error (which
/// names files and quotes YAML).
pub const LOAD_FAILED: &str = "the app's configuration could not be loaded (see the server log)";

impl From<RunError> for ApiError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::AppNotFound(app) => ApiError::app_not_found(&app),
            // The load error names files and quotes YAML: it is in the log, and in `list-apps`
            // for callers who may see it.
            RunError::AppBroken(m) => {
                tracing::warn!(error = %m, "run refused: the app failed to load");
                ApiError::new(
                    ErrorCode::AppLoadFailed,
                    format!("Failed to load agent: {LOAD_FAILED}"),
                )
            }
            RunError::SessionNotFound(sid) => ApiError::new(
                ErrorCode::SessionNotFound,
                format!(
                    "Session not found: {sid}. To create it with the run, send \
                     \"createSession\": true."
                ),
            ),
            e @ RunError::NoMessage => ApiError::new(ErrorCode::NewMessageRequired, e.to_string()),
            e @ RunError::InvocationNotFound(_) => {
                ApiError::new(ErrorCode::InvocationNotFound, e.to_string())
            }
            e @ RunError::NoTurn => ApiError::new(ErrorCode::TurnNotFound, e.to_string()),
            RunError::Busy(active) => ApiError::new(
                ErrorCode::SessionBusy,
                format!(
                    "The session already has an active run ({active}). Retry later, or send \
                     \"onBusy\": \"enqueue\" or \"interrupt\"."
                ),
            ),
            e @ RunError::QueueTimeout(_) => {
                ApiError::new(ErrorCode::SessionBusyTimeout, e.to_string())
            }
            RunError::ShuttingDown => ApiError::new(
                ErrorCode::ShuttingDown,
                "The server is shutting down; retry on another replica.",
            ),
            e @ RunError::TooManyRuns(_) => ApiError::new(ErrorCode::TooManyRuns, e.to_string()),
            RunError::BudgetExhausted(spent) => {
                let now = crate::event::now_ts();
                ApiError::new(ErrorCode::BudgetExhausted, spent.to_string())
                    .retry_after(crate::store::usage::retry_after(spent.reset, now))
            }
            RunError::Internal(m) => ApiError::internal(m),
            RunError::Store(e) => e.into(),
        }
    }
}

impl From<RewindError> for ApiError {
    fn from(e: RewindError) -> Self {
        match e {
            e @ RewindError::SeqOutOfRange(..) => {
                ApiError::new(ErrorCode::SeqOutOfRange, e.to_string())
            }
            e => RunError::from(e).into(),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
