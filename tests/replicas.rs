//! Several real `agentd` processes (the built binary) on one PostgreSQL database, and on one
//! Citus cluster: re-attach and follow across replicas, cancel across replicas, a replica
//! killed with `kill -9`, and a SIGTERM drain. Plus the same routes in one process on both backends, run ownership
//! (fencing) at the store, and a panicking agent.

mod common;

use agentd::agent::{Agent, AgentResult, AgentTree, InvocationContext, PluginSet};
use agentd::event::Event;
use agentd::runner::{claim, Claim};
use agentd::store::{Fence, NewRun, RunStatus, SessionKey, StoreError};
use async_trait::async_trait;
use common::procs::{Apps, Replica, PATIENCE, USER};
use common::sse_client::{Msg, Sse};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------- harness

/// A slow echo with a tool call: events `functionCall`, partials, `functionResponse`, reply.
const SLOW_TOOL: &str = "chunks: 20\nchunk_delay_ms: 100\ncall_tool: lookup";

fn run_body(app: &str, session: &str, text: &str) -> Value {
    json!({
        "appName": app, "userId": USER, "sessionId": session,
        "newMessage": { "role": "user", "parts": [{ "text": text }] },
    })
}

/// `(seq, event id)` of each committed event among `msgs`.
fn committed(msgs: &[Msg]) -> Vec<(i64, String)> {
    msgs.iter()
        .filter(|m| m.is_committed())
        .map(|m| {
            (
                m.id.parse().expect("numeric id"),
                m.data["id"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn done_of(msgs: &[Msg]) -> &Value {
    let last = msgs.last().expect("messages");
    assert_eq!(last.event, "done", "ends with done: {msgs:#?}");
    &last.data
}

async fn events_of(r: &Replica, app: &str, session: &str) -> Vec<Value> {
    let path = format!("/apps/{app}/users/{USER}/sessions/{session}/events?limit=1000");
    json_with_status(r.get(&path).await, 200).await["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Every function call in `events` has a response after it.
fn unanswered_calls(events: &[Value]) -> Vec<String> {
    let mut open = std::collections::BTreeSet::new();
    for e in events {
        for p in e["content"]["parts"].as_array().into_iter().flatten() {
            if let Some(id) = p["functionCall"]["id"].as_str() {
                open.insert(id.to_string());
            }
            if let Some(id) = p["functionResponse"]["id"].as_str() {
                open.remove(id);
            }
        }
    }
    open.into_iter().collect()
}

/// Waits until replica `from` has announced on the replicas' notification channel that it
/// follows session `(app, user, session)`: a watch (`"t": "w"`, the session among `"ks"`; see
/// `runner::bus`), which every other replica hears on the same channel.
async fn watch_announced(
    channel: &mut sqlx::postgres::PgListener,
    from: &str,
    (app, user, session): (&str, &str, &str),
) {
    let want = json!([app, user, session]);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let heard = tokio::time::timeout(left, channel.recv())
            .await
            .unwrap_or_else(|_| panic!("replica {from} never announced a watch of {want}"))
            .expect("notification");
        // `<sending replica>\n<message or array of messages>`
        let Some((sender, body)) = heard.payload().split_once('\n') else {
            continue;
        };
        if sender != from {
            continue;
        }
        let messages = match serde_json::from_str::<Value>(body) {
            Ok(Value::Array(all)) => all,
            Ok(one) => vec![one],
            Err(_) => continue,
        };
        let watches = messages
            .iter()
            .any(|m| m["t"] == "w" && m["ks"].as_array().is_some_and(|keys| keys.contains(&want)));
        if watches {
            return;
        }
    }
}

/// Tickets taken in the run queue so far (the sequence behind `run_queue.ticket`; a fresh
/// database per test).
async fn tickets_issued(db: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM run_queue_ticket_seq",
    )
    .fetch_one(&mut *db)
    .await
    .expect("the run queue's ticket sequence")
}

/// Waits until the request that sent `text` to `slow`/`s1` has its place in line: a ticket
/// taken after `issued_before` tickets is in the queue, or it was already admitted (its user
/// event is stored: admission commits it, before the ticket is given back; a request that
/// finds the session free and nobody queued is admitted without a ticket).
async fn in_line(db: &mut sqlx::PgConnection, issued_before: i64, text: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (queued, admitted): (bool, bool) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM run_queue
                             WHERE app_name = 'slow' AND user_id = $1 AND session_id = 's1'
                               AND ticket > $2),
                    EXISTS (SELECT 1 FROM events
                             WHERE app_name = 'slow' AND user_id = $1 AND session_id = 's1'
                               AND author = 'user'
                               AND event->'content'->'parts'->0->>'text' = $3)",
        )
        .bind(USER)
        .bind(issued_before)
        .bind(text)
        .fetch_one(&mut *db)
        .await
        .expect("read the run queue");
        if queued || admitted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{text:?} never took its place in line"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ------------------------------------------------------ two replicas (PostgreSQL, Citus)

/// Replicas `a` and `b` on one fresh PostgreSQL (or Citus) database, serving the slow tool-calling echo
/// app, with session `s1` created (keep the database and apps alive as long as the replicas).
async fn two_replicas_on_slow_s1(backend: Backend) -> (TestDb, Apps, Replica, Replica) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", SLOW_TOOL);
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    a.create_session("slow", "s1").await;
    (db, apps, a, b)
}

async fn re_attach_on_another_replica_mid_stream_and_after_the_end(backend: Backend) {
    let (_db, _apps, a, b) = two_replicas_on_slow_s1(backend).await;

    let mut on_a = Sse::open(
        a.post("/run", run_body("slow", "s1", "hello replicas"))
            .await,
    )
    .await;
    let run_id = on_a.run_id();
    let first = on_a.next_matching(Msg::is_committed).await; // the functionCall
    on_a.next_matching(Msg::is_partial).await;

    // B, from the run's start: the committed call is replayed, then live frames follow.
    let mut from_start = Sse::open(b.get(&format!("/runs/{run_id}/stream")).await).await;
    // B, resuming after the first committed event (Last-Event-ID).
    let resp = b
        .client
        .get(b.url(&format!("/runs/{run_id}/stream")))
        .header("Last-Event-ID", &first.id)
        .send()
        .await
        .unwrap();
    let mut resumed = Sse::open(resp).await;

    let mut a_msgs = vec![first.clone()];
    a_msgs.extend(on_a.rest().await);
    let b_all = from_start.rest().await;
    let b_resumed = resumed.rest().await;

    let a_committed = committed(&a_msgs);
    assert_eq!(a_committed.len(), 3, "call, response, reply: {a_msgs:#?}");
    assert_eq!(
        committed(&b_all),
        a_committed,
        "replay + live = what A streamed"
    );
    assert_eq!(committed(&b_resumed), a_committed[1..].to_vec());
    assert!(
        b_all.iter().any(Msg::is_partial),
        "partial frames reach the other replica live"
    );
    assert_eq!(done_of(&b_all)["status"], "completed");
    assert_eq!(done_of(&b_all), done_of(&a_msgs), "the same done payload");
    assert_eq!(done_of(&b_resumed)["runId"], run_id);

    // After the end: replay, then done at once.
    let after = Sse::open(b.get(&format!("/runs/{run_id}/stream")).await)
        .await
        .rest()
        .await;
    assert_eq!(committed(&after), a_committed);
    assert!(!after.iter().any(Msg::is_partial));
    assert_eq!(done_of(&after), done_of(&a_msgs));
}

/// A client retries through the load balancer and lands on the other replica while its first
/// request's run is still going: the key is in the database, so B starts nothing and streams
/// A's run (replay + live) to the same end.
async fn an_idempotent_retry_on_another_replica_joins_the_first_run(backend: Backend) {
    let (_db, _apps, a, b) = two_replicas_on_slow_s1(backend).await;
    let keyed = |r: &Replica| {
        r.client
            .post(r.url("/run"))
            .header("Idempotency-Key", "retry-1")
            .json(&run_body("slow", "s1", "only once"))
    };
    let mut on_a = Sse::open(keyed(&a).send().await.unwrap()).await;
    let run_id = on_a.run_id();
    on_a.next_matching(Msg::is_committed).await; // the functionCall: the run is under way

    let retry = keyed(&b).send().await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let mut on_b = Sse::open(retry).await;
    assert_eq!(on_b.run_id(), run_id, "the first run, not a second one");
    let b_msgs = on_b.rest().await;
    let a_rest = on_a.rest().await;
    assert_eq!(done_of(&b_msgs), done_of(&a_rest), "the same end");
    assert_eq!(done_of(&b_msgs)["status"], "completed");
    assert_eq!(
        committed(&b_msgs).len(),
        3,
        "call, response and reply, replayed and live: {b_msgs:#?}"
    );
    let events = events_of(&a, "slow", "s1").await;
    assert_eq!(events.len(), 4, "one user event and one run's three events");
    // A different body under the same key is refused on either replica.
    let other = b
        .client
        .post(b.url("/run"))
        .header("Idempotency-Key", "retry-1")
        .json(&run_body("slow", "s1", "something else"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_with_status(other, 422).await["code"],
        "idempotency_key_reused"
    );
}

async fn a_session_follower_on_b_sees_two_runs_on_a_live(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", "chunks: 10\nchunk_delay_ms: 50");
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    a.create_session("slow", "s1").await;

    // The replicas' notification channel, heard as A hears it.
    let mut channel = sqlx::postgres::PgListener::connect(&db.url)
        .await
        .expect("listen");
    channel
        .listen(agentd::runner::bus::CHANNEL)
        .await
        .expect("listen");
    let path = format!("/apps/slow/users/{USER}/sessions/s1/stream?after=0");
    let mut follower = Sse::open(b.get(&path).await).await;
    // The follower's watch (B announces it at subscribe time) is out to A before the run
    // starts: the session's live frames are sent to B from the run's first chunk.
    watch_announced(&mut channel, "b", ("slow", USER, "s1")).await;
    drop(channel);
    let mut a_committed = vec![];
    for text in ["first run", "second run"] {
        let msgs = Sse::open(a.post("/run", run_body("slow", "s1", text)).await)
            .await
            .rest()
            .await;
        assert_eq!(done_of(&msgs)["status"], "completed");
        a_committed.extend(committed(&msgs));
    }
    let mut seen = vec![];
    let mut partials = 0;
    let mut runs_done = 0;
    while runs_done < 2 {
        let m = follower.next().await.expect("follower stream open");
        match m.event.as_str() {
            "run_done" => runs_done += 1,
            "message" if m.is_partial() => partials += 1,
            "message" => seen.push((
                m.id.parse::<i64>().unwrap(),
                m.data["author"].as_str().unwrap_or("").to_string(),
            )),
            _ => {}
        }
    }
    let seqs: Vec<i64> = seen.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "every committed event once, in order");
    let authors: Vec<&str> = seen.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!(authors, ["user", "slow", "user", "slow"]);
    assert!(partials > 0, "live partial frames from the other replica");
    assert_eq!(a_committed.len(), 2);
}

async fn cancel_on_b_stops_a_run_on_a_and_seals_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo(
        "slow",
        "chunks: 200\nchunk_delay_ms: 100\ncall_tool: lookup",
    );
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    a.create_session("slow", "s1").await;

    let mut on_a = Sse::open(
        a.post("/run", run_body("slow", "s1", "cancel me please"))
            .await,
    )
    .await;
    let run_id = on_a.run_id();
    on_a.next_matching(Msg::is_partial).await;
    let asked = Instant::now();
    let resp = b
        .post(
            &format!("/runs/{run_id}/cancel"),
            json!({"reason": "user pressed stop"}),
        )
        .await;
    let record = json_with_status(resp, 202).await;
    assert_eq!(record["cancelReason"], "user pressed stop");
    let rest = on_a.rest().await;
    let took = asked.elapsed();
    assert_eq!(done_of(&rest)["status"], "cancelled");
    // Not a timing assertion: the lease-based path needed seconds; report what we saw.
    eprintln!("cross-replica cancel reached the end of A's stream after {took:?}");

    let events = events_of(&b, "slow", "s1").await;
    assert!(unanswered_calls(&events).is_empty(), "sealed: {events:#?}");
    assert_eq!(events.last().unwrap()["errorCode"], "INVOCATION_ABORTED");
    let record = json_with_status(b.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(record["status"], "cancelled");
    // A second cancel is answered as "already ended"; who asked first is kept.
    let again = b.post(&format!("/runs/{run_id}/cancel"), json!({})).await;
    assert_eq!(json_with_status(again, 409).await["code"], "run_not_active");

    // The session stop button, before the client knows the run id.
    let mut on_a = Sse::open(a.post("/run", run_body("slow", "s1", "stop button")).await).await;
    on_a.next_matching(Msg::is_partial).await;
    let stop = format!("/apps/slow/users/{USER}/sessions/s1/cancel");
    let record = json_with_status(b.post(&stop, json!({})).await, 202).await;
    assert_eq!(record["runId"], on_a.run_id());
    assert_eq!(done_of(&on_a.rest().await)["status"], "cancelled");
    let none = b.post(&stop, json!({})).await;
    assert_eq!(json_with_status(none, 409).await["code"], "no_active_run");
}

async fn enqueued_runs_on_two_replicas_are_admitted_first_come_first_served(backend: Backend) {
    use sqlx::Connection;
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("slow", "chunks: 5\nchunk_delay_ms: 100");
    let a = Arc::new(Replica::spawn(&db, &apps, "a", &[]).await);
    let b = Arc::new(Replica::spawn(&db, &apps, "b", &[]).await);
    a.create_session("slow", "s1").await;
    let mut first = Sse::open(a.post("/run", run_body("slow", "s1", "holder")).await).await;
    first.next_matching(Msg::is_partial).await;
    let mut direct = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    // Waiters arrive alternately on B and A, each once the one before has its place in line.
    let mut waiters = vec![];
    for i in 0..4 {
        let replica = if i % 2 == 0 { b.clone() } else { a.clone() };
        let text = format!("waiter {i}");
        let mut body = run_body("slow", "s1", &text);
        body["onBusy"] = json!("enqueue");
        let issued = tickets_issued(&mut direct).await;
        waiters.push(tokio::spawn(async move {
            Sse::open(replica.post("/run", body).await)
                .await
                .rest()
                .await
        }));
        in_line(&mut direct, issued, &text).await;
    }
    assert_eq!(done_of(&first.rest().await)["status"], "completed");
    for w in waiters {
        assert_eq!(done_of(&w.await.unwrap())["status"], "completed");
    }
    let events = events_of(&a, "slow", "s1").await;
    let users: Vec<String> = events
        .iter()
        .filter(|e| e["author"] == "user")
        .map(|e| {
            e["content"]["parts"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(
        users,
        ["holder", "waiter 0", "waiter 1", "waiter 2", "waiter 3"]
    );
}

async fn kill_9_of_a_ends_bs_follower_with_abandoned_and_seals_the_dead_run(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo(
        "slow",
        "chunks: 200\nchunk_delay_ms: 100\ncall_tool: lookup",
    );
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
        &["--drain-secs", "1", "--shutdown-grace-secs", "5"],
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

// --------------------------------------------------------------- one process, both backends

async fn re_attach_in_one_process_and_bad_input(backend: Backend) {
    let apps = Apps::new().echo("slow", "chunks: 10\nchunk_delay_ms: 50\ncall_tool: lookup");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, |args| args.apps_dir = dir).await;
    json_with_status(
        s.post_json(
            &format!("/apps/slow/users/{USER}/sessions"),
            json!({"sessionId": "s1"}),
        )
        .await,
        200,
    )
    .await;
    let mut live = Sse::open(
        s.post_json("/run", run_body("slow", "s1", "same process"))
            .await,
    )
    .await;
    let run_id = live.run_id();
    let first = live.next_matching(Msg::is_committed).await;
    let resp = s
        .client
        .get(s.url(&format!("/runs/{run_id}/stream")))
        .header("Last-Event-ID", &first.id)
        .send()
        .await
        .unwrap();
    let mut attached = Sse::open(resp).await;
    let mut original = vec![first];
    original.extend(live.rest().await);
    let again = attached.rest().await;
    assert_eq!(committed(&again), committed(&original)[1..].to_vec());
    assert_eq!(done_of(&again), done_of(&original));

    // Bad input: a clear error, nothing changed.
    let bad = s
        .client
        .get(s.url(&format!("/runs/{run_id}/stream")))
        .header("Last-Event-ID", "seven")
        .send()
        .await
        .unwrap();
    assert_eq!(json_with_status(bad, 422).await["code"], "validation_error");
    let beyond = s.get(&format!("/runs/{run_id}/stream?after=999")).await;
    assert_eq!(
        json_with_status(beyond, 400).await["code"],
        "after_beyond_end"
    );
    let missing = s.get("/runs/run-nope/stream").await;
    assert_eq!(
        json_with_status(missing, 404).await["code"],
        "run_not_found"
    );
    let follow_missing = s
        .get(&format!("/apps/slow/users/{USER}/sessions/nope/stream"))
        .await;
    assert_eq!(
        json_with_status(follow_missing, 404).await["code"],
        "session_not_found"
    );
    let stop = s
        .post_json(
            &format!("/apps/slow/users/{USER}/sessions/s1/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(json_with_status(stop, 409).await["code"], "no_active_run");
    let bad_body = s
        .post_json(
            &format!("/apps/slow/users/{USER}/sessions/s1/cancel"),
            json!({"why": 1}),
        )
        .await;
    assert_eq!(
        json_with_status(bad_body, 422).await["code"],
        "validation_error"
    );
    let nul = s
        .post_json(
            &format!("/apps/slow/users/{USER}/sessions/s1/cancel"),
            json!({"reason": "stop\u{0}"}),
        )
        .await;
    assert_eq!(json_with_status(nul, 422).await["code"], "nul_character");
}

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
        .heartbeat("live", Duration::from_secs(10), false)
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
        .append_fenced(&key, stale, vec![], Fence::Run("old"))
        .await;
    assert!(matches!(refused, Err(StoreError::NotOwner)), "{refused:?}");
    let ok = store
        .append_fenced(
            &key,
            Event::new("e-new", "agent"),
            vec![],
            Fence::Run("new"),
        )
        .await
        .unwrap();
    assert_eq!(ok.seq, 1, "the refused append left no trace");
    assert!(
        !store
            .finish_run(&key.user_id, "old", RunStatus::Cancelled, None, None)
            .await
            .unwrap(),
        "the old run cannot record an outcome"
    );
    let old = store.get_run("old").await.unwrap().unwrap();
    assert_eq!(old.status, RunStatus::Abandoned);
    // An append is idempotent on the event id (how a lost acknowledgement is resolved).
    let again = store
        .append_fenced(&key, ok.event.clone(), vec![], Fence::Run("new"))
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
        .finish_run(&key.user_id, "new", RunStatus::Completed, Some(1), None)
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

struct Panics;

#[async_trait]
impl Agent for Panics {
    fn name(&self) -> &str {
        "panics"
    }
    fn description(&self) -> &str {
        "panics when asked"
    }
    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        if ctx.user_text().contains("panic") {
            panic!("deliberate panic in an agent");
        }
        ctx.emit(
            ctx.new_event()
                .with_content(agentd::event::Content::text("model", "fine")),
        )
        .await?;
        Ok(())
    }
}

async fn a_panicking_agent_fails_its_run_and_frees_the_session(backend: Backend) {
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert("p", AgentTree::new(Arc::new(Panics)).expect("tree"));
    let s = TestServer::start_embedded(backend, apps, PluginSet::default()).await;
    let body = |text: &str| {
        json!({"appName": "p", "userId": USER, "sessionId": "s1", "createSession": true,
               "newMessage": {"role": "user", "parts": [{"text": text}]}})
    };
    let msgs = Sse::open(s.post_json("/run", body("please panic")).await)
        .await
        .rest()
        .await;
    assert!(msgs.iter().any(|m| m.event == "error"), "{msgs:#?}");
    assert_eq!(done_of(&msgs)["status"], "failed");
    let msgs = Sse::open(s.post_json("/run", body("and now?")).await)
        .await
        .rest()
        .await;
    assert_eq!(
        done_of(&msgs)["status"],
        "completed",
        "the session is free again"
    );
}

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

/// `--max-run-secs` is a hard limit even when the client does not read: the run is timed out,
/// sealed and recorded on time, and a re-attach reads its end.
async fn a_client_that_never_reads_does_not_hold_the_run_past_its_limit(backend: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let apps = Apps::new().echo("big", "chunks: 3000");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, |args| {
        args.apps_dir = dir;
        args.max_run_secs = 2;
    })
    .await;
    // Several MiB of partial frames: more than the socket buffers hold.
    let body = json!({"appName": "big", "userId": USER, "sessionId": "s1", "createSession": true,
        "newMessage": {"role": "user", "parts": [{"text": "z".repeat(6 * 1024 * 1024)}]}})
    .to_string();
    let addr: std::net::SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut conn = sock.connect(addr).await.unwrap();
    let req = format!(
        "POST /run HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 2048];
    let n = conn.read(&mut head).await.unwrap();
    let head = String::from_utf8_lossy(&head[..n]).to_string();
    let run_id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-agentd-run-id: "))
        .unwrap_or_else(|| panic!("no run id in {head}"))
        .trim()
        .to_string();
    // Never read again. The run must still end on time.
    let deadline = Instant::now() + PATIENCE;
    let record = loop {
        let r = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
        if r["status"] != "running" {
            break r;
        }
        assert!(Instant::now() < deadline, "the run outlived its limit: {r}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(record["status"], "timed_out");
    let end = Sse::open(s.get(&format!("/runs/{run_id}/stream?after=0")).await)
        .await
        .rest()
        .await;
    assert_eq!(done_of(&end)["status"], "timed_out");
    drop(conn);
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

/// An event held back for the run's outcome (`emit_final`) reaches the client within the hold
/// limit when the run goes on without reporting anything: here the agent waits until the
/// client has seen it.
async fn a_held_reply_reaches_the_client_while_the_run_goes_on(backend: Backend) {
    let seen = Arc::new(tokio::sync::Notify::new());
    let agent = WaitsAfterReply { seen: seen.clone() };
    let s = TestServer::start_agent(backend, "held", Arc::new(agent), PluginSet::default()).await;
    let body = json!({"appName": "held", "userId": USER, "sessionId": "s1", "createSession": true,
        "newMessage": {"role": "user", "parts": [{"text": "hi"}]}});
    let mut sse = Sse::open(s.post_json("/run", body).await).await;
    let first = tokio::time::timeout(
        Duration::from_secs(30),
        sse.next_matching(Msg::is_committed),
    )
    .await
    .expect("the held reply never reached the client while its run went on");
    assert_eq!(first.id, "2");
    assert_eq!(first.data["content"]["parts"][0]["text"], "first");
    seen.notify_one();
    let rest = sse.rest().await;
    let committed: Vec<&Msg> = rest.iter().filter(|m| m.is_committed()).collect();
    assert_eq!(committed.len(), 1, "{rest:#?}");
    assert_eq!(committed[0].id, "3");
    assert_eq!(done_of(&rest)["status"], "completed");
    let session = json_with_status(
        s.get(&format!("/apps/held/users/{USER}/sessions/s1")).await,
        200,
    )
    .await;
    let texts: Vec<&str> = session["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["content"]["parts"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["hi", "first", "second"]);
    assert_eq!(session["state"]["replies"], 2, "both deltas stored");
}

/// Reports a final-looking reply, waits until the test saw it, then reports another.
struct WaitsAfterReply {
    seen: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl Agent for WaitsAfterReply {
    fn name(&self) -> &str {
        "waits"
    }
    fn description(&self) -> &str {
        "replies, waits, replies again"
    }
    async fn run(&self, ctx: &InvocationContext) -> AgentResult {
        let mut first = ctx
            .new_event()
            .with_content(agentd::event::Content::text("model", "first"));
        first.actions.state_delta.insert("replies".into(), json!(1));
        ctx.emit_final(first).await?;
        // The run's state has the held event's delta at once.
        assert_eq!(ctx.state_get("replies"), Some(json!(1)));
        self.seen.notified().await;
        let mut second = ctx
            .new_event()
            .with_content(agentd::event::Content::text("model", "second"));
        second
            .actions
            .state_delta
            .insert("replies".into(), json!(2));
        ctx.emit_final(second).await
    }
}

/// The run's last write can record its outcome ([`Fence::RunEnd`]): the event, the run's
/// `completed` status with that seq and the freed session commit together, and only while the
/// run owns the session.
async fn a_run_s_last_event_records_its_outcome(backend: Backend) {
    let (_db, store, key) = store_with_session(backend, json!({})).await;
    store
        .heartbeat("live", Duration::from_secs(10), false)
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
        .append_fenced(&key, reply, vec![], Fence::RunEnd("r1"))
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
    for fence in [Fence::RunEnd("r1"), Fence::Run("r1")] {
        let late = store
            .append_fenced(&key, Event::new("e-r1", "agent"), vec![], fence)
            .await;
        assert!(matches!(late, Err(StoreError::NotOwner)), "{late:?}");
    }
    assert_eq!(store.session_head(&key).await.unwrap().unwrap().last_seq, 1);
    assert!(
        !store
            .finish_run(&key.user_id, "r1", RunStatus::Failed, None, None)
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
        .append_fenced(&key, twice.clone(), vec![], Fence::Run("r2"))
        .await
        .unwrap();
    let again = store
        .append_fenced(&key, twice, vec![], Fence::RunEnd("r2"))
        .await
        .unwrap();
    assert_eq!((first.seq, again.seq), (2, 2), "stored once");
    assert_eq!(
        store.get_run("r2").await.unwrap().unwrap().status,
        RunStatus::Running
    );
    assert!(store
        .finish_run(&key.user_id, "r2", RunStatus::Completed, Some(2), None)
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
        .heartbeat("live", Duration::from_secs(10), false)
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
        .finish_run(&key.user_id, "r1", RunStatus::Completed, Some(1), None)
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
            .finish_run(&key.user_id, "r2", RunStatus::Completed, Some(3), None)
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
    assert!(store.expire_run(&dead).await.unwrap());
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

both_backends!(
    a_held_reply_reaches_the_client_while_the_run_goes_on,
    a_run_s_last_event_records_its_outcome,
    admission_commits_the_user_event,
    a_client_that_never_reads_does_not_hold_the_run_past_its_limit,
    re_attach_in_one_process_and_bad_input,
    a_run_that_lost_its_session_cannot_write_into_it,
    a_panicking_agent_fails_its_run_and_frees_the_session,
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

postgres_backends!(
    re_attach_on_another_replica_mid_stream_and_after_the_end,
    an_idempotent_retry_on_another_replica_joins_the_first_run,
    a_session_follower_on_b_sees_two_runs_on_a_live,
    cancel_on_b_stops_a_run_on_a_and_seals_it,
    enqueued_runs_on_two_replicas_are_admitted_first_come_first_served,
    kill_9_of_a_ends_bs_follower_with_abandoned_and_seals_the_dead_run,
    sigterm_drains_a_replica,
    a_draining_replica_answers_until_the_drain_ends,
);
