//! A2A's two bindings over the same operations ([`super::tasks`]): JSON-RPC at
//! `POST /a2a/{app}` ([`rpc`]) and HTTP+JSON at `/a2a/{app}/message:send`, `/tasks/…`
//! ([`rest`], which also serves the agent card).

pub mod rest;
pub mod rpc;

use crate::http::AppState;

pub fn router() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .merge(rest::router())
        .merge(rpc::router())
}
