//! The two outboxes at the store are database facts: deliveries, claims as leases, ticks.

use super::*;
use crate::both_backends;

/// The two outboxes at the store, on both backends: a run's end writes its deliveries (one per
/// target that wants the event, none for one that does not); a claim is a lease that only
/// its holder may settle and that another sender takes over when it runs out; a retried
/// delivery keeps its id. A tick is claimed once, and a dead claimer's tick is taken over.
async fn the_outboxes_are_database_facts(backend: Backend) {
    use agentd::runner::claim;
    use agentd::store::{
        NewRun, NewSession, RunStatus, ScheduleRecord, SessionKey, Settle, TickPlan,
    };
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    store
        .create_session(NewSession {
            app_name: "echo".into(),
            user_id: USER.into(),
            session_id: Some("s1".into()),
            ..Default::default()
        })
        .await
        .expect("session");
    let target = |url: &str, events: &[&str]| json!({"url": url, "secret": SECRET, "events": events, "includeText": true});
    let run = NewRun {
        run_id: "run-1".into(),
        key: SessionKey::new("echo", USER, "s1"),
        invocation_id: "e-1".into(),
        owner: "r1".into(),
        user_event: false,
        queue_ttl: Duration::from_secs(60),
        opening: None,
        webhooks: Some(json!([
            target("https://a.example/", &["run.completed"]),
            target("https://b.example/", &["run.failed"]),
            target("https://c.example/", &["run.input_required"]),
        ])),
        durable: None,
        api_key: None,
    };
    claim(store.as_ref(), &run, None).await.expect("admitted");
    assert!(
        store
            .run_deliveries(&run.key.user_id, "run-1")
            .await
            .expect("read")
            .is_empty(),
        "none while running"
    );
    assert!(store
        .finish_run(
            &run.key.user_id,
            "run-1",
            0,
            RunStatus::Completed,
            None,
            None
        )
        .await
        .expect("finish"));
    let written = store
        .run_deliveries(&run.key.user_id, "run-1")
        .await
        .expect("read");
    let urls: Vec<&str> = written.iter().map(|d| d.url.as_str()).collect();
    // `run.input_required` is told apart from `run.completed` by the sender.
    assert_eq!(
        urls,
        ["https://a.example/", "https://c.example/"],
        "{written:?}"
    );
    assert!(written
        .iter()
        .all(|d| d.status == "pending" && d.attempts == 0));

    let first = store.claim_deliveries("s-a", 0.5, 10).await.expect("claim");
    assert_eq!(first.len(), 2);
    assert!(
        store
            .claim_deliveries("s-b", 30.0, 10)
            .await
            .expect("claim")
            .is_empty(),
        "leased"
    );
    let d = first
        .iter()
        .find(|d| d.target["url"] == "https://a.example/")
        .expect("a")
        .clone();
    assert_eq!(d.attempt, 1);
    assert!(!store
        .settle_delivery(&d, "s-b", &Settle::Delivered { status: 200 }, None)
        .await
        .expect("settle"));
    // s-a's lease runs out: s-b takes both over (attempt 2, same ids); s-a's late word is void.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let taken = store
        .claim_deliveries("s-b", 30.0, 10)
        .await
        .expect("claim");
    assert_eq!(taken.len(), 2);
    let d2 = taken
        .iter()
        .find(|x| x.id == d.id)
        .expect("same id")
        .clone();
    assert_eq!(d2.attempt, 2);
    assert!(!store
        .settle_delivery(&d, "s-a", &Settle::Delivered { status: 200 }, None)
        .await
        .expect("settle"));
    let retry_at = agentd::event::now_ts() - 1.0;
    let retry = Settle::Retry {
        status: Some(500),
        error: "the receiver answered 500".into(),
        retry_at,
    };
    assert!(store
        .settle_delivery(&d2, "s-b", &retry, None)
        .await
        .expect("settle"));
    let again = store
        .claim_deliveries("s-c", 30.0, 10)
        .await
        .expect("claim");
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id.as_str(), again[0].attempt), (d.id.as_str(), 3));
    assert!(store
        .settle_delivery(
            &again[0],
            "s-c",
            &Settle::Delivered { status: 204 },
            Some("run.input_required"),
        )
        .await
        .expect("settle"));
    let shown = store
        .run_deliveries(&run.key.user_id, "run-1")
        .await
        .expect("read");
    let a = shown.iter().find(|x| x.id == d.id).expect("a");
    assert_eq!(
        (a.status.as_str(), a.attempts, a.last_status),
        ("delivered", 3, Some(204))
    );
    assert_eq!(
        a.event_type, "run.input_required",
        "recorded as it was sent"
    );
    assert!(a.delivered_at.is_some());

    // Ticks.
    let now = agentd::event::now_ts();
    let schedule = ScheduleRecord {
        id: "sch-1".into(),
        app_name: "echo".into(),
        user_id: USER.into(),
        cron: "* * * * *".into(),
        timezone: "UTC".into(),
        message: json!({"role": "user", "parts": [{"text": "x"}]}),
        session_id: None,
        on_busy: "reject".into(),
        catch_up: "one".into(),
        webhook: None,
        enabled: true,
        next_tick: Some(now - 5.0),
        created_at: now,
        updated_at: now,
        created_by: Some("k1".into()),
        paused_reason: None,
    };
    assert!(store.create_schedule(&schedule, 20).await.expect("create"));
    let plan = move |s: &ScheduleRecord, _now: f64| TickPlan {
        fire: s.next_tick,
        next: Some(now + 3600.0),
    };
    let ticks = store.claim_ticks("dead", &plan, 10).await.expect("claim");
    assert_eq!(ticks.len(), 1);
    assert!(
        store
            .claim_ticks("live", &plan, 10)
            .await
            .expect("claim")
            .is_empty(),
        "claimed once"
    );
    // "dead" never heartbeats: "live" takes its claimed tick over, with the same run id.
    let taken = store
        .take_over_ticks("live", 300.0)
        .await
        .expect("take over");
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].1.run_id, ticks[0].1.run_id);
    assert_eq!(taken[0].0.id, "sch-1");
    assert!(!store
        .settle_tick(&ticks[0].1, "dead", "started", None)
        .await
        .expect("settle"));
    assert!(store
        .settle_tick(&taken[0].1, "live", "started", None)
        .await
        .expect("settle"));
    assert!(store
        .take_over_ticks("other", 300.0)
        .await
        .expect("take over")
        .is_empty());
    let listed = store
        .schedule_ticks("sch-1", None, 10)
        .await
        .expect("ticks");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, "started");
    // Pruning old runs takes their deliveries and old ticks with them.
    let prune = agentd::store::PruneRequest {
        sessions_before: 0.0,
        runs_before: agentd::event::now_ts() + 10.0,
        app: None,
        batch: 100,
        dry_run: false,
    };
    assert_eq!(store.delete_old_runs(&prune).await.expect("prune"), 1);
    assert!(store
        .run_deliveries(&run.key.user_id, "run-1")
        .await
        .expect("read")
        .is_empty());
    assert!(store
        .schedule_ticks("sch-1", None, 10)
        .await
        .expect("ticks")
        .is_empty());
    // Deleting a schedule deletes its ticks.
    let again = ScheduleRecord {
        id: "sch-2".into(),
        ..schedule.clone()
    };
    assert!(store.create_schedule(&again, 20).await.expect("create"));
    assert_eq!(
        store
            .claim_ticks("live", &plan, 10)
            .await
            .expect("claim")
            .len(),
        1
    );
    assert!(store
        .delete_schedule("echo", USER, "sch-2")
        .await
        .expect("delete"));
    assert!(store
        .schedule_ticks("sch-2", None, 10)
        .await
        .expect("ticks")
        .is_empty());

    // Deleting a session takes its runs' deliveries with them (no delivery is sent for a run
    // of a session its user deleted).
    store
        .create_session(NewSession {
            app_name: "echo".into(),
            user_id: USER.into(),
            session_id: Some("s2".into()),
            ..Default::default()
        })
        .await
        .expect("session");
    let doomed = NewRun {
        run_id: "run-2".into(),
        key: SessionKey::new("echo", USER, "s2"),
        ..run.clone()
    };
    claim(store.as_ref(), &doomed, None)
        .await
        .expect("admitted");
    assert!(store
        .finish_run(USER, "run-2", 0, RunStatus::Completed, None, None)
        .await
        .expect("finish"));
    assert_eq!(
        store
            .run_deliveries(USER, "run-2")
            .await
            .expect("read")
            .len(),
        2
    );
    assert!(store.delete_session(&doomed.key).await.expect("delete"));
    assert!(store
        .run_deliveries(USER, "run-2")
        .await
        .expect("read")
        .is_empty());
    assert!(store
        .claim_deliveries("live", 30.0, 100)
        .await
        .expect("claim")
        .iter()
        .all(|d| d.run_id != "run-2"));
}

both_backends!(the_outboxes_are_database_facts);

/// A user's schedules are bounded at the store (the quota holds however many replicas create
/// them), and revoking a key pauses the schedules it made: disabled, no next tick, a reason.
async fn schedules_are_bounded_and_stop_with_their_key(backend: Backend) {
    use agentd::store::ScheduleRecord;
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let now = agentd::event::now_ts();
    let schedule = |id: &str, user: &str, key: &str| ScheduleRecord {
        id: id.into(),
        app_name: "echo".into(),
        user_id: user.into(),
        cron: "0 9 * * *".into(),
        timezone: "UTC".into(),
        message: json!({"role": "user", "parts": [{"text": "x"}]}),
        session_id: None,
        on_busy: "reject".into(),
        catch_up: "one".into(),
        webhook: None,
        enabled: true,
        next_tick: Some(now + 3600.0),
        created_at: now,
        updated_at: now,
        created_by: Some(key.into()),
        paused_reason: None,
    };
    // Twelve at once against a quota of five: never more than five are kept.
    let tries = (0..12).map(|i| {
        let store = store.clone();
        let s = schedule(&format!("sch-{i}"), USER, "k1");
        async move { store.create_schedule(&s, 5).await.expect("create") }
    });
    let made = futures::future::join_all(tries).await;
    let stored = store
        .list_schedules("echo", Some(USER), None, 100)
        .await
        .expect("list");
    assert!(stored.len() <= 5, "quota overshot: {}", stored.len());
    assert_eq!(made.iter().filter(|m| **m).count(), stored.len());
    // One after another, the quota is filled exactly.
    for i in 0..5 {
        store
            .create_schedule(&schedule(&format!("more-{i}"), USER, "k1"), 5)
            .await
            .expect("create");
    }
    let stored = store
        .list_schedules("echo", Some(USER), None, 100)
        .await
        .expect("list");
    assert_eq!(stored.len(), 5);
    assert!(!store
        .create_schedule(&schedule("over", USER, "k1"), 5)
        .await
        .expect("create"));
    // Another user has their own quota.
    assert!(store
        .create_schedule(&schedule("theirs", "other-user", "k2"), 5)
        .await
        .expect("create"));

    assert_eq!(
        store
            .pause_schedules_of_key("k1", "key_revoked")
            .await
            .expect("pause"),
        5
    );
    for s in store
        .list_schedules("echo", Some(USER), None, 100)
        .await
        .expect("list")
    {
        assert!(!s.enabled);
        assert_eq!(s.next_tick, None);
        assert_eq!(s.paused_reason.as_deref(), Some("key_revoked"));
    }
    let theirs = store
        .get_schedule("echo", "other-user", "theirs")
        .await
        .expect("get")
        .expect("kept");
    assert!(theirs.enabled, "another key's schedule keeps firing");
}

both_backends!(schedules_are_bounded_and_stop_with_their_key);
