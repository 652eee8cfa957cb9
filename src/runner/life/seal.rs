//! Sealing: leaving a run that did not finish normally with a valid transcript. Every function
//! call it committed without a response gets an error response (a model provider rejects a
//! history with an unanswered tool call), then an `INVOCATION_ABORTED` event ends it.
//!
//! A live run seals itself (cancel, timeout, drain) from what it tracked while running. A dead
//! run (its replica stopped) is sealed from its stored events by whoever detects it: the next
//! admission on its session (fenced by the new run) or a sweeper (fenced by the session being
//! free). Sealing a dead run twice adds nothing the second time.

use super::super::bus::BusMsg;
use super::super::Runner;
use crate::event::{Content, Event, FunctionResponse, JsonMap, Part};
use crate::invocation::InvocationContext;
use crate::store::{Fence, RunRecord, RunStatus, SessionKey, StoreResult};
use crate::transcript::{EmitState, Outbox};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `errorCode` of the event that seals a cancelled, timed-out, interrupted or abandoned run.
pub const INVOCATION_ABORTED: &str = "INVOCATION_ABORTED";

/// `errorCode` of a run that failed because its replicas kept dying under it.
pub const MAX_RESUMES_EXCEEDED: &str = "MAX_RESUMES_EXCEEDED";

/// The events that answer `open` calls (id → (name, author)) and end the invocation.
fn seal_events(
    invocation_id: &str,
    open: BTreeMap<String, (String, String)>,
    root: &str,
    reason: &str,
    with_abort: bool,
    metadata: Option<&JsonMap>,
) -> Vec<Event> {
    let mut by_author: BTreeMap<String, Vec<Part>> = BTreeMap::new();
    for (id, (name, author)) in open {
        let response = serde_json::from_value(serde_json::json!({
            "error": "cancelled", "message": reason,
        }))
        .unwrap_or_default();
        by_author.entry(author).or_default().push(Part {
            function_response: Some(FunctionResponse {
                id: Some(id),
                name,
                response,
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let mut events: Vec<Event> = by_author
        .into_iter()
        .map(|(author, parts)| {
            Event::new(invocation_id, author).with_content(Content {
                parts,
                role: Some("user".into()),
                ..Default::default()
            })
        })
        .collect();
    if with_abort {
        let mut abort = Event::new(invocation_id, root);
        abort.error_code = Some(INVOCATION_ABORTED.into());
        abort.error_message = Some(reason.to_string());
        abort.interrupted = Some(true);
        events.push(abort);
    }
    if let Some(meta) = metadata {
        for e in &mut events {
            e.custom_metadata = Some(meta.clone());
        }
    }
    events
}

/// Seals a live run from its own tracking (holding its emit lock, so nothing interleaves).
/// Each event is committed fenced by the run and streamed to its client.
pub(in crate::runner) async fn seal_live(
    ctx: &InvocationContext,
    outbox: &Outbox,
    st: &mut EmitState,
    root: &str,
    reason: &str,
) {
    let open = std::mem::take(&mut st.open_calls);
    let events = seal_events(
        ctx.invocation_id(),
        open,
        root,
        reason,
        true,
        ctx.run_config().custom_metadata.as_ref(),
    );
    for event in events {
        if let Err(e) = outbox.commit(st, event, vec![]).await {
            tracing::error!(error = %e, "could not seal the run");
            return;
        }
    }
}

/// Seals a run that ended with nobody running it, from its stored events: every open call
/// answered, and an abort event with `code` and `reason`. Returns the seal's events (empty if
/// it was already sealed), committed under `fence`.
pub(in crate::runner) async fn seal_dead(
    runner: &Runner,
    run: &RunRecord,
    root: &str,
    fence: Fence<'_>,
    code: &str,
    reason: &str,
) -> StoreResult<Vec<(i64, Event)>> {
    let key = run.key();
    let mut open: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut aborted = false;
    let mut after = run.base_seq.unwrap_or(0);
    loop {
        let page = runner
            .sessions
            .invocation_events(&key, &run.invocation_id, after, 500)
            .await?;
        for stored in &page.events {
            let e = &stored.event;
            aborted |= e.error_code.as_deref() == Some(INVOCATION_ABORTED);
            for call in e.function_calls() {
                if let Some(id) = &call.id {
                    open.insert(id.clone(), (call.name.clone(), e.author.clone()));
                }
            }
            for resp in e.function_responses() {
                if let Some(id) = &resp.id {
                    open.remove(id);
                }
            }
        }
        match page.events.last() {
            Some(last) if page.has_more => after = last.seq,
            _ => break,
        }
    }
    let mut sealed = vec![];
    let mut events = seal_events(&run.invocation_id, open, root, reason, !aborted, None);
    if let Some(abort) = events.last_mut().filter(|e| e.error_code.is_some()) {
        abort.error_code = Some(code.to_string());
    }
    for event in events {
        let stored = runner
            .sessions
            .append_fenced(&key, event, vec![], fence)
            .await?;
        sealed.push((stored.seq, stored.event));
    }
    runner.runs.mark_sealed(&run.user_id, &run.run_id).await?;
    if !sealed.is_empty() {
        tracing::info!(run = %run.run_id, events = sealed.len(), "sealed the transcript of a dead run");
    }
    Ok(sealed)
}

/// Seals the transcripts of `key`'s runs that died with their replica (under `fence`: the
/// run that now holds the session), and tells followers each one ended.
pub(in crate::runner) async fn seal_dead_runs(
    runner: &Runner,
    key: &SessionKey,
    fence: Fence<'_>,
) -> StoreResult<()> {
    for dead in runner.runs.unsealed_runs(key).await? {
        let root = runner.root_name(&dead.app_name);
        let (code, reason) = why_ended(&dead);
        let sealed = seal_dead(runner, &dead, &root, fence, code, &reason).await?;
        publish_sealed(runner, &dead, sealed);
        runner.bus.publish(
            key,
            BusMsg::Done {
                run_id: dead.run_id.as_str().into(),
                status: dead.status,
                last_seq: None,
            },
        );
    }
    Ok(())
}

/// The abort event's code and reason for a run that ended with nobody running it.
fn why_ended(run: &RunRecord) -> (&'static str, String) {
    match run.status {
        RunStatus::Cancelled => (
            INVOCATION_ABORTED,
            "Invocation was aborted by client.".into(),
        ),
        RunStatus::TimedOut => (
            INVOCATION_ABORTED,
            "Invocation exceeded its maximum duration.".into(),
        ),
        RunStatus::Failed => (MAX_RESUMES_EXCEEDED, run.error.clone().unwrap_or_default()),
        _ => (
            INVOCATION_ABORTED,
            "Invocation was abandoned: the replica running it stopped.".into(),
        ),
    }
}

/// Tells a dead run's followers about the events that sealed it.
pub(in crate::runner) fn publish_sealed(
    runner: &Runner,
    run: &RunRecord,
    sealed: Vec<(i64, Event)>,
) {
    let key = run.key();
    let run_id: Arc<str> = run.run_id.as_str().into();
    for (seq, event) in sealed {
        runner.bus.publish(
            &key,
            BusMsg::Committed {
                run_id: Some(run_id.clone()),
                seq,
                event: Some(Arc::new(event)),
                in_run_stream: true,
            },
        );
    }
}
