//! Budgets of an app and of an API key (docs/usage.md#budgets), beside the user's (in
//! `usage.rs`): each scripted call spends 15 tokens, a run two calls.

use super::*;
use crate::both_backends;
use crate::common::sse_client::{self, Msg};
use agentd::config::AuthMode;

fn run_body(user: &str, session: &str) -> Value {
    json!({
        "appName": "weather", "userId": user, "sessionId": session,
        "newMessage": {"role": "user", "parts": [{"text": "Weather?"}]},
        "streaming": true, "createSession": true,
    })
}

fn weather_apps(m: &ScriptedModel) -> agentd::apps::AppRegistry {
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = LlmAgent::new("weather_agent", m.model("weather")).tool(weather_tool(calls));
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        "weather",
        agentd::agent::AgentTree::new(Arc::new(agent)).expect("valid tree"),
    );
    apps
}

fn script_runs(m: &ScriptedModel, runs: usize) {
    for _ in 0..runs {
        m.push(
            "weather",
            Reply::tool_calls(&[("call_1", "get_weather", r#"{"city": "Paris"}"#)]),
        )
        .push("weather", Reply::text(&["Sunny."]));
    }
}

fn last_error_code(msgs: &[Msg]) -> Value {
    complete(msgs)
        .last()
        .map(|e| e["errorCode"].clone())
        .unwrap_or(Value::Null)
}

/// An app's budget holds all its users together: one user's run spends it, another's is
/// stopped mid-run, a third is refused at admission naming the app's budget; removing it
/// lets runs go again. (That only admins see or set it is in the key test below.)
async fn an_apps_budget_holds_all_its_users(backend: Backend) {
    let m = ScriptedModel::start().await;
    script_runs(&m, 3);
    let s =
        TestServer::start_embedded_with(backend, weather_apps(&m), PluginSet::default(), |_| {})
            .await;
    let path = "/apps/weather/budget";
    let r = call(&s, reqwest::Method::PUT, path, None, Some(json!({}))).await;
    assert_eq!(r.status(), 422, "an empty budget is refused");
    let r = call(
        &s,
        reqwest::Method::PUT,
        "/apps/nowhere/budget",
        None,
        Some(json!({"tokensPerDay": 40})),
    )
    .await;
    assert_eq!(json_with_status(r, 404).await["code"], "app_not_found");
    let r = call(
        &s,
        reqwest::Method::PUT,
        path,
        None,
        Some(json!({"tokensPerDay": 40})),
    )
    .await;
    assert_eq!(json_with_status(r, 200).await["tokensPerDay"], 40);

    let msgs = s.run_stream(run_body("ann", "s1")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let msgs = s.run_stream(run_body("bob", "s1")).await;
    assert_eq!(done_status(&msgs), "failed", "{msgs:#?}");
    assert_eq!(last_error_code(&msgs), "BUDGET_EXHAUSTED");
    let text = complete(&msgs)
        .last()
        .and_then(|e| e["errorMessage"].as_str().map(str::to_string))
        .unwrap_or_default();
    assert!(text.contains("The app's budget"), "{text}");
    assert_eq!(m.unused(), 3, "bob's second call was never made");

    let r = s.post_json("/run_sse", run_body("cy", "s1")).await;
    assert!(r.headers().contains_key("retry-after"));
    let refused = json_with_status(r, 429).await;
    assert_eq!(refused["code"], "budget_exhausted", "{refused}");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap_or("")
            .contains("app's budget"),
        "{refused}"
    );
    let gone = s.get("/apps/weather/users/cy/sessions/s1").await;
    assert_eq!(gone.status(), 404, "a refused run creates nothing");
    // The users' own budgets are untouched: none was set.
    let own = json_with_status(s.get("/apps/weather/users/cy/budget").await, 200).await;
    assert_eq!(own["exhausted"], false, "{own}");

    let view = json_with_status(s.get(path).await, 200).await;
    assert_eq!(view["spent"]["tokensToday"], 45, "{view}");
    assert_eq!(view["exhausted"], true, "{view}");
    assert_eq!(s.delete(path).await.status(), 204);
    let r = s.delete(path).await;
    assert_eq!(json_with_status(r, 404).await["code"], "budget_not_found");
    let msgs = s.run_stream(run_body("cy", "s1")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
}

/// A request as `key` (none: no `Authorization`), with a JSON body if given.
async fn call(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = s.client.request(method, s.url(path));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.expect("request")
}

async fn run_with(s: &TestServer, key: &str, body: Value) -> Vec<Msg> {
    let r = call(s, reqwest::Method::POST, "/run", Some(key), Some(body)).await;
    sse_client::read_all(r).await
}

async fn new_key(s: &TestServer, user: &str, admin: bool) -> (String, String) {
    let k = agentd::auth::keys::generate(
        agentd::auth::keys::KeySpec {
            user_id: user.into(),
            apps: None,
            admin,
            name: None,
            expires_at: None,
        },
        agentd::event::now_ts(),
    )
    .expect("key");
    s.db.store()
        .await
        .insert_api_key(&k.record)
        .await
        .expect("stored");
    (k.plaintext, k.record.id)
}

/// An API key's budget holds the key, not its user: the key's runs are stopped and then
/// refused while another key of the same user goes on; the key may read its own budget but
/// not another's; everyone's report by key says which key spent what, in how many runs.
async fn a_keys_budget_holds_the_key_not_its_user(backend: Backend) {
    let m = ScriptedModel::start().await;
    script_runs(&m, 4);
    let s = TestServer::start_embedded_with(backend, weather_apps(&m), PluginSet::default(), |a| {
        a.security.auth = vec![AuthMode::ApiKey]
    })
    .await;
    let (admin, _) = new_key(&s, "ops", true).await;
    let (capped, capped_id) = new_key(&s, USER, false).await;
    let (other, other_id) = new_key(&s, USER, false).await;
    let path = format!("/keys/{capped_id}/budget");

    let r = call(
        &s,
        reqwest::Method::PUT,
        &path,
        Some(&capped),
        Some(json!({"tokensPerDay": 40})),
    )
    .await;
    assert_eq!(json_with_status(r, 403).await["code"], "admin_required");
    let r = call(
        &s,
        reqwest::Method::PUT,
        "/keys/00000000000000aa/budget",
        Some(&admin),
        Some(json!({"tokensPerDay": 40})),
    )
    .await;
    assert_eq!(json_with_status(r, 404).await["code"], "key_not_found");
    let r = call(
        &s,
        reqwest::Method::PUT,
        &path,
        Some(&admin),
        Some(json!({"tokensPerDay": 40})),
    )
    .await;
    assert_eq!(json_with_status(r, 200).await["tokensPerDay"], 40);

    let msgs = run_with(&s, &capped, run_body(USER, "s1")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let msgs = run_with(&s, &capped, run_body(USER, "s2")).await;
    assert_eq!(done_status(&msgs), "failed", "{msgs:#?}");
    assert_eq!(last_error_code(&msgs), "BUDGET_EXHAUSTED");
    let r = call(
        &s,
        reqwest::Method::POST,
        "/run_sse",
        Some(&capped),
        Some(run_body(USER, "s3")),
    )
    .await;
    let refused = json_with_status(r, 429).await;
    assert!(
        refused["detail"]
            .as_str()
            .unwrap_or("")
            .contains("API key's budget"),
        "{refused}"
    );
    // The same user through another key is not held by the first key's budget (its run gets
    // the reply the stopped run never asked for: one call, 15 tokens).
    let msgs = run_with(&s, &other, run_body(USER, "s3")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");

    let own = json_with_status(
        call(&s, reqwest::Method::GET, &path, Some(&capped), None).await,
        200,
    )
    .await;
    assert_eq!(own["spent"]["tokensToday"], 45, "{own}");
    assert_eq!(own["exhausted"], true, "{own}");
    let r = call(
        &s,
        reqwest::Method::GET,
        &format!("/keys/{other_id}/budget"),
        Some(&capped),
        None,
    )
    .await;
    assert_eq!(json_with_status(r, 403).await["code"], "admin_required");
    let theirs = json_with_status(
        call(
            &s,
            reqwest::Method::GET,
            &format!("/keys/{other_id}/budget"),
            Some(&admin),
            None,
        )
        .await,
        200,
    )
    .await;
    assert_eq!(theirs["spent"]["tokensToday"], 15, "{theirs}");
    assert_eq!(theirs["tokensPerDay"], Value::Null, "{theirs}");

    let by_key = json_with_status(
        call(
            &s,
            reqwest::Method::GET,
            "/usage?groupBy=key",
            Some(&admin),
            None,
        )
        .await,
        200,
    )
    .await;
    let tokens = |id: &str| {
        by_key["usage"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["key"] == id))
            .map(|r| {
                r["inputTokens"].as_u64().unwrap_or(0) + r["outputTokens"].as_u64().unwrap_or(0)
            })
    };
    assert_eq!(tokens(&capped_id), Some(45), "{by_key}");
    assert_eq!(tokens(&other_id), Some(15), "{by_key}");
    let runs_of = |id: &str| {
        by_key["usage"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["key"] == id))
            .map(|r| r["runs"].clone())
    };
    assert_eq!(runs_of(&capped_id), Some(json!(2)), "{by_key}");
    assert_eq!(runs_of(&other_id), Some(json!(1)), "{by_key}");
    // Only admins see what keys spent, and only admins see or set an app's budget.
    for (method, path) in [
        (reqwest::Method::GET, "/usage?groupBy=key"),
        (reqwest::Method::GET, "/apps/weather/budget"),
        (reqwest::Method::PUT, "/apps/weather/budget"),
    ] {
        let body = (method == reqwest::Method::PUT).then(|| json!({"tokensPerDay": 1}));
        let r = call(&s, method, path, Some(&capped), body).await;
        assert_eq!(
            json_with_status(r, 403).await["code"],
            "admin_required",
            "{path}"
        );
    }

    let r = call(&s, reqwest::Method::DELETE, &path, Some(&admin), None).await;
    assert_eq!(r.status(), 204);
    let msgs = run_with(&s, &capped, run_body(USER, "s4")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
}

/// An admin (service) key acts for any user: its budget holds what it spends for all of
/// them together.
async fn an_admin_keys_budget_holds_it_across_users(backend: Backend) {
    let m = ScriptedModel::start().await;
    script_runs(&m, 3);
    let s = TestServer::start_embedded_with(backend, weather_apps(&m), PluginSet::default(), |a| {
        a.security.auth = vec![AuthMode::ApiKey]
    })
    .await;
    let (service, service_id) = new_key(&s, "backend", true).await;
    let path = format!("/keys/{service_id}/budget");
    let r = call(
        &s,
        reqwest::Method::PUT,
        &path,
        Some(&service),
        Some(json!({"tokensPerDay": 40})),
    )
    .await;
    assert_eq!(json_with_status(r, 200).await["tokensPerDay"], 40);
    let msgs = run_with(&s, &service, run_body("ann", "s1")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let msgs = run_with(&s, &service, run_body("bob", "s1")).await;
    assert_eq!(done_status(&msgs), "failed", "{msgs:#?}");
    assert_eq!(last_error_code(&msgs), "BUDGET_EXHAUSTED");
    let r = call(
        &s,
        reqwest::Method::POST,
        "/run_sse",
        Some(&service),
        Some(run_body("cy", "s1")),
    )
    .await;
    let refused = json_with_status(r, 429).await;
    assert!(
        refused["detail"]
            .as_str()
            .unwrap_or("")
            .contains("API key's budget"),
        "{refused}"
    );
    let r = call(&s, reqwest::Method::GET, &path, Some(&service), None).await;
    let view = json_with_status(r, 200).await;
    assert_eq!(
        view["spent"]["tokensToday"], 45,
        "ann's 30 and bob's 15: {view}"
    );
}

/// A replica from before migration 0017 admits runs without writing the session's key: such
/// a run is charged to no key, never to the key of the session's previous run: not while it
/// runs (its record, the key's spending), not when it ends (its `runs` row, `usage_keys`).
async fn a_run_an_older_replica_admitted_inherits_no_key(backend: Backend) {
    use sqlx::Connection;
    let m = ScriptedModel::start().await;
    script_runs(&m, 1);
    let s = TestServer::start_embedded_with(backend, weather_apps(&m), PluginSet::default(), |a| {
        a.security.auth = vec![AuthMode::ApiKey]
    })
    .await;
    let (key, key_id) = new_key(&s, USER, false).await;
    let msgs = run_with(&s, &key, run_body(USER, "s1")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let budget = format!("/keys/{key_id}/budget");
    let spent = |v: Value| v["spent"]["tokensToday"].clone();
    let before = spent(
        json_with_status(
            call(&s, reqwest::Method::GET, &budget, Some(&key), None).await,
            200,
        )
        .await,
    );
    assert_eq!(before, 30, "the key's own run");

    // What an older replica's admission writes: every run column it knows, not the key; and
    // what its run's commits write: the usage so far.
    let mut db = sqlx::PgConnection::connect(&s.db.url)
        .await
        .expect("connect");
    // The older replica is alive (a sweep must not end its run while the test looks at it).
    sqlx::query(
        "INSERT INTO replicas (id, heartbeat_at, lease_secs, started_at)
         VALUES ('old', extract(epoch from now()), 3600, extract(epoch from now()))",
    )
    .execute(&mut db)
    .await
    .expect("the older replica");
    let admitted = sqlx::query(
        "UPDATE sessions SET active_run = 'run-old', run_invocation = 'e-old', run_owner = 'old',
                run_created_at = extract(epoch from now()), run_base_seq = last_seq,
                run_user_event = false, run_cancel_requested = false, run_resumes = 0,
                run_webhooks = NULL,
                run_usage = '{\"weather\": {\"inputTokens\": 100, \"modelCalls\": 1, \"unpricedCalls\": 1}}'
          WHERE app_name = 'weather' AND user_id = $1 AND id = 's1' AND active_run IS NULL",
    )
    .bind(USER)
    .execute(&mut db)
    .await
    .expect("admitted");
    assert_eq!(admitted.rows_affected(), 1);
    let runs_path = format!("/apps/weather/users/{USER}/runs");
    let runs = json_with_status(
        call(&s, reqwest::Method::GET, &runs_path, Some(&key), None).await,
        200,
    )
    .await;
    let old = |runs: &Value| {
        runs["runs"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["runId"] == "run-old").cloned())
            .unwrap_or(Value::Null)
    };
    assert_eq!(old(&runs)["status"], "running", "{runs}");
    let running = spent(
        json_with_status(
            call(&s, reqwest::Method::GET, &budget, Some(&key), None).await,
            200,
        )
        .await,
    );
    assert_eq!(
        running, before,
        "the older replica's run is not the key's spending"
    );

    // Its end (here by this replica's store, as a sweep or a takeover would end it).
    let store = s.db.store().await;
    store
        .finish_run(
            USER,
            "run-old",
            0,
            agentd::store::RunStatus::Completed,
            None,
            None,
        )
        .await
        .expect("finished");
    let runs = json_with_status(
        call(&s, reqwest::Method::GET, &runs_path, Some(&key), None).await,
        200,
    )
    .await;
    assert_ne!(old(&runs)["status"], "running", "{runs}");
    assert_eq!(old(&runs)["usage"]["inputTokens"], 100, "{runs}");
    let after = spent(
        json_with_status(
            call(&s, reqwest::Method::GET, &budget, Some(&key), None).await,
            200,
        )
        .await,
    );
    assert_eq!(
        after, before,
        "its end adds nothing to the key's aggregates"
    );
    let keys: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT id, key_id FROM runs WHERE user_id = $1 ORDER BY created_at")
            .bind(USER)
            .fetch_all(&mut db)
            .await
            .expect("runs");
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(
        keys[0].1.as_deref(),
        Some(key_id.as_str()),
        "the key's own run: {keys:?}"
    );
    assert_eq!(keys[1], ("run-old".to_string(), None), "{keys:?}");
}

crate::postgres_backends!(a_run_an_older_replica_admitted_inherits_no_key);

both_backends!(
    an_apps_budget_holds_all_its_users,
    a_keys_budget_holds_the_key_not_its_user,
    an_admin_keys_budget_holds_it_across_users,
);
