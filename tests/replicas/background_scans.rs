//! Background work that does not grow with replicas (src/store/turns.rs): idle replicas
//! scan for due work about once per poll period between them, not once each, and not at all
//! while they know nothing can be due.

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

/// Kills `replicas` (no drain to wait for): their connections close, their backends exit,
/// and PostgreSQL has their scans counted.
async fn kill_all(replicas: &mut [Replica]) {
    for r in replicas.iter() {
        r.signal("-KILL");
    }
    for r in replicas.iter_mut() {
        let _ = tokio::time::timeout(PATIENCE, r.child.wait()).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Seconds until the deployment's schedule quiet ends (negative: not quiet).
async fn quiet_left(conn: &mut sqlx::PgConnection) -> Result<f64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT quiet_until - extract(epoch from now()) FROM poll_turns WHERE kind = 'schedules'",
    )
    .fetch_one(conn)
    .await
}

/// Three idle replicas polling for due schedules every 200 ms. The first look that finds
/// nothing also finds that no schedule can be due, and the deployment goes quiet
/// (src/store/turns.rs): no replica scans `schedules` again for `MAX_QUIET` (30 s), where
/// taking turns alone scanned once per period (30 times in 6 s). A schedule stored on another
/// replica ends the quiet at once, and its first tick fires when due, not after the quiet.
/// PostgreSQL counts the scans itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_deployment_stays_quiet_until_a_schedule_is_stored() {
    let db = TestDb::new(Backend::Postgres).await;
    db.store().await; // migrated before the replicas start
    let apps = Apps::new().echo("echo", "");
    let flags = [
        "--schedule-poll-ms",
        "200",
        "--schedule-min-interval-secs",
        "1",
    ];
    let spawn = || async {
        let mut replicas = vec![];
        for name in ["a", "b", "c"] {
            replicas.push(Replica::spawn(&db, &apps, name, &flags).await);
        }
        replicas
    };
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    // Idle: counted by PostgreSQL once the replicas' backends have exited.
    let before = scans(&db, "schedules").await;
    let started = Instant::now();
    let mut replicas = spawn().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let left = quiet_left(&mut conn).await.expect("poll_turns");
    assert!(
        left > 10.0,
        "quiet for the longest it may be: {left:.1} s left"
    );
    let lived = started.elapsed().as_secs_f64();
    kill_all(&mut replicas).await;
    let n = scans(&db, "schedules").await - before;
    println!(
        "{n} scans of schedules in {lived:.1} s ({:.0} periods of 200 ms)",
        lived / 0.2
    );
    // Each replica looks once at start (the look, and the read of the next tick), then none
    // does. Turns alone: one a period.
    assert!(
        (n as f64) <= 3.0 * 3.0,
        "{n} scans in {:.0} periods: the deployment did not go quiet",
        lived / 0.2
    );

    // Still quiet (it is a row): a schedule stored through c ends it, and some replica's
    // next look fires the first tick when it is due, not when the quiet would have ended.
    let replicas = spawn().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = quiet_left(&mut conn).await.expect("poll_turns");
    assert!(
        left > 10.0,
        "quiet again after the replicas' first looks: {left:.1} s left"
    );
    let path = format!("/apps/echo/users/{USER}/schedules");
    let created = json_with_status(
        replicas[2]
            .post(
                &path,
                json!({"cron": "*/2 * * * * *", "message": "on time", "session": "new"}),
            )
            .await,
        201,
    )
    .await;
    let id = created["id"].as_str().expect("schedule id").to_string();
    let left = quiet_left(&mut conn).await.expect("poll_turns");
    assert!(
        left < 0.0,
        "storing a schedule ends the quiet: {left:.1} s left"
    );
    let deadline = Instant::now() + PATIENCE;
    let tick = loop {
        let page = json_with_status(replicas[0].get(&format!("{path}/{id}/runs")).await, 200).await;
        if let Some(tick) = page["ticks"].as_array().and_then(|t| t.last()).cloned() {
            break tick;
        }
        assert!(Instant::now() < deadline, "no tick fired: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let late =
        tick["firedAt"].as_f64().expect("firedAt") - tick["tickTime"].as_f64().expect("tickTime");
    assert!(
        late < 10.0,
        "the first tick fired {late:.1} s after it was due: the quiet held it back ({tick})"
    );
}

/// Idle replicas write their heartbeats and reconcile without reading every user's sessions:
/// with no run, none of their runs can be cancelled or lost (src/runner/liveness.rs). Only
/// the sweep for runs nobody runs reads them, one replica per period. Three replicas with a
/// 3 s lease: a heartbeat a second each and a reconciliation every two, which read the
/// sessions about 27 times in 6 s more when they read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_replicas_read_no_sessions_for_their_heartbeats() {
    let db = TestDb::new(Backend::Postgres).await;
    db.store().await;
    let apps = Apps::new().echo("echo", "");
    let before = scans(&db, "sessions").await;
    let started = Instant::now();
    // One run first, on a: its heartbeats and reconciliation read while it runs, not after.
    let mut replicas = vec![];
    for name in ["a", "b", "c"] {
        replicas.push(Replica::spawn(&db, &apps, name, &["--run-lease-secs", "3"]).await);
    }
    replicas[0].create_session("echo", "s1").await;
    let ran = replicas[0]
        .post(
            "/run",
            json!({"appName": "echo", "userId": USER, "sessionId": "s1",
                   "newMessage": {"role": "user", "parts": [{"text": "hi"}]}}),
        )
        .await;
    assert_eq!(ran.status(), 200);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let lived = started.elapsed().as_secs_f64();
    kill_all(&mut replicas).await;
    let n = scans(&db, "sessions").await - before;
    println!("{n} reads of sessions in {lived:.1} s by three idle replicas");
    // The sweeps, one a second between them (a look every lease / 3), and what the start and
    // the run read (each replica's first sweep and reconciliation, the session, the run, a's
    // reconciliation after it): 20 here, 44 with the heartbeats and reconciliations reading.
    assert!(
        (n as f64) <= 1.5 * lived + 15.0,
        "{n} reads of sessions in {lived:.1} s: idle heartbeats or reconciliations read them"
    );
}
