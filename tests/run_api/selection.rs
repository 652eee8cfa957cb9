//! Agent selection: the next turn goes to the agent that spoke last, as ADK chooses it.

use super::*;
use crate::both_backends;

/// `relay` (echo) with sub-agents `child` and `other`; `strict` the same with a `child` that
/// disallows transfer back to its parent; `pipeline` a sequence of `first` and `second`.
fn selection_apps() -> Apps {
    let sub_agents = |files: [&str; 2]| {
        let refs: String = files.map(|f| format!("  - config_path: {f}\n")).concat();
        format!("sub_agents:\n{refs}")
    };
    let mut apps = Apps::new();
    for (app, child) in [
        ("relay", ""),
        ("strict", "disallow_transfer_to_parent: true"),
    ] {
        let root = format!("chunks: 0\n{}", sub_agents(["child.yaml", "other.yaml"]));
        apps = apps
            .agent(app, "root_agent.yaml", "EchoAgent", app, &root)
            .agent(
                app,
                "child.yaml",
                "EchoAgent",
                "child",
                &format!("chunks: 0\n{child}"),
            )
            .agent(app, "other.yaml", "EchoAgent", "other", "chunks: 0");
    }
    let steps = sub_agents(["first.yaml", "second.yaml"]);
    apps.agent(
        "pipeline",
        "root_agent.yaml",
        "SequentialAgent",
        "pipeline",
        &steps,
    )
    .agent("pipeline", "first.yaml", "EchoAgent", "first", "chunks: 0")
    .agent(
        "pipeline",
        "second.yaml",
        "EchoAgent",
        "second",
        "chunks: 0",
    )
}

async fn turn_authors(s: &TestServer, app: &str, text: &str) -> Vec<String> {
    authors(&turn(s, app, "s1", text).await)
}

async fn a_transfer_keeps_the_conversation_with_the_agent_that_spoke_last(backend: Backend) {
    let apps = selection_apps();
    let s = apps.serve(backend).await;
    create_session(&s, "relay", "s1").await;
    let first = turn(&s, "relay", "s1", "@child hi").await;
    assert_eq!(authors(&first), ["relay", "child"]);
    assert_eq!(first[0]["actions"]["transferToAgent"], "child");
    assert_eq!(text(&first[1]), "@child hi");
    assert_eq!(turn_authors(&s, "relay", "and now?").await, ["child"]);
    assert_eq!(turn_authors(&s, "relay", "still you?").await, ["child"]);
}

/// Selection reads the newest events: a transfer after a long conversation with the root
/// (more than a page of history) still keeps the next turn at the sub-agent.
async fn selection_looks_at_the_newest_events_of_a_long_session(backend: Backend) {
    let apps = selection_apps();
    let s = apps.serve(backend).await;
    create_session(&s, "relay", "s1").await;
    for i in 0..30 {
        assert_eq!(
            turn_authors(&s, "relay", &format!("turn {i}")).await,
            ["relay"]
        );
    }
    assert_eq!(
        turn_authors(&s, "relay", "@child hi").await,
        ["relay", "child"]
    );
    assert_eq!(turn_authors(&s, "relay", "and now?").await, ["child"]);
}

async fn an_agent_that_disallows_transfer_to_parent_hands_the_next_turn_to_the_root(
    backend: Backend,
) {
    let apps = selection_apps();
    let s = apps.serve(backend).await;
    create_session(&s, "strict", "s1").await;
    assert_eq!(
        turn_authors(&s, "strict", "@child hi").await,
        ["strict", "child"]
    );
    assert_eq!(turn_authors(&s, "strict", "and now?").await, ["strict"]);
}

async fn a_workflow_turn_starts_again_at_the_root(backend: Backend) {
    let apps = selection_apps();
    let s = apps.serve(backend).await;
    create_session(&s, "pipeline", "s1").await;
    for message in ["one", "two"] {
        assert_eq!(
            turn_authors(&s, "pipeline", message).await,
            ["first", "second"]
        );
    }
}

both_backends!(
    selection_looks_at_the_newest_events_of_a_long_session,
    a_transfer_keeps_the_conversation_with_the_agent_that_spoke_last,
    an_agent_that_disallows_transfer_to_parent_hands_the_next_turn_to_the_root,
    a_workflow_turn_starts_again_at_the_root,
);
