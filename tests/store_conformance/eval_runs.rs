//! Runs of stored eval sets at the store: a case is one attempt's at a time (a stale attempt
//! writes nothing), a cancel ends what is not finished, and an app's runs are bounded.

use super::*;
use crate::both_backends;
use agentd::store::{EvalCaseKey, NewEvalRun, RunCreate};

fn cases(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("c{i}"), format!(r#"{{"eval_id": "c{i}"}}"#)))
        .collect()
}

async fn create(
    store: &Arc<dyn Store>,
    id: &str,
    n: usize,
    now: f64,
    running: usize,
    stored: usize,
) -> RunCreate {
    let cases = cases(n);
    store
        .create_eval_run(
            &NewEvalRun {
                app: APP,
                run_id: id,
                set_id: "set",
                criteria: r#"{"criteria": {"response_match_score": 0.8}}"#,
                cases: &cases,
                now,
            },
            running,
            stored,
        )
        .await
        .unwrap()
}

fn case_key(run: &str, case: &str) -> EvalCaseKey {
    EvalCaseKey {
        app: APP.into(),
        run_id: run.into(),
        eval_id: case.into(),
    }
}

/// Claimed once; renewed and finished only by the attempt that holds it; taken again once
/// its lease ran out, after which the first attempt's writes change nothing.
async fn a_case_is_one_attempts_at_a_time(backend: Backend) {
    let (_db, store) = open(backend).await;
    assert_eq!(
        create(&store, "r1", 1, 100.0, 8, 100).await,
        RunCreate::Created
    );
    assert_eq!(
        create(&store, "r1", 1, 100.0, 8, 100).await,
        RunCreate::Exists
    );
    let due = store.due_eval_cases(100.0, 10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(
        (
            due[0].eval_id.as_str(),
            due[0].attempts,
            due[0].session.clone()
        ),
        ("c0", 0, None)
    );
    assert!(
        store.due_eval_cases(99.0, 10).await.unwrap().is_empty(),
        "not due before its time"
    );
    let first = store
        .claim_eval_case(&due[0], 160.0)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!((first.attempt, first.set_id.as_str()), (1, "set"));
    assert!(
        store
            .claim_eval_case(&due[0], 160.0)
            .await
            .unwrap()
            .is_none(),
        "claimed once"
    );
    let k = case_key("r1", "c0");
    assert!(store
        .renew_eval_case(&k, 1, 170.0, Some(("u", "s1")))
        .await
        .unwrap());
    assert!(
        store.due_eval_cases(169.0, 10).await.unwrap().is_empty(),
        "held while renewed"
    );
    // The lease runs out: another attempt takes it, and sees the first one's session.
    let again = store.due_eval_cases(171.0, 10).await.unwrap();
    assert_eq!(again[0].session, Some(("u".into(), "s1".into())));
    let second = store
        .claim_eval_case(&again[0], 231.0)
        .await
        .unwrap()
        .expect("taken again");
    assert_eq!(second.attempt, 2);
    assert!(
        !store.renew_eval_case(&k, 1, 240.0, None).await.unwrap(),
        "a stale attempt renews nothing"
    );
    assert!(!store
        .finish_eval_case(&k, 1, "{\"stale\": true}", 200.0)
        .await
        .unwrap());
    assert!(store
        .finish_eval_case(&k, 2, "{\"ok\": true}", 201.0)
        .await
        .unwrap());
    assert!(
        !store
            .finish_eval_case(&k, 2, "{\"twice\": true}", 202.0)
            .await
            .unwrap(),
        "finished once"
    );
    let run = store.eval_run(APP, "r1").await.unwrap().unwrap();
    assert_eq!(run.open_cases, 0);
    assert!(!run.cancelled);
    assert_eq!(run.cases[0].result.as_deref(), Some("{\"ok\": true}"));
    assert_eq!(
        (run.cases[0].attempts, run.cases[0].finished_at),
        (2, Some(201.0))
    );
    assert!(store.due_eval_cases(1e12, 10).await.unwrap().is_empty());
}

/// A cancel ends the cases not finished (their attempts' renewals then fail) and keeps the
/// finished ones' results; cancelling a finished run changes nothing; deleting removes all.
async fn a_cancel_ends_what_is_not_finished(backend: Backend) {
    let (_db, store) = open(backend).await;
    create(&store, "r1", 2, 100.0, 8, 100).await;
    let due = store.due_eval_cases(100.0, 10).await.unwrap();
    let a = store
        .claim_eval_case(&due[0], 160.0)
        .await
        .unwrap()
        .unwrap();
    let b = store
        .claim_eval_case(&due[1], 160.0)
        .await
        .unwrap()
        .unwrap();
    let (ka, kb) = (
        case_key("r1", &due[0].eval_id),
        case_key("r1", &due[1].eval_id),
    );
    assert!(store
        .finish_eval_case(&ka, a.attempt, "{}", 120.0)
        .await
        .unwrap());
    assert_eq!(store.cancel_eval_run(APP, "r1").await.unwrap(), Some(true));
    assert!(
        !store
            .renew_eval_case(&kb, b.attempt, 200.0, None)
            .await
            .unwrap(),
        "the cancelled case's attempt stops"
    );
    assert!(!store
        .finish_eval_case(&kb, b.attempt, "{}", 130.0)
        .await
        .unwrap());
    let run = store.eval_run(APP, "r1").await.unwrap().unwrap();
    assert!(run.cancelled);
    assert_eq!(run.open_cases, 0);
    let results: Vec<bool> = run.cases.iter().map(|c| c.result.is_some()).collect();
    assert_eq!(
        results.iter().filter(|r| **r).count(),
        1,
        "the finished case keeps its result"
    );
    assert_eq!(store.cancel_eval_run(APP, "r1").await.unwrap(), Some(false));
    assert_eq!(store.cancel_eval_run(APP, "nope").await.unwrap(), None);
    // A finished run is not cancelled by a late cancel.
    create(&store, "r2", 1, 300.0, 8, 100).await;
    let due = store.due_eval_cases(300.0, 10).await.unwrap();
    let c = store
        .claim_eval_case(&due[0], 360.0)
        .await
        .unwrap()
        .unwrap();
    store
        .finish_eval_case(&case_key("r2", "c0"), c.attempt, "{}", 310.0)
        .await
        .unwrap();
    assert_eq!(store.cancel_eval_run(APP, "r2").await.unwrap(), Some(false));
    assert!(!store.eval_run(APP, "r2").await.unwrap().unwrap().cancelled);
    assert_eq!(store.list_eval_runs(APP).await.unwrap(), ["r1", "r2"]);
    assert!(store.delete_eval_run(APP, "r1").await.unwrap());
    assert!(!store.delete_eval_run(APP, "r1").await.unwrap());
    assert_eq!(store.list_eval_runs(APP).await.unwrap(), ["r2"]);
    assert!(store.eval_run(APP, "r1").await.unwrap().is_none());
}

/// An app has at most `max_running` runs in flight (a refused one writes nothing), and keeps
/// its newest `max_stored` finished runs: older ones go as new runs start.
async fn an_apps_runs_are_bounded(backend: Backend) {
    let (_db, store) = open(backend).await;
    assert_eq!(create(&store, "r1", 1, 1.0, 2, 2).await, RunCreate::Created);
    assert_eq!(create(&store, "r2", 1, 2.0, 2, 2).await, RunCreate::Created);
    assert_eq!(create(&store, "r3", 1, 3.0, 2, 2).await, RunCreate::Busy);
    assert_eq!(
        store.list_eval_runs(APP).await.unwrap(),
        ["r1", "r2"],
        "a refused run writes nothing"
    );
    assert_eq!(store.due_eval_cases(1e9, 10).await.unwrap().len(), 2);
    // Each finished, then four more started one at a time, each finished before the next.
    for (i, id) in ["r1", "r2", "r3", "r4", "r5", "r6"].iter().enumerate() {
        if i >= 2 {
            assert_eq!(
                create(&store, id, 1, 1.0 + i as f64, 2, 2).await,
                RunCreate::Created
            );
        }
        let due = store.due_eval_cases(1e9, 10).await.unwrap();
        let d = due.iter().find(|d| d.run_id == *id).unwrap();
        let c = store.claim_eval_case(d, 1e10).await.unwrap().unwrap();
        store
            .finish_eval_case(&case_key(id, "c0"), c.attempt, "{}", 10.0)
            .await
            .unwrap();
    }
    // r6 started with r3, r4, r5 finished beside it: the two newest finished stay, then r6.
    assert_eq!(store.list_eval_runs(APP).await.unwrap(), ["r4", "r5", "r6"]);
}

both_backends!(
    a_case_is_one_attempts_at_a_time,
    a_cancel_ends_what_is_not_finished,
    an_apps_runs_are_bounded,
);
