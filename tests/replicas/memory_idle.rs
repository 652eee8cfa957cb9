//! `memory: idle_seconds:` across replicas (docs/memory.md#when-sessions-are-added): the
//! session a run on replica A made due is extracted by replica B after A was killed with
//! `kill -9` before the pause ended: what is due lives in the database, not in a process.

use super::*;
use crate::common::model_server::{Reply, ScriptedModel};
use crate::common::sse_client::read_all;
use crate::postgres_backends;

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
    let path = format!("/apps/facts/users/{USER}/memory?query=tomatoes");
    let deadline = Instant::now() + PATIENCE;
    let hits = loop {
        let found = json_with_status(b.get(&path).await, 200).await["memories"].clone();
        if found.as_array().is_some_and(|h| !h.is_empty()) {
            break found;
        }
        assert!(Instant::now() < deadline, "B never extracted the session");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(hits[0]["text"], "Grows tomatoes", "{hits:#}");
    assert_eq!(model.requests_for("extractor").len(), 1);
}

postgres_backends!(a_killed_replicas_due_session_is_extracted_by_another);
