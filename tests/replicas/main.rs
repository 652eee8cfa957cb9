//! Several real `agentd` processes (the built binary) on one PostgreSQL database, and on one
//! Citus cluster: re-attach and follow across replicas, cancel across replicas, a replica
//! killed with `kill -9`, and a SIGTERM drain. Plus the same routes in one process on both backends, run ownership
//! (fencing) at the store, and a panicking agent.

#[path = "../common/mod.rs"]
mod common;

use common::procs::{Apps, Replica, PATIENCE, USER};
use common::sse_client::{Msg, Sse};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod across_replicas;
mod background_scans;
mod budgets;
mod database_faults;
mod durable_runs;
mod eval_runs;
mod fencing;
mod kill_and_drain;
mod memory_idle;
mod one_process;

fn run_body(app: &str, session: &str, text: &str) -> Value {
    json!({
        "appName": app, "userId": USER, "sessionId": session,
        "newMessage": { "role": "user", "parts": [{ "text": text }] },
    })
}

/// `(seq, event id)` of each committed event among `msgs`.
fn committed(msgs: &[Msg]) -> Vec<(i64, String)> {
    msgs.iter()
        .filter(|m| m.is_committed())
        .map(|m| {
            (
                m.id.parse().expect("numeric id"),
                m.data["id"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn done_of(msgs: &[Msg]) -> &Value {
    let last = msgs.last().expect("messages");
    assert_eq!(last.event, "done", "ends with done: {msgs:#?}");
    &last.data
}

async fn events_of(r: &Replica, app: &str, session: &str) -> Vec<Value> {
    let path = format!("/apps/{app}/users/{USER}/sessions/{session}/events?limit=1000");
    json_with_status(r.get(&path).await, 200).await["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Every function call in `events` has a response after it.
fn unanswered_calls(events: &[Value]) -> Vec<String> {
    let mut open = std::collections::BTreeSet::new();
    for e in events {
        for p in e["content"]["parts"].as_array().into_iter().flatten() {
            if let Some(id) = p["functionCall"]["id"].as_str() {
                open.insert(id.to_string());
            }
            if let Some(id) = p["functionResponse"]["id"].as_str() {
                open.remove(id);
            }
        }
    }
    open.into_iter().collect()
}
