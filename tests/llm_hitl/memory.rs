//! Memory search through `load_memory` finds what another session said.

use super::*;
use crate::both_backends;
use agentd::tools::builtin::LoadMemory;

/// What one session said, added to memory, is found by `load_memory` in another session of
/// the same user, and by no one else.
async fn load_memory_finds_what_another_session_said(backend: Backend) {
    let m = ScriptedModel::start().await;
    let agent = LlmAgent::new("keeper", m.model("mem-model"))
        .instruction("Remember things.")
        .tool(LoadMemory);
    let s = TestServer::start_agent(backend, "mem", Arc::new(agent), PluginSet::default()).await;

    // Session A: the answer holds the fact.
    m.push(
        "mem-model",
        Reply::text(&["Noted: the launch code ", "is pelican."]),
    );
    let msgs = s
        .run_stream(text_body("mem", USER, "A", "Please remember our code."))
        .await;
    assert_eq!(done_status(&msgs), "completed");
    let r = s
        .patch_json(
            &format!("/apps/mem/users/{USER}/memory"),
            json!({"sessionId": "A"}),
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);

    // Session B, same user: the model looks it up.
    m.push(
        "mem-model",
        Reply::tool_calls(&[("m1", "load_memory", r#"{"query":"launch code"}"#)]),
    );
    m.push("mem-model", Reply::text(&["The code is pelican."]));
    let msgs = s
        .run_stream(text_body("mem", USER, "B", "What was the launch code?"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let events = stored_events(&s, "mem", USER, "B").await;
    let found = responses_to(&events, "m1");
    assert_eq!(found.len(), 1, "{events:#?}");
    assert_eq!(found[0]["name"], "load_memory");
    let memories = found[0]["response"]["memories"]
        .as_array()
        .expect("memories");
    let hit = memories
        .iter()
        .find(|mem| mem["text"].as_str().is_some_and(|t| t.contains("pelican")))
        .unwrap_or_else(|| panic!("a memory mentions pelican: {memories:#?}"));
    assert_eq!(hit["author"], "keeper");
    assert_eq!(hit["sessionId"], "A");
    let reqs = m.requests_for("mem-model");
    let result = tool_result_after_call(&reqs[2], "m1");
    assert!(
        result.to_string().contains("pelican"),
        "the model sees it: {result}"
    );
    assert_eq!(final_text(&msgs), "The code is pelican.");

    // Another user asks the same: nothing of u1's memory.
    m.push(
        "mem-model",
        Reply::tool_calls(&[("m2", "load_memory", r#"{"query":"launch code"}"#)]),
    );
    m.push("mem-model", Reply::text(&["I don't know."]));
    let msgs = s
        .run_stream(text_body("mem", "u2", "C", "What was the launch code?"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let events = stored_events(&s, "mem", "u2", "C").await;
    let found = responses_to(&events, "m2");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["response"]["memories"], json!([]), "{found:#?}");
    assert_requests_well_formed(&m);
    assert_eq!(m.unused(), 0);
}

both_backends!(load_memory_finds_what_another_session_said);
