//! Run control: one run per session (reject, enqueue, interrupt), cancel, client disconnect.

use super::*;
use crate::both_backends;
use std::collections::BTreeSet;

/// The message just before `event: done`, which a cancelled run's stream ends with.
fn aborted_then_done(msgs: &[Msg]) -> &Msg {
    assert!(msgs.len() >= 2, "{msgs:#?}");
    &msgs[msgs.len() - 2]
}

fn assert_aborted(event: &Value, author: &str) {
    assert_eq!(event["errorCode"], "INVOCATION_ABORTED", "{event}");
    assert_eq!(event["errorMessage"], "Invocation was aborted by client.");
    assert_eq!(event["author"], author);
}

async fn concurrent_runs_on_one_session_admit_one_and_reject_the_rest(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let outcomes = futures::future::join_all(
        (0..20).map(|i| run_to_end(&s, run_body("slow", "s1", &format!("message {i}")))),
    )
    .await;

    let mut winners = vec![];
    for outcome in outcomes {
        match outcome {
            Ok(msgs) => winners.push(msgs),
            Err((status, body)) => {
                assert_eq!(status, 409, "{body}");
                assert_eq!(body["code"], "session_busy", "{body}");
            }
        }
    }
    assert_eq!(winners.len(), 1, "exactly one run is admitted");
    let winner = &winners[0];
    assert_eq!(done(winner)["status"], "completed");

    let stored = transcript(&s, "slow", "s1").await;
    assert_eq!(stored.len(), 2, "one run's events only: {stored:#?}");
    let invocation = &complete(winner)[0]["invocationId"];
    assert!(stored.iter().all(|e| &e["invocationId"] == invocation));
    assert_eq!(text(&stored[0]), text(&stored[1]));
}

async fn enqueued_runs_on_one_session_all_complete_one_after_another(backend: Backend) {
    let apps = Apps::new().echo("quick", "chunks: 5\nchunk_delay_ms: 20");
    let s = apps.serve(backend).await;
    create_session(&s, "quick", "s1").await;
    let outcomes = futures::future::join_all((0..20).map(|i| {
        let body = run_body("quick", "s1", &format!("message {i}"));
        run_to_end(&s, with(body, json!({ "onBusy": "enqueue" })))
    }))
    .await;
    for outcome in outcomes {
        let msgs = outcome.unwrap_or_else(|(status, body)| panic!("{status}: {body}"));
        assert_eq!(done(&msgs)["status"], "completed");
    }

    let stored = transcript(&s, "quick", "s1").await;
    assert_eq!(stored.len(), 40, "20 turns of user event and reply");
    let mut messages = BTreeSet::new();
    for (n, pair) in stored.chunks(2).enumerate() {
        let (user, reply) = (&pair[0], &pair[1]);
        assert_eq!(user["author"], "user", "turn {n}: {pair:#?}");
        assert_eq!(reply["author"], "quick");
        assert_eq!(
            user["invocationId"], reply["invocationId"],
            "turn {n} is contiguous"
        );
        assert_eq!(text(user), text(reply));
        assert_eq!(reply["actions"]["stateDelta"]["turns"], n + 1);
        messages.insert(text(user));
    }
    assert_eq!(messages.len(), 20, "every request ran once");
    // A waiting request's user event is stamped when it is committed, not when it arrived:
    // the transcript's timestamps never go backwards.
    let stamps: Vec<f64> = stored
        .iter()
        .map(|e| e["timestamp"].as_f64().unwrap())
        .collect();
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "timestamps in commit order: {stamps:?}"
    );
}

async fn interrupt_cancels_the_running_run_and_starts_the_new_one(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let mut first = run(&s, run_body("slow", "s1", "first")).await;
    first.until(Msg::is_partial).await;

    let second = with(
        run_body("slow", "s1", "second"),
        json!({ "onBusy": "interrupt" }),
    );
    let mut second = run(&s, second).await;
    let first_msgs = first.rest().await;
    assert_aborted(&aborted_then_done(&first_msgs).data, "slow");
    assert_eq!(done(&first_msgs)["status"], "cancelled");
    assert_eq!(done(&second.rest().await)["status"], "completed");
    assert_eq!(
        finished_run(&s, &first.run_id()).await["status"],
        "cancelled"
    );

    let stored = transcript(&s, "slow", "s1").await;
    let texts: Vec<String> = stored.iter().map(text).collect();
    assert_eq!(texts, ["first", "", "second", "second"]);
    assert_aborted(&stored[1], "slow");
}

async fn cancel_seals_the_transcript_and_frees_the_session(backend: Backend) {
    let apps = Apps::new().echo("slow", &format!("{SLOW}\ncall_tool: lookup"));
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let mut sse = run(&s, run_body("slow", "s1", "take your time")).await;
    let run_id = sse.run_id();
    let mut msgs = sse.until(Msg::is_partial).await;
    let call_id = msgs[0].data["content"]["parts"][0]["functionCall"]["id"].clone();
    assert!(call_id.is_string(), "{:?}", msgs[0]);

    let resp = s
        .post_json(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    let accepted = json_with_status(resp, 202).await;
    assert_eq!(accepted["runId"], run_id.as_str());
    assert_eq!(accepted["cancelRequested"], true);
    msgs.extend(sse.rest().await);

    let finish = done(&msgs);
    assert_eq!(finish["status"], "cancelled");
    let abort = aborted_then_done(&msgs);
    assert_aborted(&abort.data, "slow");
    assert_eq!(
        finish["lastSeq"].to_string(),
        abort.id,
        "lastSeq is the last id"
    );
    let events = complete(&msgs);
    let sealed_call = events[events.len() - 2];
    let response = &sealed_call["content"]["parts"][0]["functionResponse"];
    assert_eq!(response["id"], call_id, "the open call is answered");
    assert!(response["response"]["error"].is_string(), "{response}");

    let stored = transcript(&s, "slow", "s1").await;
    assert_eq!(
        stored.len(),
        4,
        "user, call, error response, abort: {stored:#?}"
    );
    assert_eq!(stored[2]["id"], sealed_call["id"]);
    assert_aborted(stored.last().unwrap(), "slow");
    assert_eq!(finished_run(&s, &run_id).await["status"], "cancelled");

    // The session takes a new run at once. A retried cancel of the cancelled run answers its
    // record; a cancel of a run that completed is 409.
    let next = run_to_end(&s, run_body("slow", "s1", "again"))
        .await
        .unwrap();
    assert_eq!(done(&next)["status"], "completed");
    let resp = s
        .post_json(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(json_with_status(resp, 202).await["status"], "cancelled");
    let completed = done(&next)["runId"]
        .as_str()
        .expect("the completed run's id")
        .to_string();
    let resp = s
        .post_json(&format!("/runs/{completed}/cancel"), json!({}))
        .await;
    assert_eq!(json_with_status(resp, 409).await["code"], "run_not_active");
    let resp = s.post_json("/runs/run-nope/cancel", json!({})).await;
    assert_eq!(json_with_status(resp, 404).await["code"], "run_not_found");
}

async fn a_client_disconnect_cancels_the_run_and_seals_the_transcript(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let mut sse = run_sse(&s, run_body("slow", "s1", "are you there?")).await;
    let run_id = sse.run_id();
    sse.until(Msg::is_partial).await;
    drop(sse);

    assert_eq!(finished_run(&s, &run_id).await["status"], "cancelled");
    let stored = transcript(&s, "slow", "s1").await;
    assert_eq!(stored.len(), 2, "{stored:#?}");
    assert_aborted(&stored[1], "slow");
}

async fn with_on_disconnect_continue_the_run_completes_without_its_client(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let body = with(
        run_body("slow", "s1", "finish anyway"),
        json!({ "onDisconnect": "continue" }),
    );
    let mut sse = run_sse(&s, body).await;
    let run_id = sse.run_id();
    sse.until(Msg::is_partial).await;
    drop(sse);

    assert_eq!(finished_run(&s, &run_id).await["status"], "completed");
    let stored = transcript(&s, "slow", "s1").await;
    let texts: Vec<String> = stored.iter().map(text).collect();
    assert_eq!(texts, ["finish anyway", "finish anyway"]);
}

both_backends!(
    concurrent_runs_on_one_session_admit_one_and_reject_the_rest,
    enqueued_runs_on_one_session_all_complete_one_after_another,
    interrupt_cancels_the_running_run_and_starts_the_new_one,
    cancel_seals_the_transcript_and_frees_the_session,
    a_client_disconnect_cancels_the_run_and_seals_the_transcript,
    with_on_disconnect_continue_the_run_completes_without_its_client,
);
