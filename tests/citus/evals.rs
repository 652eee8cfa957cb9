//! Eval sets, cases and runs on Citus are keyed by app (`APP_TABLES`): every statement of
//! their store but the eval workers' scan for due cases (which spans every app, by design)
//! runs on one shard. Checked by running them all on connections where Citus refuses any
//! statement planned over several shards (`citus.multi_task_query_log_level = error`), so a
//! statement added later is checked too.

use super::*;
use agentd::store::{CaseWrite, EvalCaseKey, NewEvalRun, RunCreate, SetWrite, StoredEvalSet};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_eval_statement_but_the_due_scan_runs_on_one_shard() {
    if citus::admin_url().is_none() {
        citus::not_run("citus::every_eval_statement_but_the_due_scan_runs_on_one_shard");
        return;
    }
    let db = TestDb::citus().await;
    let open = db.store().await; // migrated and distributed
    refuse_multi_shard(&db.url).await;
    // New connections, with the setting.
    let store = db.store().await;
    let (app, set) = ("quiz", "golden");
    let cases = vec![
        ("a".to_string(), r#"{"eval_id": "a"}"#.to_string()),
        ("b".to_string(), r#"{"eval_id": "b"}"#.to_string()),
    ];
    let stored = StoredEvalSet {
        head: r#"{"eval_set_id": "golden"}"#.into(),
        cases: cases.clone(),
    };
    let one = |what: &str, e: agentd::store::StoreError| -> ! {
        panic!("{what} is not one shard's: {e}")
    };
    let w = store.put_eval_set(app, set, &stored, false, 10, 1.0).await;
    assert_eq!(
        w.unwrap_or_else(|e| one("creating a set", e)),
        SetWrite::Created
    );
    let w = store.put_eval_set(app, set, &stored, true, 10, 2.0).await;
    assert_eq!(
        w.unwrap_or_else(|e| one("replacing a set", e)),
        SetWrite::Replaced
    );
    let ids = store
        .list_eval_sets(app)
        .await
        .unwrap_or_else(|e| one("listing sets", e));
    assert_eq!(ids, [set]);
    let got = store
        .eval_set(app, set)
        .await
        .unwrap_or_else(|e| one("reading a set", e));
    assert_eq!(got.map(|s| s.cases.len()), Some(2));
    store
        .eval_case_ids(app, set)
        .await
        .unwrap_or_else(|e| one("a set's case ids", e));
    let case = store.eval_case(app, set, "a").await;
    assert!(case.unwrap_or_else(|e| one("reading a case", e)).is_ok());
    let w = store
        .add_eval_case(app, set, "c", r#"{"eval_id": "c"}"#, 10, 1 << 20)
        .await;
    assert_eq!(
        w.unwrap_or_else(|e| one("adding a case", e)),
        CaseWrite::Done
    );
    let w = store
        .update_eval_case(app, set, "c", r#"{"eval_id": "c", "x": 1}"#, 1 << 20)
        .await;
    assert_eq!(
        w.unwrap_or_else(|e| one("updating a case", e)),
        CaseWrite::Done
    );
    let w = store.delete_eval_case(app, set, "c").await;
    assert_eq!(
        w.unwrap_or_else(|e| one("deleting a case", e)),
        CaseWrite::Done
    );

    let run = NewEvalRun {
        app,
        run_id: "run-1",
        set_id: set,
        criteria: r#"{"criteria": {"response_match_score": 0.8}}"#,
        cases: &cases,
        now: 3.0,
    };
    let created = store.create_eval_run(&run, 4, 10).await;
    assert_eq!(
        created.unwrap_or_else(|e| one("creating a run", e)),
        RunCreate::Created
    );
    // The workers' scan spans every app: refused here (the check bites), read on a
    // connection without the setting.
    assert!(
        store.due_eval_cases(f64::MAX, 10).await.is_err(),
        "a multi-shard statement ran: the check would catch nothing"
    );
    let due = open.due_eval_cases(f64::MAX, 10).await.expect("due cases");
    assert_eq!(due.len(), 2);
    let claimed = store.claim_eval_case(&due[0], 100.0).await;
    let claimed = claimed
        .unwrap_or_else(|e| one("claiming a case", e))
        .expect("claimed");
    let key = EvalCaseKey {
        app: app.into(),
        run_id: "run-1".into(),
        eval_id: due[0].eval_id.clone(),
    };
    store
        .renew_eval_case(&key, claimed.attempt, 200.0, Some(("tester", "s1")))
        .await
        .unwrap_or_else(|e| one("renewing a claim", e));
    let finished = store
        .finish_eval_case(&key, claimed.attempt, "{}", 4.0)
        .await;
    assert!(finished.unwrap_or_else(|e| one("finishing a case", e)));
    let read = store
        .eval_run(app, "run-1")
        .await
        .unwrap_or_else(|e| one("reading a run", e));
    assert_eq!(read.map(|r| r.open_cases), Some(1));
    store
        .list_eval_runs(app)
        .await
        .unwrap_or_else(|e| one("listing runs", e));
    store
        .cancel_eval_run(app, "run-1")
        .await
        .unwrap_or_else(|e| one("cancelling a run", e));
    let gone = store.delete_eval_run(app, "run-1").await;
    assert!(gone.unwrap_or_else(|e| one("deleting a run", e)));
    let gone = store.delete_eval_set(app, set).await;
    assert!(gone.unwrap_or_else(|e| one("deleting a set", e)));
}
