//! A2A (Agent2Agent, spec 1.0): every app served to other agents, over JSON-RPC
//! (`POST /a2a/{app}`) and HTTP+JSON (`/a2a/{app}/message:send`, `/tasks/…`), both in
//! [`routes`], with its agent card ([`card`]).
//!
//! A task is a run and its context a session ([`tasks`] does the work for both bindings,
//! [`map`] is the pure mapping), so tasks are durable, streams resume on any replica and a
//! cancel works from any replica. What maps to what is in `docs/a2a.md`.

pub mod card;
pub mod error;
pub mod map;
pub mod push;
pub mod routes;
pub mod scope;
pub mod tasks;
pub mod v03;

use crate::config::{AuthMode, ServeArgs};

/// What agent cards say about this server.
#[derive(Debug, Clone, Default)]
pub struct Interop {
    /// `--public-url`, without a trailing slash.
    pub public_url: Option<String>,
    /// `--a2a-default-app`.
    pub default_app: Option<String>,
    /// `--auth`, for the cards' security schemes.
    pub auth: Vec<AuthMode>,
}

impl Interop {
    pub fn new(args: &ServeArgs) -> Self {
        Interop {
            public_url: args
                .interop
                .public_url
                .as_ref()
                .map(|u| u.trim_end_matches('/').to_string()),
            default_app: args.interop.a2a_default_app.clone(),
            auth: args.security.auth.clone(),
        }
    }
}

pub use routes::router;
