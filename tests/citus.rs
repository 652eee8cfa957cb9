//! agentd on Citus (docs/citus.md): every hot-path statement is routed to one shard group
//! (one node), checked with `EXPLAIN` on a real coordinator with two workers; and a shard
//! move of a busy user's shard group while its runs stream loses nothing.
//!
//! Needs `AGENTD_TEST_CITUS_URL` (`./scripts/test.sh` starts a cluster with
//! `scripts/citus.sh`); without it each test says loudly that it did not run.

mod common;

use agentd::store::postgres::{
    list_runs_sql, list_session_runs_sql, pg_insert_run_sql, ACTIVE_RUN_SQL, APPEND_END_SQL,
    APPEND_SQL, CANCEL_RUN_SQL, CREATE_SQL, DEQUEUE_SQL, ENQUEUE_SQL, EVENTS_AFTER_SQL,
    EVENT_BY_ID_SQL, EXPIRE_RUN_SQL, FINISH_RUN_SQL, HEAD_SQL, LIST_SESSIONS_SQL, USER_RUN_SQL,
};
use agentd::store::runs::RUN_INVOCATIONS;
use common::{citus, TestDb};
use serde_json::Value;
use sqlx::{Connection, Executor, Row};
use std::collections::BTreeSet;

/// What an `EXPLAIN` on the coordinator says about where a statement runs: every distributed
/// step's task count, the nodes whose tasks touch a distributed (user-owned) table's shard,
/// and every node any task goes to (a reference table, copied to every node, may be read on
/// any of them).
#[derive(Debug, Default)]
struct Routing {
    task_counts: Vec<u64>,
    shard_nodes: BTreeSet<String>,
    nodes: BTreeSet<String>,
}

/// The tables a plan line reads or writes through a shard (`… on sessions_102008 s`).
fn shard_tables(line: &str) -> Vec<String> {
    line.split(" on ")
        .skip(1)
        .filter_map(|rest| {
            let word = rest.split_whitespace().next()?;
            let (table, id) = word.rsplit_once('_')?;
            (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| table.to_string())
        })
        .collect()
}

fn routing(plan: &str) -> Routing {
    let distributed = agentd::store::postgres::citus::DISTRIBUTED_TABLES;
    let mut r = Routing::default();
    let mut node = String::new();
    for line in plan.lines().map(str::trim) {
        if let Some(n) = line.strip_prefix("Task Count: ") {
            r.task_counts.push(n.trim().parse().unwrap_or(u64::MAX));
        }
        if let Some(n) = line.strip_prefix("Node: ") {
            // "host=… port=… dbname=…": the node, whatever the database.
            node = n
                .split_whitespace()
                .filter(|kv| kv.starts_with("port="))
                .collect();
            r.nodes.insert(node.clone());
        }
        if shard_tables(line)
            .iter()
            .any(|t| distributed.contains(&t.as_str()))
        {
            r.shard_nodes.insert(node.clone());
        }
    }
    r
}

/// `sql` with `$1`, `$2`, … replaced by the comma-separated SQL literals of `args`.
fn with_arguments(sql: &str, args: &str) -> String {
    let mut values = vec![];
    let (mut current, mut quoted) = (String::new(), false);
    for c in args.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                current.push(c);
            }
            ',' if !quoted => values.push(std::mem::take(&mut current).trim().to_string()),
            _ => current.push(c),
        }
    }
    values.push(current.trim().to_string());
    let mut out = sql.to_string();
    // Highest first: `$1` must not eat the start of `$12`.
    for (i, v) in values.iter().enumerate().rev() {
        out = out.replace(&format!("${}", i + 1), &format!("({v})"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hot_statement_is_routed_to_one_shard() {
    if citus::admin_url().is_none() {
        citus::not_run("citus::every_hot_statement_is_routed_to_one_shard");
        return;
    }
    let db = TestDb::citus().await;
    db.store().await; // migrated and distributed
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let distributed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_dist_partition WHERE partmethod = 'h'")
            .fetch_one(&mut conn)
            .await
            .expect("pg_dist_partition");
    assert_eq!(
        distributed as usize,
        agentd::store::postgres::citus::DISTRIBUTED_TABLES.len(),
        "every user-owned table is distributed"
    );
    conn.execute(
        "INSERT INTO sessions (app_name, user_id, id, state, create_time, update_time, last_seq)
         SELECT 'echo', 'u' || g, 's5', '{}'::jsonb, g, g, 2 FROM generate_series(1, 50) g;
         INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author,
                             \"timestamp\", event)
         SELECT 'echo', 'u1', 's5', g, 'ev-' || g, 'e-1', 'user', g, '{}'::jsonb
           FROM generate_series(1, 2) g;
         INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                           lease_expires_at, created_at, sealed)
         VALUES ('run-1', 'echo', 'u1', 's5', 'e-1', 'running', 'r1', 0, 1, true);",
    )
    .await
    .expect("rows");

    let insert_run = pg_insert_run_sql();
    let first_page = list_runs_sql(false, false);
    let later_page = list_runs_sql(true, true);
    let session_runs = list_session_runs_sql(false);
    let append_args =
        "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', 'run-1', NULL";
    let cases: Vec<(&str, &str, &str)> = vec![
        ("session head", HEAD_SQL, "'echo', 'u1', 's5'"),
        ("append (fenced by the run)", APPEND_SQL, append_args),
        ("append ending the run", APPEND_END_SQL.as_str(), append_args),
        (
            "append (sealing a dead run)",
            APPEND_SQL,
            "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', NULL, 'run-1'",
        ),
        ("create session", CREATE_SQL, "'echo', 'u1', 'new', '{}', 1.0, 1.0"),
        ("list sessions", LIST_SESSIONS_SQL, "'echo', 'u1', NULL, '', 51"),
        (
            "admission with the user event",
            insert_run,
            "'run-new', 'echo', 'u1', 's5', 'e-new', 'r1', true, NULL, 90.0, \
             true, '{}', '{}', '{}', 1.0, 'ev-new', 'e-new', 'user', '{}', NULL",
        ),
        (
            "admission of a resume",
            insert_run,
            "'run-new', 'echo', 'u1', 's5', 'e-new', 'r1', false, NULL, 90.0, \
             false, '{}', '{}', '{}', 0.0, '', '', '', '{}', NULL",
        ),
        ("replay: events after a seq", EVENTS_AFTER_SQL, "'echo', 'u1', 's5', 1, 501"),
        ("event by id", EVENT_BY_ID_SQL, "'echo', 'u1', 's5', 'ev-1'"),
        ("a session's run invocations", RUN_INVOCATIONS, "'echo', 'u1', 's5'"),
        ("a run, by its user", USER_RUN_SQL.as_str(), "'run-1', 'u1'"),
        ("the session's active run", ACTIVE_RUN_SQL.as_str(), "'echo', 'u1', 's5'"),
        (
            "outcome",
            FINISH_RUN_SQL.as_str(),
            "'run-1', 'completed', 2, NULL, 'u1'",
        ),
        ("cancel", CANCEL_RUN_SQL.as_str(), "'run-1', 'me', 'why', 'u1'"),
        ("takeover of a dead run", EXPIRE_RUN_SQL.as_str(), "'run-1', 'u1'"),
        ("enqueue", ENQUEUE_SQL.as_str(), "'echo', 'u1', 's5', 'r1'"),
        ("dequeue", DEQUEUE_SQL, "1, 'u1'"),
        ("a user's runs", &first_page, "'echo', 'u1', 51"),
        (
            "a user's runs, a later page",
            &later_page,
            "'echo', 'u1', 'completed', 1000.0, 'run-1000', 51",
        ),
        ("a session's runs", &session_runs, "'echo', 'u1', 's5', 51"),
    ];

    let mut wrong = vec![];
    for (name, sql, args) in &cases {
        // The arguments written into the statement: Citus plans a distributed statement for
        // its parameters' values (the router picks the shard from them), and a PREPAREd
        // modifying statement cannot be EXPLAINed on the coordinator ("could not create
        // distributed plan").
        let sql = with_arguments(sql, args);
        let rows = sqlx::query(&format!("EXPLAIN {sql}"))
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}\n{sql}"));
        let plan: String = rows
            .iter()
            .map(|r| r.get::<String, _>(0))
            .collect::<Vec<_>>()
            .join("\n");
        let r = routing(&plan);
        if r.task_counts.is_empty()
            || r.task_counts.iter().any(|&n| n != 1)
            || r.shard_nodes.len() != 1
        {
            wrong.push(format!("{name}: {r:?}\n{plan}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "statements not routed to one shard group:\n{}",
        wrong.join("\n\n")
    );

    // The check can tell: a run found by its id alone (the bare `/runs/{id}`) asks every
    // shard of `runs`.
    let bare = with_arguments("SELECT * FROM runs WHERE id = $1", "'run-1'");
    let rows = sqlx::query(&format!("EXPLAIN {bare}"))
        .fetch_all(&mut conn)
        .await
        .expect("explain");
    let plan: String = rows
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n");
    let r = routing(&plan);
    assert!(
        r.task_counts.iter().any(|&n| n > 1),
        "a lookup by run id alone fans out: {r:?}\n{plan}"
    );
}

/// One client's runs on its session, one after the other, until `stop`: each run's committed
/// event ids and its `done` status. A request that fails before its stream starts is retried
/// once (counted); a second failure fails the test.
async fn runs_until(
    replica: &common::procs::Replica,
    session: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Vec<String>, usize, usize) {
    let (mut committed, mut runs, mut retries) = (vec![], 0, 0);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let body = serde_json::json!({
            "appName": "slow", "userId": common::procs::USER, "sessionId": session,
            "newMessage": {"role": "user", "parts": [{"text": format!("turn {runs}")}]},
        });
        let mut resp = replica.post("/run", body.clone()).await;
        if resp.status() != 200 {
            retries += 1;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            resp = replica.post("/run", body).await;
        }
        let msgs = common::sse_client::read_all(resp).await;
        let done = msgs.last().expect("messages");
        assert_eq!(done.event, "done", "{msgs:#?}");
        assert_eq!(done.data["status"], "completed", "{msgs:#?}");
        committed.extend(
            msgs.iter()
                .filter(|m| m.is_committed() && m.data["author"] != "user")
                .filter_map(|m| m.data["id"].as_str().map(str::to_string)),
        );
        runs += 1;
    }
    (committed, runs, retries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_move_while_runs_stream_loses_nothing() {
    use common::procs::{Apps, Replica, USER};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    if citus::admin_url().is_none() {
        citus::not_run("citus::a_shard_move_while_runs_stream_loses_nothing");
        return;
    }
    let db = TestDb::citus().await;
    let apps = Apps::new().echo("slow", "chunks: 5\nchunk_delay_ms: 40");
    let a = Replica::spawn(&db, &apps, "a", &[]).await;
    let b = Replica::spawn(&db, &apps, "b", &[]).await;
    let sessions: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    for s in &sessions {
        a.create_session("slow", s).await;
    }
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    // The busy user's shard group: where its `sessions` shard lives, and another worker.
    let shard: i64 =
        sqlx::query_scalar("SELECT get_shard_id_for_distribution_column('sessions', $1)")
            .bind(USER)
            .fetch_one(&mut conn)
            .await
            .expect("shard of the user");
    let placement = "SELECT nodename, nodeport FROM citus_shards WHERE shardid = $1";
    let (from_host, from_port): (String, i32) = sqlx::query_as(placement)
        .bind(shard)
        .fetch_one(&mut conn)
        .await
        .expect("placement");
    let (to_host, to_port): (String, i32) = sqlx::query_as(
        "SELECT nodename, nodeport FROM pg_dist_node
          WHERE groupid <> 0 AND noderole = 'primary' AND nodeport <> $1 LIMIT 1",
    )
    .bind(from_port)
    .fetch_one(&mut conn)
    .await
    .expect("another worker");

    let stop = Arc::new(AtomicBool::new(false));
    let a = Arc::new(a);
    let b = Arc::new(b);
    let clients: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let replica = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (s, stop) = (s.clone(), stop.clone());
            tokio::spawn(async move { runs_until(&replica, s, stop).await })
        })
        .collect();
    // Runs are streaming; move the user's shard group (its runs, events, sessions…) to the
    // other worker. `block_writes`: writes to the group wait while it is copied (logical
    // replication, the online mode, needs `wal_level = logical`).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    sqlx::query(
        "SELECT citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')",
    )
    .bind(shard)
    .bind(&from_host)
    .bind(from_port)
    .bind(&to_host)
    .bind(to_port)
    .execute(&mut conn)
    .await
    .expect("citus_move_shard_placement");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);

    let (moved_host, moved_port): (String, i32) = sqlx::query_as(placement)
        .bind(shard)
        .fetch_one(&mut conn)
        .await
        .expect("placement");
    assert_eq!(
        (moved_host, moved_port),
        (to_host, to_port),
        "the group moved"
    );
    let (mut total_runs, mut total_retries) = (0, 0);
    for (client, session) in clients.into_iter().zip(&sessions) {
        let (committed, runs, retries) = client.await.expect("client");
        assert!(
            runs > 1,
            "runs went on around the move ({runs} on {session})"
        );
        total_runs += runs;
        total_retries += retries;
        // Every event a client saw committed is stored, in order, and nothing else is.
        let stored = common::json_with_status(
            a.get(&format!("/apps/slow/users/{USER}/sessions/{session}"))
                .await,
            200,
        )
        .await;
        let stored: Vec<&Value> = stored["events"]
            .as_array()
            .expect("events")
            .iter()
            .collect();
        let replies: Vec<String> = stored
            .iter()
            .filter(|e| e["author"] != "user")
            .filter_map(|e| e["id"].as_str().map(str::to_string))
            .collect();
        assert_eq!(
            replies, committed,
            "what {session}'s clients saw is what is stored"
        );
        assert_eq!(stored.len(), 2 * runs, "a user event and a reply per run");
    }
    // No run is left running (none stuck past its lease).
    let running = common::json_with_status(
        b.get(&format!("/apps/slow/users/{USER}/runs?status=running"))
            .await,
        200,
    )
    .await;
    assert_eq!(running["runs"], serde_json::json!([]), "{running}");
    eprintln!("shard move: {total_runs} runs across the move, {total_retries} retried request(s)");
}
