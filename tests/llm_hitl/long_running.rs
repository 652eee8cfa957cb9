//! Long-running tools answered by the client in a later run; a stray answer does no harm.

use super::*;
use crate::both_backends;

/// A sub-agent's long-running tool leaves its call open (`longRunningToolIds`), the run ends;
/// the client's `functionResponse` in a later run goes to that sub-agent, whose model sees
/// the client's result right after its call, and the answer is stored. A normal tool called
/// in the same step runs at once and is not long-running.
async fn long_running_tool_round_trip_through_a_sub_agent(backend: Backend) {
    let m = ScriptedModel::start().await;
    let started = Arc::new(AtomicUsize::new(0));
    let s2 = started.clone();
    let ask = FunctionTool::new(
        "ask_manager",
        "Asks a manager for approval; the answer comes later.",
        move |_a: RequestArgs, _ctx| {
            let started = s2.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                Ok(Value::Null) // pending: the client answers later
            }
        },
    )
    .long_running();
    let check = FunctionTool::new(
        "check_budget",
        "The budget left.",
        |_a: RequestArgs, _ctx| async move { Ok(json!({"left": 1000})) },
    );
    let worker = LlmAgent::new("worker", m.model("worker-model"))
        .description("Handles budget requests.")
        .instruction("You handle budget requests.")
        .tool(ask)
        .tool(check);
    let coordinator = LlmAgent::new("coordinator", m.model("coord-model"))
        .instruction("Route requests.")
        .sub_agent(Arc::new(worker));
    let s =
        TestServer::start_agent(backend, "hitl", Arc::new(coordinator), PluginSet::default()).await;

    // Turn 1: the coordinator transfers, the worker calls the long-running tool (and a
    // normal one).
    m.push(
        "coord-model",
        Reply::tool_calls(&[("t1", "transfer_to_agent", r#"{"agent_name":"worker"}"#)]),
    );
    m.push(
        "worker-model",
        Reply::tool_calls(&[
            ("lr1", "ask_manager", r#"{"request":"more budget"}"#),
            ("n1", "check_budget", r#"{"request":"left"}"#),
        ]),
    );
    let msgs = s
        .run_stream(text_body("hitl", USER, "s1", "I need more budget"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(started.load(Ordering::SeqCst), 1, "the tool ran once");
    assert_eq!(m.requests_for("coord-model").len(), 1);
    assert_eq!(
        m.requests_for("worker-model").len(),
        1,
        "the model waits for the pending call"
    );

    let events = stored_events(&s, "hitl", USER, "s1").await;
    let call_event = events
        .iter()
        .find(|e| calls_of(e).iter().any(|c| c["id"] == "lr1"))
        .expect("the long-running call is stored");
    assert_eq!(call_event["author"], "worker");
    assert_eq!(calls_of(call_event)[0]["name"], "ask_manager");
    assert_eq!(
        long_running_ids(call_event),
        ["lr1"],
        "only the long-running call"
    );
    assert!(
        responses_to(&events, "lr1").is_empty(),
        "a pending call has no response: {events:#?}"
    );
    let n1 = responses_to(&events, "n1");
    assert_eq!(n1.len(), 1, "the normal call was answered at once");
    assert_eq!(n1[0]["response"], json!({"left": 1000}));
    // The transfer call is not long-running.
    let transfer = events
        .iter()
        .find(|e| calls_of(e).iter().any(|c| c["id"] == "t1"))
        .expect("transfer stored");
    assert_eq!(long_running_ids(transfer), Vec::<String>::new());
    // What the client saw matches what was stored.
    let streamed_call = complete(&msgs)
        .into_iter()
        .find(|e| calls_of(e).iter().any(|c| c["id"] == "lr1"))
        .expect("the call event was streamed");
    assert_eq!(long_running_ids(&streamed_call), ["lr1"]);

    // Turn 2: the client answers the call; the worker (not the root) goes on.
    m.push(
        "worker-model",
        Reply::text(&["Your budget ", "was approved."]),
    );
    let msgs = s
        .run_stream(answer_body(
            "hitl",
            "s1",
            "lr1",
            "ask_manager",
            json!({"status": "approved"}),
        ))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(
        m.requests_for("coord-model").len(),
        1,
        "the root was not asked"
    );
    let reqs = m.requests_for("worker-model");
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        tool_result_after_call(&reqs[1], "lr1"),
        json!({"status": "approved"})
    );
    assert_eq!(
        tool_result_after_call(&reqs[1], "n1"),
        json!({"left": 1000})
    );
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "the tool is not run again"
    );
    assert_eq!(final_text(&msgs), "Your budget was approved.");

    let events = stored_events(&s, "hitl", USER, "s1").await;
    let last = events.last().expect("events");
    assert_eq!(last["author"], "worker");
    assert_eq!(text_of(last), "Your budget was approved.");
    let answers = responses_to(&events, "lr1");
    assert_eq!(answers.len(), 1, "the client's answer is stored once");
    assert_eq!(answers[0]["response"], json!({"status": "approved"}));

    // Turn 3: the worker hands the conversation back; the coordinator's model sees the
    // worker's exchange as context, and its request is still one a provider accepts (the
    // client's answer to the worker's call is not an orphan tool message there).
    m.push(
        "worker-model",
        Reply::tool_calls(&[("t2", "transfer_to_agent", r#"{"agent_name":"coordinator"}"#)]),
    );
    m.push("coord-model", Reply::text(&["Anything else?"]));
    let msgs = s
        .run_stream(text_body(
            "hitl",
            USER,
            "s1",
            "Thanks, that is all for budgets.",
        ))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(final_text(&msgs), "Anything else?");
    let coord = m.requests_for("coord-model");
    assert_eq!(coord.len(), 2);
    let dump = serde_json::to_string(all_messages(&coord[1])).unwrap();
    assert!(
        dump.contains("approved"),
        "the outcome is in context: {dump}"
    );
    assert_requests_well_formed(&m);
    assert_eq!(m.unused(), 0);
}

/// A `functionResponse` that answers no call of the session (a stale client, a typo in the
/// id) does not poison the session: the model's requests stay ones a provider accepts.
async fn a_stray_function_response_does_not_poison_the_session(backend: Backend) {
    let m = ScriptedModel::start().await;
    let agent = LlmAgent::new("helper", m.model("stray-model")).instruction("Help.");
    let s = TestServer::start_agent(backend, "stray", Arc::new(agent), PluginSet::default()).await;
    m.push("stray-model", Reply::text(&["Hello."]));
    let msgs = s.run_stream(text_body("stray", USER, "s1", "hi")).await;
    assert_eq!(done_status(&msgs), "completed");

    m.push("stray-model", Reply::text(&["I did not ask for that."]));
    let msgs = s
        .run_stream(answer_body(
            "stray",
            "s1",
            "ghost-1",
            "ask_manager",
            json!({"status": "approved"}),
        ))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    m.push("stray-model", Reply::text(&["Still here."]));
    let msgs = s
        .run_stream(text_body("stray", USER, "s1", "are you there?"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(m.requests_for("stray-model").len(), 3);
    assert_requests_well_formed(&m);
    assert_eq!(m.unused(), 0);
}

both_backends!(
    long_running_tool_round_trip_through_a_sub_agent,
    a_stray_function_response_does_not_poison_the_session,
);
