//! The one API key of a bench run: created by the server harness when agentd runs with
//! `--auth api-key` (`--auth`), carried by every client.

/// Set once, by the first server started with auth; read by every client.
pub static API_KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
