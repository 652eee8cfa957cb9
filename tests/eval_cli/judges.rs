//! The LLM-as-judge metrics in `agentd eval`: `final_response_match_v2` and the rubric-based
//! ones, judged by a scripted OpenAI-compatible server, their scores checked against
//! google-adk 2.13's evaluators given the same judge answers; a judge that fails or is past
//! the user's budget.

use super::*;

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
        assert!(error.contains("no call of the judge"), "{case}");
    }
    assert_eq!(model.requests_for(&judge).len(), asked + 4);

    // A budget the judge's tokens spend: the first case's runs are admitted, its first
    // invocation's first sample asked (10 tokens), and no call after it (the budget is
    // checked before each); the case fails saying so.
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
    model.push(
        &judge,
        Reply::text(&[valid])
            .with_usage(json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})),
    );
    let run = agentd_eval(&args, Some(&db.url)).await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let result = read_json(&out);
    let error = result["eval_case_results"][0]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(error.contains("the judge was not called"), "{result}");
    assert_eq!(
        model.requests_for(&judge).len(),
        asked + 4 + 1,
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
