//! Where a re-attached or followed stream starts: the client's resume point
//! (`Last-Event-ID` or `?after=`), checked against the session's last seq.

use crate::error_code::ErrorCode;
use crate::http::error::{problem, ApiError, ApiResult};
use crate::http::sse;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use utoipa::IntoParams;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AfterQuery {
    /// Resume after this seq (`Last-Event-ID` wins when both are sent).
    after: Option<String>,
}

/// The resume point: `Last-Event-ID` wins over `?after=`; either must be a seq (an integer
/// ≥ 0).
pub fn resume_point(headers: &HeaderMap, query: &AfterQuery) -> ApiResult<Option<i64>> {
    let (raw, loc) = match headers.get("last-event-id") {
        Some(v) => (
            Some(v.to_str().unwrap_or("\u{fffd}").trim().to_string()),
            vec![json!("header"), json!("Last-Event-ID")],
        ),
        None => (query.after.clone(), vec![json!("query"), json!("after")]),
    };
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    match raw.parse::<i64>() {
        Ok(n) if n >= 0 => Ok(Some(n)),
        _ => Err(ApiError::validation(vec![problem(
            "int_parsing",
            loc,
            format!("must be an event seq (an integer ≥ 0), got {raw:?}"),
        )])),
    }
}

pub fn beyond_end(after: i64, last: i64) -> ApiError {
    ApiError::new(
        ErrorCode::AfterBeyondEnd,
        format!("after={after} is beyond the last committed event (seq {last})."),
    )
}

pub fn sse_body(rx: mpsc::Receiver<Bytes>, extra: HeaderMap) -> Response {
    sse::event_stream(tokio_stream::wrappers::ReceiverStream::new(rx), extra)
}
