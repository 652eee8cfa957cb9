//! API keys bind every route to its caller; revocation reaches every replica; the keys CLI.

use super::*;
use crate::both_backends;

/// Everything stored for alice, read with the admin key.
async fn snapshot(s: &TestServer, admin: &str) -> Value {
    let mut out = json!({});
    for path in [
        SESSION.to_string(),
        "/apps/echo/users/alice/sessions".into(),
        format!("{SESSION}/artifacts"),
        format!("{SESSION}/artifacts/notes.txt"),
        "/apps/echo/users/alice/sessions/s2".into(),
        "/apps/echo/users/alice/memory?query=tulips".into(),
    ] {
        let (status, body, _) = call(s, Method::GET, &path, None, Cred::Bearer(admin)).await;
        out[path] = json!([status, body]);
    }
    out
}

async fn every_route_is_bound_to_its_caller(backend: Backend) {
    let s = with_keys(backend).await;
    let admin = key(&s.db, "svc", None, true, None).await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let bob = key(&s.db, "bob", None, false, None).await;
    let pipeline_only = key(&s.db, "alice", Some(&["pipeline"]), false, None).await;
    let expired = key(&s.db, "alice", None, false, Some(1.0)).await;
    let revoked = key(&s.db, "alice", None, false, None).await;
    let revoked_id = revoked.split('_').nth(1).unwrap().to_string();
    assert!(s
        .db
        .store()
        .await
        .revoke_api_key(&revoked_id, agentd::event::now_ts())
        .await
        .unwrap());

    // Alice's data, made by alice herself (and an admin acting for her).
    let a = Cred::Bearer(&alice);
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/apps/echo/users/alice/sessions",
        Some(&json!({"sessionId": "s1"})),
        a,
    )
    .await;
    assert_eq!(st, 200);
    let resp = s
        .client
        .post(s.url("/run"))
        .bearer_auth(&alice)
        .header("accept", "application/json")
        .json(
            &json!({"appName": "echo", "userId": "alice", "sessionId": "s1",
            "newMessage": {"role": "user", "parts": [{"text": "remember the tulips"}]}}),
        )
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-agentd-run-id"]
        .to_str()
        .unwrap()
        .to_string();
    json_with_status(resp, 200).await;
    let (st, _, _) = call(
        &s,
        Method::POST,
        &format!("{SESSION}/artifacts"),
        Some(&json!({"filename": "notes.txt", "artifact": {"text": "hello"}})),
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 200, "an admin key acts for any user");
    let (st, _, _) = call(
        &s,
        Method::PATCH,
        "/apps/echo/users/alice/memory",
        Some(&json!({"sessionId": "s1"})),
        Cred::XApiKey(&alice),
    )
    .await;
    assert_eq!(st, 200, "x-api-key works as well as Authorization");

    let before = snapshot(&s, &admin).await;
    let denied: [(&str, Cred, u16, &str); 6] = [
        ("no credentials", Cred::Nothing, 401, "unauthenticated"),
        (
            "a bad key",
            Cred::Bearer("agentd_0123456789abcdef_not-the-secret"),
            401,
            "invalid_api_key",
        ),
        ("garbage", Cred::Bearer("hello"), 401, "invalid_api_key"),
        (
            "a revoked key",
            Cred::Bearer(&revoked),
            401,
            "api_key_revoked",
        ),
        (
            "an expired key",
            Cred::XApiKey(&expired),
            401,
            "api_key_expired",
        ),
        (
            "a wrong secret for a real key id",
            Cred::Bearer(&format!("agentd_{revoked_id}_x")),
            401,
            "invalid_api_key",
        ),
    ];
    for (what, cred, status, code) in denied {
        for (method, path, body) in routes(&run_id) {
            let (st, b, h) = call(&s, method.clone(), &path, body.as_ref(), cred).await;
            assert_eq!(st, status, "{what}: {method} {path}: {b}");
            assert_eq!(b["code"], code, "{what}: {method} {path}: {b}");
            assert_eq!(h["www-authenticate"], "Bearer", "{what}: {method} {path}");
        }
    }

    // Bob's key: alice's things do not exist for him; the app list and app info are his too.
    for (method, path, body) in routes(&run_id) {
        let (st, b, _) = call(&s, method.clone(), &path, body.as_ref(), Cred::Bearer(&bob)).await;
        let expect = match path.as_str() {
            "/list-apps" => 200,
            // The echo app's own answer (its root is not an LLM agent), not a 404.
            "/apps/echo/app-info" => 400,
            _ => 404,
        };
        assert_eq!(st, expect, "bob: {method} {path}: {b}");
        if path.contains("/sessions/s") && st == 404 {
            assert_eq!(b["code"], "session_not_found", "bob: {method} {path}");
        }
        if path.starts_with("/runs/") {
            assert_eq!(b["code"], "run_not_found", "bob: {method} {path}");
        }
    }

    // A key for the pipeline app only: echo is invisible, even to its own user.
    for (method, path, body) in routes(&run_id) {
        let (st, b, _) = call(
            &s,
            method.clone(),
            &path,
            body.as_ref(),
            Cred::Bearer(&pipeline_only),
        )
        .await;
        if path == "/list-apps" {
            assert_eq!((st, &b), (200, &json!(["pipeline"])));
            continue;
        }
        assert_eq!(st, 404, "app-restricted: {method} {path}: {b}");
        let code = if path.starts_with("/runs/") {
            "run_not_found"
        } else {
            "app_not_found"
        };
        assert_eq!(b["code"], code, "app-restricted: {method} {path}: {b}");
    }
    let (st, _, _) = call(
        &s,
        Method::GET,
        "/apps/pipeline/users/alice/sessions",
        None,
        Cred::Bearer(&pipeline_only),
    )
    .await;
    assert_eq!(st, 200, "the key's own app works");

    assert_eq!(
        snapshot(&s, &admin).await,
        before,
        "nothing of alice's changed"
    );
    let (st, run, _) = call(
        &s,
        Method::GET,
        &format!("/runs/{run_id}"),
        None,
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!((st, run["status"].as_str()), (200, Some("completed")));

    // Open routes stay open.
    for path in ["/health", "/ready", "/version", "/metrics"] {
        let (st, _, _) = call(&s, Method::GET, path, None, Cred::Nothing).await;
        assert_eq!(st, 200, "{path}");
    }
}

/// Revocation is a database fact, looked up on every request: the next request fails.
async fn revocation_takes_effect_at_once(backend: Backend) {
    let s = with_keys(backend).await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let path = "/apps/echo/users/alice/sessions";
    assert_eq!(
        call(&s, Method::GET, path, None, Cred::Bearer(&alice))
            .await
            .0,
        200
    );
    let id = alice.split('_').nth(1).unwrap();
    assert!(s
        .db
        .store()
        .await
        .revoke_api_key(id, agentd::event::now_ts())
        .await
        .unwrap());
    let b = until_revoked(&s, path, &alice).await;
    assert_eq!(b["code"], "api_key_revoked");
    // The stored row holds a hash, never the key.
    let listed = s.db.store().await.list_api_keys().await.unwrap();
    assert_eq!(listed.len(), 1);
    let (_, secret) = agentd::auth::keys::parse(&alice).unwrap();
    assert!(!listed[0].secret_hash.contains(secret));
    assert!(listed[0].revoked_at.is_some());
}

/// Requests with `key` until one is refused. On SQLite every request reads its key; on
/// PostgreSQL replicas cache keys and drop them when the revocation's notification arrives
/// (milliseconds), so the first request after the revocation may still race it.
async fn until_revoked(s: &TestServer, path: &str, key: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (st, b, _) = call(s, Method::GET, path, None, Cred::Bearer(key)).await;
        if st == 401 {
            return b;
        }
        assert_eq!(st, 200, "{b}");
        assert!(
            s.db.backend.is_postgres(),
            "SQLite reads the key on every request: the revocation holds at once"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the revocation never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Two replicas cache a key; `agentd keys revoke` (another process) reaches both.
#[tokio::test]
async fn a_revocation_reaches_every_replica() {
    let a = with_keys(Backend::Postgres).await;
    let mut args = agentd::config::ServeArgs::for_database(a.db.url.clone());
    args.apps_dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/apps");
    args.security.auth = vec![AuthMode::ApiKey];
    let b_server = agentd::server::Server::start(args)
        .await
        .expect("replica B");
    let b_base = format!("http://{}", b_server.addr);
    let alice = key(&a.db, "alice", None, false, None).await;
    let path = "/apps/echo/users/alice/sessions";
    let get_b = |k: String| {
        let url = format!("{b_base}{path}");
        async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(k)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    for _ in 0..3 {
        assert_eq!(
            call(&a, Method::GET, path, None, Cred::Bearer(&alice))
                .await
                .0,
            200
        );
        assert_eq!(get_b(alice.clone()).await, 200);
    }
    let id = alice.split('_').nth(1).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["keys", "revoke", id, "--database-url", &a.db.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until_revoked(&a, path, &alice).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while get_b(alice.clone()).await != 401 {
        assert!(
            std::time::Instant::now() < deadline,
            "replica B never heard of it"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    b_server
        .shutdown(std::time::Duration::from_secs(1))
        .await
        .unwrap();
}

/// `agentd keys create|list|revoke` against a real database file.
#[tokio::test]
async fn keys_cli_creates_lists_and_revokes() {
    let db = TestDb::sqlite().await;
    let bin = env!("CARGO_BIN_EXE_agentd");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin)
            .args(args)
            .args(["--database-url", &db.url])
            .output()
            .expect("agentd runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, key, err) = run(&[
        "keys",
        "create",
        "--user",
        "alice",
        "--apps",
        "echo,pipeline",
        "--name",
        "ci",
    ]);
    assert!(ok, "{err}");
    assert!(key.starts_with("agentd_"), "{key}");
    let id = key.split('_').nth(1).unwrap().to_string();
    let (ok, listed, _) = run(&["keys", "list"]);
    assert!(ok);
    let row: Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(row["id"], id);
    assert_eq!(row["user_id"], "alice");
    assert_eq!(row["apps"], json!(["echo", "pipeline"]));
    assert_eq!(row["name"], "ci");
    let (_, secret) = agentd::auth::keys::parse(&key).unwrap();
    assert!(!listed.contains(secret), "no secret in the list");
    let (ok, _, err) = run(&["keys", "revoke", &id]);
    assert!(ok, "{err}");
    let (ok, _, err) = run(&["keys", "revoke", &id]);
    assert!(!ok, "revoking twice says so: {err}");
    let (ok, _, err) = run(&["keys", "create", "--user", "alice", "--apps", ""]);
    assert!(!ok, "--apps with no app is not an unrestricted key: {err}");
    let (ok, _, err) = run(&["keys", "create", "--user", ""]);
    assert!(!ok, "an empty user is refused: {err}");

    // A key made with a budget has it from its first request (docs/usage.md#budgets).
    let (ok, capped, err) = run(&[
        "keys",
        "create",
        "--user",
        "alice",
        "--budget-tokens-per-day",
        "500",
        "--budget-cost-per-month",
        "2.5",
    ]);
    assert!(ok, "{err}");
    let capped_id = capped.split('_').nth(1).unwrap().to_string();
    let budget = db
        .store()
        .await
        .budget(&agentd::usage::Payer::Key {
            id: capped_id,
            user: Some("alice".into()),
        })
        .await
        .unwrap();
    assert_eq!(
        budget,
        Some(agentd::usage::Budget {
            tokens_per_day: Some(500),
            cost_per_month: Some(2.5),
        })
    );
    let (ok, _, err) = run(&[
        "keys",
        "create",
        "--user",
        "alice",
        "--budget-cost-per-month=-1",
    ]);
    assert!(!ok, "a negative budget is refused: {err}");
    let (_, listed, _) = run(&["keys", "list"]);
    assert_eq!(
        listed.lines().count(),
        2,
        "the refused key was not stored: {listed}"
    );
}

both_backends!(
    every_route_is_bound_to_its_caller,
    revocation_takes_effect_at_once,
);

/// Schedules belong to their user: another user's is 404 for a user key, and only an admin
/// key lists every user's schedules of an app.
async fn schedules_are_bound_to_their_user(backend: Backend) {
    let s = TestServer::start_with(backend, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.background.scheduler = false;
    })
    .await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let bob = key(&s.db, "bob", None, false, None).await;
    let admin = key(&s.db, "ops", None, true, None).await;
    let body = json!({"cron": "0 9 * * *", "message": "report"});
    let (st, created, _) = call(
        &s,
        Method::POST,
        "/apps/echo/users/alice/schedules",
        Some(&body),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let theirs = format!("/apps/echo/users/alice/schedules/{id}");
    for (method, path) in [
        (Method::GET, theirs.clone()),
        (Method::DELETE, theirs.clone()),
        (Method::GET, "/apps/echo/users/alice/schedules".to_string()),
        (Method::POST, "/apps/echo/users/alice/schedules".to_string()),
    ] {
        let send = (method == Method::POST).then_some(&body);
        let (st, got, _) = call(&s, method.clone(), &path, send, Cred::Bearer(&bob)).await;
        assert_eq!(st, 404, "{method} {path} as bob: {got}");
    }
    let (st, _, _) = call(
        &s,
        Method::GET,
        "/apps/echo/schedules",
        None,
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 403, "a user key may not list everyone's");
    let (st, all, _) = call(
        &s,
        Method::GET,
        "/apps/echo/schedules",
        None,
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 200, "{all}");
    assert_eq!(all["schedules"][0]["id"], id.as_str());
    assert_eq!(all["schedules"][0]["userId"], "alice");
    let (st, _, _) = call(&s, Method::GET, &theirs, None, Cred::Bearer(&alice)).await;
    assert_eq!(st, 200);
}

both_backends!(schedules_are_bound_to_their_user);

/// A schedule stops when the key that made it does: `agentd keys revoke` pauses it at once
/// (`pausedReason: "key_revoked"`), a key that expires pauses it at its next tick
/// (`key_expired`, the tick skipped), and a valid caller enabling it again makes it fire.
async fn a_schedule_stops_with_its_key(backend: Backend) {
    let s = TestServer::start_with(backend, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.background.schedule_poll_ms = 100;
        a.background.schedule_min_interval_secs = 1;
    })
    .await;
    let now = agentd::event::now_ts();
    let alice = key(&s.db, "alice", None, false, None).await;
    let bob = key(&s.db, "bob", None, false, Some(now + 3.0)).await;
    let admin = key(&s.db, "ops", None, true, None).await;
    let every_second = json!({"cron": "* * * * * *", "message": "tick"});
    let mut made = vec![];
    for (user, k) in [("alice", &alice), ("bob", &bob)] {
        let (st, got, _) = call(
            &s,
            Method::POST,
            &format!("/apps/echo/users/{user}/schedules"),
            Some(&every_second),
            Cred::Bearer(k),
        )
        .await;
        assert_eq!(st, 201, "{got}");
        made.push(format!(
            "/apps/echo/users/{user}/schedules/{}",
            got["id"].as_str().expect("id")
        ));
    }
    let ticks = |path: String| {
        let s = &s;
        let admin = &admin;
        async move {
            let (st, got, _) = call(
                s,
                Method::GET,
                &format!("{path}/runs?limit=200"),
                None,
                Cred::Bearer(admin),
            )
            .await;
            assert_eq!(st, 200, "{got}");
            got["ticks"].as_array().cloned().unwrap_or_default()
        }
    };
    let get = |path: String| {
        let s = &s;
        let admin = &admin;
        async move {
            let (st, got, _) = call(s, Method::GET, &path, None, Cred::Bearer(admin)).await;
            assert_eq!(st, 200, "{got}");
            got
        }
    };
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert!(
        !ticks(made[0].clone()).await.is_empty(),
        "alice's schedule fires"
    );

    // Revoked with the CLI: paused at once.
    let (id, _) = agentd::auth::keys::parse(&alice).expect("key");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["keys", "revoke", id, "--database-url", &s.db.url])
        .output()
        .expect("agentd runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    // The CLI pauses the key's schedules right after the revocation; the server, notified of
    // the revocation, pauses them at their next tick, which may come in between (then the
    // CLI finds nothing left to pause). Either way the schedule is paused now, for this reason.
    assert!(said.contains("revoked key"), "{said}");
    let paused = get(made[0].clone()).await;
    assert_eq!(paused["enabled"], false, "{paused}");
    assert_eq!(paused["pausedReason"], "key_revoked");
    assert!(paused.get("nextTick").is_none());
    let before = ticks(made[0].clone()).await.len();
    tokio::time::sleep(std::time::Duration::from_millis(2000)).await;
    assert_eq!(
        ticks(made[0].clone()).await.len(),
        before,
        "no tick after the revocation"
    );

    // Bob's key has expired by now: his schedule paused itself at its next tick.
    let paused = get(made[1].clone()).await;
    assert_eq!(paused["enabled"], false, "{paused}");
    assert_eq!(paused["pausedReason"], "key_expired");
    let bobs = ticks(made[1].clone()).await;
    let skipped = bobs
        .iter()
        .find(|t| t["status"] == "skipped")
        .unwrap_or_else(|| panic!("a skipped tick: {bobs:?}"));
    assert!(
        skipped["error"]
            .as_str()
            .is_some_and(|e| e.contains("expired")),
        "{skipped}"
    );

    // An admin enables it again: it fires under the admin's key.
    let (st, resumed, _) = call(
        &s,
        Method::PATCH,
        &made[1],
        Some(&json!({"enabled": true})),
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 200, "{resumed}");
    assert_eq!(resumed["enabled"], true);
    assert!(resumed.get("pausedReason").is_none(), "{resumed}");
    let started = |t: &Vec<Value>| t.iter().filter(|t| t["status"] == "started").count();
    let before = started(&ticks(made[1].clone()).await);
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert!(
        started(&ticks(made[1].clone()).await) > before,
        "fires again"
    );
}

both_backends!(a_schedule_stops_with_its_key);
