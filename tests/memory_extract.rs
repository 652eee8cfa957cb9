//! Memory extraction (`memory: {mode: extract}`, docs/memory.md#extraction) on every backend,
//! over real HTTP, with the scripted OpenAI-compatible server as the extraction model: facts
//! the model names are added, updated (the earlier text kept as a revision, shown by
//! `GET …/memory/{id}`) and deleted as it says; the model is shown only the user's own
//! memories, and an id it invents changes nothing; a failed extraction stores nothing and the
//! next add repeats it; two adds of the same events apply once; pruning a session forgets
//! what memory took from it, revisions included; `--memory-auto-ingest` extracts after a run.

mod common;

use common::model_server::{Reply, ScriptedModel};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const APP: &str = "facts";
const EXTRACTOR: &str = "extractor-1";

/// An apps directory with app `facts` (an echo agent) that extracts its memories with the
/// scripted server's `extractor-1`, `agent`'s further lines in its root agent, and `memory`'s
/// further lines in its `memory:` block (each starting with two spaces).
fn apps_dir_with(dir: &Path, model: &ScriptedModel, agent: &str, memory: &str) {
    let app = dir.join(APP);
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("root_agent.yaml"),
        format!("agent_class: EchoAgent\nname: facts\n{agent}"),
    )
    .unwrap();
    std::fs::write(
        app.join("agentd.yaml"),
        format!(
            "memory:\n  mode: extract\n  extraction_model: openai/{EXTRACTOR}\n  \
             extraction_options:\n    base_url: {}\n    max_retries: 0\n{memory}",
            model.base_url
        ),
    )
    .unwrap();
}

struct Setup {
    s: TestServer,
    model: ScriptedModel,
    _dir: tempfile::TempDir,
}

async fn serve(backend: Backend, auto_ingest: bool) -> Setup {
    serve_with(backend, auto_ingest, "", "").await
}

async fn serve_with(backend: Backend, auto_ingest: bool, agent: &str, memory: &str) -> Setup {
    let model = ScriptedModel::start().await;
    let dir = tempfile::tempdir().unwrap();
    apps_dir_with(dir.path(), &model, agent, memory);
    let path = dir.path().to_path_buf();
    let s = TestServer::start_on(TestDb::new(backend).await, move |a| {
        a.apps_dir = path;
        a.memory_auto_ingest = auto_ingest;
    })
    .await;
    Setup {
        s,
        model,
        _dir: dir,
    }
}

async fn say(s: &TestServer, user: &str, session: &str, text: &str) {
    let msgs = s
        .run_stream(json!({
            "appName": APP, "userId": user, "sessionId": session, "createSession": true,
            "newMessage": {"role": "user", "parts": [{"text": text}]},
        }))
        .await;
    let done = msgs.last().expect("a done event");
    assert_eq!(done.event, "done", "{msgs:?}");
    assert_eq!(done.data["status"], "completed", "{msgs:?}");
}

async fn add(s: &TestServer, user: &str, session: &str) -> reqwest::Response {
    s.patch_json(
        &format!("/apps/{APP}/users/{user}/memory"),
        json!({ "sessionId": session }),
    )
    .await
}

async fn search(s: &TestServer, user: &str, query: &str) -> Vec<Value> {
    let q: String = form_urlencoded::byte_serialize(query.as_bytes()).collect();
    let resp = s
        .get(&format!(
            "/apps/{APP}/users/{user}/memory?query={q}&limit=20"
        ))
        .await;
    json_with_status(resp, 200).await["memories"]
        .as_array()
        .expect("memories")
        .clone()
}

/// The extraction model's answer.
fn answer(ops: Value) -> Reply {
    Reply::text(&[&json!({ "memories": ops }).to_string()])
}

/// What the extraction model was sent in request `i`: the memories it was shown and the
/// conversation.
/// What `user`'s memory finds for `query` once the idle sweep added the session (15 s at
/// most): exactly one memory.
async fn after_the_pause(s: &TestServer, user: &str, query: &str) -> Vec<Value> {
    let mut hits = vec![];
    for _ in 0..300 {
        hits = search(s, user, query).await;
        if !hits.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hits.len(), 1, "nothing added after the pause: {hits:#?}");
    hits
}

fn sent(model: &ScriptedModel, i: usize) -> Value {
    let requests = model.requests_for(EXTRACTOR);
    let r = &requests[i];
    let user = r["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .expect("a user message");
    serde_json::from_str(user["content"].as_str().expect("text content")).expect("JSON")
}

fn id_with_text(hits: &[Value], text: &str) -> String {
    hits.iter()
        .find(|h| h["text"] == text)
        .unwrap_or_else(|| panic!("no memory {text:?} in {hits:#?}"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn facts_are_added_updated_and_deleted_as_the_model_says(backend: Backend) {
    let Setup { s, model, .. } = serve(backend, false).await;
    // Bob's memory shares words with alice's conversation; the model must never see it.
    let resp = s
        .post_json(
            &format!("/apps/{APP}/users/bob/memory"),
            json!({"text": "Bob lives in Lisbon and his favourite colour is blue"}),
        )
        .await;
    let bobs = json_with_status(resp, 201).await["id"]
        .as_str()
        .unwrap()
        .to_string();

    say(
        &s,
        "alice",
        "s1",
        "My favourite colour is blue, and I live in Lisbon",
    )
    .await;
    model.push(
        EXTRACTOR,
        answer(json!([
            {"action": "add", "text": "Her favourite colour is blue"},
            {"action": "add", "text": "She lives in Lisbon"},
        ])),
    );
    assert_eq!(
        json_with_status(add(&s, "alice", "s1").await, 200).await,
        Value::Null
    );
    let first = sent(&model, 0);
    assert_eq!(first["memories"], json!([]), "{first}");
    let conversation = first["conversation"].as_array().unwrap();
    assert_eq!(conversation[0]["author"], "user");
    assert_eq!(
        conversation[0]["text"],
        "My favourite colour is blue, and I live in Lisbon"
    );
    let instruction = &model.requests_for(EXTRACTOR)[0]["messages"][0];
    assert_eq!(instruction["role"], "system");
    assert!(
        instruction["content"]
            .as_str()
            .unwrap()
            .contains("\"action\""),
        "{instruction}"
    );

    // Only the facts are remembered, not the events they came from.
    let hits = search(&s, "alice", "favourite colour Lisbon").await;
    assert_eq!(hits.len(), 2, "{hits:#?}");
    assert!(hits
        .iter()
        .all(|h| h["author"] == "memory" && h["sessionId"] == "s1"));
    let colour = id_with_text(&hits, "Her favourite colour is blue");
    let city = id_with_text(&hits, "She lives in Lisbon");

    // The call's tokens are the user's: in their usage report by model (the scripted usage
    // chunk says 10 in, 5 out).
    let usage = s
        .get(&format!("/apps/{APP}/users/alice/usage?groupBy=model"))
        .await;
    let usage = json_with_status(usage, 200).await;
    let row = usage["usage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == EXTRACTOR)
        .unwrap_or_else(|| panic!("no extraction usage: {usage}"))
        .clone();
    assert_eq!(
        (row["inputTokens"].as_u64(), row["outputTokens"].as_u64()),
        (Some(10), Some(5)),
        "{row}"
    );
    assert_eq!(row["modelCalls"], 1, "{row}");

    // Adding again with nothing new asks nothing.
    assert_eq!(
        json_with_status(add(&s, "alice", "s1").await, 200).await,
        Value::Null
    );
    assert_eq!(model.requests_for(EXTRACTOR).len(), 1);

    // A new conversation updates one fact, contradicts another, and adds one; the answer also
    // names bob's memory and an invented id, which change nothing.
    say(
        &s,
        "alice",
        "s2",
        "I no longer live in Lisbon: I moved to Porto. And blue is not my favourite colour now.",
    )
    .await;
    model.push(
        EXTRACTOR,
        answer(json!([
            {"action": "update", "id": city, "text": "She lives in Porto"},
            {"action": "delete", "id": colour},
            {"action": "delete", "id": bobs},
            {"action": "update", "id": "mem-invented", "text": "Invented"},
            {"action": "add", "text": "She moved house recently"},
        ])),
    );
    assert_eq!(
        json_with_status(add(&s, "alice", "s2").await, 200).await,
        Value::Null
    );
    let second = sent(&model, 1);
    let shown: Vec<&str> = second["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(
        shown.contains(&city.as_str()) && shown.contains(&colour.as_str()),
        "{second}"
    );
    assert!(
        !shown.contains(&bobs.as_str()),
        "bob's memory was shown: {second}"
    );

    let one = json_with_status(
        s.get(&format!("/apps/{APP}/users/alice/memory/{city}"))
            .await,
        200,
    )
    .await;
    assert_eq!(one["text"], "She lives in Porto");
    assert_eq!(one["sessionId"], "s2");
    let revisions = one["revisions"].as_array().unwrap();
    assert_eq!(revisions.len(), 1, "{one}");
    assert_eq!(revisions[0]["revision"], 1);
    assert_eq!(revisions[0]["text"], "She lives in Lisbon");
    assert_eq!(revisions[0]["sessionId"], "s1");
    assert!(
        revisions[0]["replacedAt"].as_f64().unwrap() >= revisions[0]["timestamp"].as_f64().unwrap()
    );
    let gone = s
        .get(&format!("/apps/{APP}/users/alice/memory/{colour}"))
        .await;
    assert_eq!(
        json_with_status(gone, 404).await["code"],
        "memory_not_found"
    );
    let hits = search(&s, "alice", "Porto moved house Invented").await;
    let texts: Vec<&str> = hits.iter().map(|h| h["text"].as_str().unwrap()).collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts.contains(&"She lives in Porto") && texts.contains(&"She moved house recently"));
    // Bob's memory is untouched.
    let his = s.get(&format!("/apps/{APP}/users/bob/memory/{bobs}")).await;
    assert_eq!(
        json_with_status(his, 200).await["text"],
        "Bob lives in Lisbon and his favourite colour is blue"
    );

    // Forgetting a memory forgets its revisions too.
    let path = format!("/apps/{APP}/users/alice/memory/{city}");
    assert_eq!(s.delete(&path).await.status(), 204);
    let store = s.db.store().await;
    assert!(store
        .memory_revisions(APP, "alice", &city)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .get_memory(APP, "alice", &city)
        .await
        .unwrap()
        .is_none());
    assert_eq!(model.unused(), 0);
}

async fn a_failed_extraction_stores_nothing_and_the_next_add_repeats_it(backend: Backend) {
    let Setup { s, model, .. } = serve(backend, false).await;
    say(&s, "alice", "s1", "I have a cat called Miso").await;
    let before = s.db.snapshot().await;
    for bad in [
        Reply::text(&["I could not find any facts."]),
        Reply::text(&["{\"memories\": \"none\"}"]),
        Reply::status(500, "the model is down"),
    ] {
        model.push(EXTRACTOR, bad);
        let resp = add(&s, "alice", "s1").await;
        let body = json_with_status(resp, 502).await;
        assert_eq!(body["code"], "memory_extraction_failed", "{body}");
        assert!(!body.to_string().contains("127.0.0.1"), "{body}");
        // Only the call's tokens are kept (the user's usage): they were spent.
        let mut after = s.db.snapshot().await;
        let mut expected = before.clone();
        after.remove("usage_daily");
        expected.remove("usage_daily");
        assert_eq!(after, expected, "a failed extraction stored something");
    }
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "add", "text": "She has a cat called Miso"}])),
    );
    assert_eq!(
        json_with_status(add(&s, "alice", "s1").await, 200).await,
        Value::Null
    );
    // The repeated call read the same conversation.
    assert_eq!(
        sent(&model, 3)["conversation"],
        sent(&model, 0)["conversation"]
    );
    let hits = search(&s, "alice", "cat").await;
    assert_eq!(hits.len(), 1, "{hits:#?}");
    assert_eq!(hits[0]["text"], "She has a cat called Miso");
    // An unknown session is 404, as in raw mode.
    let resp = add(&s, "alice", "nope").await;
    assert_eq!(
        json_with_status(resp, 404).await["code"],
        "session_not_found"
    );
}

/// An extraction's calls are the user's spending, so a spent budget stops the next one
/// before its call: 429 `budget_exhausted` with `Retry-After`, no call, nothing stored; the
/// events wait at the mark and the next add, once the budget allows, sends them.
async fn a_spent_budget_stops_an_extraction_before_its_call(backend: Backend) {
    let Setup { s, model, .. } = serve(backend, false).await;
    say(&s, "alice", "s1", "I have a cat called Miso").await;
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "add", "text": "She has a cat called Miso"}])),
    );
    json_with_status(add(&s, "alice", "s1").await, 200).await;
    say(&s, "alice", "s1", "I also have a dog called Rex").await;
    // That call spent 15 tokens of a budget of 10 a day.
    let budget = format!("/apps/{APP}/users/alice/budget");
    let put = s
        .client
        .put(s.url(&budget))
        .json(&json!({"tokensPerDay": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let before = s.db.snapshot().await;
    let resp = add(&s, "alice", "s1").await;
    assert!(
        resp.headers().get("retry-after").is_some(),
        "{:?}",
        resp.headers()
    );
    let body = json_with_status(resp, 429).await;
    assert_eq!(body["code"], "budget_exhausted", "{body}");
    assert_eq!(
        model.requests_for(EXTRACTOR).len(),
        1,
        "a call was made past the budget"
    );
    assert_eq!(
        s.db.snapshot().await,
        before,
        "a refused extraction stored something"
    );
    // Bob's budget is his own.
    say(&s, "bob", "s2", "I live in Porto").await;
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "add", "text": "He lives in Porto"}])),
    );
    json_with_status(add(&s, "bob", "s2").await, 200).await;

    assert_eq!(s.delete(&budget).await.status(), 204);
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "add", "text": "She has a dog called Rex"}])),
    );
    json_with_status(add(&s, "alice", "s1").await, 200).await;
    let conversation = sent(&model, 2)["conversation"].to_string();
    assert!(conversation.contains("a dog called Rex"), "{conversation}");
    assert!(!conversation.contains("Miso"), "{conversation}");
    assert_eq!(search(&s, "alice", "dog").await.len(), 1);
}

async fn two_adds_of_the_same_events_apply_once(backend: Backend) {
    let Setup { s, model, .. } = serve(backend, false).await;
    say(&s, "alice", "s1", "I play the cello").await;
    // Both calls are made (each answer streams for about a second), then one applies and the
    // other, finding the mark moved, drops its changes.
    for _ in 0..2 {
        let Reply::Stream(chunks) =
            answer(json!([{"action": "add", "text": "She plays the cello"}]))
        else {
            unreachable!()
        };
        model.push(EXTRACTOR, Reply::Slow(chunks, Duration::from_millis(250)));
    }
    let (a, b) = tokio::join!(add(&s, "alice", "s1"), add(&s, "alice", "s1"));
    assert_eq!(a.status(), 200);
    assert_eq!(b.status(), 200);
    assert_eq!(
        model.requests_for(EXTRACTOR).len(),
        2,
        "the two adds did not overlap"
    );
    let hits = search(&s, "alice", "cello").await;
    assert_eq!(hits.len(), 1, "applied twice: {hits:#?}");
}

async fn pruning_a_session_forgets_what_memory_took_from_it(backend: Backend) {
    let Setup { s, model, .. } = serve(backend, false).await;
    say(&s, "alice", "s1", "I live in Lisbon").await;
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "add", "text": "She lives in Lisbon"}])),
    );
    json_with_status(add(&s, "alice", "s1").await, 200).await;
    let id = id_with_text(&search(&s, "alice", "Lisbon").await, "She lives in Lisbon");
    say(&s, "alice", "s2", "I moved from Lisbon to Porto").await;
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "update", "id": id, "text": "She lives in Porto"}])),
    );
    json_with_status(add(&s, "alice", "s2").await, 200).await;
    let store = s.db.store().await;
    assert_eq!(
        store
            .memory_revisions(APP, "alice", &id)
            .await
            .unwrap()
            .len(),
        1
    );
    // s2 goes idle; s1 is used again, so a prune of idle sessions takes s2 alone.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let idle_before = agentd::event::now_ts();
    tokio::time::sleep(Duration::from_millis(50)).await;
    say(&s, "alice", "s1", "thanks").await;
    let report = store
        .prune(&agentd::store::PruneRequest {
            sessions_before: idle_before,
            runs_before: idle_before,
            app: Some(APP.into()),
            batch: 100,
            dry_run: false,
        })
        .await
        .unwrap();
    assert_eq!(report.sessions, 1, "{report:?}");
    // The memory s2 last wrote is gone, and so is its earlier text, though that came from s1.
    assert!(store.get_memory(APP, "alice", &id).await.unwrap().is_none());
    assert!(
        store
            .memory_revisions(APP, "alice", &id)
            .await
            .unwrap()
            .is_empty(),
        "a pruned memory's revisions were left behind"
    );
}

async fn auto_ingest_extracts_after_each_run(backend: Backend) {
    let Setup { s, model, .. } = serve(backend, true).await;
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "add", "text": "She speaks Portuguese"}])),
    );
    say(&s, "alice", "s1", "Eu falo português; I speak Portuguese").await;
    // The extraction runs after the run's end, in the background.
    let mut hits = vec![];
    for _ in 0..200 {
        hits = search(&s, "alice", "Portuguese").await;
        if !hits.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hits.len(), 1, "{hits:#?}");
    assert_eq!(hits[0]["text"], "She speaks Portuguese");
    assert_eq!(hits[0]["author"], "memory");
    assert_eq!(model.requests_for(EXTRACTOR).len(), 1);
}

/// With `memory: idle_seconds:` a session is added once it has paused: two quick runs make
/// no extraction, then one call covers both, and the session is no longer due.
async fn a_paused_session_is_extracted_once(backend: Backend) {
    let Setup { s, model, .. } = serve_with(backend, false, "", "  idle_seconds: 2\n").await;
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "add", "text": "She speaks Portuguese and Spanish"}])),
    );
    say(&s, "alice", "s1", "I speak Portuguese").await;
    say(&s, "alice", "s1", "and Spanish too").await;
    let store = s.db.store().await;
    let due = store.due_memories(f64::MAX, 10).await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!(due[0].key.session_id, "s1");
    assert!(
        model.requests_for(EXTRACTOR).is_empty(),
        "extracted before the pause"
    );
    let hits = after_the_pause(&s, "alice", "Portuguese").await;
    assert_eq!(hits[0]["text"], "She speaks Portuguese and Spanish");
    let calls = model.requests_for(EXTRACTOR);
    assert_eq!(calls.len(), 1);
    let conversation = sent(&model, 0)["conversation"].to_string();
    assert!(
        conversation.contains("I speak Portuguese") && conversation.contains("and Spanish too"),
        "{conversation}"
    );
    for _ in 0..100 {
        if store.due_memories(f64::MAX, 10).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.due_memories(f64::MAX, 10).await.unwrap().is_empty());
    // A setting out of range is refused with the reason.
    use agentd::apps::settings::MemorySettings;
    for bad in ["idle_seconds: 0", "idle_seconds: 604801"] {
        let m: MemorySettings = serde_yaml_ng::from_str(bad).unwrap();
        assert!(
            m.build().err().unwrap_or_default().contains("idle_seconds"),
            "{bad}"
        );
    }
}

both_backends!(
    a_paused_session_is_extracted_once,
    a_run_longer_than_its_pause_is_extracted_after_it,
    facts_are_added_updated_and_deleted_as_the_model_says,
    a_failed_extraction_stores_nothing_and_the_next_add_repeats_it,
    a_spent_budget_stops_an_extraction_before_its_call,
    two_adds_of_the_same_events_apply_once,
    pruning_a_session_forgets_what_memory_took_from_it,
    auto_ingest_extracts_after_each_run,
);

/// A run longer than the pause is not extracted while it goes on: its start marked the
/// session due, and the sweep, seeing the run, waits for the pause after it. One extraction,
/// after the run's end, reads the whole turn.
async fn a_run_longer_than_its_pause_is_extracted_after_it(backend: Backend) {
    // Eleven chunks (a character each), 300 ms apart: a run of over 3 s.
    let agent = "chunks: 30\nchunk_delay_ms: 300\n";
    let Setup { s, model, .. } = serve_with(backend, false, agent, "  idle_seconds: 1\n").await;
    model.push(
        EXTRACTOR,
        answer(json!([{"action": "add", "text": "She keeps bees"}])),
    );
    eprintln!("SAY {}", agentd::event::now_ts());
    say(&s, "alice", "s1", "I keep bees").await;
    eprintln!("SAID {}", agentd::event::now_ts());
    let hits = after_the_pause(&s, "alice", "bees").await;
    assert_eq!(hits[0]["text"], "She keeps bees");
    assert_eq!(
        model.requests_for(EXTRACTOR).len(),
        1,
        "extracted during the run"
    );
    let conversation = &sent(&model, 0)["conversation"];
    let authors: Vec<&str> = conversation
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["author"].as_str().unwrap())
        .collect();
    assert_eq!(authors, ["user", "facts"], "{conversation}");
}

/// A `memory:` block that cannot work fails the app's load with the reason.
#[test]
fn bad_memory_blocks_are_refused() {
    use agentd::apps::settings::MemorySettings;
    for (yaml, why) in [
        ("mode: extract", "needs extraction_model"),
        ("extraction_model: openai/x", "needs mode: extract"),
        ("embedding_model: openai/e", "needs dimensions"),
        ("dimensions: 8", "needs embedding_model"),
        ("ttl_days: 0", "ttl_days"),
        ("ttl_days: -1", "ttl_days"),
    ] {
        let m: MemorySettings = serde_yaml_ng::from_str(yaml).unwrap();
        let err = m
            .build()
            .err()
            .unwrap_or_else(|| panic!("{yaml} was accepted"));
        assert!(err.contains(why), "{yaml}: {err}");
    }
    let ok: MemorySettings =
        serde_yaml_ng::from_str("mode: extract\nextraction_model: openai/x\nttl_days: 1.5")
            .unwrap();
    let built = ok.build().unwrap();
    assert!(built.extraction.is_some() && built.embedder.is_none());
    assert_eq!(built.ttl, Some(std::time::Duration::from_secs(129_600)));
}
