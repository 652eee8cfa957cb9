//! Service routes: liveness, readiness, version and the Prometheus metrics.

use crate::error_code::ErrorCode;
use crate::http::error::{ApiError, ApiResult};
use crate::http::openapi::error_set;
use crate::http::openapi::{Errors, Status};
use crate::http::AppState;
use crate::store::memory::vectors::VectorSupport;
use crate::store::SessionKey;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

error_set!(
    /// What `GET /ready` answers beyond the door's codes.
    ReadyErrors: ShuttingDown
);

error_set!(
    /// What `GET /metrics` answers beyond the door's codes.
    RenderMetricsErrors: AdminRequired
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(ready))
        .routes(routes!(version))
        .routes(routes!(render_metrics))
}

/// Liveness plus a database round trip: a replica that cannot reach its database is not
/// healthy (load balancers and the Docker HEALTHCHECK use this).
#[utoipa::path(get, path = "/health", tag = "service",
    responses((status = 200, description = "Alive and the database answers.", body = Status), Errors))]
async fn health(state: axum::extract::State<AppState>) -> ApiResult<axum::Json<Value>> {
    let probe = SessionKey::new("__health__", "__health__", "__health__");
    state.store.session_head(&probe).await.map_err(|e| {
        tracing::warn!(error = %e, "health check: database unreachable");
        ApiError::new(ErrorCode::DatabaseUnavailable, "database unreachable")
    })?;
    Ok(axum::Json(json!({ "status": "ok" })))
}

/// Readiness for a load balancer: 503 `shutting_down` from the moment a shutdown starts (so
/// the balancer stops sending new runs while in-flight ones drain), and 503 when the database
/// is unreachable. `/health` stays 200 during a drain: the process is alive and finishing.
#[utoipa::path(get, path = "/ready", tag = "service",
    responses((status = 200, description = "Ready for new runs.", body = Status), Errors, ReadyErrors))]
async fn ready(state: axum::extract::State<AppState>) -> ApiResult<axum::Json<Value>> {
    if state.runner.is_draining() {
        return Err(ApiError::new(
            ErrorCode::ShuttingDown,
            "This replica is shutting down; send new runs to another replica.",
        ));
    }
    let vectors = state.store.vector_support();
    let _alive = health(state).await?;
    // How memory is searched: `hybrid` (words and meaning) where vectors can be stored,
    // else `full-text` with the reason (PostgreSQL without pgvector).
    Ok(axum::Json(match vectors {
        VectorSupport::Available => json!({ "status": "ready", "memorySearch": "hybrid" }),
        VectorSupport::Missing(why) => json!({
            "status": "ready", "memorySearch": "full-text", "memorySearchNote": why,
        }),
    }))
}

/// The server's version (ADK's shape).
#[utoipa::path(get, path = "/version", tag = "service",
    responses((status = 200, description = "The version.", body = VersionBody)))]
async fn version() -> axum::Json<Value> {
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "language": "rust",
        "language_version": option_env!("CARGO_PKG_RUST_VERSION").unwrap_or(""),
    }))
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct VersionBody {
    version: String,
    language: String,
    language_version: String,
}

/// Prometheus text exposition of agentd's metrics (see [`crate::metrics`]). Open unless the
/// server runs with `--protect-metrics`, which asks for an admin key.
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses((status = 200, description = "Prometheus text format 0.0.4.", content_type = "text/plain",
        body = String), Errors, RenderMetricsErrors))]
async fn render_metrics(state: axum::extract::State<AppState>) -> Response {
    let (open, idle) = state.store.pool_stats();
    metrics::gauge!("agentd_db_pool_connections", "state" => "idle").set(idle as f64);
    metrics::gauge!("agentd_db_pool_connections", "state" => "in_use")
        .set(open.saturating_sub(idle as u32) as f64);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}
