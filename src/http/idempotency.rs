//! `Idempotency-Key` on `POST /run`, `POST /run_sse` and session create: a retried request (a
//! client timeout, a proxy retry) with the same key and the same body does its work once.
//!
//! - The key is scoped to its caller (the app and user the request names; the authenticated
//!   caller once auth exists) and claimed in the database, so a retry on another replica sees
//!   it. It expires after `--idempotency-ttl-secs`.
//! - A repeat of a run request re-attaches to the first run's stream (replayed from the
//!   database, then live; header `idempotent-replayed: true`); a repeat of a session create
//!   answers the first response.
//! - The same key with another body is a 422 `idempotency_key_reused`. A repeat that arrives
//!   while the first request has not yet produced anything is a 409
//!   `idempotency_key_in_progress` with `Retry-After`; a claim that stays empty past the
//!   enqueue timeout plus a minute (its request died) is taken over by the next repeat.
//! - A first request that fails before doing anything gives its key up, so it can be retried.

use super::error::{problem, ApiError, ApiResult};
use super::AppState;
use crate::error_code::ErrorCode;
use crate::runner::{RunError, RunHandle, RunRequest};
use crate::store::KeyClaim;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sha2::{Digest, Sha256};

pub const HEADER: &str = "idempotency-key";

/// A request that carries a key.
#[derive(Debug, Clone)]
pub struct Keyed {
    /// The user the request names: the key's partition (one shard on Citus).
    pub user: String,
    pub scope: String,
    pub key: String,
    hash: String,
}

/// What the key says about this request.
pub enum Prior {
    /// First use: do the work, then record it.
    New,
    /// The run the first request started.
    Run(String),
    /// The first request's answer.
    Response(u16, String),
}

/// Reads the key (None without the header). The key is scoped to the app and user the request
/// names; the hash covers the route and the body bytes.
pub fn keyed(
    headers: &HeaderMap,
    app: &str,
    user: &str,
    route: &str,
    body: &[u8],
) -> ApiResult<Option<Keyed>> {
    let Some(value) = headers.get(HEADER) else {
        return Ok(None);
    };
    let key = value.to_str().unwrap_or("");
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError {
            code: ErrorCode::InvalidIdempotencyKey,
            ..ApiError::validation(vec![problem(
                "value_error",
                vec![json!("header"), json!("Idempotency-Key")],
                "must be 1 to 255 visible ASCII characters",
            )])
        });
    }
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0]);
    h.update(body);
    let hash = crate::hex(&h.finalize());
    Ok(Some(Keyed {
        user: user.to_string(),
        scope: scope(app, user),
        key: key.to_string(),
        hash,
    }))
}

/// The scope of a request naming `app` and `user`.
fn scope(app: &str, user: &str) -> String {
    format!("{app}\u{1f}{user}")
}

/// Claims the key, or says what its first use produced.
pub async fn claim(state: &AppState, k: &Keyed) -> ApiResult<Prior> {
    let ttl = state.runner.idempotency_ttl().as_secs_f64();
    // A first request records its run (or answer) once admitted; it may wait for a busy
    // session up to the enqueue timeout first. A claim still empty well after that is dead.
    let pending = state.runner.enqueue_timeout().as_secs_f64() + 60.0;
    match state
        .store
        .claim_key(&k.user, &k.scope, &k.key, &k.hash, ttl, pending)
        .await?
    {
        KeyClaim::Claimed => Ok(Prior::New),
        KeyClaim::Seen(rec) if rec.request_hash != k.hash => Err(ApiError::new(
            ErrorCode::IdempotencyKeyReused,
            "This Idempotency-Key was used with a different request; use a new key.",
        )),
        KeyClaim::Seen(rec) => match (rec.run_id, rec.response) {
            (Some(run), _) => Ok(Prior::Run(run)),
            (None, Some((status, body))) => Ok(Prior::Response(status, body)),
            (None, None) => Err(ApiError::new(
                ErrorCode::IdempotencyKeyInProgress,
                "The first request with this Idempotency-Key is still being processed.",
            )
            .with_status(StatusCode::CONFLICT)),
        },
    }
}

/// Gives the key up after the first request failed without doing anything.
pub async fn release(state: &AppState, k: &Keyed) {
    if let Err(e) = state.store.release_key(&k.user, &k.scope, &k.key).await {
        tracing::warn!(error = %e, "could not release an idempotency key; it expires by itself");
    }
}

/// With an `Idempotency-Key`: the prior run to replay, if this is a repeat.
pub(crate) async fn prior_run(
    state: &AppState,
    headers: &HeaderMap,
    req: &RunRequest,
    route: &str,
    raw: &[u8],
) -> ApiResult<(Option<Keyed>, Option<String>)> {
    let Some(keyed) = keyed(headers, &req.key.app_name, &req.key.user_id, route, raw)? else {
        return Ok((None, None));
    };
    match claim(state, &keyed).await? {
        Prior::New => Ok((Some(keyed), None)),
        Prior::Run(run) => Ok((None, Some(run))),
        Prior::Response(..) => Err(ApiError::new(
            ErrorCode::IdempotencyKeyReused,
            "This Idempotency-Key was used with a different request; use a new key.",
        )),
    }
}

/// Starts the run; with a key, records the run on it (or gives the key up if nothing started).
pub(crate) async fn start_keyed(
    state: &AppState,
    req: RunRequest,
    keyed: Option<Keyed>,
) -> Result<RunHandle, RunError> {
    let started = state.runner.start_run(req).await;
    if let Some(k) = keyed {
        match &started {
            Ok(handle) => {
                if let Err(e) = state
                    .store
                    .key_run(&k.user, &k.scope, &k.key, &handle.run_id)
                    .await
                {
                    tracing::warn!(error = %e, "could not record the run on its idempotency key");
                }
            }
            Err(_) => release(state, &k).await,
        }
    }
    started
}

/// What [`claim_response`] found for a request whose answer is a stored response (not a run).
pub enum Claimed {
    /// A repeat: the first request's answer, again (`idempotent-replayed: true`).
    Replay(Response),
    /// A new request: its key, if it has one (record its answer with [`record_response`]).
    New(Option<Keyed>),
}

/// With an `Idempotency-Key`: the stored answer of a repeat, or the claim of a new key. A key
/// that started a run answers 422 `idempotency_key_reused` (it was another request).
pub async fn claim_response(
    state: &AppState,
    headers: &HeaderMap,
    app: &str,
    user: &str,
    route: &str,
    raw: &[u8],
) -> ApiResult<Claimed> {
    let Some(k) = keyed(headers, app, user, route, raw)? else {
        return Ok(Claimed::New(None));
    };
    match claim(state, &k).await? {
        Prior::New => Ok(Claimed::New(Some(k))),
        Prior::Response(status, body) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            let mut resp = (status, body).into_response();
            let h = resp.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            h.insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(Claimed::Replay(resp))
        }
        Prior::Run(_) => Err(ApiError::new(
            ErrorCode::IdempotencyKeyReused,
            "This Idempotency-Key was used with a different request; use a new key.",
        )),
    }
}

/// Records a request's answer on its key (a failure gives the key up: the request may be
/// repeated and run again).
pub async fn record_response<T: serde::Serialize>(
    state: &AppState,
    k: &Keyed,
    answer: &ApiResult<T>,
) {
    let body = answer
        .as_ref()
        .ok()
        .and_then(|v| serde_json::to_string(v).ok());
    let Some(body) = body else {
        return release(state, k).await;
    };
    if let Err(e) = state
        .store
        .key_response(&k.user, &k.scope, &k.key, 200, &body)
        .await
    {
        tracing::warn!(error = %e, "could not record the response on its idempotency key");
    }
}
