//! Two replicas on one database: re-attach, retry, follow, cancel and admission across them.

use super::*;
use crate::postgres_backends;

/// A slow echo with a tool call: events `functionCall`, partials, `functionResponse`, reply.
const SLOW_TOOL: &str = "chunks: 20\nchunk_delay_ms: 100\ncall_tool: lookup";

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
    // A retried cancel did what it asked: 202 with the record; who asked first is kept.
    let again = b.post(&format!("/runs/{run_id}/cancel"), json!({})).await;
    let again = json_with_status(again, 202).await;
    assert_eq!(again["status"], "cancelled");
    assert_eq!(again["cancelledBy"], record["cancelledBy"]);

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

postgres_backends!(
    re_attach_on_another_replica_mid_stream_and_after_the_end,
    an_idempotent_retry_on_another_replica_joins_the_first_run,
    a_session_follower_on_b_sees_two_runs_on_a_live,
    cancel_on_b_stops_a_run_on_a_and_seals_it,
    enqueued_runs_on_two_replicas_are_admitted_first_come_first_served,
);
