//! Run ownership at the store: a fenced run cannot write; admission and the last event commit.

use super::*;
use crate::both_backends;
use agentd::event::Event;
use agentd::runner::{claim, Claim};
use agentd::store::{Fence, NewRun, RunStatus, SessionKey, StoreError};

/// A store with session `app`/`USER`/`s1` and this initial state, for the store-level tests.
async fn store_with_session(
    backend: Backend,
    state: Value,
) -> (TestDb, Arc<dyn agentd::store::Store>, SessionKey) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .create_session(agentd::store::NewSession {
            app_name: "app".into(),
            user_id: USER.into(),
            session_id: Some("s1".into()),
            state: serde_json::from_value(state).unwrap(),
            ..Default::default()
        })
        .await
        .unwrap();
    (db, store, SessionKey::new("app", USER, "s1"))
}

/// Run `id` (invocation `e-<id>`) of `owner` with a user message, committed by admission if
/// `opening` carries it.
fn new_run(key: &SessionKey, id: &str, owner: &str, opening: Option<Event>) -> NewRun {
    NewRun {
        run_id: id.into(),
        key: key.clone(),
        invocation_id: format!("e-{id}"),
        owner: owner.into(),
        user_event: true,
        queue_ttl: Duration::from_secs(60),
        opening,
        webhooks: None,
        durable: None,
        api_key: None,
    }
}

/// Ownership is a database fact: a run that lost its session (taken over after its replica
/// stopped heartbeating) can neither commit into it nor record an outcome over the new owner.
async fn a_run_that_lost_its_session_cannot_write_into_it(backend: Backend) {
    let (_db, store, key) = store_with_session(backend, json!({})).await;
    let run = |id: &str, owner: &str| new_run(&key, id, owner, None);
    // `stalled` never heartbeats: to everyone else it is dead.
    assert!(matches!(
        claim(store.as_ref(), &run("old", "stalled"), None)
            .await
            .unwrap(),
        Claim::Acquired { .. }
    ));
    store
        .heartbeat("live", Duration::from_secs(10), false, false)
        .await
        .unwrap();
    assert!(matches!(
        claim(store.as_ref(), &run("new", "live"), None)
            .await
            .unwrap(),
        Claim::Acquired { .. }
    ));

    let stale = Event::new("e-old", "agent");
    let refused = store
        .append_fenced(&key, stale, vec![], Fence::Run("old", 0))
        .await;
    assert!(matches!(refused, Err(StoreError::NotOwner)), "{refused:?}");
    let ok = store
        .append_fenced(
            &key,
            Event::new("e-new", "agent"),
            vec![],
            Fence::Run("new", 0),
        )
        .await
        .unwrap();
    assert_eq!(ok.seq, 1, "the refused append left no trace");
    assert!(
        !store
            .finish_run(&key.user_id, "old", 0, RunStatus::Cancelled, None, None)
            .await
            .unwrap(),
        "the old run cannot record an outcome"
    );
    let old = store.get_run("old").await.unwrap().unwrap();
    assert_eq!(old.status, RunStatus::Abandoned);
    // An append is idempotent on the event id (how a lost acknowledgement is resolved).
    let again = store
        .append_fenced(&key, ok.event.clone(), vec![], Fence::Run("new", 0))
        .await
        .unwrap();
    assert_eq!(again.seq, 1);
    let page = store
        .list_events(
            &key,
            agentd::store::EventRange {
                after: None,
                before: None,
                limit: 10,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(page.events.len(), 1, "stored once");
    assert!(store
        .finish_run(&key.user_id, "new", 0, RunStatus::Completed, Some(1), None)
        .await
        .unwrap());
    assert!(store.active_run(&key).await.unwrap().is_none());

    // The abandoned `old` still awaits sealing; deleting the session takes its runs along, so
    // a session re-created under the same id inherits nothing.
    assert!(matches!(
        claim(store.as_ref(), &run("probe", "live"), None)
            .await
            .unwrap(),
        Claim::Acquired { unsealed: true, .. }
    ));
    assert!(store.delete_session(&key).await.unwrap());
    assert!(store.get_run("old").await.unwrap().is_none());
    store
        .create_session(agentd::store::NewSession {
            app_name: "app".into(),
            user_id: USER.into(),
            session_id: Some("s1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(matches!(
        claim(store.as_ref(), &run("fresh", "live"), None)
            .await
            .unwrap(),
        Claim::Acquired {
            unsealed: false,
            ..
        }
    ));
}

/// The run's last write can record its outcome ([`Fence::RunEnd`]): the event, the run's
/// `completed` status with that seq and the freed session commit together, and only while the
/// run owns the session.
async fn a_run_s_last_event_records_its_outcome(backend: Backend) {
    let (_db, store, key) = store_with_session(backend, json!({})).await;
    store
        .heartbeat("live", Duration::from_secs(10), false, false)
        .await
        .unwrap();
    assert!(matches!(
        claim(store.as_ref(), &new_run(&key, "r1", "live", None), None)
            .await
            .unwrap(),
        Claim::Acquired { .. }
    ));
    let mut reply = Event::new("e-r1", "agent");
    reply.actions.state_delta.insert("k".into(), json!(1));
    let stored = store
        .append_fenced(&key, reply, vec![], Fence::RunEnd("r1", 0))
        .await
        .unwrap();
    assert_eq!(stored.seq, 1);
    let run = store.get_run("r1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.last_seq, Some(1));
    assert!(store.active_run(&key).await.unwrap().is_none());
    assert_eq!(
        store.session_head(&key).await.unwrap().unwrap().state["k"],
        1
    );
    // Finished: the run owns nothing, so neither kind of write goes in.
    for fence in [Fence::RunEnd("r1", 0), Fence::Run("r1", 0)] {
        let late = store
            .append_fenced(&key, Event::new("e-r1", "agent"), vec![], fence)
            .await;
        assert!(matches!(late, Err(StoreError::NotOwner)), "{late:?}");
    }
    assert_eq!(store.session_head(&key).await.unwrap().unwrap().last_seq, 1);
    assert!(
        !store
            .finish_run(&key.user_id, "r1", 0, RunStatus::Failed, None, None)
            .await
            .unwrap(),
        "the outcome is recorded once"
    );

    // An event already stored (reported twice) is returned as stored and ends nothing: its
    // seq is not past the run's last one, so the runner records the outcome on its own.
    assert!(matches!(
        claim(store.as_ref(), &new_run(&key, "r2", "live", None), None)
            .await
            .unwrap(),
        Claim::Acquired { .. }
    ));
    let twice = Event::new("e-r2", "agent");
    let first = store
        .append_fenced(&key, twice.clone(), vec![], Fence::Run("r2", 0))
        .await
        .unwrap();
    let again = store
        .append_fenced(&key, twice, vec![], Fence::RunEnd("r2", 0))
        .await
        .unwrap();
    assert_eq!((first.seq, again.seq), (2, 2), "stored once");
    assert_eq!(
        store.get_run("r2").await.unwrap().unwrap().status,
        RunStatus::Running
    );
    assert!(store
        .finish_run(&key.user_id, "r2", 0, RunStatus::Completed, Some(2), None)
        .await
        .unwrap());
    assert!(store.active_run(&key).await.unwrap().is_none());
}

/// Admission commits the run's user event and reads the run's starting state with it
/// (PostgreSQL: in one statement; SQLite: in one transaction). On PostgreSQL that state is
/// trusted only when the statement's snapshot saw the session as it was when the statement
/// took it: here another write to the free session (as a sweeper sealing a dead run's
/// transcript makes, with an `app:` delta) commits while admission waits for the row, so
/// admission reports no state and the runner reads it again. A dead run's transcript holds
/// the user event back (it must come after the seal).
async fn admission_commits_the_user_event(backend: Backend) {
    use sqlx::{Connection, Executor};
    let (db, store, key) = store_with_session(backend, json!({"k": 1, "app:shared": 1})).await;
    store
        .heartbeat("live", Duration::from_secs(10), false, false)
        .await
        .unwrap();
    let run = |id: &str, owner: &str| {
        let mut event = Event::new(format!("e-{id}"), "user");
        event.content = Some(agentd::event::Content::text("user", "hello"));
        event.actions.state_delta =
            serde_json::from_value(json!({"k": 2, "user:seen": true, "temp:t": 1})).unwrap();
        new_run(&key, id, owner, Some(event))
    };

    // The usual case: admitted, the user event committed, the state after it returned.
    let Claim::Acquired {
        base_seq,
        unsealed: false,
        opened: Some(opened),
    } = claim(store.as_ref(), &run("r1", "live"), None)
        .await
        .unwrap()
    else {
        panic!("admitted with the user event");
    };
    assert_eq!((base_seq, opened.stored.seq), (0, 1));
    assert_eq!(
        opened.state.as_ref().map(|s| Value::Object(s.clone())),
        Some(json!({"k": 2, "app:shared": 1, "user:seen": true})),
        "the state after the user event; temp: keys are never stored"
    );
    assert_eq!(store.session_head(&key).await.unwrap().unwrap().last_seq, 1);
    let stored = store
        .find_event(&key, &opened.stored.event.id)
        .await
        .unwrap();
    assert_eq!(stored.map(|s| s.seq), Some(1), "committed");
    assert_eq!(
        store.get_run("r1").await.unwrap().unwrap().base_seq,
        Some(0)
    );
    assert!(store
        .finish_run(&key.user_id, "r1", 0, RunStatus::Completed, Some(1), None)
        .await
        .unwrap());

    // PostgreSQL's single statement and its snapshot. (On Citus the statement's parts run as
    // steps of one transaction and the lock wait happens on a worker, where this test's
    // `pg_stat_activity` probe on the coordinator cannot see it.)
    if backend == Backend::Postgres {
        // A write to the free session commits while r2's admission waits for the session
        // row: r2's snapshot predates it.
        let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let mut watch = sqlx::PgConnection::connect(&db.url).await.unwrap();
        other
            .execute(
                "BEGIN;
                 UPDATE sessions SET last_seq = last_seq + 1 WHERE id = 's1';
                 UPDATE app_states SET state = state || '{\"shared\": 2}' WHERE app_name = 'app';",
            )
            .await
            .unwrap();
        let admit = {
            let store = store.clone();
            let r2 = run("r2", "live");
            tokio::spawn(async move { claim(store.as_ref(), &r2, None).await })
        };
        // Wait until r2's statement is blocked on the row lock, then commit.
        let deadline = Instant::now() + PATIENCE;
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND query LIKE '%async_commit%'",
            )
            .fetch_one(&mut watch)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "admission never waited for the row"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        other.execute("COMMIT").await.unwrap();
        let Claim::Acquired {
            base_seq,
            opened: Some(opened),
            ..
        } = admit.await.unwrap().unwrap()
        else {
            panic!("admitted once the row was free");
        };
        assert_eq!((base_seq, opened.stored.seq), (2, 3));
        assert_eq!(
            opened.state, None,
            "a stale snapshot's state is not trusted"
        );
        let head = store.session_head(&key).await.unwrap().unwrap();
        assert_eq!(
            head.state["app:shared"],
            json!(2),
            "what the runner reads instead"
        );
        assert!(store
            .finish_run(&key.user_id, "r2", 0, RunStatus::Completed, Some(3), None)
            .await
            .unwrap());
    }

    // A run whose replica died (`stalled` never heartbeats) is abandoned, unsealed: the next
    // admission takes the session but leaves its user event to the runner, after the seal.
    let Claim::Acquired { .. } = claim(store.as_ref(), &run("r3", "stalled"), None)
        .await
        .unwrap()
    else {
        panic!("admitted");
    };
    let dead = store.get_run("r3").await.unwrap().unwrap();
    assert_eq!(
        store.expire_run(&dead).await.unwrap(),
        agentd::store::Expired::Ended
    );
    let last_seq = store.session_head(&key).await.unwrap().unwrap().last_seq;
    let claim = claim(store.as_ref(), &run("r4", "live"), None)
        .await
        .unwrap();
    assert_eq!(
        claim,
        Claim::Acquired {
            base_seq: last_seq,
            unsealed: true,
            opened: None
        }
    );
    assert_eq!(
        store.session_head(&key).await.unwrap().unwrap().last_seq,
        last_seq,
        "nothing appended"
    );
}

/// A durable run moves between replicas under the same id, one epoch at a time: after a
/// takeover its previous owner can neither commit nor record an outcome (its epoch is old),
/// a second takeover with the old epoch loses, a live owner's run cannot be taken, and a run
/// handed over on a drain is taken by another replica. The run's record counts the moves and
/// logs them; its end is written once, with one delivery per target.
async fn a_durable_run_moves_one_epoch_at_a_time(backend: Backend) {
    use agentd::store::{Durable, Expired, ResumeReason};
    let (_db, store, key) = store_with_session(backend, json!({})).await;
    let mut run = new_run(&key, "r1", "stalled", None);
    run.durable = Some(Durable {
        config: Some(json!({"streaming": true})),
        max_secs: 600.0,
    });
    run.webhooks = Some(
        json!([{"url": "https://hooks.example/", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "events": ["run.completed"], "includeText": false}]),
    );
    assert!(matches!(
        claim(store.as_ref(), &run, None).await.unwrap(),
        Claim::Acquired { .. }
    ));
    for live in ["live", "other"] {
        store
            .heartbeat(live, Duration::from_secs(10), false, false)
            .await
            .unwrap();
    }
    let seen = store.get_user_run(USER, "r1").await.unwrap().unwrap();
    // Admission does not end a durable run whose replica died: it is to be resumed.
    assert_eq!(store.expire_run(&seen).await.unwrap(), Expired::Durable);
    let orphans = store.orphans("live", false).await.unwrap();
    assert_eq!(orphans.len(), 1);
    assert!(orphans[0].durable && !orphans[0].released);
    assert!(
        orphans[0].remaining.is_some_and(|r| r > 590.0),
        "{orphans:?}"
    );

    let taken = store
        .take_over(&seen, "live", ResumeReason::ReplicaLost, false)
        .await
        .unwrap()
        .expect("taken over");
    assert_eq!(taken.run.owner, "live");
    assert_eq!(taken.run.resumes, 1);
    assert_eq!(taken.config, Some(json!({"streaming": true})));
    assert!(taken.has_webhooks);
    assert!(
        store
            .take_over(&seen, "other", ResumeReason::ReplicaLost, false)
            .await
            .unwrap()
            .is_none(),
        "the old epoch loses"
    );
    // The previous owner is fenced out; the new one writes.
    let event = |text: &str| {
        Event::new("e-r1", "agent").with_content(agentd::event::Content {
            parts: vec![agentd::event::Part::text(text)],
            role: Some("model".into()),
            ..Default::default()
        })
    };
    assert!(matches!(
        store
            .append_fenced(&key, event("zombie"), vec![], Fence::Run("r1", 0))
            .await,
        Err(StoreError::NotOwner)
    ));
    assert!(!store
        .finish_run(USER, "r1", 0, RunStatus::Failed, None, None)
        .await
        .unwrap());
    store
        .append_fenced(&key, event("taker"), vec![], Fence::Run("r1", 1))
        .await
        .expect("the taker writes");
    // A live owner's run is nobody's to take.
    assert!(store.orphans("other", false).await.unwrap().is_empty());
    assert!(store
        .take_over(&taken.run, "other", ResumeReason::ReplicaLost, false)
        .await
        .unwrap()
        .is_none());
    // Handed over on a drain: released, then taken by a live replica.
    assert!(store.release_run(USER, "r1", 1, "live").await.unwrap());
    assert!(matches!(
        store
            .append_fenced(&key, event("late"), vec![], Fence::Run("r1", 1))
            .await,
        Err(StoreError::NotOwner)
    ));
    let orphans = store.orphans("other", false).await.unwrap();
    assert!(orphans.len() == 1 && orphans[0].released, "{orphans:?}");
    let moved = store
        .take_over(&orphans[0].run, "other", ResumeReason::Drain, false)
        .await
        .unwrap()
        .expect("taken over after the drain");
    assert_eq!(moved.run.resumes, 2);
    assert!(store
        .finish_run(USER, "r1", 2, RunStatus::Completed, Some(3), None)
        .await
        .unwrap());
    let ended = store.get_user_run(USER, "r1").await.unwrap().unwrap();
    assert_eq!(ended.status, RunStatus::Completed);
    assert_eq!(ended.resumes, 2);
    let log: Vec<(&str, &str, &str)> = ended
        .resumed
        .iter()
        .map(|s| (s.from.as_str(), s.to.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        log,
        vec![
            ("stalled", "live", "replica_lost"),
            ("live", "other", "drain")
        ]
    );
    assert_eq!(store.run_deliveries(USER, "r1").await.unwrap().len(), 1);
}

both_backends!(
    a_run_s_last_event_records_its_outcome,
    admission_commits_the_user_event,
    a_run_that_lost_its_session_cannot_write_into_it,
    a_durable_run_moves_one_epoch_at_a_time,
);

/// An admission that had to wait for its session's row (another transaction held it) stamps
/// its user event no earlier than that transaction's write: a transcript's times never go
/// backwards, however long the statement waited after the runner stamped the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_that_waited_for_the_session_row_is_stamped_after_it() {
    let (db, store, key) = store_with_session(Backend::Postgres, json!({})).await;
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let later = agentd::event::now_ts() + 5.0;
    sqlx::query(
        "UPDATE sessions SET update_time = $4 WHERE app_name = $1 AND user_id = $2 AND id = $3",
    )
    .bind(&key.app_name)
    .bind(&key.user_id)
    .bind(&key.session_id)
    .bind(later)
    .execute(&mut *tx)
    .await
    .unwrap();
    let opening =
        Event::new("e-late", "user").with_content(agentd::event::Content::text("user", "hello"));
    assert!(opening.timestamp < later);
    let run = new_run(&key, "late", "r1", Some(opening));
    let admitting = {
        let store = store.clone();
        tokio::spawn(async move { claim(store.as_ref(), &run, None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!admitting.is_finished(), "the admission waits for the row");
    tx.commit().await.unwrap();
    let Claim::Acquired {
        opened: Some(opened),
        ..
    } = admitting.await.unwrap().unwrap()
    else {
        panic!("admitted with its user event")
    };
    assert!(opened.stored.event.timestamp >= later, "{opened:?}");
    let stored = store
        .find_event(&key, &opened.stored.event.id)
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(stored.event.timestamp, opened.stored.event.timestamp);
}
