//! One behaviour suite for the `SessionStore` and `ArtifactStore` traits, run against both
//! backends (`<test>::postgres` and `<test>::sqlite`). Every test gets a fresh database.
//!
//! What is checked is what callers rely on: ADK state-prefix semantics, gapless `seq`,
//! all-or-nothing appends (including under concurrency and injected failures), ADK list
//! order and keyset paging, and artifact versioning and scoping.

mod common;

use agentd::event::{Blob, Bytes64, Content, Event, JsonMap, Part, Session};
use agentd::store::{
    ArtifactScope, ArtifactVersion, ArtifactWrite, EventRange, NewSession, SessionCursor,
    SessionHead, SessionKey, Store, StoreError, StoreLimits, StoredEvent,
};
use common::{Backend, TestDb};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

const APP: &str = "conformance_app";
const USER: &str = "alice";
const OTHER_USER: &str = "bob";

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Asserts that `result` is an `Err` matching `pattern`.
macro_rules! assert_err {
    ($result:expr, $pattern:pat $(if $guard:expr)?) => {
        match $result {
            Err($pattern) $(if $guard)? => {}
            Err(e) => panic!("expected {}, got error {e:?}", stringify!($pattern)),
            Ok(v) => panic!("expected {}, got Ok({v:?})", stringify!($pattern)),
        }
    };
}

async fn open(backend: Backend) -> (TestDb, Arc<dyn Store>) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    (db, store)
}

fn obj(v: Value) -> JsonMap {
    match v {
        Value::Object(m) => m,
        other => panic!("expected a JSON object, got {other}"),
    }
}

fn key(user: &str, id: &str) -> SessionKey {
    SessionKey::new(APP, user, id)
}

fn scope(user: &str, session: &str) -> ArtifactScope {
    ArtifactScope::new(APP, user, session)
}

fn new_session(user: &str, id: Option<&str>, state: Value) -> NewSession {
    NewSession {
        app_name: APP.into(),
        user_id: user.into(),
        session_id: id.map(str::to_string),
        state: obj(state),
        events: vec![],
    }
}

/// Creates session `id` of `user` with `state` and returns its key.
async fn create(store: &dyn Store, user: &str, id: &str, state: Value) -> SessionKey {
    store
        .create_session(new_session(user, Some(id), state))
        .await
        .expect("create_session");
    key(user, id)
}

/// Creates a session whose `lastUpdateTime` is `update_time` (via one restored event).
async fn create_at(store: &dyn Store, user: &str, id: &str, update_time: f64) -> SessionKey {
    let mut new = new_session(user, Some(id), json!({}));
    new.events = vec![restored_event(update_time)];
    store.create_session(new).await.expect("create_session");
    key(user, id)
}

/// A restored (client-supplied) event without id; `timestamp` 0 means "not set".
fn restored_event(timestamp: f64) -> Event {
    Event {
        author: "user".into(),
        invocation_id: "e-restored".into(),
        content: Some(Content::text("user", format!("restored at {timestamp}"))),
        timestamp,
        ..Default::default()
    }
}

/// A complete agent event carrying `delta` as its state delta.
fn event(delta: Value) -> Event {
    let mut e = Event::new("e-conformance", "agent").with_content(Content::text("model", "ok"));
    e.actions.state_delta = obj(delta);
    e
}

fn event_at(timestamp: f64, delta: Value) -> Event {
    Event {
        timestamp,
        ..event(delta)
    }
}

async fn append(store: &dyn Store, key: &SessionKey, delta: Value) -> StoredEvent {
    store
        .append_event(key, event(delta), vec![])
        .await
        .expect("append_event")
}

fn text_write(filename: &str, text: &str) -> ArtifactWrite {
    ArtifactWrite {
        filename: filename.into(),
        part: Part::text(text),
        custom_metadata: JsonMap::new(),
    }
}

fn blob_part(data: &[u8], mime: &str) -> Part {
    Part {
        inline_data: Some(Blob {
            data: Bytes64(data.to_vec()),
            mime_type: Some(mime.into()),
            display_name: None,
        }),
        ..Default::default()
    }
}

async fn save_text(store: &dyn Store, scope: &ArtifactScope, filename: &str, text: &str) -> i64 {
    store
        .save_artifact(scope, text_write(filename, text))
        .await
        .expect("save_artifact")
        .version
}

async fn load_text(
    store: &dyn Store,
    scope: &ArtifactScope,
    filename: &str,
    version: Option<i64>,
) -> Option<String> {
    store
        .load_artifact(scope, filename, version)
        .await
        .expect("load_artifact")
        .map(|p| p.text.expect("a text part"))
}

async fn version_numbers(store: &dyn Store, scope: &ArtifactScope, filename: &str) -> Vec<i64> {
    store
        .list_artifact_versions(scope, filename)
        .await
        .expect("list_artifact_versions")
        .iter()
        .map(|v| v.version)
        .collect()
}

/// The session's merged state, as JSON.
async fn state(store: &dyn Store, key: &SessionKey) -> Value {
    Value::Object(get(store, key).await.state)
}

async fn get(store: &dyn Store, key: &SessionKey) -> Session {
    store
        .get_session(key, None)
        .await
        .expect("get_session")
        .expect("session exists")
}

async fn head(store: &dyn Store, key: &SessionKey) -> SessionHead {
    store
        .session_head(key)
        .await
        .expect("session_head")
        .expect("session exists")
}

async fn events_page(
    store: &dyn Store,
    key: &SessionKey,
    after: Option<i64>,
    before: Option<i64>,
    limit: u32,
) -> (Vec<i64>, bool) {
    let page = store
        .list_events(
            key,
            EventRange {
                after,
                before,
                limit,
            },
        )
        .await
        .expect("list_events")
        .expect("session exists");
    (page.events.iter().map(|e| e.seq).collect(), page.has_more)
}

async fn all_stored_events(store: &dyn Store, key: &SessionKey) -> Vec<StoredEvent> {
    let range = EventRange {
        limit: 100_000,
        ..Default::default()
    };
    store
        .list_events(key, range)
        .await
        .expect("list_events")
        .expect("session exists")
        .events
}

async fn listed_ids(store: &dyn Store, user: &str) -> Vec<String> {
    let page = store
        .list_sessions(APP, user, None, 1000)
        .await
        .expect("list_sessions");
    page.sessions.into_iter().map(|s| s.id).collect()
}

/// Everything an append could touch, as seen through the public API.
#[derive(Debug, PartialEq)]
struct Snapshot {
    sessions: Vec<Option<Session>>,
    last_seqs: Vec<Option<i64>>,
    artifacts: Vec<(String, Vec<ArtifactVersion>, Option<Part>)>,
}

async fn snapshot(store: &dyn Store, keys: &[&SessionKey]) -> Snapshot {
    let mut snap = Snapshot {
        sessions: vec![],
        last_seqs: vec![],
        artifacts: vec![],
    };
    for k in keys {
        snap.sessions
            .push(store.get_session(k, None).await.expect("get_session"));
        let h = store.session_head(k).await.expect("session_head");
        snap.last_seqs.push(h.map(|h| h.last_seq));
        let sc = ArtifactScope::from(*k);
        for name in store.list_artifact_keys(&sc).await.expect("list keys") {
            let versions = store
                .list_artifact_versions(&sc, &name)
                .await
                .expect("versions");
            let latest = store.load_artifact(&sc, &name, None).await.expect("load");
            snap.artifacts
                .push((format!("{}/{name}", k.session_id), versions, latest));
        }
    }
    snap
}

/// Runs `sql` on the test database through a connection of its own.
async fn exec_raw(db: &TestDb, statements: &[&str]) {
    use sqlx::Connection;
    match db.backend {
        Backend::Postgres | Backend::Citus => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            for s in statements {
                sqlx::query(s).execute(&mut c).await.expect("raw statement");
            }
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("connect");
            for s in statements {
                sqlx::query(s).execute(&mut c).await.expect("raw statement");
            }
        }
    }
}

/// Makes every insert of an event authored by `explode` fail inside the database, i.e. at
/// the very last step of an append, after state and artifacts were written.
async fn inject_event_insert_failure(db: &TestDb) {
    match db.backend {
        Backend::Postgres | Backend::Citus => {
            // Citus takes a trigger on a distributed table only when told it is safe (this
            // one reads only the row it fires for).
            let unsafe_triggers = if db.backend == Backend::Citus {
                "SET citus.enable_unsafe_triggers = on"
            } else {
                "SELECT 1"
            };
            exec_raw(
                db,
                &[
                    unsafe_triggers,
                    "CREATE FUNCTION explode() RETURNS trigger AS $$ BEGIN
                        IF NEW.author = 'explode' THEN RAISE EXCEPTION 'injected failure'; END IF;
                        RETURN NEW; END $$ LANGUAGE plpgsql",
                    "CREATE TRIGGER explode BEFORE INSERT ON events
                        FOR EACH ROW EXECUTE FUNCTION explode()",
                ],
            )
            .await
        }
        Backend::Sqlite => {
            exec_raw(
                db,
                &[
                    "CREATE TRIGGER explode BEFORE INSERT ON events WHEN NEW.author = 'explode'
                      BEGIN SELECT RAISE(ABORT, 'injected failure'); END",
                ],
            )
            .await
        }
    }
}

/// A session with history, state in every scope and artifacts in both scopes, plus a
/// sibling session of the same user: the "before" picture for failure tests.
async fn populated(store: &dyn Store) -> (SessionKey, SessionKey) {
    let k = create(store, USER, "s1", json!({"k": 1, "app:theme": "dark"})).await;
    let sibling = create(store, USER, "s2", json!({"user:lang": "en"})).await;
    let arts = vec![
        text_write("notes.txt", "v0"),
        text_write("user:profile.txt", "v0"),
    ];
    store
        .append_event(&k, event(json!({"k": 2, "user:n": 1})), arts)
        .await
        .expect("append with artifacts");
    append(store, &k, json!({"app:count": 1})).await;
    (k, sibling)
}

/// The staged artifacts and state delta a failing append tries to commit.
fn doomed_append() -> (Event, Vec<ArtifactWrite>) {
    let e = event(json!({"k": 99, "fresh": true, "app:theme": "light", "user:n": 99}));
    let arts = vec![
        text_write("notes.txt", "doomed"),
        text_write("user:profile.txt", "doomed"),
        text_write("brand-new.txt", "doomed"),
    ];
    (e, arts)
}

// ---------------------------------------------------------------------------------------
// create_session
// ---------------------------------------------------------------------------------------

async fn create_session_generates_uuid_id(backend: Backend) {
    let (_db, store) = open(backend).await;
    let a = store
        .create_session(new_session(USER, None, json!({})))
        .await
        .unwrap();
    let b = store
        .create_session(new_session(USER, None, json!({})))
        .await
        .unwrap();
    uuid::Uuid::parse_str(&a.id).expect("generated id is a uuid");
    assert_ne!(a.id, b.id);
    assert_eq!((a.app_name.as_str(), a.user_id.as_str()), (APP, USER));
    assert!(a.events.is_empty());
    assert!(a.last_update_time > 0.0);
    assert_eq!(get(&*store, &key(USER, &a.id)).await, a);
}

async fn create_session_with_given_id_rejects_duplicates(backend: Backend) {
    let (_db, store) = open(backend).await;
    let s = store
        .create_session(new_session(USER, Some("s1"), json!({"k": 1})))
        .await
        .unwrap();
    assert_eq!(s.id, "s1");
    assert_err!(
        store
            .create_session(new_session(USER, Some("s1"), json!({"k": 2})))
            .await,
        StoreError::SessionExists(id) if id == "s1"
    );
    // The failed create left the original untouched.
    assert_eq!(state(&*store, &key(USER, "s1")).await, json!({"k": 1}));
    // Ids are per user: another user may use the same id.
    store
        .create_session(new_session(OTHER_USER, Some("s1"), json!({})))
        .await
        .expect("same id for another user");
}

async fn create_session_splits_initial_state_by_prefix(backend: Backend) {
    let (_db, store) = open(backend).await;
    let initial = json!({"k": "v", "app:theme": "dark", "user:lang": "en", "temp:scratch": 1});
    let s = store
        .create_session(new_session(USER, Some("s1"), initial))
        .await
        .unwrap();
    let expected = obj(json!({"k": "v", "app:theme": "dark", "user:lang": "en"}));
    assert_eq!(s.state, expected, "temp: keys are dropped");
    assert_eq!(
        state(&*store, &key(USER, "s1")).await,
        Value::Object(expected)
    );

    let same_user = create(&*store, USER, "s2", json!({})).await;
    assert_eq!(
        state(&*store, &same_user).await,
        json!({"app:theme": "dark", "user:lang": "en"})
    );
    let other_user = create(&*store, OTHER_USER, "s3", json!({})).await;
    assert_eq!(
        state(&*store, &other_user).await,
        json!({"app:theme": "dark"}),
        "user: state is not shared with other users"
    );
    let other_app = store
        .create_session(NewSession {
            app_name: "another_app".into(),
            ..new_session(USER, Some("s4"), json!({}))
        })
        .await
        .unwrap();
    assert!(other_app.state.is_empty(), "app: state is per app");
}

async fn create_session_restores_events_with_seq_ids_and_timestamps(backend: Backend) {
    let (_db, store) = open(backend).await;
    let mut with_id = restored_event(1_000.5);
    with_id.id = "given-id".into();
    let mut new = new_session(USER, Some("s1"), json!({}));
    new.events = vec![restored_event(0.0), with_id, restored_event(2_000.25)];
    let s = store.create_session(new).await.unwrap();

    assert_eq!(s.events.len(), 3);
    assert!(s.events.iter().all(|e| !e.id.is_empty()), "ids filled");
    assert!(s.events[0].timestamp > 0.0, "timestamp filled");
    assert_eq!(s.events[1].id, "given-id");
    assert_eq!(s.last_update_time, 2_000.25, "lastUpdateTime = last event");

    let k = key(USER, "s1");
    let stored = all_stored_events(&*store, &k).await;
    assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    let stored: Vec<Event> = stored.into_iter().map(|e| e.event).collect();
    assert_eq!(stored, s.events);
    assert_eq!(head(&*store, &k).await.last_seq, 3);
    assert_eq!(get(&*store, &k).await, s);
    assert_eq!(append(&*store, &k, json!({})).await.seq, 4);
}

// ---------------------------------------------------------------------------------------
// get_session / session_head
// ---------------------------------------------------------------------------------------

async fn get_session_returns_merged_state_and_events_oldest_first(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({"k": 0})).await;
    let mut appended = vec![];
    for i in 1..=3 {
        let delta = json!({"k": i, "app:a": i, "user:u": i});
        appended.push(append(&*store, &k, delta).await.event);
    }
    let s = get(&*store, &k).await;
    assert_eq!(
        s.events, appended,
        "stored events equal the returned ones, in order"
    );
    assert_eq!(s.state, obj(json!({"k": 3, "app:a": 3, "user:u": 3})));
    assert_eq!(
        (s.id.as_str(), s.app_name.as_str(), s.user_id.as_str()),
        ("s1", APP, USER)
    );
}

async fn get_session_recent_keeps_newest_events(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    let mut ids = vec![];
    for _ in 0..5 {
        ids.push(append(&*store, &k, json!({})).await.event.id);
    }
    let recent = |n| {
        let store = store.clone();
        let k = k.clone();
        async move {
            let s = store.get_session(&k, Some(n)).await.unwrap().unwrap();
            s.events.into_iter().map(|e| e.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(recent(2).await, ids[3..]);
    assert_eq!(recent(5).await, ids);
    assert_eq!(recent(50).await, ids);
    assert!(recent(0).await.is_empty());
}

async fn missing_session_reads_as_none(backend: Backend) {
    let (_db, store) = open(backend).await;
    create(&*store, USER, "s1", json!({})).await;
    for k in [key(USER, "nope"), key(OTHER_USER, "s1")] {
        assert!(store.get_session(&k, None).await.unwrap().is_none());
        assert!(store.session_head(&k).await.unwrap().is_none());
    }
}

async fn session_head_reports_last_seq_and_merged_state(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({"k": 1, "user:u": 1})).await;
    assert_eq!(head(&*store, &k).await.last_seq, 0);
    append(&*store, &k, json!({"app:a": 2})).await;
    let last = append(&*store, &k, json!({})).await;
    let h = head(&*store, &k).await;
    assert_eq!(h.last_seq, 2);
    assert_eq!(h.key, k);
    assert_eq!(h.state, obj(json!({"k": 1, "user:u": 1, "app:a": 2})));
    assert_eq!(h.last_update_time, last.event.timestamp);
}

// ---------------------------------------------------------------------------------------
// append_event
// ---------------------------------------------------------------------------------------

async fn append_event_assigns_gapless_seq(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    let other = create(&*store, USER, "s2", json!({})).await;
    for expected in 1..=5 {
        assert_eq!(append(&*store, &k, json!({})).await.seq, expected);
    }
    assert_eq!(
        append(&*store, &other, json!({})).await.seq,
        1,
        "seq is per session"
    );
    let seqs: Vec<i64> = all_stored_events(&*store, &k)
        .await
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
}

async fn append_event_applies_state_delta_by_prefix(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    let same_user = create(&*store, USER, "s2", json!({})).await;
    let other_user = create(&*store, OTHER_USER, "s3", json!({})).await;
    append(
        &*store,
        &k,
        json!({"k": "v", "app:theme": "dark", "user:lang": "en"}),
    )
    .await;

    assert_eq!(
        state(&*store, &k).await,
        json!({"k": "v", "app:theme": "dark", "user:lang": "en"})
    );
    assert_eq!(
        state(&*store, &same_user).await,
        json!({"app:theme": "dark", "user:lang": "en"})
    );
    assert_eq!(
        state(&*store, &other_user).await,
        json!({"app:theme": "dark"})
    );
}

async fn append_event_drops_temp_keys_from_stored_and_returned_event(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    let returned = append(&*store, &k, json!({"temp:scratch": 1, "k": 2})).await;
    assert_eq!(returned.event.actions.state_delta, obj(json!({"k": 2})));
    let s = get(&*store, &k).await;
    assert_eq!(s.events[0].actions.state_delta, obj(json!({"k": 2})));
    assert_eq!(s.state, obj(json!({"k": 2})));
}

async fn append_event_stores_null_values(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(
        &*store,
        USER,
        "s1",
        json!({"k": 1, "app:a": 1, "user:u": 1}),
    )
    .await;
    append(
        &*store,
        &k,
        json!({"k": null, "app:a": null, "user:u": null}),
    )
    .await;
    assert_eq!(
        state(&*store, &k).await,
        json!({"k": null, "app:a": null, "user:u": null}),
        "null is stored, not a deletion"
    );
}

async fn append_event_overwrites_keys_shallowly(backend: Backend) {
    let (_db, store) = open(backend).await;
    let nested = json!({"x": 1, "y": {"z": 1}});
    let k = create(
        &*store,
        USER,
        "s1",
        json!({"obj": nested, "app:obj": nested, "user:obj": nested, "keep": true}),
    )
    .await;
    let replacement = json!({"y": {"w": 2}});
    let delta = json!({"obj": replacement, "app:obj": replacement, "user:obj": replacement});
    append(&*store, &k, delta).await;
    assert_eq!(
        state(&*store, &k).await,
        json!({
            "obj": replacement, "app:obj": replacement, "user:obj": replacement, "keep": true
        })
    );
}

async fn append_event_sets_last_update_time_and_fills_defaults(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    let ts = agentd::event::now_ts() + 5.0;
    let stored = store
        .append_event(&k, event_at(ts, json!({})), vec![])
        .await
        .unwrap();
    assert_eq!(stored.event.timestamp, ts);
    assert_eq!(get(&*store, &k).await.last_update_time, ts);

    let mut bare = event(json!({}));
    bare.id.clear();
    bare.timestamp = 0.0;
    let stored = store.append_event(&k, bare, vec![]).await.unwrap();
    assert!(!stored.event.id.is_empty(), "id filled");
    assert!(stored.event.timestamp > 0.0, "timestamp filled");
    assert_eq!(
        head(&*store, &k).await.last_update_time,
        stored.event.timestamp
    );
    assert_eq!(get(&*store, &k).await.events[1], stored.event);
}

async fn append_event_to_missing_session_is_not_found(backend: Backend) {
    let (_db, store) = open(backend).await;
    create(&*store, USER, "s1", json!({})).await;
    for k in [key(USER, "nope"), key(OTHER_USER, "s1")] {
        assert_err!(
            store.append_event(&k, event(json!({"k": 1})), vec![]).await,
            StoreError::SessionNotFound
        );
    }
    assert!(store
        .get_session(&key(USER, "nope"), None)
        .await
        .unwrap()
        .is_none());
}

async fn append_event_commits_staged_artifacts_with_the_event(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    let sc = scope(USER, "s1");
    save_text(&*store, &sc, "report.txt", "saved directly").await;

    let mut e = event(json!({}));
    e.actions.artifact_delta.insert("earlier.txt".into(), 7);
    let arts = vec![
        text_write("report.txt", "from the event"),
        text_write("user:avatar.txt", "mine"),
    ];
    let stored = store.append_event(&k, e, arts).await.unwrap();

    let expected: BTreeMap<String, i64> = [
        ("earlier.txt".to_string(), 7),
        ("report.txt".to_string(), 1),
        ("user:avatar.txt".to_string(), 0),
    ]
    .into();
    assert_eq!(stored.event.actions.artifact_delta, expected);
    assert_eq!(
        get(&*store, &k).await.events,
        std::slice::from_ref(&stored.event)
    );
    assert_eq!(
        load_text(&*store, &sc, "report.txt", Some(1))
            .await
            .as_deref(),
        Some("from the event")
    );
    let sibling = scope(USER, "other-session");
    assert_eq!(
        load_text(&*store, &sibling, "user:avatar.txt", None)
            .await
            .as_deref(),
        Some("mine")
    );
    let meta = store
        .artifact_version(&sc, "report.txt", Some(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(meta.create_time, stored.event.timestamp);
}

/// Two stores (two pools, as two replicas would have) append to one session at once.
async fn concurrent_appends_from_two_stores_lose_nothing(backend: Backend) {
    const N: i64 = 100;
    let db = TestDb::new(backend).await;
    let stores = [db.store().await, db.store().await];
    let k = create(&*stores[0], USER, "s1", json!({})).await;

    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let store = stores[(i % 2) as usize].clone();
            let k = k.clone();
            let delta = json!({
                format!("counter_{i}"): i, format!("app:a_{i}"): i, format!("user:u_{i}"): i
            });
            tokio::spawn(async move { store.append_event(&k, event(delta), vec![]).await })
        })
        .collect();
    let mut returned = vec![];
    for t in tasks {
        returned.push(t.await.expect("task").expect("append_event"));
    }

    let mut seqs: Vec<i64> = returned.iter().map(|e| e.seq).collect();
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (1..=N).collect::<Vec<_>>(),
        "seq 1..=N, no duplicate, no gap"
    );

    let stored = all_stored_events(&*stores[1], &k).await;
    assert_eq!(stored.len(), N as usize);
    for r in &returned {
        assert_eq!(
            stored[(r.seq - 1) as usize],
            *r,
            "stored under its returned seq"
        );
    }
    let h = head(&*stores[1], &k).await;
    assert_eq!(h.last_seq, N);
    for i in 0..N {
        for name in [
            format!("counter_{i}"),
            format!("app:a_{i}"),
            format!("user:u_{i}"),
        ] {
            assert_eq!(h.state.get(&name), Some(&json!(i)), "lost update of {name}");
        }
    }
    assert_eq!(h.state.len(), 3 * N as usize);
}

/// Staged `user:` artifacts are shared by all of a user's sessions, so appends in two
/// sessions can race for the next version of the same file; both must commit.
async fn concurrent_appends_staging_one_user_artifact_all_commit(backend: Backend) {
    const PER_SESSION: usize = 10;
    let db = TestDb::new(backend).await;
    let stores = [db.store().await, db.store().await];
    let keys = [
        create(&*stores[0], USER, "s1", json!({})).await,
        create(&*stores[0], USER, "s2", json!({})).await,
    ];

    let tasks: Vec<_> = (0..2 * PER_SESSION)
        .map(|i| {
            let store = stores[i % 2].clone();
            let k = keys[i % 2].clone();
            let arts = vec![text_write("user:shared.txt", &format!("write {i}"))];
            tokio::spawn(async move { store.append_event(&k, event(json!({})), arts).await })
        })
        .collect();
    let mut versions = vec![];
    for t in tasks {
        let stored = t.await.expect("task").expect("append_event with artifact");
        versions.push(stored.event.actions.artifact_delta["user:shared.txt"]);
    }
    versions.sort_unstable();
    let expected: Vec<i64> = (0..2 * PER_SESSION as i64).collect();
    assert_eq!(versions, expected);
    assert_eq!(
        version_numbers(&*stores[0], &scope(USER, "any"), "user:shared.txt").await,
        expected
    );
    for k in &keys {
        assert_eq!(head(&*stores[1], k).await.last_seq, PER_SESSION as i64);
    }
}

// ---------------------------------------------------------------------------------------
// A failed append changes nothing
// ---------------------------------------------------------------------------------------

async fn failed_append_to_missing_session_writes_no_artifacts(backend: Backend) {
    let (_db, store) = open(backend).await;
    let (k, sibling) = populated(&*store).await;
    let gone = key(USER, "gone");
    let before = snapshot(&*store, &[&k, &sibling, &gone]).await;

    let (e, arts) = doomed_append();
    assert_err!(
        store.append_event(&gone, e, arts).await,
        StoreError::SessionNotFound
    );
    assert_eq!(snapshot(&*store, &[&k, &sibling, &gone]).await, before);
    assert_eq!(
        store
            .list_artifact_keys(&ArtifactScope::from(&gone))
            .await
            .unwrap(),
        ["user:profile.txt"],
        "only the user artifact that existed before"
    );
}

async fn failed_append_with_oversize_artifact_changes_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db
        .store_with(StoreLimits {
            max_artifact_bytes: 16,
        })
        .await;
    let (k, sibling) = populated(&*store).await;
    let before = snapshot(&*store, &[&k, &sibling]).await;

    let (e, mut arts) = doomed_append();
    arts.push(text_write("huge.txt", &"x".repeat(17)));
    assert_err!(
        store.append_event(&k, e, arts).await,
        StoreError::ArtifactTooLarge {
            size: 17,
            limit: 16
        }
    );
    assert_eq!(snapshot(&*store, &[&k, &sibling]).await, before);
}

async fn failed_append_with_invalid_artifact_changes_nothing(backend: Backend) {
    let (_db, store) = open(backend).await;
    let (k, sibling) = populated(&*store).await;
    let before = snapshot(&*store, &[&k, &sibling]).await;

    let (e, mut arts) = doomed_append();
    arts.push(ArtifactWrite {
        filename: "empty.bin".into(),
        part: Part::default(),
        custom_metadata: JsonMap::new(),
    });
    assert_err!(
        store.append_event(&k, e, arts).await,
        StoreError::InvalidArtifact(_)
    );
    assert_eq!(snapshot(&*store, &[&k, &sibling]).await, before);
}

/// The database rejects the event row itself, after everything else was written in the
/// same transaction: all of it must roll back.
async fn failed_event_insert_rolls_back_state_and_artifacts(backend: Backend) {
    let (db, store) = open(backend).await;
    let (k, sibling) = populated(&*store).await;
    inject_event_insert_failure(&db).await;
    let before = snapshot(&*store, &[&k, &sibling]).await;

    for with_artifacts in [false, true] {
        let (mut e, arts) = doomed_append();
        e.author = "explode".into();
        let arts = if with_artifacts { arts } else { vec![] };
        assert_err!(
            store.append_event(&k, e, arts).await,
            StoreError::Database(_)
        );
        assert_eq!(snapshot(&*store, &[&k, &sibling]).await, before);
    }
    assert_eq!(
        append(&*store, &k, json!({})).await.seq,
        3,
        "the store still works"
    );
}

/// PostgreSQL's jsonb rejects `\u0000` in the middle of the append transaction (after the
/// staged artifacts were inserted); nothing may remain. SQLite stores it verbatim.
async fn nul_in_state_fails_atomically_or_round_trips(backend: Backend) {
    let (_db, store) = open(backend).await;
    let (k, sibling) = populated(&*store).await;
    let before = snapshot(&*store, &[&k, &sibling]).await;

    let (_, arts) = doomed_append();
    let delta = json!({"app:theme": "light", "user:n": 5, "nul": "a\u{0000}b"});
    let result = store.append_event(&k, event(delta), arts).await;
    match backend {
        Backend::Postgres | Backend::Citus => {
            assert_err!(result, StoreError::Database(_));
            assert_eq!(snapshot(&*store, &[&k, &sibling]).await, before);
        }
        Backend::Sqlite => {
            let stored = result.expect("sqlite stores NUL");
            let s = get(&*store, &k).await;
            assert_eq!(s.state["nul"], json!("a\u{0000}b"));
            assert_eq!(s.events.last(), Some(&stored.event));
        }
    }
}

// ---------------------------------------------------------------------------------------
// list_sessions
// ---------------------------------------------------------------------------------------

async fn list_sessions_orders_by_update_time_then_id(backend: Backend) {
    let (_db, store) = open(backend).await;
    create_at(&*store, USER, "b", 100.0).await;
    create_at(&*store, USER, "a", 100.0).await;
    create_at(&*store, USER, "c", 50.0).await;
    let d = create_at(&*store, USER, "d", 75.0).await;
    assert_eq!(listed_ids(&*store, USER).await, ["c", "d", "a", "b"]);

    store
        .append_event(&d, event_at(300.0, json!({})), vec![])
        .await
        .unwrap();
    assert_eq!(
        listed_ids(&*store, USER).await,
        ["c", "a", "b", "d"],
        "an append moves the session to the end"
    );
}

async fn list_sessions_returns_merged_state_without_events(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({"k": 1, "user:lang": "en"})).await;
    append(&*store, &k, json!({"k": 2})).await;
    create(&*store, OTHER_USER, "x", json!({"app:theme": "dark"})).await;

    let page = store.list_sessions(APP, USER, None, 10).await.unwrap();
    assert_eq!(page.next, None);
    let [s] = page.sessions.as_slice() else {
        panic!("one session expected, got {:?}", page.sessions)
    };
    assert!(s.events.is_empty());
    assert_eq!(
        s.state,
        obj(json!({"k": 2, "user:lang": "en", "app:theme": "dark"}))
    );
    assert_eq!(
        *s,
        Session {
            events: vec![],
            ..get(&*store, &k).await
        }
    );
}

async fn list_sessions_excludes_other_users_apps_and_eval_sessions(backend: Backend) {
    let (_db, store) = open(backend).await;
    for id in [
        "mine",
        "adk-eval-session-1",
        "___eval___session___2",
        "XYZevalXYZsessionXYZ3",
    ] {
        create(&*store, USER, id, json!({})).await;
    }
    create(&*store, OTHER_USER, "theirs", json!({})).await;
    store
        .create_session(NewSession {
            app_name: "another_app".into(),
            ..new_session(USER, Some("elsewhere"), json!({}))
        })
        .await
        .unwrap();

    let mut ids = listed_ids(&*store, USER).await;
    ids.sort();
    assert_eq!(ids, ["XYZevalXYZsessionXYZ3", "mine"]);
    assert_eq!(listed_ids(&*store, OTHER_USER).await, ["theirs"]);
    assert!(listed_ids(&*store, "nobody").await.is_empty());
}

async fn list_sessions_pages_with_keyset_cursor(backend: Backend) {
    let (_db, store) = open(backend).await;
    // Ties in update time, so the cursor must use the id too.
    for (id, t) in [
        ("e", 3.0),
        ("a", 1.0),
        ("c", 2.0),
        ("b", 2.0),
        ("g", 2.0),
        ("f", 3.0),
        ("d", 0.5),
    ] {
        create_at(&*store, USER, id, t).await;
    }
    create_at(&*store, OTHER_USER, "zz", 2.0).await;
    let everything = listed_ids(&*store, USER).await;
    assert_eq!(everything, ["d", "a", "b", "c", "g", "e", "f"]);

    for limit in [1, 2, 3, 7, 8] {
        let mut seen = vec![];
        let mut cursor: Option<SessionCursor> = None;
        let mut pages = 0;
        loop {
            let page = store
                .list_sessions(APP, USER, cursor.as_ref(), limit)
                .await
                .unwrap();
            pages += 1;
            assert!(page.sessions.len() <= limit as usize);
            seen.extend(page.sessions.iter().map(|s| s.id.clone()));
            if let Some(next) = &page.next {
                let last = page
                    .sessions
                    .last()
                    .expect("a page with a cursor is not empty");
                assert_eq!(
                    (next.update_time, &next.id),
                    (last.last_update_time, &last.id)
                );
            }
            cursor = page.next;
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(
            seen, everything,
            "limit {limit}: every session exactly once, in order"
        );
        assert_eq!(
            pages,
            everything.len().div_ceil(limit as usize),
            "limit {limit}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// delete_session
// ---------------------------------------------------------------------------------------

async fn delete_session_reports_whether_it_existed(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    let other = create(&*store, OTHER_USER, "s1", json!({})).await;
    assert!(store.delete_session(&k).await.unwrap());
    assert!(!store.delete_session(&k).await.unwrap());
    assert!(!store.delete_session(&key(USER, "never")).await.unwrap());
    assert!(store.get_session(&k, None).await.unwrap().is_none());
    assert!(
        store.get_session(&other, None).await.unwrap().is_some(),
        "per user"
    );
}

async fn delete_session_removes_events_and_session_artifacts_keeps_user_artifacts(
    backend: Backend,
) {
    let (_db, store) = open(backend).await;
    let (k, sibling) = populated(&*store).await;
    let sc = ArtifactScope::from(&k);
    save_text(&*store, &sc, "notes.txt", "v1").await;
    let sibling_before = snapshot(&*store, &[&sibling]).await;

    assert!(store.delete_session(&k).await.unwrap());
    assert!(store
        .list_events(&k, EventRange::default())
        .await
        .unwrap()
        .is_none());
    assert!(store
        .list_artifact_versions(&sc, "notes.txt")
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.list_artifact_keys(&sc).await.unwrap(),
        ["user:profile.txt"]
    );
    assert_eq!(
        load_text(&*store, &sc, "user:profile.txt", None)
            .await
            .as_deref(),
        Some("v0")
    );
    assert_eq!(snapshot(&*store, &[&sibling]).await, sibling_before);
}

async fn recreated_session_starts_fresh(backend: Backend) {
    let (_db, store) = open(backend).await;
    let (k, _) = populated(&*store).await;
    assert!(store.delete_session(&k).await.unwrap());

    let s = store
        .create_session(new_session(USER, Some("s1"), json!({})))
        .await
        .unwrap();
    assert!(s.events.is_empty());
    assert!(!s.state.contains_key("k"), "old session state is gone");
    assert_eq!(
        s.state["user:n"],
        json!(1),
        "user: state outlives the session"
    );
    assert_eq!(head(&*store, &k).await.last_seq, 0);
    assert_eq!(append(&*store, &k, json!({})).await.seq, 1);
    assert_eq!(get(&*store, &k).await.events.len(), 1);
    assert_eq!(
        store
            .list_artifact_keys(&ArtifactScope::from(&k))
            .await
            .unwrap(),
        ["user:profile.txt"]
    );
}

// ---------------------------------------------------------------------------------------
// list_events
// ---------------------------------------------------------------------------------------

async fn with_ten_events(store: &dyn Store) -> SessionKey {
    let k = create(store, USER, "s1", json!({})).await;
    for _ in 0..10 {
        append(store, &k, json!({})).await;
    }
    k
}

async fn list_events_pages_forward_after(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = with_ten_events(&*store).await;
    let s = &*store;
    assert_eq!(
        events_page(s, &k, None, None, 4).await,
        (vec![1, 2, 3, 4], true)
    );
    assert_eq!(
        events_page(s, &k, Some(4), None, 4).await,
        (vec![5, 6, 7, 8], true)
    );
    assert_eq!(
        events_page(s, &k, Some(8), None, 4).await,
        (vec![9, 10], false)
    );
    assert!(
        !events_page(s, &k, None, None, 10).await.1,
        "exactly the rest"
    );
    assert_eq!(events_page(s, &k, Some(10), None, 4).await, (vec![], false));

    let page = store
        .list_events(
            &k,
            EventRange {
                after: Some(2),
                before: None,
                limit: 1,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        page.events[0].event,
        get(s, &k).await.events[2],
        "seq 3 is the 3rd event"
    );
}

async fn list_events_pages_backward_before(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = with_ten_events(&*store).await;
    let s = &*store;
    assert_eq!(
        events_page(s, &k, None, Some(11), 4).await,
        (vec![7, 8, 9, 10], true)
    );
    assert_eq!(
        events_page(s, &k, None, Some(7), 4).await,
        (vec![3, 4, 5, 6], true)
    );
    assert_eq!(
        events_page(s, &k, None, Some(3), 4).await,
        (vec![1, 2], false)
    );
    assert_eq!(events_page(s, &k, None, Some(1), 4).await, (vec![], false));
    assert_eq!(
        events_page(s, &k, Some(2), Some(9), 10).await,
        (vec![3, 4, 5, 6, 7, 8], false)
    );
    assert_eq!(
        events_page(s, &k, Some(2), Some(9), 3).await,
        (vec![6, 7, 8], true)
    );
}

async fn list_events_of_missing_or_empty_session(backend: Backend) {
    let (_db, store) = open(backend).await;
    let k = create(&*store, USER, "s1", json!({})).await;
    assert_eq!(
        events_page(&*store, &k, None, None, 10).await,
        (vec![], false)
    );
    assert_eq!(
        events_page(&*store, &k, None, Some(5), 10).await,
        (vec![], false)
    );
    for missing in [key(USER, "nope"), key(OTHER_USER, "s1")] {
        let range = EventRange {
            limit: 10,
            ..Default::default()
        };
        assert!(store.list_events(&missing, range).await.unwrap().is_none());
    }
}

// ---------------------------------------------------------------------------------------
// Artifacts
// ---------------------------------------------------------------------------------------

async fn artifact_versions_count_from_zero(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    for expected in 0..3 {
        assert_eq!(
            save_text(&*store, &sc, "a.txt", &format!("v{expected}")).await,
            expected
        );
    }
    assert_eq!(
        save_text(&*store, &sc, "b.txt", "other").await,
        0,
        "per filename"
    );
    assert_eq!(
        save_text(&*store, &scope(USER, "s2"), "a.txt", "other").await,
        0,
        "per session"
    );
    assert_eq!(version_numbers(&*store, &sc, "a.txt").await, [0, 1, 2]);
}

async fn load_artifact_latest_by_version_and_missing(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    for v in ["first", "second", "third"] {
        save_text(&*store, &sc, "a.txt", v).await;
    }
    let s = &*store;
    assert_eq!(
        load_text(s, &sc, "a.txt", None).await.as_deref(),
        Some("third")
    );
    assert_eq!(
        load_text(s, &sc, "a.txt", Some(0)).await.as_deref(),
        Some("first")
    );
    assert_eq!(
        load_text(s, &sc, "a.txt", Some(1)).await.as_deref(),
        Some("second")
    );
    assert_eq!(load_text(s, &sc, "a.txt", Some(3)).await, None);
    assert_eq!(load_text(s, &sc, "a.txt", Some(-1)).await, None);
    assert_eq!(load_text(s, &sc, "missing.txt", None).await, None);
    assert_eq!(load_text(s, &scope(USER, "s2"), "a.txt", None).await, None);
}

async fn artifact_version_metadata_and_canonical_uris(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    let saved = store
        .save_artifact(&sc, text_write("dir/a.txt", "x"))
        .await
        .unwrap();
    save_text(&*store, &sc, "dir/a.txt", "y").await;
    assert_eq!(
        saved.canonical_uri,
        format!("agentd://apps/{APP}/users/{USER}/sessions/s1/artifacts/dir/a.txt/versions/0")
    );
    assert!(saved.create_time > 0.0);
    let meta = |version| {
        let store = store.clone();
        let sc = sc.clone();
        async move {
            store
                .artifact_version(&sc, "dir/a.txt", version)
                .await
                .unwrap()
        }
    };
    assert_eq!(meta(Some(0)).await, Some(saved.clone()));
    assert_eq!(meta(None).await.map(|m| m.version), Some(1));
    assert_eq!(meta(Some(5)).await, None);
    assert_eq!(
        store
            .list_artifact_versions(&sc, "dir/a.txt")
            .await
            .unwrap()[0],
        saved
    );

    let user_saved = store
        .save_artifact(&sc, text_write("user:u.txt", "x"))
        .await
        .unwrap();
    assert_eq!(
        user_saved.canonical_uri,
        format!("agentd://apps/{APP}/users/{USER}/artifacts/user:u.txt/versions/0")
    );
}

async fn inline_bytes_round_trip_exactly(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    let mut bytes: Vec<u8> = (0..=255u8).collect();
    bytes.extend_from_slice(&[0xC3, 0x28, 0xFF, 0xFE, 0x00, 0x80]);
    let mut part = blob_part(&bytes, "application/octet-stream");
    part.inline_data.as_mut().unwrap().display_name = Some("raw.bin".into());
    part.extra.insert("videoMetadata".into(), json!({"fps": 2}));
    let empty = blob_part(&[], "application/x-empty");

    for (name, part) in [("raw.bin", part), ("empty.bin", empty)] {
        let write = ArtifactWrite {
            filename: name.into(),
            part: part.clone(),
            custom_metadata: JsonMap::new(),
        };
        let saved = store.save_artifact(&sc, write).await.unwrap();
        let mime = part.inline_data.as_ref().unwrap().mime_type.clone();
        assert_eq!(saved.mime_type, mime);
        let loaded = store.load_artifact(&sc, name, None).await.unwrap();
        assert_eq!(loaded, Some(part), "{name} round-trips exactly");
        let listed = store.list_artifact_versions(&sc, name).await.unwrap();
        assert_eq!(listed[0].mime_type, mime);
    }
}

async fn artifact_mime_types_follow_the_part(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    let file_data = Part {
        extra: obj(json!({"fileData": {"fileUri": "gs://b/o.png", "mimeType": "image/png"}})),
        ..Default::default()
    };
    let cases = [
        ("t.txt", Part::text("héllo wörld"), Some("text/plain")),
        (
            "p.png",
            blob_part(b"\x89PNG", "image/png"),
            Some("image/png"),
        ),
        ("f.png", file_data, Some("image/png")),
    ];
    for (name, part, mime) in cases {
        let write = ArtifactWrite {
            filename: name.into(),
            part: part.clone(),
            custom_metadata: JsonMap::new(),
        };
        let saved = store.save_artifact(&sc, write).await.unwrap();
        assert_eq!(saved.mime_type.as_deref(), mime, "{name}");
        let stored = store
            .artifact_version(&sc, name, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.mime_type.as_deref(), mime, "{name}");
        assert_eq!(
            store.load_artifact(&sc, name, None).await.unwrap(),
            Some(part)
        );
    }
}

async fn artifact_custom_metadata_round_trips(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    let metadata = obj(json!({"source": "tool", "n": 3, "nested": {"a": [1, null, "x"]}}));
    let write = ArtifactWrite {
        custom_metadata: metadata.clone(),
        ..text_write("a.txt", "x")
    };
    let saved = store.save_artifact(&sc, write).await.unwrap();
    assert_eq!(saved.custom_metadata, metadata);
    save_text(&*store, &sc, "a.txt", "y").await;
    let versions = store.list_artifact_versions(&sc, "a.txt").await.unwrap();
    assert_eq!(versions[0].custom_metadata, metadata);
    assert!(versions[1].custom_metadata.is_empty());
    let v0 = store.artifact_version(&sc, "a.txt", Some(0)).await.unwrap();
    assert_eq!(v0.unwrap().custom_metadata, metadata);
}

async fn list_artifact_keys_sorted_with_user_artifacts(backend: Backend) {
    let (_db, store) = open(backend).await;
    let s1 = scope(USER, "s1");
    let s2 = scope(USER, "s2");
    for name in ["zeta.txt", "alpha.txt", "dir/b.txt", "alpha.txt"] {
        save_text(&*store, &s1, name, "x").await;
    }
    save_text(&*store, &s2, "user:prefs.json", "x").await;
    save_text(&*store, &s2, "only-in-s2.txt", "x").await;

    assert_eq!(
        store.list_artifact_keys(&s1).await.unwrap(),
        ["alpha.txt", "dir/b.txt", "user:prefs.json", "zeta.txt"]
    );
    assert_eq!(
        store
            .list_artifact_keys(&scope(USER, "fresh"))
            .await
            .unwrap(),
        ["user:prefs.json"]
    );
    assert_eq!(
        load_text(&*store, &s1, "user:prefs.json", None)
            .await
            .as_deref(),
        Some("x")
    );
    assert_eq!(
        save_text(&*store, &s1, "user:prefs.json", "y").await,
        1,
        "one file"
    );
}

async fn user_artifacts_are_invisible_to_other_users(backend: Backend) {
    let (_db, store) = open(backend).await;
    save_text(&*store, &scope(USER, "s1"), "user:secret.txt", "mine").await;
    save_text(&*store, &scope(USER, "s1"), "session.txt", "mine").await;
    let theirs = scope(OTHER_USER, "s1");
    assert!(store.list_artifact_keys(&theirs).await.unwrap().is_empty());
    assert_eq!(
        load_text(&*store, &theirs, "user:secret.txt", None).await,
        None
    );
    assert!(version_numbers(&*store, &theirs, "user:secret.txt")
        .await
        .is_empty());
    assert_eq!(
        save_text(&*store, &theirs, "user:secret.txt", "theirs").await,
        0
    );
    let other_app = ArtifactScope::new("another_app", USER, "s1");
    assert!(store
        .list_artifact_keys(&other_app)
        .await
        .unwrap()
        .is_empty());
}

async fn missing_artifact_has_no_versions(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    assert!(version_numbers(&*store, &sc, "nothing.txt")
        .await
        .is_empty());
    assert!(version_numbers(&*store, &sc, "user:nothing.txt")
        .await
        .is_empty());
    assert!(store.list_artifact_keys(&sc).await.unwrap().is_empty());
    assert_eq!(
        store
            .artifact_version(&sc, "nothing.txt", None)
            .await
            .unwrap(),
        None
    );
}

async fn delete_artifact_removes_every_version(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    for name in ["a.txt", "user:u.txt"] {
        save_text(&*store, &sc, name, "v0").await;
        save_text(&*store, &sc, name, "v1").await;
    }
    save_text(&*store, &sc, "keep.txt", "x").await;
    save_text(&*store, &scope(USER, "s2"), "a.txt", "other session").await;

    for name in ["a.txt", "user:u.txt"] {
        store.delete_artifact(&sc, name).await.unwrap();
        assert!(version_numbers(&*store, &sc, name).await.is_empty());
        assert_eq!(load_text(&*store, &sc, name, Some(0)).await, None);
    }
    assert_eq!(store.list_artifact_keys(&sc).await.unwrap(), ["keep.txt"]);
    assert_eq!(
        version_numbers(&*store, &scope(USER, "s2"), "a.txt").await,
        [0]
    );
    store
        .delete_artifact(&sc, "never-existed.txt")
        .await
        .expect("deleting nothing is Ok");
    assert_eq!(
        save_text(&*store, &sc, "a.txt", "again").await,
        0,
        "starts over"
    );
}

async fn artifact_over_the_limit_is_rejected(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db
        .store_with(StoreLimits {
            max_artifact_bytes: 10,
        })
        .await;
    let sc = scope(USER, "s1");
    assert_eq!(save_text(&*store, &sc, "ok.txt", &"x".repeat(10)).await, 0);
    assert_err!(
        store
            .save_artifact(&sc, text_write("big.txt", &"x".repeat(11)))
            .await,
        StoreError::ArtifactTooLarge {
            size: 11,
            limit: 10
        }
    );
    let blob = ArtifactWrite {
        filename: "big.bin".into(),
        part: blob_part(&[0u8; 11], "application/octet-stream"),
        custom_metadata: JsonMap::new(),
    };
    assert_err!(
        store.save_artifact(&sc, blob).await,
        StoreError::ArtifactTooLarge {
            size: 11,
            limit: 10
        }
    );
    assert_eq!(store.list_artifact_keys(&sc).await.unwrap(), ["ok.txt"]);
}

async fn invalid_artifacts_are_rejected(backend: Backend) {
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    let invalid = [
        ArtifactWrite {
            part: Part::default(),
            ..text_write("empty.txt", "")
        },
        text_write("", "no name"),
        text_write("nul\0.txt", "x"),
    ];
    for write in invalid {
        assert_err!(
            store.save_artifact(&sc, write).await,
            StoreError::InvalidArtifact(_)
        );
    }
    assert!(store.list_artifact_keys(&sc).await.unwrap().is_empty());
}

async fn concurrent_artifact_saves_get_consecutive_versions(backend: Backend) {
    const TASKS: i64 = 8;
    let (_db, store) = open(backend).await;
    let sc = scope(USER, "s1");
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let store = store.clone();
            let sc = sc.clone();
            tokio::spawn(async move {
                let text = format!("task {i}");
                let saved = store
                    .save_artifact(&sc, text_write("shared.txt", &text))
                    .await;
                (saved.expect("save_artifact").version, text)
            })
        })
        .collect();
    let mut saved = vec![];
    for t in tasks {
        saved.push(t.await.expect("task"));
    }
    saved.sort();
    let versions: Vec<i64> = saved.iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, (0..TASKS).collect::<Vec<_>>());
    for (version, text) in &saved {
        let loaded = load_text(&*store, &sc, "shared.txt", Some(*version)).await;
        assert_eq!(
            loaded.as_ref(),
            Some(text),
            "version {version} holds its own write"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Unknown fields
// ---------------------------------------------------------------------------------------

async fn unknown_event_fields_round_trip(backend: Backend) {
    let (_db, store) = open(backend).await;
    let raw = json!({
        "invocationId": "e-1", "author": "agent", "id": "ev-1", "timestamp": 1234.5,
        "groundingMetadata": {"chunks": [{"web": {"uri": "https://x"}}]},
        "outputTranscription": {"text": "hi", "finished": true},
        "content": {"role": "model", "parts": [{"text": "hi", "videoMetadata": {"fps": 2}}],
                    "futureContentField": 1},
        "actions": {"stateDelta": {"k": 1}, "compaction": {"startTimestamp": 1.0}}
    });
    let original: Event = serde_json::from_value(raw.clone()).unwrap();
    assert!(original.extra.contains_key("groundingMetadata"));

    let mut new = new_session(USER, Some("restored"), json!({}));
    new.events = vec![original.clone()];
    store.create_session(new).await.unwrap();
    let k = create(&*store, USER, "s1", json!({})).await;
    let appended = store
        .append_event(&k, original.clone(), vec![])
        .await
        .unwrap();
    assert_eq!(appended.event, original);

    for k in [key(USER, "restored"), k] {
        let s = get(&*store, &k).await;
        assert_eq!(s.events, std::slice::from_ref(&original));
        let wire = serde_json::to_value(&s.events[0]).unwrap();
        for field in ["groundingMetadata", "outputTranscription"] {
            assert_eq!(wire[field], raw[field], "{field}");
        }
        assert_eq!(
            wire["content"]["parts"][0]["videoMetadata"],
            json!({"fps": 2})
        );
        assert_eq!(wire["content"]["futureContentField"], json!(1));
        assert_eq!(wire["actions"]["compaction"], raw["actions"]["compaction"]);
    }
}

both_backends!(
    create_session_generates_uuid_id,
    create_session_with_given_id_rejects_duplicates,
    create_session_splits_initial_state_by_prefix,
    create_session_restores_events_with_seq_ids_and_timestamps,
    get_session_returns_merged_state_and_events_oldest_first,
    get_session_recent_keeps_newest_events,
    missing_session_reads_as_none,
    session_head_reports_last_seq_and_merged_state,
    append_event_assigns_gapless_seq,
    append_event_applies_state_delta_by_prefix,
    append_event_drops_temp_keys_from_stored_and_returned_event,
    append_event_stores_null_values,
    append_event_overwrites_keys_shallowly,
    append_event_sets_last_update_time_and_fills_defaults,
    append_event_to_missing_session_is_not_found,
    append_event_commits_staged_artifacts_with_the_event,
    concurrent_appends_from_two_stores_lose_nothing,
    concurrent_appends_staging_one_user_artifact_all_commit,
    failed_append_to_missing_session_writes_no_artifacts,
    failed_append_with_oversize_artifact_changes_nothing,
    failed_append_with_invalid_artifact_changes_nothing,
    failed_event_insert_rolls_back_state_and_artifacts,
    nul_in_state_fails_atomically_or_round_trips,
    list_sessions_orders_by_update_time_then_id,
    list_sessions_returns_merged_state_without_events,
    list_sessions_excludes_other_users_apps_and_eval_sessions,
    list_sessions_pages_with_keyset_cursor,
    delete_session_reports_whether_it_existed,
    delete_session_removes_events_and_session_artifacts_keeps_user_artifacts,
    recreated_session_starts_fresh,
    list_events_pages_forward_after,
    list_events_pages_backward_before,
    list_events_of_missing_or_empty_session,
    artifact_versions_count_from_zero,
    load_artifact_latest_by_version_and_missing,
    artifact_version_metadata_and_canonical_uris,
    inline_bytes_round_trip_exactly,
    artifact_mime_types_follow_the_part,
    artifact_custom_metadata_round_trips,
    list_artifact_keys_sorted_with_user_artifacts,
    user_artifacts_are_invisible_to_other_users,
    missing_artifact_has_no_versions,
    delete_artifact_removes_every_version,
    artifact_over_the_limit_is_rejected,
    invalid_artifacts_are_rejected,
    concurrent_artifact_saves_get_consecutive_versions,
    unknown_event_fields_round_trip,
);
