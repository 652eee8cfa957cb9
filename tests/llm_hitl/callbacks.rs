//! Model and tool callbacks and plugins that short-circuit, observe and edit.

use super::*;
use crate::both_backends;
use agentd::agent::llm::{BeforeModel, LlmCallbacks, ToolCall};
use agentd::agent::{AgentResult, AgentTree, Plugin};
use agentd::apps::AppRegistry;
use agentd::model::LlmResponse;
use agentd::tools::ToolContext;
use async_trait::async_trait;

/// A before-model callback answers instead of the model; an after-model callback edits
/// what the model said before it is stored.
async fn model_callbacks_short_circuit_and_edit(backend: Backend) {
    let m = ScriptedModel::start().await;
    let cached = LlmAgent::new("cached", m.model("cached-model"))
        .instruction("Answer.")
        .llm_callbacks(
            LlmCallbacks::default().before_model(|_ctx, _req| async move {
                Ok(BeforeModel::Respond(LlmResponse::text("cached")))
            }),
        );
    let edited = LlmAgent::new("edited", m.model("edited-model"))
        .instruction("Answer.")
        .llm_callbacks(LlmCallbacks::default().after_model(
            |_ctx, mut r: LlmResponse| async move {
                if let Some(c) = &mut r.content {
                    for p in &mut c.parts {
                        if let Some(t) = &mut p.text {
                            *t = t.replace("secret", "[redacted]");
                        }
                    }
                }
                Ok(r)
            },
        ));
    let mut apps = AppRegistry::default();
    apps.insert("cached", AgentTree::new(Arc::new(cached)).unwrap());
    apps.insert("edited", AgentTree::new(Arc::new(edited)).unwrap());
    let s = TestServer::start_embedded(backend, apps, PluginSet::default()).await;

    let msgs = s.run_stream(text_body("cached", USER, "s1", "hi")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert!(
        m.requests_for("cached-model").is_empty(),
        "the model is not called"
    );
    assert_eq!(final_text(&msgs), "cached");
    let events = stored_events(&s, "cached", USER, "s1").await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["author"], "cached");
    assert_eq!(text_of(&events[1]), "cached");

    m.push("edited-model", Reply::text(&["the secret ", "is out"]));
    let msgs = s.run_stream(text_body("edited", USER, "s1", "hi")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(m.requests_for("edited-model").len(), 1);
    assert_eq!(final_text(&msgs), "the [redacted] is out");
    let events = stored_events(&s, "edited", USER, "s1").await;
    assert_eq!(text_of(events.last().unwrap()), "the [redacted] is out");
    assert_requests_well_formed(&m);
    assert_eq!(m.unused(), 0);
}

/// What an after-model callback removes (redaction) never reaches the client, not even in
/// the streamed chunks: ADK runs `after_model_callback` on every streamed response, partial
/// ones included, in order, and streams what it returns. Here the secret arrives split across
/// two chunks, so a redactor that looks at one chunk at a time cannot see it: this one holds
/// back a tail that could begin the secret until the next chunk tells.
async fn after_model_redaction_covers_streamed_chunks(backend: Backend) {
    const SECRET: &str = "hunter2";
    let m = ScriptedModel::start().await;
    let held = Arc::new(std::sync::Mutex::new(String::new()));
    let agent = LlmAgent::new("redactor", m.model("redact-model"))
        .instruction("Answer.")
        .llm_callbacks(
            LlmCallbacks::default().after_model(move |_ctx, mut r: LlmResponse| {
                let held = held.clone();
                async move {
                    let partial = r.partial;
                    if let Some(c) = &mut r.content {
                        for p in &mut c.parts {
                            let Some(t) = &mut p.text else { continue };
                            let mut held = held.lock().unwrap();
                            if !partial {
                                // The whole response, aggregated from the raw chunks.
                                held.clear();
                                *t = t.replace(SECRET, "[redacted]");
                                continue;
                            }
                            let mut text = std::mem::take(&mut *held) + t.as_str();
                            text = text.replace(SECRET, "[redacted]");
                            let keep = (1..SECRET.len())
                                .rev()
                                .find(|&n| text.ends_with(&SECRET[..n]))
                                .unwrap_or(0);
                            *held = text.split_off(text.len() - keep);
                            *t = text;
                        }
                    }
                    Ok(r)
                }
            }),
        );
    let s = TestServer::start_agent(backend, "redact", Arc::new(agent), PluginSet::default()).await;
    m.push(
        "redact-model",
        Reply::text(&["the password is hun", "ter2", " ok"]),
    );
    let msgs = s
        .run_stream(text_body("redact", USER, "s1", "what is the password?"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(final_text(&msgs), "the password is [redacted] ok");
    // Each chunk was streamed, as the callback returned it.
    let partials: Vec<&Msg> = msgs
        .iter()
        .filter(|m| m.is_event() && m.is_partial())
        .collect();
    assert!(
        partials.len() > 1,
        "the reply was streamed in chunks: {msgs:#?}"
    );
    let streamed: String = partials.iter().map(|m| text_of(&m.data)).collect();
    assert_eq!(
        streamed, "the password is [redacted] ok",
        "what the client assembles from the chunks: {partials:#?}"
    );
    let leaked: Vec<&Msg> = msgs
        .iter()
        .filter(|m| m.data.to_string().contains(SECRET))
        .collect();
    assert!(
        leaked.is_empty(),
        "the redacted text was streamed to the client: {leaked:#?}"
    );
    let stored = stored_events(&s, "redact", USER, "s1").await;
    assert!(stored.len() >= 2, "{stored:#?}");
    let leaked: Vec<&Value> = stored
        .iter()
        .filter(|e| e.to_string().contains(SECRET))
        .collect();
    assert!(leaked.is_empty(), "the secret was stored: {leaked:#?}");
}

/// A before-tool callback answers instead of the tool; the model sees the stub.
async fn before_tool_callback_stubs_the_tool(backend: Backend) {
    let m = ScriptedModel::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(vec![]));
    let seen2 = seen.clone();
    let agent = LlmAgent::new("stubbed", m.model("stub-model"))
        .instruction("Manage files.")
        .tool(counting_tool("delete_file", calls.clone()))
        .llm_callbacks(LlmCallbacks::default().before_tool(
            move |call: ToolCall, _ctx: ToolContext| {
                let seen = seen2.clone();
                async move {
                    seen.lock()
                        .unwrap()
                        .push((call.name.clone(), call.args.clone()));
                    Ok(Some(json!({"stubbed": true})))
                }
            },
        ));
    let s = TestServer::start_agent(backend, "stub", Arc::new(agent), PluginSet::default()).await;
    m.push(
        "stub-model",
        Reply::tool_calls(&[("s1c", "delete_file", r#"{"path":"/etc/passwd"}"#)]),
    );
    m.push("stub-model", Reply::text(&["Done (stubbed)."]));
    let msgs = s
        .run_stream(text_body("stub", USER, "s1", "delete it"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the tool body never ran");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, "delete_file");
        assert_eq!(seen[0].1["path"], "/etc/passwd");
    }
    let events = stored_events(&s, "stub", USER, "s1").await;
    let r = responses_to(&events, "s1c");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0]["response"], json!({"stubbed": true}));
    let reqs = m.requests_for("stub-model");
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        tool_result_after_call(&reqs[1], "s1c"),
        json!({"stubbed": true})
    );
    assert_eq!(final_text(&msgs), "Done (stubbed).");
    assert_requests_well_formed(&m);
    assert_eq!(m.unused(), 0);
}

#[derive(Default)]
struct ToolAudit {
    before: AtomicUsize,
    after: AtomicUsize,
    results: std::sync::Mutex<Vec<Value>>,
}

struct AuditPlugin(Arc<ToolAudit>);

#[async_trait]
impl Plugin for AuditPlugin {
    fn name(&self) -> &str {
        "tool_audit"
    }

    async fn before_tool(&self, _ctx: &ToolContext, call: &ToolCall) -> AgentResult<Option<Value>> {
        assert_eq!(call.name, "delete_file");
        self.0.before.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }

    async fn after_tool(
        &self,
        ctx: &ToolContext,
        _call: &ToolCall,
        result: &mut Value,
    ) -> AgentResult {
        self.0.after.fetch_add(1, Ordering::SeqCst);
        self.0.results.lock().unwrap().push(result.clone());
        result["audited_call"] = json!(ctx.function_call_id());
        Ok(())
    }
}

/// A plugin's tool hooks see every call and its result, and may edit the result.
async fn plugin_tool_hooks_observe_and_edit(backend: Backend) {
    let m = ScriptedModel::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let audit = Arc::new(ToolAudit::default());
    let agent = LlmAgent::new("audited", m.model("audit-model"))
        .instruction("Manage files.")
        .tool(counting_tool("delete_file", calls.clone()));
    let plugins = PluginSet::new(vec![Arc::new(AuditPlugin(audit.clone()))]).expect("plugins");
    let s = TestServer::start_agent(backend, "audit", Arc::new(agent), plugins).await;
    m.push(
        "audit-model",
        Reply::tool_calls(&[
            ("p1", "delete_file", r#"{"path":"a.txt"}"#),
            ("p2", "delete_file", r#"{"path":"b.txt"}"#),
        ]),
    );
    m.push("audit-model", Reply::text(&["Both deleted."]));
    let msgs = s
        .run_stream(text_body("audit", USER, "s1", "delete a and b"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(audit.before.load(Ordering::SeqCst), 2);
    assert_eq!(audit.after.load(Ordering::SeqCst), 2);
    let mut results = audit.results.lock().unwrap().clone();
    results.sort_by_key(|v| v.to_string());
    assert_eq!(
        results,
        [json!({"deleted": "a.txt"}), json!({"deleted": "b.txt"})]
    );
    let events = stored_events(&s, "audit", USER, "s1").await;
    for (id, path) in [("p1", "a.txt"), ("p2", "b.txt")] {
        let r = responses_to(&events, id);
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0]["response"],
            json!({"deleted": path, "audited_call": id})
        );
    }
    let reqs = m.requests_for("audit-model");
    assert_eq!(tool_result_after_call(&reqs[1], "p1")["audited_call"], "p1");
    assert_eq!(final_text(&msgs), "Both deleted.");
    assert_requests_well_formed(&m);
}

both_backends!(
    model_callbacks_short_circuit_and_edit,
    after_model_redaction_covers_streamed_chunks,
    before_tool_callback_stubs_the_tool,
    plugin_tool_hooks_observe_and_edit,
);
