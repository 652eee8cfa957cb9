//! `append_event`: gapless `seq`, state deltas by prefix, staged artifacts, concurrent appends.

use super::*;
use crate::both_backends;
use std::collections::BTreeMap;

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

both_backends!(
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
);
