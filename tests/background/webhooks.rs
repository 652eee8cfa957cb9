//! Webhooks: signed, checked by `standardwebhooks`, retried, delivered once, even after a crash.

use super::*;
use crate::both_backends;
use crate::common::clients::python;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};

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

both_backends!(a_webhook_is_signed_retried_and_delivered_once);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_survives_a_crash_between_the_runs_end_and_its_delivery() {
    a_webhook_is_delivered_after_a_crash().await;
}

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

/// One user's receiver that accepts and never answers does not hold the sender: that user,
/// and that host, get a share of the replica's slots (4 of 16 by default, one once the host
/// has timed out), so another user's delivery goes out while the dead host's wait. Before
/// the shares, 48 such deliveries took all 16 slots for three rounds of timeouts first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_receiver_does_not_hold_other_users_deliveries() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut receiver = Receiver::start(&[]).await;
    // The dead host: accepts every connection and never answers; counts and holds them.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_url = format!(
        "http://127.0.0.1:{}/hook",
        dead.local_addr().expect("addr").port()
    );
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        let mut held = vec![];
        for conn in dead.incoming() {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(conn);
        }
    });
    let db = TestDb::new(Backend::Postgres).await;
    let apps = Apps::new().echo("echo", "chunks: 1");
    let flags = [
        "--webhook-allow-private",
        "127.0.0.1",
        "--webhook-timeout-secs",
        "3",
    ];
    let r = Replica::spawn(&db, &apps, "fair", &flags).await;
    let slow_user = "slow-tenant";
    let mut runs = vec![];
    for i in 0..48 {
        let session = format!("s{i}");
        json_with_status(
            r.post(
                &format!("/apps/echo/users/{slow_user}/sessions"),
                json!({"sessionId": session}),
            )
            .await,
            200,
        )
        .await;
        let started = json_with_status(
            r.post(
                &format!("/apps/echo/users/{slow_user}/sessions/{session}/runs"),
                run_body(
                    "to the dead host",
                    json!({"url": dead_url, "secret": SECRET}),
                ),
            )
            .await,
            202,
        )
        .await;
        runs.push(started["runId"].as_str().expect("runId").to_string());
    }
    for run in &runs {
        let ended =
            json_with_status(r.post(&format!("/runs/{run}/wait"), json!({})).await, 200).await;
        assert_eq!(ended["status"], "completed");
    }
    // Another user's run with a receiver that answers.
    r.create_session("echo", "mine").await;
    let started = json_with_status(
        r.post(
            &format!("/apps/echo/users/{USER}/sessions/mine/runs"),
            run_body("mine", json!({"url": receiver.url(), "secret": SECRET})),
        )
        .await,
        202,
    )
    .await;
    let mine = started["runId"].as_str().expect("runId").to_string();
    json_with_status(r.post(&format!("/runs/{mine}/wait"), json!({})).await, 200).await;
    let d = receiver.next(Duration::from_secs(60)).await;
    assert_eq!(d["payload"]["data"]["runId"], mine.as_str());
    // By then the dead host has had at most its share of attempts at once, and the slow
    // tenant's 48 deliveries have not all gone before it.
    let seen = accepted.load(Ordering::SeqCst);
    assert!(
        seen < 16,
        "{seen} attempts reached the dead host before another user's delivery"
    );
}
