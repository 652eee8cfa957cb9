//! The memory service on both backends (PostgreSQL full-text search, SQLite FTS5): adding
//! sessions, ranked and scoped search, hostile query text, non-ASCII text, the ADK
//! `PATCH …/memory` route and agentd's `GET …/memory`, and `--memory-auto-ingest`.

mod common;

use agentd::event::{Content, Event, FunctionCall, Part};
use agentd::store::{MemoryEntry, NewSession, SessionKey, Store, StoreError};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::sync::Arc;

const APP: &str = "memory_app";
const USER: &str = "alice";

async fn open(backend: Backend) -> (TestDb, Arc<dyn Store>) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    (db, store)
}

fn text_event(author: &str, text: &str) -> Event {
    let role = if author == "user" { "user" } else { "model" };
    Event::new("e-test", author).with_content(Content::text(role, text))
}

/// Creates session `id` of (app, user) and appends one event per `(author, text)`.
async fn session_with(
    store: &dyn Store,
    app: &str,
    user: &str,
    id: &str,
    events: &[(&str, &str)],
) -> SessionKey {
    store
        .create_session(NewSession {
            app_name: app.into(),
            user_id: user.into(),
            session_id: Some(id.into()),
            ..Default::default()
        })
        .await
        .expect("create_session");
    let key = SessionKey::new(app, user, id);
    for (author, text) in events {
        append(store, &key, text_event(author, text)).await;
    }
    key
}

async fn append(store: &dyn Store, key: &SessionKey, event: Event) {
    store
        .append_event(key, event, vec![])
        .await
        .expect("append_event");
}

async fn search(store: &dyn Store, user: &str, query: &str) -> Vec<MemoryEntry> {
    store
        .search_memory(APP, user, query, 10)
        .await
        .unwrap_or_else(|e| panic!("search {query:?}: {e}"))
}

fn texts(found: &[MemoryEntry]) -> Vec<&str> {
    found.iter().map(|m| m.text.as_str()).collect()
}

// ---------------------------------------------------------------------------------------
// Store
// ---------------------------------------------------------------------------------------

/// The bundled SQLite that sqlx links is built with FTS5 (the SQLite migration needs it).
#[tokio::test]
async fn bundled_sqlite_has_fts5() {
    let db = TestDb::new(Backend::Sqlite).await;
    let _store = db.store().await;
    let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
    // (The bundled build omits `sqlite_compile_option_used`: use FTS5 directly.)
    let mut conn = pool.acquire().await.expect("connection");
    sqlx::query("CREATE VIRTUAL TABLE temp.fts_probe USING fts5(body)")
        .execute(&mut *conn)
        .await
        .expect("libsqlite3-sys was built without SQLITE_ENABLE_FTS5");
    sqlx::query("INSERT INTO temp.fts_probe (body) VALUES ('full text search')")
        .execute(&mut *conn)
        .await
        .expect("insert");
    let hits: i64 =
        sqlx::query_scalar("SELECT count(*) FROM temp.fts_probe WHERE fts_probe MATCH 'text'")
            .fetch_one(&mut *conn)
            .await
            .expect("MATCH");
    assert_eq!(hits, 1);
    drop(conn);
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE name IN ('memory_entries', 'memory_fts')",
    )
    .fetch_one(&pool)
    .await
    .expect("schema");
    assert_eq!(tables, 2);
    pool.close().await;
}

async fn ingest_then_search_ranks_the_match_first(backend: Backend) {
    let (_db, store) = open(backend).await;
    let key = session_with(
        &*store,
        APP,
        USER,
        "s1",
        &[
            ("user", "I would like a pizza with extra cheese"),
            (
                "echo_agent",
                "The weather in Paris is rainy today, take an umbrella",
            ),
            ("user", "My cat is called Tom"),
        ],
    )
    .await;
    assert!(
        search(&*store, USER, "weather").await.is_empty(),
        "not added yet"
    );
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 3);

    let found = search(&*store, USER, "What is the weather like in Paris?").await;
    assert!(!found.is_empty());
    let best = &found[0];
    assert_eq!(
        best.text,
        "The weather in Paris is rainy today, take an umbrella"
    );
    assert_eq!(best.author, "echo_agent");
    assert_eq!(best.session_id, "s1");
    assert_eq!(
        best.content.parts[0].text.as_deref(),
        Some(best.text.as_str())
    );
    assert_eq!(best.content.role.as_deref(), Some("model"));
    let stored = store.get_session(&key, None).await.unwrap().unwrap();
    assert_eq!(best.event_id, stored.events[1].id);
    assert_eq!(best.timestamp, stored.events[1].timestamp);

    // Case-insensitive, English stemming on both backends.
    assert_eq!(
        texts(&search(&*store, USER, "UMBRELLAS").await),
        [best.text.as_str()]
    );
    assert_eq!(
        texts(&search(&*store, USER, "cats").await),
        ["My cat is called Tom"]
    );
    // No word in common: nothing.
    assert!(search(&*store, USER, "giraffe").await.is_empty());
    // `limit` is honoured; the serialized form is camelCase.
    let one = store
        .search_memory(APP, USER, "pizza weather cat", 1)
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    let wire = serde_json::to_value(&one[0]).unwrap();
    for field in [
        "sessionId",
        "eventId",
        "author",
        "timestamp",
        "text",
        "content",
    ] {
        assert!(wire.get(field).is_some(), "{field} missing in {wire}");
    }
    assert!(store
        .search_memory(APP, USER, "weather", 0)
        .await
        .unwrap()
        .is_empty());
}

async fn more_matched_words_rank_higher(backend: Backend) {
    let (_db, store) = open(backend).await;
    let key = session_with(
        &*store,
        APP,
        USER,
        "s1",
        &[
            ("user", "blue skies"),
            (
                "user",
                "my favourite colour is blue and my favourite food is soup",
            ),
            ("user", "soup of the day"),
        ],
    )
    .await;
    store.add_session_to_memory(&key).await.unwrap();
    let found = search(&*store, USER, "favourite colour blue").await;
    assert_eq!(
        found[0].text,
        "my favourite colour is blue and my favourite food is soup"
    );
    assert_eq!(found.len(), 2, "{:?}", texts(&found));
}

async fn memory_is_scoped_to_app_and_user(backend: Backend) {
    let (_db, store) = open(backend).await;
    let secret = "the launch code is swordfish";
    for (app, user, id) in [
        (APP, USER, "a1"),
        (APP, "bob", "b1"),
        ("other_app", USER, "o1"),
        // Same session id for another user: still separate.
        (APP, "bob", "a1"),
    ] {
        let key = session_with(&*store, app, user, id, &[("user", secret)]).await;
        assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 1);
    }
    let mine = search(&*store, USER, "swordfish").await;
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].session_id, "a1");
    let bobs = search(&*store, "bob", "swordfish").await;
    assert_eq!(bobs.len(), 2);
    let ids: Vec<&str> = bobs.iter().map(|m| m.event_id.as_str()).collect();
    assert!(!ids.contains(&mine[0].event_id.as_str()));
    let other = store
        .search_memory("other_app", USER, "swordfish", 10)
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].session_id, "o1");
    assert!(search(&*store, "carol", "swordfish").await.is_empty());
    assert!(store
        .search_memory("no_such_app", USER, "swordfish", 10)
        .await
        .unwrap()
        .is_empty());
}

async fn adding_again_adds_only_new_events(backend: Backend) {
    let (_db, store) = open(backend).await;
    let key = session_with(
        &*store,
        APP,
        USER,
        "s1",
        &[("user", "first apple"), ("echo_agent", "first apple")],
    )
    .await;
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 2);
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 0);
    assert_eq!(search(&*store, USER, "apple").await.len(), 2);

    append(&*store, &key, text_event("user", "second apple")).await;
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 1);
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 0);
    assert_eq!(search(&*store, USER, "apple").await.len(), 3);

    // Concurrent adds of one session store each event once.
    append(&*store, &key, text_event("user", "third apple")).await;
    let adds = (0..4).map(|_| store.add_session_to_memory(&key));
    let added: usize = futures::future::join_all(adds)
        .await
        .into_iter()
        .map(|r| r.expect("add"))
        .sum();
    assert_eq!(added, 1);
    assert_eq!(search(&*store, USER, "apple").await.len(), 4);

    // Memory outlives its session; a new session with the same id is added from its start.
    assert!(store.delete_session(&key).await.unwrap());
    assert!(matches!(
        store.add_session_to_memory(&key).await,
        Err(StoreError::SessionNotFound)
    ));
    assert_eq!(search(&*store, USER, "apple").await.len(), 4);
    let key = session_with(&*store, APP, USER, "s1", &[("user", "fourth apple")]).await;
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 1);
    assert_eq!(search(&*store, USER, "apple").await.len(), 5);
}

/// A long session is read page by page (200 events per page) and fully added.
async fn a_long_session_is_added_completely(backend: Backend) {
    let (_db, store) = open(backend).await;
    let key = session_with(&*store, APP, USER, "long", &[]).await;
    for i in 0..450 {
        append(
            &*store,
            &key,
            text_event("user", &format!("note number n{i}")),
        )
        .await;
    }
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 450);
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 0);
    for i in [0, 199, 200, 449] {
        let found = search(&*store, USER, &format!("n{i}")).await;
        assert_eq!(texts(&found), [format!("note number n{i}").as_str()]);
    }
    let all = store.search_memory(APP, USER, "note", 1000).await.unwrap();
    assert_eq!(all.len(), 450);
}

async fn a_missing_session_is_not_found(backend: Backend) {
    let (_db, store) = open(backend).await;
    let err = store
        .add_session_to_memory(&SessionKey::new(APP, USER, "ghost"))
        .await;
    assert!(matches!(err, Err(StoreError::SessionNotFound)), "{err:?}");
    // Another user's session of that id is not this user's.
    session_with(&*store, APP, "bob", "s1", &[("user", "hello")]).await;
    let err = store
        .add_session_to_memory(&SessionKey::new(APP, USER, "s1"))
        .await;
    assert!(matches!(err, Err(StoreError::SessionNotFound)), "{err:?}");
}

/// Only the text of complete events is remembered: no thoughts, no partial chunks, no
/// function calls, no ADK-internal function events, no events without text.
async fn only_the_text_of_complete_events_is_remembered(backend: Backend) {
    let (_db, store) = open(backend).await;
    let key = session_with(&*store, APP, USER, "s1", &[]).await;
    let mut thinking = text_event("model", "the answer is marmalade");
    thinking.content.as_mut().unwrap().parts.insert(
        0,
        Part {
            thought: Some(true),
            ..Part::text("ponder the kumquat")
        },
    );
    append(&*store, &key, thinking).await;
    let mut partial = text_event("model", "partial kumquat chunk");
    partial.partial = Some(true);
    append(&*store, &key, partial).await;
    let call = Event::new("e-test", "model").with_content(Content {
        parts: vec![Part {
            function_call: Some(FunctionCall {
                name: "get_weather".into(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        role: Some("model".into()),
        extra: Default::default(),
    });
    append(&*store, &key, call).await;
    let mut transfer = text_event("model", "transferring about kumquat");
    transfer.content.as_mut().unwrap().parts.push(Part {
        function_call: Some(FunctionCall {
            name: "transfer_to_agent".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    append(&*store, &key, transfer).await;
    append(&*store, &key, Event::new("e-test", "model")).await;

    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 1);
    assert!(search(&*store, USER, "kumquat").await.is_empty());
    assert!(search(&*store, USER, "get_weather").await.is_empty());
    let found = search(&*store, USER, "marmalade").await;
    assert_eq!(texts(&found), ["the answer is marmalade"]);
    assert_eq!(
        found[0].content.parts.len(),
        1,
        "thought parts are not kept"
    );
}

/// Query text is never query syntax: FTS5 / tsquery operators, quotes, SQL and control
/// characters are ordinary separators or words. None of them is an error.
async fn query_syntax_characters_never_fail(backend: Backend) {
    let (_db, store) = open(backend).await;
    let key = session_with(
        &*store,
        APP,
        USER,
        "s1",
        &[
            ("user", "the weather AND the sea"),
            ("user", "near or not, text: fine"),
        ],
    )
    .await;
    store.add_session_to_memory(&key).await.unwrap();
    let hostile = [
        "\"",
        "\"weather",
        "weather\"",
        "\"\"",
        "*",
        "weather*",
        "*weather",
        "AND",
        "OR",
        "NOT",
        "weather AND",
        "AND weather",
        "weather OR OR",
        "NOT weather",
        "NEAR(weather sea)",
        "NEAR",
        "(",
        ")",
        "(weather",
        "weather)",
        "-",
        "-weather",
        "weather -sea",
        ":",
        "text:weather",
        "text : weather",
        "{text}: weather",
        "^weather",
        "+weather",
        "weather & sea | !rain <-> x",
        "'",
        "weather's",
        "\\",
        "weather\\",
        "''; DROP TABLE memory_entries; --",
        "%_",
        "weather\u{0}sea",
        "\u{1}\u{7f}",
        "🙂 weather 🙂",
        "or",
        "\"or\" \"and\"",
    ];
    for q in hostile {
        if let Err(e) = store.search_memory(APP, USER, q, 10).await {
            panic!("query {q:?} failed: {e}");
        }
    }
    // Operators are words, so these still find what their words find.
    for q in [
        "weather AND",
        "\"weather",
        "weather*",
        "-weather",
        "weather:",
        "(weather",
    ] {
        let found = search(&*store, USER, q).await;
        assert_eq!(
            texts(&found).first(),
            Some(&"the weather AND the sea"),
            "{q:?}"
        );
    }
    // The table is still there.
    assert_eq!(search(&*store, USER, "sea").await.len(), 1);
}

async fn a_blank_query_finds_nothing(backend: Backend) {
    let (_db, store) = open(backend).await;
    let key = session_with(&*store, APP, USER, "s1", &[("user", "anything at all")]).await;
    store.add_session_to_memory(&key).await.unwrap();
    for q in ["", " ", "\t\n", "!!! ... ???", "\"\" ()", "-:*"] {
        assert!(search(&*store, USER, q).await.is_empty(), "{q:?}");
    }
}

/// Words of any script are matched whole. Tokenizers split on spaces and punctuation only,
/// so unsegmented CJK text ("東京に行きます") is one token: "東京" finds "東京" where it stands
/// alone, not inside a longer run of CJK characters. Diacritics: SQLite's tokenizer folds
/// them ("zurich" finds "Zürich"); PostgreSQL's 'english' configuration does not.
async fn non_ascii_text_is_searchable(backend: Backend) {
    let (_db, store) = open(backend).await;
    let key = session_with(
        &*store,
        APP,
        USER,
        "s1",
        &[
            ("user", "Grüezi aus Zürich!"),
            ("user", "Москва — столица России"),
            ("user", "東京 タワー は高い"),
            ("user", "東京に行きます"),
            ("user", "naïve café crème"),
        ],
    )
    .await;
    assert_eq!(store.add_session_to_memory(&key).await.unwrap(), 5);
    assert_eq!(
        texts(&search(&*store, USER, "Zürich").await),
        ["Grüezi aus Zürich!"]
    );
    assert_eq!(
        texts(&search(&*store, USER, "Москва").await),
        ["Москва — столица России"]
    );
    assert_eq!(
        texts(&search(&*store, USER, "東京").await),
        ["東京 タワー は高い"]
    );
    assert_eq!(
        texts(&search(&*store, USER, "タワー").await),
        ["東京 タワー は高い"]
    );
    assert_eq!(
        texts(&search(&*store, USER, "東京に行きます").await),
        ["東京に行きます"]
    );
    assert_eq!(
        texts(&search(&*store, USER, "café").await),
        ["naïve café crème"]
    );
    let folded = search(&*store, USER, "zurich").await;
    match backend {
        Backend::Sqlite => assert_eq!(texts(&folded), ["Grüezi aus Zürich!"]),
        Backend::Postgres | Backend::Citus => assert!(folded.is_empty()),
    }
}

// ---------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------

const MEMORY: &str = "/apps/echo/users/u1/memory";

/// One echo run in JSON mode (the response ends with the run).
async fn echo_run(s: &TestServer, session: &str, text: &str) -> Value {
    let resp = s
        .client
        .post(s.url("/run"))
        .header("accept", "application/json")
        .json(&json!({
            "appName": "echo", "userId": "u1", "sessionId": session, "createSession": true,
            "newMessage": { "role": "user", "parts": [{ "text": text }] },
        }))
        .send()
        .await
        .expect("POST /run");
    json_with_status(resp, 200).await
}

async fn find(s: &TestServer, query: &str) -> Vec<Value> {
    let path = format!("{MEMORY}?query={}", urlencode(query));
    let body = json_with_status(s.get(&path).await, 200).await;
    body["memories"].as_array().expect("memories").clone()
}

fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

async fn patch_memory_then_search(backend: Backend) {
    let s = TestServer::start(backend).await;
    echo_run(&s, "s1", "remember the purple elephant").await;
    assert!(find(&s, "elephant").await.is_empty(), "not added yet");

    let resp = s.patch_json(MEMORY, json!({ "sessionId": "s1" })).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    assert_eq!(resp.text().await.unwrap(), "null");

    let found = find(&s, "purple elephants").await;
    assert_eq!(found.len(), 2, "{found:?}");
    let authors: Vec<&str> = found
        .iter()
        .map(|m| m["author"].as_str().unwrap())
        .collect();
    assert!(
        authors.contains(&"user") && authors.contains(&"echo_agent"),
        "{authors:?}"
    );
    for m in &found {
        assert_eq!(m["sessionId"], "s1");
        assert_eq!(m["text"], "remember the purple elephant");
        assert_eq!(
            m["content"]["parts"][0]["text"],
            "remember the purple elephant"
        );
        assert!(
            m["eventId"].is_string() && m["timestamp"].is_number(),
            "{m}"
        );
    }

    // Again (snake_case body this time): still 200 null, nothing duplicated.
    let again = s.patch_json(MEMORY, json!({ "session_id": "s1" })).await;
    assert_eq!(json_with_status(again, 200).await, Value::Null);
    assert_eq!(find(&s, "elephant").await.len(), 2);

    // Other users and apps see nothing.
    let other = json_with_status(
        s.get("/apps/echo/users/u2/memory?query=elephant").await,
        200,
    )
    .await;
    assert_eq!(other, json!({ "memories": [] }));
    let other = json_with_status(s.get("/apps/x/users/u1/memory?query=elephant").await, 200).await;
    assert_eq!(other, json!({ "memories": [] }));

    // Query parameters: blank or absent query, limit.
    let blank = json_with_status(s.get(&format!("{MEMORY}?query=%20")).await, 200).await;
    assert_eq!(blank, json!({ "memories": [] }));
    let absent = json_with_status(s.get(MEMORY).await, 200).await;
    assert_eq!(absent, json!({ "memories": [] }));
    let one = json_with_status(
        s.get(&format!("{MEMORY}?query=elephant&limit=1")).await,
        200,
    )
    .await;
    assert_eq!(one["memories"].as_array().unwrap().len(), 1);
    let many = json_with_status(
        s.get(&format!("{MEMORY}?query=elephant&limit=100000"))
            .await,
        200,
    )
    .await;
    assert_eq!(many["memories"].as_array().unwrap().len(), 2);
    let hostile = format!("{MEMORY}?query={}", urlencode("\"elephant* AND (-:"));
    let hostile = json_with_status(s.get(&hostile).await, 200).await;
    assert_eq!(hostile["memories"].as_array().unwrap().len(), 2);
    let bad = json_with_status(s.get(&format!("{MEMORY}?query=x&limit=-1")).await, 422).await;
    assert_eq!(bad["code"], "validation_error");
    assert_eq!(bad["detail"][0]["loc"], json!(["query", "limit"]));
}

async fn patch_memory_errors(backend: Backend) {
    let s = TestServer::start(backend).await;
    // ADK fixture 117, plus agentd's `code`.
    let resp = s.patch_json(MEMORY, json!({ "sessionId": "ghost" })).await;
    assert_eq!(
        json_with_status(resp, 404).await,
        json!({ "detail": "Session not found", "code": "session_not_found" })
    );
    // Unknown app: no such session either (ADK does not check apps on these routes).
    let resp = s
        .patch_json(
            "/apps/nope/users/u1/memory",
            json!({ "sessionId": "ghost" }),
        )
        .await;
    assert_eq!(
        json_with_status(resp, 404).await["code"],
        "session_not_found"
    );

    let resp = s.patch_json(MEMORY, json!({})).await;
    let body = json_with_status(resp, 422).await;
    assert_eq!(body["code"], "validation_error");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "sessionId"]));
    let resp = s.patch_json(MEMORY, json!({ "sessionId": 7 })).await;
    assert_eq!(
        json_with_status(resp, 422).await["code"],
        "validation_error"
    );
    let resp = s
        .client
        .patch(s.url(MEMORY))
        .header("content-type", "application/json")
        .body(r#"{"sessionId":"#)
        .send()
        .await
        .unwrap();
    assert_eq!(json_with_status(resp, 422).await["code"], "json_invalid");
}

async fn auto_ingest_adds_every_run(backend: Backend) {
    let s = TestServer::start_with(backend, |a| a.memory_auto_ingest = true).await;
    echo_run(&s, "s1", "my locker combination is tangerine").await;
    let found = find(&s, "tangerine").await;
    let authors: Vec<&str> = found
        .iter()
        .map(|m| m["author"].as_str().unwrap())
        .collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        authors.contains(&"echo_agent"),
        "the reply is remembered: {authors:?}"
    );

    // The next run adds only its own events; PATCH after it adds nothing new.
    echo_run(&s, "s1", "and my bike is green tangerine").await;
    assert_eq!(find(&s, "tangerine").await.len(), 4);
    let resp = s.patch_json(MEMORY, json!({ "sessionId": "s1" })).await;
    assert_eq!(json_with_status(resp, 200).await, Value::Null);
    assert_eq!(find(&s, "tangerine").await.len(), 4);
}

async fn without_auto_ingest_runs_are_not_remembered(backend: Backend) {
    let s = TestServer::start(backend).await;
    echo_run(&s, "s1", "my locker combination is tangerine").await;
    assert!(find(&s, "tangerine").await.is_empty());
}

#[test]
fn memory_auto_ingest_flag_parses() {
    use agentd::config::{Cli, Command};
    use clap::Parser;
    let serve = |args: &[&str]| match Cli::try_parse_from(args).expect("parses").command {
        Command::Serve(a) => a,
        other => panic!("{other:?}"),
    };
    assert!(serve(&["agentd", "serve", "--memory-auto-ingest"]).memory_auto_ingest);
    if std::env::var_os("AGENTD_MEMORY_AUTO_INGEST").is_none() {
        assert!(!serve(&["agentd", "serve"]).memory_auto_ingest);
    }
}

both_backends!(
    ingest_then_search_ranks_the_match_first,
    more_matched_words_rank_higher,
    memory_is_scoped_to_app_and_user,
    adding_again_adds_only_new_events,
    a_long_session_is_added_completely,
    a_missing_session_is_not_found,
    only_the_text_of_complete_events_is_remembered,
    query_syntax_characters_never_fail,
    a_blank_query_finds_nothing,
    non_ascii_text_is_searchable,
    patch_memory_then_search,
    patch_memory_errors,
    auto_ingest_adds_every_run,
    without_auto_ingest_runs_are_not_remembered,
);
