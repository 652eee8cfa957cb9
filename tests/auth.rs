//! Authentication and tenant isolation, on both backends: API keys (stored hashed, revoked at
//! once), JWTs from a JWKS server on a local port (with key rotation), the binding of every
//! route to the caller's user and apps, the cross-site check, rate and run limits, `app:`
//! state writes, the refusal to serve unauthenticated on a public address, and the CLI.

mod common;

use agentd::auth::keys::{generate, KeySpec};
use agentd::config::AuthMode;
use common::{json_with_status, Backend, TestDb, TestServer};
use jsonwebtoken::{encode, EncodingKey, Header};
use reqwest::Method;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");

/// How a request presents itself.
#[derive(Clone, Copy, Debug)]
enum Cred<'a> {
    Nothing,
    Bearer(&'a str),
    XApiKey(&'a str),
}

async fn call(
    s: &TestServer,
    method: Method,
    path: &str,
    body: Option<&Value>,
    cred: Cred<'_>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut req = s.client.request(method, s.url(path));
    req = match cred {
        Cred::Nothing => req,
        Cred::Bearer(k) => req.bearer_auth(k),
        Cred::XApiKey(k) => req.header("x-api-key", k),
    };
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        headers,
    )
}

/// Stores a key directly (as `agentd keys create` does) and returns its plaintext.
async fn key(
    db: &TestDb,
    user: &str,
    apps: Option<&[&str]>,
    admin: bool,
    expires_at: Option<f64>,
) -> String {
    let now = agentd::event::now_ts();
    let k = generate(
        KeySpec {
            user_id: user.into(),
            apps: apps.map(|a| a.iter().map(|s| s.to_string()).collect()),
            admin,
            name: None,
            expires_at,
        },
        now,
    )
    .expect("key");
    db.store()
        .await
        .insert_api_key(&k.record)
        .await
        .expect("stored");
    k.plaintext
}

async fn with_keys(backend: Backend) -> TestServer {
    TestServer::start_with(backend, |a| a.security.auth = vec![AuthMode::ApiKey]).await
}

const SESSION: &str = "/apps/echo/users/alice/sessions/s1";

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

/// Every route that names a user, an app or a run: (method, path, body).
fn routes(run_id: &str) -> Vec<(Method, String, Option<Value>)> {
    let run = json!({"appName": "echo", "userId": "alice", "sessionId": "s1",
        "newMessage": {"role": "user", "parts": [{"text": "hijack"}]}});
    let run_new = json!({"appName": "echo", "userId": "alice", "sessionId": "s9",
        "createSession": true, "newMessage": {"role": "user", "parts": [{"text": "x"}]}});
    vec![
        (Method::GET, "/list-apps".into(), None),
        (Method::GET, "/apps/echo/app-info".into(), None),
        (Method::GET, "/apps/echo/users/alice/sessions".into(), None),
        (
            Method::POST,
            "/apps/echo/users/alice/sessions".into(),
            Some(json!({"sessionId": "s3"})),
        ),
        (Method::GET, SESSION.into(), None),
        (
            Method::POST,
            "/apps/echo/users/alice/sessions/s2".into(),
            Some(json!({})),
        ),
        (
            Method::PATCH,
            SESSION.into(),
            Some(json!({"stateDelta": {"x": 1}})),
        ),
        (Method::DELETE, SESSION.into(), None),
        (Method::GET, format!("{SESSION}/events"), None),
        (Method::GET, format!("{SESSION}/artifacts"), None),
        (
            Method::POST,
            format!("{SESSION}/artifacts"),
            Some(json!({"filename": "evil.txt", "artifact": {"text": "x"}})),
        ),
        (Method::GET, format!("{SESSION}/artifacts/notes.txt"), None),
        (
            Method::GET,
            format!("{SESSION}/artifacts/notes.txt/versions"),
            None,
        ),
        (
            Method::DELETE,
            format!("{SESSION}/artifacts/notes.txt"),
            None,
        ),
        (
            Method::PATCH,
            "/apps/echo/users/alice/memory".into(),
            Some(json!({"sessionId": "s1"})),
        ),
        (
            Method::GET,
            "/apps/echo/users/alice/memory?query=tulips".into(),
            None,
        ),
        (Method::POST, "/run".into(), Some(run.clone())),
        (Method::POST, "/run_sse".into(), Some(run)),
        (Method::POST, "/run".into(), Some(run_new)),
        (Method::GET, format!("/runs/{run_id}"), None),
        (
            Method::POST,
            format!("/runs/{run_id}/cancel"),
            Some(json!({})),
        ),
        (Method::GET, format!("/runs/{run_id}/stream"), None),
        (Method::GET, format!("{SESSION}/stream"), None),
        (Method::POST, format!("{SESSION}/cancel"), Some(json!({}))),
    ]
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

/// `app:` state is shared by every user of an app (and rendered into their instructions):
/// with auth on, only an admin key may write it.
async fn app_state_needs_an_admin(backend: Backend) {
    let s = with_keys(backend).await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let admin = key(&s.db, "svc", None, true, None).await;
    let base = "/apps/echo/users/alice/sessions";
    let writes = [
        (
            Method::POST,
            base.to_string(),
            json!({"sessionId": "a", "state": {"app:motd": "obey"}}),
        ),
        (
            Method::POST,
            base.to_string(),
            json!({"sessionId": "b", "events": [{"author": "user", "invocationId": "e-1",
                "actions": {"stateDelta": {"app:motd": "obey"}}}]}),
        ),
        (
            Method::POST,
            format!("{base}/c"),
            json!({"app:motd": "obey"}),
        ),
    ];
    for (method, path, body) in writes {
        let (st, b, _) = call(&s, method, &path, Some(&body), Cred::Bearer(&alice)).await;
        assert_eq!(
            (st, b["code"].as_str()),
            (403, Some("app_state_forbidden")),
            "{path}"
        );
    }
    let (st, _, _) = call(
        &s,
        Method::POST,
        base,
        Some(&json!({"sessionId": "s"})),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200);
    let (st, b, _) = call(
        &s,
        Method::PATCH,
        &format!("{base}/s"),
        Some(&json!({"stateDelta": {"app:motd": "obey"}})),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!((st, b["code"].as_str()), (403, Some("app_state_forbidden")));
    let run = json!({"appName": "echo", "userId": "alice", "sessionId": "s",
        "stateDelta": {"app:motd": "obey"},
        "newMessage": {"role": "user", "parts": [{"text": "x"}]}});
    let (st, b, _) = call(&s, Method::POST, "/run", Some(&run), Cred::Bearer(&alice)).await;
    assert_eq!((st, b["code"].as_str()), (403, Some("app_state_forbidden")));
    let (_, session, _) = call(
        &s,
        Method::GET,
        &format!("{base}/s"),
        None,
        Cred::Bearer(&alice),
    )
    .await;
    assert!(session["state"].get("app:motd").is_none(), "{session}");
    assert_eq!(
        session["events"],
        json!([]),
        "the refused run stored nothing"
    );

    let (st, _, _) = call(
        &s,
        Method::PATCH,
        &format!("{base}/s"),
        Some(&json!({"stateDelta": {"app:motd": "hello"}})),
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 200, "an admin key may");
    // user: state stays the user's own to write.
    let (st, _, _) = call(
        &s,
        Method::PATCH,
        &format!("{base}/s"),
        Some(&json!({"stateDelta": {"user:lang": "fr"}})),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200);
}

// ------------------------------------------------------------------------------------- JWT

/// An identity provider's JWKS endpoint on a local port; its key set can be rotated.
struct Jwks {
    url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    fetches: Arc<AtomicUsize>,
    /// While set, the endpoint answers 503 (an identity provider that is down or blocked).
    down: Arc<std::sync::atomic::AtomicBool>,
}

async fn jwks_server(initial: &[&str]) -> Jwks {
    let keys: Vec<Value> = initial.iter().map(|k| jwk(k)).collect();
    let keys = Arc::new(Mutex::new(keys));
    let fetches = Arc::new(AtomicUsize::new(0));
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (k, f, d) = (keys.clone(), fetches.clone(), down.clone());
    let app = axum::Router::new().route(
        "/.well-known/jwks.json",
        axum::routing::get(move || {
            let (k, f, d) = (k.clone(), f.clone(), d.clone());
            async move {
                use axum::response::IntoResponse;
                f.fetch_add(1, Ordering::SeqCst);
                if d.load(Ordering::SeqCst) {
                    return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
                }
                axum::Json(json!({"keys": *k.lock().unwrap()})).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Jwks {
        url: format!("http://127.0.0.1:{port}/.well-known/jwks.json"),
        keys,
        fetches,
        down,
    }
}

fn jwk(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/{name}.jwk.json")).unwrap())
        .unwrap()
}

const ISSUER: &str = "https://idp.example.test/";

fn now() -> i64 {
    agentd::event::now_ts() as i64
}

/// A token for `sub`, signed with the private key `signer`, naming `kid`.
fn token(signer: &str, kid: &str, claims: Value) -> String {
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(kid.into());
    let pem = std::fs::read(format!("{FIXTURES}/{signer}.pem")).unwrap();
    encode(&header, &claims, &EncodingKey::from_rsa_pem(&pem).unwrap()).unwrap()
}

fn claims(sub: &str) -> Value {
    json!({"sub": sub, "iss": ISSUER, "aud": "agentd", "iat": now(), "exp": now() + 300})
}

fn b64(v: &Value) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

async fn jwt_tokens_are_verified(backend: Backend) {
    let idp = jwks_server(&["k1"]).await;
    let url = idp.url.clone();
    let s = TestServer::start_with(backend, |a| {
        a.security.auth = vec![AuthMode::Jwt];
        a.security.jwt_jwks_url = Some(url);
        a.security.jwt_issuer = Some(ISSUER.into());
        a.security.jwt_audience = vec!["agentd".into()];
        a.security.jwt_jwks_refresh_secs = 0;
        a.security.jwt_leeway_secs = 0;
    })
    .await;
    let mine = "/apps/echo/users/alice/sessions";
    let good = token("k1", "k1", claims("alice"));
    let (st, _, _) = call(
        &s,
        Method::POST,
        mine,
        Some(&json!({"sessionId": "j1"})),
        Cred::Bearer(&good),
    )
    .await;
    assert_eq!(st, 200);
    let (st, b, _) = call(
        &s,
        Method::GET,
        "/apps/echo/users/bob/sessions",
        None,
        Cred::Bearer(&good),
    )
    .await;
    assert_eq!(
        st, 404,
        "the token's subject is the only user it acts as: {b}"
    );

    let mut expired = claims("alice");
    expired["exp"] = json!(now() - 3600);
    let mut wrong_aud = claims("alice");
    wrong_aud["aud"] = json!("someone-else");
    let mut wrong_iss = claims("alice");
    wrong_iss["iss"] = json!("https://evil.example/");
    let mut not_yet = claims("alice");
    not_yet["nbf"] = json!(now() + 3600);
    let mut no_sub = claims("alice");
    no_sub.as_object_mut().unwrap().remove("sub");
    let alg_none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims("alice"))
    );
    // Algorithm confusion: HS256 "signed" with the public key as the secret.
    let confused = {
        let mut h = Header::new(jsonwebtoken::Algorithm::HS256);
        h.kid = Some("k1".into());
        let public = std::fs::read(format!("{FIXTURES}/k1.pub.pem")).unwrap();
        encode(&h, &claims("alice"), &EncodingKey::from_secret(&public)).unwrap()
    };
    let bad: [(&str, String, &str); 9] = [
        ("expired", token("k1", "k1", expired), "token_expired"),
        (
            "wrong audience",
            token("k1", "k1", wrong_aud),
            "invalid_token",
        ),
        (
            "wrong issuer",
            token("k1", "k1", wrong_iss),
            "invalid_token",
        ),
        ("not yet valid", token("k1", "k1", not_yet), "invalid_token"),
        ("no user claim", token("k1", "k1", no_sub), "invalid_token"),
        (
            "wrong signature",
            token("evil", "k1", claims("alice")),
            "invalid_token",
        ),
        (
            "unknown key",
            token("evil", "evil", claims("alice")),
            "invalid_token",
        ),
        ("alg none", alg_none, "invalid_token"),
        ("HS256 with the public key", confused, "invalid_token"),
    ];
    for (what, t, code) in bad {
        // Every route refuses it alike (the run id need not exist: the door answers first).
        for (method, path, body) in routes("run-x") {
            let (st, b, _) = call(&s, method.clone(), &path, body.as_ref(), Cred::Bearer(&t)).await;
            assert_eq!(
                (st, b["code"].as_str()),
                (401, Some(code)),
                "{what}: {method} {path}"
            );
        }
        let (st, b, _) = call(
            &s,
            Method::POST,
            mine,
            Some(&json!({"sessionId": "x"})),
            Cred::Bearer(&t),
        )
        .await;
        assert_eq!((st, b["code"].as_str()), (401, Some(code)), "{what}: {b}");
    }
    let (_, list, _) = call(&s, Method::GET, mine, None, Cred::Bearer(&good)).await;
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["j1"], "no refused request created anything");

    // Rotation: the provider starts signing with k2; its first token makes agentd fetch the
    // key set again.
    idp.keys.lock().unwrap().push(jwk("k2"));
    let before = idp.fetches.load(Ordering::SeqCst);
    let rotated = token("k2", "k2", claims("alice"));
    let (st, _, _) = call(&s, Method::GET, mine, None, Cred::Bearer(&rotated)).await;
    assert_eq!(st, 200);
    assert_eq!(idp.fetches.load(Ordering::SeqCst), before + 1);
    // Known keys need no fetch.
    call(&s, Method::GET, mine, None, Cred::Bearer(&good)).await;
    assert_eq!(idp.fetches.load(Ordering::SeqCst), before + 1);
}

/// With a minimum gap between fetches, a flood of tokens naming unknown keys does not become
/// a flood of requests to the identity provider.
#[tokio::test]
async fn jwks_refetches_are_rate_bounded() {
    let idp = jwks_server(&["k1"]).await;
    let url = idp.url.clone();
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.security.auth = vec![AuthMode::Jwt];
        a.security.jwt_jwks_url = Some(url);
        a.security.jwt_audience = vec!["agentd".into()];
        a.security.jwt_jwks_refresh_secs = 3600;
    })
    .await;
    let good = token("k1", "k1", claims("alice"));
    assert_eq!(
        call(&s, Method::GET, "/list-apps", None, Cred::Bearer(&good))
            .await
            .0,
        200
    );
    for i in 0..20 {
        let t = token("evil", &format!("made-up-{i}"), claims("alice"));
        assert_eq!(
            call(&s, Method::GET, "/list-apps", None, Cred::Bearer(&t))
                .await
                .0,
            401
        );
    }
    assert_eq!(
        idp.fetches.load(Ordering::SeqCst),
        1,
        "one fetch, at first use"
    );
}

/// An identity provider that cannot be reached does not keep its old keys valid for ever: they
/// serve while younger than `--jwt-jwks-max-stale-secs`, then tokens are refused (503, the
/// provider's keys cannot be checked) until a fetch succeeds again. Before, every failed
/// refetch counted as a fresh fetch, so a blocked provider kept a removed key valid.
#[tokio::test]
async fn a_key_set_that_cannot_be_refetched_expires() {
    let idp = jwks_server(&["k1"]).await;
    let url = idp.url.clone();
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.security.auth = vec![AuthMode::Jwt];
        a.security.jwt_jwks_url = Some(url);
        a.security.jwt_audience = vec!["agentd".into()];
        a.security.jwt_jwks_refresh_secs = 0;
        a.security.jwt_jwks_max_stale_secs = 2;
    })
    .await;
    let good = token("k1", "k1", claims("alice"));
    let list = |t: String| {
        let s = &s;
        async move { call(s, Method::GET, "/list-apps", None, Cred::Bearer(&t)).await }
    };
    assert_eq!(list(good.clone()).await.0, 200);
    idp.down.store(true, Ordering::SeqCst);
    // Past the stale limit, with every refetch failing: refused, never served on old keys.
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let fetches = idp.fetches.load(Ordering::SeqCst);
    let (st, b, _) = list(good.clone()).await;
    assert_eq!(
        (st, b["code"].as_str()),
        (503, Some("auth_unavailable")),
        "{b}"
    );
    let (st, _, _) = list(good.clone()).await;
    assert_eq!(
        st, 503,
        "still refused: a failed fetch does not make the keys fresh"
    );
    assert!(
        idp.fetches.load(Ordering::SeqCst) > fetches,
        "agentd tried the provider again"
    );
    // The provider is back: the next token fetches the key set and passes.
    idp.down.store(false, Ordering::SeqCst);
    assert_eq!(list(good).await.0, 200);
}

/// Agents' instructions and why an app failed to load (file paths, YAML) are for admins:
/// other callers see them redacted in `app-info` and `list-apps?detailed=true`, and an unknown
/// app's 404 names no place on the server's disk.
async fn internals_are_shown_to_admins_only(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let apps = dir.path().join("apps");
    std::fs::create_dir_all(apps.join("broken")).unwrap();
    std::fs::write(
        apps.join("broken/root_agent.yaml"),
        "agent_class: NoSuchClass\nname: b\n",
    )
    .unwrap();
    std::fs::create_dir_all(apps.join("helper")).unwrap();
    std::fs::write(
        apps.join("helper/root_agent.yaml"),
        "name: helper\nmodel: openai/gpt-4o-mini\ninstruction: the secret playbook\n",
    )
    .unwrap();
    let apps_dir = apps.clone();
    let s = TestServer::start_with(backend, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.apps_dir = apps_dir;
    })
    .await;
    let user = key(&s.db, "alice", None, false, None).await;
    let admin = key(&s.db, "ops", None, true, None).await;
    let path_text = apps.display().to_string();

    let (st, info, _) = call(
        &s,
        Method::GET,
        "/apps/helper/app-info",
        None,
        Cred::Bearer(&user),
    )
    .await;
    assert_eq!(st, 200, "{info}");
    assert_eq!(info["agents"]["helper"]["instruction"], "", "{info}");
    let (st, info, _) = call(
        &s,
        Method::GET,
        "/apps/helper/app-info",
        None,
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 200, "{info}");
    assert_eq!(
        info["agents"]["helper"]["instruction"],
        "the secret playbook"
    );

    let broken = |v: &Value| {
        v["apps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "broken")
            .unwrap()["error"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (_, listed, _) = call(
        &s,
        Method::GET,
        "/list-apps?detailed=true",
        None,
        Cred::Bearer(&user),
    )
    .await;
    let redacted = broken(&listed);
    assert!(
        !redacted.contains("NoSuchClass") && !redacted.contains(&path_text),
        "{redacted}"
    );
    let (_, listed, _) = call(
        &s,
        Method::GET,
        "/list-apps?detailed=true",
        None,
        Cred::Bearer(&admin),
    )
    .await;
    assert!(broken(&listed).contains("NoSuchClass"), "{listed}");
    for cred in [Cred::Bearer(&user), Cred::Bearer(&admin)] {
        let (st, b, _) = call(&s, Method::GET, "/apps/broken/app-info", None, cred).await;
        assert_eq!(st, 500);
        let _ = b;
    }
    let (_, b, _) = call(
        &s,
        Method::GET,
        "/apps/broken/app-info",
        None,
        Cred::Bearer(&user),
    )
    .await;
    assert!(!b.to_string().contains("NoSuchClass"), "{b}");
    let (st, b, _) = call(
        &s,
        Method::GET,
        "/apps/nope/app-info",
        None,
        Cred::Bearer(&admin),
    )
    .await;
    assert_eq!(st, 404);
    assert!(!b.to_string().contains(&path_text), "{b}");
    let (st, b, _) = call(
        &s,
        Method::POST,
        "/run",
        Some(
            &json!({"appName": "broken", "userId": "alice", "sessionId": "s1",
            "newMessage": {"role": "user", "parts": [{"text": "hi"}]}}),
        ),
        Cred::Bearer(&user),
    )
    .await;
    assert_eq!(st, 500, "{b}");
    assert!(!b.to_string().contains("NoSuchClass"), "{b}");
}

/// A static HMAC secret (`--jwt-secret`), together with API keys.
#[tokio::test]
async fn a_static_secret_and_api_keys_together() {
    let secret = "0123456789abcdef0123456789abcdef-test-only";
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.security.auth = vec![AuthMode::ApiKey, AuthMode::Jwt];
        a.security.jwt_secret = Some(secret.into());
    })
    .await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let hs = encode(
        &Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": "carol", "exp": now() + 60}),
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    let path = |u: &str| format!("/apps/echo/users/{u}/sessions");
    assert_eq!(
        call(&s, Method::GET, &path("carol"), None, Cred::Bearer(&hs))
            .await
            .0,
        200
    );
    assert_eq!(
        call(&s, Method::GET, &path("alice"), None, Cred::Bearer(&hs))
            .await
            .0,
        404
    );
    assert_eq!(
        call(&s, Method::GET, &path("alice"), None, Cred::Bearer(&alice))
            .await
            .0,
        200
    );
    let forged = encode(
        &Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": "carol", "exp": now() + 60}),
        &EncodingKey::from_secret(b"another secret of thirty-two bytes or more"),
    )
    .unwrap();
    let (st, b, _) = call(&s, Method::GET, &path("carol"), None, Cred::Bearer(&forged)).await;
    assert_eq!((st, b["code"].as_str()), (401, Some("invalid_token")));
}

// ------------------------------------------------------------------------------ the door

/// Without authentication, agentd listens on loopback only unless told otherwise.
#[tokio::test]
async fn no_auth_on_a_public_address_needs_allow_unauthenticated() {
    let db = TestDb::sqlite().await;
    let mut args = agentd::config::ServeArgs::for_database(db.url.clone());
    args.bind = "0.0.0.0:0".parse().unwrap();
    let err = agentd::server::Server::start(args.clone())
        .await
        .err()
        .expect("refused");
    let mut jwks_without_audience = args.clone();
    jwks_without_audience.security.auth = vec![AuthMode::Jwt];
    jwks_without_audience.security.jwt_jwks_url = Some("http://127.0.0.1:9/jwks".into());
    let e = agentd::server::Server::start(jwks_without_audience)
        .await
        .err()
        .expect("a JWKS without an audience is refused");
    assert!(e.to_string().contains("--jwt-audience"), "{e}");
    let msg = err.to_string();
    assert!(
        msg.contains("--allow-unauthenticated") && msg.contains("--auth"),
        "{msg}"
    );
    args.security.allow_unauthenticated = true;
    let server = agentd::server::Server::start(args.clone())
        .await
        .expect("starts");
    server
        .shutdown(std::time::Duration::from_secs(1))
        .await
        .unwrap();
    args.security.allow_unauthenticated = false;
    args.security.auth = vec![AuthMode::ApiKey];
    let server = agentd::server::Server::start(args)
        .await
        .expect("starts with auth");
    server
        .shutdown(std::time::Duration::from_secs(1))
        .await
        .unwrap();
}

/// A page on another origin cannot drive a local agentd that runs without authentication.
#[tokio::test]
async fn cross_site_writes_are_refused() {
    let s = TestServer::start(Backend::Sqlite).await;
    let host = s.base.trim_start_matches("http://").to_string();
    let path = "/apps/echo/users/u/sessions";
    let post = |origin: Option<String>, sec: Option<&'static str>, id: &str| {
        let mut r = s.client.post(s.url(path)).json(&json!({"sessionId": id}));
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        if let Some(v) = sec {
            r = r.header("sec-fetch-site", v);
        }
        r.send()
    };
    let resp = post(Some("http://evil.example".into()), None, "a")
        .await
        .unwrap();
    let b = json_with_status(resp, 403).await;
    assert_eq!(b["code"], "cross_origin_forbidden");
    let resp = post(None, Some("cross-site"), "b").await.unwrap();
    json_with_status(resp, 403).await;
    let resp = post(Some(format!("http://{host}")), None, "c")
        .await
        .unwrap();
    json_with_status(resp, 200).await;
    let resp = post(None, None, "d").await.unwrap();
    json_with_status(resp, 200).await;
    let resp = s
        .client
        .get(s.url(path))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    let list = json_with_status(resp, 200).await;
    let mut ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["c", "d"], "the refused requests created nothing");

    // DNS rebinding: a page whose name now points at 127.0.0.1 is same-origin to the
    // browser, but its Host header gives it away.
    let port = host.rsplit(':').next().unwrap().to_string();
    for (h, status) in [
        (format!("evil.example:{port}"), 403),
        (format!("localhost:{port}"), 200),
        (format!("[::1]:{port}"), 200),
    ] {
        let resp = s
            .client
            .get(s.url(path))
            .header("host", h.clone())
            .send()
            .await
            .unwrap();
        let b = json_with_status(resp, status).await;
        if status == 403 {
            assert_eq!(b["code"], "host_forbidden", "{h}");
        }
    }
    // A type a page may send cross-site without a preflight is not JSON.
    let resp = s
        .client
        .post(s.url(path))
        .header("content-type", "text/plain;json")
        .body(r#"{"sessionId": "e"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_with_status(resp, 415).await["code"],
        "unsupported_content_type"
    );

    // An origin allowed for CORS may write.
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.allow_origins = vec!["https://app.example".into()]
    })
    .await;
    let resp = s
        .client
        .post(s.url(path))
        .header("origin", "https://app.example")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    json_with_status(resp, 200).await;
}

/// A browser attaches the `Basic` or `Digest` credentials it cached (for a proxy in front of
/// agentd, say) to a cross-site request by itself, and without authentication nothing checks
/// a bearer token: neither exempts a page's POST from the cross-site check. Refused with
/// 403 `cross_origin_forbidden` on session create and `/run`, and nothing is stored.
#[tokio::test]
async fn cached_browser_credentials_do_not_pass_the_cross_site_check() {
    let s = TestServer::start(Backend::Sqlite).await;
    let host = s.base.trim_start_matches("http://").to_string();
    let sessions = "/apps/echo/users/u/sessions";
    let run = json!({"appName": "echo", "userId": "u", "sessionId": "forged-run",
        "createSession": true, "newMessage": {"role": "user", "parts": [{"text": "hi"}]}});
    let writes = [(sessions, json!({"sessionId": "forged"})), ("/run", run)];
    let authorizations = [
        "Basic dXNlcjpwYXNz",
        r#"Digest username="user", realm="proxy", nonce="n", uri="/run", response="0""#,
        "Bearer anything",
    ];
    // What a browser sends with a cross-site POST (both headers), and each on its own.
    let cross_site = [
        (Some("https://evil.example"), Some("cross-site")),
        (Some("https://evil.example"), None),
        (None, Some("cross-site")),
    ];
    for authorization in authorizations {
        for (origin, fetch_site) in cross_site {
            for (path, body) in &writes {
                let mut req = s
                    .client
                    .post(s.url(path))
                    .header("authorization", authorization)
                    .json(body);
                if let Some(o) = origin {
                    req = req.header("origin", o);
                }
                if let Some(v) = fetch_site {
                    req = req.header("sec-fetch-site", v);
                }
                let b = json_with_status(req.send().await.unwrap(), 403).await;
                assert_eq!(
                    b["code"], "cross_origin_forbidden",
                    "{authorization} {path} {origin:?} {fetch_site:?}"
                );
            }
        }
    }
    let list = json_with_status(s.get(sessions).await, 200).await;
    assert_eq!(list, json!([]), "the refused requests created nothing");
    let resp = s.get(&format!("{sessions}/forged-run")).await;
    assert_eq!(resp.status(), 404, "no run created its session");

    // The same request from agentd's own origin is fine: the header itself is not refused.
    let resp = s
        .client
        .post(s.url(sessions))
        .header("authorization", "Basic dXNlcjpwYXNz")
        .header("origin", format!("http://{host}"))
        .header("sec-fetch-site", "same-origin")
        .json(&json!({"sessionId": "same-site"}))
        .send()
        .await
        .unwrap();
    json_with_status(resp, 200).await;
}

/// With authentication on, a credential agentd checks (a bearer token, an `x-api-key`; a
/// browser adds neither by itself) still passes the cross-site check, as before, and is
/// then authenticated; a `Basic` header does not.
#[tokio::test]
async fn checked_credentials_still_pass_the_cross_site_check() {
    let s = with_keys(Backend::Sqlite).await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let path = "/apps/echo/users/alice/sessions";
    let post = |name: &'static str, value: String, id: &str| {
        s.client
            .post(s.url(path))
            .header(name, value)
            .header("origin", "https://evil.example")
            .header("sec-fetch-site", "cross-site")
            .json(&json!({"sessionId": id}))
            .send()
    };
    let resp = post("authorization", format!("Bearer {alice}"), "by-bearer").await;
    json_with_status(resp.unwrap(), 200).await;
    let resp = post("x-api-key", alice.clone(), "by-api-key").await;
    json_with_status(resp.unwrap(), 200).await;
    let forged = "agentd_0000000000000000_forged".to_string();
    let resp = post("authorization", format!("Bearer {forged}"), "by-bad-key").await;
    let b = json_with_status(resp.unwrap(), 401).await;
    assert_eq!(
        b["code"], "invalid_api_key",
        "a bearer token is checked, not trusted"
    );
    let resp = post("authorization", "Basic dXNlcjpwYXNz".into(), "by-basic").await;
    let b = json_with_status(resp.unwrap(), 403).await;
    assert_eq!(b["code"], "cross_origin_forbidden");

    let (st, list, _) = call(&s, Method::GET, path, None, Cred::Bearer(&alice)).await;
    assert_eq!(st, 200, "{list}");
    let mut ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["by-api-key", "by-bearer"]);
}

/// `--protect-metrics`: `/metrics` needs an admin key; `--allow-client-app-state` lets any
/// caller write `app:` state.
#[tokio::test]
async fn metrics_protection_and_client_app_state_flags() {
    let s = TestServer::start_with(Backend::Sqlite, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.security.protect_metrics = true;
        a.security.allow_client_app_state = true;
    })
    .await;
    let alice = key(&s.db, "alice", None, false, None).await;
    let admin = key(&s.db, "svc", None, true, None).await;
    assert_eq!(
        call(&s, Method::GET, "/metrics", None, Cred::Nothing)
            .await
            .0,
        401
    );
    let (st, b, _) = call(&s, Method::GET, "/metrics", None, Cred::Bearer(&alice)).await;
    assert_eq!((st, b["code"].as_str()), (403, Some("admin_required")));
    let (st, b, _) = call(&s, Method::GET, "/metrics", None, Cred::Bearer(&admin)).await;
    assert_eq!(st, 200);
    assert!(b.as_str().unwrap_or("").contains("agentd_"), "{b}");
    assert_eq!(
        call(&s, Method::GET, "/health", None, Cred::Nothing)
            .await
            .0,
        200
    );
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/apps/echo/users/alice/sessions",
        Some(&json!({"sessionId": "a", "state": {"app:motd": "hello"}})),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200, "the flag lets a non-admin key write app: state");
}

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
}

both_backends!(
    every_route_is_bound_to_its_caller,
    revocation_takes_effect_at_once,
    app_state_needs_an_admin,
    jwt_tokens_are_verified,
    internals_are_shown_to_admins_only,
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

/// A2A and MCP behind the same door: the agent card is open (a discovery document) and says
/// how to authenticate; every call needs a credential that decides the user; another user's
/// task is "not found"; a key limited to some apps sees only those as MCP tools.
async fn a2a_and_mcp_are_bound_to_their_user(backend: Backend) {
    let s = with_keys(backend).await;
    let alice = key(&s.db, "alice", Some(&["echo"]), false, None).await;
    let bob = key(&s.db, "bob", None, false, None).await;

    // Cards are behind the door by default: a credential, and only the key's apps.
    let card_path = "/a2a/echo/.well-known/agent-card.json";
    let (st, _, _) = call(&s, Method::GET, card_path, None, Cred::Nothing).await;
    assert_eq!(st, 401);
    let (st, _, _) = call(
        &s,
        Method::GET,
        "/a2a/helpdesk/.well-known/agent-card.json",
        None,
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(
        st, 404,
        "a key limited to echo cannot read another app's card"
    );
    let (st, card, _) = call(&s, Method::GET, card_path, None, Cred::Bearer(&alice)).await;
    assert_eq!(st, 200, "{card}");
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    assert!(card["securityRequirements"][0]["schemes"]["bearer"].is_object());

    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message":
        {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "mine"}]}}});
    let (st, _, _) = call(&s, Method::POST, "/a2a/echo", Some(&send), Cred::Nothing).await;
    assert_eq!(st, 401, "A2A calls need a credential");
    let (st, sent, _) = call(
        &s,
        Method::POST,
        "/a2a/echo",
        Some(&send),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200, "{sent}");
    let task = sent["result"]["task"]["id"]
        .as_str()
        .expect("task")
        .to_string();
    let ctx = sent["result"]["task"]["contextId"]
        .as_str()
        .expect("ctx")
        .to_string();
    // The context is alice's session.
    let (st, _, _) = call(
        &s,
        Method::GET,
        &format!("/apps/echo/users/alice/sessions/{ctx}"),
        None,
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 200);
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task}});
    let (_, theirs, _) = call(
        &s,
        Method::POST,
        "/a2a/echo",
        Some(&get),
        Cred::Bearer(&bob),
    )
    .await;
    assert_eq!(theirs["error"]["code"], -32001, "{theirs}");
    // Bob naming alice's context gets his own session of that id, never hers.
    let into = json!({"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message":
        {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "bob"}], "contextId": ctx}}});
    let (_, his, _) = call(
        &s,
        Method::POST,
        "/a2a/echo",
        Some(&into),
        Cred::Bearer(&bob),
    )
    .await;
    assert_eq!(
        his["result"]["task"]["history"].as_array().map(Vec::len),
        Some(2),
        "{his}"
    );
    let (_, hers, _) = call(
        &s,
        Method::POST,
        "/a2a/echo",
        Some(&get),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(
        hers["result"]["history"].as_array().map(Vec::len),
        Some(2),
        "{hers}"
    );
    // An app outside alice's key is hidden, for A2A and MCP alike.
    let (st, _, _) = call(
        &s,
        Method::POST,
        "/a2a/helpdesk",
        Some(&send),
        Cred::Bearer(&alice),
    )
    .await;
    assert_eq!(st, 404);

    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {}});
    let mcp = |path: &'static str, cred: Option<String>| {
        let mut req = s
            .client
            .post(s.url(path))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&list);
        if let Some(k) = cred {
            req = req.bearer_auth(k);
        }
        req.send()
    };
    assert_eq!(mcp("/mcp", None).await.expect("POST").status(), 401);
    let tools: Value = mcp("/mcp", Some(alice.clone()))
        .await
        .expect("POST")
        .json()
        .await
        .expect("JSON");
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["echo"], "only the apps alice's key may use");
    let resp = mcp("/apps/helpdesk/mcp", Some(alice.clone()))
        .await
        .expect("POST");
    assert_eq!(resp.status(), 404);
    let bobs: Value = mcp("/mcp", Some(bob.clone()))
        .await
        .expect("POST")
        .json()
        .await
        .expect("JSON");
    assert!(bobs["result"]["tools"].as_array().expect("tools").len() > 1);
}

/// `--a2a-public-cards`: cards answer without credentials; nothing else does.
async fn public_agent_cards_need_no_credentials(backend: Backend) {
    let s = TestServer::start_with(backend, |a| {
        a.security.auth = vec![AuthMode::ApiKey];
        a.interop.a2a_public_cards = true;
    })
    .await;
    let card = "/a2a/echo/.well-known/agent-card.json";
    let (st, body, _) = call(&s, Method::GET, card, None, Cred::Nothing).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["name"], "echo");
    let (st, _, _) = call(&s, Method::GET, "/a2a/echo/tasks", None, Cred::Nothing).await;
    assert_eq!(st, 401);
}

both_backends!(
    a2a_and_mcp_are_bound_to_their_user,
    public_agent_cards_need_no_credentials
);
