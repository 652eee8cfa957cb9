//! A failed append changes nothing: no event, no state, no artifact.

use super::*;
use crate::both_backends;

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
            ..StoreLimits::default()
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

both_backends!(
    failed_append_to_missing_session_writes_no_artifacts,
    failed_append_with_oversize_artifact_changes_nothing,
    failed_append_with_invalid_artifact_changes_nothing,
    failed_event_insert_rolls_back_state_and_artifacts,
    nul_in_state_fails_atomically_or_round_trips,
);
