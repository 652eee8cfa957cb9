//! Plans that hold without statistics: on a PostgreSQL database whose tables were never
//! analyzed (a fresh deployment, a bulk load, autovacuum off or behind), every hot statement
//! reaches its rows through the index made for it. Deterministic: EXPLAIN, not timing.
//!
//! Listing a user's sessions may be planned as a bitmap scan of that user's entries in the
//! listing index plus a top-N sort, or as an ordered scan of it: either way it reads that
//! index, never the primary key or the whole table.
//!
//! The data: 10,000 sessions of one user (and a few of others), 2,000 events and 2,000 ended
//! runs in one of them, which is running another run (on its session row). Each statement is checked with a custom plan (what the first executions of
//! a prepared statement get) and with the generic plan (what PostgreSQL may switch to after
//! five), since sqlx prepares every statement.

mod common;

use agentd::store::memory::due::{CLAIM, CLEAR, DUE};
use agentd::store::memory::sql::{EXPIRE_MEMORIES, EXPIRE_REVISIONS, MEMORY_BY_ID};
use agentd::store::postgres::{
    list_runs_sql, list_session_runs_sql, pg_insert_run_sql, ACTIVE_RUN_SQL, APPEND, APPEND_END,
    APPEND_END_KEYLESS, APPEND_END_UNMETERED, CANCEL_RUN, CREATE_SQL, EVENTS_AFTER_SQL,
    EVENT_BY_ID_SQL, EXPIRE_AS, EXPIRE_RUN, FINISH_RUN, HEAD_SQL, LIST_SESSIONS_SQL, RELEASE_SQL,
    RUN_INVOCATIONS_SQL, TAKE_OVER, TRIM_SQL, USER_RUN_SQL,
};
use common::TestDb;
use serde_json::Value;
use sqlx::{Connection, Executor, Row};

/// Tables whose scans are checked (the small shared-state tables may be read any way).
const CHECKED: &[&str] = &[
    "sessions",
    "events",
    "runs",
    "run_queue",
    "usage_daily",
    "usage_keys",
    "memory_entries",
    "memory_revisions",
    "memory_due",
];

/// (name, statement, EXECUTE arguments, table → the indexes it may be read through; a table
/// written `?t` may also not be read at all).
type Case<'a> = (&'a str, &'a str, &'a str, Vec<(&'a str, &'a [&'a str])>);

/// Every scan of a checked table in a plan: (table, node type, index).
fn scans(plan: &Value, out: &mut Vec<(String, String, Option<String>)>) {
    if let Some(rel) = plan["Relation Name"].as_str() {
        let node = plan["Node Type"].as_str().unwrap_or("").to_string();
        if CHECKED.contains(&rel) && node.contains("Scan") {
            // A bitmap heap scan reads through the index of its bitmap index scan(s).
            let index = plan["Index Name"].as_str().map(str::to_string).or_else(|| {
                plan["Plans"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find_map(|c| c["Index Name"].as_str().map(str::to_string))
            });
            out.push((rel.to_string(), node, index));
        }
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        scans(child, out);
    }
}

#[tokio::test]
async fn hot_statements_use_their_indexes_without_statistics() {
    let db = TestDb::postgres().await;
    db.store().await; // migrated
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    for t in CHECKED {
        // This machine runs with autovacuum off; elsewhere, keep it from analyzing mid-test.
        conn.execute(format!("ALTER TABLE {t} SET (autovacuum_enabled = false)").as_str())
            .await
            .unwrap();
    }
    conn.execute(
        "INSERT INTO sessions (app_name, user_id, id, state, create_time, update_time, last_seq)
         SELECT 'echo', 'u1', 's' || g, '{}'::jsonb, g, g, CASE WHEN g = 5 THEN 2000 ELSE 0 END
           FROM generate_series(1, 10000) g;
         INSERT INTO sessions (app_name, user_id, id, state, create_time, update_time, last_seq)
         SELECT 'echo', 'other' || g, 's1', '{}'::jsonb, g, g, 0 FROM generate_series(1, 100) g;
         INSERT INTO events (app_name, user_id, session_id, seq, id, invocation_id, author,
                             \"timestamp\", event)
         SELECT 'echo', 'u1', 's5', g, 'ev-' || g, 'e-' || (g / 2), 'user', g, '{}'::jsonb
           FROM generate_series(1, 2000) g;
         INSERT INTO runs (id, app_name, user_id, session_id, invocation_id, status, owner,
                           lease_expires_at, created_at, sealed)
         SELECT 'run-' || g, 'echo', 'u1', 's5', 'e-' || g, 'completed', 'r1', 0, g, true
           FROM generate_series(1, 2000) g;
         UPDATE sessions SET active_run = 'run-live', run_invocation = 'e-live', run_owner = 'r1',
                run_created_at = 3000, run_base_seq = 2000
          WHERE app_name = 'echo' AND user_id = 'u1' AND id = 's5';
         INSERT INTO memory_entries (app_name, user_id, session_id, event_id, author,
                                     \"timestamp\", text, content)
         SELECT 'echo', CASE WHEN g <= 10000 THEN 'u1' ELSE 'other' || g END, 's5', 'mem-' || g,
                'user', g, 'fact ' || g, '{}'::jsonb
           FROM generate_series(1, 10100) g;
         INSERT INTO memory_revisions (app_name, user_id, memory_id, revision, session_id,
                                       author, \"timestamp\", text, replaced_at)
         SELECT 'echo', 'u1', 'mem-' || g, 1, 's5', 'user', g, 'old fact', g
           FROM generate_series(1, 1000) g;
         INSERT INTO memory_due (app_name, user_id, session_id, due_at)
         SELECT 'echo', 'u1', 's' || g, g FROM generate_series(1, 10000) g;",
    )
    .await
    .unwrap();
    let analyzed: Vec<f32> = sqlx::query(
        "SELECT reltuples FROM pg_class WHERE relname IN ('sessions', 'events', 'runs')",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<f32, _>(0))
    .collect();
    assert!(
        analyzed.iter().all(|&t| t < 0.0),
        "the premise: no statistics were ever gathered ({analyzed:?})"
    );

    let insert_run = pg_insert_run_sql();
    let spent = |payer: agentd::usage::Payer| agentd::store::usage::spent_sql(&payer, true);
    let user_spent = spent(agentd::usage::Payer::User {
        app: "echo".into(),
        user: "u1".into(),
    });
    let key_spent = spent(agentd::usage::Payer::Key {
        id: "k1".into(),
        user: Some("u1".into()),
    });
    let admin_key_spent = spent(agentd::usage::Payer::Key {
        id: "k1".into(),
        user: None,
    });
    let app_spent = spent(agentd::usage::Payer::App { app: "echo".into() });
    let first_page = list_runs_sql(false, false);
    let later_page = list_runs_sql(true, true);
    let session_runs = list_session_runs_sql(false);
    let session_runs_later = list_session_runs_sql(true);
    let cases: Vec<Case> = vec![
        (
            "session head",
            HEAD_SQL,
            "'echo', 'u1', 's5'",
            vec![("sessions", &["sessions_pkey"])],
        ),
        (
            "append (fenced by the run)",
            APPEND.plain.as_str(),
            "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', 'run-1', NULL, 0, '{}'",
            // A custom plan drops the sealing branch (its parameter is NULL). The session is
            // found by its key or by its running run's id (unique): one row either way.
            vec![
                ("sessions", &["sessions_pkey", "sessions_running"]),
                ("?runs", &["runs_pkey"]),
            ],
        ),
        (
            "append ending the run (reply with the outcome)",
            APPEND_END.plain.as_str(),
            "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', 'run-live', NULL, 0, '{}'",
            // The generic plan keeps the sealing branch (its parameter is NULL here).
            vec![
                ("sessions", &["sessions_pkey", "sessions_running"]),
                ("?runs", &["runs_pkey"]),
            ],
        ),
        (
            "append ending a run no key started",
            APPEND_END_KEYLESS.plain.as_str(),
            "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', 'run-live', NULL, 0, '{}'",
            vec![
                ("sessions", &["sessions_pkey", "sessions_running"]),
                ("?runs", &["runs_pkey"]),
            ],
        ),
        (
            "append ending a run that spent nothing",
            APPEND_END_UNMETERED.plain.as_str(),
            "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', 'run-live', NULL, 0, NULL",
            vec![
                ("sessions", &["sessions_pkey", "sessions_running"]),
                ("?runs", &["runs_pkey"]),
            ],
        ),
        (
            "append (sealing a dead run)",
            APPEND.plain.as_str(),
            "'echo', 'u1', 's5', '{}', '{}', '{}', 1.0, 'ev-new', 'e-9', 'user', '{}', NULL, 'run-1', NULL, NULL",
            vec![("sessions", &["sessions_pkey"]), ("runs", &["runs_pkey"])],
        ),
        (
            "a run's outcome",
            FINISH_RUN.plain.as_str(),
            "'run-live', 'completed', 2, NULL, 'u1', 0, NULL",
            vec![("sessions", &["sessions_running"])],
        ),
        (
            "cancel",
            CANCEL_RUN.plain.as_str(),
            "'run-live', 'me', 'why', 'u1'",
            vec![("sessions", &["sessions_running"])],
        ),
        (
            "takeover of a dead run",
            EXPIRE_RUN.plain.as_str(),
            "'run-live', 'u1'",
            vec![("sessions", &["sessions_running"])],
        ),
        (
            "takeover of a durable run",
            TAKE_OVER.plain.as_str(),
            "'run-live', 'u1', 'r2', 'r1', 0, false, 1000.0, '[]'",
            vec![("sessions", &["sessions_running"])],
        ),
        (
            "end of a run nobody runs",
            EXPIRE_AS.plain.as_str(),
            "'run-live', 'u1', 'abandoned', 'gone', 0, 'r2', false",
            vec![("sessions", &["sessions_running"])],
        ),
        (
            "hand-over on drain",
            RELEASE_SQL,
            "'run-live', 'u1', 0, 'r1'",
            vec![("sessions", &["sessions_running"])],
        ),
        (
            "a run, by its user",
            USER_RUN_SQL.as_str(),
            "'run-7', 'u1'",
            vec![
                ("runs", &["runs_pkey"]),
                ("sessions", &["sessions_running"]),
            ],
        ),
        (
            "the session's active run",
            ACTIVE_RUN_SQL.as_str(),
            "'echo', 'u1', 's5'",
            // The user's running runs are few: either index is exact enough.
            vec![("sessions", &["sessions_pkey", "sessions_running_by_user"])],
        ),
        (
            "what a user spent (a budget's check)",
            &user_spent,
            "'echo', 'u1', '', 20000, 19990",
            // The user's running runs are few: either index is exact enough.
            vec![
                ("sessions", &["sessions_pkey", "sessions_running_by_user"]),
                ("usage_daily", &["usage_daily_pkey"]),
            ],
        ),
        (
            "what an API key spent (a budget's check)",
            &key_spent,
            "'', 'u1', 'k1', 20000, 19990",
            // Running runs are few: any index on them is exact enough.
            vec![
                ("sessions", &["sessions_running", "sessions_running_by_owner", "sessions_running_by_user"]),
                ("usage_keys", &["usage_keys_pkey", "usage_keys_by_key"]),
            ],
        ),
        (
            "what an admin API key spent (a budget's check)",
            &admin_key_spent,
            "'', '', 'k1', 20000, 19990",
            vec![
                ("sessions", &["sessions_running", "sessions_running_by_owner", "sessions_running_by_user"]),
                ("usage_keys", &["usage_keys_by_key"]),
            ],
        ),
        (
            "what an app spent (a budget's check)",
            &app_spent,
            "'echo', '', '', 20000, 19990",
            // Never every session of the app: only the running ones.
            vec![
                ("sessions", &["sessions_running", "sessions_running_by_owner", "sessions_running_by_user"]),
                ("usage_daily", &["usage_daily_by_app"]),
            ],
        ),
        (
            "create session",
            CREATE_SQL,
            "'echo', 'u1', 'new', '{}', 1.0, 1.0",
            vec![],
        ),
        (
            "list sessions (first page)",
            LIST_SESSIONS_SQL,
            "'echo', 'u1', NULL, '', 51",
            vec![("sessions", &["sessions_by_owner_update_time"])],
        ),
        (
            "list sessions (after a cursor)",
            LIST_SESSIONS_SQL,
            "'echo', 'u1', 5000.0, 's5000', 51",
            vec![("sessions", &["sessions_by_owner_update_time"])],
        ),
        (
            "admission with the user event",
            insert_run,
            "'run-new', 'echo', 'u1', 's5', 'e-new', 'r1', true, NULL, 90.0, \
             true, '{}', '{}', '{}', 1.0, 'ev-new', 'e-new', 'user', '{}', NULL, 'run-new', NULL, 600.0, 'k1'",
            vec![
                ("sessions", &["sessions_pkey"]),
                ("run_queue", &["run_queue_by_session"]),
                // A dead run to seal first (`runs_unsealed`); the run id already used (the key).
                ("runs", &["runs_unsealed", "runs_pkey"]),
            ],
        ),
        (
            "admission of a resume (no user event)",
            insert_run,
            "'run-new', 'echo', 'u1', 's5', 'e-new', 'r1', false, NULL, 90.0, \
             false, '{}', '{}', '{}', 0.0, '', '', '', '{}', NULL, NULL, NULL, NULL, NULL",
            vec![
                ("sessions", &["sessions_pkey"]),
                ("run_queue", &["run_queue_by_session"]),
                // A dead run to seal first (`runs_unsealed`); the run id already used (the key).
                ("runs", &["runs_unsealed", "runs_pkey"]),
            ],
        ),
        (
            "events after a seq",
            EVENTS_AFTER_SQL,
            "'echo', 'u1', 's5', 1500, 501",
            vec![("events", &["events_pkey"])],
        ),
        (
            "event by id",
            EVENT_BY_ID_SQL,
            "'echo', 'u1', 's5', 'ev-77'",
            vec![("events", &["events_by_id"])],
        ),
        (
            "a session's run invocations",
            RUN_INVOCATIONS_SQL,
            "'echo', 'u1', 's5'",
            vec![
                ("runs", &["runs_by_session", "runs_unsealed"]),
                ("sessions", &["sessions_pkey"]),
            ],
        ),
        (
            "a user's runs, newest first (first page)",
            first_page.plain.as_str(),
            "'echo', 'u1', 51",
            vec![
                ("runs", &["runs_by_owner_created"]),
                ("sessions", &["sessions_running_by_user"]),
            ],
        ),
        (
            "a user's runs, a later page filtered by status",
            later_page.plain.as_str(),
            "'echo', 'u1', 'completed', 1000.0, 'run-1000', 51",
            vec![
                ("runs", &["runs_by_owner_created"]),
                ("?sessions", &["sessions_running_by_user"]),
            ],
        ),
        (
            "a session's runs (A2A ListTasks by context), first page",
            &session_runs,
            "'echo', 'u1', 's5', 51",
            vec![
                ("runs", &["runs_by_session"]),
                ("sessions", &["sessions_pkey"]),
            ],
        ),
        (
            "a session's runs, after a cursor",
            &session_runs_later,
            "'echo', 'u1', 's5', 1000.0, 'run-1000', 51",
            vec![
                ("runs", &["runs_by_session"]),
                ("sessions", &["sessions_pkey"]),
            ],
        ),
        (
            "one memory, by id",
            MEMORY_BY_ID,
            "'echo', 'u1', 'mem-5000'",
            vec![("memory_entries", &["memory_entries_pkey"])],
        ),
        (
            "trim a user's memories to the newest",
            TRIM_SQL,
            "'echo', 'u1', 9000, 1000",
            vec![(
                "memory_entries",
                &["memory_entries_pkey", "memory_entries_by_age"],
            )],
        ),
        (
            "expire an app's old memories",
            EXPIRE_MEMORIES,
            "'echo', 100.0",
            vec![("memory_entries", &["memory_entries_by_app_age"])],
        ),
        (
            "the sessions due for memory, soonest first",
            DUE,
            "5000.0, 32",
            vec![("memory_due", &["memory_due_by_time"])],
        ),
        (
            "claim a session due for memory",
            CLAIM,
            "'echo', 'u1', 's5000', 5000.0, 9000.0",
            vec![("memory_due", &["memory_due_pkey"])],
        ),
        (
            "clear a session due for memory",
            CLEAR,
            "'echo', 'u1', 's5000', 9000.0",
            vec![("memory_due", &["memory_due_pkey"])],
        ),
        (
            "expire an app's old revisions",
            EXPIRE_REVISIONS,
            "'echo', 100.0",
            vec![("memory_revisions", &["memory_revisions_by_app_age"])],
        ),
    ];

    let mut wrong = vec![];
    for (name, sql, args, expect) in &cases {
        conn.execute(format!("PREPARE hot AS {sql}").as_str())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for mode in ["force_custom_plan", "force_generic_plan"] {
            conn.execute(format!("SET plan_cache_mode = {mode}").as_str())
                .await
                .unwrap();
            let row = sqlx::query(&format!("EXPLAIN (FORMAT JSON) EXECUTE hot({args})"))
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let plan: Value = row.get::<sqlx::types::Json<Value>, _>(0).0;
            let mut found = vec![];
            scans(&plan[0]["Plan"], &mut found);
            for (table, node, index) in &found {
                let allowed = expect
                    .iter()
                    .find(|(t, _)| t.trim_start_matches('?') == table)
                    .map(|(_, i)| *i)
                    .unwrap_or(&[]);
                let ok = index.as_deref().is_some_and(|i| allowed.contains(&i));
                if !ok {
                    wrong.push(format!(
                        "{name} ({mode}): {node} on {table} via {index:?}, expected one of {allowed:?}"
                    ));
                }
            }
            for (table, _) in expect.iter().filter(|(t, _)| !t.starts_with('?')) {
                if !found.iter().any(|(t, _, _)| t == table) {
                    wrong.push(format!("{name} ({mode}): {table} is not read at all?"));
                }
            }
        }
        conn.execute("DEALLOCATE hot").await.unwrap();
    }
    assert!(
        wrong.is_empty(),
        "plans that depend on statistics:\n{}",
        wrong.join("\n")
    );
}

/// SQLite: the budget checks (each payer's spending) search their tables through an index,
/// never scan them whole: the running runs through `runs_running`, the aggregates through
/// their keys.
#[tokio::test]
async fn sqlite_budget_checks_search_through_indexes() {
    use agentd::usage::Payer;
    let db = TestDb::sqlite().await;
    db.store().await; // migrated
    let mut conn = sqlx::SqliteConnection::connect(&db.url)
        .await
        .expect("connect");
    let payers = [
        Payer::User {
            app: "echo".into(),
            user: "u1".into(),
        },
        Payer::App { app: "echo".into() },
        Payer::Key {
            id: "k1".into(),
            user: Some("u1".into()),
        },
        Payer::Key {
            id: "k1".into(),
            user: None,
        },
    ];
    let mut wrong = vec![];
    for payer in &payers {
        let (app, user, key) = payer.columns();
        let sql = agentd::store::usage::spent_sql(payer, false);
        let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}"))
            .bind(app)
            .bind(user)
            .bind(key)
            .bind(20_000_i64)
            .bind(19_990_i64)
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{payer:?}: {e}"));
        let steps: Vec<String> = rows.iter().map(|r| r.get::<String, _>("detail")).collect();
        for table in ["runs", "usage_daily", "usage_keys"] {
            if steps
                .iter()
                .any(|s| s.starts_with(&format!("SCAN {table}")))
            {
                wrong.push(format!("{payer:?} scans {table}: {steps:?}"));
            }
        }
        assert!(
            steps.iter().any(|s| s.contains("runs_running")),
            "{payer:?}: {steps:?}"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A user with more memories than the primary key's branch is for (2,000) is searched by
/// words through the GIN index alone: the primary key is read only for the count that picks
/// the branch, 2,001 entries at most. Without statistics the planner used to AND the GIN index
/// with a scan of the whole key for `user_id = …` (its second column, so every entry of every
/// app and user): more than half of a search at 100,000 memories (migration 0024). Rows about
/// as wide as a memory with its vector, where that plan is the planner's pick; 0019's function,
/// run on the same rows, shows the test tells the two apart.
#[tokio::test]
async fn a_large_users_search_by_words_does_not_scan_the_primary_key() {
    let db = TestDb::postgres().await;
    db.store().await; // migrated
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    conn.execute("ALTER TABLE memory_entries SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    // 3,000 memories of u1 and 500 of others, every tenth of each with one of three words.
    conn.execute(
        "INSERT INTO memory_entries (app_name, user_id, session_id, event_id, author,
                                     \"timestamp\", text, content)
         SELECT 'echo', CASE WHEN g <= 3000 THEN 'u1' ELSE 'other' || (g % 5) END, 's1',
                'mem-' || g, 'user', g,
                CASE g % 30 WHEN 0 THEN 'needle ' WHEN 10 THEN 'thread ' WHEN 20 THEN 'button '
                            ELSE '' END || 'fact ' || g || ' '
                  || repeat('padding ', 190), '{}'::jsonb
           FROM generate_series(1, 3500) g",
    )
    .await
    .unwrap();
    let reltuples: f32 =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'memory_entries'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(reltuples < 0.0, "the premise: no statistics ({reltuples})");

    sqlx::raw_sql(&common::words_function_0019("words_0019"))
        .execute(&mut conn)
        .await
        .unwrap();
    // What a search by `function` found, and the entries it read of the key and the GIN index
    // (the counters of the connection, not yet flushed: those of its searches so far).
    async fn search(conn: &mut sqlx::PgConnection, function: &str) -> (Vec<String>, i64, i64) {
        let mut tx = conn.begin().await.unwrap();
        let found: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT event_id FROM {function}('echo', 'u1', $1, 500)"
        ))
        .bind(r#""needle" or "thread" or "button""#)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        let (key_entries, gin_entries): (i64, i64) = sqlx::query_as(
            "SELECT pg_stat_get_xact_tuples_returned('memory_entries_pkey'::regclass),
                    pg_stat_get_xact_tuples_returned('memory_entries_tsv'::regclass)",
        )
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        tx.rollback().await.unwrap();
        (found, key_entries, gin_entries)
    }
    let (_, old_key_entries, _) = search(&mut conn, "words_0019").await;
    assert!(
        old_key_entries > 2001,
        "the premise: 0019's function reads more of the key here ({old_key_entries})"
    );
    // On a connection of its own: the counters are the backend's, and hold the last search's
    // until they are flushed.
    let mut fresh = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let (found, key_entries, gin_entries) = search(&mut fresh, "agentd_memory_by_words_v1").await;

    let mut found_n: Vec<u32> = found
        .iter()
        .map(|id| id.trim_start_matches("mem-").parse().unwrap())
        .collect();
    found_n.sort_unstable();
    let expected: Vec<u32> = (1..=300).map(|i| i * 10).collect();
    assert_eq!(
        found_n, expected,
        "u1's 300 memories with the word, no one else's"
    );
    assert_eq!(gin_entries, 350, "the matches came from the GIN index");
    assert!(
        key_entries <= 2001,
        "the primary key was read for {key_entries} entries: at most the 2,001 of the count \
         that picks the branch, not every memory of the user"
    );
}
