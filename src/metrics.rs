//! Prometheus metrics (`GET /metrics`, text exposition format), through the `metrics` facade.
//!
//! Label values stay bounded: route templates (never raw paths), app names from the registry,
//! run statuses, providers and model and tool names from the apps' configuration; never user,
//! session or run ids.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `agentd_http_requests_total` | counter | method, route, status |
//! | `agentd_http_request_duration_seconds` | histogram | method, route (to the response head; a stream's body is not included) |
//! | `agentd_runs_started_total` | counter | app |
//! | `agentd_runs_finished_total` | counter | app, status |
//! | `agentd_run_duration_seconds` | histogram | app, status |
//! | `agentd_run_time_to_first_event_seconds` | histogram | app (admission to the first partial or complete event) |
//! | `agentd_open_streams` | gauge | (SSE responses open on this replica) |
//! | `agentd_events_committed_total` | counter | |
//! | `agentd_commit_duration_seconds` | histogram | |
//! | `agentd_db_pool_connections` | gauge | state = in_use, idle |
//! | `agentd_model_calls_total` | counter | provider, model, outcome (`ok` or the error code) |
//! | `agentd_model_call_duration_seconds` | histogram | provider, model |
//! | `agentd_model_tokens_total` | counter | provider, model, direction = input, output |
//! | `agentd_tool_calls_total` | counter | tool, outcome = ok, error |
//! | `agentd_tool_call_duration_seconds` | histogram | tool |

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Seconds buckets for latencies from sub-millisecond commits to minutes-long runs.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// Installs the process-wide recorder once (later calls, e.g. several servers in one test
/// process, share it) and returns the handle that renders it.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            match builder.install_recorder() {
                Ok(handle) => handle,
                Err(e) => {
                    // Another recorder is installed (an embedding program's): render an empty
                    // registry of our own rather than fail.
                    tracing::warn!(error = %e, "a metrics recorder is already installed");
                    PrometheusBuilder::new().build_recorder().handle()
                }
            }
        })
        .clone()
}

/// Counts an SSE response as open until dropped.
pub struct OpenStream;

impl OpenStream {
    pub fn new() -> Self {
        metrics::gauge!("agentd_open_streams").increment(1.0);
        OpenStream
    }
}

impl Default for OpenStream {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        metrics::gauge!("agentd_open_streams").decrement(1.0);
    }
}
