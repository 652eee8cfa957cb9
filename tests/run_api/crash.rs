//! A killed replica leaves only complete events, and its lease expires (for an app whose runs
//! are not resumed; `tests/replicas/durable_runs.rs` has the runs that go on).

use super::*;
use crate::both_backends;

async fn a_killed_replica_leaves_only_complete_events_and_its_lease_expires(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new()
        .echo("slow", "chunks: 50\nchunk_delay_ms: 100\ncall_tool: lookup")
        .settings("slow", "resume: never\n");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let bind = format!("127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .arg("serve")
        .args(["--bind", &bind, "--database-url", &db.url])
        .arg("--apps-dir")
        .arg(apps.path())
        .args(["--run-lease-secs", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn agentd");

    let child_url = |path: &str| format!("http://{bind}{path}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + PATIENCE;
    while !matches!(client.get(child_url("/health")).send().await, Ok(r) if r.status() == 200) {
        assert!(Instant::now() < deadline, "the child server never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let create = client
        .post(child_url(&format!("/apps/slow/users/{USER}/sessions")))
        .json(&json!({ "sessionId": "s1" }))
        .send()
        .await
        .unwrap();
    json_with_status(create, 200).await;
    let resp = client
        .post(child_url("/run"))
        .json(&run_body("slow", "s1", "crash during this"))
        .send()
        .await
        .unwrap();
    let mut sse = Sse::open(resp).await;
    let run_id = sse.run_id();
    for _ in 0..3 {
        sse.until(Msg::is_partial).await;
    }
    child.start_kill().expect("kill -9");
    child.wait().await.expect("child exits");

    let dir = apps.path().to_path_buf();
    let s = TestServer::start_on(db, |args| args.apps_dir = dir).await;
    let stored = transcript(&s, "slow", "s1").await;
    for e in &stored {
        serde_json::from_value::<Event>(e.clone()).expect("every stored event is whole");
    }
    assert_eq!(authors(&stored), ["user", "slow"]);
    assert!(stored[1]["content"]["parts"][0]["functionCall"].is_object());
    let record = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(
        record["status"], "running",
        "nobody has noticed the death yet"
    );

    // Busy until the dead run's 1 s lease runs out; then the session is taken over.
    let deadline = Instant::now() + PATIENCE;
    let msgs = loop {
        match run_to_end(&s, run_body("slow", "s1", "x")).await {
            Ok(msgs) => break msgs,
            Err((409, body)) if body["code"] == "session_busy" => {}
            Err((status, body)) => panic!("{status}: {body}"),
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done(&msgs)["status"], "completed");
    let record = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(record["status"], "abandoned");
}

both_backends!(a_killed_replica_leaves_only_complete_events_and_its_lease_expires);
