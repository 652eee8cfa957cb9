//! ADK's dev UI (`--web-ui-dir`): the Angular bundle of the `google-adk` wheel
//! (`google/adk/cli/browser`), served at `/dev-ui/` as `adk web` serves it, so
//! `agentd serve --web-ui-dir DIR` gives a browser chat with state, events and artifacts.
//!
//! The bundle calls the ADK routes agentd already has (same origin, no credentials). Its
//! runtime configuration is generated here: the API is this origin (`backendUrl: ""`), and
//! telemetry is off, which also keeps the UI's consent dialog away. `/` and `/dev-ui` redirect
//! to `/dev-ui/` (the bundle's `<base href="./">` needs the slash). These routes sit outside
//! the authentication door: they are static files; the API calls the UI makes are checked as
//! any other.
//!
//! Its trace routes (the Trace tab, an event's request and response) are in [`trace`], over the
//! spans agentd keeps; [`map`] gives those spans ADK's names.

pub mod map;
pub mod trace;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use std::path::Path;
use tower::ServiceExt;
use tower_http::services::ServeDir;

const PREFIX: &str = "/dev-ui";

pub fn router(dir: &Path) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::temporary("/dev-ui/") }))
        .route(PREFIX, get(|| async { Redirect::temporary("/dev-ui/") }))
        .route(
            "/dev-ui/assets/config/runtime-config.json",
            get(runtime_config),
        )
        .route("/dev-ui/", get(asset))
        .route("/dev-ui/{*path}", get(asset))
        .with_state(ServeDir::new(dir))
}

async fn runtime_config() -> Response {
    let mut resp =
        axum::Json(serde_json::json!({"backendUrl": "", "telemetry": false})).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// A file of the bundle (`..` and missing files are 404s; a directory serves its index).
async fn asset(State(files): State<ServeDir>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let rest = parts.uri.path().strip_prefix(PREFIX).unwrap_or("/");
    let rest = if rest.is_empty() { "/" } else { rest };
    parts.uri = match Uri::builder().path_and_query(rest).build() {
        Ok(uri) => uri,
        Err(_) => return axum::http::StatusCode::NOT_FOUND.into_response(),
    };
    match files.oneshot(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(Body::new),
        Err(e) => match e {},
    }
}
