//! Recall with a real embedding model (docs/memory.md#search): 200 facts of one user and 50
//! questions that ask for 50 of them in other words (tests/fixtures/memory_recall.json,
//! written for this test), searched over real HTTP on every backend, by an app whose
//! embedding model is all-MiniLM-L6-v2 (tests/fixtures/minilm_server.py, the OpenAI Embeddings
//! wire format) and by an app without one (words only). The hybrid search must find the right
//! fact in its top 3 for at least 90% of the questions. The words-only figure is the
//! fixture's check: its questions must be paraphrases that full-text search mostly misses
//! (at most 50%), or the first figure would prove nothing about meaning.
//!
//! `cargo test --test memory_recall -- --nocapture` prints both figures and the misses.

mod common;

use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

const HYBRID: &str = "recall";
const WORDS: &str = "words";
const USER: &str = "u1";

/// The embedding server, stopped on drop.
struct ModelServer {
    child: std::process::Child,
    base_url: String,
}

impl ModelServer {
    fn start() -> ModelServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm_server.py");
        let mut child = std::process::Command::new(common::clients::embeddings_python())
            .arg(script)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the embedding server");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("the server's port");
        let port: Value = serde_json::from_str(&first)
            .unwrap_or_else(|e| panic!("the embedding server did not start ({e}): {first:?}"));
        ModelServer {
            child,
            base_url: format!("http://127.0.0.1:{}/v1", port["port"]),
        }
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Fixture {
    facts: Vec<(String, String)>,
    questions: Vec<(String, String)>,
}

fn fixture() -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/memory_recall.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).expect("fixture")).expect("JSON");
    let pairs = |key: &str, a: &str, b: &str| -> Vec<(String, String)> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| (x[a].as_str().unwrap().into(), x[b].as_str().unwrap().into()))
            .collect()
    };
    Fixture {
        facts: pairs("facts", "id", "text"),
        questions: pairs("questions", "question", "fact"),
    }
}

fn apps_dir(dir: &Path, base_url: &str) {
    for app in [HYBRID, WORDS] {
        let d = dir.join(app);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("root_agent.yaml"),
            format!("agent_class: EchoAgent\nname: {app}\n"),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join(HYBRID).join("agentd.yaml"),
        format!(
            "memory:\n  embedding_model: openai/all-MiniLM-L6-v2\n  dimensions: 384\n  \
             embedding_options:\n    base_url: {base_url}\n    timeout_secs: 120\n"
        ),
    )
    .unwrap();
}

/// How many questions find their fact in `app`'s top 3, and the misses.
async fn recall(s: &TestServer, app: &str, f: &Fixture) -> (usize, Vec<String>) {
    let text_of = |id: &str| f.facts.iter().find(|(i, _)| i == id).unwrap().1.clone();
    let mut found = 0;
    let mut misses = vec![];
    for (question, fact) in &f.questions {
        let q: String = form_urlencoded::byte_serialize(question.as_bytes()).collect();
        let resp = s
            .get(&format!(
                "/apps/{app}/users/{USER}/memory?query={q}&limit=3"
            ))
            .await;
        let top: Vec<String> = json_with_status(resp, 200).await["memories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["text"].as_str().unwrap().to_string())
            .collect();
        if top.contains(&text_of(fact)) {
            found += 1;
        } else {
            misses.push(format!("{question:?} → {top:?}"));
        }
    }
    (found, misses)
}

async fn hybrid_search_finds_what_the_user_meant(backend: Backend) {
    let model = ModelServer::start();
    let f = fixture();
    assert_eq!((f.facts.len(), f.questions.len()), (200, 50));
    let dir = tempfile::tempdir().unwrap();
    apps_dir(dir.path(), &model.base_url);
    let path = dir.path().to_path_buf();
    let s = TestServer::start_on(TestDb::new(backend).await, move |a| a.apps_dir = path).await;
    for app in [HYBRID, WORDS] {
        for (_, text) in &f.facts {
            let resp = s
                .post_json(
                    &format!("/apps/{app}/users/{USER}/memory"),
                    json!({ "text": text }),
                )
                .await;
            json_with_status(resp, 201).await;
        }
    }
    let store = s.db.store().await;
    for _ in 0..1200 {
        if store.pending_count(HYBRID).await.unwrap() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        store.pending_count(HYBRID).await.unwrap(),
        0,
        "facts still wait for vectors after 120 s"
    );

    let (hybrid, hybrid_misses) = recall(&s, HYBRID, &f).await;
    let (words, words_misses) = recall(&s, WORDS, &f).await;
    let n = f.questions.len();
    println!(
        "memory recall ({backend:?}, all-MiniLM-L6-v2, top 3 of 200 facts): hybrid {hybrid}/{n} \
         ({}%), words only {words}/{n} ({}%)",
        hybrid * 100 / n,
        words * 100 / n
    );
    println!("hybrid misses: {hybrid_misses:#?}");
    println!("words-only misses: {}", words_misses.len());
    assert!(
        hybrid * 10 >= n * 9,
        "hybrid search found {hybrid}/{n}: {hybrid_misses:#?}"
    );
    assert!(
        words * 2 <= n,
        "the fixture's questions share too many words with their facts: words alone found \
         {words}/{n}"
    );
}

both_backends!(hybrid_search_finds_what_the_user_meant);
