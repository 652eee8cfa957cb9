//! agentd: an HTTP/SSE agent-serving daemon, wire-compatible with Google ADK's `api_server`.
//!
//! Data flows one way; no module reaches back up (the picture, with file links:
//! `docs/architecture.md`):
//!
//! ```text
//! http (axum) ──► runner ──► agent tree ──► models / tools
//!    │              │
//!    │              └──► store (sessions, events, state, artifacts, runs)
//!    └──► store (session and artifact CRUD that runs no agent)
//!
//! run: RunItem (what the runner hands http) and the outbox (commit, then deliver), below all
//! ```
//!
//! - [`event`]: the ADK wire model (`Session`, `Event`, `Content`, `Part`, `EventActions`).
//! - [`run`]: a run as data: its items ([`run::RunItem`]) and its outbox ([`run::Outbox`]),
//!   where **a complete event is committed, fenced by the run's ownership, before the client
//!   sees it**.
//! - [`store`]: the traits per resource and their PostgreSQL and SQLite backends
//!   (`store::postgres`, `store::sqlite`, one file per resource).
//! - [`runner`]: admission (one run per session, enforced by the database; FCFS queueing),
//!   the user event, agent selection, cancel/timeout/drain and the seal of a stopped run,
//!   per-replica liveness (heartbeat, sweeper), and the bus that lets followers on any
//!   replica watch a run and a cancel reach its owner (PostgreSQL LISTEN/NOTIFY).
//! - [`agent`]: the `Agent` trait, the invocation context (what agents see), callbacks,
//!   plugins, the echo and workflow agents, and [`agent::llm::LlmAgent`] (the model↔tools
//!   loop).
//! - [`model`]: the streaming `Model` trait and its providers (OpenAI-compatible,
//!   Anthropic, Gemini); [`tools`]: function tools, built-ins, HTTP tools, MCP toolsets.
//! - [`apps`]: the apps found under `--apps-dir` and their YAML loader.
//! - [`http`]: the axum router and middleware, one module per resource under `http::routes`,
//!   SSE framing and followers under `http::sse`, one folder per frontend protocol under
//!   `http::frontend`, the JSON error type.
//! - [`auth`]: API keys, JWTs, key revocation; [`server`]: startup, the accept loop, shutdown.
//! - [`config`]: command-line flags and their environment variables; [`metrics`] and
//!   [`telemetry`]: what agentd exports (Prometheus, OTLP).

pub mod agent;
pub mod apps;
pub mod auth;
pub mod config;
pub mod event;
pub mod http;
pub mod invocation;
pub mod metrics;
pub mod model;
pub mod runner;
pub mod schedule;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod transcript;
pub mod webhook;

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
