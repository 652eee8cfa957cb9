//! Runs of stored eval sets (docs/evals.md#running-a-stored-set), on SQLite, PostgreSQL and
//! Citus, over real HTTP, against an LLM app on a scripted OpenAI-compatible server: a run
//! started by agentd's route goes on without its caller and keeps its results; ADK's
//! dev-server routes run a set and answer as ADK's do; a cancelled run stops its case's run;
//! bad input is refused and starts nothing. (A replica killed mid-case: tests/replicas.)

mod common;

use common::model_server::{Reply, ScriptedModel};
use common::{json_with_status, Backend, TestServer};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(60);

/// A case whose one invocation expects `answer` to `question`, and no tool call.
fn case(id: &str, question: &str, answer: &str) -> Value {
    json!({
        "eval_id": id,
        "conversation": [{
            "invocation_id": format!("inv-{id}"),
            "user_content": {"parts": [{"text": question}], "role": "user"},
            "final_response": {"parts": [{"text": answer}], "role": "model"},
            "intermediate_data": {"tool_uses": []},
        }],
        "session_input": {"app_name": "weather", "user_id": "tester", "state": {}},
    })
}

/// A server with `weather`, an LLM agent on `model` (as `name`), and its set `weather` of two
/// cases stored.
async fn server(
    backend: Backend,
    model: &ScriptedModel,
    name: &str,
) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("weather");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("root_agent.yaml"),
        format!(
            "agent_class: LlmAgent\nname: forecaster\nmodel: openai/{name}\n\
             model_options:\n  base_url: {}\n  retry_backoff_ms: 5\n\
             instruction: Report the weather.\n",
            model.base_url
        ),
    )
    .unwrap();
    let apps = dir.path().to_path_buf();
    let s = TestServer::start_with(backend, |a| a.apps_dir = apps).await;
    let set = json!({
        "eval_set_id": "weather",
        "name": "weather",
        "eval_cases": [
            case("zurich", "What is the weather in Zurich?", "It is sunny in Zurich."),
            case("paris", "And in Paris?", "It rains in Paris today."),
        ],
    });
    let put = s
        .client
        .put(s.url("/apps/weather/eval-sets/weather"))
        .json(&set)
        .send()
        .await
        .unwrap();
    json_with_status(put, 201).await;
    (s, dir)
}

/// Until the run is no longer running; its view.
async fn until_ended(s: &TestServer, id: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let run =
            json_with_status(s.get(&format!("/apps/weather/eval-runs/{id}")).await, 200).await;
        if run["status"] != "running" {
            return run;
        }
        assert!(Instant::now() < deadline, "the run never ended: {run:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn code_of(body: &Value) -> &str {
    body["code"].as_str().unwrap_or_default()
}

/// A run started by agentd's route answers at once, goes on without its caller, and keeps
/// every case's result (ADK's `EvalSetResult`) with the session it ran in; ADK's dev routes
/// list and read the same result; one case is run again through ADK's `run` route.
async fn a_stored_set_runs_without_its_caller_and_keeps_its_results(backend: Backend) {
    let model = ScriptedModel::start().await;
    let name = format!("evalrun-{}", uuid::Uuid::new_v4().simple());
    let (s, _dir) = server(backend, &model, &name).await;
    // Both cases get the Zurich answer (the cases run at once, so which takes which reply
    // is not known): Zurich's case passes, Paris's fails.
    for _ in 0..2 {
        model.push(&name, Reply::text(&["It is sunny ", "in Zurich."]));
    }
    let resp = s
        .post_json("/apps/weather/eval-sets/weather/runs", json!({}))
        .await;
    let location = resp
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_string());
    let started = json_with_status(resp, 202).await;
    let id = started["evalRunId"]
        .as_str()
        .expect("evalRunId")
        .to_string();
    assert!(id.starts_with("weather_weather_"), "ADK's result id: {id}");
    assert_eq!(
        location.as_deref(),
        Some(&*format!("/apps/weather/eval-runs/{id}"))
    );
    assert_eq!(started["evalSetId"], "weather");
    assert_eq!(started["cases"], 2);
    assert_eq!(
        started["criteria"],
        json!({"criteria": {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.8}}),
        "no criteria: ADK's defaults"
    );

    let run = until_ended(&s, &id).await;
    assert_eq!(run["status"], "done", "{run:#}");
    assert_eq!(
        (run["finishedCases"].clone(), run["passedCases"].clone()),
        (json!(2), json!(1))
    );
    let result = &run["result"];
    assert_eq!(result["eval_set_result_id"], id.as_str());
    assert_eq!(result["eval_set_id"], "weather");
    let cases = result["eval_case_results"].as_array().unwrap();
    let verdicts: Vec<(Value, Value)> = cases
        .iter()
        .map(|c| (c["eval_id"].clone(), c["final_eval_status"].clone()))
        .collect();
    assert_eq!(
        verdicts,
        vec![(json!("zurich"), json!(1)), (json!("paris"), json!(2))],
        "the set's order, ADK's statuses"
    );
    // Each case ran in a session of its own, kept: the record of what the agent did.
    for c in cases {
        assert_eq!(c["user_id"], "tester");
        let session = c["session_id"].as_str().unwrap();
        assert!(session.starts_with("adk-eval-session-"), "{session}");
        let events = json_with_status(
            s.get(&format!("/apps/weather/users/tester/sessions/{session}"))
                .await,
            200,
        )
        .await["events"]
            .clone();
        let texts: Vec<&str> = events
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["content"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(texts.last(), Some(&"It is sunny in Zurich."), "{events:#}");
        let per = &c["eval_metric_result_per_invocation"][0];
        assert_eq!(
            per["actual_invocation"]["final_response"]["parts"][0]["text"],
            "It is sunny in Zurich."
        );
    }

    // ADK's dev routes: the same result, in ADK's wire form.
    let ids = json_with_status(s.get("/dev/apps/weather/eval-results").await, 200).await;
    assert_eq!(ids, json!({"evalResultIds": [id]}));
    let legacy = json_with_status(s.get("/dev/apps/weather/eval_results").await, 200).await;
    assert_eq!(legacy, json!([id]));
    let wire = json_with_status(
        s.get(&format!("/dev/apps/weather/eval-results/{id}")).await,
        200,
    )
    .await;
    assert_eq!(wire["evalSetResultId"], id.as_str());
    assert_eq!(wire["evalCaseResults"][0]["finalEvalStatus"], 1);
    let metric = &wire["evalCaseResults"][1]["overallEvalMetricResults"][1];
    assert_eq!(metric["metricName"], "response_match_score");
    assert_eq!(metric["evalStatus"], 2);
    assert_eq!(metric["details"], json!({}), "ADK's defaults filled in");
    assert_eq!(
        json_with_status(
            s.get(&format!("/dev/apps/weather/eval_results/{id}")).await,
            200
        )
        .await,
        wire
    );

    // ADK's web UI's run: one case, one metric with its threshold; answered once it ended.
    model.push(&name, Reply::text(&["It rains in Paris today."]));
    let ran = json_with_status(
        s.post_json(
            "/dev/apps/weather/eval-sets/weather/run",
            json!({"evalCaseIds": ["paris"],
                   "evalMetrics": [{"metricName": "response_match_score", "threshold": 0.5}]}),
        )
        .await,
        200,
    )
    .await;
    let results = ran["runEvalResults"].as_array().expect("runEvalResults");
    assert_eq!(results.len(), 1, "{ran:#}");
    let r = &results[0];
    assert_eq!(
        (r["evalId"].clone(), r["finalEvalStatus"].clone()),
        (json!("paris"), json!(1))
    );
    assert_eq!(r["evalSetId"], "weather");
    assert_eq!(
        r["evalMetricResults"],
        json!([]),
        "ADK's deprecated field, empty"
    );
    let overall = r["overallEvalMetricResults"].as_array().unwrap();
    assert_eq!(overall.len(), 1);
    assert_eq!(
        (
            overall[0]["metricName"].clone(),
            overall[0]["threshold"].clone(),
            overall[0]["score"].clone()
        ),
        (json!("response_match_score"), json!(0.5), json!(1.0))
    );
    assert!(r["sessionId"]
        .as_str()
        .unwrap()
        .starts_with("adk-eval-session-"));
    let all = json_with_status(s.get("/apps/weather/eval-runs").await, 200).await;
    assert_eq!(all["evalRunIds"].as_array().unwrap().len(), 2, "{all}");

    // Deleted: its result goes.
    let gone = s
        .client
        .delete(s.url(&format!("/apps/weather/eval-runs/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 204);
    let missing =
        json_with_status(s.get(&format!("/apps/weather/eval-runs/{id}")).await, 404).await;
    assert_eq!(code_of(&missing), "eval_run_not_found");
    json_with_status(
        s.get(&format!("/dev/apps/weather/eval-results/{id}")).await,
        404,
    )
    .await;
    assert_eq!(model.unused(), 0, "every scripted reply was asked for");
}

/// Cancelling a run in flight stops its case's run and leaves the case without a result;
/// the run reads `cancelled`, and cancelling it again changes nothing.
async fn a_cancelled_run_stops_its_case(backend: Backend) {
    let model = ScriptedModel::start().await;
    let name = format!("evalrun-{}", uuid::Uuid::new_v4().simple());
    let (s, _dir) = server(backend, &model, &name).await;
    let slow = |pieces: usize| match Reply::text(&vec!["sun "; pieces]) {
        Reply::Stream(chunks) => Reply::Slow(chunks, Duration::from_millis(200)),
        other => other,
    };
    model.push(&name, slow(100));
    let started = json_with_status(
        s.post_json(
            "/apps/weather/eval-sets/weather/runs",
            json!({"evalCaseIds": ["zurich"], "criteria": {"response_match_score": 0.5}}),
        )
        .await,
        202,
    )
    .await;
    let id = started["evalRunId"].as_str().unwrap().to_string();
    assert_eq!(started["cases"], 1);
    // Until the case's run is in its model call.
    let deadline = Instant::now() + PATIENCE;
    while model.requests_for(&name).is_empty() {
        assert!(Instant::now() < deadline, "the case never called its model");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = json_with_status(
        s.post_json(&format!("/apps/weather/eval-runs/{id}/cancel"), json!({}))
            .await,
        200,
    )
    .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}");
    assert_eq!(cancelled["finishedCases"], 0);
    // The case's run is cancelled by the worker at its next renewal.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let runs = json_with_status(s.get("/apps/weather/users/tester/runs").await, 200).await;
        let statuses: Vec<&str> = runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["status"].as_str())
            .collect();
        if statuses == ["cancelled"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the case's run goes on: {runs:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = json_with_status(
        s.post_json(&format!("/apps/weather/eval-runs/{id}/cancel"), json!({}))
            .await,
        200,
    )
    .await;
    assert_eq!(again["status"], "cancelled");
    let run = json_with_status(s.get(&format!("/apps/weather/eval-runs/{id}")).await, 200).await;
    assert_eq!(run["result"]["eval_case_results"], json!([]), "{run:#}");
}

/// Bad input gets a clear error and starts nothing.
async fn bad_runs_are_refused_and_start_nothing(backend: Backend) {
    let model = ScriptedModel::start().await;
    let name = format!("evalrun-{}", uuid::Uuid::new_v4().simple());
    let (s, _dir) = server(backend, &model, &name).await;
    let refused = |path: &'static str, body: Value, status: u16, code: &'static str| {
        let s = &s;
        async move {
            let got = json_with_status(s.post_json(path, body.clone()).await, status).await;
            assert_eq!(code_of(&got), code, "{path} {body}: {got}");
        }
    };
    refused(
        "/apps/weather/eval-sets/nope/runs",
        json!({}),
        404,
        "eval_set_not_found",
    )
    .await;
    refused(
        "/dev/apps/weather/eval-sets/nope/run",
        json!({"evalMetrics": []}),
        404,
        "eval_set_not_found",
    )
    .await;
    refused(
        "/apps/nope/eval-sets/weather/runs",
        json!({}),
        404,
        "app_not_found",
    )
    .await;
    refused(
        "/apps/weather/eval-sets/weather/runs",
        json!({"evalCaseIds": ["zurich", "rome"]}),
        404,
        "eval_case_not_found",
    )
    .await;
    refused(
        "/apps/weather/eval-sets/weather/runs",
        json!({"criteria": {"hallucinations_v1": 0.5}}),
        422,
        "invalid_eval_criteria",
    )
    .await;
    refused(
        "/dev/apps/weather/eval-sets/weather/run",
        json!({"evalMetrics": [{"metricName": "response_match_score"}]}),
        422,
        "invalid_eval_criteria",
    )
    .await;
    refused(
        "/apps/weather/eval-sets/weather/runs",
        json!({"userSimulatorConfig": {"type": "llm"}}),
        422,
        "invalid_eval_criteria",
    )
    .await;
    refused(
        "/apps/weather/eval-sets/weather/runs",
        json!({"evalCaseIds": "zurich"}),
        422,
        "validation_error",
    )
    .await;
    // A set with no cases.
    json_with_status(
        s.post_json(
            "/apps/weather/eval-sets",
            json!({"evalSet": {"evalSetId": "empty"}}),
        )
        .await,
        200,
    )
    .await;
    refused(
        "/apps/weather/eval-sets/empty/runs",
        json!({}),
        422,
        "eval_set_empty",
    )
    .await;
    let none = json_with_status(s.get("/apps/weather/eval-runs").await, 200).await;
    assert_eq!(none, json!({"evalRunIds": []}), "nothing was started");
    assert!(model.requests().is_empty(), "no model was called");
    let missing = json_with_status(
        s.post_json(
            "/apps/weather/eval-runs/weather_weather_1.5/cancel",
            json!({}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(code_of(&missing), "eval_run_not_found");
}

both_backends!(
    a_stored_set_runs_without_its_caller_and_keeps_its_results,
    a_cancelled_run_stops_its_case,
    bad_runs_are_refused_and_start_nothing,
);
