//! ADK's tool-confirmation round trip: approving runs the tool once, rejecting never runs it.

use super::*;
use crate::both_backends;

/// Approving runs the tool once and answers the ORIGINAL call with its real result; the
/// model sees exactly that result and nothing of the confirmation machinery.
async fn approving_a_confirmation_runs_the_tool_once(backend: Backend) {
    let ConfirmSetup {
        m,
        s,
        calls,
        request_id,
        ..
    } = confirmation_requested(backend).await;

    m.push("ops-model", Reply::text(&["Deleted ", "the report."]));
    let msgs = s
        .run_stream(answer_body(
            "confirm",
            "s1",
            &request_id,
            REQUEST_CONFIRMATION,
            json!({"confirmed": true}),
        ))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the tool ran once");

    let events = stored_events(&s, "confirm", USER, "s1").await;
    let answers = responses_to(&events, "c1");
    assert_eq!(answers.len(), 2, "the placeholder, then the real result");
    assert_eq!(answers[1]["name"], "delete_file");
    assert_eq!(
        answers[1]["response"],
        json!({"deleted": "/tmp/report.txt"})
    );
    let real = events
        .iter()
        .rev()
        .find(|e| responses_of(e).iter().any(|r| r["id"] == "c1"))
        .unwrap();
    assert_eq!(real["author"], "ops");

    let reqs = m.requests_for("ops-model");
    assert_eq!(reqs.len(), 2, "the model is called after the tool");
    let result = tool_result_after_call(&reqs[1], "c1");
    assert_eq!(result, json!({"deleted": "/tmp/report.txt"}));
    let dump = serde_json::to_string(all_messages(&reqs[1])).unwrap();
    assert!(
        !dump.contains(REQUEST_CONFIRMATION),
        "the confirmation calls are internal: {dump}"
    );
    assert!(!dump.contains(CONFIRMATION_REQUIRED), "{dump}");
    assert_eq!(
        all_messages(&reqs[1]).len(),
        4,
        "system, user, call, result: {dump}"
    );

    assert_eq!(final_text(&msgs), "Deleted the report.");
    assert_eq!(text_of(events.last().unwrap()), "Deleted the report.");
    assert_requests_well_formed(&m);
    assert_eq!(m.unused(), 0);
}

/// Rejecting never runs the tool; the model is told the call was rejected.
async fn rejecting_a_confirmation_never_runs_the_tool(backend: Backend) {
    let ConfirmSetup {
        m,
        s,
        calls,
        request_id,
        ..
    } = confirmation_requested(backend).await;

    m.push("ops-model", Reply::text(&["OK, I left the report alone."]));
    let msgs = s
        .run_stream(answer_body(
            "confirm",
            "s1",
            &request_id,
            REQUEST_CONFIRMATION,
            json!({"confirmed": false}),
        ))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a rejected tool never runs"
    );

    let events = stored_events(&s, "confirm", USER, "s1").await;
    let answers = responses_to(&events, "c1");
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[1]["response"]["error"], CONFIRMATION_REJECTED);

    let reqs = m.requests_for("ops-model");
    assert_eq!(reqs.len(), 2);
    let result = tool_result_after_call(&reqs[1], "c1");
    assert_eq!(result["error"], CONFIRMATION_REJECTED);
    let dump = serde_json::to_string(all_messages(&reqs[1])).unwrap();
    assert!(!dump.contains(REQUEST_CONFIRMATION), "{dump}");
    assert_eq!(final_text(&msgs), "OK, I left the report alone.");
    assert_requests_well_formed(&m);
    assert_eq!(m.unused(), 0);
}

/// The ADK web UI sends the confirmation JSON-encoded under `response`; it works the same.
async fn approving_in_the_web_ui_encoding(backend: Backend) {
    let ConfirmSetup {
        m,
        s,
        calls,
        request_id,
        ..
    } = confirmation_requested(backend).await;
    m.push("ops-model", Reply::text(&["Deleted."]));
    let msgs = s
        .run_stream(answer_body(
            "confirm",
            "s1",
            &request_id,
            REQUEST_CONFIRMATION,
            json!({"response": "{\"confirmed\": true}"}),
        ))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let reqs = m.requests_for("ops-model");
    assert_eq!(
        tool_result_after_call(&reqs[1], "c1"),
        json!({"deleted": "/tmp/report.txt"})
    );
    // A malformed answer is a rejection, never an approval (as ADK).
    let ConfirmSetup {
        m,
        s,
        calls,
        request_id,
        ..
    } = confirmation_requested(backend).await;
    m.push("ops-model", Reply::text(&["Not deleted."]));
    let msgs = s
        .run_stream(answer_body(
            "confirm",
            "s1",
            &request_id,
            REQUEST_CONFIRMATION,
            json!({"confirmed": "yes"}),
        ))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "\"yes\" is not a boolean approval"
    );
    let reqs = m.requests_for("ops-model");
    assert_eq!(
        tool_result_after_call(&reqs[1], "c1")["error"],
        CONFIRMATION_REJECTED
    );
}

/// A client that sends its approval twice (a retried request, a double click) must not run
/// the side effect twice: one approval is consent for one execution.
async fn a_replayed_approval_does_not_run_the_tool_again(backend: Backend) {
    let ConfirmSetup {
        m,
        s,
        calls,
        request_id,
        ..
    } = confirmation_requested(backend).await;
    let approve = answer_body(
        "confirm",
        "s1",
        &request_id,
        REQUEST_CONFIRMATION,
        json!({"confirmed": true}),
    );
    m.push("ops-model", Reply::text(&["Deleted."]));
    let msgs = s.run_stream(approve.clone()).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    m.push("ops-model", Reply::text(&["Already done."]));
    let msgs = s.run_stream(approve).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the replayed approval ran the tool again"
    );
    let events = stored_events(&s, "confirm", USER, "s1").await;
    assert_eq!(
        responses_to(&events, "c1").len(),
        2,
        "no third response to c1: {events:#?}"
    );
    assert_requests_well_formed(&m);
}

/// An approved tool interrupted while it works is run again by `resume` (or asks again),
/// rather than the model being told it was cancelled.
async fn resume_reruns_an_approved_call_interrupted_while_running(backend: Backend) {
    let ConfirmSetup {
        m,
        s,
        calls,
        started,
        slow,
        request_id,
    } = confirmation_requested(backend).await;
    slow.store(true, Ordering::SeqCst);
    let resp = s
        .post_json(
            "/run",
            answer_body(
                "confirm",
                "s1",
                &request_id,
                REQUEST_CONFIRMATION,
                json!({"confirmed": true}),
            ),
        )
        .await;
    assert_eq!(resp.status().as_u16(), 200);
    wait_until("the approved tool to start", || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    cancel(&s, &resp).await;
    let msgs = read_all(resp).await;
    assert_eq!(done_status(&msgs), "cancelled", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let events = stored_events(&s, "confirm", USER, "s1").await;
    assert_eq!(
        events.last().unwrap()["errorCode"],
        "INVOCATION_ABORTED",
        "{events:#?}"
    );

    slow.store(false, Ordering::SeqCst);
    m.push("ops-model", Reply::text(&["Deleted."]));
    let msgs = s
        .run_stream(
            json!({"appName": "confirm", "userId": USER, "sessionId": "s1",
               "streaming": true, "resume": true}),
        )
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    // Either outcome is acceptable: the approved call runs again, or the user is asked again.
    // Not acceptable: the model being called with the stale "requires confirmation" answer.
    let reran = started.load(Ordering::SeqCst) == 2;
    let asked_again = complete(&msgs).iter().any(|e| {
        calls_of(e).iter().any(|c| {
            c["name"] == REQUEST_CONFIRMATION && c["args"]["originalFunctionCall"]["id"] == "c1"
        })
    });
    let reqs = m.requests_for("ops-model");
    assert!(
        reran || asked_again,
        "resume neither ran the approved call again nor asked again; the model was called \
         with: {:#?}",
        reqs.last().map(|r| tool_messages(r, "c1"))
    );
    if reran {
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            tool_result_after_call(reqs.last().unwrap(), "c1"),
            json!({"deleted": "/tmp/report.txt"})
        );
    } else {
        assert_eq!(reqs.len(), 1, "the model waits for the new approval");
    }
    assert_requests_well_formed(&m);
}

/// An event without a message after the confirmation request — a PATCH of the session's
/// state, or a compaction's summary (author `user`, no content) — does not end the turn:
/// approving still runs the tool.
async fn an_event_without_a_message_does_not_end_the_turn(backend: Backend) {
    let ConfirmSetup {
        m,
        s,
        calls,
        request_id,
        ..
    } = confirmation_requested(backend).await;
    let patched = s
        .client
        .patch(s.url(&format!("/apps/confirm/users/{USER}/sessions/s1")))
        .json(&json!({"stateDelta": {"note": "between"}}))
        .send()
        .await
        .expect("PATCH");
    assert_eq!(patched.status(), 200);
    m.push("ops-model", Reply::text(&["Deleted."]));
    let msgs = s
        .run_stream(answer_body(
            "confirm",
            "s1",
            &request_id,
            REQUEST_CONFIRMATION,
            json!({"confirmed": true}),
        ))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the approved tool ran");
}

both_backends!(
    an_event_without_a_message_does_not_end_the_turn,
    approving_a_confirmation_runs_the_tool_once,
    rejecting_a_confirmation_never_runs_the_tool,
    approving_in_the_web_ui_encoding,
    a_replayed_approval_does_not_run_the_tool_again,
    resume_reruns_an_approved_call_interrupted_while_running,
);
