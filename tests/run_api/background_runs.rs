//! Background runs, and run records: listed newest first, found by id at every moment.

use super::*;
use crate::both_backends;

/// A run started without a client: 202 with the run and its links once admitted, it completes
/// alone, `wait` returns it ended, and its stream replays the whole run to `done`.
async fn a_background_run_completes_alone_and_replays(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let path = format!("{}/runs", session_path("slow", "s1"));
    let resp = s
        .post_json(
            &path,
            json!({"newMessage": {"role": "user", "parts": [{"text": "later"}]}}),
        )
        .await;
    assert_eq!(
        resp.headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        resp.headers()
            .get("x-agentd-run-id")
            .and_then(|v| v.to_str().ok())
            .map(|id| format!("/apps/slow/users/{USER}/runs/{id}"))
    );
    let started = json_with_status(resp, 202).await;
    let run_id = started["runId"].as_str().expect("runId").to_string();
    assert!(started["invocationId"].as_str().is_some(), "{started}");
    // The links name the run under its user (one shard on Citus); the bare forms work too.
    let at = format!("/apps/slow/users/{USER}/runs/{run_id}");
    assert_eq!(started["links"]["wait"], format!("{at}/wait"));
    assert_eq!(started["links"]["stream"], format!("{at}/stream"));
    let early = json_with_status(s.get(&at).await, 200).await;
    assert_eq!(early["runId"], run_id.as_str(), "{early}");
    // Another user's path, or another app's, does not find it.
    let other = s
        .get(&format!("/apps/slow/users/someone-else/runs/{run_id}"))
        .await;
    assert_eq!(other.status(), 404);
    let other = s
        .get(&format!("/apps/echo/users/{USER}/runs/{run_id}"))
        .await;
    assert_eq!(other.status(), 404);
    let user_wait = json_with_status(
        s.post_json(&format!("{at}/wait?wait=30"), json!({})).await,
        200,
    )
    .await;
    assert_eq!(user_wait["status"], "completed", "{user_wait}");
    let user_stream = Sse::open(s.get(&format!("{at}/stream")).await)
        .await
        .rest()
        .await;
    assert_eq!(done(&user_stream)["status"], "completed");

    // Nobody reads it; it ends on its own, and the long poll answers when it does.
    let waited = json_with_status(
        s.post_json(&format!("/runs/{run_id}/wait?wait=30"), json!({}))
            .await,
        200,
    )
    .await;
    assert_eq!(waited["status"], "completed", "{waited}");
    let polled = json_with_status(s.get(&format!("/runs/{run_id}?wait=5")).await, 200).await;
    assert_eq!(polled["status"], "completed");
    let msgs = Sse::open(s.get(&format!("/runs/{run_id}/stream")).await)
        .await
        .rest()
        .await;
    assert_eq!(done(&msgs)["status"], "completed");
    let replayed: Vec<String> = complete(&msgs).into_iter().map(text).collect();
    assert_eq!(replayed, ["later"], "the reply, replayed from the database");
    let stored: Vec<String> = transcript(&s, "slow", "s1")
        .await
        .iter()
        .map(text)
        .collect();
    assert_eq!(stored, ["later", "later"]);

    // `"background": true` on /run does the same.
    let resp = s
        .post_json(
            "/run",
            with(
                run_body("slow", "s1", "also later"),
                json!({"background": true}),
            ),
        )
        .await;
    let started = json_with_status(resp, 202).await;
    let second = started["runId"].as_str().unwrap().to_string();
    let waited = json_with_status(
        s.post_json(&format!("/runs/{second}/wait"), json!({}))
            .await,
        200,
    )
    .await;
    assert_eq!(waited["status"], "completed");
}

/// A background request is refused exactly as `/run` refuses it, before anything starts:
/// a busy session (409), a missing session (404), a body naming another session (422).
async fn a_background_run_is_refused_like_run(backend: Backend) {
    let apps = Apps::new().echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "slow", "s1").await;
    let path = format!("{}/runs", session_path("slow", "s1"));
    let msg = json!({"newMessage": {"role": "user", "parts": [{"text": "one"}]}});
    let first = json_with_status(s.post_json(&path, msg.clone()).await, 202).await;
    let busy = json_with_status(s.post_json(&path, msg.clone()).await, 409).await;
    assert_eq!(busy["code"], "session_busy", "{busy}");
    let ghost = format!("{}/runs", session_path("slow", "ghost"));
    let missing = json_with_status(s.post_json(&ghost, msg.clone()).await, 404).await;
    assert_eq!(missing["code"], "session_not_found");
    let other = with(msg.clone(), json!({"sessionId": "s2"}));
    let bad = json_with_status(s.post_json(&path, other).await, 422).await;
    assert_eq!(bad["code"], "validation_error");
    let run_id = first["runId"].as_str().unwrap();
    assert_eq!(finished_run(&s, run_id).await["status"], "completed");
    let stored: Vec<String> = transcript(&s, "slow", "s1")
        .await
        .iter()
        .map(text)
        .collect();
    assert_eq!(
        stored,
        ["one", "one"],
        "only the admitted run wrote anything"
    );
    let unknown = json_with_status(s.post_json("/runs/run-nope/wait", json!({})).await, 404).await;
    assert_eq!(unknown["code"], "run_not_found");
}

/// A user's runs, newest first, a page at a time with a cursor, filtered by status.
async fn a_users_runs_are_listed_newest_first(backend: Backend) {
    let apps = Apps::new().echo("e", "chunks: 1");
    let s = apps.serve(backend).await;
    create_session(&s, "e", "s1").await;
    let mut ids = vec![];
    for i in 0..3 {
        let msgs = run(&s, run_body("e", "s1", &format!("m{i}")))
            .await
            .rest()
            .await;
        ids.push(done(&msgs)["runId"].as_str().unwrap().to_string());
    }
    ids.reverse();
    let listing = format!("/apps/e/users/{USER}/runs");
    let page = json_with_status(s.get(&format!("{listing}?limit=2")).await, 200).await;
    let got: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[0].as_str(), ids[1].as_str()]);
    let next = page["next"].as_str().expect("a next cursor").to_string();
    let page = json_with_status(s.get(&format!("{listing}?limit=2&after={next}")).await, 200).await;
    let got: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[2].as_str()]);
    assert!(page.get("next").is_none(), "{page}");
    let done_runs =
        json_with_status(s.get(&format!("{listing}?status=completed")).await, 200).await;
    assert_eq!(done_runs["runs"].as_array().unwrap().len(), 3);
    let running = json_with_status(s.get(&format!("{listing}?status=running")).await, 200).await;
    assert!(running["runs"].as_array().unwrap().is_empty());
    let other_user = json_with_status(s.get("/apps/e/users/someone-else/runs").await, 200).await;
    assert!(other_user["runs"].as_array().unwrap().is_empty());
    for bad in [
        "?status=finished",
        "?after=not-a-cursor",
        "?limit=0",
        "?limit=201",
    ] {
        let b = json_with_status(s.get(&format!("{listing}{bad}")).await, 422).await;
        assert_eq!(b["code"], "validation_error", "{bad}: {b}");
    }
}

/// A run is found by its id, bare and under its user, at every moment from its admission to
/// its end: on PostgreSQL a running run lives on its session row and moves into `runs` as it
/// ends, and no reader may fall between the two (on Citus the bare lookup reads every shard,
/// each in a snapshot of its own). Running, it is listed first, and as `running`.
async fn a_run_is_found_by_its_id_at_every_moment(backend: Backend) {
    let apps = Apps::new()
        .echo("e", "chunks: 3\nchunk_delay_ms: 10")
        .echo("slow", SLOW);
    let s = apps.serve(backend).await;
    create_session(&s, "e", "s1").await;
    for i in 0..20 {
        let mut sse = run_sse(&s, run_body("e", "s1", &format!("m{i}"))).await;
        let id = sse.run_id();
        // Both lookups, alternately, until the run reads ended; it must have read `running`
        // first (the run takes 30 ms), so the reads spanned its end.
        let poll = async {
            let mut running = 0;
            loop {
                for path in [
                    format!("/runs/{id}"),
                    format!("/apps/e/users/{USER}/runs/{id}"),
                ] {
                    let record = json_with_status(s.get(&path).await, 200).await;
                    if record["status"] != "running" {
                        assert_eq!(record["status"], "completed", "{record}");
                        return running;
                    }
                    running += 1;
                }
            }
        };
        let (running, _) = tokio::join!(poll, sse.rest());
        assert!(running > 0, "run {i} was never read while running");
    }

    create_session(&s, "slow", "s2").await;
    let mut sse = run_sse(&s, run_body("slow", "s2", "still going")).await;
    let id = sse.run_id();
    sse.until(Msg::is_partial).await;
    let listing = format!("/apps/slow/users/{USER}/runs");
    let running = json_with_status(s.get(&format!("{listing}?status=running")).await, 200).await;
    let running = running["runs"].as_array().unwrap();
    assert_eq!(running.len(), 1, "{running:?}");
    assert_eq!(
        (running[0]["runId"].as_str(), running[0]["status"].as_str()),
        (Some(id.as_str()), Some("running"))
    );
    let session_runs = json_with_status(s.get(&listing).await, 200).await;
    assert_eq!(
        session_runs["runs"][0]["runId"],
        id.as_str(),
        "newest first"
    );
    let run = json_with_status(s.get(&format!("{listing}/{id}")).await, 200).await;
    assert_eq!(run["sessionId"], "s2");
    sse.rest().await;
}

/// A run id names one run, ever: admission refuses an id that a running run has on another
/// session, or that an ended run had, and refusing it changes nothing (the session stays
/// free, the first run's record stays as it was). Schedules re-fire a tick with its run id
/// and MCP derives a run id from the request id, both counting on this.
async fn a_run_id_names_one_run(backend: Backend) {
    use agentd::store::{Insert, NewRun, NewSession, RunStatus, SessionKey};
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    for id in ["a", "b", "c"] {
        store
            .create_session(NewSession {
                app_name: "e".into(),
                user_id: USER.into(),
                session_id: Some(id.into()),
                state: Default::default(),
                events: vec![],
            })
            .await
            .unwrap();
    }
    let run = |session: &str| NewRun {
        run_id: "run-once".into(),
        key: SessionKey::new("e", USER, session),
        invocation_id: format!("e-{session}"),
        owner: "replica-1".into(),
        user_event: false,
        queue_ttl: Duration::from_secs(60),
        opening: None,
        webhooks: None,
        durable: None,
        api_key: None,
    };
    let first = store.insert_run(&run("a"), None).await.unwrap();
    assert!(matches!(first, Insert::Inserted { .. }), "{first:?}");
    let refused =
        |r: &agentd::store::StoreResult<Insert>| !matches!(r, Ok(Insert::Inserted { .. }));
    let while_running = store.insert_run(&run("b"), None).await;
    assert!(refused(&while_running), "{while_running:?}");
    let free = |s: &str| SessionKey::new("e", USER, s);
    assert!(store.active_run(&free("b")).await.unwrap().is_none());
    assert!(store
        .finish_run(USER, "run-once", 0, RunStatus::Completed, Some(0), None)
        .await
        .unwrap());
    let ended = store.insert_run(&run("c"), None).await;
    assert!(refused(&ended), "{ended:?}");
    assert!(store.active_run(&free("c")).await.unwrap().is_none());
    let record = store.get_user_run(USER, "run-once").await.unwrap().unwrap();
    assert_eq!(
        (record.session_id.as_str(), record.status),
        ("a", RunStatus::Completed)
    );
}

both_backends!(
    a_run_is_found_by_its_id_at_every_moment,
    a_run_id_names_one_run,
    a_background_run_completes_alone_and_replays,
    a_background_run_is_refused_like_run,
    a_users_runs_are_listed_newest_first,
);
