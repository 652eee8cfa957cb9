//! agentd: an HTTP/SSE agent-serving daemon, wire-compatible with Google ADK's `api_server`.
//!
//! Data flows one way; no module reaches back up:
//!
//! ```text
//! http (axum) ──► runner ──► agent tree ──► models / tools
//!    │              │
//!    │              └──► store (sessions, events, state, artifacts, runs)
//!    └──► store (session and artifact CRUD that runs no agent)
//! ```
//!
//! - [`event`]: the ADK wire model (`Session`, `Event`, `Content`, `Part`, `EventActions`).
//! - [`store`]: `SessionStore` / `ArtifactStore` with PostgreSQL and SQLite backends.
//!   **A complete event is committed in [`store::SessionStore::append_event`]** (one
//!   transaction: event row, state delta, artifact delta, the session's new `seq`).
//!   Memory (full-text search over past sessions) lives beside it ([`store::MemoryStore`]).
//! - [`runner`]: admission (one run per session, enforced by the database; FCFS queueing),
//!   the user event, agent selection, cancel/timeout/drain and the seal of a stopped run,
//!   per-replica liveness (heartbeat, sweeper), and the bus that lets followers on any
//!   replica watch a run and a cancel reach its owner (PostgreSQL LISTEN/NOTIFY).
//! - [`agent`]: the `Agent` trait, the invocation context whose `emit` hands each complete
//!   event to `append_event` before the client sees it, callbacks, plugins, the echo and
//!   workflow agents, the YAML loader, and [`agent::llm::LlmAgent`] (the model↔tools loop).
//! - [`model`]: the streaming `Model` trait and its providers (OpenAI-compatible,
//!   Anthropic, Gemini); [`tools`]: function tools, built-ins, HTTP tools, MCP toolsets.
//! - [`apps`]: the apps found under `--apps-dir`.
//! - [`http`]: the axum router, one module per resource (re-attach and follow in
//!   `http::stream`), the JSON error type.
//! - [`config`]: command-line flags and their environment variables.
//! - [`metrics`]: the Prometheus metrics agentd exports (`GET /metrics`).

pub mod agent;
pub mod apps;
pub mod auth;
pub mod config;
pub mod event;
pub mod http;
pub mod metrics;
pub mod model;
pub mod run;
pub mod runner;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tools;

/// Lower-case hex of `bytes` (key ids, SHA-256 digests of key secrets and request bodies).
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}
