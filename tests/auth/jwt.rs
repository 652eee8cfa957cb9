//! JWTs, verified with a JWKS endpoint (rotation, bounded refetches) or a static secret.

use super::*;
use crate::both_backends;
use jsonwebtoken::{encode, EncodingKey, Header};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");

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

both_backends!(jwt_tokens_are_verified);
