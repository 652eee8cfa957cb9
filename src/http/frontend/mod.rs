//! Other frontends' wire protocols over the same sessions and runs: the Vercel AI SDK's UI
//! message stream ([`ai_sdk`]), AG-UI ([`ag_ui`]), the OpenAI Chat Completions and Responses
//! APIs ([`openai`]), A2A for other agents ([`a2a`]) and ADK's own dev UI ([`adk_web_ui`]).
//!
//! Each protocol is a folder of two files: the routes (request parsing, who the user is, which session,
//! starting or following the run) and a pure mapping from the runner's items — live, or
//! replayed from stored events — to that protocol's frames (`map.rs`, unit-tested on
//! recorded runs); what they share is in [`kit`]. Nothing here has its own event log: every frame derives from the
//! session's events, with ids taken from event ids and seqs, so a replay reproduces them.

pub mod a2a;
pub mod adk_web_ui;
pub mod ag_ui;
pub mod ai_sdk;
pub mod kit;
pub mod mcp;
pub mod openai;

use super::AppState;

pub fn router() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .merge(ai_sdk::router())
        .merge(ag_ui::router())
        .merge(openai::router())
        .merge(a2a::router())
        .merge(adk_web_ui::trace::router())
}
