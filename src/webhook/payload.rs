//! A delivery's body, built from the stored run and its events, so every attempt of a
//! delivery sends the same bytes: `{"type", "timestamp", "data": {run ids, status, lastSeq,
//! error, text}}` (the Standard Webhooks envelope).

use crate::store::{Delivery, RunRecord, Store, StoreResult};
use serde_json::{json, Value};

/// Events read per page while looking for the final response.
const PAGE: u32 = 500;
/// The most text a body carries (the rest is in the session).
const MAX_TEXT: usize = 64 * 1024;

/// The event type and body of a delivery.
pub(super) async fn build(
    store: &dyn Store,
    d: &Delivery,
    include_text: bool,
) -> StoreResult<(String, Vec<u8>)> {
    let timestamp = chrono::DateTime::from_timestamp_millis((d.created_at * 1000.0) as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    let Some(run) = store.get_user_run(&d.user_id, &d.run_id).await? else {
        // Pruned since: what the delivery row itself knows.
        let body = json!({"type": d.event_type, "timestamp": timestamp,
                          "data": {"runId": d.run_id}});
        return Ok((
            d.event_type.clone(),
            serde_json::to_vec(&body).unwrap_or_default(),
        ));
    };
    let (text, input_required) = final_response(store, &run).await?;
    let event_type = if d.event_type == "run.completed" && input_required {
        "run.input_required".to_string()
    } else {
        d.event_type.clone()
    };
    let mut data = json!({
        "runId": run.run_id,
        "invocationId": run.invocation_id,
        "appName": run.app_name,
        "userId": run.user_id,
        "sessionId": run.session_id,
        "status": run.status,
        "lastSeq": run.last_seq,
        "error": run.error,
        "createdAt": run.created_at,
        "finishedAt": run.finished_at,
    });
    if include_text {
        data["text"] = text.map(Value::String).unwrap_or(Value::Null);
    }
    let body = json!({"type": event_type, "timestamp": timestamp, "data": data});
    Ok((event_type, serde_json::to_vec(&body).unwrap_or_default()))
}

/// The event type and body of an A2A push notification (see [`super::a2a`]).
pub(super) async fn build_a2a(store: &dyn Store, d: &Delivery) -> StoreResult<(String, Vec<u8>)> {
    let Some(run) = store.get_user_run(&d.user_id, &d.run_id).await? else {
        return Ok((d.event_type.clone(), b"{}".to_vec()));
    };
    let (_, waiting) = final_response(store, &run).await?;
    let event_type = if d.event_type == "run.completed" && waiting {
        "run.input_required".to_string()
    } else {
        d.event_type.clone()
    };
    Ok((event_type, crate::a2a_task::status_body(&run, waiting)))
}

/// The text of the run's last agent event that has any, and whether the run left a
/// long-running call or a confirmation request unanswered (it waits for the user:
/// `run.input_required`).
async fn final_response(store: &dyn Store, run: &RunRecord) -> StoreResult<(Option<String>, bool)> {
    let key = run.key();
    let mut after = run.base_seq.unwrap_or(0);
    let mut text = None;
    // Long-running calls (and confirmation requests) not answered later in the run: the same
    // rule as every protocol's "calls waiting for the client".
    let mut open = std::collections::BTreeSet::new();
    loop {
        let page = store
            .invocation_events(&key, &run.invocation_id, after, PAGE)
            .await?;
        for stored in &page.events {
            let e = &stored.event;
            if e.partial == Some(true) {
                continue;
            }
            let long: &[String] = e.long_running_tool_ids.as_deref().unwrap_or(&[]);
            for c in e.function_calls() {
                if let Some(id) = c.id.as_ref().filter(|id| long.contains(id)) {
                    open.insert(id.clone());
                }
            }
            for r in e.function_responses() {
                if let Some(id) = &r.id {
                    open.remove(id);
                }
            }
            if e.author == "user" {
                continue;
            }
            let t: String = e
                .content
                .iter()
                .flat_map(|c| &c.parts)
                .filter(|p| p.thought != Some(true))
                .filter_map(|p| p.text.as_deref())
                .collect();
            if !t.is_empty() {
                let mut t = t;
                if t.len() > MAX_TEXT {
                    let mut cut = MAX_TEXT;
                    while !t.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    t.truncate(cut);
                }
                text = Some(t);
            }
        }
        match page.events.last() {
            Some(last) if page.has_more => after = last.seq,
            _ => break,
        }
    }
    Ok((text, !open.is_empty()))
}
