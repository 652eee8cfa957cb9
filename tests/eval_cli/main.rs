//! `agentd eval` (docs/evals.md): an eval set file run in process against an app whose LLM
//! agent talks to a scripted OpenAI-compatible server over real HTTP and calls a real HTTP
//! tool, scored, tabled, written as a result file, and exited by the thresholds, on SQLite
//! (the embedded default), PostgreSQL and Citus (`--database-url`). The scores are checked
//! against google-adk 2.13's own evaluators on the same invocations
//! (tests/clients/adk/eval_scores.py).

#[path = "../common/mod.rs"]
mod common;

mod judges;

use axum::extract::Query;
use axum::routing::get;
use axum::{Json, Router};
use common::clients::{adk_python, run_driver};
use common::model_server::{Reply, ScriptedModel};
use common::{Backend, TestDb};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;

const SCORES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/adk/eval_scores.py"
);

/// A weather API on a real port: `GET /weather?city=…`.
async fn weather_api() -> String {
    let app = Router::new().route(
        "/weather",
        get(|Query(q): Query<HashMap<String, String>>| async move {
            Json(json!({"city": q.get("city"), "forecast": "sunny"}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn case(id: &str, question: &str, answer: &str, city: &str) -> Value {
    json!({
        "eval_id": id,
        "conversation": [{
            "invocation_id": format!("inv-{id}"),
            "user_content": {"parts": [{"text": question}], "role": "user"},
            "final_response": {"parts": [{"text": answer}], "role": "model"},
            "intermediate_data": {"tool_uses": [{"name": "get_weather", "args": {"city": city}}]},
        }],
        "session_input": {"app_name": "weather", "user_id": "tester", "state": {}},
    })
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn agentd_eval(args: &[String], db: Option<&str>) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentd"));
    cmd.arg("eval")
        .args(args)
        .env("RUST_LOG", "agentd=warn")
        .kill_on_drop(true);
    if let Some(url) = db {
        cmd.args(["--database-url", url]);
    }
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), cmd.output())
        .await
        .expect("agentd eval did not finish in 120 s")
        .expect("agentd eval starts");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("result file")).expect("JSON")
}

/// ADK's scores of the cases in `result` (the actual and expected invocations agentd wrote),
/// its judge answering `judge` in turn.
async fn adk_scores(dir: &Path, config: &Value, result: &Value, judge: &[&str]) -> Value {
    let cases: Vec<Value> = result["eval_case_results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let per = c["eval_metric_result_per_invocation"].as_array().unwrap();
            json!({
                "actual": per.iter().map(|p| p["actual_invocation"].clone()).collect::<Vec<_>>(),
                "expected": per.iter().map(|p| p["expected_invocation"].clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let input = dir.join("adk-input.json");
    std::fs::write(
        &input,
        json!({"config": config, "cases": cases, "judge_answers": judge}).to_string(),
    )
    .unwrap();
    run_driver(&adk_python(), &[SCORES, input.to_str().unwrap()], &[]).await
}

/// agentd's score of `metric` in case `i`: (overall, per invocation).
fn ours(result: &Value, i: usize, metric: &str) -> (f64, Vec<f64>) {
    let case = &result["eval_case_results"][i];
    let overall = case["overall_eval_metric_results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric_name"] == metric)
        .unwrap_or_else(|| panic!("{metric} in {case}"))["score"]
        .as_f64()
        .unwrap();
    let per = case["eval_metric_result_per_invocation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["eval_metric_results"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["metric_name"] == metric)
                .unwrap()["score"]
                .as_f64()
                .unwrap()
        })
        .collect();
    (overall, per)
}

fn assert_same_as_adk(result: &Value, adk: &Value, metrics: &[&str]) {
    for (i, theirs) in adk["cases"].as_array().unwrap().iter().enumerate() {
        for m in metrics {
            let (overall, per) = ours(result, i, m);
            let want = theirs[*m]["score"].as_f64().unwrap();
            assert!(
                (overall - want).abs() < 1e-12,
                "case {i} {m}: agentd {overall}, ADK {want}"
            );
            let want_per: Vec<f64> = theirs[*m]["per_invocation"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(per.len(), want_per.len());
            for (a, b) in per.iter().zip(&want_per) {
                assert!(
                    (a - b).abs() < 1e-12,
                    "case {i} {m} per invocation: {per:?} vs {want_per:?}"
                );
            }
            assert_eq!(
                result["eval_case_results"][i]["overall_eval_metric_results"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|x| x["metric_name"] == *m)
                    .unwrap()["eval_status"],
                theirs[*m]["status"],
                "case {i} {m}: pass/fail as ADK says"
            );
        }
    }
}

async fn agentd_eval_scores_a_set_as_adk_does_and_exits_by_its_thresholds(backend: Backend) {
    let db = TestDb::new(backend).await;
    // SQLite: the embedded default database; the others through --database-url.
    let url = (backend != Backend::Sqlite).then_some(db.url.as_str());
    let model = ScriptedModel::start().await;
    let api = weather_api().await;
    let name = format!("eval-{}", uuid::Uuid::new_v4().simple());
    let dir = tempfile::tempdir().unwrap();
    let app_dir = dir.path().join("apps/weather");
    std::fs::create_dir_all(&app_dir).unwrap();
    std::fs::write(
        app_dir.join("root_agent.yaml"),
        format!(
            "agent_class: LlmAgent\nname: forecaster\nmodel: openai/{name}\n\
             model_options:\n  base_url: {}\n  retry_backoff_ms: 5\n\
             instruction: Report the weather.\ntools:\n  - name: HttpTool\n    args:\n\
             \x20     name: get_weather\n      description: The weather in a city.\n\
             \x20     url: {api}/weather\n      allow_private: [\"127.0.0.1\"]\n\
             \x20     parameters: {{type: object, properties: {{city: {{type: string}}}}, required: [city]}}\n",
            model.base_url
        ),
    )
    .unwrap();
    let set = dir.path().join("weather.evalset.json");
    std::fs::write(
        &set,
        serde_json::to_string_pretty(&json!({
            "eval_set_id": "weather",
            "name": "weather",
            "eval_cases": [
                case("zurich", "What is the weather in Zurich?", "It is sunny in Zurich.", "Zurich"),
                case("paris", "And in Paris?", "It rains in Paris today.", "Paris"),
            ],
        }))
        .unwrap(),
    )
    .unwrap();
    let apps = dir.path().join("apps");
    let out1 = dir.path().join("first.json");
    let script = |zurich_city: &str, paris_city: &str, paris_answer: &str| {
        model.push(
            &name,
            Reply::tool_calls(&[(
                "c1",
                "get_weather",
                &format!(r#"{{"city": "{zurich_city}"}}"#),
            )]),
        );
        model.push(&name, Reply::text(&["It is sunny ", "in Zurich."]));
        model.push(
            &name,
            Reply::tool_calls(&[(
                "c2",
                "get_weather",
                &format!(r#"{{"city": "{paris_city}"}}"#),
            )]),
        );
        model.push(&name, Reply::text(&[paris_answer]));
    };

    // ADK's default criteria: the Zurich case is what was expected, the Paris one asked
    // about Rome and answered something else.
    script("Zurich", "Rome", "Rome is cloudy, not rainy, today.");
    let common = |out: &Path| -> Vec<String> {
        vec![
            "--apps-dir".into(),
            apps.to_str().unwrap().into(),
            "weather".into(),
            set.to_str().unwrap().into(),
            "--concurrency".into(),
            "1".into(),
            "--output".into(),
            out.to_str().unwrap().into(),
        ]
    };
    let args1 = common(&out1);
    let run = agentd_eval(&args1, url).await;
    assert_eq!(
        run.code,
        Some(1),
        "a failing case exits 1:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    let rows: Vec<&str> = run.stdout.lines().collect();
    assert!(
        rows[0].starts_with("eval_id") && rows[0].contains("tool_trajectory_avg_score (≥ 1)"),
        "{}",
        run.stdout
    );
    let row = |case: &str, score: &str, verdict: &str| {
        let row = rows
            .iter()
            .find(|r| r.starts_with(case))
            .unwrap_or_else(|| panic!("no row for {case}:\n{}", run.stdout));
        assert!(row.contains(score) && row.ends_with(verdict), "{row}");
    };
    row("zurich", "1.000 PASSED", "PASSED");
    row("paris", "0.000 FAILED", "FAILED");
    assert!(run.stdout.contains("1 of 2 cases passed"), "{}", run.stdout);
    let result = read_json(&out1);
    assert_eq!(result["eval_set_id"], "weather");
    let cases = result["eval_case_results"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    assert_eq!(
        (
            cases[0]["eval_id"].clone(),
            cases[0]["final_eval_status"].clone()
        ),
        (json!("zurich"), json!(1))
    );
    assert_eq!(
        (
            cases[1]["eval_id"].clone(),
            cases[1]["final_eval_status"].clone()
        ),
        (json!("paris"), json!(2))
    );
    assert_eq!(cases[0]["user_id"], "tester");
    // The actual conversation is the run's: the tool call made and the answer streamed.
    let actual = &cases[1]["eval_metric_result_per_invocation"][0]["actual_invocation"];
    assert_eq!(
        actual["final_response"]["parts"][0]["text"],
        "Rome is cloudy, not rainy, today."
    );
    assert_eq!(ours(&result, 0, "tool_trajectory_avg_score").0, 1.0);
    assert_eq!(ours(&result, 1, "tool_trajectory_avg_score").0, 0.0);
    let defaults =
        json!({"criteria": {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.8}});
    let adk = adk_scores(dir.path(), &defaults, &result, &[]).await;
    assert_same_as_adk(
        &result,
        &adk,
        &["tool_trajectory_avg_score", "response_match_score"],
    );

    // A config that lets any arguments pass and asks less of the answer, found beside the set
    // as `adk eval` finds it: both cases pass, Paris though the tool was asked about Lyon.
    let beside = dir.path().join("test_config.json");
    let lenient = json!({"criteria": {
        "tool_trajectory_avg_score": {"threshold": 1.0, "match_type": "ANY_ORDER", "ignore_args": true},
        "response_match_score": 0.3,
    }});
    std::fs::write(&beside, lenient.to_string()).unwrap();
    script("Zurich", "Lyon", "It is raining in Paris today.");
    let out2 = dir.path().join("second.json");
    let args2 = common(&out2);
    let run = agentd_eval(&args2, url).await;
    assert_eq!(
        run.code,
        Some(0),
        "every case passes: exit 0:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(run.stdout.contains("2 of 2 cases passed"), "{}", run.stdout);
    let result = read_json(&out2);
    let actual = &result["eval_case_results"][1]["eval_metric_result_per_invocation"][0]
        ["actual_invocation"];
    assert_eq!(
        actual["intermediate_data"]["invocation_events"][0]["content"]["parts"][0]["function_call"]
            ["args"],
        json!({"city": "Lyon"}),
        "{actual}"
    );
    let adk = adk_scores(dir.path(), &lenient, &result, &[]).await;
    assert_same_as_adk(
        &result,
        &adk,
        &["tool_trajectory_avg_score", "response_match_score"],
    );
    assert_eq!(model.unused(), 0, "every scripted reply was asked for");

    // What cannot be run exits 2, says why, writes no result and calls no model.
    let asked = model.requests().len();
    let unusable = |extra: &[&str], out: &Path| {
        let mut args = common(out);
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let judge = dir.path().join("judge.json");
    std::fs::write(&judge, r#"{"criteria": {"hallucinations_v1": 0.8}}"#).unwrap();
    let out3 = dir.path().join("third.json");
    let args3 = unusable(&["--config", judge.to_str().unwrap()], &out3);
    let run = agentd_eval(&args3, url).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("hallucinations_v1") && run.stderr.contains("not available"),
        "{}",
        run.stderr
    );
    assert!(!out3.exists(), "no result file for a set that did not run");
    // A result file already there is left as it was by a run that cannot start.
    let kept = std::fs::read_to_string(&out1).unwrap();
    let args_kept = unusable(&["--config", judge.to_str().unwrap()], &out1);
    let run = agentd_eval(&args_kept, url).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(&out1).unwrap(),
        kept,
        "the old result is untouched"
    );
    let mut args4 = common(&out3);
    args4[2] = "nowhere".into();
    let run = agentd_eval(&args4, url).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("no app \"nowhere\""), "{}", run.stderr);
    let nowhere = dir.path().join("missing-dir/result.json");
    let args5 = common(&nowhere);
    let run = agentd_eval(&args5, url).await;
    assert_eq!(
        run.code,
        Some(2),
        "an output that cannot be written fails before any run: {}",
        run.stderr
    );
    assert!(run.stderr.contains("cannot write"), "{}", run.stderr);
    let mut scenario = case("sim", "Hi", "Hello", "Zurich");
    scenario.as_object_mut().unwrap().remove("conversation");
    scenario["conversation_scenario"] =
        json!({"starting_prompt": "Hi", "conversation_plan": "Ask about the weather."});
    std::fs::write(
        &set,
        json!({"eval_set_id": "weather", "eval_cases": [scenario]}).to_string(),
    )
    .unwrap();
    let run = agentd_eval(&args1, url).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("conversation scenario"),
        "{}",
        run.stderr
    );
    std::fs::write(
        &set,
        r#"{"eval_set_id": "weather", "eval_cases": [{"conversation": []}]}"#,
    )
    .unwrap();
    let run = agentd_eval(&args1, url).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("is not a valid eval set"),
        "{}",
        run.stderr
    );
    assert_eq!(
        model.requests().len(),
        asked,
        "nothing unusable reached the model"
    );
}

both_backends!(agentd_eval_scores_a_set_as_adk_does_and_exits_by_its_thresholds);
