//! ADK's dev UI served by `--web-ui-dir`, driven in headless Chromium.

use super::*;
use crate::both_backends;

/// ADK's dev UI served by `--web-ui-dir`, in headless Chromium: pick the app, chat, see the
/// reply and the state the agent wrote; then, in the Evals tab, make an eval set, add the chat
/// to it as a case, open the case, run the set with the dialog's metrics and see it passed.
async fn adk_web_ui(backend: Backend) {
    let bundle = web_ui_bundle();
    let m = ScriptedModel::start().await;
    let weather = FunctionTool::new(
        "get_weather",
        "Weather of a city.",
        |a: CityArgs, ctx| async move {
            ctx.set_state("last_city", json!(a.city));
            Ok(json!({"temp": 21}))
        },
    );
    let agent = LlmAgent::new("assistant", m.model("webui"))
        .instruction("Help.")
        .tool(weather);
    let mut apps = agentd::apps::AppRegistry::default();
    apps.insert(
        APP,
        agentd::agent::AgentTree::new(std::sync::Arc::new(agent)).expect("tree"),
    );
    let s = TestServer::start_embedded_with(backend, apps, PluginSet::default(), |a| {
        a.web_ui_dir = Some(bundle.clone());
    })
    .await;
    // The runtime config the bundle reads: this origin, no telemetry.
    let config = json_with_status(
        s.get("/dev-ui/assets/config/runtime-config.json").await,
        200,
    )
    .await;
    assert_eq!(config, json!({"backendUrl": "", "telemetry": false}));
    let r = s
        .client
        .get(s.url("/dev-ui/../Cargo.toml"))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), 404);

    m.push(
        "webui",
        Reply::tool_calls(&[("c1", "get_weather", r#"{"city":"Paris"}"#)]),
    );
    m.push("webui", Reply::text(&["Sunny in ", "Paris"]));
    let out = clients::node(
        "web-ui",
        "web-ui.mjs",
        &[],
        &[
            ("AGENTD_URL", &s.base),
            ("AGENTD_APP", APP),
            ("AGENTD_EXPECT_REPLY", "Sunny in Paris"),
        ],
    )
    .await;
    assert_eq!(out["loaded"], true, "{out}");
    assert_eq!(out["appSelected"], true, "{out}");
    assert_eq!(out["consentDialog"], false, "{out}");
    assert_eq!(out["replySeen"], true, "{out}");
    assert_eq!(out["runFinished"], true, "{out}");
    assert!(
        out["stateText"]
            .as_str()
            .unwrap_or("")
            .contains("last_city"),
        "{out}"
    );
    assert_eq!(
        out["externalRequests"].as_u64().map(|_| ()),
        Some(()),
        "{out}"
    );

    // The Evals tab: a new set, the chat just had as its case, the case opened.
    let session = out["sessionId"].as_str().unwrap_or("").to_string();
    assert!(!session.is_empty(), "{out}");
    // The run from the tab replays the case: the same tool call and answer.
    m.push(
        "webui",
        Reply::tool_calls(&[("c2", "get_weather", r#"{"city":"Paris"}"#)]),
    );
    m.push("webui", Reply::text(&["Sunny in ", "Paris"]));
    let shot = std::env::temp_dir().join(format!("agentd-eval-tab-{backend:?}.png"));
    let evals = clients::node(
        "web-ui",
        "eval-tab.mjs",
        &[],
        &[
            ("AGENTD_URL", &s.base),
            ("AGENTD_APP", APP),
            ("AGENTD_SESSION", &session),
            ("AGENTD_EVAL_SET", "golden"),
            ("AGENTD_EVAL_CASE", "paris_weather"),
            ("AGENTD_SHOT", shot.to_str().unwrap()),
        ],
    )
    .await;
    assert_eq!(evals["setListed"], true, "{evals}");
    assert_eq!(evals["caseListed"], true, "{evals}");
    assert_eq!(evals["alerts"], json!([]), "{evals}");
    let shown = evals["caseText"].as_str().unwrap_or("");
    assert!(
        shown.contains("Case: paris_weather") && shown.contains("Sunny in Paris"),
        "the opened case does not show the conversation: {evals}"
    );
    for r in evals["evalRequests"].as_array().expect("requests") {
        assert_eq!(r["status"], 200, "the UI's eval call failed: {evals}");
    }
    // The run: what the dialog sent, and the result the UI shows.
    assert_eq!(evals["ran"], true, "{evals}");
    assert_eq!(
        evals["runBody"]["eval_case_ids"],
        json!(["paris_weather"]),
        "{evals}"
    );
    let result = evals["resultText"].as_str().unwrap_or("");
    assert!(
        result.contains("1 PASS") && result.contains("Response Match : 0.70"),
        "the run's result is not shown passed: {evals}"
    );
    let runs = json_with_status(s.get(&format!("/apps/{APP}/eval-runs")).await, 200).await;
    let id = runs["evalRunIds"][0]
        .as_str()
        .expect("a stored run")
        .to_string();
    let run = json_with_status(s.get(&format!("/apps/{APP}/eval-runs/{id}")).await, 200).await;
    assert_eq!(
        (run["status"].clone(), run["passedCases"].clone()),
        (json!("done"), json!(1)),
        "{run}"
    );
    // What the UI stored is the case agentd makes from that session, tool call included.
    let file = json_with_status(s.get(&format!("/apps/{APP}/eval-sets/golden")).await, 200).await;
    let case = &file["eval_cases"][0];
    assert_eq!(case["eval_id"], "paris_weather", "{file}");
    let events = &case["conversation"][0]["intermediate_data"]["invocation_events"];
    assert_eq!(
        events[0]["content"]["parts"][0]["function_call"]["name"], "get_weather",
        "{file}"
    );
    assert_eq!(
        case["conversation"][0]["final_response"]["parts"][0]["text"], "Sunny in Paris",
        "{file}"
    );
}

both_backends!(adk_web_ui);
