//! The HTTP API: an axum router, one module per resource, shared [`AppState`].
//!
//! Middleware (outermost first): request id (`x-request-id`, generated if absent and echoed
//! back), sensitive headers (`Authorization`, `x-api-key`, cookies) marked so no log or trace
//! shows them, a tracing span per request carrying it, panic → JSON 500, CORS (only with
//! `--allow-origin`), gzip for JSON (never for `text/event-stream`), `Connection: close` on
//! every 413, the body deadline, the body limit; then per route: metrics, the door
//! (`auth::guard`: the DNS-rebinding and cross-site checks, authentication, rate limits,
//! binding to the caller's user and apps, and a 413 that even clients writing the whole body
//! first can read) and the read retry.

pub mod auth;
pub mod body_limit;
pub mod error;
pub mod extract;
pub mod frontend;
pub mod idempotency;
pub mod json_shape;
pub mod openapi;
pub mod paging;
pub mod routes;
pub mod sse;

use crate::apps::AppRegistry;
use crate::config::ServeArgs;
use crate::error_code::ErrorCode;
use crate::runner::Runner;
use crate::store::Store;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use error::ApiError;
use std::sync::Arc;
use std::time::Duration;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;

/// Shared by every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub apps: Arc<AppRegistry>,
    pub runner: Arc<Runner>,
    /// Renders the Prometheus registry (`GET /metrics`).
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Authentication, rate limits and what callers may touch.
    pub gate: Arc<auth::Gate>,
    /// What a webhook may reach, and the default secret.
    pub webhooks: Arc<crate::webhook::WebhookPolicy>,
    /// What A2A agent cards say about this server (its URL, how callers authenticate).
    pub interop: Arc<frontend::a2a::Interop>,
    /// How many schedules a user may have, and how often they may fire.
    pub schedules: crate::schedule::Limits,
    /// How many JSON values a body may hold (`--max-json-values`).
    pub json: json_shape::JsonLimits,
    /// Wakes this replica's eval worker ([`crate::eval::worker`]) when a run is created here.
    pub eval_wake: Arc<tokio::sync::Notify>,
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Builds the full application router.
pub fn router(state: AppState, args: &ServeArgs) -> Router {
    // For the JSON extractors, which see the request but not the state.
    let json_limits = state.json;
    let (api, mut doc) = api_routes().split_for_parts();
    doc.merge(<frontend::mcp::McpDoc as utoipa::OpenApi>::openapi());
    openapi::add_door_errors(&mut doc);
    openapi::add_fallback_errors(&mut doc);
    let api = api
        .merge(openapi::router(&doc))
        .merge(frontend::mcp::router(&state, args))
        .merge(routes::evals::dev_router())
        .merge(routes::eval_runs::dev_router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.store.clone(),
            retry_reads,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .with_state(state);
    let api = match &args.web_ui_dir {
        Some(dir) => api.merge(frontend::adk_web_ui::router(dir)),
        None => api,
    }
    .layer(axum::middleware::from_fn(track_http));

    let trace = TraceLayer::new_for_http()
        .make_span_with(|req: &Request<_>| {
            let request_id = req
                .headers()
                .get(&REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let span = tracing::info_span!(
                "http",
                // The route is not known yet (this runs before routing); semantic conventions
                // then name the span by the method alone. The method as the metrics label it
                // (an invented one is `other`): a 30 KB method must not become a 30 KB span
                // name in every log line and trace.
                otel.name = method_label(req.method()),
                otel.kind = "server",
                method = method_label(req.method()),
                path = %req.uri().path(),
                request_id
            );
            crate::telemetry::continue_trace(&span, req.headers());
            span
        })
        .on_response(tower_http::trace::DefaultOnResponse::new().level(tracing::Level::INFO));

    let mut app = api
        .layer(axum::extract::DefaultBodyLimit::max(args.max_body_bytes))
        .layer(axum::Extension(json_limits))
        .layer(axum::middleware::from_fn(body_limit::close_after_413))
        .layer(axum::middleware::from_fn_with_state(
            Duration::from_secs(args.security.body_timeout_secs.max(1)),
            body_limit::body_deadline,
        ))
        .layer(CompressionLayer::new());
    if let Some(cors) = cors_layer(&args.allow_origins) {
        app = app.layer(cors);
    }
    app.layer(CatchPanicLayer::custom(|_| {
        ApiError::internal("handler panicked").into_response()
    }))
    .layer(trace)
    .layer(SetSensitiveRequestHeadersLayer::new([
        axum::http::header::AUTHORIZATION,
        axum::http::header::COOKIE,
        axum::http::header::PROXY_AUTHORIZATION,
        HeaderName::from_static("x-api-key"),
    ]))
    .layer(PropagateRequestIdLayer::new(REQUEST_ID))
    .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// Every documented route, with the document they make (see [`openapi`]).
pub fn api_routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    use utoipa::OpenApi;
    utoipa_axum::router::OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(routes::service::router())
        .merge(routes::apps::router())
        .merge(routes::memory::router())
        .merge(routes::sessions::router())
        .merge(routes::session_stream::router())
        .merge(routes::artifacts::router())
        .merge(routes::run::router())
        .merge(routes::background::router())
        .merge(routes::runs::router())
        .merge(routes::rewind::router())
        .merge(routes::fork::router())
        .merge(routes::schedules::router())
        .merge(routes::usage::router())
        .merge(routes::budgets::router())
        .merge(routes::evals::router())
        .merge(routes::eval_runs::router())
        .merge(frontend::router())
}

fn cors_layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list: Vec<HeaderValue> = origins
            .iter()
            .filter_map(|o| HeaderValue::from_str(o.trim()).ok())
            .collect();
        AllowOrigin::list(list)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([
                Method::GET,
                Method::POST,
                Method::PATCH,
                Method::PUT,
                Method::DELETE,
                Method::OPTIONS,
            ])
            .allow_headers(tower_http::cors::Any)
            .expose_headers([
                REQUEST_ID,
                HeaderName::from_static("x-next-cursor"),
                // So a browser's `/run_sse` client can learn the run id (to re-attach or cancel).
                HeaderName::from_static("x-agentd-run-id"),
                HeaderName::from_static("x-agentd-invocation-id"),
                // So a browser's MCP client can name its session (and cancel its calls).
                HeaderName::from_static("mcp-session-id"),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

/// A read that failed on a broken database connection (a PostgreSQL restart, a cut network)
/// is repeated once, on a connection checked first: the store is told a connection died
/// ([`Store::connection_lost`]), so for a few seconds every pooled connection is pinged before
/// use (after a restart they are all dead, not only the idle ones). What still fails is a 503
/// `database_unavailable` with `Retry-After`, never a 500. Writes are not repeated here (the
/// client decides; appends resolve their own outcome by event id).
async fn retry_reads(
    store: axum::extract::State<Arc<dyn Store>>,
    req: Request<axum::body::Body>,
    next: axum::middleware::Next,
) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return next.run(req).await;
    }
    let mut again = Request::builder()
        .method(req.method().clone())
        .uri(req.uri().clone())
        .version(req.version());
    if let Some(headers) = again.headers_mut() {
        *headers = req.headers().clone();
    }
    // The router's path parameters (and the request id) travel as extensions.
    if let Some(ext) = again.extensions_mut() {
        *ext = req.extensions().clone();
    }
    let resp = next.clone().run(req).await;
    if resp
        .extensions()
        .get::<error::DatabaseUnavailable>()
        .is_none()
    {
        return resp;
    }
    store.connection_lost();
    match again.body(axum::body::Body::empty()) {
        Ok(again) => {
            tracing::info!("read failed on a broken database connection; retrying once");
            next.run(again).await
        }
        Err(_) => resp,
    }
}

/// Counts and times every request by route template (never the raw path: bounded labels).
///
/// This runs before the door, so every label must stay bounded whatever an unauthenticated
/// client sends: the recorder never drops a series, and each distinct label set is memory
/// held for the life of the process and a line in every `/metrics` answer. hyper accepts any
/// method token up to the size of the request head, so the method is one of the standard
/// nine or `other` ([`method_label`]); the route is a template or `unmatched`; the status is
/// one of the codes a response can carry ([`status_label`]).
async fn track_http(req: Request<axum::body::Body>, next: axum::middleware::Next) -> Response {
    let method = method_label(req.method());
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let status = status_label(resp.status());
    metrics::histogram!("agentd_http_request_duration_seconds", "method" => method, "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("agentd_http_requests_total", "method" => method, "route" => route, "status" => status)
        .increment(1);
    resp
}

/// The method as a metric label: the methods of RFC 9110 and PATCH by name, any other token
/// (`FOO`, a 30 KB string) as `other`, so clients cannot mint series.
fn method_label(method: &Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "other",
    }
}

/// The status as a metric label: the numeric code (what dashboards group by) when it is in
/// HTTP's 100-599 range, `other` otherwise. `StatusCode` admits 100-999 and only agentd's own
/// handlers set it, so this is bounded already; the range check keeps it bounded should a
/// handler ever pass on a status it was given (a proxied upstream's, say).
fn status_label(status: StatusCode) -> String {
    let code = status.as_u16();
    if (100..=599).contains(&code) {
        code.to_string()
    } else {
        "other".to_string()
    }
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::RouteNotFound, "Not Found")
}

async fn method_not_allowed() -> Response {
    ApiError::new(ErrorCode::MethodNotAllowed, "Method Not Allowed").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_labels_are_the_standard_methods_or_other() {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
            Method::CONNECT,
            Method::TRACE,
        ] {
            assert_eq!(method_label(&m), m.as_str());
        }
        let long = "X".repeat(30_000);
        for token in ["FOO", "get", "PROPFIND", long.as_str()] {
            let m = Method::from_bytes(token.as_bytes()).expect("a valid method token");
            assert_eq!(method_label(&m), "other", "{token:.20}");
        }
    }

    #[test]
    fn status_labels_are_codes_in_range_or_other() {
        assert_eq!(status_label(StatusCode::OK), "200");
        assert_eq!(status_label(StatusCode::METHOD_NOT_ALLOWED), "405");
        let odd = StatusCode::from_u16(999).expect("StatusCode admits 100-999");
        assert_eq!(status_label(odd), "other");
    }
}
