//! Background work that does not grow with replicas (src/store/turns.rs): idle replicas
//! scan for due work about once per poll period between them, not once each.

use super::*;
use sqlx::Connection;

/// How many times PostgreSQL scanned `table` (sequential and index scans), as its statistics
/// say once every backend that scanned it has exited (a backend flushes its counts at exit;
/// the caller waits for that).
async fn scans(db: &TestDb, table: &str) -> i64 {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query_scalar(
        "SELECT COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0)
           FROM pg_stat_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_one(&mut conn)
    .await
    .expect("pg_stat_user_tables")
}

/// Three idle replicas polling for due schedules every 200 ms. Each poll that finds nothing
/// takes a turn first, so the deployment scans `schedules` about once per 200 ms, where three
/// replicas each scanning would be three times that. PostgreSQL counts the scans itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_replicas_scan_once_per_period_between_them() {
    let db = TestDb::new(Backend::Postgres).await;
    db.store().await; // migrated before the replicas start
    let apps = Apps::new().echo("echo", "");
    let before = scans(&db, "schedules").await;
    let started = Instant::now();
    let mut replicas = vec![];
    for name in ["a", "b", "c"] {
        replicas.push(Replica::spawn(&db, &apps, name, &["--schedule-poll-ms", "200"]).await);
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    // Killed (no drain to wait for): their connections close, and their backends exit.
    for r in &replicas {
        r.signal("-KILL");
    }
    let lived = started.elapsed().as_secs_f64();
    for r in &mut replicas {
        let _ = tokio::time::timeout(PATIENCE, r.child.wait()).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = scans(&db, "schedules").await - before;
    let periods = lived / 0.2;
    println!("{n} scans of schedules in {lived:.1} s ({periods:.0} periods of 200 ms)");
    assert!(
        (n as f64) <= 1.5 * periods,
        "{n} scans in {periods:.0} periods: each replica scans on its own"
    );
    assert!(
        (n as f64) >= 0.5 * 6.0 / 0.2,
        "{n} scans in {periods:.0} periods: the deployment must still look every period"
    );
}
