//! A cancel accepted before a run's outcome is recorded always ends the run `cancelled`,
//! whatever its agent was doing: the outcome follows the cause, on every path.

use super::*;
use crate::both_backends;
use agentd::agent::Agent;
use agentd::store::CancelRequest;
use tokio::sync::Notify;

/// Streams a partial, waits for `go`, then answers: with `emit_final` (the reply and the
/// outcome in one commit) or `emit` (the reply, then the outcome on its own).
struct FinishesOnSignal {
    go: Arc<Notify>,
    held: bool,
}

#[async_trait]
impl Agent for FinishesOnSignal {
    fn name(&self) -> &str {
        "finisher"
    }

    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        let mut thinking = ctx
            .new_event()
            .with_content(Content::text("model", "thinking"));
        thinking.partial = Some(true);
        ctx.emit(thinking).await?;
        self.go.notified().await;
        let reply = ctx.new_event().with_content(Content::text("model", "done"));
        match self.held {
            true => ctx.emit_final(reply).await,
            false => ctx.emit(reply).await.map(drop),
        }
    }
}

/// The cancel is recorded in the database only (as one accepted by another replica looks
/// before its notification arrives), then the agent returns `Ok`: nothing on this replica
/// knows of the cancel when the run ends. The run ends `cancelled`, sealed, its reply kept;
/// never `completed` with `cancelRequested`.
async fn a_cancel_recorded_first_wins_over_the_runs_own_end(backend: Backend) {
    for held in [true, false] {
        let go = Arc::new(Notify::new());
        let agent = FinishesOnSignal {
            go: go.clone(),
            held,
        };
        let mut apps = AppRegistry::default();
        apps.insert("finish", AgentTree::new(Arc::new(agent)).unwrap());
        // A long lease: no heartbeat picks the cancel up inside the window.
        let s = TestServer::start_embedded_with(backend, apps, PluginSet::default(), |a| {
            a.run_lease_secs = 60
        })
        .await;
        create_session(&s, "finish", "s1").await;
        let mut stream = run(&s, run_body("finish", "s1", "go")).await;
        let run_id = stream.run_id();
        let first = stream.next().await.expect("the partial");
        assert_eq!(first.data["partial"], true, "{first:?}");
        let store = s.server.as_ref().expect("server").state.store.clone();
        let why = CancelRequest {
            by: Some("another replica".into()),
            reason: Some("the test".into()),
        };
        store
            .request_cancel("u1", &run_id, &why)
            .await
            .expect("cancel recorded")
            .expect("a running run");
        go.notify_one();
        let rest = stream.rest().await;
        let done = rest.last().expect("done");
        assert_eq!(done.event, "done", "{rest:#?}");
        assert_eq!(done.data["status"], "cancelled", "held: {held}: {rest:#?}");
        let run_id = run_id.as_str();
        let run = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
        assert_eq!(run["status"], "cancelled", "held: {held}: {run}");
        assert_eq!(run["cancelRequested"], true, "{run}");
        // The reply was committed, then the transcript sealed.
        let events = stored_session(&s, "finish", "s1").await["events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let texts: Vec<&str> = events
            .iter()
            .filter_map(|e| e["content"]["parts"][0]["text"].as_str())
            .collect();
        assert!(texts.contains(&"done"), "{events:#?}");
        assert_eq!(
            events.last().expect("events")["errorCode"],
            "INVOCATION_ABORTED",
            "{events:#?}"
        );
    }
}

/// A cancel that comes after the run ended changes nothing: 409, and the record keeps
/// `completed` without `cancelRequested`.
async fn a_cancel_after_the_end_is_refused(backend: Backend) {
    let apps = Apps::new().echo("echo", "chunks: 1");
    let s = apps.serve(backend).await;
    create_session(&s, "echo", "s1").await;
    let msgs = run_to_end(&s, run_body("echo", "s1", "hi"))
        .await
        .expect("run");
    let run_id = msgs.last().unwrap().data["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let cancel = s
        .post_json(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(cancel.status(), 409);
    let run = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["cancelRequested"], false, "{run}");
}

both_backends!(
    a_cancel_recorded_first_wins_over_the_runs_own_end,
    a_cancel_after_the_end_is_refused,
);
