//! agentd on Citus (docs/citus.md): every hot-path statement is routed to one shard group
//! (one node), checked with `EXPLAIN` on a real coordinator with two workers; and a shard
//! move of a busy user's shard group while its runs stream loses nothing.
//!
//! Needs `AGENTD_TEST_CITUS_URL` (`./scripts/test.sh` starts a cluster with
//! `scripts/citus.sh`); without it each test says loudly that it did not run.

#[path = "../common/mod.rs"]
mod common;
mod evals;
mod hot_path;
mod idle;
mod shard_move;

use agentd::store::postgres::{
    list_runs_sql, list_session_runs_sql, pg_insert_run_sql, ACTIVE_RUN_SQL, APPEND, APPEND_END,
    APPEND_END_KEYLESS, APPEND_END_UNMETERED, CANCEL_RUN, CREATE_SQL, DEQUEUE_SQL, ENQUEUE_SQL,
    EVENTS_AFTER_SQL, EVENT_BY_ID_SQL, EXPIRE_AS, EXPIRE_RUN, FINISH_RUN, HEAD_SQL,
    LIST_SESSIONS_SQL, RELEASE_SQL, RUN_INVOCATIONS_SQL, TAKE_OVER, USER_RUN_SQL,
};
use agentd::store::usage::{spent_sql, BUDGET_SQL, PG_BY_SESSION};
use agentd::usage::Payer;
use common::{citus, TestDb};
use serde_json::Value;
use sqlx::{Connection, Executor, Row};
use std::collections::BTreeSet;

/// Makes Citus refuse any statement planned over several shards on the database at `url`
/// (`citus.multi_task_query_log_level = error`), for the connections opened from now on; a
/// connection opened before (returned).
async fn refuse_multi_shard(url: &str) -> sqlx::PgConnection {
    let name = url.rsplit('/').next().expect("a database name");
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    conn.execute(
        format!("ALTER DATABASE \"{name}\" SET citus.multi_task_query_log_level = 'error'")
            .as_str(),
    )
    .await
    .expect("alter database");
    conn
}

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

/// The coordinator's `EXPLAIN` of `sql`, as text.
async fn explain(conn: &mut sqlx::PgConnection, sql: &str, name: &str) -> String {
    let rows = sqlx::query(&format!("EXPLAIN {sql}"))
        .fetch_all(conn)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}\n{sql}"));
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
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
        agentd::store::postgres::citus::DISTRIBUTED_TABLES.len()
            + agentd::store::postgres::citus::APP_TABLES.len(),
        "every user-owned and app-owned table is distributed"
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
         VALUES ('run-0', 'echo', 'u1', 's5', 'e-0', 'completed', 'r1', 0, 1, true),
                ('run-dead', 'echo', 'u1', 's5', 'e-dead', 'abandoned', 'r0', 0, 0, false);
         UPDATE sessions SET active_run = 'run-1', run_invocation = 'e-1', run_owner = 'r1',
                run_created_at = 2, run_base_seq = 2
          WHERE app_name = 'echo' AND user_id = 'u1' AND id = 's5';",
    )
    .await
    .expect("rows");

    let insert_run = pg_insert_run_sql();
    // An app's and an admin key's spending are every user's: the budget checks that are not
    // one shard's (docs/usage.md#budgets).
    let user_spent = spent_sql(
        &Payer::User {
            app: "echo".into(),
            user: "u1".into(),
        },
        true,
    );
    let key_spent = spent_sql(
        &Payer::Key {
            id: "k1".into(),
            user: Some("u1".into()),
        },
        true,
    );
    let first_page = list_runs_sql(false, false);
    let later_page = list_runs_sql(true, true);
    let session_runs = list_session_runs_sql(false);
    let by_day = agentd::store::usage::daily_sql(
        "day",
        &agentd::store::UsageQuery {
            app: Some("echo".into()),
            user: Some("u1".into()),
            from_day: 0,
            to_day: 0,
            group_by: agentd::store::GroupBy::Day,
        },
    );
    let append_args =
        "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', 'run-1', NULL, 0, '{\"m\": {\"inputTokens\": 1}}'";
    let cases: Vec<(&str, &str, &str)> = vec![
        ("session head", HEAD_SQL, "'echo', 'u1', 's5'"),
        ("append (fenced by the run)", APPEND.citus.as_str(), append_args),
        ("append ending the run", APPEND_END.citus.as_str(), append_args),
        (
            "append ending a run no key started",
            APPEND_END_KEYLESS.citus.as_str(),
            append_args,
        ),
        (
            "append ending a run that spent nothing",
            APPEND_END_UNMETERED.citus.as_str(),
            append_args,
        ),
        (
            "append (sealing a dead run)",
            APPEND.citus.as_str(),
            "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', NULL, 'run-dead', NULL, NULL",
        ),
        ("create session", CREATE_SQL, "'echo', 'u1', 'new', '{}', 1.0, 1.0"),
        ("list sessions", LIST_SESSIONS_SQL, "'echo', 'u1', NULL, '', 51"),
        (
            "admission with the user event",
            insert_run,
            "'run-new', 'echo', 'u1', 's5', 'e-new', 'r1', true, NULL, 90.0, \
             true, '{}', '{}', '{}', 1.0, 'ev-new', 'e-new', 'user', '{}', NULL, 'run-new', NULL, 600.0, 'k1'",
        ),
        (
            "admission of a resume",
            insert_run,
            "'run-new', 'echo', 'u1', 's5', 'e-new', 'r1', false, NULL, 90.0, \
             false, '{}', '{}', '{}', 0.0, '', '', '', '{}', NULL, NULL, NULL, NULL, NULL",
        ),
        ("replay: events after a seq", EVENTS_AFTER_SQL, "'echo', 'u1', 's5', 1, 501"),
        ("event by id", EVENT_BY_ID_SQL, "'echo', 'u1', 's5', 'ev-1'"),
        ("a session's run invocations", RUN_INVOCATIONS_SQL, "'echo', 'u1', 's5'"),
        ("a run, by its user", USER_RUN_SQL.as_str(), "'run-1', 'u1'"),
        ("an ended run, by its user", USER_RUN_SQL.as_str(), "'run-0', 'u1'"),
        ("the session's active run", ACTIVE_RUN_SQL.as_str(), "'echo', 'u1', 's5'"),
        (
            "outcome",
            FINISH_RUN.citus.as_str(),
            "'run-1', 'completed', 2, NULL, 'u1', 0, '{\"m\": {\"inputTokens\": 1}}'",
        ),
        ("cancel", CANCEL_RUN.citus.as_str(), "'run-1', 'me', 'why', 'u1'"),
        ("takeover of a dead run", EXPIRE_RUN.citus.as_str(), "'run-1', 'u1'"),
        (
            "takeover of a durable run",
            TAKE_OVER.citus.as_str(),
            "'run-1', 'u1', 'r2', 'r1', 0, false, 1000.0, '[]'",
        ),
        (
            "end of a run nobody runs",
            EXPIRE_AS.citus.as_str(),
            "'run-1', 'u1', 'abandoned', 'gone', 0, 'r2', false",
        ),
        ("hand-over on drain", RELEASE_SQL, "'run-1', 'u1', 0, 'r1'"),
        ("a user's budget", BUDGET_SQL, "'echo', 'u1'"),
        ("what a user spent", &user_spent, "'echo', 'u1', '', 20000, 19990"),
        ("what a key spent", &key_spent, "'', 'u1', 'k1', 20000, 19990"),
        ("a user's usage by day", &by_day, "20000, 20030, 'echo', 'u1', 1001"),
        ("a user's usage by session", PG_BY_SESSION, "20000, 20030, 'echo', 'u1', 1001"),
        ("enqueue", ENQUEUE_SQL.as_str(), "'echo', 'u1', 's5', 'r1'"),
        ("dequeue", DEQUEUE_SQL, "1, 'u1'"),
        ("a user's runs", first_page.citus.as_str(), "'echo', 'u1', 51"),
        (
            "a user's runs, a later page",
            later_page.citus.as_str(),
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
        let plan = explain(&mut conn, &with_arguments(sql, args), name).await;
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

    // An app's and an admin key's spending are every user's: not one shard's, but Citus must
    // run them (a refusal would fail every admission under such a budget).
    for (name, payer) in [
        ("what an app spent", Payer::App { app: "echo".into() }),
        (
            "what an admin key spent",
            Payer::Key {
                id: "k1".into(),
                user: None,
            },
        ),
    ] {
        let (app, user, key) = payer.columns();
        let row = sqlx::query(&spent_sql(&payer, true))
            .bind(app)
            .bind(user)
            .bind(key)
            .bind(20_000_i64)
            .bind(19_990_i64)
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tokens: i64 = row.get("tokens_today");
        assert!(tokens >= 0, "{name}");
    }

    // The check can tell: a run found by its id alone (the bare `/runs/{id}`) asks every
    // shard of `runs`.
    let bare = with_arguments("SELECT * FROM runs WHERE id = $1", "'run-0'");
    let plan = explain(&mut conn, &bare, "a run by its id alone").await;
    let r = routing(&plan);
    assert!(
        r.task_counts.iter().any(|&n| n > 1),
        "a lookup by run id alone fans out: {r:?}\n{plan}"
    );
}

/// An existing single-PostgreSQL database distributed in place, as docs/citus.md tells an
/// operator: agentd used it as a plain PostgreSQL (a session, its events, memory), then the
/// extension and the workers are added and `agentd migrate --citus` distributes it. Its data
/// is all there, on the shards, and memory search works (its SQL function reached the
/// workers, although it was created before the extension).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_database_is_distributed_in_place() {
    use agentd::event::{Content, Event};
    use agentd::store::{NewSession, SessionKey, StoreLimits};
    let Some(admin) = citus::admin_url() else {
        citus::not_run("citus::an_existing_database_is_distributed_in_place");
        return;
    };
    let name = format!("agentd_test_{}", uuid::Uuid::new_v4().simple());
    let (url, nodes) = citus::create_plain(&admin, &name).await;
    let key = SessionKey::new("echo", "u1", "s1");
    {
        let store = agentd::store::open(&url, 2, StoreLimits::default())
            .await
            .expect("a plain PostgreSQL store");
        store
            .create_session(NewSession {
                app_name: "echo".into(),
                user_id: "u1".into(),
                session_id: Some("s1".into()),
                ..Default::default()
            })
            .await
            .expect("session");
        for text in ["a zebra at the zoo", "the zebra sleeps"] {
            let mut e = Event::new(uuid::Uuid::new_v4().to_string(), "user");
            e.content = Some(Content::text("user", text));
            store.append_event(&key, e, vec![]).await.expect("append");
        }
        assert_eq!(store.add_session_to_memory(&key).await.expect("memory"), 2);
        let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
        let citus: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
        )
        .fetch_one(&mut conn)
        .await
        .expect("extensions");
        assert!(!citus, "the premise: a plain PostgreSQL database");
    }
    citus::register(&admin, &url).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["migrate", "--citus", "--database-url", &url])
        .output()
        .expect("agentd migrate");
    assert!(
        out.status.success(),
        "agentd migrate --citus: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    let distributed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_dist_partition WHERE partmethod = 'h'")
            .fetch_one(&mut conn)
            .await
            .expect("pg_dist_partition");
    assert_eq!(
        distributed as usize,
        agentd::store::postgres::citus::DISTRIBUTED_TABLES.len()
            + agentd::store::postgres::citus::APP_TABLES.len()
    );
    let store = agentd::store::open(&url, 2, StoreLimits::default())
        .await
        .expect("the distributed store");
    let session = store
        .get_session(&key, Default::default())
        .await
        .expect("read")
        .expect("the session survived");
    assert_eq!(session.events.len(), 2);
    let found = store
        .search_memory("echo", "u1", "zebra", 10)
        .await
        .expect("memory search on the workers");
    assert_eq!(found.len(), 2);
    drop(store);

    // A database an older release distributed has no routed functions: the next migrate
    // installs them, and the store calls them (an append through them lands).
    let routed = "SELECT count(*) FROM pg_dist_object
                   WHERE objid::regprocedure::text LIKE 'agentd_%_v1(%'
                     AND objid::regprocedure::text NOT LIKE 'agentd_memory_%'
                     AND distribution_argument_index IS NOT NULL";
    // Memory search, by words and by meaning: one call each on the user's worker too.
    let memory: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_dist_object
          WHERE objid::regprocedure::text LIKE 'agentd_memory_%_v1(%'
            AND distribution_argument_index IS NOT NULL",
    )
    .fetch_one(&mut conn)
    .await
    .expect("memory functions");
    assert_eq!(
        memory, 2,
        "memory search by words and by meaning: routed by their user"
    );
    let n: i64 = sqlx::query_scalar(routed)
        .fetch_one(&mut conn)
        .await
        .expect("functions");
    assert_eq!(
        n, 4,
        "create session, admission, append, finish: routed by their user"
    );
    conn.execute(
        "DROP FUNCTION agentd_create_session_v1, agentd_admit_v1, agentd_append_v1,
                       agentd_finish_run_v1, agentd_record_end_v1, agentd_after_end_v1",
    )
    .await
    .expect("drop the functions, as before this release");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["migrate", "--database-url", &url])
        .output()
        .expect("agentd migrate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n: i64 = sqlx::query_scalar(routed)
        .fetch_one(&mut conn)
        .await
        .expect("functions");
    assert_eq!(n, 4, "installed again by the upgrade's migrate");
    let store = agentd::store::open(&url, 2, StoreLimits::default())
        .await
        .expect("the upgraded store");
    let mut e = Event::new(uuid::Uuid::new_v4().to_string(), "user");
    e.content = Some(Content::text("user", "after the upgrade"));
    let stored = store.append_event(&key, e, vec![]).await.expect("append");
    assert_eq!(stored.seq, 3);
    drop(store);
    citus::drop(&nodes, &name).await;
}

/// A function a migration replaces on a database Citus distributed before it (0024's memory
/// search by words) reaches the workers: a distributed call runs the body the worker has, so a
/// body changed on the coordinator alone would change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_replaces_a_distributed_function_on_the_workers() {
    use agentd::store::StoreLimits;
    let Some(admin) = citus::admin_url() else {
        citus::not_run("citus::a_migration_replaces_a_distributed_function_on_the_workers");
        return;
    };
    let name = format!("agentd_test_{}", uuid::Uuid::new_v4().simple());
    let (url, nodes) = citus::create(&admin, &name).await;
    drop(
        agentd::store::open(&url, 2, StoreLimits::default())
            .await
            .expect("migrated and distributed"),
    );
    let bodies = |nodes: Vec<String>, name: String| async move {
        let mut out = vec![];
        for node in nodes.iter().skip(1) {
            let mut c = sqlx::PgConnection::connect(&common::with_database(node, &name))
                .await
                .expect("a worker");
            let body: String = sqlx::query_scalar(
                "SELECT prosrc || ' ' || coalesce(array_to_string(proconfig, ' '), '')
                   FROM pg_proc WHERE proname = 'agentd_memory_by_words_v1'",
            )
            .fetch_one(&mut c)
            .await
            .expect("the function on the worker");
            out.push(body);
        }
        out
    };
    // As a database distributed before 0024 was: 0019's body, 0024 not applied.
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    let old = common::words_function_0019("agentd_memory_by_words_v1");
    sqlx::raw_sql(&old)
        .execute(&mut conn)
        .await
        .expect("0019's body");
    conn.execute("DELETE FROM _sqlx_migrations WHERE version = 24")
        .await
        .expect("0024 not applied");
    let before = bodies(nodes.clone(), name.clone()).await;
    assert!(!before.is_empty(), "the premise: workers");
    assert!(
        before
            .iter()
            .all(|b| !b.contains("COLLATE") && !b.contains("enable_bitmapscan=off")),
        "the premise: 0019's body on every worker"
    );

    drop(
        agentd::store::open(&url, 2, StoreLimits::default())
            .await
            .expect("migrated to 0024"),
    );
    let after = bodies(nodes.clone(), name.clone()).await;
    assert!(
        after
            .iter()
            .all(|b| b.contains(r#"COLLATE "C""#) && b.contains("enable_bitmapscan=off")),
        "0024's body and settings on every worker: {after:?}"
    );
    let distributed: bool = sqlx::query_scalar(
        "SELECT distribution_argument_index IS NOT NULL FROM pg_dist_object
          WHERE objid = to_regprocedure('agentd_memory_by_words_v1(text, text, text, integer)')",
    )
    .fetch_one(&mut conn)
    .await
    .expect("pg_dist_object");
    assert!(distributed, "still distributed by its user");

    // A user past 2,000 memories is searched by the branch with the "C" collation, still on
    // the user's shard alone: every node refuses a statement planned over several shards.
    conn.execute(
        "INSERT INTO memory_entries (app_name, user_id, session_id, event_id, author,
                                     \"timestamp\", text, content)
         SELECT 'echo', 'u1', 's1', 'mem-' || g, 'user', g,
                CASE WHEN g % 100 = 0 THEN 'needle ' ELSE '' END || 'fact ' || g, '{}'::jsonb
           FROM generate_series(1, 2100) g",
    )
    .await
    .expect("a large user's memories");
    for node in &nodes {
        // On each node for itself: Citus runs ALTER DATABASE only on the coordinator unless
        // told not to propagate it.
        let mut c = sqlx::PgConnection::connect(&common::with_database(node, &name))
            .await
            .expect("a node");
        c.execute("SET citus.enable_ddl_propagation TO off")
            .await
            .expect("no propagation");
        c.execute(
            format!("ALTER DATABASE \"{name}\" SET citus.multi_task_query_log_level = 'error'")
                .as_str(),
        )
        .await
        .expect("refuse multi-shard statements");
    }
    let store = agentd::store::open(&url, 2, StoreLimits::default())
        .await
        .expect("a store with fresh connections");
    let found = store
        .search_memory("echo", "u1", "needle", 30)
        .await
        .expect("one shard's search");
    assert_eq!(found.len(), 21, "u1's memories with the word");
    drop(store);
    let _ = conn.close().await;
    citus::drop(&nodes, &name).await;
}

/// On Citus each hot step is one call of a function distributed by its user
/// (src/store/postgres/router.sql): the coordinator forwards it to the one worker holding the
/// user's shards, whole. `EXPLAIN` on the coordinator shows that one task and nothing else: no
/// subplan, no intermediate result. Then the calls themselves, checked for what they write.
/// (The rest of the suite runs every hot step through these functions on Citus.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hot_step_is_one_call_forwarded_to_the_users_worker() {
    use agentd::store::postgres::router;
    if citus::admin_url().is_none() {
        citus::not_run("citus::every_hot_step_is_one_call_forwarded_to_the_users_worker");
        return;
    }
    let db = TestDb::citus().await;
    db.store().await; // migrated, distributed, the functions installed
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let append_args =
        "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', 'run-1', NULL, 0, '{\"m\": {\"inputTokens\": 1}}'";
    let cases: Vec<(&str, &str, &str)> = vec![
        ("create session", router::CREATE_CALL, "'echo', 'u1', 'new', '{}', 1.0, 1.0"),
        (
            "admission with the user event",
            router::ADMIT_CALL,
            "'run-new', 'echo', 'u1', 's5', 'e-new', 'r1', true, NULL, 90.0, \
             true, '{}', '{}', '{}', 1.0, 'ev-new', 'e-new', 'user', '{}', NULL, 'run-new', NULL, 600.0, 'k1'",
        ),
        ("append", router::APPEND_CALL, append_args),
        ("append ending the run", router::APPEND_END_CALL, append_args),
        (
            "outcome",
            router::FINISH_CALL,
            "'run-1', 'completed', 2, NULL, 'u1', 0, '{\"m\": {\"inputTokens\": 1}}'",
        ),
    ];
    // The node holding the user's shard group.
    let port: i32 = sqlx::query_scalar(
        "SELECT nodeport FROM pg_dist_shard_placement
          WHERE shardid = get_shard_id_for_distribution_column('sessions', 'u1')",
    )
    .fetch_one(&mut conn)
    .await
    .expect("u1's shard");
    let users_node = format!("port={port}");
    let mut wrong = vec![];
    for (name, sql, args) in &cases {
        let plan = explain(&mut conn, &with_arguments(sql, args), name).await;
        let r = routing(&plan);
        if r.task_counts != [1]
            || r.nodes != BTreeSet::from([users_node.clone()])
            || plan.contains("Subplan")
            || plan.contains("intermediate")
        {
            wrong.push(format!("{name}: {r:?}\n{plan}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "steps not forwarded whole to one worker:\n{}",
        wrong.join("\n\n")
    );

    // And they do what the statement forms do: a run admitted with its user event and a key,
    // ended by its reply with usage and a webhook; another ended by its outcome.
    let call = |sql: &str, args: &str| with_arguments(sql, args);
    let hook =
        r#"'[{"url": "http://hooks.example/a", "events": ["run.completed", "run.failed"]}]'"#;
    let usage = r#"'{"m": {"inputTokens": 3, "outputTokens": 2, "modelCalls": 1}}'"#;
    for (session, run) in [("s-end", "run-end"), ("s-fin", "run-fin")] {
        let created: i64 = sqlx::query_scalar(&call(
            &router::CREATE_CALL.replace("SELECT *", "SELECT last_seq"),
            &format!("'echo', 'u2', '{session}', '{{}}', 1.0, 1.0"),
        ))
        .fetch_one(&mut conn)
        .await
        .expect("create");
        assert_eq!(created, 0);
        let row = sqlx::query(&call(
            router::ADMIT_CALL,
            &format!(
                "'{run}', 'echo', 'u2', '{session}', 'e-{run}', 'r1', true, NULL, 90.0, \
                 true, '{{}}', '{{}}', '{{\"n\": 1}}', 2.0, 'ev-{run}', 'e-{run}', 'user', '{{}}', \
                 {hook}, '{run}', NULL, 600.0, 'k1'"
            ),
        ))
        .fetch_one(&mut conn)
        .await
        .expect("admit");
        assert!(row.get::<bool, _>("session") && !row.get::<bool, _>("taken"));
        assert_eq!(row.get::<Option<i64>, _>("seq"), Some(1), "the user event");
        assert_eq!(row.get::<Option<i64>, _>("base_seq"), Some(0));
        assert_eq!(row.get::<Value, _>("user_state")["n"], 1);
    }
    let seq: Option<i64> = sqlx::query_scalar(&call(
        &router::APPEND_END_CALL.replace("SELECT *", "SELECT seq"),
        &format!(
            "'echo', 'u2', 's-end', '{{}}', '{{}}', '{{}}', 3.0, 'ev-reply', 'e-run-end', 'echo', \
             '{{}}', 'run-end', NULL, 0, {usage}"
        ),
    ))
    .fetch_optional(&mut conn)
    .await
    .expect("append ending the run");
    assert_eq!(seq, Some(2));
    let n: i64 = sqlx::query_scalar(&call(
        router::FINISH_CALL,
        &format!("'run-fin', 'failed', 1, 'boom', 'u2', 0, {usage}"),
    ))
    .fetch_one(&mut conn)
    .await
    .expect("finish");
    assert_eq!(n, 1);
    /// id, status, last seq, key, sealed.
    type Ended = (String, String, Option<i64>, Option<String>, bool);
    let runs: Vec<Ended> = sqlx::query_as(
        "SELECT id, status, last_seq, key_id, sealed FROM runs WHERE user_id = 'u2' ORDER BY id",
    )
    .fetch_all(&mut conn)
    .await
    .expect("runs");
    assert_eq!(
        runs,
        vec![
            (
                "run-end".into(),
                "completed".into(),
                Some(2),
                Some("k1".into()),
                true
            ),
            (
                "run-fin".into(),
                "failed".into(),
                Some(1),
                Some("k1".into()),
                true
            ),
        ]
    );
    let free: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sessions WHERE user_id = 'u2' AND active_run IS NULL",
    )
    .fetch_one(&mut conn)
    .await
    .expect("sessions");
    assert_eq!(free, 2, "both sessions freed");
    let daily: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT model, input_tokens, model_calls, runs FROM usage_daily
          WHERE user_id = 'u2' ORDER BY model",
    )
    .fetch_all(&mut conn)
    .await
    .expect("usage_daily");
    assert_eq!(daily, vec![("".into(), 0, 0, 2), ("m".into(), 6, 2, 2)]);
    let keyed: (i64, i64) = sqlx::query_as(
        "SELECT input_tokens, runs FROM usage_keys WHERE user_id = 'u2' AND key_id = 'k1'",
    )
    .fetch_one(&mut conn)
    .await
    .expect("usage_keys");
    assert_eq!(keyed, (6, 2));
    let hooks: Vec<(String, String)> = sqlx::query_as(
        "SELECT run_id, event_type FROM webhook_deliveries WHERE user_id = 'u2' ORDER BY run_id",
    )
    .fetch_all(&mut conn)
    .await
    .expect("deliveries");
    assert_eq!(
        hooks,
        vec![
            ("run-end".into(), "run.completed".into()),
            ("run-fin".into(), "run.failed".into())
        ]
    );
}
