//! `memory: idle_seconds:` across replicas (docs/memory.md#when-sessions-are-added): the
//! session a run on replica A made due is extracted by replica B after A was killed with
//! `kill -9` before the pause ended: what is due lives in the database, not in a process.
//! And a replica killed in the middle of a run that is not resumed leaves its session due
//! too: the run's start marked it.

use super::*;
use crate::common::model_server::{Reply, ScriptedModel};
use crate::common::sse_client::read_all;
use crate::postgres_backends;

/// What the user's memory in `app` finds for `query` on `replica`, once it finds something
/// (within the tests' patience).
async fn found_by(replica: &Replica, app: &str, query: &str) -> Value {
    let path = format!("/apps/{app}/users/{USER}/memory?query={query}");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let found = json_with_status(replica.get(&path).await, 200).await["memories"].clone();
        if found.as_array().is_some_and(|h| !h.is_empty()) {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "the session was never added to memory on {path}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn a_killed_replicas_due_session_is_extracted_by_another(backend: Backend) {
    let db = TestDb::new(backend).await;
    let model = ScriptedModel::start().await;
    let settings = format!(
        "memory:\n  mode: extract\n  extraction_model: openai/extractor\n  \
         extraction_options:\n    base_url: {}\n    max_retries: 0\n  idle_seconds: 2\n",
        model.base_url
    );
    let apps = Apps::new().echo("facts", "").settings("facts", &settings);
    let mut a = Replica::spawn(&db, &apps, "a", &[]).await;
    let mut body = run_body("facts", "s1", "I grow tomatoes on my balcony");
    body["createSession"] = json!(true);
    let msgs = read_all(a.post("/run", body).await).await;
    assert_eq!(msgs.last().expect("messages").event, "done", "{msgs:#?}");
    // Killed within the pause: nothing of it ran on A.
    a.child.start_kill().expect("kill -9");
    a.child.wait().await.expect("reaped");
    assert!(model.requests_for("extractor").is_empty());
    model.push(
        "extractor",
        Reply::text(&[
            &json!({"memories": [{"action": "add", "text": "Grows tomatoes"}]}).to_string(),
        ]),
    );
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    let hits = found_by(&b, "facts", "tomatoes").await;
    assert_eq!(hits[0]["text"], "Grows tomatoes", "{hits:#}");
    assert_eq!(model.requests_for("extractor").len(), 1);
}

/// A `resume: never` run on A, killed mid-run: its end never ran on A (B seals the run), yet
/// B adds the session to memory once it has paused, from the mark of the run's start.
async fn a_session_whose_run_died_is_added_after_its_pause(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new()
        .echo(
            "notes",
            "chunks: 200\nchunk_delay_ms: 100\ncall_tool: lookup",
        )
        .settings("notes", "resume: never\nmemory:\n  idle_seconds: 2\n");
    let lease = ["--run-lease-secs", "2"];
    let mut a = Replica::spawn(&db, &apps, "a", &lease).await;
    a.create_session("notes", "s1").await;
    let mut on_a = Sse::open(
        a.post(
            "/run",
            run_body("notes", "s1", "I grow tomatoes on my balcony"),
        )
        .await,
    )
    .await;
    let run_id = on_a.run_id();
    on_a.next_matching(Msg::is_committed).await;
    a.child.start_kill().expect("kill -9");
    a.child.wait().await.expect("reaped");

    let b = Replica::spawn(&db, &apps, "b", &lease).await;
    let hits = found_by(&b, "notes", "tomatoes").await;
    assert!(
        hits[0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("tomatoes"),
        "{hits:#}"
    );
    // The run never ended on A: B sealed it.
    let record = json_with_status(b.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(record["status"], "abandoned", "{record}");
}

postgres_backends!(
    a_killed_replicas_due_session_is_extracted_by_another,
    a_session_whose_run_died_is_added_after_its_pause,
);
