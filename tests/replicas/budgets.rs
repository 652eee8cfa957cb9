//! A budget held by two replicas at once (docs/usage.md): runs of one user on both spend from
//! one budget counted in the database, overshoot by at most one model call per concurrent run,
//! and once it is spent both refuse the user's next run.

use super::*;
use crate::common::model_server::{Reply, ScriptedModel};
use crate::common::sse_client::read_all;
use crate::postgres_backends;

const RUNS: usize = 6;
const CALLS_PER_RUN: usize = 3;
/// Every scripted call reports 10 input and 5 output tokens.
const CALL_TOKENS: u64 = 15;
const BUDGET: u64 = 100;

/// `spend`: three LLM agents in a row, one model call each (the scripted model answers slowly,
/// so the runs of both replicas are in their calls together).
fn apps(model: &ScriptedModel) -> Apps {
    let apps = Apps::new().agent(
        "spend",
        "agent_class: SequentialAgent\nname: spend\nsub_agents:\n  - config_path: ./a.yaml\n\
         \x20 - config_path: ./b.yaml\n  - config_path: ./c.yaml\n",
    );
    for step in ["a", "b", "c"] {
        let yaml = format!(
            "agent_class: LlmAgent\nname: step_{step}\nmodel: openai/spend\n\
             model_options:\n  base_url: {}\n  retry_backoff_ms: 5\ninstruction: Help.\n",
            model.base_url
        );
        std::fs::write(apps.path().join("spend").join(format!("{step}.yaml")), yaml)
            .expect("agent file");
    }
    apps
}

fn slow_text() -> Reply {
    match Reply::text(&["Spent", " some", " tokens."]) {
        Reply::Stream(chunks) => Reply::Slow(chunks, Duration::from_millis(60)),
        other => other,
    }
}

async fn a_budget_holds_across_two_replicas(backend: Backend) {
    let db = TestDb::new(backend).await;
    let model = ScriptedModel::start().await;
    for _ in 0..RUNS * CALLS_PER_RUN {
        model.push("spend", slow_text());
    }
    let apps = apps(&model);
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    let budget = format!("/apps/spend/users/{USER}/budget");
    let put = a
        .client
        .put(a.url(&budget))
        .json(&json!({"tokensPerDay": BUDGET}))
        .send()
        .await
        .expect("PUT budget");
    assert_eq!(put.status(), 200);

    let runs = (0..RUNS).map(|i| {
        let replica = if i % 2 == 0 { &a } else { &b };
        let mut body = run_body("spend", &format!("s{i}"), "Spend.");
        body["createSession"] = json!(true);
        async move { read_all(replica.post("/run", body).await).await }
    });
    let outcomes = futures::future::join_all(runs).await;
    let mut stopped = 0;
    for msgs in &outcomes {
        let done = msgs.last().expect("messages");
        assert_eq!(done.event, "done", "{msgs:#?}");
        match done.data["status"].as_str() {
            Some("completed") => {}
            Some("failed") => {
                stopped += 1;
                let codes: Vec<&Value> = msgs.iter().map(|m| &m.data["errorCode"]).collect();
                assert!(codes.contains(&&json!("BUDGET_EXHAUSTED")), "{msgs:#?}");
            }
            other => panic!("{other:?}: {msgs:#?}"),
        }
    }
    assert!(
        stopped > 0,
        "{RUNS} runs of {CALLS_PER_RUN} calls cannot all fit in {BUDGET} tokens"
    );

    let view = json_with_status(a.get(&budget).await, 200).await;
    let spent = view["spent"]["tokensToday"].as_u64().expect("spent");
    assert!(
        spent >= BUDGET,
        "the runs went on until the budget was spent: {view}"
    );
    assert!(
        spent <= BUDGET + RUNS as u64 * CALL_TOKENS,
        "overshoot beyond one call per concurrent run: {spent} > {BUDGET} + {RUNS} × {CALL_TOKENS}"
    );
    let made = (RUNS * CALLS_PER_RUN - model.unused()) as u64;
    assert_eq!(
        spent,
        made * CALL_TOKENS,
        "every call made is counted, once"
    );
    eprintln!(
        "budget {BUDGET}: {spent} tokens spent in {made} calls; {stopped} of {RUNS} runs stopped"
    );

    // The report on the other replica says the same, and each run's record adds up to it.
    let report =
        json_with_status(b.get(&format!("/apps/spend/users/{USER}/usage")).await, 200).await;
    assert_eq!(
        report["total"]["inputTokens"].as_u64(),
        Some(made * 10),
        "{report}"
    );
    assert_eq!(
        report["total"]["runs"].as_u64(),
        Some(RUNS as u64),
        "{report}"
    );
    let listed =
        json_with_status(b.get(&format!("/apps/spend/users/{USER}/runs")).await, 200).await;
    let per_run: u64 = listed["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["usage"]["modelCalls"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(per_run, made);

    // Spent: both replicas refuse the user's next run, before storing anything.
    for (r, session) in [(&a, "late-a"), (&b, "late-b")] {
        let mut body = run_body("spend", session, "More.");
        body["createSession"] = json!(true);
        let resp = r.post("/run", body).await;
        assert!(resp.headers().contains_key("retry-after"));
        let refused = json_with_status(resp, 429).await;
        assert_eq!(refused["code"], "budget_exhausted");
        let gone = r
            .get(&format!("/apps/spend/users/{USER}/sessions/{session}"))
            .await;
        assert_eq!(gone.status(), 404);
    }
}

/// A budget set on one replica applies on another that had just read "no budget" (and cached
/// it): the change is announced, so the other refuses the user's next run at once, well
/// before its cache would have expired.
async fn a_budget_set_on_one_replica_applies_on_the_other_at_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let apps = Apps::new().echo("echo", "chunks: 1");
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    async fn run(r: &Replica, session: &str) -> reqwest::Response {
        let mut body = run_body("echo", session, "hi");
        body["createSession"] = json!(true);
        r.post("/run", body).await
    }
    let first = read_all(run(&b, "s0").await).await;
    assert_eq!(first.last().map(|m| m.event.as_str()), Some("done"));
    let put = a
        .client
        .put(a.url(&format!("/apps/echo/users/{USER}/budget")))
        .json(&json!({"tokensPerDay": 0}))
        .send()
        .await
        .expect("PUT budget");
    assert_eq!(put.status(), 200);
    let started = Instant::now();
    let mut admitted = 0;
    loop {
        let resp = run(&b, &format!("s{}", admitted + 1)).await;
        if resp.status() == 429 {
            assert_eq!(
                json_with_status(resp, 429).await["code"],
                "budget_exhausted"
            );
            break;
        }
        read_all(resp).await;
        admitted += 1;
        assert!(
            started.elapsed() < PATIENCE,
            "replica b never heard of the budget"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waited = started.elapsed();
    assert!(
        waited < agentd::runner::budgets::MAX_AGE / 2,
        "b refused only after {waited:?} ({admitted} runs admitted): the notification was not heard"
    );
}

postgres_backends!(
    a_budget_holds_across_two_replicas,
    a_budget_set_on_one_replica_applies_on_the_other_at_once
);
