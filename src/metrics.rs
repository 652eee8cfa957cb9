//! Prometheus metrics (`GET /metrics`, text exposition format), through the `metrics` facade.
//!
//! Label values stay bounded: route templates (never raw paths), the standard HTTP methods
//! (any other method token a client sends is `other`), app names from the registry, run
//! statuses, providers and model and tool names from the apps' configuration; never user,
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
//! | `agentd_runs_resumed_total` | counter | reason = replica_lost, drain, restart (runs this replica took over) |
//! | `agentd_runs_handed_over_total` | counter | (runs this replica gave up while draining) |
//! | `agentd_tool_calls_repeated_total` | counter | tool (calls in flight at a takeover, run again: safe to repeat) |
//! | `agentd_tool_calls_interrupted_total` | counter | tool (calls in flight at a takeover, answered `interrupted`) |
//! | `agentd_connections_shed_total` | counter | (idle or half-sent connections closed at the bound for a new client) |
//! | `agentd_open_streams` | gauge | (SSE responses open on this replica) |
//! | `agentd_events_committed_total` | counter | |
//! | `agentd_commit_duration_seconds` | histogram | |
//! | `agentd_db_pool_connections` | gauge | state = in_use, idle |
//! | `agentd_model_calls_total` | counter | provider, model, outcome (`ok` or the error code) |
//! | `agentd_model_call_duration_seconds` | histogram | provider, model |
//! | `agentd_model_tokens_total` | counter | app, model, kind = input, output, cached, reasoning |
//! | `agentd_model_cost_total` | gauge (only grows) | app, model, currency |
//! | `agentd_tool_calls_total` | counter | tool, outcome = ok, error |
//! | `agentd_tool_call_duration_seconds` | histogram | tool |
//! | `agentd_webhook_attempts_total` | counter | outcome = delivered, retry, failed, skipped |
//! | `agentd_webhook_deliveries_failed_total` | counter | (deliveries given up) |
//! | `agentd_webhook_delivery_seconds` | histogram | (the run's end to its webhook's 2xx, retries included) |
//! | `agentd_schedule_ticks_total` | counter | outcome = started, skipped, failed |
//! | `agentd_memory_embedding_tokens_total` | counter | app, purpose = document, query |
//! | `agentd_memory_embedding_failures_total` | counter | app, purpose, code (the model error code) |
//!
//! The recorder keeps every histogram sample until something drains it into its buckets: a
//! scrape does, and so does the exporter's upkeep. `install_recorder` (agentd serves
//! `/metrics` itself, so it needs no listener of the exporter's) runs no upkeep, so each
//! server runs it on a timer ([`spawn_upkeep`]): without a scraper, samples would otherwise
//! pile up for the life of the process (a few bytes per request, run and commit).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often the recorder's upkeep runs: what `PrometheusBuilder::install` would use. Between
/// two passes the pending samples are bounded by five seconds of traffic.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Upkeep passes run in this process, by every server's task (see [`upkeep_runs`]).
static UPKEEP_RUNS: AtomicU64 = AtomicU64::new(0);

/// Seconds buckets for latencies from sub-millisecond commits to minutes-long runs.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// Webhook deliveries: from milliseconds to a day of retries.
const DELIVERY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0, 14400.0, 86400.0,
];

/// Installs the process-wide recorder once (later calls, e.g. several servers in one test
/// process, share it) and returns the handle that renders it.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            // A full name's buckets win over a suffix's (the exporter checks them first).
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("agentd_webhook_delivery_seconds".into()),
                        DELIVERY_BUCKETS,
                    )
                })
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

/// Runs the recorder's upkeep (draining histogram samples into their buckets) every
/// [`UPKEEP_EVERY`] until `stop` is cancelled; the server passes its shutdown token, so the
/// task ends with the server and no server leaves one behind.
///
/// One task per server rather than one per process, although the recorder is one per process:
/// a task lives on the runtime that spawned it, and tests (and embedding programs) start
/// servers on runtimes that end before the process does, which would silently end a
/// process-wide task with them. Several servers in one process each run it; a pass with
/// nothing pending costs a few lock acquisitions.
pub fn spawn_upkeep(handle: PrometheusHandle, stop: CancellationToken) {
    tokio::spawn(async move {
        // The first pass one period after the start: a server just started has recorded little.
        let mut every =
            tokio::time::interval_at(tokio::time::Instant::now() + UPKEEP_EVERY, UPKEEP_EVERY);
        // A stalled runtime gets one pass when it resumes, not a burst of them.
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            handle.run_upkeep();
            UPKEEP_RUNS.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// How many upkeep passes have run in this process, by every server's upkeep task. Nothing a
/// scrape shows changes when upkeep runs (a scrape drains the same samples itself), so this
/// is how a test sees that the task runs without a scrape, and that it stops with its server.
pub fn upkeep_runs() -> u64 {
    UPKEEP_RUNS.load(Ordering::Relaxed)
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
