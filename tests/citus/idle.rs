//! An idle deployment on Citus: three replicas up and nothing to do run at most one
//! multi-shard statement a second on the coordinator between them (issue 36). The scans for
//! due work take turns and go quiet while they know nothing is due (src/store/turns.rs), idle
//! heartbeats and reconciliations read no sessions, and the sweep reads them only when a
//! replica's lease ran out or one drains (src/runner/liveness.rs). Citus counts the
//! statements itself (`citus_stat_counters`, with `citus.enable_stat_counters`).

use super::*;
use common::procs::{Apps, Replica};
use std::time::{Duration, Instant};

/// The coordinator's count of multi-shard statements in the test's database.
async fn multi_shard(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT query_execution_multi_shard FROM citus_stat_counters(
             (SELECT oid FROM pg_database WHERE datname = current_database()))",
    )
    .fetch_optional(&mut *conn)
    .await
    .expect("citus_stat_counters")
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cluster_runs_at_most_one_multi_shard_statement_a_second() {
    if citus::admin_url().is_none() {
        citus::not_run("citus::an_idle_cluster_runs_at_most_one_multi_shard_statement_a_second");
        return;
    }
    let db = TestDb::citus().await;
    db.store().await; // migrated and distributed before the replicas start
    let name = db
        .url
        .rsplit('/')
        .next()
        .expect("a database name")
        .to_string();
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    conn.execute(format!("ALTER DATABASE \"{name}\" SET citus.enable_stat_counters = on").as_str())
        .await
        .expect("alter database");
    let apps = Apps::new().echo("echo", "");
    let mut replicas = vec![];
    for r in ["a", "b", "c"] {
        replicas.push(Replica::spawn(&db, &apps, r, &[]).await);
    }
    // Past the start: each replica's first looks need no turn.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let before = multi_shard(&mut conn).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let n = multi_shard(&mut conn).await - before;
    let secs = started.elapsed().as_secs_f64();
    for r in &replicas {
        r.signal("-KILL");
    }
    println!("{n} multi-shard statements in {secs:.1} s with three idle replicas");
    // Proof that the counter counts this database's statements: one of its own, on a
    // connection opened since the setting.
    let mut own = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let before = multi_shard(&mut conn).await;
    sqlx::query("SELECT count(*) FROM sessions")
        .execute(&mut own)
        .await
        .expect("count");
    assert!(
        multi_shard(&mut conn).await > before,
        "citus_stat_counters does not count this database's multi-shard statements"
    );
    assert!(
        (n as f64) <= secs,
        "{n} multi-shard statements in {secs:.1} s: an idle cluster scans more than once a second"
    );
}
