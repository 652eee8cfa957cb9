//! `agentd eval` (docs/evals.md): an eval set file run in process against an app whose LLM
//! agent talks to a scripted OpenAI-compatible server over real HTTP and calls a real HTTP
//! tool, scored, tabled, written as a result file, and exited by the thresholds, on SQLite
//! (the embedded default), PostgreSQL and Citus (`--database-url`). The scores are checked
//! against google-adk 2.13's own evaluators on the same invocations
//! (tests/clients/adk/eval_scores.py).

mod common;

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

/// One invocation of a case: the user's message and the expected final response.
fn turn(id: &str, question: &str, answer: &str) -> Value {
    json!({
        "invocation_id": id,
        "user_content": {"parts": [{"text": question}], "role": "user"},
        "final_response": {"parts": [{"text": answer}], "role": "model"},
    })
}

/// agentd's scores of the judge metric `metric` in `result` are ADK's (`adk`, from
/// [`adk_scores`]): per case, its score, status, per-invocation scores and, for a rubric
/// metric, each rubric's score.
fn same_as_adk(result: &Value, adk: &Value, metric: &str) {
    for (i, theirs) in adk["cases"].as_array().unwrap().iter().enumerate() {
        let theirs = &theirs[metric];
        let case = &result["eval_case_results"][i];
        let ours = &case["overall_eval_metric_results"][0];
        assert_eq!(
            ours["score"], theirs["score"],
            "case {i}: {ours} vs ADK's {theirs}"
        );
        assert_eq!(ours["eval_status"], theirs["status"], "case {i}");
        let per: Vec<Value> = case["eval_metric_result_per_invocation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["eval_metric_results"][0]["score"].clone())
            .collect();
        assert_eq!(Value::Array(per), theirs["per_invocation"], "case {i}");
        let by_rubric: Vec<Value> = ours["details"]["rubric_scores"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| json!([r["rubric_id"], r["score"]]))
            .collect();
        assert_eq!(Value::Array(by_rubric), theirs["rubric_scores"], "case {i}");
    }
}

/// App `quiz` under `dir/apps`: an LLM agent of the scripted server's model `agent-…`,
/// judged by its `judge-…` (the app's `evals:`). The two model names.
fn judged_app(dir: &Path, model: &ScriptedModel) -> (String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (agent, judge) = (format!("agent-{id}"), format!("judge-{id}"));
    let app_dir = dir.join("apps/quiz");
    std::fs::create_dir_all(&app_dir).unwrap();
    std::fs::write(
        app_dir.join("root_agent.yaml"),
        format!(
            "agent_class: LlmAgent\nname: quizzer\nmodel: openai/{agent}\n\
             model_options:\n  base_url: {}\n  retry_backoff_ms: 5\ninstruction: Answer briefly.\n",
            model.base_url
        ),
    )
    .unwrap();
    std::fs::write(
        app_dir.join("agentd.yaml"),
        format!(
            "evals:\n  judge_model: openai/{judge}\n  judge_options:\n    base_url: {}\n    retry_backoff_ms: 5\n",
            model.base_url
        ),
    )
    .unwrap();
    (agent, judge)
}

/// `agentd eval` of `set` by `config_path` under `dir` (app `quiz`), one case at a time,
/// writing `out`.
fn judged_args(dir: &Path, set: &Path, config_path: &Path, out: &Path) -> Vec<String> {
    vec![
        "--apps-dir".into(),
        dir.join("apps").to_str().unwrap().into(),
        "quiz".into(),
        set.to_str().unwrap().into(),
        "--config".into(),
        config_path.to_str().unwrap().into(),
        "--concurrency".into(),
        "1".into(),
        "--output".into(),
        out.to_str().unwrap().into(),
    ]
}

/// `final_response_match_v2`: the judge the app's `evals:` names is asked `num_samples` times
/// per invocation with the user's message, the agent's response and the reference; the
/// verdicts add up as google-adk 2.13's evaluator adds the same answers up (majority per
/// invocation, a tie invalid, an answer without a verdict not counted, the fraction valid per
/// case), and the exit code follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentd_eval_judges_final_responses_as_adk_does() {
    let db = TestDb::sqlite().await;
    let model = ScriptedModel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (agent, judge) = judged_app(dir.path(), &model);
    let set = dir.path().join("quiz.evalset.json");
    let session = json!({"app_name": "quiz", "user_id": "tester", "state": {}});
    std::fs::write(
        &set,
        json!({"eval_set_id": "quiz", "eval_cases": [
            {"eval_id": "sums", "session_input": session, "conversation": [
                turn("s1", "What is 2+2?", "4"), turn("s2", "And 3+3?", "6")]},
            {"eval_id": "capital", "session_input": session, "conversation": [
                turn("c1", "Capital of France?", "Paris")]},
            {"eval_id": "sky", "session_input": session, "conversation": [
                turn("k1", "Colour of the sky?", "Blue")]},
        ]})
        .to_string(),
    )
    .unwrap();
    let config = json!({"criteria": {"final_response_match_v2": {
        "threshold": 0.5, "judge_model_options": {"num_samples": 3}}}});
    let config_path = dir.path().join("judge.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    for reply in ["It is 4.", "It is 6.", "Paris.", "Green."] {
        model.push(&agent, Reply::text(&[reply]));
    }
    let valid =
        r#"{"reasoning": "The key fact is there.", "is_the_agent_response_valid": "valid"}"#;
    let invalid = "```json\n{\n  \"reasoning\": \"Wrong.\",\n  \"is_the_agent_response_valid\": [\"invalid\"]\n}\n```";
    let unsure = "I cannot tell.";
    let answers = [
        // sums, 2+2: two of three valid.
        valid, valid, invalid,
        // sums, 3+3: one each way and one without a verdict, a tie: invalid.
        invalid, unsure, valid, // capital: no verdict at all, not evaluated.
        unsure, unsure, unsure, // sky: invalid by majority.
        invalid, invalid, valid,
    ];
    for a in answers {
        model.push(
            &judge,
            Reply::text(&[a]).with_usage(
                json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}),
            ),
        );
    }
    let out = dir.path().join("result.json");
    let args = judged_args(dir.path(), &set, &config_path, &out);
    let run = agentd_eval(&args, Some(&db.url)).await;
    assert_eq!(
        run.code,
        Some(1),
        "a case failed: exit 1:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    let row = |case: &str| {
        run.stdout
            .lines()
            .find(|r| r.starts_with(case))
            .unwrap_or_else(|| panic!("no row for {case}:\n{}", run.stdout))
            .to_string()
    };
    assert!(row("sums").contains("0.500 PASSED"), "{}", run.stdout);
    assert!(row("capital").contains("NOT_EVALUATED"), "{}", run.stdout);
    assert!(row("sky").contains("0.000 FAILED"), "{}", run.stdout);
    let result = read_json(&out);
    let metric =
        |case: usize| result["eval_case_results"][case]["overall_eval_metric_results"][0].clone();
    let per = |case: usize| -> Vec<Value> {
        result["eval_case_results"][case]["eval_metric_result_per_invocation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["eval_metric_results"][0]["score"].clone())
            .collect()
    };
    assert_eq!(per(0), vec![json!(1.0), json!(0.0)]);
    assert_eq!(per(1), vec![Value::Null]);
    assert_eq!(metric(1)["eval_status"], 3, "{}", metric(1));

    // ADK, its judge answering the same, scores the same invocations the same.
    let adk = adk_scores(dir.path(), &config, &result, &answers).await;
    same_as_adk(&result, &adk, "final_response_match_v2");

    // What the judge was asked: each invocation's message, response and reference.
    let asked = model.requests_for(&judge);
    assert_eq!(asked.len(), answers.len());
    let first = asked[0].to_string();
    for text in [
        "What is 2+2?",
        "It is 4.",
        r#"\"reference_response\":\"4\""#,
    ] {
        assert!(first.contains(text), "{text} is not in {first}");
    }
    assert_eq!(model.unused(), 0, "every scripted reply was asked for");
    // The judge's tokens are the case's user's usage, as a run's are.
    let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
    let (input, output): (i64, i64) = sqlx::query_as(
        "SELECT input_tokens, output_tokens FROM usage_daily \
         WHERE app_name = 'quiz' AND user_id = 'tester' AND model = ?",
    )
    .bind(&judge)
    .fetch_one(&pool)
    .await
    .expect("the judge's usage");
    assert_eq!((input, output), (12 * 7, 12 * 3));

    // A judge that cannot be reached fails the case (not "not evaluated", which would pass
    // beside a passing metric), asked once per invocation: a failed call ends its samples.
    for reply in ["It is 4.", "It is 6.", "Paris.", "Blue."] {
        model.push(&agent, Reply::text(&[reply]));
    }
    for _ in 0..4 {
        model.push(&judge, Reply::status(401, "bad key"));
    }
    let asked = model.requests_for(&judge).len();
    let run = agentd_eval(&args, Some(&db.url)).await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let result = read_json(&out);
    for case in result["eval_case_results"].as_array().unwrap() {
        assert_eq!(case["final_eval_status"], 2, "{case}");
        let error = case["error"].as_str().unwrap_or_default();
        assert!(error.contains("every call of the judge"), "{case}");
    }
    assert_eq!(model.requests_for(&judge).len(), asked + 4);

    // A budget the judge's tokens spend: the first case's runs are admitted, its first
    // invocation judged (30 tokens), and its second not (the budget is spent by then); the
    // case fails saying so.
    let (spent,): (i64,) = sqlx::query_as(
        "SELECT SUM(input_tokens + output_tokens) FROM usage_daily \
         WHERE app_name = 'quiz' AND user_id = 'tester'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO budgets (app_name, user_id, tokens_per_day, cost_per_month, update_time) \
         VALUES ('quiz', 'tester', ?, NULL, 0)",
    )
    .bind(spent + 1)
    .execute(&pool)
    .await
    .unwrap();
    // The agent's calls spend nothing, so both of the case's runs are admitted.
    let free = json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0});
    for reply in ["It is 4.", "It is 6."] {
        model.push(&agent, Reply::text(&[reply]).with_usage(free.clone()));
    }
    for _ in 0..3 {
        model.push(
            &judge,
            Reply::text(&[valid]).with_usage(
                json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}),
            ),
        );
    }
    let run = agentd_eval(&args, Some(&db.url)).await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let result = read_json(&out);
    let error = result["eval_case_results"][0]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(error.contains("the judge was not called"), "{result}");
    assert_eq!(
        model.requests_for(&judge).len(),
        asked + 4 + 3,
        "a judge call past the budget"
    );
    assert_eq!(model.unused(), 0);
}

/// `rubric_based_final_response_quality_v1`: each invocation is judged by the criterion's
/// rubrics, the case's and its expected invocation's (of the metric's type), `num_samples`
/// times; per rubric the majority decides (a tie is a no), a verdict is matched to its rubric
/// by id or by its text, and the case's score is the mean of every rubric score, as
/// google-adk 2.13's evaluator scores the same answers; each rubric's scores are in the
/// result's `details`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentd_eval_judges_by_rubrics_as_adk_does() {
    let db = TestDb::sqlite().await;
    let model = ScriptedModel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (agent, judge) = judged_app(dir.path(), &model);
    let rubric = |id: &str, text: &str, kind: Option<&str>| {
        let mut r = json!({"rubric_id": id, "rubric_content": {"text_property": text}});
        if let Some(k) = kind {
            r["type"] = json!(k);
        }
        r
    };
    let mut second = turn("t2", "Colour of the sky?", "Blue");
    second["rubrics"] = json!([
        rubric(
            "colour",
            "The answer names a colour.",
            Some("FINAL_RESPONSE_QUALITY")
        ),
        rubric("tools", "No tool is called.", Some("TOOL_USE_QUALITY")),
    ]);
    let session = json!({"app_name": "quiz", "user_id": "tester", "state": {}});
    let set = dir.path().join("quiz.evalset.json");
    std::fs::write(
        &set,
        json!({"eval_set_id": "quiz", "eval_cases": [
            {"eval_id": "trip", "session_input": session,
             "rubrics": [rubric("short", "The answer is one word.", Some("FINAL_RESPONSE_QUALITY"))],
             "conversation": [turn("t1", "Capital of France?", "Paris"), second]},
            {"eval_id": "refused", "session_input": session, "conversation": [
                turn("r1", "Capital of Spain?", "Madrid")]},
        ]})
        .to_string(),
    )
    .unwrap();
    let config = json!({"criteria": {"rubric_based_final_response_quality_v1": {
        "threshold": 0.6, "judge_model_options": {"num_samples": 2},
        "rubrics": [rubric("polite", "The answer is polite.", None)]}}});
    let config_path = dir.path().join("rubrics.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    for reply in ["Paris.", "Blue.", "Madrid."] {
        model.push(&agent, Reply::text(&[reply]));
    }
    let block = |id: Option<&str>, property: &str, verdict: &str| {
        let id = id.map(|i| format!("ID: {i}\n")).unwrap_or_default();
        format!(
            "{id}Property: {property}\nEvidence: n/a\nRationale: Because.\nVerdict: {verdict}\n\n"
        )
    };
    let answers: Vec<String> = vec![
        // t1, polite: a yes and a no, a tie: no. short: yes twice (the second found by its text).
        block(Some("polite"), "The answer is polite.", "yes")
            + &block(Some("short"), "The answer is one word.", "yes"),
        block(None, "**The answer is polite.**", "No")
            + &block(None, "*The answer is one word.*", "Yes"),
        // t2: polite yes; short yes and no verdict: yes; colour no twice; a made-up property
        // and the tool rubric (not this metric's) are left out.
        block(Some("polite"), "The answer is polite.", "yes")
            + &block(Some("short"), "The answer is one word.", "yes")
            + &block(Some("colour"), "The answer names a colour.", "no"),
        block(Some("polite"), "The answer is polite.", "yes")
            + &block(Some("short"), "The answer is one word.", "unsure")
            + &block(Some("colour"), "The answer names a colour.", "no")
            + &block(Some("tools"), "No tool is called.", "yes")
            + &block(Some("made-up"), "The answer rhymes.", "yes"),
        // refused: no verdicts at all, not evaluated.
        "I will not rate this.".into(),
        "Property: The answer is polite.\nVerdict: yes\n".into(),
    ];
    for a in &answers {
        model.push(&judge, Reply::text(&[a.as_str()]));
    }
    let out = dir.path().join("result.json");
    let args = judged_args(dir.path(), &set, &config_path, &out);
    let run = agentd_eval(&args, Some(&db.url)).await;
    assert_eq!(
        run.code,
        Some(1),
        "a case not evaluated: exit 1:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    let result = read_json(&out);
    let metric =
        |case: usize| result["eval_case_results"][case]["overall_eval_metric_results"][0].clone();
    let trip = metric(0);
    // t1: polite 0, short 1; t2: polite 1, short 1, colour 0: 3 of 5.
    assert_eq!(trip["score"], json!(0.6), "{trip}");
    assert_eq!(trip["eval_status"], 1, "{trip}");
    let by_rubric: Vec<(Value, Value)> = trip["details"]["rubric_scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["rubric_id"].clone(), r["score"].clone()))
        .collect();
    assert_eq!(
        by_rubric,
        [
            (json!("polite"), json!(0.5)),
            (json!("short"), json!(1.0)),
            (json!("colour"), json!(0.0))
        ]
    );
    assert_eq!(metric(1)["eval_status"], 3, "{}", metric(1));
    // The case's and the expected invocation's rubrics are on the actual invocations, as
    // ADK's eval service puts them there.
    let per = result["eval_case_results"][0]["eval_metric_result_per_invocation"].clone();
    let ids = |i: usize| -> Vec<Value> {
        per[i]["actual_invocation"]["rubrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["rubric_id"].clone())
            .collect()
    };
    assert_eq!(ids(0), [json!("short")]);
    assert_eq!(ids(1), [json!("short"), json!("colour"), json!("tools")]);

    // ADK, its judge answering the same, scores the same invocations the same.
    let texts: Vec<&str> = answers.iter().map(String::as_str).collect();
    let adk = adk_scores(dir.path(), &config, &result, &texts).await;
    same_as_adk(&result, &adk, "rubric_based_final_response_quality_v1");
    // What the judge was asked: the rubrics with their ids, and the agent's answer.
    let asked = model.requests_for(&judge);
    assert_eq!(asked.len(), answers.len());
    let second = asked[2].to_string();
    for text in [
        "[id: polite] The answer is polite.",
        "[id: colour] The answer names a colour.",
        "Blue.",
    ] {
        assert!(second.contains(text), "{text} is not in {second}");
    }
    assert!(!second.contains("No tool is called"), "{second}");
    assert_eq!(model.unused(), 0, "every scripted reply was asked for");
}
