//! Request bodies: a total deadline, and a readable 413 for oversize ones.
//!
//! A client that declares a body over `--max-body-bytes` and writes all of it before reading
//! (Python's `http.client` and `requests` do) gets a broken pipe, not the answer, if the server
//! answers and closes at once. So, once the caller is authenticated (an anonymous client
//! cannot make agentd read anything), the body is read and thrown away first, up to a bound
//! (four times the limit, at least 64 MiB) and within the body deadline, then the 413 is sent
//! with `Connection: close`. A body beyond the bound is not read: that client sees the
//! connection close, which is the best a server can do without reading without end.

use super::error::ApiError;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

const MIN_DRAIN: u64 = 64 * 1024 * 1024;

/// The declared length, if it is over `max`.
pub fn oversize(req: &Request<Body>, max: usize) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&n| n > max as u64)
}

/// Reads and discards an oversize body (within bounds), then answers 413.
pub async fn drain_and_refuse(req: Request<Body>, declared: u64, max: usize) -> Response {
    let drain_limit = (max as u64).saturating_mul(4).max(MIN_DRAIN);
    if declared <= drain_limit {
        // Errors (the deadline, the client giving up) just end the draining.
        let mut body = req.into_body().into_data_stream();
        while let Some(Ok(_)) = body.next().await {}
    }
    ApiError::payload_too_large(format!(
        "The request body is {declared} bytes; the limit is {max} bytes."
    ))
    .into_response()
}

/// Every 413 closes its connection: the rest of that body is unread, so the connection cannot
/// carry another request, and a client's pool must not reuse it.
pub async fn close_after_413(req: Request<Body>, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A body must arrive within `deadline` in total (not per chunk: a client trickling a byte now
/// and then would otherwise hold its connection for ever).
pub async fn body_deadline(
    State(deadline): State<Duration>,
    req: Request<Body>,
    next: Next,
) -> Response {
    let req = req.map(|inner| {
        Body::new(DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(deadline)),
        })
    });
    next.run(req).await
}

struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the request body did not arrive in time",
            )))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
