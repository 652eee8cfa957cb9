//! A readable 413 for oversize bodies.
//!
//! A client that declares a body over `--max-body-bytes` and writes all of it before reading
//! (Python's `http.client` and `requests` do) gets a broken pipe, not the answer, if the server
//! answers and closes at once. So the body is read and thrown away first, up to a bound (four
//! times the limit, at least 64 MiB) and within the body-read timeout, then the 413 is sent with
//! `Connection: close`. A body beyond the bound is not read: that client sees the connection
//! close, which is the best a server can do without reading without end.

use super::error::ApiError;
use axum::extract::State;
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

const MIN_DRAIN: u64 = 64 * 1024 * 1024;

pub async fn refuse_oversize(
    State(max): State<usize>,
    req: Request<axum::body::Body>,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some(declared) = declared.filter(|&n| n > max as u64) else {
        let mut resp = next.run(req).await;
        // A chunked body found too large while reading: the rest is unread, so the
        // connection cannot carry another request. Say so, or a client's pool reuses it.
        if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return resp;
    };
    let drain_limit = (max as u64).saturating_mul(4).max(MIN_DRAIN);
    if declared <= drain_limit {
        // Errors (a timeout, the client giving up) just end the draining.
        let mut body = req.into_body().into_data_stream();
        while let Some(Ok(_)) = body.next().await {}
    }
    let mut resp = ApiError::payload_too_large(format!(
        "The request body is {declared} bytes; the limit is {max} bytes."
    ))
    .into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}
