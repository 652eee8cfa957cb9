//! Rate and run limits: slowed auth failures, 429 with Retry-After, bounded concurrent runs.

use super::*;

/// Bad credentials from one address are rate-bounded (no key lookup once over budget).
#[tokio::test]
async fn repeated_auth_failures_are_slowed_down() {
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.security.auth_failures_per_ip = 10;
    })
    .await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let path = "/apps/echo/users/alice/sessions";
    let mut limited = None;
    for i in 0..200 {
        let bad = format!("agentd_{:016x}_guess{i}", i);
        let (st, b, h) = call(&s, Method::GET, path, None, Cred::Bearer(&bad)).await;
        if st == 429 {
            assert_eq!(b["code"], "too_many_auth_failures");
            assert!(h.contains_key("retry-after"));
            limited = Some(i);
            break;
        }
        assert_eq!(st, 401);
    }
    let n = limited.expect("failures are limited");
    assert!(n >= 50, "the burst allows honest mistakes first: {n}");
    // Even a good key waits out the block from that address.
    assert_eq!(
        call(&s, Method::GET, path, None, Cred::Bearer(&alice))
            .await
            .0,
        429
    );
}

#[tokio::test]
async fn requests_over_the_rate_get_429_with_retry_after() {
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.security.rate_limit_rps = 1;
        a.security.rate_limit_burst = Some(1);
    })
    .await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let bob = key(&s.db, "bob", None, false, None).await;
    let path = "/apps/echo/users/alice/sessions";
    // Requests back to back until one is refused. One per second with a burst of one: however
    // long each request takes, no more get through than the burst plus one per second that
    // passed (the budget refills while the loop runs, so the count is a bound, not a number).
    let started = std::time::Instant::now();
    let mut allowed = 0u32;
    let (b, h) = loop {
        let (st, b, h) = call(&s, Method::GET, path, None, Cred::Bearer(&alice)).await;
        if st == 429 {
            break (b, h);
        }
        assert_eq!(st, 200, "{b}");
        allowed += 1;
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "never limited: {allowed} requests allowed"
        );
    };
    let elapsed = started.elapsed().as_secs_f64();
    assert!(allowed >= 1, "the burst lets the first request through");
    assert!(
        f64::from(allowed) <= 1.0 + elapsed.floor(),
        "{allowed} requests allowed in {elapsed:.3} s at 1/s with a burst of 1"
    );
    assert_eq!(b["code"], "rate_limited", "{b}");
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    // Another caller has a budget of its own.
    let bob_path = "/apps/echo/users/bob/sessions";
    assert_eq!(
        call(&s, Method::GET, bob_path, None, Cred::Bearer(&bob))
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn concurrent_runs_per_user_are_bounded() {
    let apps = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(apps.path().join("slow")).unwrap();
    std::fs::write(
        apps.path().join("slow/root_agent.yaml"),
        "agent_class: EchoAgent\nname: slow\nchunks: 600\nchunk_delay_ms: 100\n",
    )
    .unwrap();
    let dir = apps.path().to_path_buf();
    let s = TestServer::start_with(Backend::Sqlite, move |a| {
        a.apps_dir = dir;
        a.security.max_runs_per_user = 1;
    })
    .await;
    let body = |user: &str, session: &str| {
        json!({"appName": "slow", "userId": user, "sessionId": session, "createSession": true,
            "newMessage": {"role": "user", "parts": [{"text": "a long answer"}]}})
    };
    let first = s.post_json("/run", body("alice", "a")).await;
    assert_eq!(first.status(), 200);
    let run_id = first.headers()["x-agentd-run-id"]
        .to_str()
        .unwrap()
        .to_string();
    let second = s.post_json("/run", body("alice", "b")).await;
    let b = json_with_status(second, 429).await;
    assert_eq!(b["code"], "too_many_runs");
    let other = s.post_json("/run", body("bob", "c")).await;
    assert_eq!(other.status(), 200, "another user is not affected");
    drop(other);
    // The slot is freed when the run ends, however it ends.
    json_with_status(
        s.post_json(&format!("/runs/{run_id}/cancel"), json!({}))
            .await,
        202,
    )
    .await;
    drop(first);
    let mut freed = false;
    for _ in 0..100 {
        let resp = s.post_json("/run", body("alice", "d")).await;
        if resp.status() == 200 {
            freed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(freed, "alice may run again once her run ended");
}
