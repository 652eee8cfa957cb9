//! The command line: `agentd healthcheck` (the container's HEALTHCHECK) against a real server.

mod common;

use common::{Backend, TestServer};

fn healthcheck(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .arg("healthcheck")
        .args(args)
        .env_remove("AGENTD_BIND")
        .output()
        .expect("run agentd healthcheck")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_0_for_a_healthy_server_and_1_otherwise() {
    let s = TestServer::start(Backend::Sqlite).await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let base = s.base.clone();
    let ok = tokio::task::spawn_blocking(move || healthcheck(&["--url", &base]))
        .await
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // The same through the listen address, as in the image (0.0.0.0 means loopback).
    let port = addr.rsplit(':').next().unwrap().to_string();
    let bind = format!("0.0.0.0:{port}");
    let ok = tokio::task::spawn_blocking(move || healthcheck(&["--bind", &bind]))
        .await
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let bad =
        tokio::task::spawn_blocking(move || healthcheck(&["--url", &dead, "--timeout-secs", "1"]))
            .await
            .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unhealthy"));
}
