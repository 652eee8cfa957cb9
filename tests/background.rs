//! Runs without a client, end to end over real processes: webhooks signed the Standard
//! Webhooks way and checked by the real `standardwebhooks` Python package, retried with the
//! same `webhook-id`, and delivered after a crash; schedules that fire each tick once across
//! two replicas while one is killed; and the refusals that store nothing.

mod common;

use common::clients::python;
use common::procs::{Apps, Replica, USER};
use common::{json_with_status, Backend, TestDb, TestServer};
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The Python receiver (`tests/clients/python/webhook_receiver.py`): each delivery it got,
/// as the line it printed.
struct Receiver {
    child: tokio::process::Child,
    port: u16,
    lines: tokio::sync::mpsc::UnboundedReceiver<Value>,
}

impl Receiver {
    async fn start(args: &[&str]) -> Receiver {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/python/webhook_receiver.py"
        );
        let mut child = tokio::process::Command::new(python())
            .arg(script)
            .args(["--secret", SECRET])
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the webhook receiver");
        let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), out.next_line())
            .await
            .expect("the receiver printed its port")
            .expect("read")
            .expect("a line");
        let port = serde_json::from_str::<Value>(&first).expect("JSON")["port"]
            .as_u64()
            .expect("port") as u16;
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                if let Ok(v) = serde_json::from_str(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        Receiver { child, port, lines }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// The next delivery, within `within`.
    async fn next(&mut self, within: Duration) -> Value {
        tokio::time::timeout(within, self.lines.recv())
            .await
            .expect("a delivery arrived in time")
            .expect("the receiver is running")
    }
}

fn run_body(text: &str, webhook: Value) -> Value {
    json!({
        "newMessage": {"role": "user", "parts": [{"text": text}]},
        "webhook": webhook,
    })
}

/// A background run with a webhook: the receiver answers 500 twice, then 200. Three
/// attempts, one `webhook-id`, every signature valid; the body carries the run and its final
/// text; `GET /runs/{id}` shows the delivery.
async fn a_webhook_is_signed_retried_and_delivered_once(backend: Backend) {
    let mut receiver = Receiver::start(&["--fail", "2"]).await;
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("echo", "chunks: 2");
    let replica = Replica::spawn(&db, &apps, "w1", &["--webhook-allow-private", "127.0.0.1"]).await;
    replica.create_session("echo", "s1").await;
    let started = json_with_status(
        replica
            .post(
                &format!("/apps/echo/users/{USER}/sessions/s1/runs"),
                run_body(
                    "hello hooks",
                    json!({"url": receiver.url(), "secret": SECRET}),
                ),
            )
            .await,
        202,
    )
    .await;
    let run_id = started["runId"].as_str().expect("runId").to_string();
    let ended = json_with_status(
        replica
            .post(&format!("/runs/{run_id}/wait"), json!({}))
            .await,
        200,
    )
    .await;
    assert_eq!(ended["status"], "completed");

    let mut attempts = vec![];
    loop {
        let d = receiver.next(Duration::from_secs(30)).await;
        let status = d["status"].as_u64();
        attempts.push(d);
        if status == Some(200) {
            break;
        }
        assert!(
            attempts.len() < 3,
            "more attempts than expected: {attempts:?}"
        );
    }
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    let ids: Vec<&Value> = attempts.iter().map(|d| &d["webhookId"]).collect();
    assert!(
        ids.iter().all(|id| *id == ids[0] && id.is_string()),
        "one webhook-id: {ids:?}"
    );
    for (i, d) in attempts.iter().enumerate() {
        assert_eq!(
            d["verified"], true,
            "signature checked by standardwebhooks: {d}"
        );
        assert_eq!(d["attempt"], i as u64 + 1);
        assert_eq!(
            d["payload"], attempts[0]["payload"],
            "the same body on every attempt"
        );
    }
    let statuses: Vec<u64> = attempts
        .iter()
        .filter_map(|d| d["status"].as_u64())
        .collect();
    assert_eq!(statuses, [500, 500, 200]);
    let body = &attempts[2]["payload"];
    assert_eq!(body["type"], "run.completed");
    assert_eq!(body["data"]["runId"], run_id.as_str());
    assert_eq!(body["data"]["sessionId"], "s1");
    assert_eq!(body["data"]["status"], "completed");
    assert!(
        body["data"]["text"]
            .as_str()
            .unwrap_or("")
            .contains("hello hooks"),
        "{body}"
    );
    assert!(body["data"]["lastSeq"].as_i64().is_some());

    // The run shows its delivery (after the receiver's answer is recorded).
    let deadline = Instant::now() + Duration::from_secs(10);
    let run = loop {
        let run = json_with_status(replica.get(&format!("/runs/{run_id}")).await, 200).await;
        if run["webhooks"][0]["status"] == "delivered" || Instant::now() > deadline {
            break run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let hook = &run["webhooks"][0];
    assert_eq!(hook["status"], "delivered", "{run}");
    assert_eq!(hook["attempts"], 3);
    assert_eq!(hook["id"], attempts[0]["webhookId"]);
    assert_eq!(hook["lastStatus"], 200);
    assert!(hook.get("secret").is_none() && !run.to_string().contains(SECRET));
}

/// agentd is killed (SIGKILL) after the run ended and before the receiver could take the
/// delivery (it is not listening yet); a new process delivers it, with the same id.
async fn a_webhook_is_delivered_after_a_crash() {
    let db = TestDb::new(Backend::Postgres).await;
    let apps = Apps::new().echo("echo", "chunks: 1");
    // A port nobody listens on yet: every attempt before the receiver starts fails.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let flags = ["--webhook-allow-private", "127.0.0.1"];
    let mut first = Replica::spawn(&db, &apps, "crash-1", &flags).await;
    first.create_session("echo", "s1").await;
    let started = json_with_status(
        first
            .post(
                &format!("/apps/echo/users/{USER}/sessions/s1/runs"),
                run_body("before the crash", json!({"url": url, "secret": SECRET})),
            )
            .await,
        202,
    )
    .await;
    let run_id = started["runId"].as_str().expect("runId").to_string();
    let ended = json_with_status(
        first.post(&format!("/runs/{run_id}/wait"), json!({})).await,
        200,
    )
    .await;
    assert_eq!(ended["status"], "completed");
    first.signal("-KILL");
    let _ = first.child.wait().await;

    let mut receiver = Receiver::start(&["--port", &port.to_string()]).await;
    let second = Replica::spawn(&db, &apps, "crash-2", &flags).await;
    let d = receiver.next(Duration::from_secs(60)).await;
    assert_eq!(d["verified"], true, "{d}");
    assert_eq!(d["status"], 200);
    assert_eq!(d["payload"]["data"]["runId"], run_id.as_str());
    assert_eq!(d["payload"]["data"]["text"], "before the crash");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let run = json_with_status(second.get(&format!("/runs/{run_id}")).await, 200).await;
        if run["webhooks"][0]["status"] == "delivered" {
            assert_eq!(run["webhooks"][0]["id"], d["webhookId"]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never recorded as delivered: {run}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Exactly one delivery arrived.
    assert!(
        tokio::time::timeout(Duration::from_secs(2), receiver.lines.recv())
            .await
            .is_err(),
        "a second delivery arrived"
    );
    drop(receiver.child);
}

/// Two replicas fire a schedule every 2 seconds for about 20 seconds; one is killed with
/// SIGKILL half way. Every tick from the first to the last fires exactly once, each with its
/// own run.
async fn a_schedule_fires_each_tick_once_across_replicas_and_a_kill() {
    let db = TestDb::new(Backend::Postgres).await;
    let apps = Apps::new().echo("echo", "chunks: 1");
    let flags = ["--run-lease-secs", "2", "--schedule-poll-ms", "200"];
    let a = Replica::spawn(&db, &apps, "tick-a", &flags).await;
    let b = Replica::spawn(&db, &apps, "tick-b", &flags).await;
    let created = json_with_status(
        a.post(
            &format!("/apps/echo/users/{USER}/schedules"),
            json!({"cron": "*/2 * * * * *", "message": "tick", "session": "new"}),
        )
        .await,
        201,
    )
    .await;
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["timezone"], "UTC");
    assert_eq!(created["catchUp"], "one");
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut a = a;
    a.signal("-KILL");
    let _ = a.child.wait().await;
    let killed_at = start.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stopped = json_with_status(
        b.client
            .patch(b.url(&format!("/apps/echo/users/{USER}/schedules/{id}")))
            .json(&json!({"enabled": false}))
            .send()
            .await
            .expect("PATCH"),
        200,
    )
    .await;
    assert_eq!(stopped["enabled"], false);
    assert!(stopped.get("nextTick").is_none());
    // Whatever was claimed before the pause starts (or is taken over) within a lease or two.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let page = json_with_status(
        b.get(&format!(
            "/apps/echo/users/{USER}/schedules/{id}/runs?limit=200"
        ))
        .await,
        200,
    )
    .await;
    let mut ticks: Vec<Value> = page["ticks"].as_array().expect("ticks").clone();
    ticks.sort_by(|x, y| {
        x["tickTime"]
            .as_f64()
            .partial_cmp(&y["tickTime"].as_f64())
            .expect("times")
    });
    let times: Vec<f64> = ticks
        .iter()
        .map(|t| t["tickTime"].as_f64().expect("time"))
        .collect();
    assert!(times.len() >= 8, "ticks: {ticks:?}");
    let expected = ((times[times.len() - 1] - times[0]) / 2.0).round() as usize + 1;
    let mut runs: Vec<&str> = ticks
        .iter()
        .map(|t| t["runId"].as_str().expect("run"))
        .collect();
    runs.sort();
    runs.dedup();
    eprintln!(
        "schedule kill test: {} ticks fired, {expected} expected from {} to {} (replica killed \
         at {:.1} s); statuses {:?}",
        times.len(),
        times[0],
        times[times.len() - 1],
        killed_at.as_secs_f64(),
        ticks
            .iter()
            .map(|t| t["status"].as_str().unwrap_or(""))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        times.len(),
        expected,
        "a tick was lost or doubled: {times:?}"
    );
    assert_eq!(runs.len(), times.len(), "one run per tick");
    for t in &ticks {
        assert_eq!(t["status"], "started", "{t}");
        let run = json_with_status(
            b.get(&format!("/runs/{}", t["runId"].as_str().unwrap_or("")))
                .await,
            200,
        )
        .await;
        assert_ne!(run["status"], "running", "{run}");
    }
    // Each run is an ordinary run of the user, in its own session.
    let listed = json_with_status(
        b.get(&format!("/apps/echo/users/{USER}/runs?limit=200"))
            .await,
        200,
    )
    .await;
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(times.len()));
}

/// Bad schedules and webhooks are refused with a stable code, and nothing is stored.
async fn bad_schedules_and_webhooks_are_refused(backend: Backend) {
    let s = TestServer::start(backend).await;
    let path = format!("/apps/echo/users/{USER}/schedules");
    let cases = [
        (
            json!({"cron": "* * *", "message": "x"}),
            422,
            "invalid_cron",
        ),
        (
            json!({"cron": "61 * * * *", "message": "x"}),
            422,
            "invalid_cron",
        ),
        (
            json!({"cron": "* * * * *", "timezone": "Mars/Olympus", "message": "x"}),
            422,
            "invalid_timezone",
        ),
        (
            json!({"cron": "* * * * *", "message": ""}),
            422,
            "invalid_message",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "catchUp": "all"}),
            422,
            "validation_error",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "session": "a/b"}),
            400,
            "invalid_id",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "ftp://example.com/", "secret": SECRET}}),
            422,
            "webhook_url_invalid",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "http://127.0.0.1:9/", "secret": SECRET}}),
            422,
            "webhook_url_refused",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "http://localhost:9/", "secret": SECRET}}),
            422,
            "webhook_url_refused",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "https://example.com/", "secret": "hunter2"}}),
            422,
            "webhook_secret_invalid",
        ),
        (
            json!({"cron": "* * * * *", "message": "x", "webhook": {"url": "https://example.com/"}}),
            422,
            "webhook_secret_required",
        ),
    ];
    for (body, status, code) in &cases {
        let resp = s.post_json(&path, body.clone()).await;
        let got = json_with_status(resp, *status).await;
        assert_eq!(got["code"], *code, "{body} → {got}");
    }
    let unknown = json_with_status(
        s.post_json(
            &format!("/apps/nope/users/{USER}/schedules"),
            json!({"cron": "* * * * *", "message": "x"}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(unknown["code"], "app_not_found");
    let listed = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(listed["schedules"], json!([]), "nothing stored");

    // A run with a refused webhook does not start: no run, no event.
    let created = s
        .post_json(
            &format!("/apps/echo/users/{USER}/sessions"),
            json!({"sessionId": "s1"}),
        )
        .await;
    json_with_status(created, 200).await;
    for (webhook, code) in [
        (
            json!({"url": "http://10.0.0.1/", "secret": SECRET}),
            "webhook_url_refused",
        ),
        (
            json!({"url": "https://example.com/", "secret": SECRET, "events": ["run.exploded"]}),
            "webhook_event_unknown",
        ),
    ] {
        let resp = s
            .post_json(
                "/run",
                json!({"appName": "echo", "userId": USER, "sessionId": "s1",
                       "newMessage": {"role": "user", "parts": [{"text": "x"}]},
                       "webhook": webhook}),
            )
            .await;
        let got = json_with_status(resp, 422).await;
        assert_eq!(got["code"], code, "{got}");
    }
    let session = json_with_status(
        s.get(&format!("/apps/echo/users/{USER}/sessions/s1")).await,
        200,
    )
    .await;
    assert_eq!(session["events"], json!([]), "nothing stored");
    let runs = json_with_status(s.get(&format!("/apps/echo/users/{USER}/runs")).await, 200).await;
    assert_eq!(runs["runs"], json!([]));
}

/// A schedule's life through the API: created, read, listed, changed, paused, deleted; and
/// another user's schedule is not found.
async fn schedules_belong_to_their_user(backend: Backend) {
    let s = TestServer::start_with(backend, |a| a.background.scheduler = false).await;
    let path = format!("/apps/echo/users/{USER}/schedules");
    let created = json_with_status(
        s.post_json(
            &path,
            json!({"cron": "0 9 * * 1-5", "timezone": "Europe/Paris", "message": "standup",
                   "session": "daily", "onBusy": "enqueue", "catchUp": "none"}),
        )
        .await,
        201,
    )
    .await;
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["session"], "daily");
    assert_eq!(created["onBusy"], "enqueue");
    assert_eq!(created["message"]["parts"][0]["text"], "standup");
    let next = created["nextTick"].as_f64().expect("nextTick");
    assert!(next > agentd::event::now_ts());
    let one = json_with_status(s.get(&format!("{path}/{id}")).await, 200).await;
    assert_eq!(one["id"], id.as_str());
    let other = json_with_status(
        s.get(&format!("/apps/echo/users/u2/schedules/{id}")).await,
        404,
    )
    .await;
    assert_eq!(other["code"], "schedule_not_found");
    let other = json_with_status(
        s.delete(&format!("/apps/echo/users/u2/schedules/{id}"))
            .await,
        404,
    )
    .await;
    assert_eq!(other["code"], "schedule_not_found");
    let listed = json_with_status(s.get("/apps/echo/users/u2/schedules").await, 200).await;
    assert_eq!(listed["schedules"], json!([]));

    let paused = json_with_status(
        s.patch_json(&format!("{path}/{id}"), json!({"enabled": false}))
            .await,
        200,
    )
    .await;
    assert_eq!(paused["enabled"], false);
    assert!(paused.get("nextTick").is_none());
    let bad = json_with_status(
        s.patch_json(&format!("{path}/{id}"), json!({"cron": "nope"}))
            .await,
        422,
    )
    .await;
    assert_eq!(bad["code"], "invalid_cron");
    let resumed = json_with_status(
        s.patch_json(
            &format!("{path}/{id}"),
            json!({"enabled": true, "cron": "*/5 * * * *", "timezone": "UTC"}),
        )
        .await,
        200,
    )
    .await;
    assert_eq!(resumed["cron"], "*/5 * * * *");
    assert!(resumed["nextTick"].as_f64().expect("nextTick") <= agentd::event::now_ts() + 300.0);
    let listed = json_with_status(s.get(&path).await, 200).await;
    assert_eq!(listed["schedules"].as_array().map(Vec::len), Some(1));
    let ticks = json_with_status(s.get(&format!("{path}/{id}/runs")).await, 200).await;
    assert_eq!(ticks["ticks"], json!([]));
    assert_eq!(s.delete(&format!("{path}/{id}")).await.status(), 204);
    json_with_status(s.get(&format!("{path}/{id}")).await, 404).await;
}

both_backends!(
    a_webhook_is_signed_retried_and_delivered_once,
    bad_schedules_and_webhooks_are_refused,
    schedules_belong_to_their_user,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_survives_a_crash_between_the_runs_end_and_its_delivery() {
    a_webhook_is_delivered_after_a_crash().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_ticks_fire_once_across_replicas_when_one_is_killed() {
    a_schedule_fires_each_tick_once_across_replicas_and_a_kill().await;
}

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
        .finish_run(&run.key.user_id, "run-1", RunStatus::Completed, None, None)
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
    };
    store.create_schedule(&schedule).await.expect("create");
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
    store.create_schedule(&again).await.expect("create");
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
        .finish_run(USER, "run-2", RunStatus::Completed, None, None)
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

/// An app's own webhooks (`agentd.yaml`), with the events it asked for: a run that waits for
/// its user is `run.input_required`, a failed run `run.failed`, and a plain completed run is
/// not sent (`skipped`). The app's `allow_private` lets it reach the receiver without any
/// server flag. An app whose webhook is refused does not load.
async fn an_apps_webhooks_send_the_events_it_asked_for(backend: Backend) {
    let mut receiver = Receiver::start(&[]).await;
    let apps = Apps::new()
        .echo("hooked", "chunks: 1\nfail_prefix: fail\nask_prefix: ask")
        .echo("broken", "chunks: 1");
    let hooked = format!(
        "webhooks:\n  - url: {}\n    secret: ${{AGENTD_TEST_HOOK_SECRET:-{SECRET}}}\n    \
         events: [run.failed, run.input_required]\n    allow_private: [127.0.0.1]\n",
        receiver.url()
    );
    std::fs::write(apps.path().join("hooked/agentd.yaml"), hooked).expect("settings");
    std::fs::write(
        apps.path().join("broken/agentd.yaml"),
        format!("webhooks:\n  - url: ftp://example.com/\n    secret: {SECRET}\n"),
    )
    .expect("settings");
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = dir).await;
    let run = |app: &'static str, session: &'static str, text: &'static str| {
        let s = &s;
        async move {
            let body = json!({"appName": app, "userId": USER, "sessionId": session,
                              "createSession": true,
                              "newMessage": {"role": "user", "parts": [{"text": text}]}});
            let resp = s.post_json("/run", body).await;
            let status = resp.status().as_u16();
            let run_id = resp
                .headers()
                .get("x-agentd-run-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            (status, run_id, resp.text().await.unwrap_or_default())
        }
    };
    let (status, plain, _) = run("hooked", "s1", "hello").await;
    assert_eq!(status, 200);
    let (_, asking, _) = run("hooked", "s2", "ask for a date").await;
    let d = receiver.next(Duration::from_secs(30)).await;
    assert_eq!(d["verified"], true);
    assert_eq!(d["payload"]["type"], "run.input_required", "{d}");
    assert_eq!(
        d["payload"]["data"]["runId"],
        asking.as_deref().unwrap_or("")
    );
    let path = format!("/runs/{}", asking.as_deref().unwrap_or(""));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = json_with_status(s.get(&path).await, 200).await;
        if shown["webhooks"][0]["status"] == "delivered" {
            assert_eq!(
                shown["webhooks"][0]["type"], "run.input_required",
                "{shown}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, failing, _) = run("hooked", "s3", "fail please").await;
    let d = receiver.next(Duration::from_secs(30)).await;
    assert_eq!(d["payload"]["type"], "run.failed", "{d}");
    assert_eq!(
        d["payload"]["data"]["runId"],
        failing.as_deref().unwrap_or("")
    );
    assert_eq!(d["payload"]["data"]["status"], "failed");
    assert!(d["payload"]["data"]["error"]
        .as_str()
        .unwrap_or("")
        .contains("deliberate failure"));
    // The completed run's delivery was written (the target wants `run.input_required`, which
    // only the sender can tell apart) and then skipped, not sent.
    let plain = plain.expect("run id");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = json_with_status(s.get(&format!("/runs/{plain}")).await, 200).await;
        if shown["webhooks"][0]["status"] == "skipped" {
            assert_eq!(
                shown["webhooks"][0]["attempts"], 0,
                "nothing was sent: {shown}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{shown}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(500), receiver.lines.recv())
            .await
            .is_err(),
        "nothing else was sent"
    );
    let (status, _, body) = run("broken", "s1", "hello").await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("app_load_failed"), "{body}");
}

both_backends!(an_apps_webhooks_send_the_events_it_asked_for);
