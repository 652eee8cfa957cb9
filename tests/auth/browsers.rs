//! The door for browsers: loopback only without auth; cross-site writes are refused.

use super::*;

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
