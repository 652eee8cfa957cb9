//! Transfers to sub-agents, sequential and loop workflows, and `include_contents: none`.

use super::*;
use crate::both_backends;
use agentd::agent::llm::IncludeContents;
use agentd::agent::workflow::{LoopAgent, SequentialAgent, WorkflowParts};
use agentd::tools::builtin::ExitLoop;

/// `transfer_to_agent` hands the turn to a sub-agent, which answers in the same run and
/// keeps the conversation on the next turn.
async fn transfer_to_a_sub_agent_keeps_the_next_turn(backend: Backend) {
    let m = ScriptedModel::start().await;
    let billing =
        LlmAgent::new("billing", m.model("billing")).description("Handles invoices and payments.");
    let support =
        LlmAgent::new("support", m.model("support")).description("Fixes technical problems.");
    let coordinator = LlmAgent::new("coordinator", m.model("coord"))
        .instruction("Route the user.")
        .sub_agent(Arc::new(billing))
        .sub_agent(Arc::new(support));
    m.push(
        "coord",
        Reply::tool_calls(&[("t1", "transfer_to_agent", r#"{"agent_name": "nobody"}"#)]),
    )
    .push(
        "coord",
        Reply::tool_calls(&[("t2", "transfer_to_agent", r#"{"agent_name": "billing"}"#)]),
    )
    .push("billing", Reply::text(&["Billing here."]))
    .push("billing", Reply::text(&["Still billing."]));
    let s =
        TestServer::start_agent(backend, "desk", Arc::new(coordinator), PluginSet::default()).await;

    let msgs = s
        .run_stream(body("desk", "s1", "My invoice is wrong"))
        .await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    let authors: Vec<&str> = events
        .iter()
        .map(|e| e["author"].as_str().unwrap())
        .collect();
    assert_eq!(
        authors,
        [
            "coordinator",
            "coordinator",
            "coordinator",
            "coordinator",
            "billing"
        ],
        "{events:#?}"
    );
    // A transfer to an unknown agent is an error the model sees, naming the valid targets.
    let bad = responses_of(&events[1])[0]["response"]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(bad.contains("billing") && bad.contains("support"), "{bad}");
    assert_eq!(events[3]["actions"]["transferToAgent"], "billing");
    assert_eq!(text_of(&events[4]), "Billing here.");

    // The coordinator was told whom it can transfer to; billing sees the routing as context
    // and may go back to its parent or to its peer.
    let coord_req = &m.requests_for("coord")[0];
    let system = messages(coord_req, "system")[0]["content"]
        .as_str()
        .unwrap();
    assert!(system.starts_with("Route the user."));
    assert!(system.contains("Agent name: billing") && system.contains("Agent name: support"));
    let billing_req = &m.requests_for("billing")[0];
    let billing_system = messages(billing_req, "system")[0]["content"]
        .as_str()
        .unwrap();
    assert!(billing_system.contains("Agent name: coordinator"));
    assert!(billing_system.contains("Agent name: support"));
    let context: Vec<String> = messages(billing_req, "user")
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        context.iter().any(|c| c.contains("For context:")
            && c.contains("[coordinator] called tool `transfer_to_agent`")),
        "{context:#?}"
    );
    assert!(
        messages(billing_req, "tool").is_empty(),
        "other agents' calls are context"
    );

    // Next turn: billing answers directly.
    let msgs = s.run_stream(body("desk", "s1", "And the refund?")).await;
    let events = complete(&msgs);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["author"], "billing");
    assert_eq!(text_of(&events[0]), "Still billing.");
    assert_eq!(
        m.requests_for("coord").len(),
        2,
        "the coordinator was not asked again"
    );
    assert_eq!(m.unused(), 0);
}

/// A sequential pipeline passes state between LLM agents (`output_key` → `{draft}`); a loop
/// of an LLM agent stops when it calls `exit_loop`.
async fn sequential_and_loop_workflows_of_llm_agents(backend: Backend) {
    let m = ScriptedModel::start().await;
    let writer = LlmAgent::new("writer", m.model("writer"))
        .instruction("Write a draft.")
        .output_key("draft");
    let reviewer = LlmAgent::new("reviewer", m.model("reviewer")).instruction("Review: {draft}");
    let pipeline = SequentialAgent {
        parts: WorkflowParts {
            name: "pipeline".into(),
            description: String::new(),
            sub_agents: vec![Arc::new(writer), Arc::new(reviewer)],
            callbacks: None,
        },
    };
    m.push("writer", Reply::text(&["A ", "draft."]))
        .push("reviewer", Reply::text(&["Looks good."]));
    let s =
        TestServer::start_agent(backend, "pipe", Arc::new(pipeline), PluginSet::default()).await;
    let msgs = s.run_stream(body("pipe", "s1", "Write about cats")).await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    let authors: Vec<&str> = events
        .iter()
        .map(|e| e["author"].as_str().unwrap())
        .collect();
    assert_eq!(authors, ["writer", "reviewer"]);
    let review_req = &m.requests_for("reviewer")[0];
    assert_eq!(
        messages(review_req, "system")[0]["content"],
        "Review: A draft."
    );
    // The reviewer sees the writer's draft as context.
    let users: Vec<String> = messages(review_req, "user")
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        users.iter().any(|u| u.contains("[writer] said: A draft.")),
        "{users:#?}"
    );

    let worker = LlmAgent::new("worker", m.model("worker"))
        .instruction("Improve until done, then call exit_loop.")
        .tool(ExitLoop);
    let looped = LoopAgent {
        parts: WorkflowParts {
            name: "refine".into(),
            description: String::new(),
            sub_agents: vec![Arc::new(worker)],
            callbacks: None,
        },
        max_iterations: Some(5),
    };
    m.push("worker", Reply::text(&["round one"]))
        .push("worker", Reply::tool_calls(&[("x1", "exit_loop", "{}")]));
    let s2 = TestServer::start_agent(backend, "loop", Arc::new(looped), PluginSet::default()).await;
    let msgs = s2.run_stream(body("loop", "s1", "go")).await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    assert_eq!(
        events.len(),
        3,
        "text, exit_loop call, its response: {events:#?}"
    );
    assert_eq!(events[2]["actions"]["escalate"], true);
    assert_eq!(events[2]["actions"]["skipSummarization"], true);
    assert_eq!(
        m.requests_for("worker").len(),
        2,
        "the loop stopped at exit_loop"
    );
    assert_eq!(m.unused(), 0);
}

/// `include_contents: none`: the model sees the current turn only (the latest user message,
/// then this turn's tool round), never the earlier turns of the session.
async fn an_include_contents_none_agent_sees_only_the_current_turn(backend: Backend) {
    let m = ScriptedModel::start().await;
    m.push("turn", Reply::text(&["Noted: ", "blue."]))
        .push(
            "turn",
            Reply::tool_calls(&[("call_1", "get_weather", r#"{"city": "Paris"}"#)]),
        )
        .push("turn", Reply::text(&["Sunny."]));
    let mut agent = LlmAgent::new("forgetful", m.model("turn"))
        .tool(weather_tool(Arc::new(AtomicUsize::new(0))));
    agent.include_contents = IncludeContents::None;
    let s = TestServer::start_agent(backend, "turn", Arc::new(agent), PluginSet::default()).await;

    let first = s.run_stream(body("turn", "s1", "My colour is blue.")).await;
    assert_eq!(done_status(&first), "completed", "{first:#?}");
    let mut b = body("turn", "s1", "Weather in Paris?");
    b["createSession"] = json!(false);
    let second = s.run_stream(b).await;
    assert_eq!(done_status(&second), "completed", "{second:#?}");
    assert_eq!(text_of(complete(&second).last().unwrap()), "Sunny.");

    let requests = m.requests_for("turn");
    assert_eq!(requests.len(), 3);
    for (i, req) in requests[1..].iter().enumerate() {
        let text = req["messages"].to_string();
        assert!(text.contains("Weather in Paris?"), "request {i}: {text}");
        assert!(
            !text.contains("My colour is blue.") && !text.contains("Noted: blue."),
            "an earlier turn reached the model: {text}"
        );
    }
    // The second step of the turn carries its tool round.
    let tool = messages(&requests[2], "tool");
    assert_eq!(tool.len(), 1, "{:#}", requests[2]);
    assert!(tool[0]["content"].as_str().unwrap().contains("sunny"));
    // The session keeps every turn.
    assert_eq!(
        session(&s, "turn", "s1").await["events"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
}

both_backends!(
    an_include_contents_none_agent_sees_only_the_current_turn,
    transfer_to_a_sub_agent_keeps_the_next_turn,
    sequential_and_loop_workflows_of_llm_agents,
);
