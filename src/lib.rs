//! agentd: an HTTP/SSE agent-serving daemon, wire-compatible with Google ADK's `api_server`.
//!
//! Data flows one way; no folder reaches back up (the picture, with file links:
//! `docs/architecture.md`):
//!
//! ```text
//! http (axum) ──► runner ──► agent tree ──► models / tools
//!    │              │             └──► invocation (what agents and tools share)
//!    │              └──► store (sessions, events, state, artifacts, runs)
//!    └──► store (session and artifact CRUD that runs no agent)
//!
//! transcript: RunItem (what the runner hands http), the outbox (commit, then deliver) and
//! the transcript's rules, below all of them
//! ```
//!
//! - [`event`]: the ADK wire model (`Session`, `Event`, `Content`, `Part`, `EventActions`);
//!   [`error_code`]: every stable error code, in one closed table.
//! - [`transcript`]: a run as data: its items ([`transcript::RunItem`]) and its outbox
//!   ([`transcript::Outbox`]), where **a complete event is committed, fenced by the run's
//!   ownership, before the client sees it**; what a rewind annuls and a summary covers.
//! - [`store`]: the traits per resource and their PostgreSQL and SQLite backends.
//! - [`runner`]: the [`runner::Runner`] facade and one run's life as typed stages (prepare,
//!   admit, begin, drive, end), per-replica liveness, and the bus that lets followers on any
//!   replica watch a run and a cancel reach its owner (PostgreSQL LISTEN/NOTIFY).
//! - [`invocation`]: the `Agent` trait, the invocation context (what agents see), the tool
//!   context, callbacks and plugins; [`agent`]: the agents (LLM, workflow, echo, remote A2A).
//! - [`model`]: the streaming `Model` trait and its providers (OpenAI-compatible,
//!   Anthropic, Gemini); [`tools`]: function tools, built-ins, HTTP tools, MCP toolsets.
//! - [`eval`]: ADK's eval sets and cases in their two JSON forms (files and the wire), and a
//!   session as an eval case.
//! - [`memory`]: memory search by meaning and words, and the task that embeds memories.
//! - [`apps`]: the apps found under `--apps-dir` and their YAML loader.
//! - [`http`]: the axum router and middleware, ADK's and agentd's routes under `http::routes`,
//!   SSE framing and followers under `http::sse`, one folder per other protocol under
//!   `http::frontend`, the JSON error type; [`a2a_task`]: A2A's task model, shared with
//!   [`webhook`] push notifications.
//! - [`auth`]: API keys, JWTs, key revocation; [`server`]: startup, the accept loop, shutdown.
//! - [`config`]: command-line flags and their environment variables; [`metrics`] and
//!   [`telemetry`]: what agentd exports (Prometheus, OTLP).

pub mod a2a_task;
pub mod agent;
pub mod apps;
pub mod auth;
pub mod config;
pub mod error_code;
pub mod eval;
pub mod event;
pub mod http;
pub mod invocation;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod runner;
pub mod schedule;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod transcript;
pub mod usage;
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
