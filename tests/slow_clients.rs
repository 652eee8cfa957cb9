//! Clients that misbehave at the transport: half-sent headers (slowloris) and bodies over the
//! limit written in full before the answer is read.

mod common;

use common::{Backend, TestServer};
use std::io::{Read, Write};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `n` connections that send half a request header and stall there (a slowloris).
async fn stall(addr: &str, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        held.push(c);
    }
    held
}

/// 1,100 connections that never finish their header do not make agentd unreachable, and each
/// is closed once the header-read timeout passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_headers_neither_block_health_nor_stay_open() {
    // Client and server share this process: 2,200 sockets.
    rlimit::increase_nofile_limit(u64::MAX).expect("raise the open-file limit");
    let s = TestServer::start_with(Backend::Sqlite, |a| a.security.header_timeout_secs = 2).await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut held = stall(&addr, 1_100).await;
    let health = s
        .client
        .get(s.url("/health"))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("/health answers while 1,100 half-sent requests are open");
    assert_eq!(health.status(), 200);
    for c in held.iter_mut().step_by(100) {
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_secs(60), c.read(&mut buf))
            .await
            .expect("the server closes a connection whose header never completes");
        // Closed (0 bytes or a reset), or a 408 before closing: never left hanging.
        if let Ok(n) = read {
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
        }
    }
}

/// At the connection bound, a client that sends a whole request is served at once: the
/// oldest connections still sending their header are closed to make room (and counted),
/// instead of the new client waiting in the backlog until a stalled one times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_bound_stalled_headers_are_shed_for_a_whole_request() {
    rlimit::increase_nofile_limit(u64::MAX).expect("raise the open-file limit");
    // A header timeout far beyond the client's patience: only shedding can serve it in time.
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.security.max_connections = 50;
        a.security.header_timeout_secs = 600;
    })
    .await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut held = stall(&addr, 50).await;
    // Every slot is taken by a stalled header now; a fresh client sends a whole request.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..3 {
        let health = client
            .get(s.url("/health"))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("a whole request is served while stalled headers fill every slot");
        assert_eq!(health.status(), 200);
    }
    // The oldest stalled connection was closed: it reads the end of the stream.
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(30), held[0].read(&mut buf))
        .await
        .expect("the oldest stalled connection is closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let metrics = client
        .get(s.url("/metrics"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let shed: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("agentd_connections_shed_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("agentd_connections_shed_total is exported");
    // One slot was made for the first request; the client's own connections, closed after
    // each answer, gave theirs back, so no more than that was needed.
    assert!(shed >= 1.0, "{shed} connections shed");
}

/// A connection answering a request is never shed, and a new client is not shed for the slot
/// it just took: with one of two slots held by a session follower, every fresh request is
/// served; with both held, a newcomer waits (no reset) and is served when one frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_connections_and_newcomers_are_never_shed() {
    let s = TestServer::start_with(Backend::Sqlite, |a| a.security.max_connections = 2).await;
    let create = s
        .post_json(
            "/apps/echo/users/u1/sessions",
            serde_json::json!({"sessionId": "s1"}),
        )
        .await;
    assert_eq!(create.status(), 200);
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let follow = s.url("/apps/echo/users/u1/sessions/s1/stream");
    let first = fresh().get(&follow).send().await.expect("a follower");
    assert_eq!(first.status(), 200);
    for i in 0..20 {
        let r = fresh()
            .get(s.url("/health"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("request {i} on the last free slot was cut: {e}"));
        assert_eq!(r.status(), 200);
    }
    let second = fresh()
        .get(&follow)
        .send()
        .await
        .expect("a second follower");
    assert_eq!(second.status(), 200);
    // Both slots answer a stream: the newcomer waits rather than being reset...
    let waiting = tokio::spawn({
        let url = s.url("/health");
        let client = fresh();
        async move { client.get(url).send().await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "served or refused while both slots were busy"
    );
    // ...and is served once a follower goes.
    drop(first);
    let r = waiting.await.unwrap().expect("served once a slot freed");
    assert_eq!(r.status(), 200);
    drop(second);
}

/// The finding as it was reported: agentd under a container's usual open-file limit (1,024,
/// soft and hard) and 1,100 connections that send half a header and stall. The connection
/// bound is derived from the limit, so the stalled connections fill it without exhausting the
/// process's descriptors, and a client that sends a whole request is served at once (a
/// stalled one is shed for it) rather than after the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_1024_file_limit_stalled_connections_do_not_lock_out_a_client() {
    // This process holds 1,100 client sockets.
    rlimit::increase_nofile_limit(u64::MAX).expect("raise the open-file limit");
    let data = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let agentd = env!("CARGO_BIN_EXE_agentd");
    let script = format!(
        "ulimit -n 1024 && exec {agentd} serve --bind {addr} --header-timeout-secs 600 \
         --database-url sqlite://{}/a.db --apps-dir {}/config/apps",
        data.path().display(),
        env!("CARGO_MANIFEST_DIR")
    );
    let mut child = tokio::process::Command::new("bash")
        .args(["-c", &script])
        .env("RUST_LOG", "agentd=warn")
        .kill_on_drop(true)
        .spawn()
        .expect("agentd starts");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("http://{addr}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !matches!(client.get(format!("{url}/health")).send().await, Ok(r) if r.status() == 200) {
        assert!(
            std::time::Instant::now() < deadline,
            "agentd never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = stall(&addr, 1_100).await;
    for _ in 0..3 {
        let health = client
            .get(format!("{url}/health"))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("/health answers while 1,100 stalled connections press on a 1,024 limit");
        assert_eq!(health.status(), 200);
    }
    let metrics = client
        .get(format!("{url}/metrics"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("agentd_connections_shed_total"),
        "stalled connections were shed"
    );
    drop(held);
    let _ = child.kill().await;
}

/// A body over `--max-body-bytes`, written in full before reading (as Python's `http.client`
/// and `requests` do), gets a readable 413 instead of a broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_body_written_in_full_gets_a_readable_413() {
    let s = TestServer::start_with(Backend::Sqlite, |a| a.max_body_bytes = 1024 * 1024).await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let answer = tokio::task::spawn_blocking(move || {
        let size = 16 * 1024 * 1024;
        let mut c = std::net::TcpStream::connect(addr).expect("connect");
        c.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            c,
            "POST /run HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {size}\r\n\r\n"
        )
        .unwrap();
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..size / chunk.len() {
            c.write_all(&chunk).expect("the whole body is accepted");
        }
        let mut out = String::new();
        c.read_to_string(&mut out).expect("the answer is readable");
        out
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("\"code\":\"payload_too_large\""),
        "{answer}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
}

/// A session follower never ends on its own; at shutdown it must, or a graceful shutdown waits
/// its whole grace period and the stream lingers after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_end_at_shutdown() {
    let mut s = TestServer::start(Backend::Sqlite).await;
    let base = "/apps/echo/users/u1/sessions";
    let created = s
        .post_json(base, serde_json::json!({"sessionId": "f"}))
        .await;
    assert_eq!(created.status(), 200);
    let resp = s.get(&format!("{base}/f/stream")).await;
    assert_eq!(resp.status(), 200);
    let mut follower = common::sse_client::Sse::open(resp).await;
    let server = s.server.take().expect("running");
    let stopping = tokio::spawn(server.shutdown(Duration::from_secs(120)));
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while follower.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the follower's stream ended at shutdown");
    stopping.await.unwrap().unwrap();
}
