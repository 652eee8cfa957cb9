//! Artifacts: versions, metadata and URIs, bytes and MIME types, scopes, limits, concurrent saves.

use super::*;
use crate::both_backends;
use agentd::event::{Blob, Bytes64};

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

/// Saving to a session that does not exist (never made, or deleted) is refused, for a
/// session's artifact and a `user:` one alike, and stores nothing.
async fn save_artifact_to_a_missing_session_is_not_found(backend: Backend) {
    let (_db, store) = open(backend).await;
    for name in ["a.txt", "user:u.txt"] {
        let refused = store
            .save_artifact(&scope(USER, "ghost"), text_write(name, "x"))
            .await;
        assert!(
            matches!(refused, Err(StoreError::SessionNotFound)),
            "{name}: {refused:?}"
        );
    }
    let k = create(&*store, USER, "gone", json!({})).await;
    save_text(&*store, &scope(USER, "gone"), "a.txt", "kept").await;
    store.delete_session(&k).await.expect("delete");
    let refused = store
        .save_artifact(&scope(USER, "gone"), text_write("a.txt", "late"))
        .await;
    assert!(
        matches!(refused, Err(StoreError::SessionNotFound)),
        "{refused:?}"
    );
    // Re-created under the same id, the session has no artifact.
    create(&*store, USER, "gone", json!({})).await;
    let keys = store
        .list_artifact_keys(&scope(USER, "gone"))
        .await
        .expect("keys");
    assert!(keys.is_empty(), "{keys:?}");
    let user_keys = store
        .list_artifact_keys(&scope(USER, "fresh-one"))
        .await
        .expect("keys");
    assert!(
        !user_keys.iter().any(|k| k == "user:u.txt"),
        "{user_keys:?}"
    );
}

async fn artifact_versions_count_from_zero(backend: Backend) {
    let (_db, store) = open(backend).await;
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
            ..StoreLimits::default()
        })
        .await;
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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
    artifact_sessions(&*store).await;
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

both_backends!(
    save_artifact_to_a_missing_session_is_not_found,
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
);
