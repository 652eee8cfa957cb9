//! Usage and budgets end to end (docs/usage.md): token counts from the real streaming wire
//! format summed per run, session, model and day, priced by `--prices`, and budgets enforced
//! at admission (429, nothing stored) and before each model call (`BUDGET_EXHAUSTED`).

use super::*;
use crate::both_backends;
use crate::common::sse_client::Msg;

/// A price file: `weather` costs 1 per million input tokens, 0.5 cached, 2 output.
fn prices_file() -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        f.path(),
        "currency: USD\nmodels:\n  weather: {input: 1.0, output: 2.0, cached_input: 0.5}\n",
    )
    .expect("write prices");
    f
}

async fn server(
    backend: Backend,
    m: &ScriptedModel,
    prices: Option<&std::path::Path>,
) -> TestServer {
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = LlmAgent::new("weather_agent", m.model("weather")).tool(weather_tool(calls));
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        "weather",
        agentd::agent::AgentTree::new(Arc::new(agent)).expect("valid tree"),
    );
    let prices = prices.map(|p| p.to_path_buf());
    TestServer::start_embedded_with(backend, apps, PluginSet::default(), |a| a.prices = prices)
        .await
}

fn close(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-12)
}

async fn report(s: &TestServer, query: &str) -> Value {
    json_with_status(
        s.get(&format!("/apps/weather/users/{USER}/usage?{query}"))
            .await,
        200,
    )
    .await
}

/// Two runs, three model calls (one reading cached input and reasoning): each run's record,
/// the reports by day, model and session, and everyone's report add up exactly, priced.
async fn usage_is_summed_per_run_session_model_and_day(backend: Backend) {
    let m = ScriptedModel::start().await;
    let cached = json!({"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140,
                        "prompt_tokens_details": {"cached_tokens": 60},
                        "completion_tokens_details": {"reasoning_tokens": 30}});
    m.push(
        "weather",
        Reply::tool_calls(&[("call_1", "get_weather", r#"{"city": "Paris"}"#)]),
    )
    .push("weather", Reply::text(&["Sunny."]).with_usage(cached))
    .push("weather", Reply::text(&["Hello."]));
    let prices = prices_file();
    let s = server(backend, &m, Some(prices.path())).await;

    let msgs = s
        .run_stream(body("weather", "s1", "Weather in Paris?"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let events = complete(&msgs);
    let answer = events.last().unwrap();
    assert_eq!(answer["usageMetadata"]["cachedContentTokenCount"], 60);
    assert_eq!(answer["usageMetadata"]["thoughtsTokenCount"], 30);
    let msgs = s.run_stream(body("weather", "s2", "Hi")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");

    // Each run's record: the first made two calls (10 + 100 in, 5 + 40 out).
    let page = json_with_status(
        s.get(&format!("/apps/weather/users/{USER}/runs")).await,
        200,
    )
    .await;
    let runs = page["runs"].as_array().unwrap();
    let first = runs.iter().find(|r| r["sessionId"] == "s1").unwrap();
    let u = &first["usage"];
    assert_eq!(
        (
            &u["inputTokens"],
            &u["outputTokens"],
            &u["cachedTokens"],
            &u["reasoningTokens"],
            &u["modelCalls"]
        ),
        (&json!(110), &json!(45), &json!(60), &json!(30), &json!(2)),
        "{first:#}"
    );
    // (10 × 1 + 5 × 2) + (40 fresh × 1 + 60 cached × 0.5 + 40 × 2) per million.
    let first_cost = (20.0 + 150.0) / 1e6;
    assert!(close(&u["cost"], first_cost), "{u}");
    assert_eq!(u["byModel"]["weather"]["modelCalls"], 2);
    let run_id = first["runId"].as_str().unwrap();
    let one = json_with_status(s.get(&format!("/runs/{run_id}")).await, 200).await;
    assert_eq!(
        one["usage"], *u,
        "GET /runs/{{id}} says what the listing says"
    );

    let total_cost = first_cost + 20.0 / 1e6;
    let by_day = report(&s, "groupBy=day").await;
    let rows = by_day["usage"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{by_day:#}");
    let today = chrono::Utc::now().date_naive().to_string();
    assert_eq!(rows[0]["key"], today);
    for r in [&rows[0], &by_day["total"]] {
        assert_eq!(
            (
                &r["inputTokens"],
                &r["outputTokens"],
                &r["cachedTokens"],
                &r["modelCalls"],
                &r["runs"]
            ),
            (&json!(120), &json!(50), &json!(60), &json!(3), &json!(2)),
            "{by_day:#}"
        );
        assert!(close(&r["cost"], total_cost), "{r}");
    }
    assert_eq!(by_day["currency"], "USD");

    let by_model = report(&s, "groupBy=model").await;
    assert_eq!(by_model["usage"][0]["key"], "weather");
    assert_eq!(by_model["usage"][0]["runs"], 2);
    assert_eq!(by_model["total"]["runs"], 2);

    let by_session = report(&s, "groupBy=session").await;
    let sessions: Vec<(&str, u64)> = by_session["usage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap(),
                r["inputTokens"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(sessions, vec![("s1", 110), ("s2", 10)]);

    // A period without runs is empty; a bad one is a 422 naming the field.
    let past = report(&s, "from=2020-01-01&to=2020-01-31").await;
    assert_eq!(past["usage"], json!([]));
    assert_eq!(past["total"]["inputTokens"], 0);
    for (q, field) in [
        ("from=yesterday", "from"),
        ("from=2026-02-01&to=2026-01-01", "to"),
        ("groupBy=user", "groupBy"),
        ("groupBy=nope", "groupBy"),
    ] {
        let r = s
            .get(&format!("/apps/weather/users/{USER}/usage?{q}"))
            .await;
        let body = json_with_status(r, 422).await;
        assert_eq!(body["code"], "validation_error", "{q}: {body}");
        assert!(body.to_string().contains(field), "{q}: {body}");
    }

    // Everyone's, by user (no authentication: the operator's own view).
    let all = json_with_status(s.get("/usage?groupBy=user").await, 200).await;
    assert_eq!(all["usage"][0]["key"], USER);
    assert_eq!(all["usage"][0]["inputTokens"], 120);
}

/// A model without a price has no cost: `null` in the run and the reports, never a guess.
async fn a_model_without_a_price_costs_null(backend: Backend) {
    let m = ScriptedModel::start().await;
    m.push("weather", Reply::text(&["Hello."]));
    let s = server(backend, &m, None).await;
    let msgs = s.run_stream(body("weather", "s1", "Hi")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let page = json_with_status(
        s.get(&format!("/apps/weather/users/{USER}/runs")).await,
        200,
    )
    .await;
    let u = &page["runs"][0]["usage"];
    assert_eq!(u["inputTokens"], 10);
    assert_eq!(u["cost"], Value::Null, "{u}");
    let r = report(&s, "").await;
    assert_eq!(r["usage"][0]["cost"], Value::Null, "{r}");
    assert_eq!(r["total"]["cost"], Value::Null, "{r}");
    assert!(r.get("currency").is_none());
}

/// A budget of 40 tokens a day: a run within it completes; the next is admitted (30 spent)
/// but stopped before its second model call (45 spent), failed with `BUDGET_EXHAUSTED`; then
/// runs are refused at admission with 429 and `Retry-After`, and nothing is stored, until the
/// budget goes.
async fn a_spent_budget_stops_a_run_and_refuses_the_next(backend: Backend) {
    let m = ScriptedModel::start().await;
    for _ in 0..3 {
        m.push(
            "weather",
            Reply::tool_calls(&[("call_1", "get_weather", r#"{"city": "Paris"}"#)]),
        )
        .push("weather", Reply::text(&["Sunny."]));
    }
    let s = server(backend, &m, None).await;
    let budget_path = format!("/apps/weather/users/{USER}/budget");
    let put = |b: Value| s.client.put(s.url(&budget_path)).json(&b).send();

    // Bad budgets are refused and store nothing.
    for bad in [
        json!({}),
        json!({"costPerMonth": -1}),
        json!({"tokensPerDay": "x"}),
        json!({"tokens": 1}),
    ] {
        let r = put(bad.clone()).await.unwrap();
        assert_eq!(r.status(), 422, "{bad}");
    }
    let none = json_with_status(s.get(&budget_path).await, 200).await;
    assert_eq!(none["tokensPerDay"], Value::Null);
    let r = put(json!({"tokensPerDay": 40})).await.unwrap();
    let set = json_with_status(r, 200).await;
    assert_eq!(set["tokensPerDay"], 40);
    assert_eq!(set["spent"]["tokensToday"], 0);
    assert_eq!(set["exhausted"], false);

    let msgs = s.run_stream(body("weather", "s1", "Weather?")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");

    let msgs = s.run_stream(body("weather", "s2", "Weather again?")).await;
    assert_eq!(done_status(&msgs), "failed", "{msgs:#?}");
    let events = complete(&msgs);
    let last = events.last().unwrap();
    assert_eq!(last["errorCode"], "BUDGET_EXHAUSTED", "{events:#?}");
    assert_eq!(
        m.unused(),
        3,
        "the second call of the second run was never made"
    );
    let runs = json_with_status(
        s.get(&format!("/apps/weather/users/{USER}/runs?status=failed"))
            .await,
        200,
    )
    .await;
    assert_eq!(runs["runs"][0]["sessionId"], "s2");
    assert_eq!(runs["runs"][0]["usage"]["inputTokens"], 10);

    let r = s
        .post_json("/run_sse", body("weather", "s3", "Once more?"))
        .await;
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&retry), "{retry}");
    let refused = json_with_status(r, 429).await;
    assert_eq!(refused["code"], "budget_exhausted", "{refused}");
    let gone = s
        .get(&format!("/apps/weather/users/{USER}/sessions/s3"))
        .await;
    assert_eq!(gone.status(), 404, "a refused run creates nothing");

    let view = json_with_status(s.get(&budget_path).await, 200).await;
    assert_eq!(view["spent"]["tokensToday"], 45, "{view}");
    assert_eq!(view["exhausted"], true);

    let r = s.delete(&budget_path).await;
    assert_eq!(r.status(), 204);
    let r = s.delete(&budget_path).await;
    assert_eq!(json_with_status(r, 404).await["code"], "budget_not_found");
    let msgs = s.run_stream(body("weather", "s3", "Once more?")).await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    let _: Vec<Msg> = msgs;
}

/// An app's `context_cache:` asks the provider to cache: OpenAI gets one `prompt_cache_key`
/// per session (the same on every turn, naming no id), and none for a prompt under
/// `min_tokens`.
async fn context_cache_sends_one_prompt_cache_key_per_session(backend: Backend) {
    let m = ScriptedModel::start().await;
    for _ in 0..4 {
        m.push("weather", Reply::text(&["Hello."]));
    }
    let mut apps = agentd::apps::AppRegistry::default();
    for (app, min_tokens) in [("cached", 0), ("short", 100_000)] {
        let agent = LlmAgent::new("weather_agent", m.model("weather")).instruction("Be brief.");
        apps.insert(
            app,
            agentd::agent::AgentTree::new(Arc::new(agent)).expect("valid tree"),
        );
        let yaml = format!("ttl_seconds: 3600\nmin_tokens: {min_tokens}\n");
        apps.set_context_cache(app, serde_yaml_ng::from_str(&yaml).expect("context_cache"));
    }
    let s = TestServer::start_embedded(backend, apps, PluginSet::default()).await;
    for (app, session) in [
        ("cached", "s1"),
        ("cached", "s1"),
        ("cached", "s2"),
        ("short", "s1"),
    ] {
        let msgs = s.run_stream(body(app, session, "Hi")).await;
        assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    }
    let keys: Vec<Value> = m
        .requests_for("weather")
        .iter()
        .map(|r| r["prompt_cache_key"].clone())
        .collect();
    assert_eq!(keys.len(), 4);
    assert!(keys[0].is_string(), "{keys:?}");
    assert_eq!(keys[0], keys[1], "one key for the turns of a session");
    assert_ne!(keys[0], keys[2], "another session, another key");
    assert!(
        !keys[0].as_str().unwrap().contains("s1"),
        "the key names no id"
    );
    assert_eq!(
        keys[3],
        Value::Null,
        "a prompt under min_tokens is not cached"
    );
}

/// A run that fails after a model call whose event is never committed (an after-model
/// callback refuses the answer) still counts that call: the outcome's statement writes it.
async fn a_failed_runs_last_call_is_counted(backend: Backend) {
    let m = ScriptedModel::start().await;
    m.push("weather", Reply::text(&["Hello."]));
    let agent = LlmAgent::new("weather_agent", m.model("weather")).llm_callbacks(
        agentd::agent::llm::LlmCallbacks::default().after_model(|_ctx, _r| async move {
            Err(agentd::agent::AgentError::failed(
                "REFUSED",
                "not this answer",
            ))
        }),
    );
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        "weather",
        agentd::agent::AgentTree::new(Arc::new(agent)).expect("tree"),
    );
    let s = TestServer::start_embedded(backend, apps, PluginSet::default()).await;
    let mut b = body("weather", "s1", "Hi");
    b["streaming"] = json!(false);
    let msgs = s.run_stream(b).await;
    assert_eq!(done_status(&msgs), "failed", "{msgs:#?}");
    assert!(
        complete(&msgs).iter().all(|e| e["usageMetadata"].is_null()),
        "{msgs:#?}"
    );
    let page = json_with_status(
        s.get(&format!("/apps/weather/users/{USER}/runs")).await,
        200,
    )
    .await;
    assert_eq!(page["runs"][0]["usage"]["inputTokens"], 10, "{page}");
    let r = report(&s, "").await;
    assert_eq!(r["total"]["inputTokens"], 10, "{r}");
    assert_eq!(r["total"]["runs"], 1, "{r}");
}

/// Deleting a session while its run is in a (slow) tool call keeps what the run spent: the
/// deletion adds it to the aggregates in its own transaction.
async fn a_deleted_sessions_running_spend_is_kept(backend: Backend) {
    let m = ScriptedModel::start().await;
    m.push(
        "weather",
        Reply::tool_calls(&[("call_1", "slow_lookup", r#"{"city": "Paris"}"#)]),
    );
    let slow = FunctionTool::new("slow_lookup", "Slow.", |a: City, _ctx| async move {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        Ok(json!({"city": a.city}))
    });
    let agent = LlmAgent::new("weather_agent", m.model("weather")).tool(slow);
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        "weather",
        agentd::agent::AgentTree::new(Arc::new(agent)).expect("tree"),
    );
    let s = TestServer::start_embedded(backend, apps, PluginSet::default()).await;
    let mut b = body("weather", "s1", "Weather?");
    b["background"] = json!(true);
    let started = s.post_json("/run", b).await;
    assert_eq!(started.status(), 202);
    // The tool call's event (with the call's usage) is committed, the tool is running.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let page = json_with_status(
            s.get(&format!("/apps/weather/users/{USER}/runs")).await,
            200,
        )
        .await;
        if page["runs"][0]["usage"]["modelCalls"] == 1 {
            assert_eq!(page["runs"][0]["status"], "running", "{page}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let r = s
        .delete(&format!("/apps/weather/users/{USER}/sessions/s1"))
        .await;
    assert_eq!(r.status(), 200);
    let r = report(&s, "").await;
    assert_eq!(r["total"]["inputTokens"], 10, "{r}");
    assert_eq!(r["total"]["modelCalls"], 1, "{r}");
}

both_backends!(
    a_deleted_sessions_running_spend_is_kept,
    a_failed_runs_last_call_is_counted,
    context_cache_sends_one_prompt_cache_key_per_session,
    usage_is_summed_per_run_session_model_and_day,
    a_model_without_a_price_costs_null,
    a_spent_budget_stops_a_run_and_refuses_the_next,
);
