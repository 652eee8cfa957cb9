//! Agent callbacks and plugins answer instead of the agent, add events and rewrite them.

use super::*;
use crate::both_backends;
use agentd::agent::{AgentCallbacks, CallbackContext, Plugin};

/// Answers every run whose message is `closed?` itself, before any agent runs.
struct Gate;

#[async_trait]
impl Plugin for Gate {
    fn name(&self) -> &str {
        "gate"
    }

    async fn before_run(&self, ctx: &InvocationContext) -> AgentResult<Option<Content>> {
        Ok((ctx.user_text() == "closed?").then(|| Content::text("model", "We are closed.")))
    }
}

/// Stamps every agent event with `customMetadata.audited`.
struct Audit;

#[async_trait]
impl Plugin for Audit {
    fn name(&self) -> &str {
        "audit"
    }

    async fn on_event(&self, _ctx: &InvocationContext, event: &mut Event) -> AgentResult {
        event
            .custom_metadata
            .get_or_insert_with(Default::default)
            .insert("audited".into(), json!(true));
        Ok(())
    }
}

/// `intercepted`: a before callback answers instead of the echo agent.
/// `signed`: an after callback appends a signature.
async fn callback_server(backend: Backend) -> TestServer {
    let echo = |name: &str, callbacks: AgentCallbacks| {
        let mut agent = agentd::agent::echo::EchoAgent::new(name);
        agent.callbacks = Some(callbacks);
        AgentTree::new(Arc::new(agent)).unwrap()
    };
    let before = AgentCallbacks::default().before(|cb: CallbackContext| async move {
        cb.set_state("checked", json!(true));
        Ok(Some(Content::text("model", "intercepted by callback")))
    });
    let after = AgentCallbacks::default().after(|cb: CallbackContext| async move {
        cb.set_state("signed", json!(true));
        Ok(Some(Content::text("model", "-- signed")))
    });
    let mut apps = AppRegistry::default();
    apps.insert("intercepted", echo("intercepted", before));
    apps.insert("signed", echo("signed", after));
    let plugins = PluginSet::new(vec![Arc::new(Gate), Arc::new(Audit)]).unwrap();
    TestServer::start_embedded(backend, apps, plugins).await
}

async fn before_agent_callback_answers_instead_of_the_agent(backend: Backend) {
    let s = callback_server(backend).await;
    create_session(&s, "intercepted", "s1").await;
    let msgs = run_sse(&s, run_body("intercepted", "s1", "echo me"))
        .await
        .rest()
        .await;
    assert_eq!(msgs.len(), 1, "the agent never ran: {msgs:#?}");
    let event = &msgs[0].data;
    assert_eq!(text(event), "intercepted by callback");
    assert_eq!(event["author"], "intercepted");
    assert_eq!(event["actions"]["stateDelta"], json!({ "checked": true }));

    let session = stored_session(&s, "intercepted", "s1").await;
    assert_eq!(session["state"]["checked"], true);
    let events = session["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(&events[1], event);
}

async fn after_agent_callback_appends_an_event(backend: Backend) {
    let s = callback_server(backend).await;
    create_session(&s, "signed", "s1").await;
    let events = turn(&s, "signed", "s1", "hello").await;
    let texts: Vec<String> = events.iter().map(text).collect();
    assert_eq!(texts, ["hello", "-- signed"]);
    assert_eq!(
        events[1]["actions"]["stateDelta"],
        json!({ "signed": true })
    );
    let stored = transcript(&s, "signed", "s1").await;
    let stored_texts: Vec<String> = stored.iter().map(text).collect();
    assert_eq!(stored_texts, ["hello", "hello", "-- signed"]);
}

async fn plugin_before_run_ends_the_run_early(backend: Backend) {
    let s = callback_server(backend).await;
    create_session(&s, "signed", "s1").await;
    let msgs = run_sse(&s, run_body("signed", "s1", "closed?"))
        .await
        .rest()
        .await;
    assert_eq!(msgs.len(), 1, "no agent, no callback: {msgs:#?}");
    assert_eq!(text(&msgs[0].data), "We are closed.");
    assert_eq!(msgs[0].data["author"], "signed", "the root agent's event");
    let stored = transcript(&s, "signed", "s1").await;
    assert_eq!(stored.len(), 2);
    assert_eq!(text(&stored[1]), "We are closed.");
}

async fn plugin_on_event_rewrites_streamed_and_stored_events(backend: Backend) {
    let s = callback_server(backend).await;
    create_session(&s, "signed", "s1").await;
    let msgs = run_sse(&s, run_body("signed", "s1", "hello"))
        .await
        .rest()
        .await;
    assert!(msgs.iter().any(Msg::is_partial));
    for m in &msgs {
        assert_eq!(
            m.data["customMetadata"],
            json!({ "audited": true }),
            "{m:?}"
        );
    }
    let stored = transcript(&s, "signed", "s1").await;
    assert!(
        stored[0].get("customMetadata").is_none(),
        "the user event is not an agent's"
    );
    assert_eq!(stored.len(), 3);
    for e in &stored[1..] {
        assert_eq!(e["customMetadata"], json!({ "audited": true }));
    }
}

both_backends!(
    before_agent_callback_answers_instead_of_the_agent,
    after_agent_callback_appends_an_event,
    plugin_before_run_ends_the_run_early,
    plugin_on_event_rewrites_streamed_and_stored_events,
);
