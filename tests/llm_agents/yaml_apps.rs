//! Apps declared in YAML run end to end, and the shipped example apps load.

use super::*;
use crate::both_backends;

fn write(dir: &std::path::Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Apps declared in YAML under `--apps-dir`: loaded, listed, described, run over `POST /run`;
/// a broken file is a clear error naming the file and the field and takes nothing else down.
async fn a_yaml_declared_app_runs_end_to_end(backend: Backend) {
    let m = ScriptedModel::start().await;
    // The invoice API the billing agent's HTTP tool calls.
    let api = axum::Router::new().route(
        "/invoices/{id}",
        axum::routing::get(
            |axum::extract::Path(id): axum::extract::Path<String>| async move {
                axum::Json(json!({"invoice": id, "status": "paid", "amount_eur": 42}))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, api).await });
    let dir = tempfile::tempdir().unwrap();
    let opts = format!(
        "model_options:\n  base_url: {}\n  retry_backoff_ms: 5\n",
        m.base_url
    );
    write(
        dir.path(),
        "desk/root_agent.yaml",
        &format!(
            "agent_class: LlmAgent\nname: coordinator\nmodel: openai/yaml-coord\n{opts}\
             description: Routes requests.\ninstruction: Route {{topic?}} requests.\n\
             generate_content_config:\n  temperature: 0.1\n  max_output_tokens: 64\n  stop_sequences: [END]\n\
             sub_agents:\n  - config_path: billing.yaml\n"
        ),
    );
    write(
        dir.path(),
        "desk/billing.yaml",
        &format!(
            "name: billing\nmodel: openai/yaml-billing\n{opts}description: Invoices.\n\
             instruction: You do billing.\noutput_key: last_billing_answer\ntools:\n  - name: exit_loop\n\
             \x20 - name: HttpTool\n    args:\n      name: lookup_invoice\n      description: Finds an invoice.\n\
             \x20     url: http://{api_addr}/invoices/{{id}}\n\
             \x20     allow_private: [\"127.0.0.1\"]\n\
             \x20     parameters: {{type: object, properties: {{id: {{type: string}}}}, required: [id]}}\n"
        ),
    );
    write(
        dir.path(),
        "broken/root_agent.yaml",
        "name: b\nmodel: openai/x\ntools:\n  - name: google_search\n",
    );
    let apps_dir = dir.path().to_path_buf();
    let s = TestServer::start_with(backend, move |a| a.apps_dir = apps_dir).await;

    let apps = json_with_status(s.get("/list-apps").await, 200).await;
    assert_eq!(apps, json!(["broken", "desk"]));
    let detailed = json_with_status(s.get("/list-apps?detailed=true").await, 200).await;
    let broken = &detailed["apps"][0];
    let error = broken["error"].as_str().unwrap();
    assert!(
        error.contains("broken/root_agent.yaml")
            && error.contains("tools[0]")
            && error.contains("google_search"),
        "{error}"
    );
    let info = json_with_status(s.get("/apps/desk/app-info").await, 200).await;
    assert_eq!(info["rootAgentName"], "coordinator");
    assert_eq!(
        info["agents"]["coordinator"]["sub_agents"],
        json!(["billing"])
    );
    assert_eq!(
        info["agents"]["billing"]["tools"][0]["functionDeclarations"][0]["name"],
        "exit_loop"
    );
    let bad_run = s.post_json("/run", body("broken", "s1", "hi")).await;
    let err = json_with_status(bad_run, 500).await;
    assert_eq!(err["code"], "app_load_failed");

    m.push(
        "yaml-coord",
        Reply::tool_calls(&[("t1", "transfer_to_agent", r#"{"agent_name":"billing"}"#)]),
    )
    .push(
        "yaml-billing",
        Reply::tool_calls(&[("h1", "lookup_invoice", r#"{"id": "INV-7"}"#)]),
    )
    .push("yaml-billing", Reply::text(&["Your invoice ", "is fixed."]));
    let mut b = body("desk", "s1", "invoice problem");
    b["stateDelta"] = json!({"topic": "support"});
    let msgs = s.run_stream(b).await;
    assert_eq!(done_status(&msgs), "completed");
    let events = complete(&msgs);
    assert_eq!(events.last().unwrap()["author"], "billing");
    let looked_up = events
        .iter()
        .flat_map(responses_of)
        .find(|r| r["name"] == "lookup_invoice")
        .expect("the HTTP tool answered");
    assert_eq!(
        looked_up["response"],
        json!({"invoice": "INV-7", "status": "paid", "amount_eur": 42})
    );
    assert_eq!(text_of(events.last().unwrap()), "Your invoice is fixed.");
    let req = &m.requests_for("yaml-coord")[0];
    assert_eq!(
        messages(req, "system")[0]["content"]
            .as_str()
            .unwrap()
            .lines()
            .next(),
        Some("Route support requests.")
    );
    assert_eq!(req["temperature"], 0.1);
    assert_eq!(req["max_tokens"], 64);
    assert_eq!(req["stop"], json!(["END"]));
    let stored = session(&s, "desk", "s1").await;
    assert_eq!(
        stored["state"]["last_billing_answer"],
        "Your invoice is fixed."
    );
}

/// The shipped example apps load (no model key is needed to load them).
#[tokio::test]
async fn the_shipped_example_apps_load() {
    let s = TestServer::start(Backend::Sqlite).await;
    let detailed = json_with_status(s.get("/list-apps?detailed=true").await, 200).await;
    for app in detailed["apps"].as_array().unwrap() {
        assert!(
            app.get("error").is_none(),
            "example app failed to load: {app:#}"
        );
    }
    let names: Vec<&str> = detailed["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    for expected in ["assistant", "echo", "helpdesk", "pipeline"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let info = json_with_status(s.get("/apps/helpdesk/app-info").await, 200).await;
    assert_eq!(
        info["agents"]["coordinator"]["sub_agents"],
        json!(["billing", "tech_support"])
    );
    let info = json_with_status(s.get("/apps/assistant/app-info").await, 200).await;
    let tools = &info["agents"]["assistant"]["tools"][0]["functionDeclarations"];
    assert_eq!(tools[0]["name"], "get_current_weather");
    assert_eq!(tools[1]["name"], "load_memory");
}

both_backends!(a_yaml_declared_app_runs_end_to_end);
