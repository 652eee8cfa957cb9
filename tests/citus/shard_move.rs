//! A shard move of a busy user's shard group while its runs stream loses nothing.

use super::*;

/// What one client saw: the committed reply ids, how many runs, how many requests it had to
/// retry, and when each run started and ended.
struct ClientLog {
    committed: Vec<String>,
    runs: usize,
    retries: usize,
    spans: Vec<(std::time::Instant, std::time::Instant)>,
}

/// One client's runs on its session, one after the other, until `stop`. A request refused
/// before its stream starts (a 503 while the shard group switches nodes) is retried after a
/// pause, for up to 10 s (each retry counted); every run must then complete.
async fn runs_until(
    replica: &common::procs::Replica,
    session: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> ClientLog {
    use std::time::{Duration, Instant};
    let mut log = ClientLog {
        committed: vec![],
        runs: 0,
        retries: 0,
        spans: vec![],
    };
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let body = serde_json::json!({
            "appName": "slow", "userId": common::procs::USER, "sessionId": session,
            "newMessage": {"role": "user", "parts": [{"text": format!("turn {}", log.runs)}]},
        });
        let started = Instant::now();
        let mut resp = replica.post("/run", body.clone()).await;
        while resp.status() != 200 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "refused for 10 s: {}",
                resp.text().await.unwrap_or_default()
            );
            log.retries += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            resp = replica.post("/run", body.clone()).await;
        }
        let msgs = common::sse_client::read_all(resp).await;
        let done = msgs.last().expect("messages");
        assert_eq!(done.event, "done", "{msgs:#?}");
        assert_eq!(done.data["status"], "completed", "{msgs:#?}");
        log.committed.extend(
            msgs.iter()
                .filter(|m| m.is_committed() && m.data["author"] != "user")
                .filter_map(|m| m.data["id"].as_str().map(str::to_string)),
        );
        log.runs += 1;
        log.spans.push((started, Instant::now()));
    }
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_move_while_runs_stream_loses_nothing() {
    use common::procs::{Apps, Replica, USER};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    if citus::admin_url().is_none() {
        citus::not_run("citus::a_shard_move_while_runs_stream_loses_nothing");
        return;
    }
    let db = TestDb::citus().await;
    let apps = Apps::new().echo("slow", "chunks: 5\nchunk_delay_ms: 40");
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    let sessions: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    for s in &sessions {
        a.create_session("slow", s).await;
    }
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    // The busy user's shard group: where its `sessions` shard lives, and another worker.
    let shard: i64 =
        sqlx::query_scalar("SELECT get_shard_id_for_distribution_column('sessions', $1)")
            .bind(USER)
            .fetch_one(&mut conn)
            .await
            .expect("shard of the user");
    let placement = "SELECT nodename, nodeport FROM citus_shards WHERE shardid = $1";
    let (from_host, from_port): (String, i32) = sqlx::query_as(placement)
        .bind(shard)
        .fetch_one(&mut conn)
        .await
        .expect("placement");
    let (to_host, to_port): (String, i32) = sqlx::query_as(
        "SELECT nodename, nodeport FROM pg_dist_node
          WHERE groupid <> 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1",
    )
    .bind(from_port)
    .fetch_one(&mut conn)
    .await
    .expect("another worker");

    let stop = Arc::new(AtomicBool::new(false));
    let a = Arc::new(a);
    let b = Arc::new(b);
    let clients: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let replica = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (s, stop) = (s.clone(), stop.clone());
            tokio::spawn(async move { runs_until(&replica, s, stop).await })
        })
        .collect();
    // Runs are streaming; move the user's shard group (its runs, events, sessions…) to the
    // other worker. `block_writes`: writes to the group wait while it is copied (logical
    // replication, the online mode, needs `wal_level = logical`).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let move_started = std::time::Instant::now();
    sqlx::query(
        "SELECT citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')",
    )
    .bind(shard)
    .bind(&from_host)
    .bind(from_port)
    .bind(&to_host)
    .bind(to_port)
    .execute(&mut conn)
    .await
    .expect("citus_move_shard_placement");
    let move_ended = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);

    let (moved_host, moved_port): (String, i32) = sqlx::query_as(placement)
        .bind(shard)
        .fetch_one(&mut conn)
        .await
        .expect("placement");
    assert_eq!(
        (moved_host, moved_port),
        (to_host, to_port),
        "the group moved"
    );
    let (mut total_runs, mut total_retries, mut across) = (0, 0, 0);
    for (client, session) in clients.into_iter().zip(&sessions) {
        let log = client.await.expect("client");
        assert!(
            log.runs > 1,
            "runs went on around the move ({} on {session})",
            log.runs
        );
        total_runs += log.runs;
        total_retries += log.retries;
        across += log
            .spans
            .iter()
            .filter(|(start, end)| *start < move_ended && *end > move_started)
            .count();
        // Every event a client saw committed is stored, in order, and nothing else is.
        let stored = common::json_with_status(
            a.get(&format!("/apps/slow/users/{USER}/sessions/{session}"))
                .await,
            200,
        )
        .await;
        let stored: Vec<&Value> = stored["events"]
            .as_array()
            .expect("events")
            .iter()
            .collect();
        let replies: Vec<String> = stored
            .iter()
            .filter(|e| e["author"] != "user")
            .filter_map(|e| e["id"].as_str().map(str::to_string))
            .collect();
        assert_eq!(
            replies, log.committed,
            "what {session}'s clients saw is what is stored"
        );
        let users = stored.iter().filter(|e| e["author"] == "user").count();
        assert_eq!(
            users, log.runs,
            "one user event per completed run: a refused request left none"
        );
    }
    assert!(
        across > 0,
        "some run was in flight while the shard group moved"
    );
    // No run is left running (none stuck past its lease).
    let running = common::json_with_status(
        b.get(&format!("/apps/slow/users/{USER}/runs?status=running"))
            .await,
        200,
    )
    .await;
    assert_eq!(running["runs"], serde_json::json!([]), "{running}");
    eprintln!("shard move: {total_runs} runs across the move, {total_retries} retried request(s)");
}
