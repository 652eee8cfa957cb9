//! The HTTP API's own resources, one module per resource, each with its `router()`.
//! (Other protocols over the same sessions and runs are in [`super::frontend`].)

pub mod apps;
pub mod artifacts;
pub mod background;
pub mod budgets;
pub mod eval_runs;
pub mod evals;
pub mod fork;
pub mod memory;
pub mod rewind;
pub mod run;
pub mod run_request;
pub mod runs;
pub mod schedules;
pub mod service;
pub mod session_body;
pub mod session_stream;
pub mod sessions;
pub mod usage;
