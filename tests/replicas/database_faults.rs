//! PostgreSQL connections cut or restarted: never a 500, ambiguous commits resolved.

use super::*;

/// A server on PostgreSQL through a proxy that can cut its connections, with `n` sessions
/// `s0…` of the echo app; and the sessions' path. The database lives as long as the returned
/// `TestDb`.
async fn behind_a_proxy_with_sessions(
    n: usize,
) -> (TestDb, common::pg_proxy::PgProxy, TestServer, String) {
    let db = TestDb::postgres().await;
    let (proxy, url) = common::pg_proxy::PgProxy::in_front_of(&db.url).await;
    let s = TestServer::start_with(Backend::Postgres, |args| {
        args.database.database_url = url;
    })
    .await;
    let path = format!("/apps/echo/users/{USER}/sessions");
    for i in 0..n {
        json_with_status(
            s.post_json(&path, json!({"sessionId": format!("s{i}")}))
                .await,
            200,
        )
        .await;
    }
    (db, proxy, s, path)
}

/// A PostgreSQL restart (every pooled connection cut) is a retried read or a 503 with
/// `Retry-After`, never a 500; the next requests work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_database_connection_is_never_a_500() {
    let (_db, proxy, s, path) = behind_a_proxy_with_sessions(4).await;
    let mut statuses: Vec<u16> = vec![];
    let mut cuts = vec![];
    for round in 0..3 {
        let cut = proxy.cut_all();
        // Something to cut: the connections the session creates used (pooled, idle) before
        // the first round; before a later one, at least the connection a 200 of the round
        // before was answered on (it went back to the pool).
        let answered_before = round == 0 || statuses[statuses.len() - 4..].contains(&200);
        if answered_before {
            assert!(
                cut > 0,
                "round {round}: no open connection was cut (statuses so far: {statuses:?})"
            );
        }
        cuts.push(cut);
        for i in 0..4 {
            let resp = s.get(&format!("{path}/s{i}")).await;
            let status = resp.status().as_u16();
            if status == 503 {
                assert!(resp.headers().contains_key("retry-after"));
                let body = json_with_status(resp, 503).await;
                assert_eq!(body["code"], "database_unavailable", "round {round}");
            } else {
                json_with_status(resp, 200).await;
            }
            statuses.push(status);
        }
    }
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    // Once the pool has fresh connections, everything answers.
    json_with_status(s.get(&format!("{path}/s0")).await, 200).await;
    eprintln!("statuses after cuts: {statuses:?}; connections cut per round: {cuts:?}");
}

/// Right after PostgreSQL restarts (every pooled connection cut at once, none of them idle
/// long enough to be pinged), idempotent reads answer 200, not 503: the first read that hits
/// a dead connection makes the pool check every connection before use, so its retry (and
/// every read after it) gets a live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_right_after_a_database_restart_answer_200() {
    let (_db, proxy, s, path) = behind_a_proxy_with_sessions(8).await;
    // Several pooled connections, as a busy replica has: eight reads at once.
    let paths: Vec<String> = (0..8).map(|i| format!("{path}/s{i}")).collect();
    let reads = paths.iter().map(|p| s.get(p));
    for resp in futures::future::join_all(reads).await {
        assert_eq!(resp.status(), 200);
    }
    let cut = proxy.cut_all();
    assert!(cut >= 2, "only {cut} pooled connections to cut");
    let mut statuses = vec![];
    for round in 0..30 {
        let resp = s.get(&format!("{path}/s{}", round % 8)).await;
        statuses.push(resp.status().as_u16());
    }
    assert!(
        statuses.iter().all(|s| *s == 200),
        "reads after the restart: {statuses:?} ({cut} connections cut)"
    );
}

/// PostgreSQL behind a fault-injecting proxy, and agentd on it serving the echo app `slow` (5
/// partials 100 ms apart, so a test can act between the user event and the reply). The
/// apps directory lives as long as the returned `Apps`.
async fn slow_echo_behind_proxy() -> (TestDb, common::pg_proxy::PgProxy, Apps, TestServer) {
    let db = TestDb::postgres().await;
    let (proxy, url) = common::pg_proxy::PgProxy::in_front_of(&db.url).await;
    let apps = Apps::new().echo("slow", "chunks: 5\nchunk_delay_ms: 100");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(Backend::Postgres, |args| {
        args.database.database_url = url;
        args.apps_dir = dir;
    })
    .await;
    (db, proxy, apps, s)
}

/// The connection drops after PostgreSQL committed an event and before agentd heard of it: the
/// runner resolves the outcome by the event's id (it is stored), reports it as committed, and
/// the event is stored exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_commit_is_resolved_by_event_id() {
    let (_db, proxy, _apps, s) = slow_echo_behind_proxy().await;
    let body = json!({"appName": "slow", "userId": USER, "sessionId": "s1", "createSession": true,
        "newMessage": {"role": "user", "parts": [{"text": "is it stored?"}]}});
    let mut sse = Sse::open(s.post_json("/run", body).await).await;
    // The user event is committed before the first partial; the next INSERT is the reply.
    sse.next_matching(Msg::is_partial).await;
    proxy.cut_after_next_insert();
    let rest = sse.rest().await;
    assert_eq!(proxy.insert_cuts(), 1, "the fault was injected");
    assert_eq!(done_of(&rest)["status"], "completed", "{rest:#?}");
    let replies: Vec<&Msg> = rest.iter().filter(|m| m.is_committed()).collect();
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].id, "2");
    let events = json_with_status(
        s.get(&format!("/apps/slow/users/{USER}/sessions/s1/events"))
            .await,
        200,
    )
    .await;
    let events = events["events"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), 2, "user event and reply, once each: {events:#?}");
    assert_eq!(ids[1], replies[0].data["id"]);
}

/// A run's final reply and its outcome are one commit: when the client sees the reply, the
/// run is already recorded as completed and its session free, with nothing left to write.
/// Here PostgreSQL becomes unreachable right after the reply's INSERT is acknowledged: with
/// a separate outcome statement the run would read `running` (and the session stay busy)
/// until the database came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reply_and_the_outcome_are_one_commit() {
    use sqlx::{Connection, Row};
    let (db, proxy, _apps, s) = slow_echo_behind_proxy().await;
    let body = json!({"appName": "slow", "userId": USER, "sessionId": "s1", "createSession": true,
        "newMessage": {"role": "user", "parts": [{"text": "one commit"}]}});
    let resp = s.post_json("/run", body).await;
    let run_id = resp.headers()["x-agentd-run-id"]
        .to_str()
        .unwrap()
        .to_string();
    let mut sse = Sse::open(resp).await;
    // The user event is committed before the first partial; the next INSERT is the reply.
    sse.next_matching(Msg::is_partial).await;
    proxy.freeze_after_next_insert();
    let reply = sse.next_matching(Msg::is_committed).await;
    assert_eq!(reply.id, "2");
    assert!(
        proxy.is_frozen(),
        "the reply's INSERT was the last thing PostgreSQL heard"
    );

    let mut direct = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let run = sqlx::query("SELECT status, last_seq FROM runs WHERE id = $1")
        .bind(&run_id)
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(run.get::<String, _>("status"), "completed");
    assert_eq!(run.get::<Option<i64>, _>("last_seq"), Some(2));
    let owner: Option<String> = sqlx::query_scalar(
        "SELECT active_run FROM sessions WHERE app_name = 'slow' AND user_id = $1 AND id = 's1'",
    )
    .bind(USER)
    .fetch_one(&mut direct)
    .await
    .unwrap();
    assert_eq!(owner, None, "the session is free");

    proxy.thaw();
    let rest = sse.rest().await;
    assert_eq!(done_of(&rest)["status"], "completed", "{rest:#?}");
    assert_eq!(done_of(&rest)["lastSeq"], 2, "{rest:#?}");
}
