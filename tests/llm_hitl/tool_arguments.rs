//! Tool arguments the model got wrong go back to the model and never reach the tool.

use super::*;
use crate::both_backends;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct WeatherArgs {
    /// The city.
    city: String,
    /// How many days ahead.
    days: u32,
}

/// Arguments that are not JSON (beyond repair) or have the wrong type never reach the tool;
/// the error goes back to the model, which can correct itself.
async fn invalid_tool_arguments_go_back_to_the_model(backend: Backend) {
    let m = ScriptedModel::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let weather = FunctionTool::new(
        "get_weather",
        "Weather for a city.",
        move |a: WeatherArgs, _ctx| {
            let calls = c2.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"city": a.city, "days": a.days, "forecast": "sunny"}))
            }
        },
    );
    let agent = LlmAgent::new("weatherman", m.model("wx-model"))
        .instruction("Report weather.")
        .tool(weather);
    let s = TestServer::start_agent(backend, "wx", Arc::new(agent), PluginSet::default()).await;

    m.push(
        "wx-model",
        Reply::tool_calls(&[
            ("bad1", "get_weather", r#"{"city": }"#),
            ("bad2", "get_weather", "nonsense"),
            ("bad4", "get_wether", r#"{"city": "Oslo", "days": 3}"#),
        ]),
    );
    m.push(
        "wx-model",
        Reply::tool_calls(&[("bad3", "get_weather", r#"{"city": 42, "days": 3}"#)]),
    );
    m.push(
        "wx-model",
        Reply::tool_calls(&[("ok1", "get_weather", r#"{"city": "Oslo", "days": 3}"#)]),
    );
    m.push("wx-model", Reply::text(&["Sunny in Oslo."]));
    let msgs = s
        .run_stream(text_body("wx", USER, "s1", "weather in Oslo?"))
        .await;
    assert_eq!(done_status(&msgs), "completed", "{msgs:#?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "only the valid call ran");

    let events = stored_events(&s, "wx", USER, "s1").await;
    for id in ["bad1", "bad2"] {
        let r = responses_to(&events, id);
        assert_eq!(r.len(), 1, "{id}: {events:#?}");
        let err = r[0]["response"]["error"].as_str().unwrap_or_default();
        assert!(err.contains("not valid JSON"), "{id}: {err}");
        assert_eq!(r[0]["name"], "get_weather");
    }
    let r = responses_to(&events, "bad4");
    assert_eq!(r.len(), 1);
    let err = r[0]["response"]["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("get_wether") && err.contains("get_weather"),
        "names the unknown tool and the available ones: {err}"
    );
    let r = responses_to(&events, "bad3");
    assert_eq!(r.len(), 1);
    let err = r[0]["response"]["error"].as_str().unwrap_or_default();
    assert!(err.contains("city"), "the field is named: {err}");
    assert!(err.contains("invalid type"), "{err}");
    let r = responses_to(&events, "ok1");
    assert_eq!(r[0]["response"]["forecast"], "sunny");

    let reqs = m.requests_for("wx-model");
    assert_eq!(reqs.len(), 4);
    for id in ["bad1", "bad2"] {
        let result = tool_result_after_call(&reqs[1], id);
        assert!(
            result["error"]
                .as_str()
                .is_some_and(|e| e.contains("not valid JSON")),
            "the model sees why: {result}"
        );
    }
    let result = tool_result_after_call(&reqs[2], "bad3");
    assert!(
        result["error"].as_str().is_some_and(|e| e.contains("city")),
        "{result}"
    );
    assert_eq!(final_text(&msgs), "Sunny in Oslo.");
    assert_requests_well_formed(&m);
    assert_eq!(m.unused(), 0);
}

both_backends!(invalid_tool_arguments_go_back_to_the_model);
