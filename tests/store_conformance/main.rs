//! One behaviour suite for the `SessionStore`, `ArtifactStore` and `EvalRunStore` traits, run
//! against both backends (`<test>::postgres` and `<test>::sqlite`, and Citus). Every test gets
//! a fresh database.
//!
//! What is checked is what callers rely on: ADK state-prefix semantics, gapless `seq`,
//! all-or-nothing appends (including under concurrency and injected failures), ADK list
//! order and keyset paging, and artifact versioning and scoping.

#[path = "../common/mod.rs"]
mod common;

use agentd::event::{Content, Event, JsonMap, Part, Session};
use agentd::store::{
    ArtifactScope, ArtifactVersion, ArtifactWrite, EventRange, NewSession, SessionHead, SessionKey,
    Store, StoreError, StoreLimits, StoredEvent,
};
use common::{Backend, TestDb};
use serde_json::{json, Value};
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

// After `assert_err!`: a `macro_rules!` macro is in scope only in the modules declared after it.
mod appends;
mod artifacts;
mod eval_runs;
mod events;
mod failed_appends;
mod sessions;

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

/// The sessions the artifact tests save through (an artifact needs its session).
async fn artifact_sessions(store: &dyn Store) {
    for (user, id) in [
        (USER, "s1"),
        (USER, "s2"),
        (USER, "other-session"),
        (USER, "any"),
        (OTHER_USER, "s1"),
    ] {
        create(store, user, id, json!({})).await;
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
