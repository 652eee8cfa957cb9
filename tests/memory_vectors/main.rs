//! Memory by meaning (docs/memory.md) on every backend: an app's `memory:` embedding model
//! (here the scripted OpenAI-compatible server's `/v1/embeddings`, whose vectors are exact,
//! see `ScriptedModel::concepts`), memories embedded in the background, hybrid search over
//! real HTTP, one memory read and deleted by id, facts added directly, one user's memories
//! never in another's results, an embedding outage that leaves search by words, a change of
//! embedding model, and leases that a dead embedder's claims outlive.

#[path = "../common/mod.rs"]
mod common;

mod large_users;

use agentd::store::memory::vectors::{PendingMemory, VectorSpace, VectorSupport};
use agentd::store::Store;
use common::model_server::ScriptedModel;
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const APP: &str = "recall";

/// Words that mean the same thing to the scripted embedding model.
const CONCEPTS: &[&[&str]] = &[
    &["colour", "color", "hue", "blue", "red", "green"],
    &["pet", "dog", "cat", "puppy"],
    &["city", "live", "lisbon", "paris", "town"],
    &["food", "eat", "pizza", "sushi", "dinner"],
];

/// An apps directory with app `recall` (an echo agent) whose `agentd.yaml` names the
/// scripted server's embedding model.
fn apps_dir(dir: &Path, model: &ScriptedModel, embedding_model: &str) {
    let app = dir.join(APP);
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("root_agent.yaml"),
        "agent_class: EchoAgent\nname: recall\n",
    )
    .unwrap();
    std::fs::write(
        app.join("agentd.yaml"),
        format!(
            "memory:\n  embedding_model: openai/{embedding_model}\n  dimensions: 8\n  \
             embedding_options:\n    base_url: {}\n    max_retries: 1\n    retry_backoff_ms: 5\n",
            model.base_url
        ),
    )
    .unwrap();
}

async fn serve(
    db: TestDb,
    model: &ScriptedModel,
    embedding_model: &str,
) -> (TestServer, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    apps_dir(dir.path(), model, embedding_model);
    let path = dir.path().to_path_buf();
    let server = TestServer::start_on(db, move |a| a.apps_dir = path).await;
    (server, dir)
}

/// A temporary directory removed on drop.
mod tempdir {
    pub struct Dir(std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir().join(format!("agentd-mem-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

async fn add_fact(s: &TestServer, user: &str, text: &str) -> String {
    let resp = s
        .post_json(
            &format!("/apps/{APP}/users/{user}/memory"),
            json!({ "text": text }),
        )
        .await;
    let body = json_with_status(resp, 201).await;
    assert_eq!(body["text"], text);
    assert_eq!(body["author"], "user");
    body["id"].as_str().expect("an id").to_string()
}

async fn search(s: &TestServer, user: &str, query: &str) -> Vec<Value> {
    let q: String = form_urlencoded::byte_serialize(query.as_bytes()).collect();
    let resp = s
        .get(&format!(
            "/apps/{APP}/users/{user}/memory?query={q}&limit=5"
        ))
        .await;
    let body = json_with_status(resp, 200).await;
    body["memories"].as_array().expect("memories").clone()
}

/// Waits until no memory of the app waits for a vector.
async fn embedded(store: &dyn Store) {
    embedded_within(store, 10).await
}

/// Waits up to `secs` seconds until no memory of the app waits for a vector.
async fn embedded_within(store: &dyn Store, secs: u64) {
    for _ in 0..secs * 20 {
        if store.pending_count(APP).await.expect("pending") == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "memories still wait for vectors after {secs} s: {}",
        store.pending_count(APP).await.unwrap()
    );
}

async fn meaning_finds_what_words_miss(backend: Backend) {
    let model = ScriptedModel::start().await;
    model.concepts(CONCEPTS);
    let (s, _dir) = serve(TestDb::new(backend).await, &model, "emb-1").await;
    let store = s.db.store().await;
    if let VectorSupport::Missing(why) = store.vector_support() {
        panic!("memory vectors are missing ({why}): as root, run scripts/pgvector.sh install");
    }
    let ready = json_with_status(s.get("/ready").await, 200).await;
    assert_eq!(ready["memorySearch"], "hybrid", "{ready}");

    let colour = add_fact(&s, "alice", "My favourite colour is blue").await;
    let dog = add_fact(&s, "alice", "I have a dog named Rex").await;
    let city = add_fact(&s, "alice", "I moved to Lisbon last year").await;
    let bob_red = add_fact(&s, "bob", "Bob's favourite hue is red").await;
    embedded(store.as_ref()).await;

    // No word of the question is in the fact; its meaning is.
    let hits = search(&s, "alice", "Which hue do I like?").await;
    assert_eq!(hits[0]["id"], colour, "{hits:#?}");
    assert_eq!(hits[0]["vectorRank"], 1);
    assert!(hits[0].get("textRank").is_none(), "{hits:#?}");
    assert!(hits[0]["similarity"].as_f64().unwrap() > 0.9);
    // Found by both beats found by one: "dog" is a word of the fact and near in meaning.
    let hits = search(&s, "alice", "tell me about my dog").await;
    assert_eq!(hits[0]["id"], dog);
    assert_eq!(hits[0]["textRank"], 1);
    assert_eq!(hits[0]["vectorRank"], 1);
    let hits = search(&s, "alice", "which town?").await;
    assert_eq!(hits[0]["id"], city);

    // Another user's memories never reach alice's results, whatever she asks: Bob's own
    // words, his id, his exact text.
    for q in [
        "hue red Bob",
        "Bob's favourite hue is red",
        bob_red.as_str(),
        "*",
        "colour OR 1=1",
    ] {
        for hit in search(&s, "alice", q).await {
            assert_ne!(
                hit["id"], bob_red,
                "query {q:?} found bob's memory for alice"
            );
            assert!(
                [&colour, &dog, &city].contains(&&hit["id"].as_str().unwrap().to_string()),
                "{hit}"
            );
        }
    }
    let bobs = search(&s, "bob", "which colour").await;
    assert_eq!(bobs.len(), 1);
    assert_eq!(bobs[0]["id"], bob_red);
    // Nor another app's: the same user in another app has no memories.
    let other = s.get("/apps/echo/users/alice/memory?query=colour").await;
    assert_eq!(json_with_status(other, 200).await["memories"], json!([]));

    // One memory by id, then forgotten.
    let path = format!("/apps/{APP}/users/alice/memory/{colour}");
    let one = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(one["text"], "My favourite colour is blue");
    assert_eq!(one["id"], colour);
    // Bob cannot read alice's memory by its id.
    let theirs = s
        .get(&format!("/apps/{APP}/users/bob/memory/{colour}"))
        .await;
    assert_eq!(
        json_with_status(theirs, 404).await["code"],
        "memory_not_found"
    );
    assert_eq!(s.delete(&path).await.status(), 204);
    assert_eq!(
        json_with_status(s.get(&path).await, 404).await["code"],
        "memory_not_found"
    );
    assert_eq!(
        json_with_status(s.delete(&path).await, 404).await["code"],
        "memory_not_found"
    );
    let hits = search(&s, "alice", "Which hue do I like?").await;
    assert!(hits.iter().all(|h| h["id"] != colour), "{hits:#?}");

    // Everything alice's memory holds, forgotten; bob's stays.
    let resp = s.delete(&format!("/apps/{APP}/users/alice/memory")).await;
    assert_eq!(json_with_status(resp, 200).await["deleted"], 2);
    assert!(search(&s, "alice", "dog town").await.is_empty());
    assert_eq!(search(&s, "bob", "hue").await.len(), 1);
}

async fn sessions_are_embedded_too_and_bad_facts_change_nothing(backend: Backend) {
    let model = ScriptedModel::start().await;
    model.concepts(CONCEPTS);
    let (s, _dir) = serve(TestDb::new(backend).await, &model, "emb-1").await;
    let store = s.db.store().await;
    // A conversation, added to memory with ADK's PATCH.
    let run = s
        .run_stream(json!({
            "appName": APP, "userId": "carol", "sessionId": "s1", "createSession": true,
            "newMessage": {"role": "user", "parts": [{"text": "For dinner I want sushi"}]},
        }))
        .await;
    assert!(!run.is_empty());
    let resp = s
        .patch_json(
            &format!("/apps/{APP}/users/carol/memory"),
            json!({"sessionId": "s1"}),
        )
        .await;
    json_with_status(resp, 200).await;
    embedded(store.as_ref()).await;
    let hits = search(&s, "carol", "what food?").await;
    assert!(!hits.is_empty());
    assert_eq!(hits[0]["sessionId"], "s1");
    assert_eq!(hits[0]["vectorRank"], 1);

    let before = s.db.snapshot().await;
    let base = format!("/apps/{APP}/users/carol/memory");
    for (body, status, code) in [
        (json!({"text": "   "}), 422, "validation_error"),
        (
            json!({"text": "x".repeat(64 * 1024 + 1)}),
            422,
            "validation_error",
        ),
        (json!({"text": "ok", "author": ""}), 422, "validation_error"),
        (json!({"text": 5}), 422, "validation_error"),
        (
            json!({"text": "ok", "colour": "blue"}),
            422,
            "validation_error",
        ),
    ] {
        let resp = s.post_json(&base, body.clone()).await;
        let err = json_with_status(resp, status).await;
        assert_eq!(err["code"], code, "{body}: {err}");
    }
    let resp = s
        .post_json(
            "/apps/no_such_app/users/carol/memory",
            json!({"text": "hi"}),
        )
        .await;
    assert_eq!(json_with_status(resp, 404).await["code"], "app_not_found");
    assert_eq!(
        s.db.snapshot().await,
        before,
        "a refused fact changed stored data"
    );
}

async fn an_embedding_outage_leaves_search_by_words(backend: Backend) {
    let model = ScriptedModel::start().await;
    model.concepts(CONCEPTS);
    // Every call fails for a while (each is retried once): the memory waits for its vector.
    model.fail_embeddings(1000);
    let (s, _dir) = serve(TestDb::new(backend).await, &model, "emb-1").await;
    let store = s.db.store().await;
    let pizza = add_fact(&s, "dave", "Pizza is my favourite").await;
    // Search still answers, by words: the query's embedding fails too.
    let hits = search(&s, "dave", "pizza").await;
    assert_eq!(hits[0]["id"], pizza);
    assert_eq!(hits[0]["textRank"], 1);
    assert!(hits[0].get("vectorRank").is_none());
    assert!(store.pending_count(APP).await.unwrap() >= 1);
    // The embedder's own call fails too (it claimed the memory and was refused).
    let mut waited = 0;
    while !model
        .embedding_requests()
        .iter()
        .any(|r| r.to_string().contains("Pizza is my favourite"))
    {
        assert!(waited < 400, "the embedder never tried the memory");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    // The provider recovers: the embedder's backoff (doubling from 1 s while it failed) ends
    // and the vector arrives, well before the failed call's claim would have run out.
    model.fail_embeddings(0);
    embedded_within(store.as_ref(), 60).await;
    let hits = search(&s, "dave", "what do I eat").await;
    assert_eq!(hits[0]["id"], pizza);
    assert_eq!(hits[0]["vectorRank"], 1);
    assert!(model.embedding_requests().len() >= 3);

    // A text the model refuses holds back no other memory: it is put off, the rest embedded.
    let refused = add_fact(&s, "dave", "UNEMBEDDABLE pizza").await;
    let sushi = add_fact(&s, "dave", "Sushi on Fridays").await;
    let mut waited = 0;
    while store.pending_count(APP).await.unwrap() > 1 {
        assert!(waited < 200, "the other memory never got its vector");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    let hits = search(&s, "dave", "dinner").await;
    assert!(
        hits.iter()
            .any(|h| h["id"] == sushi && h.get("vectorRank").is_some()),
        "{hits:#?}"
    );
    // Still found by its words.
    let hits = search(&s, "dave", "unembeddable").await;
    let found = hits
        .iter()
        .find(|h| h["id"] == refused)
        .expect("found by words");
    assert_eq!(found["textRank"], 1);
    assert!(found.get("vectorRank").is_none());
}

/// Memory's embedding calls are the user's spending (docs/memory.md#bounds), so once the
/// user's budget is spent none is made for them: a search ranks by words without embedding
/// the query, and a new memory is put off, not embedded, while another user's are.
async fn a_spent_budget_stops_memorys_embedding_calls(backend: Backend) {
    let model = ScriptedModel::start().await;
    model.concepts(CONCEPTS);
    let (s, _dir) = serve(TestDb::new(backend).await, &model, "emb-1").await;
    let store = s.db.store().await;
    let colour = add_fact(&s, "alice", "My favourite colour is blue").await;
    add_fact(&s, "bob", "Bob's favourite hue is red").await;
    embedded(store.as_ref()).await;
    // Alice's fact took 5 tokens (a token a word) of a budget of 1 a day.
    let budget = format!("/apps/{APP}/users/alice/budget");
    let put = s
        .client
        .put(s.url(&budget))
        .json(&json!({"tokensPerDay": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);

    let calls = model.embedding_requests().len();
    let hits = search(&s, "alice", "my colour").await;
    assert_eq!(hits[0]["id"], colour, "{hits:#?}");
    assert_eq!(hits[0]["textRank"], 1);
    assert!(hits[0].get("vectorRank").is_none(), "{hits:#?}");
    assert_eq!(
        model.embedding_requests().len(),
        calls,
        "a query was embedded past the budget"
    );
    // Bob's budget is his own: his query is embedded.
    let bobs = search(&s, "bob", "which colour").await;
    assert_eq!(bobs[0]["vectorRank"], 1, "{bobs:#?}");
    assert_eq!(model.embedding_requests().len(), calls + 1);

    // Alice's new memory waits (found by words); bob's, added after it, is embedded. The
    // embedder claims every pending memory of the app at once, so by the time bob's has its
    // vector, alice's was claimed and put off.
    let dog = add_fact(&s, "alice", "I have a dog named Rex").await;
    add_fact(&s, "bob", "Bob has a cat").await;
    let mut waited = 0;
    while store.pending_count(APP).await.unwrap() > 1 {
        assert!(waited < 200, "bob's memory never got its vector");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(store.pending_count(APP).await.unwrap(), 1);
    assert!(
        !model
            .embedding_requests()
            .iter()
            .any(|r| r.to_string().contains("Rex")),
        "alice's memory was embedded past her budget"
    );
    let hits = search(&s, "alice", "dog").await;
    assert_eq!(hits[0]["id"], dog);
    assert!(hits[0].get("vectorRank").is_none(), "{hits:#?}");
    let usage = json_with_status(s.get(&format!("/apps/{APP}/users/alice/usage")).await, 200).await;
    assert_eq!(usage["total"]["inputTokens"], 5, "{usage}");
}

/// The store's side: claims are leases (a claimer that dies loses nothing), two claimers
/// never get the same memory, and a new space makes every memory pending again.
async fn claims_are_leases_and_a_new_space_starts_over(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store: Arc<dyn Store> = db.store().await;
    let mut ids = vec![];
    for (user, text) in [("u1", "one"), ("u1", "two"), ("u2", "three")] {
        let e = agentd::store::memory::fact_entry("user", text).unwrap();
        store.insert_memory(APP, user, &e).await.unwrap();
        ids.push(e.event_id);
    }
    let a = VectorSpace {
        name: "a/2".into(),
        dims: 2,
    };
    assert!(store.adopt_space(APP, &a).await.unwrap());
    assert!(!store.adopt_space(APP, &a).await.unwrap());
    let lease = Duration::from_secs(2);
    let first = store.claim_pending(APP, 2, lease).await.unwrap();
    let second = store.claim_pending(APP, 10, lease).await.unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(second.len(), 1, "a claimed memory was claimed again");
    assert!(store
        .claim_pending(APP, 10, lease)
        .await
        .unwrap()
        .is_empty());
    // The first claimer dies: once its lease ends, its memories are claimed again.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let again = store.claim_pending(APP, 10, lease).await.unwrap();
    let mut got: Vec<_> = again.iter().map(|p| p.event_id.clone()).collect();
    got.sort();
    // The second claim's lease ran out too.
    let mut all = ids.clone();
    all.sort();
    assert_eq!(got, all);
    let vectors: Vec<_> = again.iter().map(|p| (p.clone(), vec![1.0, 0.5])).collect();
    assert_eq!(store.store_vectors(APP, &a, &vectors).await.unwrap(), 3);
    assert_eq!(store.pending_count(APP).await.unwrap(), 0);
    let near = store
        .nearest_memories(APP, "u1", &a, &[1.0, 0.5], 10)
        .await
        .unwrap();
    assert_eq!(near.len(), 2, "only u1's memories");
    assert!(near[0].distance.abs() < 1e-6);
    // A deleted memory's vector goes with it; storing for it is a no-op.
    assert!(store.delete_memory(APP, "u2", &ids[2]).await.unwrap());
    let gone = [(
        PendingMemory {
            user_id: "u2".into(),
            event_id: ids[2].clone(),
            text: "gone".into(),
        },
        vec![0.0, 1.0],
    )];
    assert_eq!(store.store_vectors(APP, &a, &gone).await.unwrap(), 0);
    // Another model: nothing is compared across spaces, everything is embedded again.
    let b = VectorSpace {
        name: "b/3".into(),
        dims: 3,
    };
    assert!(store.adopt_space(APP, &b).await.unwrap());
    assert_eq!(store.pending_count(APP).await.unwrap(), 2);
    assert!(store
        .nearest_memories(APP, "u1", &b, &[1.0, 0.5, 0.0], 10)
        .await
        .unwrap()
        .is_empty());
    // A vector of the wrong size finds nothing rather than failing.
    assert!(store
        .nearest_memories(APP, "u1", &b, &[1.0], 10)
        .await
        .unwrap()
        .is_empty());
}

/// A vector embedded from a memory's text is not stored once the memory holds another text
/// (an extraction updated it while the embedding call ran): the memory waits for a vector of
/// its new text.
async fn a_vector_of_an_older_text_is_not_stored(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store: Arc<dyn Store> = db.store().await;
    let e = agentd::store::memory::fact_entry("user", "She lives in Lisbon").unwrap();
    store.insert_memory(APP, "u1", &e).await.unwrap();
    let space = VectorSpace {
        name: "a/2".into(),
        dims: 2,
    };
    store.adopt_space(APP, &space).await.unwrap();
    let claimed = store
        .claim_pending(APP, 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    // Meanwhile the memory gets a new text (what an update by extraction writes).
    let update = "UPDATE memory_entries SET text = 'She lives in Porto' WHERE event_id = $1";
    if backend == Backend::Sqlite {
        let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
        sqlx::query(&update.replace('$', "?"))
            .bind(&e.event_id)
            .execute(&pool)
            .await
            .unwrap();
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        sqlx::query(update)
            .bind(&e.event_id)
            .execute(&pool)
            .await
            .unwrap();
    }
    let stale = [(claimed[0].clone(), vec![1.0, 0.5])];
    assert_eq!(store.store_vectors(APP, &space, &stale).await.unwrap(), 0);
    assert_eq!(store.pending_count(APP).await.unwrap(), 1);
    let mut fresh = claimed[0].clone();
    fresh.text = "She lives in Porto".into();
    assert_eq!(
        store
            .store_vectors(APP, &space, &[(fresh, vec![1.0, 0.5])])
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.pending_count(APP).await.unwrap(), 0);
}

/// ADK's `preload_memory`: the user's memories that match the message, by meaning, are in the
/// model's system instruction (another user's never), and the model is not offered it as a
/// function (`load_memory` it is).
async fn preload_memory_puts_the_users_memories_in_the_instruction(backend: Backend) {
    let model = ScriptedModel::start().await;
    model.concepts(CONCEPTS);
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("helper");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("root_agent.yaml"),
        format!(
            "name: helper\nmodel: openai/chat-1\nmodel_options:\n  base_url: {}\n\
             instruction: You help.\ntools:\n  - name: preload_memory\n  - name: load_memory\n",
            model.base_url
        ),
    )
    .unwrap();
    std::fs::write(
        app.join("agentd.yaml"),
        format!(
            "memory:\n  embedding_model: openai/emb-1\n  dimensions: 8\n  \
             embedding_options:\n    base_url: {}\n",
            model.base_url
        ),
    )
    .unwrap();
    let path = dir.path().to_path_buf();
    let s = TestServer::start_on(TestDb::new(backend).await, move |a| a.apps_dir = path).await;
    for (user, text) in [
        ("alice", "My favourite colour is blue"),
        ("bob", "Bob likes red"),
    ] {
        let resp = s
            .post_json(
                &format!("/apps/helper/users/{user}/memory"),
                json!({"text": text}),
            )
            .await;
        json_with_status(resp, 201).await;
    }
    let store = s.db.store().await;
    for _ in 0..200 {
        if store.pending_count("helper").await.unwrap() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    model.push("chat-1", common::model_server::Reply::text(&["Blue."]));
    let msgs = s
        .run_stream(json!({
            "appName": "helper", "userId": "alice", "sessionId": "s1", "createSession": true,
            "newMessage": {"role": "user", "parts": [{"text": "Which hue do I like?"}]},
        }))
        .await;
    assert_eq!(msgs.last().unwrap().data["status"], "completed", "{msgs:?}");
    let request = &model.requests_for("chat-1")[0];
    let system = request["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(system.starts_with("You help."), "{system}");
    assert!(system.contains("<PAST_CONVERSATIONS>"), "{system}");
    assert!(
        system.contains("user: My favourite colour is blue"),
        "{system}"
    );
    assert!(system.contains("Time: 20"), "{system}");
    assert!(
        !system.contains("Bob"),
        "another user's memory was preloaded: {system}"
    );
    let tools: Vec<&str> = request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["load_memory"]);

    // The embedding calls are charged to their users (the scripted model counts a token a
    // word): alice's fact (5) in the background, her run's query (5) with the run; bob's
    // fact (3) to bob, whether it shared alice's call or not.
    let emb = |user: &'static str| {
        let s = &s;
        async move {
            let resp = s
                .get(&format!("/apps/helper/users/{user}/usage?groupBy=model"))
                .await;
            let usage = json_with_status(resp, 200).await;
            usage["usage"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["key"] == "emb-1")
                .map(|r| (r["inputTokens"].as_u64(), r["outputTokens"].as_u64()))
        }
    };
    assert_eq!(emb("alice").await, Some((Some(10), Some(0))));
    assert_eq!(emb("bob").await, Some((Some(3), Some(0))));
    let run = msgs.last().unwrap().data["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let run = json_with_status(
        s.get(&format!("/apps/helper/users/alice/runs/{run}")).await,
        200,
    )
    .await;
    assert_eq!(run["usage"]["byModel"]["emb-1"]["inputTokens"], 5, "{run}");
}

/// The budget check of the embedder's batch (`spent_budgets`): a user's spent budget holds
/// that user alone; the app's holds every user; with both spent, the one that resets last is
/// the one waited for. (That the app's is read once per batch is the code's shape, not
/// counted here.)
async fn a_batchs_budget_check_holds_each_user_and_the_app(backend: Backend) {
    use agentd::store::usage::spent_budgets;
    use agentd::usage::{Budget, Payer};
    let db = TestDb::new(backend).await;
    let store: Arc<dyn Store> = db.store().await;
    let users = ["alice", "bob", "carol"];
    let spent = || async { spent_budgets(store.as_ref(), APP, users).await.unwrap() };
    assert!(spent().await.is_empty(), "no budget is set");
    let nothing_today = Budget {
        tokens_per_day: Some(0),
        cost_per_month: None,
    };
    let alice = Payer::User {
        app: APP.into(),
        user: "alice".into(),
    };
    store.set_budget(&alice, &nothing_today, 0.0).await.unwrap();
    let only_alice = spent().await;
    assert_eq!(only_alice.keys().collect::<Vec<_>>(), ["alice"]);
    assert_eq!(only_alice["alice"].payer, alice);

    let app = Payer::App { app: APP.into() };
    let nothing_this_month = Budget {
        tokens_per_day: None,
        cost_per_month: Some(0.0),
    };
    store
        .set_budget(&app, &nothing_this_month, 0.0)
        .await
        .unwrap();
    let all = spent().await;
    assert_eq!(all.keys().collect::<Vec<_>>(), ["alice", "bob", "carol"]);
    // The app's month ends after alice's day (or with it, on a month's last day: hers, then).
    assert_eq!(all["bob"].payer, app);
    assert!(all["alice"].reset >= only_alice["alice"].reset);
    if all["alice"].reset > only_alice["alice"].reset {
        assert_eq!(all["alice"].payer, app);
    }
    // One user, as a search or an extraction asks.
    let one = agentd::store::usage::spent_budget(store.as_ref(), APP, "carol")
        .await
        .unwrap()
        .expect("the app's budget holds carol");
    assert_eq!(one, all["carol"]);
}

both_backends!(
    a_batchs_budget_check_holds_each_user_and_the_app,
    meaning_finds_what_words_miss,
    sessions_are_embedded_too_and_bad_facts_change_nothing,
    an_embedding_outage_leaves_search_by_words,
    a_spent_budget_stops_memorys_embedding_calls,
    claims_are_leases_and_a_new_space_starts_over,
    preload_memory_puts_the_users_memories_in_the_instruction,
    a_vector_of_an_older_text_is_not_stored,
);

/// PostgreSQL without pgvector (here: a role that may not create the extension): agentd
/// starts, `/ready` says memory search is full-text only and why, and search by words works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pgvector_search_is_full_text_and_ready_says_so() {
    let db = TestDb::postgres().await;
    let admin = sqlx::PgPool::connect(&db.url).await.expect("connect");
    let role = format!("novector_{}", uuid::Uuid::new_v4().simple());
    let dbname = format!("{role}_db");
    sqlx::query(&format!("CREATE ROLE {role} LOGIN"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {dbname} OWNER {role}"))
        .execute(&admin)
        .await
        .unwrap();
    // Dropped whatever the test's outcome.
    struct Cleanup(sqlx::PgPool, String, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let (pool, db, role) = (self.0.clone(), self.1.clone(), self.2.clone());
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                        .execute(&pool)
                        .await;
                    let _ = sqlx::query(&format!("DROP ROLE IF EXISTS {role}"))
                        .execute(&pool)
                        .await;
                })
            });
        }
    }
    let _cleanup = Cleanup(admin.clone(), dbname.clone(), role.clone());
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username(&role).unwrap();
    url.set_path(&format!("/{dbname}"));
    let model = ScriptedModel::start().await;
    model.concepts(CONCEPTS);
    let dir = tempdir::Dir::new();
    apps_dir(dir.path(), &model, "emb-1");
    let path = dir.path().to_path_buf();
    let url_s = url.to_string();
    let mut args = agentd::config::ServeArgs::for_database(url_s.clone());
    args.apps_dir = path;
    let server = agentd::server::Server::start(args)
        .await
        .expect("agentd starts without pgvector");
    let base = format!("http://{}", server.addr);
    let client = reqwest::Client::new();
    let ready: Value = client
        .get(format!("{base}/ready"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["memorySearch"], "full-text", "{ready}");
    assert!(
        ready["memorySearchNote"]
            .as_str()
            .unwrap()
            .contains("pgvector"),
        "{ready}"
    );
    let added = client
        .post(format!("{base}/apps/{APP}/users/erin/memory"))
        .json(&json!({"text": "Paris in spring"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let found: Value = client
        .get(format!("{base}/apps/{APP}/users/erin/memory?query=paris"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(found["memories"][0]["text"], "Paris in spring");
    assert_eq!(found["memories"][0]["textRank"], 1);
    assert!(
        model.embedding_requests().is_empty(),
        "nothing to embed into"
    );
    server.shutdown(Duration::from_secs(1)).await.unwrap();
}
