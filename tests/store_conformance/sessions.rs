//! Sessions: create (state by prefix, restored events), get, head, list with keyset paging, delete.

use super::*;
use crate::both_backends;
use agentd::store::SessionCursor;

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

async fn listed_ids(store: &dyn Store, user: &str) -> Vec<String> {
    let page = store
        .list_sessions(APP, user, None, 1000)
        .await
        .expect("list_sessions");
    page.sessions.into_iter().map(|s| s.id).collect()
}

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

both_backends!(
    create_session_generates_uuid_id,
    create_session_with_given_id_rejects_duplicates,
    create_session_splits_initial_state_by_prefix,
    create_session_restores_events_with_seq_ids_and_timestamps,
    get_session_returns_merged_state_and_events_oldest_first,
    get_session_recent_keeps_newest_events,
    missing_session_reads_as_none,
    session_head_reports_last_seq_and_merged_state,
    list_sessions_orders_by_update_time_then_id,
    list_sessions_returns_merged_state_without_events,
    list_sessions_excludes_other_users_apps_and_eval_sessions,
    list_sessions_pages_with_keyset_cursor,
    delete_session_reports_whether_it_existed,
    delete_session_removes_events_and_session_artifacts_keeps_user_artifacts,
    recreated_session_starts_fresh,
);
