//! A replica killed with `kill -9` and a SIGTERM drain, for runs that are not resumed (an app
//! with `resume: never`, `--drain-handover off`): nothing is lost, runs are sealed.
//! `durable_runs` has the runs that go on.

use super::*;
use crate::postgres_backends;

async fn kill_9_of_a_ends_bs_follower_with_abandoned_and_seals_the_dead_run(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new()
        .echo(
            "slow",
            "chunks: 200\nchunk_delay_ms: 100\ncall_tool: lookup",
        )
        .settings("slow", "resume: never\n");
    let mut a = Replica::spawn(&db, &apps, "a", &["--run-lease-secs", "2"]).await;
    let b = Replica::spawn(&db, &apps, "b", &["--run-lease-secs", "2"]).await;
    a.create_session("slow", "s1").await;

    let mut on_a = Sse::open(
        a.post("/run", run_body("slow", "s1", "crash during this"))
            .await,
    )
    .await;
    let run_id = on_a.run_id();
    on_a.next_matching(Msg::is_committed).await; // the call is committed
    let mut follower = Sse::open(b.get(&format!("/runs/{run_id}/stream")).await).await;
    follower.next_matching(Msg::is_committed).await;

    a.child.start_kill().expect("kill -9");
    a.child.wait().await.expect("A exits");
    let rest = follower.rest().await;
    assert_eq!(done_of(&rest)["status"], "abandoned", "{rest:#?}");

    // Swept by B without any new request on the session: abandoned, free, transcript sealed.
    let record = json_with_status(b.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(record["status"], "abandoned");
    let events = events_of(&b, "slow", "s1").await;
    assert!(
        unanswered_calls(&events).is_empty(),
        "a dead run's calls are answered: {events:#?}"
    );
    assert_eq!(events.last().unwrap()["errorCode"], "INVOCATION_ABORTED");
    let next = Sse::open(b.post("/run", run_body("slow", "s1", "ok")).await).await;
    let _ = next; // admitted at once: the session is free
}

async fn sigterm_drains_a_replica(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo(
        "slow",
        "chunks: 300\nchunk_delay_ms: 100\ncall_tool: lookup",
    );
    let a = Replica::spawn(
        &db,
        &apps,
        "a",
        &[
            "--drain-secs",
            "1",
            "--shutdown-grace-secs",
            "5",
            "--drain-handover",
            "off",
        ],
    )
    .await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    a.create_session("slow", "s1").await;
    a.create_session("slow", "s2").await;
    json_with_status(a.get("/ready").await, 200).await;

    let mut on_a = Sse::open(
        a.post("/run", run_body("slow", "s1", "a long answer"))
            .await,
    )
    .await;
    let run_id = on_a.run_id();
    on_a.next_matching(Msg::is_partial).await;
    let path = format!("/apps/slow/users/{USER}/sessions/s1/stream");
    let mut follower = Sse::open(b.get(&path).await).await;

    a.signal("-TERM");
    // Not ready at once; alive still; new runs refused with Retry-After.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = a.get("/ready").await;
        if r.status() == 503 {
            assert_eq!(json_with_status(r, 503).await["code"], "shutting_down");
            break;
        }
        assert!(Instant::now() < deadline, "never turned not-ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    json_with_status(a.get("/health").await, 200).await;
    let refused = a.post("/run", run_body("slow", "s2", "too late")).await;
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(
        json_with_status(refused, 503).await["code"],
        "shutting_down"
    );

    let rest = on_a.rest().await;
    assert_eq!(done_of(&rest)["status"], "interrupted");
    let end = follower.next_matching(|m| m.event == "run_done").await;
    assert_eq!(end.data["status"], "interrupted");
    assert_eq!(end.data["runId"], run_id);
    let events = events_of(&b, "slow", "s1").await;
    assert!(unanswered_calls(&events).is_empty());
    assert_eq!(events.last().unwrap()["errorCode"], "INVOCATION_ABORTED");
    let record = json_with_status(b.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(record["status"], "interrupted");

    // The interrupted session is free at once on B, and a resume there picks up after the seal.
    let mut resume = run_body("slow", "s1", "carry on");
    resume["resume"] = json!(true);
    let mut on_b = Sse::open(b.post("/run", resume).await).await;
    let resumed_id = on_b.run_id();
    assert_ne!(resumed_id, run_id, "a new run");
    let resumed = on_b.rest().await;
    assert_eq!(done_of(&resumed)["status"], "completed", "{resumed:#?}");
    assert_eq!(
        committed(&resumed).len(),
        3,
        "call, response, reply: {resumed:#?}"
    );
    let start = follower.next_matching(|m| m.event == "run_started").await;
    assert_eq!(
        start.data["runId"], resumed_id,
        "the follower on B sees the resume"
    );
    let end = follower.next_matching(|m| m.event == "run_done").await;
    assert_eq!(end.data["runId"], resumed_id);
    assert_eq!(end.data["status"], "completed");
    let record = json_with_status(b.get(&format!("/runs/{resumed_id}")).await, 200).await;
    assert_eq!(record["status"], "completed");

    // One history: the interrupted run's events and its seal, unchanged, then the resumed
    // run's user event, call, response and reply.
    let after = events_of(&b, "slow", "s1").await;
    assert_eq!(after.len(), events.len() + 4, "{after:#?}");
    assert_eq!(
        &after[..events.len()],
        &events[..],
        "the interrupted run's history is kept"
    );
    let new = &after[events.len()..];
    assert_eq!(new[0]["author"], "user");
    assert_eq!(new[0]["content"]["parts"][0]["text"], "carry on");
    assert_eq!(new[3]["content"]["parts"][0]["text"], "carry on");
    assert!(new.iter().all(|e| e["errorCode"].is_null()), "{new:#?}");
    let invocations: std::collections::BTreeSet<&str> = new
        .iter()
        .filter_map(|e| e["invocationId"].as_str())
        .collect();
    assert_eq!(invocations.len(), 1, "one invocation: {new:#?}");
    assert_ne!(
        events.last().unwrap()["invocationId"],
        new[0]["invocationId"],
        "the resume is a new invocation after the seal"
    );
    assert!(unanswered_calls(&after).is_empty(), "{after:#?}");
}

/// One HTTP/1.1 request on an open connection; the status code and the body of the answer
/// (read by `Content-Length`). The connection stays open for the next request.
async fn raw_request(conn: &mut tokio::net::TcpStream, head: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(head.as_bytes()).await.expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(PATIENCE, conn.read(&mut chunk))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(
            n > 0,
            "the connection was closed without an answer: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap_or(0))
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = text[9..12].parse().expect("a status code");
                return (status, text[end + 4..end + 4 + len].to_string());
            }
        }
    }
}

/// SIGTERM with nothing running: for the whole `--drain-secs` the replica still answers, on a
/// new connection and on one kept alive from before, `/ready` 503 and a new run 503
/// `shutting_down` with `Retry-After` (a balancer still routing here gets an answer it can
/// retry, not a refused or reset connection), then it exits.
async fn a_draining_replica_answers_until_the_drain_ends(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("echo", "chunks: 1");
    let mut a = Replica::spawn(&db, &apps, "a", &["--drain-secs", "4"]).await;
    a.create_session("echo", "s1").await;
    let addr = a.base.trim_start_matches("http://").to_string();
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let mut kept = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    assert_eq!(raw_request(&mut kept, &get("/ready")).await.0, 200);

    a.signal("-TERM");
    // Not ready soon after the signal, on new connections: never a refused one.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut fresh = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("the listener is still open during the drain");
        let (status, body) = raw_request(&mut fresh, &get("/ready")).await;
        if status == 503 {
            assert!(body.contains("shutting_down"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "never turned not-ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The connection kept alive from before the signal is answered too.
    let (status, body) = raw_request(&mut kept, &get("/ready")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("shutting_down"), "{body}");
    let refused = a.post("/run", run_body("echo", "s1", "too late")).await;
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(
        json_with_status(refused, 503).await["code"],
        "shutting_down"
    );
    // Then it goes, on its own.
    let exited = tokio::time::timeout(PATIENCE, a.child.wait())
        .await
        .expect("agentd exits after the drain")
        .expect("wait");
    assert!(exited.success(), "{exited:?}");
}

postgres_backends!(
    kill_9_of_a_ends_bs_follower_with_abandoned_and_seals_the_dead_run,
    sigterm_drains_a_replica,
    a_draining_replica_answers_until_the_drain_ends,
);
