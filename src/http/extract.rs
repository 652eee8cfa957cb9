//! Extractors that turn every client mistake into a clear JSON error instead of axum's
//! plain-text rejections: malformed JSON, wrong types, invalid UTF-8, oversize bodies,
//! wrong content types, bad query strings, bad path segments.

use super::error::{problem, ApiError, ApiResult};
use crate::error_code::ErrorCode;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// A JSON body. Accepts camelCase or snake_case (the models carry both names).
/// An empty body deserializes from `{}` when `T` allows it (ADK: "no body = all defaults"),
/// whatever its content type; a body with content must be labelled JSON (415 otherwise).
pub struct Json<T>(pub T);

/// A JSON body together with its bytes as received (what an `Idempotency-Key` is checked
/// against).
pub struct JsonBody<T>(pub T, pub axum::body::Bytes);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        read_json(req, state).await.map(|(v, _)| Json(v))
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        read_json(req, state).await.map(|(v, b)| JsonBody(v, b))
    }
}

/// Reads and parses a JSON body.
///
/// A body with content must be labelled `application/json` (or a `+json` type); otherwise
/// 415 `unsupported_content_type`, before anything is parsed or stored. A page on another
/// site may send `text/plain`, or no content type at all (a `Blob` or `ArrayBuffer` body),
/// without a CORS preflight, so only a JSON type shows that a script the browser let through
/// CORS, or a client that is no browser, sent the body. The clients ADK users have label
/// their JSON (`requests`/`httpx` with `json=`; ADK's web UI through Angular's `HttpClient`
/// and, for `/run_sse`, `fetch` with an explicit type; curl with `-H 'content-type:
/// application/json'`). ADK itself answers `text/plain` with 422 and parses a body without
/// a type; agentd refuses both, with 415. An empty body (a cancel without a reason,
/// create-session with no state) needs no type: it is ADK's "all defaults", and one sent
/// from another site is refused at the door (`http::auth`).
async fn read_json<S: Send + Sync, T: DeserializeOwned>(
    req: Request,
    state: &S,
) -> Result<(T, axum::body::Bytes), ApiError> {
    let headers = req.headers().clone();
    let limits = super::json_shape::JsonLimits::of(req.extensions());
    let raw = axum::body::Bytes::from_request(req, state)
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large("Request body is larger than the configured limit.")
            } else {
                ApiError::new(ErrorCode::BodyUnreadable, rejection.body_text())
            }
        })?;
    require_json(&headers, &raw, limits)?;
    let bytes: &[u8] = if raw.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &raw
    };
    let value = parse_json(bytes)?;
    Ok((value, raw))
}

/// Every route's rule for a body: one with content must be labelled JSON
/// (`application/json` or a `+json` type), else 415 `unsupported_content_type`; an empty (or
/// all-whitespace) body needs no label; and no body may hold more JSON values than
/// `--max-json-values` (413 `body_too_complex`, before it is parsed), and no string in it may
/// hold the NUL character (422 `nul_character`, see [`refuse_nul`]). Routes that read their
/// body themselves (A2A, MCP) ask this too: on PostgreSQL a NUL they passed on failed the run
/// with an internal error.
pub(crate) fn require_json(
    headers: &axum::http::HeaderMap,
    raw: &[u8],
    limits: super::json_shape::JsonLimits,
) -> ApiResult<()> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    check_content_type(headers)?;
    limits.check(raw)?;
    refuse_nul(raw)
}

fn check_content_type(headers: &axum::http::HeaderMap) -> ApiResult<()> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    match content_type.as_deref() {
        Some(ct) if is_json_type(ct) => Ok(()),
        Some(ct) => Err(unsupported_content_type(&format!("got {ct}"))),
        None => Err(unsupported_content_type("the request has no Content-Type")),
    }
}

/// 415 for a body that is not labelled JSON; `what` says what the request sent instead.
fn unsupported_content_type(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedContentType,
        format!("Expected a JSON body (Content-Type: application/json); {what}."),
    )
}

/// Parses JSON bytes into `T`, reporting the first problem with its location.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(ApiError {
            code: ErrorCode::InvalidUtf8,
            ..ApiError::validation(vec![problem(
                "json_invalid",
                vec![json!("body"), json!(e.valid_up_to())],
                "Request body is not valid UTF-8",
            )])
        });
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        // Trailing characters after the value are malformed JSON too.
        Ok(v) => de.end().map(|()| v).map_err(|e| json_invalid(&e)),
        Err(err) => {
            let path = err.path().to_string();
            let inner = err.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                return Err(json_invalid(&inner));
            }
            Err(ApiError::validation(vec![describe_data_error(
                &path, &inner,
            )]))
        }
    }
}

fn json_invalid(err: &serde_json::Error) -> ApiError {
    ApiError {
        code: ErrorCode::JsonInvalid,
        ..ApiError::validation(vec![problem(
            "json_invalid",
            vec![json!("body"), json!(err.column())],
            format!("JSON decode error: {err}"),
        )])
    }
}

/// Turns a serde data error into a FastAPI-like problem with a `loc` path.
fn describe_data_error(path: &str, err: &serde_json::Error) -> Value {
    let msg = err.to_string();
    let mut loc: Vec<Value> = vec![json!("body")];
    if path != "." {
        loc.extend(path.split('.').map(|seg| {
            seg.trim_end_matches(']')
                .parse::<u64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::String(seg.to_string()))
        }));
    }
    // serde reports a missing field at its parent; name the field as FastAPI does.
    if let Some(field) = msg
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
    {
        loc.push(json!(field));
        return problem("missing", loc, "Field required");
    }
    let kind = if msg.starts_with("invalid type") {
        "type_error"
    } else {
        "value_error"
    };
    let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
    problem(kind, loc, msg)
}

/// A query string; a bad one is a 422 naming the parameter.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let q = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(q.as_bytes()));
        serde_path_to_error::deserialize::<_, T>(de)
            .map(Query)
            .map_err(|e| {
                let path = e.path().to_string();
                let msg = e.into_inner().to_string();
                let mut loc = vec![json!("query")];
                if path != "." {
                    loc.push(json!(path));
                }
                ApiError::validation(vec![problem("query_invalid", loc, msg)])
            })
    }
}

/// Path parameters; undecodable segments are a 400 instead of axum's plain text.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // One rule for every id in a path, on every route: ids are primary-key parts
        // (PostgreSQL refuses NUL and over-long index entries: a 500 otherwise).
        if let Ok(raw) = axum::extract::RawPathParams::from_request_parts(parts, state).await {
            for (name, value) in raw.iter() {
                if matches!(name, "app" | "user" | "session" | "run_id") {
                    validate_id(name, value)?;
                } else if value.chars().any(char::is_control) {
                    return Err(ApiError::new(
                        ErrorCode::InvalidPath,
                        format!("path segment `{name}` must be printable characters"),
                    ));
                }
            }
        }
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|r| ApiError::new(ErrorCode::InvalidPath, r.body_text()))
    }
}

/// The location of the first string (or object key) in `v` that contains a NUL character.
fn find_nul(v: &Value, path: &mut Vec<Value>) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().enumerate().any(|(i, item)| {
            path.push(json!(i));
            let found = find_nul(item, path);
            if !found {
                path.pop();
            }
            found
        }),
        Value::Object(map) => map.iter().any(|(k, item)| {
            path.push(json!(k));
            let found = k.contains('\0') || find_nul(item, path);
            if !found {
                path.pop();
            }
            found
        }),
        _ => false,
    }
}

/// PostgreSQL cannot store a NUL character in text or jsonb, so agentd refuses it in every
/// JSON body on both backends alike (a 422 naming the field), rather than storing it on
/// SQLite and failing on PostgreSQL. JSON can carry a NUL only as the escape `\u0000`, so
/// only bodies containing that text are looked at closely.
fn refuse_nul(bytes: &[u8]) -> Result<(), ApiError> {
    if !bytes.windows(6).any(|w| w == b"\\u0000") {
        return Ok(());
    }
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return Ok(());
    };
    let mut path = vec![json!("body")];
    if find_nul(&v, &mut path) {
        return Err(ApiError {
            code: ErrorCode::NulCharacter,
            ..ApiError::validation(vec![problem(
                "string_pattern_mismatch",
                path,
                "must not contain the NUL character (\\u0000)",
            )])
        });
    }
    Ok(())
}

/// `application/json` or a `+json` type (parameters allowed). Not any type that merely
/// mentions json: `text/plain;json` is a type a browser sends cross-site without asking.
fn is_json_type(ct: &str) -> bool {
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Ids become primary-key parts and URL segments: keep them printable and bounded.
pub fn validate_id(kind: &str, id: &str) -> ApiResult<()> {
    // 128 bytes: every id is part of a primary key (PostgreSQL refuses huge index entries).
    if id.is_empty() || id.len() > 128 || id.chars().any(|c| c.is_control() || c == '/') {
        return Err(ApiError::new(
            ErrorCode::InvalidId,
            format!("{kind} must be 1 to 128 printable characters without '/'"),
        ));
    }
    Ok(())
}
