//! Runs of stored eval sets outlive the replica running their cases: real processes, a real
//! `kill -9` mid-case, an LLM app on a scripted model whose first answer streams for seconds.
//! The other replica (on SQLite, the restarted one) claims the case once its lease has run out, stops the run the dead
//! attempt left, and runs the case again from the start in a new session; the result is that
//! whole replay's.

use super::*;
use common::model_server::{Reply, ScriptedModel};

const MODEL: &str = "evals-kill";

async fn an_eval_case_is_run_again_when_its_replica_is_killed(backend: Backend) {
    let model = ScriptedModel::start().await;
    // The first attempt's answer streams for about 20 s: the replica is killed inside it.
    // The replies after it are the same answer at once: one for the attempt that runs the
    // case again, and one for the dead attempt's run, should the runner's takeover resume
    // it before the case's new attempt stops it.
    let slow = match Reply::text(&vec!["sunny "; 100]) {
        Reply::Stream(chunks) => Reply::Slow(chunks, Duration::from_millis(200)),
        other => other,
    };
    model.push(MODEL, slow);
    for _ in 0..2 {
        model.push(MODEL, Reply::text(&["It is sunny ", "in Zurich."]));
    }
    let db = TestDb::new(backend).await;
    let apps = Apps::new().agent(
        "weather",
        &format!(
            "agent_class: LlmAgent\nname: forecaster\nmodel: openai/{MODEL}\n\
             model_options:\n  base_url: {}\n  retry_backoff_ms: 5\n\
             instruction: Report the weather.\n",
            model.base_url
        ),
    );
    let flags = ["--run-lease-secs", "2"];
    let mut a = Replica::spawn(&db, &apps, "a", &flags).await;
    let set = json!({
        "eval_set_id": "weather",
        "eval_cases": [{
            "eval_id": "zurich",
            "conversation": [{
                "invocation_id": "inv-1",
                "user_content": {"parts": [{"text": "Weather in Zurich?"}], "role": "user"},
                "final_response": {"parts": [{"text": "It is sunny in Zurich."}], "role": "model"},
                "intermediate_data": {"tool_uses": []},
            }],
            "session_input": {"app_name": "weather", "user_id": "tester", "state": {}},
        }],
    });
    let put = a
        .client
        .put(a.url("/apps/weather/eval-sets/weather"))
        .json(&set)
        .send()
        .await
        .unwrap();
    json_with_status(put, 201).await;
    // Only A serves while the run starts, so A's worker takes the case.
    let started = json_with_status(
        a.post(
            "/apps/weather/eval-sets/weather/runs",
            json!({"criteria": {"response_match_score": 0.8}}),
        )
        .await,
        202,
    )
    .await;
    let id = started["evalRunId"].as_str().unwrap().to_string();
    let deadline = Instant::now() + PATIENCE;
    while model.requests_for(MODEL).is_empty() {
        assert!(Instant::now() < deadline, "the case never called its model");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // PostgreSQL: B serves beside A, and takes the case when A dies. SQLite is one process's
    // file: the replica that takes the case is A's restart.
    let b = match backend {
        Backend::Sqlite => {
            a.signal("-KILL");
            let _ = a.child.wait().await;
            Replica::spawn(&db, &apps, "a", &flags).await
        }
        _ => {
            let b = Replica::spawn(&db, &apps, "b", &flags).await;
            a.signal("-KILL");
            let _ = a.child.wait().await;
            b
        }
    };

    let path = format!("/apps/weather/eval-runs/{id}");
    let deadline = Instant::now() + PATIENCE * 2;
    let run = loop {
        let run = json_with_status(b.get(&path).await, 200).await;
        if run["status"] != "running" {
            break run;
        }
        assert!(
            Instant::now() < deadline,
            "the run never ended on B: {run:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(run["status"], "done", "{run:#}");
    assert_eq!(run["passedCases"], 1, "{run:#}");
    let case = &run["result"]["eval_case_results"][0];
    let replayed = case["session_id"].as_str().unwrap().to_string();
    assert_eq!(
        case["eval_metric_result_per_invocation"][0]["actual_invocation"]["final_response"]
            ["parts"][0]["text"],
        "It is sunny in Zurich.",
        "the result is the whole replay's: {case:#}"
    );
    // Two eval sessions (their list hides them, as ADK's does; their runs do not): the
    // killed attempt's, whose run is not left running (the takeover's cancel ended it, or it
    // ended on its own, resumed by the runner before the case's new attempt stopped it), and
    // the one the result was made in.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let runs = json_with_status(b.get("/apps/weather/users/tester/runs").await, 200).await;
        let runs = runs["runs"].as_array().unwrap();
        let mut sessions: Vec<&str> = runs
            .iter()
            .filter_map(|r| r["sessionId"].as_str())
            .collect();
        sessions.sort();
        sessions.dedup();
        assert_eq!(sessions.len(), 2, "{runs:#?}");
        assert!(sessions.contains(&replayed.as_str()), "{runs:#?}");
        let status_of = |session: &str| -> Vec<&str> {
            runs.iter()
                .filter(|r| r["sessionId"] == session)
                .filter_map(|r| r["status"].as_str())
                .collect()
        };
        assert_eq!(status_of(&replayed), ["completed"]);
        let first = sessions.iter().find(|s| **s != replayed).unwrap();
        if status_of(first).iter().all(|s| *s != "running") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead attempt's run goes on: {runs:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

crate::both_backends!(an_eval_case_is_run_again_when_its_replica_is_killed);
